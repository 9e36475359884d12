//! Selective state update (SSU): the decode step of Mamba1 and Mamba2.
//!
//! The contract is vLLM's Triton `selective_state_update` (SEMANTICS.md, semantics/ssu.md §2
//! and §3.2): state pools addressed by slot tables with a caller-named pad value, varlen
//! batches through `cu_seqlens`, speculative decoding with 2-D slot tables and
//! `num_accepted_tokens`, the tied (Mamba2) and per-channel (Mamba1) parameter forms, and
//! optional stochastic rounding of an fp16 state.
//!
//! The crate has the four pieces every op family has:
//! - [`SelectiveStateUpdate`]: the borrowed arguments, named as vLLM names them;
//! - [`plan`]: every check, once, before anything is written; it returns an [`SsuPlan`]
//!   that backends trust;
//! - [`SsuBackend`]: the trait each backend implements;
//! - [`reference`]: the kernel-faithful scalar implementation (f32, and an f64 variant).

mod args;
mod error;
pub mod philox;
mod plan;
pub mod reference;

pub use args::{SelectiveStateUpdate, StochasticRounding};
pub use error::SsuError;
pub use plan::{IndexTable, ParamForm, Route, SsuAlgorithm, SsuDims, SsuDtypes, SsuPlan, Strided, TokenStrides, plan};

/// A backend that runs the selective state update.
///
/// Implementations trust `plan` (built by [`plan`] from the same `args`) and never
/// re-validate shapes or host index values.
pub trait SsuBackend {
    /// The backend's error type.
    type Error;
    /// Runs one call: writes `out` and the state slots the tables name, nothing else.
    fn selective_state_update(&self, plan: &SsuPlan, args: SelectiveStateUpdate<'_>) -> Result<(), Self::Error>;
}
