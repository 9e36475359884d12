//! Selective state update (SSU): the decode step of Mamba1 and Mamba2.
//!
//! The contract is vLLM's Triton `selective_state_update` (SEMANTICS.md, semantics/ssu.md §2
//! and §3.2): state pools addressed by slot tables with a caller-named pad value, varlen
//! batches through `cu_seqlens`, speculative decoding with 2-D slot tables and
//! `num_accepted_tokens`, the tied (Mamba2) and per-channel (Mamba1) parameter forms, and
//! optional stochastic rounding of an fp16 state.
//!
//! The crate has the four pieces every op family has:
//! - [`SelectiveStateUpdateArgs`]: the borrowed arguments, named as vLLM names them;
//! - [`plan`]: every check, once, before anything is written; it returns the arguments
//!   and their [`SsuPlan`] as one [`Planned`] call, the only thing a backend accepts
//!   (`impl Run<SelectiveStateUpdateArgs> for …`);
//! - [`reference`](mod@reference): the kernel-faithful scalar implementation (f32, and an f64 variant).
//!
//! A plan from one call cannot run with another call's arguments. A backend takes one
//! [`Planned`] value, made only by [`plan`] from the arguments it keeps:
//!
//! ```
//! # use ssm_ssu::{Planned, Run, SelectiveStateUpdateArgs};
//! fn decode<'a>(backend: &impl Run<SelectiveStateUpdateArgs<'a>>, args: SelectiveStateUpdateArgs<'a>) {
//!     let call = ssm_ssu::plan(args).expect("checked");
//!     let _ = backend.run(call); // the plan travels with the arguments it was built from
//! }
//! ```
//!
//! Pairing the plan of a large call with the arguments of a small one does not compile,
//! neither by building the pair (its fields are private) ...
//!
//! ```compile_fail,E0451
//! # use ssm_ssu::{Planned, Run, SelectiveStateUpdateArgs};
//! fn forge<'a>(
//!     backend: &impl Run<SelectiveStateUpdateArgs<'a>>,
//!     small: SelectiveStateUpdateArgs<'a>,
//!     big: Planned<SelectiveStateUpdateArgs<'a>>,
//! ) {
//!     let (_, plan) = big.into_parts();
//!     let _ = backend.run(Planned { args: small, plan, device: ssm_tensor::Device::Cpu });
//! }
//! ```
//!
//! ... nor by handing a backend the plan and the arguments side by side:
//!
//! ```compile_fail,E0308
//! # use ssm_ssu::{Planned, Run, SelectiveStateUpdateArgs};
//! fn forge<'a>(
//!     backend: &impl Run<SelectiveStateUpdateArgs<'a>>,
//!     small: SelectiveStateUpdateArgs<'a>,
//!     big: Planned<SelectiveStateUpdateArgs<'a>>,
//! ) {
//!     let (_, plan) = big.into_parts();
//!     let _ = backend.run((small, plan));
//! }
//! ```

mod args;
mod error;
pub mod philox;
mod plan;
pub mod quant;
pub mod reference;

pub use args::{SelectiveStateUpdateArgs, StochasticRounding};
pub use error::SsuError;
pub use plan::{
    IndexTable, IntermediatePlan, ParamForm, Route, SsuAlgorithm, SsuDims, SsuDtypes, SsuPlan, Strided, TokenStrides,
    start_column,
};
pub use ssm_tensor::{Op, Planned, Run};

ssm_tensor::op_family! {
    /// A backend of the selective state update.
    family SsuBackend, error SsuError;
    SelectiveStateUpdateArgs => "selective_state_update", SsuPlan, plan::plan_selective_state_update;
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
