use ssm_tensor::{TensorMut, TensorRef};

/// Stochastic rounding of an fp16 state on its final store (semantics/ssu.md §2.7, §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StochasticRounding {
    /// Philox key. vLLM draws it per call; here the caller passes it, so that every
    /// backend produces the same bits for the same seed.
    pub seed: u64,
    /// Philox rounds; 0 means Triton's default of 10 (vLLM's `cache_philox_rounds = 0`).
    pub philox_rounds: u32,
}

impl StochasticRounding {
    /// The most Philox rounds a call may ask for. Each round is work per state element, so an
    /// unbounded count would let one argument stall the call; Philox4x32 is specified with 10
    /// (Triton's default) and 7 already passes BigCrush.
    pub const MAX_ROUNDS: u32 = 64;

    /// The number of Philox rounds actually run.
    pub fn rounds(&self) -> u32 {
        if self.philox_rounds == 0 { 10 } else { self.philox_rounds }
    }
}

/// Arguments of one selective state update, named as vLLM's Python API names them.
///
/// Shapes (vLLM's unsqueeze rules apply: a rank one lower means "no heads axis" / "one group"):
/// - `state` `[slots, heads, dim, dstate]` (or `[slots, dim, dstate]`), f32/f16/bf16, or i16 / i8
///   with `state_scale`; updated in place; its last dimension must be contiguous.
/// - `state_scale` `[slots, heads, dim]` (or `[slots, dim]` with a 3-D state; a trailing axis of
///   1 is accepted), f32: the decode scale of each i16 / i8 state row, rewritten with the row.
/// - `x`, `dt`, `z`, `out`: `[rows, heads, dim]` (or `[rows, dim]`), or dense `[batch, steps, heads, dim]`.
///   `rows` is the batch (one token per sequence) or the packed token count with `cu_seqlens`.
/// - `a` (vLLM's `A`) `[heads, dim, dstate]` (or `[dim, dstate]`), already negative (`-exp(A_log)`).
/// - `b`, `c` (`B`, `C`): `[rows, groups, dstate]` (or `[rows, dstate]`, or dense `[batch, steps, groups, dstate]`);
///   head `h` uses group `h / (heads / groups)`.
/// - `d`, `dt_bias` (`D`, `dt_bias`): `[heads, dim]` (or `[dim]`).
/// - Tied (Mamba2) form: `A` strides of the last two axes, `dt`'s last stride and `dt_bias`'s
///   last stride are 0 (stride-0 broadcast views) — one scalar per head is read.
/// - `state_batch_indices`, `dst_state_batch_indices`: `[seqs]` or `[seqs, width]`, i32/i64.
/// - `num_accepted_tokens`: `[seqs]`, i32/i64; needs a 2-D `state_batch_indices`.
/// - `cu_seqlens`: `[seqs + 1]`, i32/i64, with a packed 3-D `x`.
/// - `intermediate_states_buffer`: `[entries, steps, heads, dim, dstate]` (or
///   `[entries, steps, dim, dstate]` with a 3-D state), the state's dtype, its last dimension
///   contiguous; `intermediate_state_indices`: `[>= seqs]`, i32/i64.
///
/// Verification without commit (FlashInfer's `disable_state_update` and intermediate-state
/// buffer, semantics/ssu.md §5.3–5.4):
/// - `disable_state_update`: the pool is read and never written (neither the final store nor
///   the per-token speculative stores); `out` and the intermediate buffer are still written.
/// - `intermediate_states_buffer`: the state after token `t` of sequence `b` is stored (rounded
///   to nearest even) to entry `intermediate_state_indices[b]` (default: the sequence's source
///   slot), step `t`, and the pool is not written. A pad source, or a pad value in
///   `intermediate_state_indices`, writes no buffer row; `out` is still written. The steps axis is the capacity: a sequence longer
///   than it is refused (host tables) or skipped and reported (device tables).
/// - With an i16 / i8 state the buffer has the same dtype, and `intermediate_state_scales`
///   `[entries, steps, heads, dim]` (f32) receives each buffered row's decode scale.
///
/// Block-scaled integer state (FlashInfer's `state_scale`, semantics/ssu.md §5.3, [`crate::quant`]):
/// i16, or i8 (the 8-bit state, one scale per (slot, head, row) likewise). A row is read as
/// `state · state_scale`; every stored row (final, speculative per-token and buffered) is
/// quantized with `encode = LIMIT / max|row|` (LIMIT 32767 for i16, 127 for i8) and its decode
/// scale `1 / encode` written beside it. A pad source reads zeros and never reads its scale. Stochastic rounding
/// and `rand_seed` are refused with it (FlashInfer refuses `rand_seed` with `state_scale`).
///
/// - Refused, with typed errors: either of them with `dst_state_batch_indices` (FlashInfer's
///   one-token and multi-token kernels disagree on what that combination writes), and the
///   buffer with stochastic rounding (which applies to the pool's final store only).
pub struct SelectiveStateUpdateArgs<'a> {
    /// The state pool, updated in place.
    pub state: TensorMut<'a>,
    /// Input activations.
    pub x: TensorRef<'a>,
    /// Time step (before `dt_bias` and softplus).
    pub dt: TensorRef<'a>,
    /// vLLM's `A`.
    pub a: TensorRef<'a>,
    /// vLLM's `B`.
    pub b: TensorRef<'a>,
    /// vLLM's `C`.
    pub c: TensorRef<'a>,
    /// vLLM's `D` (skip connection), optional.
    pub d: Option<TensorRef<'a>>,
    /// Added to `dt` in f32 before softplus, optional.
    pub dt_bias: Option<TensorRef<'a>>,
    /// Gate: `out *= z·sigmoid(z)`, optional.
    pub z: Option<TensorRef<'a>>,
    /// Apply `softplus` (threshold 20) to `dt + dt_bias`.
    pub dt_softplus: bool,
    /// Source slot per sequence (1-D) or per (sequence, column) (2-D).
    pub state_batch_indices: Option<TensorRef<'a>>,
    /// Destination slots; default `state_batch_indices`.
    pub dst_state_batch_indices: Option<TensorRef<'a>>,
    /// The pad value (vLLM's `null_block_id` / `pad_slot_id`). No default: `None` means no pads.
    pub pad_slot_id: Option<i64>,
    /// Output, written for every token of every non-empty sequence (pad rows included).
    pub out: TensorMut<'a>,
    /// Speculative decoding: accepted tokens of the previous step per sequence.
    pub num_accepted_tokens: Option<TensorRef<'a>>,
    /// Packed varlen: sequence starts in the token rows.
    pub cu_seqlens: Option<TensorRef<'a>>,
    /// Stochastic rounding of an fp16 state (final store only).
    pub stochastic_rounding: Option<StochasticRounding>,
    /// Verify without committing: no write to `state` (FlashInfer's `disable_state_update`).
    pub disable_state_update: bool,
    /// Every token's state, cached for verification (FlashInfer's `intermediate_states_buffer`).
    pub intermediate_states_buffer: Option<TensorMut<'a>>,
    /// Buffer entry per sequence (FlashInfer's `intermediate_state_indices`); default: the
    /// sequence's source slot.
    pub intermediate_state_indices: Option<TensorRef<'a>>,
    /// FlashInfer's `rand_seed`: the Philox key of stochastic rounding read from this one-element
    /// i64 tensor (on the call's device) when the kernel runs, in place of
    /// `stochastic_rounding.seed`; a CUDA graph captured with it draws fresh bits whenever the
    /// tensor is rewritten between replays. Needs `stochastic_rounding` (its `philox_rounds`
    /// still apply).
    pub rand_seed: Option<TensorRef<'a>>,
    /// FlashInfer's `state_scale`: the f32 decode scale of every row of an i16 / i8 `state`,
    /// rewritten in place with the rows. Required with an integer state, refused otherwise.
    pub state_scale: Option<TensorMut<'a>>,
    /// FlashInfer's `intermediate_state_scales`: the decode scale of every buffered row of an
    /// i16 / i8 `intermediate_states_buffer`. Required with one, refused otherwise.
    pub intermediate_state_scales: Option<TensorMut<'a>>,
}

