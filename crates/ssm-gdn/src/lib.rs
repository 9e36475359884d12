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
//! the [`Run`] impls of each backend, and the scalar [`reference`] (f32 and f64).
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
pub use ssm_tensor::{Op, Planned, Run};

/// The chunk length of the chunked prefill (vLLM's `FLA_CHUNK_SIZE`).
pub const CHUNK_SIZE: usize = 64;

/// The largest `head_k_dim` the ops accept (vLLM's l2norm refuses features of 64 KiB and more;
/// the CPU kernels keep one normalised `q`/`k` row on the stack).
pub const MAX_HEAD_K_DIM: usize = 1024;

impl Op for FusedGdnGatingArgs<'_> {
    const NAME: &'static str = "fused_gdn_gating";
    type Plan = GatingPlan;
    type Error = GdnError;
    fn plan(&self) -> Result<GatingPlan, GdnError> {
        plan::fused_gdn_gating(self)
    }
    fn device(plan: &GatingPlan) -> ssm_tensor::Device {
        plan.device
    }
}

impl Op for FusedRecurrentGatedDeltaRuleArgs<'_> {
    const NAME: &'static str = "fused_recurrent_gated_delta_rule";
    type Plan = RecurrentPlan;
    type Error = GdnError;
    fn plan(&self) -> Result<RecurrentPlan, GdnError> {
        plan::fused_recurrent_gated_delta_rule(self)
    }
    fn device(plan: &RecurrentPlan) -> ssm_tensor::Device {
        plan.device
    }
}

impl Op for FusedSigmoidGatingDeltaRuleUpdateArgs<'_> {
    const NAME: &'static str = "fused_sigmoid_gating_delta_rule_update";
    type Plan = RecurrentPlan;
    type Error = GdnError;
    fn plan(&self) -> Result<RecurrentPlan, GdnError> {
        plan::fused_sigmoid_gating_delta_rule_update(self)
    }
    fn device(plan: &RecurrentPlan) -> ssm_tensor::Device {
        plan.device
    }
}

impl Op for ChunkGatedDeltaRuleArgs<'_> {
    const NAME: &'static str = "chunk_gated_delta_rule";
    type Plan = ChunkPlan;
    type Error = GdnError;
    fn plan(&self) -> Result<ChunkPlan, GdnError> {
        plan::chunk_gated_delta_rule(self)
    }
    fn device(plan: &ChunkPlan) -> ssm_tensor::Device {
        plan.device
    }
}

/// Checks every argument of a gated-delta-rule call ([`FusedGdnGatingArgs`],
/// [`FusedRecurrentGatedDeltaRuleArgs`], [`FusedSigmoidGatingDeltaRuleUpdateArgs`] or
/// [`ChunkGatedDeltaRuleArgs`]) and keeps them with their plan. Backends trust the plan and
/// write exactly what the call's `Args` documents, nothing else.
///
/// Errors name the argument and what was expected; nothing is written by a failed call.
pub fn plan<A: Op<Error = GdnError>>(args: A) -> Result<Planned<A>, GdnError> {
    Planned::new(args)
}

/// Elements of f32 scratch a backend's chunked prefill wants for a plan (0 when it needs
/// none); passing at least this much as [`ChunkGatedDeltaRuleArgs::scratch`] makes the call
/// allocation-free.
pub trait ChunkScratch {
    /// The size query, from the plan's dimensions and the backend's parallelism alone.
    fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize;
}

/// A backend of every gated-delta-rule op, with one error type `E`: every backend implements it (through
/// its `Run` impls), and generic harnesses take it as their bound.
pub trait GdnBackend<E>:
    for<'a> Run<FusedGdnGatingArgs<'a>, Error = E>
    + for<'a> Run<FusedRecurrentGatedDeltaRuleArgs<'a>, Error = E>
    + for<'a> Run<FusedSigmoidGatingDeltaRuleUpdateArgs<'a>, Error = E>
    + for<'a> Run<ChunkGatedDeltaRuleArgs<'a>, Error = E>
{
}

impl<
    E,
    B: for<'a> Run<FusedGdnGatingArgs<'a>, Error = E>
        + for<'a> Run<FusedRecurrentGatedDeltaRuleArgs<'a>, Error = E>
        + for<'a> Run<FusedSigmoidGatingDeltaRuleUpdateArgs<'a>, Error = E>
        + for<'a> Run<ChunkGatedDeltaRuleArgs<'a>, Error = E>,
> GdnBackend<E> for B
{
}
