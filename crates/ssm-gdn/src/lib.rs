//! Gated delta rule (GDN): the linear-attention core of Qwen3-Next / Qwen3.5.
//!
//! The contract is vLLM's Triton kernels (SEMANTICS.md, semantics/gdn_conv.md §1–§2):
//! - [`fused_gdn_gating`](FusedGdnGatingArgs): `g = −exp(A_log)·softplus(a + dt_bias)`,
//!   `β = sigmoid(b)`;
//! - [`fused_recurrent_gated_delta_rule`](FusedRecurrentGatedDeltaRuleArgs) and
//!   [`fused_sigmoid_gating_delta_rule_update`](FusedSigmoidGatingDeltaRuleUpdateArgs): the
//!   token-by-token recurrence (decode, varlen, speculative decoding) over a pool of state slots;
//! - [`chunk_gated_delta_rule`](ChunkGatedDeltaRuleArgs): chunked prefill (chunk 64, WY/UT form),
//!   with initial states read from a pool and final states written back;
//! - [`gdn_decode_step`](GdnDecodeStepArgs): one decode step of the layer, the conv update
//!   (`ssm_conv`) and then the sigmoid-gated recurrence on its output, as one call.
//!
//! The state of one value head is a `V × K` matrix `S` with `o_t = S_t q_t`. It is stored either
//! V-major (`[slots, HV, V, K]`, vLLM's GPU layout) or K-major (`[slots, HV, K, V]`, FLA and
//! vLLM's CPU layout); the layout is an explicit argument ([`StateLayout`]).
//!
//! Every op has the same four pieces: borrowed `…Args` named as vLLM names them, a
//! [`plan`](fn@plan) function per op that checks everything once before anything is written,
//! the [`Run`] impls of each backend, and the scalar [`reference`](mod@reference) (f32 and f64).
//!
//! # Null slots (vLLM's `NULL_BLOCK_ID` rule)
//! vLLM's recurrent GDN kernels have no `pad_slot_id` argument: any slot index `<= 0` is the
//! null block (PROVENANCE.md, "GDN recurrent kernels"). The recurrent ops follow that exactly:
//! a read index `<= 0` skips the whole sequence (its `o` rows are not written and no state is
//! stored), a write index `<= 0` skips that one store. Slot 0 therefore never holds a real state
//! for these ops. Indices `>= slots` are refused by the plan. The chunked prefill is this
//! project's pooled extension of vLLM's dense API and takes an explicit `pad_slot_id`.

mod args;
mod decode_step;
mod error;
pub mod plan;
pub mod reference;

pub use args::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, StateLayout,
};
pub use decode_step::{DecodeStepPlan, DeviceParts, GdnDecodeStepArgs};
pub use error::GdnError;
pub use plan::{ChunkPlan, GatingPlan, RecurrentPlan};
pub use ssm_tensor::{Op, Planned, Run};

/// The chunk length of the chunked prefill (vLLM's `FLA_CHUNK_SIZE`).
pub const CHUNK_SIZE: usize = 64;

/// The largest `head_k_dim` the ops accept (vLLM's l2norm refuses features of 64 KiB and more;
/// the CPU kernels keep one normalised `q`/`k` row on the stack).
pub const MAX_HEAD_K_DIM: usize = 1024;

/// Elements of f32 scratch a backend's chunked prefill wants for a plan (0 when it needs
/// none); passing at least this much as [`ChunkGatedDeltaRuleArgs::scratch`] makes the call
/// allocation-free.
pub trait ChunkScratch {
    /// The size query, from the plan's dimensions and the backend's parallelism alone.
    fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize;
}

ssm_tensor::op_family! {
    /// A backend of every gated-delta-rule op.
    family GdnBackend, error GdnError;
    FusedGdnGatingArgs => "fused_gdn_gating", GatingPlan, plan::plan_fused_gdn_gating;
    FusedRecurrentGatedDeltaRuleArgs => "fused_recurrent_gated_delta_rule", RecurrentPlan, plan::plan_fused_recurrent_gated_delta_rule;
    FusedSigmoidGatingDeltaRuleUpdateArgs => "fused_sigmoid_gating_delta_rule_update", RecurrentPlan, plan::plan_fused_sigmoid_gating_delta_rule_update;
    ChunkGatedDeltaRuleArgs => "chunk_gated_delta_rule", ChunkPlan, plan::plan_chunk_gated_delta_rule;
    GdnDecodeStepArgs => "gdn_decode_step", DecodeStepPlan, decode_step::plan_gdn_decode_step;
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
