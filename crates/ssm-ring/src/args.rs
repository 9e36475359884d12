use ssm_tensor::{TensorMut, TensorRef};

/// The three per-slot ReplaySSM cursors, updated in place. Each is `[num_states]`, i32 or
/// i64 (all three the same dtype and length).
pub struct RingTrackers<'a> {
    /// Ring row of the oldest live history token, per state slot.
    pub ring_start: TensorMut<'a>,
    /// Live history rows since the checkpoint (`k`), per state slot.
    pub prev_num_accepted: TensorMut<'a>,
    /// Query length of the pending speculative window (MTP), per state slot.
    pub prev_query_len: TensorMut<'a>,
}

/// Arguments of `update_replayssm_ring_trackers` (vLLM's ReplaySSM dispatch, semantics/ssu.md §7.4).
///
/// With `logical_window: None` the call **resets** the selected slots (all three cursors to 0,
/// what `reset_replayssm_ring_trackers` does). With a window `W` and `ring_buffer_len` `L` it
/// **advances** them after one decoded token: `must = prev + 1 > W;
/// start' = must ? (start + prev) % L : start; prev' = must ? 1 : prev + 1`; `prev_query_len`
/// is left as it is.
///
/// `state_batch_indices` is `[n]` or `[n, width]` (column 0 is used), i32/i64. Entries equal to
/// `pad_slot_id` or outside `[0, num_states)` are skipped (not an error: this mirrors the GPU
/// kernel's mask). An empty table is a no-op. Rows are applied in order.
pub struct UpdateRingTrackersArgs<'a> {
    /// The cursors.
    pub trackers: RingTrackers<'a>,
    /// Slot of each request.
    pub state_batch_indices: TensorRef<'a>,
    /// `W`; `None` resets.
    pub logical_window: Option<i64>,
    /// `L`; required when `logical_window` is given, ignored otherwise.
    pub ring_buffer_len: Option<i64>,
    /// The pad value (vLLM's `null_block_id`); `None`: no pads.
    pub pad_slot_id: Option<i64>,
}

impl RingTrackers<'_> {
    /// The same three tensors, borrowed again for a shorter call.
    pub fn reborrow(&mut self) -> RingTrackers<'_> {
        RingTrackers {
            ring_start: self.ring_start.reborrow(),
            prev_num_accepted: self.prev_num_accepted.reborrow(),
            prev_query_len: self.prev_query_len.reborrow(),
        }
    }
}

impl<'a> UpdateRingTrackersArgs<'a> {
    /// The arguments of `reset_replayssm_ring_trackers`: zero the three cursors of every valid slot.
    pub fn reset(trackers: RingTrackers<'a>, state_batch_indices: TensorRef<'a>, pad_slot_id: Option<i64>) -> Self {
        UpdateRingTrackersArgs {
            trackers,
            state_batch_indices,
            logical_window: None,
            ring_buffer_len: None,
            pad_slot_id,
        }
    }
}

/// Arguments of `commit_replayssm_ring_trackers`: commit the previous speculative window
/// (its accepted count is known only now) and record the current query length.
///
/// Per request row `i` with a valid slot `s`: `q = prev_query_len[s]`,
/// `must = q > 0 && prev + q > W`; `start' = must ? (start + prev) % L : start`;
/// `prev' = q == 0 ? 0 : (must ? accepted[i] : prev + accepted[i])`;
/// `prev_query_len' = query_start_loc[i+1] − query_start_loc[i]`.
/// `num_accepted_tokens` `[>= n]` and `query_start_loc` `[>= n+1]` are i32/i64.
pub struct CommitRingTrackersArgs<'a> {
    /// The cursors.
    pub trackers: RingTrackers<'a>,
    /// Slot of each request (`[n]` or `[n, width]`, column 0).
    pub state_batch_indices: TensorRef<'a>,
    /// Tokens accepted from each request's previous query (bonus token included).
    pub num_accepted_tokens: TensorRef<'a>,
    /// Query starts of the current step.
    pub query_start_loc: TensorRef<'a>,
    /// `W`.
    pub logical_window: i64,
    /// `L`.
    pub ring_buffer_len: i64,
    /// The pad value; `None`: no pads.
    pub pad_slot_id: Option<i64>,
}

