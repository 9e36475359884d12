//! ReplaySSM: decode that writes the recurrent state back only on periodic flushes.
//!
//! Each state slot keeps a checkpoint state and a ring of recent inputs (x, B and the
//! processed dt); a decode step replays the live history from the checkpoint to produce
//! its outputs, appends its own tokens to the ring, and stores a new checkpoint only when
//! the ring's window is full (semantics/ssu.md §7, SEMANTICS.md "ReplaySSM").
//!
//! Ops, with the pieces every op family has (args, [`plan`], the backends' [`Run`] impls,
//! [`reference`]):
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
};
pub use ssm_tensor::{Op, Planned, Run};

impl Op for UpdateRingTrackers<'_> {
    const NAME: &'static str = "update_replayssm_ring_trackers";
    type Plan = TrackerPlan;
    type Error = RingError;
    fn plan(&self) -> Result<TrackerPlan, RingError> {
        plan::plan_update(self)
    }
    fn device(plan: &TrackerPlan) -> ssm_tensor::Device {
        plan.device
    }
}

impl Op for CommitRingTrackers<'_> {
    const NAME: &'static str = "commit_replayssm_ring_trackers";
    type Plan = TrackerPlan;
    type Error = RingError;
    fn plan(&self) -> Result<TrackerPlan, RingError> {
        plan::plan_commit(self)
    }
    fn device(plan: &TrackerPlan) -> ssm_tensor::Device {
        plan.device
    }
}

impl Op for CheckpointingSsu<'_> {
    const NAME: &'static str = "checkpointing_ssu";
    type Plan = CheckpointingSsuPlan;
    type Error = RingError;
    fn plan(&self) -> Result<CheckpointingSsuPlan, RingError> {
        plan::plan_checkpointing_ssu(self)
    }
    fn device(plan: &CheckpointingSsuPlan) -> ssm_tensor::Device {
        plan.device
    }
}

/// Checks every argument of a ReplaySSM call ([`UpdateRingTrackers`], [`CommitRingTrackers`]
/// or [`CheckpointingSsu`]) and keeps them with their plan. Backends trust the plan.
///
/// Tracker updates and commits skip pads and out-of-range slots (they are not errors); the
/// checkpointing SSU checks every host index it reads. Nothing is written by a failed call.
pub fn plan<A: Op<Error = RingError>>(args: A) -> Result<Planned<A>, RingError> {
    Planned::new(args)
}

/// A backend of every ReplaySSM op, with one error type `E`: every backend implements it (through
/// its `Run` impls), and generic harnesses take it as their bound.
pub trait RingBackend<E>:
    for<'a> Run<UpdateRingTrackers<'a>, Error = E>
    + for<'a> Run<CommitRingTrackers<'a>, Error = E>
    + for<'a> Run<CheckpointingSsu<'a>, Error = E>
{
}

impl<
    E,
    B: for<'a> Run<UpdateRingTrackers<'a>, Error = E>
        + for<'a> Run<CommitRingTrackers<'a>, Error = E>
        + for<'a> Run<CheckpointingSsu<'a>, Error = E>,
> RingBackend<E> for B
{
}
