//! Borrowed tensor views for ssm-kernels.
//!
//! A view is `{ data, dtype, shape, strides, offset, device }`, like a DLPack
//! tensor: it never owns memory and has no dependency on any backend. Host views
//! borrow a byte slice; device views borrow a raw device address (valid for the
//! view's lifetime by the caller's promise), so a cudarc `CudaSlice`, a PyTorch
//! tensor or an engine's own allocator can all be wrapped without copies.
//!
//! Strides are in elements; a stride of 0 is legal and means broadcast (vLLM
//! passes `A`, `D` and `dt_bias` as stride-0 views). Every constructor checks
//! that each reachable element lies inside the borrowed memory, so no view can
//! address out of bounds.
//!
//! [`Planned`] pairs an op's arguments with the plan checked from them; backends [`Run`]
//! planned calls only.
//! Shared addressing for every op family: [`Strided`] (offset + Σ index·stride),
//! [`SlotTable`] with pad resolution and the aliasing rule ([`first_slot_conflict`]), and
//! scalar element readers and writers by dtype ([`elem`]).
//!
//! [`HostTensor`] is the one owning type: an aligned host buffer for tests, tools and
//! benchmarks, which hands out views.

mod arg_error;
mod dtype;
pub mod elem;
mod error;
mod layout;
mod owned;
mod planned;
mod precision;
mod rows;
mod slots;
mod strided;
mod view;

pub use arg_error::ArgError;
pub use dtype::{DType, Element};
pub use error::TensorError;
pub use layout::{Layout, MAX_RANK};
pub use owned::HostTensor;
pub use planned::{Op, Planned, Run, Unsupported};
pub use precision::{Arithmetic, Precision};
pub use rows::{CopyRowsArgs, CopyRowsPlan, RowDirection, RowsError, copy_rows_reference};
pub use slots::{Slot, SlotConflict, SlotTable, SlotUse, first_slot_conflict};
pub use strided::Strided;
pub use view::{Device, TensorMut, TensorRef};

pub use half::{bf16, f16};

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
