//! Gated delta rule (GDN): the linear-attention core of Qwen3-Next / Qwen3.5.
//!
//! The contract is vLLM's Triton kernels (SEMANTICS.md, semantics/gdn_conv.md §1–§2):
//! - [`fused_gdn_gating`](FusedGdnGatingArgs): `g = −exp(A_log)·softplus(a + dt_bias)`,
//!   `β = sigmoid(b)`;
//! - [`fused_recurrent_gated_delta_rule`](FusedRecurrentGatedDeltaRuleArgs) and
//!   [`fused_sigmoid_gating_delta_rule_update`](FusedSigmoidGatingDeltaRuleUpdateArgs): the
//!   token-by-token recurrence (decode, varlen, speculative decoding) over a pool of state slots;
//! - [`chunk_gated_delta_rule`](ChunkGatedDeltaRuleArgs): chunked prefill (chunk 64, WY/UT form),
//!   with initial states read from a pool and final states written back.
//!
//! The state of one value head is a `V × K` matrix `S` with `o_t = S_t q_t`. It is stored either
//! V-major (`[slots, HV, V, K]`, vLLM's GPU layout) or K-major (`[slots, HV, K, V]`, FLA and
//! vLLM's CPU layout); the layout is an explicit argument ([`StateLayout`]).
//!
//! Every op has the same four pieces: borrowed `…Args` named as vLLM names them, a
//! [`plan`] function per op that checks everything once before anything is written,
//! the [`GdnBackend`] trait, and the scalar [`reference`] (f32 and f64).
//!
//! # Null slots (vLLM's `NULL_BLOCK_ID` rule)
//! vLLM's recurrent GDN kernels have no `pad_slot_id` argument: any slot index `<= 0` is the
//! null block (PROVENANCE.md, "GDN recurrent kernels"). The recurrent ops follow that exactly:
//! a read index `<= 0` skips the whole sequence (its `o` rows are not written and no state is
//! stored), a write index `<= 0` skips that one store. Slot 0 therefore never holds a real state
//! for these ops. Indices `>= slots` are refused by the plan. The chunked prefill is this
//! project's pooled extension of vLLM's dense API and takes an explicit `pad_slot_id`.

mod args;
mod error;
pub mod plan;
pub mod reference;

pub use args::{
    ChunkGatedDeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout,
};
pub use error::GdnError;
pub use plan::{ChunkPlan, GatingPlan, RecurrentPlan};

/// The chunk length of the chunked prefill (vLLM's `FLA_CHUNK_SIZE`).
pub const CHUNK_SIZE: usize = 64;

/// The largest `head_k_dim` the ops accept (vLLM's l2norm refuses features of 64 KiB and more;
/// the CPU kernels keep one normalised `q`/`k` row on the stack).
pub const MAX_HEAD_K_DIM: usize = 1024;

/// A backend that runs the gated delta rule ops.
///
/// Implementations trust the plan (built by the matching function in [`plan`] from the same
/// `args`) and never re-validate shapes or host index values. Each method writes exactly what
/// its `Args` documents and nothing else.
pub trait GdnBackend {
    /// The backend's error type.
    type Error;

    /// `g = −exp(A_log)·softplus(a + dt_bias)` and `β = sigmoid(b)`; writes `g` and `beta_output`.
    fn fused_gdn_gating(&self, plan: &GatingPlan, args: FusedGdnGatingArgs<'_>) -> Result<(), Self::Error>;

    /// The recurrence with precomputed `g` and `beta`; writes `o` and the state slots.
    fn fused_recurrent_gated_delta_rule(
        &self,
        plan: &RecurrentPlan,
        args: FusedRecurrentGatedDeltaRuleArgs<'_>,
    ) -> Result<(), Self::Error>;

    /// The recurrence with the gating fused in; writes `o` and the state slots.
    fn fused_sigmoid_gating_delta_rule_update(
        &self,
        plan: &RecurrentPlan,
        args: FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), Self::Error>;

    /// Elements of f32 scratch the chunked prefill wants for `plan` (0 when it needs none).
    /// Passing at least this much as `args.scratch` makes the call allocation-free.
    fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize;

    /// Chunked prefill; writes `o`, `final_state` and (in place) the pool slots.
    fn chunk_gated_delta_rule(&self, plan: &ChunkPlan, args: ChunkGatedDeltaRuleArgs<'_>) -> Result<(), Self::Error>;
}