impl<'a> SelectiveStateUpdateArgs<'a> {
    /// A call with the required tensors only: no `D`, `dt_bias`, `z` or tables, no pads, no
    /// softplus, not speculative or varlen, no stochastic rounding, no verification arguments
    /// and a float state. Callers set what they need with struct update syntax:
    /// `SelectiveStateUpdateArgs { dt_softplus: true, ..SelectiveStateUpdateArgs::new(…) }`.
    pub fn new(
        state: TensorMut<'a>,
        x: TensorRef<'a>,
        dt: TensorRef<'a>,
        a: TensorRef<'a>,
        b: TensorRef<'a>,
        c: TensorRef<'a>,
        out: TensorMut<'a>,
    ) -> Self {
        SelectiveStateUpdateArgs {
            state,
            x,
            dt,
            a,
            b,
            c,
            d: None,
            dt_bias: None,
            z: None,
            dt_softplus: false,
            state_batch_indices: None,
            dst_state_batch_indices: None,
            pad_slot_id: None,
            out,
            num_accepted_tokens: None,
            cu_seqlens: None,
            stochastic_rounding: None,
            disable_state_update: false,
            intermediate_states_buffer: None,
            intermediate_state_indices: None,
            rand_seed: None,
            state_scale: None,
            intermediate_state_scales: None,
        }
    }
}
