use ssm_ring::{CheckpointingSsu, CommitRingTrackers, RingTrackers, UpdateRingTrackers};
use ssm_tensor::{TensorMut, TensorRef};

use crate::{Error, Runtime};

/// Arguments of [`Runtime::selective_state_update_replayssm`], vLLM's
/// `selective_state_update_replayssm_flashinfer`: one checkpointing SSU step
/// ([`ssm_ring::CheckpointingSsu`], same shapes and names) whose cursors come from the shared
/// tracker tensors, which the call advances afterwards when `update_trackers` is set.
pub struct SelectiveStateUpdateReplaySsm<'a> {
    /// Checkpoint state pool `[cache, H, P, N]`.
    pub state: TensorMut<'a>,
    /// Ring of x `[cache, H, L, P]`.
    pub x_cache: TensorMut<'a>,
    /// Ring of B `[cache, G, L, N]`.
    pub b_cache: TensorMut<'a>,
    /// Ring of processed dt `[cache, H, L]` (f32).
    pub dt_cache: TensorMut<'a>,
    /// The shared cursors `[cache]` (`ring_start`, `prev_num_accepted`, `prev_query_len`).
    pub trackers: RingTrackers<'a>,
    /// `W`, the window the trackers advance against (vLLM's `logical_window`).
    pub logical_window: i64,
    /// New tokens' x.
    pub x: TensorRef<'a>,
    /// New tokens' raw dt.
    pub dt: TensorRef<'a>,
    /// `A`.
    pub a: TensorRef<'a>,
    /// `B`.
    pub b: TensorRef<'a>,
    /// `C`.
    pub c: TensorRef<'a>,
    /// Output.
    pub out: TensorMut<'a>,
    /// `D`.
    pub d: Option<TensorRef<'a>>,
    /// Gate.
    pub z: Option<TensorRef<'a>>,
    /// `dt_bias`.
    pub dt_bias: Option<TensorRef<'a>>,
    /// Softplus on dt.
    pub dt_softplus: bool,
    /// Slot per sequence (`[batch]` or `[batch, width]`, column 0).
    pub state_batch_indices: Option<TensorRef<'a>>,
    /// vLLM's `null_block_id`; `None`: no pads.
    pub pad_slot_id: Option<i64>,
    /// Varlen starts.
    pub cu_seqlens: Option<TensorRef<'a>>,
    /// Varlen window `T`.
    pub max_seqlen: Option<usize>,
    /// Advance the trackers of every valid slot by one token after the step (single-token
    /// decode). Speculative decode passes `false` and calls
    /// [`Runtime::commit_replayssm_ring_trackers`] before the next step instead.
    pub update_trackers: bool,
}

impl Runtime {
    fn replayssm_backend(&self, op: &'static str) -> Result<(), Error> {
        if self.config.replayssm { Ok(()) } else { Err(Error::ReplaySsmDisabled { op }) }
    }

    /// vLLM's `update_replayssm_ring_trackers`: advances (window given) or resets the cursors of
    /// every slot `state_batch_indices` names; pads and out-of-range slots are skipped.
    pub fn update_replayssm_ring_trackers(&self, args: UpdateRingTrackers<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// vLLM's `reset_replayssm_ring_trackers`: zeroes the three cursors of every valid slot.
    pub fn reset_replayssm_ring_trackers(
        &self,
        trackers: RingTrackers<'_>,
        state_batch_indices: TensorRef<'_>,
        pad_slot_id: Option<i64>,
    ) -> Result<(), Error> {
        self.update_replayssm_ring_trackers(UpdateRingTrackers::reset(trackers, state_batch_indices, pad_slot_id))
    }

    /// vLLM's `commit_replayssm_ring_trackers`: folds in the previous speculative window's
    /// accepted counts and records the current query lengths.
    pub fn commit_replayssm_ring_trackers(&self, args: CommitRingTrackers<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// FlashInfer's `checkpointing_ssu` (ReplaySSM decode step): writes `out`, the ring rows
    /// after each sequence's live history, and the checkpoint of flushing sequences; never
    /// moves the cursors ([`ssm_ring::CheckpointingSsu`]).
    pub fn checkpointing_ssu(&self, args: CheckpointingSsu<'_>) -> Result<(), Error> {
        self.replayssm_backend("checkpointing_ssu")?;
        self.plan_and_run(args)
    }

    /// vLLM's `selective_state_update_replayssm_flashinfer`: one checkpointing SSU step with
    /// the cursors read from the shared trackers, then, with `update_trackers`, the trackers
    /// advanced by one token (`W = logical_window`, `L = x_cache.shape[2]`). Both calls are
    /// planned before either runs, so a refused call writes nothing.
    pub fn selective_state_update_replayssm(&self, args: SelectiveStateUpdateReplaySsm<'_>) -> Result<(), Error> {
        self.replayssm_backend("selective_state_update_replayssm")?;
        let SelectiveStateUpdateReplaySsm { mut trackers, logical_window, update_trackers, .. } = args;
        let ring_len = args.x_cache.shape().get(2).copied().unwrap_or(0) as i64;
        let indices = args.state_batch_indices.filter(|_| update_trackers);
        let pad_slot_id = args.pad_slot_id;
        fn update<'t>(
            trackers: RingTrackers<'t>,
            state_batch_indices: TensorRef<'t>,
            (window, ring_len, pad_slot_id): (i64, i64, Option<i64>),
        ) -> UpdateRingTrackers<'t> {
            UpdateRingTrackers {
                trackers,
                state_batch_indices,
                logical_window: Some(window),
                ring_buffer_len: Some(ring_len),
                pad_slot_id,
            }
        }
        let sizes = (logical_window, ring_len, pad_slot_id);
        // The tracker update reads what the step reads, so it is planned first (a refusal
        // writes nothing) and planned again to run once the step has released the cursors;
        // its plan depends only on shapes and dtypes, which the step cannot change.
        if let Some(idx) = indices {
            ssm_ring::plan(update(trackers.reborrow(), idx, sizes))?;
        }
        let step = CheckpointingSsu {
            state: args.state,
            x_cache: args.x_cache,
            b_cache: args.b_cache,
            dt_cache: args.dt_cache,
            ring_start: trackers.ring_start.as_ref(),
            prev_num_accepted_tokens: trackers.prev_num_accepted.as_ref(),
            x: args.x,
            dt: args.dt,
            a: args.a,
            b: args.b,
            c: args.c,
            out: args.out,
            d: args.d,
            z: args.z,
            dt_bias: args.dt_bias,
            dt_softplus: args.dt_softplus,
            state_batch_indices: args.state_batch_indices,
            pad_slot_id: args.pad_slot_id,
            cu_seqlens: args.cu_seqlens,
            max_seqlen: args.max_seqlen,
        };
        self.plan_and_run(step)?;
        if let Some(idx) = indices {
            self.plan_and_run(update(trackers.reborrow(), idx, sizes))?;
        }
        Ok(())
    }
}
