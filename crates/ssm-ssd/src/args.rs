use ssm_tensor::{DType, TensorMut, TensorRef};

/// Arguments of vLLM's `mamba_chunk_scan_combined_varlen` (MATE's `ssd_combined_fwd_varlen`),
/// the Mamba2 SSD chunked prefill over a packed varlen batch (semantics/ssd_mamba2.md §1–§3).
///
/// Shapes (`T` tokens, `H` heads, `P` head dim, `N` dstate, `G` groups, `batch` sequences,
/// `nchunks` chunks):
/// - `x` `[T, H, P]`, `dt` `[T, H]`, `A` `[H]`, `B`/`C` `[T, G, N]` (head `h` uses group
///   `h / (H / G)`), `z`/`out` `[T, H, P]`, `D` `[H]` or `[H, P]`, `dt_bias` `[H]`. Float
///   tensors are f32/f16/bf16; `x`, `B`, `C`, `z`, `out` must be contiguous along their last
///   axis (any other strides, e.g. views into the conv output, are fine).
/// - `cu_seqlens` `[batch + 1]`, `cu_chunk_seqlens` `[nchunks + 1]`, `last_chunk_indices`
///   `[batch]`, `seq_idx` `[nchunks]`: i32/i64. Chunk `c` covers tokens
///   `[cu_chunk_seqlens[c], cu_chunk_seqlens[c+1])`, `1..=chunk_size` tokens of sequence
///   `seq_idx[c]`. [`crate::compute_chunk_metadata`] builds them as vLLM does.
/// - `initial_states` `[batch, H, P, N]`: the state entering each sequence.
/// - `varlen_states` (vLLM's return value) `[batch, H, P, N]`, or `[nchunks, H, P, N]` with
///   `return_intermediate_states`, in `state_dtype` (default `C`'s dtype).
/// - `workspace`: optional 1-D f32 scratch of at least [`crate::SsdPlan::workspace_len`]
///   elements on the device of `x`; without it a backend allocates per call.
///
/// Writes: every token of `out` (when given) and every row of `varlen_states`: the state at
/// the end of each chunk, or each sequence's final state (an empty sequence's final state is
/// its initial state, or zeros). Reads everything else only.
pub struct MambaChunkScanCombinedVarlen<'a> {
    /// SSM input.
    pub x: TensorRef<'a>,
    /// Raw time step (before `dt_bias`, softplus and the `dt_limit` clamp).
    pub dt: TensorRef<'a>,
    /// vLLM's `A` (negative), one per head.
    pub a: TensorRef<'a>,
    /// vLLM's `B`.
    pub b: TensorRef<'a>,
    /// vLLM's `C`.
    pub c: TensorRef<'a>,
    /// Tokens per chunk (a power of two).
    pub chunk_size: usize,
    /// Sequence starts in the packed tokens.
    pub cu_seqlens: TensorRef<'a>,
    /// Chunk starts in the packed tokens.
    pub cu_chunk_seqlens: TensorRef<'a>,
    /// Index of each sequence's last chunk (-1 for an empty sequence).
    pub last_chunk_indices: TensorRef<'a>,
    /// Sequence of each chunk.
    pub seq_idx: TensorRef<'a>,
    /// Output; `None` computes the states only.
    pub out: Option<TensorMut<'a>>,
    /// vLLM's `D`, optional.
    pub d: Option<TensorRef<'a>>,
    /// Gate `y *= z·sigmoid(z)`, optional.
    pub z: Option<TensorRef<'a>>,
    /// Added to `dt` before softplus, optional.
    pub dt_bias: Option<TensorRef<'a>>,
    /// State entering each sequence; `None`: zeros.
    pub initial_states: Option<TensorRef<'a>>,
    /// Softplus (threshold 20) on `dt + dt_bias`.
    pub dt_softplus: bool,
    /// Clamp of the processed dt, always applied (vLLM's default `(0, inf)`).
    pub dt_limit: (f32, f32),
    /// Return every chunk's end state instead of each sequence's final state.
    pub return_intermediate_states: bool,
    /// Dtype of the returned states; `None`: `C`'s dtype.
    pub state_dtype: Option<DType>,
    /// The returned states (vLLM's return value), written.
    pub varlen_states: TensorMut<'a>,
    /// Caller-owned f32 scratch.
    pub workspace: Option<TensorMut<'a>>,
}
