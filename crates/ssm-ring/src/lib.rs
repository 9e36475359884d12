//! ReplaySSM: decode that writes the recurrent state back only on periodic flushes.
//!
//! Each state slot keeps a checkpoint state and a ring of recent inputs (x, B and the
//! processed dt); a decode step replays the live history from the checkpoint to produce
//! its outputs, appends its own tokens to the ring, and stores a new checkpoint only when
//! the ring's window is full (semantics/ssu.md §7, SEMANTICS.md "ReplaySSM").
//!
//! Ops, with the pieces every op family has (args, [`plan_update`]/[`plan_commit`]/
//! [`plan_checkpointing_ssu`], [`RingBackend`], [`reference`]):
//! - ring trackers, integer-exact as vLLM's Triton kernels define them:
//!   `update_replayssm_ring_trackers` (advance after a decoded token, or reset when no
//!   window is given), `reset_replayssm_ring_trackers`, `commit_replayssm_ring_trackers`
//!   (delayed commit of a speculative window);
//! - `checkpointing_ssu`, following FlashInfer's contract: flush when `k + T > W`,
//!   `W = L − T`; appends on both branches; the op never moves the trackers; a pad row
//!   writes nothing, not even `out`.

mod args;
mod error;
mod plan;
pub mod reference;

pub use args::{CheckpointingSsu, CommitRingTrackers, RingTrackers, UpdateRingTrackers};
pub use error::RingError;
pub use plan::{
    CheckpointingSsuPlan, HeadParam, PoolStrides, Strided1, TokenForm, TokenStrides, TrackerMode, TrackerPlan,
    plan_checkpointing_ssu, plan_commit, plan_update,
};

/// A backend that runs the ReplaySSM ops.
///
/// Implementations trust the plan (built from the same args) and never re-validate.
pub trait RingBackend {
    /// The backend's error type.
    type Error;
    /// Advances (or, with a reset plan, resets) the trackers of every valid slot.
    fn update_replayssm_ring_trackers(
        &self,
        plan: &TrackerPlan,
        args: UpdateRingTrackers<'_>,
    ) -> Result<(), Self::Error>;
    /// Commits the previous speculative window and records the current query lengths.
    fn commit_replayssm_ring_trackers(
        &self,
        plan: &TrackerPlan,
        args: CommitRingTrackers<'_>,
    ) -> Result<(), Self::Error>;
    /// One checkpointing SSU step: writes `out`, the ring rows after the live history, and the
    /// checkpoint of flushing sequences; nothing else.
    fn checkpointing_ssu(&self, plan: &CheckpointingSsuPlan, args: CheckpointingSsu<'_>) -> Result<(), Self::Error>;
}