/// Arguments of `checkpointing_ssu` (FlashInfer's ReplaySSM decode, semantics/ssu.md §7.3),
/// Mamba2 tied form (one `A`, `dt`, `dt_bias` per head).
///
/// Shapes (`cache` slots, `H` heads, `P` = dim, `N` = dstate, `G` groups, `L` ring length):
/// - `state` `[cache, H, P, N]` f32/f16/bf16: the checkpoint `S0`; written only when a sequence flushes.
/// - `x_cache` `[cache, H, L, P]`, `B_cache` `[cache, G, L, N]` (f32/f16/bf16),
///   `dt_cache` `[cache, H, L]` f32 holding the **processed** dt (bias and softplus applied).
/// - `ring_start`, `prev_num_accepted_tokens` `[cache]` i32/i64: read only (the op never moves them).
/// - Tokens, three forms: one-token `x` `[batch, H, P]`; dense `x` `[batch, T, H, P]`;
///   varlen (`cu_seqlens` `[batch+1]`) `x` `[total, H, P]` or `[1, total, H, P]` with
///   `T = max_seqlen`. `dt` has `x`'s leading axes then `[H]`, or `[H, P]` with stride 0 on `P`;
///   `B`, `C` the leading axes then `[G, N]`; `z`, `out` like `x`.
/// - `A` `[H]` or `[H, P, N]` with stride 0 on `P` and `N`; `dt_bias` `[H]` or `[H, P]` with
///   stride 0 on `P`; `D` `[H]` or `[H, P]`.
/// - `state_batch_indices` `[batch]` or `[batch, width]` (column 0), i32/i64; `None`: row `b` uses slot `b`.
///
/// Per sequence with slot `s`, `k = prev_num_accepted_tokens[s]`, `start = ring_start[s]`,
/// `n` tokens (`n <= T`), `W = L − T` (an error when `T > W`): the sequence **flushes** when
/// `k + n > W`: the `k` history rows are replayed into the checkpoint and `S_k` is stored to
/// `state[s]`; otherwise the state is not touched. Outputs of the new tokens are the
/// recurrence from the checkpoint through the history and the new tokens (un-rounded f32).
/// On both branches the new tokens are appended at ring rows `(start + k + i) % L`.
/// A row whose slot equals `pad_slot_id` writes nothing, not even `out`; an empty varlen
/// sequence writes nothing.
pub struct CheckpointingSsuArgs<'a> {
    /// The checkpoint state pool.
    pub state: TensorMut<'a>,
    /// Ring of x, head-major.
    pub x_cache: TensorMut<'a>,
    /// Ring of B, per group.
    pub b_cache: TensorMut<'a>,
    /// Ring of processed dt (f32).
    pub dt_cache: TensorMut<'a>,
    /// Oldest live ring row per slot.
    pub ring_start: TensorRef<'a>,
    /// Live history rows per slot (`k`).
    pub prev_num_accepted_tokens: TensorRef<'a>,
    /// New tokens' x.
    pub x: TensorRef<'a>,
    /// New tokens' raw dt.
    pub dt: TensorRef<'a>,
    /// FlashInfer's `A` (negative).
    pub a: TensorRef<'a>,
    /// FlashInfer's `B`.
    pub b: TensorRef<'a>,
    /// FlashInfer's `C`.
    pub c: TensorRef<'a>,
    /// Output, written for every token of every non-pad, non-empty sequence.
    pub out: TensorMut<'a>,
    /// `D`, optional.
    pub d: Option<TensorRef<'a>>,
    /// Gate `out *= z·sigmoid(z)`, optional.
    pub z: Option<TensorRef<'a>>,
    /// Added to `dt` before softplus, optional.
    pub dt_bias: Option<TensorRef<'a>>,
    /// Softplus (threshold 20) on `dt + dt_bias`.
    pub dt_softplus: bool,
    /// Slot per sequence; `None`: the identity.
    pub state_batch_indices: Option<TensorRef<'a>>,
    /// The pad value; `None`: no pads.
    pub pad_slot_id: Option<i64>,
    /// Packed varlen sequence starts.
    pub cu_seqlens: Option<TensorRef<'a>>,
    /// Varlen: the window's token count `T` (FlashInfer's `max_seqlen`); required with `cu_seqlens`.
    pub max_seqlen: Option<usize>,
}
