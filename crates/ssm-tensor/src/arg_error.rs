//! The tensor-argument errors every op family reports the same way (shape, rank, dtype,
//! device, strides, overlap, unreadable view). Each op crate's error enum wraps [`ArgError`]
//! transparently and keeps its op-specific variants, so one message is written once.

use crate::{DType, Device, TensorError};

/// A tensor argument that does not meet its op's contract. Every variant names the argument
/// (as vLLM names it), what was expected and what came.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A tensor has a rank the op does not accept.
    #[error("`{arg}` must have rank {expected}, got shape {actual:?}")]
    Rank {
        /// Argument name.
        arg: &'static str,
        /// Accepted ranks, e.g. "3 or 4" or "2 ([dim, width])".
        expected: &'static str,
        /// The shape that came.
        actual: Vec<usize>,
    },
    /// A tensor's shape does not match the contract.
    #[error("`{arg}` must have shape {expected}, got {actual:?}")]
    Shape {
        /// Argument name.
        arg: &'static str,
        /// The expected shape, with the names of its dimensions.
        expected: String,
        /// The shape that came.
        actual: Vec<usize>,
    },
    /// A tensor has a dtype the op does not accept.
    #[error("`{arg}` must be {expected}, got {actual}")]
    DType {
        /// Argument name.
        arg: &'static str,
        /// The accepted dtypes.
        expected: String,
        /// The dtype that came.
        actual: DType,
    },
    /// A layout the kernels cannot address: a dimension that must be contiguous is not, or a
    /// parameter that must be per head is not.
    #[error("`{arg}` must be {what}, got shape {shape:?} with strides {strides:?}")]
    Strides {
        /// Argument name.
        arg: &'static str,
        /// What is required, e.g. "contiguous along dstate (last stride 1)".
        what: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides.
        strides: Vec<isize>,
    },
    /// Tensors live on different devices.
    #[error("`{arg}` lives on {actual}, but `{reference}` lives on {expected}")]
    Device {
        /// Argument name.
        arg: &'static str,
        /// The argument whose device sets the call's device.
        reference: &'static str,
        /// That device.
        expected: Device,
        /// The argument's device.
        actual: Device,
    },
    /// `heads` is not a multiple of `groups`.
    #[error("heads ({heads}, from `{heads_from}`) must be a multiple of groups ({groups}, from `B`)")]
    HeadsNotDivisible {
        /// Number of heads.
        heads: usize,
        /// The argument the heads were read from.
        heads_from: &'static str,
        /// Number of groups.
        groups: usize,
    },
    /// An argument needs another one that was not given.
    #[error("`{arg}` needs {needs}")]
    Requires {
        /// The argument given.
        arg: &'static str,
        /// What it needs (argument names in backticks).
        needs: &'static str,
    },
    /// A written tensor whose elements overlap (e.g. a stride-0 output).
    #[error("`{arg}` is written, so its elements must not overlap; got shape {shape:?} with strides {strides:?}")]
    Overlapping {
        /// Argument name.
        arg: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides.
        strides: Vec<isize>,
    },
    /// A view could not be read.
    #[error("`{arg}`: {source}")]
    Tensor {
        /// Argument name.
        arg: &'static str,
        /// The view's error.
        source: TensorError,
    },
    /// Shape or stride arithmetic of an argument does not fit in the address space.
    #[error("`{arg}`: {what} overflows (shape {shape:?}, strides {strides:?})")]
    Overflow {
        /// Argument name.
        arg: &'static str,
        /// The quantity that overflowed, e.g. "element offset" or "tokens × dim".
        what: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides.
        strides: Vec<isize>,
    },
}

impl ArgError {
    /// [`ArgError::Overlapping`] unless the written argument `arg` is disjoint
    /// ([`Layout::is_disjoint`](crate::Layout::is_disjoint)): the one overlap rule of every plan.
    pub fn check_written(arg: &'static str, layout: &crate::Layout) -> Result<(), ArgError> {
        if layout.is_disjoint() {
            Ok(())
        } else {
            Err(ArgError::Overlapping { arg, shape: layout.shape().to_vec(), strides: layout.strides().to_vec() })
        }
    }
}
