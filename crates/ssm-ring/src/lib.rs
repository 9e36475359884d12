//! ReplaySSM: decode that writes the recurrent state back only on periodic flushes.
//!
//! Each state slot keeps a checkpoint state and a ring of recent inputs (x, B and the
//! processed dt); a decode step replays the live history from the checkpoint to produce
//! its outputs, appends its own tokens to the ring, and stores a new checkpoint only when
//! the ring's window is full (semantics/ssu.md §7, SEMANTICS.md "ReplaySSM").
//!
//! Ops, with the pieces every op family has (args, [`plan`], the backends' [`Run`] impls,
//! [`reference`](mod@reference)):
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
pub mod step;

pub use args::{CheckpointingSsuArgs, CommitRingTrackersArgs, RingTrackers, UpdateRingTrackersArgs};
pub use error::RingError;
pub use plan::{CheckpointingSsuPlan, HeadParam, PoolStrides, TokenForm, TokenStrides, TrackerMode, TrackerPlan};
pub use ssm_tensor::{Op, Planned, Run};

ssm_tensor::op_family! {
    /// A backend of every ReplaySSM op.
    family RingBackend, error RingError;
    UpdateRingTrackersArgs => "update_replayssm_ring_trackers", TrackerPlan, plan::plan_update_replayssm_ring_trackers;
    CommitRingTrackersArgs => "commit_replayssm_ring_trackers", TrackerPlan, plan::plan_commit_replayssm_ring_trackers;
    CheckpointingSsuArgs => "checkpointing_ssu", CheckpointingSsuPlan, plan::plan_checkpointing_ssu;
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
