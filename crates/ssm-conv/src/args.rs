use ssm_tensor::{TensorMut, TensorRef};

/// The activation applied to each output, as vLLM's `activation` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `activation=None`: the convolution output as is.
    None,
    /// `activation="silu"` (or `"swish"`, or `True`): `y / (1 + e^-y)`.
    Silu,
}

/// How the conv-state pool is laid out, i.e. which axis of the given `conv_state` view is
/// the time (state) axis.
///
/// The layout is an explicit argument (SEMANTICS.md rule 6); strides are read from the view,
/// so any strided view works with either layout. vLLM's kernels index the logical
/// `(slots, dim, state_len)` view; under vLLM's default storage that view is the transpose of
/// a contiguous `(slots, state_len, dim)` buffer. Pass that transposed view (or the
/// conformance files' contiguous `[slots, dim, state_len]` tensors) as
/// [`ConvStateLayout::DimStateLen`], and the underlying contiguous buffer as
/// [`ConvStateLayout::StateLenDim`]: both describe the same memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvStateLayout {
    /// `conv_state` has shape `(slots, state_len, dim)`: vLLM's default "SD" storage.
    StateLenDim,
    /// `conv_state` has shape `(slots, dim, state_len)`: vLLM's "DS" storage
    /// (`VLLM_SSM_CONV_STATE_LAYOUT=DS`) and the logical view its kernels take.
    DimStateLen,
}

impl ConvStateLayout {
    /// The shape this layout expects, with dimension names (for error messages).
    pub(crate) fn describe(self) -> &'static str {
        match self {
            ConvStateLayout::StateLenDim => "(slots, state_len, dim)",
            ConvStateLayout::DimStateLen => "(slots, dim, state_len)",
        }
    }
}

/// Arguments of `causal_conv1d_update`: the decode step of the depthwise causal conv, with
/// a pool of conv states, pads, the speculative rolling buffer and prefix-caching tables.
///
/// Token-major shapes: every `x`/`out` here is `[.., tokens, dim]`. vLLM's 3-D x
/// `[batch, dim, seqlen]` is the same memory seen through a permuted-stride view
/// `[batch, seqlen, dim]` with strides `[dim·seqlen, 1, seqlen]`; any strides are accepted.
///
/// What the call writes (vLLM's Triton `causal_conv1d_update`, semantics/gdn_conv.md §4.4):
/// - `out` rows of every sequence that is neither a pad nor empty; pad and empty rows are
///   left as they were (vLLM writes into `x` in place, so there they keep the input);
/// - columns `[0, L)` of each such sequence's write slot, where the effective state length
///   `L` is `width − 1` without `num_accepted_tokens` and `width − 2 + q` with it (q = that
///   sequence's token count). Columns `≥ L` and every other slot are never touched.
///
/// All floating-point tensors share one dtype (f32, f16 or bf16): the computation runs in
/// that storage dtype as vLLM's does after `x.to(conv_state.dtype)`.
pub struct CausalConv1dUpdateArgs<'a> {
    /// `[batch, dim]` (one token each), `[batch, seqlen, dim]`, or with `query_start_loc`
    /// `[num_tokens, dim]` (packed varlen).
    pub x: TensorRef<'a>,
    /// The conv-state pool, shaped as `conv_state_layout` says; `state_len ≥ width − 1`.
    pub conv_state: TensorMut<'a>,
    /// Which axis of `conv_state` is the state (time) axis.
    pub conv_state_layout: ConvStateLayout,
    /// `[dim, width]`, width 2, 3 or 4; `weight[:, width − 1]` multiplies the current token.
    pub weight: TensorRef<'a>,
    /// `[dim]`, added before the activation.
    pub bias: Option<TensorRef<'a>>,
    /// Activation of the outputs.
    pub activation: Activation,
    /// `[batch]` or `[batch, n]` (i32/i64) slot table; `None` means sequence b uses slot b.
    /// A 2-D table is read in column 0, or in the prefix-caching columns below.
    pub conv_state_indices: Option<TensorRef<'a>>,
    /// `[batch]` (i32/i64): speculative decoding. Sequence b's window starts at column
    /// `num_accepted_tokens[b] − 1` and the buffer rolls by one (vLLM's GPU rolling buffer).
    pub num_accepted_tokens: Option<TensorRef<'a>>,
    /// `[batch + 1]` (i32/i64) non-decreasing token starts into a 2-D `x`.
    pub query_start_loc: Option<TensorRef<'a>>,
    /// The pad value of the slot tables (vLLM's `null_block_id`, or `pad_slot_id` in older
    /// versions). No default: `None` means no entry is a pad.
    pub pad_slot_id: Option<i64>,
    /// `[batch]` (i32/i64), prefix caching: the column of `conv_state_indices` the new state
    /// is written to. Given together with `initial_state_idx`.
    pub block_idx_last_scheduled_token: Option<TensorRef<'a>>,
    /// `[batch]` (i32/i64), prefix caching: the column of `conv_state_indices` the history
    /// is read from.
    pub initial_state_idx: Option<TensorRef<'a>>,
    /// Output, the shape and dtype of `x`.
    pub out: TensorMut<'a>,
}

