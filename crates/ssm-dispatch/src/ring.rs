use std::marker::PhantomData;

use ssm_ring::{CheckpointingSsuArgs, CommitRingTrackersArgs, RingTrackers, UpdateRingTrackersArgs};
use ssm_tensor::TensorRef;

use crate::layer_core::Schedule;
use crate::{Error, Runtime};

/// Arguments of [`Runtime::selective_state_update_replayssm`], vLLM's
/// `selective_state_update_replayssm_flashinfer`: one checkpointing SSU step
/// ([`ssm_ring::CheckpointingSsuArgs`], same shapes and names) whose cursors are the shared
/// tracker tensors, which the call advances afterwards when `update_trackers` is set.
///
/// Built by [`SelectiveStateUpdateReplaySsm::new`], which hands the step read views of the
/// trackers' `ring_start` and `prev_num_accepted`; the fields stay private, so those views
/// and the trackers are used only by the call, one after the other.
pub struct SelectiveStateUpdateReplaySsm<'a> {
    trackers: RingTrackers<'a>,
    logical_window: i64,
    update_trackers: bool,
    step: CheckpointingSsuArgs<'a>,
}

/// The step's cursors: read views of the trackers' `ring_start` and `prev_num_accepted`,
/// for the step's `ring_start` and `prev_num_accepted_tokens`. They live for `'c`, a lifetime
/// the step builder of [`SelectiveStateUpdateReplaySsm::new`] cannot name, so the views go
/// into the step and nowhere else:
///
/// ```compile_fail
/// # use ssm_dispatch::SelectiveStateUpdateReplaySsm;
/// # fn leak<'a>(trackers: ssm_ring::RingTrackers<'a>, step: ssm_ring::CheckpointingSsuArgs<'a>) {
/// let mut kept = None;
/// let _ = SelectiveStateUpdateReplaySsm::new(trackers, 15, true, |cursors| {
///     kept = Some(cursors.ring_start); // refused: the view cannot outlive the builder
///     step
/// });
/// # }
/// ```
pub struct ReplaySsmCursors<'c, 'a> {
    /// For [`CheckpointingSsuArgs::ring_start`].
    pub ring_start: TensorRef<'c>,
    /// For [`CheckpointingSsuArgs::prev_num_accepted_tokens`].
    pub prev_num_accepted_tokens: TensorRef<'c>,
    /// `'a: 'c`, so that the builder may put views of lifetime `'a` into a step of `'c`.
    _within: PhantomData<&'c &'a ()>,
}

impl<'a> SelectiveStateUpdateReplaySsm<'a> {
    /// The step `step(cursors)` builds (its `ring_start` and `prev_num_accepted_tokens` taken
    /// from `cursors`), reading its cursors from `trackers`; with `update_trackers` the call
    /// then advances the trackers of every slot in `state_batch_indices` by one token against
    /// the window `W = logical_window` (vLLM's `logical_window`; single-token decode).
    /// Speculative decode passes `false` and calls [`Runtime::commit_replayssm_ring_trackers`]
    /// before the next step instead. Without `state_batch_indices` the trackers are not moved.
    pub fn new(
        trackers: RingTrackers<'a>,
        logical_window: i64,
        update_trackers: bool,
        step: impl for<'c> FnOnce(ReplaySsmCursors<'c, 'a>) -> CheckpointingSsuArgs<'c>,
    ) -> Self {
        let RingTrackers { ring_start, prev_num_accepted, prev_query_len } = trackers;
        // SAFETY: one alias of each cursor goes into the step (read), the other stays in the
        // trackers (written by the update). Both are private to this value, and the only code
        // that uses them, `Runtime::selective_state_update_replayssm`, plans the step, plans
        // the update, runs the step to completion, and only then runs the update: no two
        // accesses overlap. The builder cannot keep a view (`'c` is not nameable outside it).
        let [ring_start, ring_start_read] = unsafe { ring_start.aliased::<2>() };
        // SAFETY: as for `ring_start` above.
        let [prev_num_accepted, prev_read] = unsafe { prev_num_accepted.aliased::<2>() };
        let cursors = ReplaySsmCursors {
            ring_start: ring_start_read.into_ref(),
            prev_num_accepted_tokens: prev_read.into_ref(),
            _within: PhantomData,
        };
        SelectiveStateUpdateReplaySsm {
            trackers: RingTrackers { ring_start, prev_num_accepted, prev_query_len },
            logical_window,
            update_trackers,
            step: step(cursors),
        }
    }
}

impl Runtime {
    fn replayssm_backend(&self, op: &'static str) -> Result<(), Error> {
        if self.config.replayssm { Ok(()) } else { Err(Error::ReplaySsmDisabled { op }) }
    }

    /// vLLM's `update_replayssm_ring_trackers`: advances (window given) or resets the cursors of
    /// every slot `state_batch_indices` names; pads and out-of-range slots are skipped.
    pub fn update_replayssm_ring_trackers(&self, args: UpdateRingTrackersArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// vLLM's `reset_replayssm_ring_trackers`: zeroes the three cursors of every valid slot.
    pub fn reset_replayssm_ring_trackers(
        &self,
        trackers: RingTrackers<'_>,
        state_batch_indices: TensorRef<'_>,
        pad_slot_id: Option<i64>,
    ) -> Result<(), Error> {
        self.update_replayssm_ring_trackers(UpdateRingTrackersArgs::reset(trackers, state_batch_indices, pad_slot_id))
    }

    /// vLLM's `commit_replayssm_ring_trackers`: folds in the previous speculative window's
    /// accepted counts and records the current query lengths.
    pub fn commit_replayssm_ring_trackers(&self, args: CommitRingTrackersArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// FlashInfer's `checkpointing_ssu` (ReplaySSM decode step): writes `out`, the ring rows
    /// after each sequence's live history, and the checkpoint of flushing sequences; never
    /// moves the cursors ([`ssm_ring::CheckpointingSsuArgs`]).
    pub fn checkpointing_ssu(&self, args: CheckpointingSsuArgs<'_>) -> Result<(), Error> {
        self.replayssm_backend("checkpointing_ssu")?;
        self.plan_and_run(args)
    }

    /// vLLM's `selective_state_update_replayssm_flashinfer`: one checkpointing SSU step with
    /// the cursors read from the shared trackers, then, with `update_trackers`, the trackers
    /// advanced by one token (`W = logical_window`, `L = x_cache.shape[2]`). The step and the
    /// update are each planned once, both before either runs, so a refused call writes nothing.
    pub fn selective_state_update_replayssm(&self, args: SelectiveStateUpdateReplaySsm<'_>) -> Result<(), Error> {
        self.replayssm_backend("selective_state_update_replayssm")?;
        let SelectiveStateUpdateReplaySsm { trackers, logical_window, update_trackers, step } = args;
        let ring_buffer_len = step.x_cache.shape().get(2).map(|&l| l as i64);
        let update =
            step.state_batch_indices.filter(|_| update_trackers).map(|state_batch_indices| UpdateRingTrackersArgs {
                trackers,
                state_batch_indices,
                logical_window: Some(logical_window),
                ring_buffer_len,
                pad_slot_id: step.pad_slot_id,
            });
        // The step reads `ring_start`/`prev_num_accepted`, which the update writes: the
        // schedule runs the step to completion before the update starts (the ordering
        // `SelectiveStateUpdateReplaySsm::new`'s aliases rely on).
        let mut schedule = Schedule::new();
        schedule.plan(step)?;
        if let Some(update) = update {
            schedule.plan(update)?;
        }
        schedule.run(self)
    }
}