/// Arguments of `causal_conv1d_fn`: varlen prefill over packed tokens.
///
/// Sequence b covers tokens `[query_start_loc[b], query_start_loc[b+1])` of `x`. Its history
/// is the first `width − 1` columns of its slot when `has_initial_state[b]`, else zeros. The
/// call writes (vLLM's Triton `causal_conv1d_fn`, semantics/gdn_conv.md §4.3):
/// - `out` rows of every sequence whose slot is not the pad; rows of pad sequences and rows
///   past `query_start_loc[batch]` are left as they were;
/// - columns `[0, width − 1)` of each non-pad, non-empty sequence's slot: the last
///   `width − 1` inputs of the history followed by the sequence. Wider buffers keep their
///   other columns; other slots are never touched;
/// - with `checkpoint_offsets`, columns `[0, width − 1)` of each checkpoint's slot: the same
///   window after the sequence's first `offset` tokens (vLLM 0.33's `store_prefill_checkpoint`,
///   its conv half).
///
/// The update's prefix-caching mode (`block_idx_*` tables) is not supported here.
pub struct CausalConv1dFnArgs<'a> {
    /// `[num_tokens, dim]` packed tokens (vLLM passes the transposed view `[dim, num_tokens]`
    /// of this memory; the logical axes here are token-major, any strides).
    pub x: TensorRef<'a>,
    /// `[dim, width]`, width 2, 3 or 4.
    pub weight: TensorRef<'a>,
    /// `[dim]`.
    pub bias: Option<TensorRef<'a>>,
    /// The conv-state pool, shaped as `conv_state_layout` says; `state_len ≥ width − 1`.
    pub conv_states: TensorMut<'a>,
    /// Which axis of `conv_states` is the state (time) axis.
    pub conv_state_layout: ConvStateLayout,
    /// `[batch + 1]` (i32/i64) non-decreasing token starts.
    pub query_start_loc: TensorRef<'a>,
    /// `[batch]` (i32/i64) slot of each sequence; `None` means sequence b uses slot b.
    pub cache_indices: Option<TensorRef<'a>>,
    /// `[batch]` bool: read the history from the slot (true) or start from zeros (false).
    /// `None` means no sequence has an initial state.
    pub has_initial_state: Option<TensorRef<'a>>,
    /// Activation of the outputs.
    pub activation: Activation,
    /// The pad value of `cache_indices` and `checkpoint_state_indices` (vLLM's
    /// `null_block_id`). No default: `None` means no entry is a pad.
    pub pad_slot_id: Option<i64>,
    /// `[batch]` (i32/i64), prefix caching: sequence b's checkpoint lies after its first
    /// `checkpoint_offsets[b]` tokens; 0 means no checkpoint, else `1 ≤ offset < ` the
    /// sequence's tokens (as vLLM places them: past the query's start, before its end). Given
    /// together with `checkpoint_state_indices`.
    pub checkpoint_offsets: Option<TensorRef<'a>>,
    /// `[batch]` (i32/i64): the slot of `conv_states` each checkpoint is written to, not the
    /// sequence's own slot. The pad writes nothing; the entry of a sequence without a checkpoint
    /// is not read (vLLM leaves its null block there).
    pub checkpoint_state_indices: Option<TensorRef<'a>>,
    /// Output `[num_tokens, dim]`, the dtype of `x`.
    pub out: TensorMut<'a>,
}
