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
///   `return_intermediate_states`, in `state_dtype` (default `C`'s dtype); optional.
/// - `ssm_state` `[slots, H, P, N]` in `state_dtype` (slot stride may be padded, each slot
///   contiguous along dstate): a state pool read at `initial_state_indices` and written at
///   `final_state_indices`, `[batch]` i32/i64 slot tables whose `pad_slot_id` entries read
///   (zeros) or write nothing; `has_initial_state` `[batch]` bool/i32/i64.
///
/// Pool addressing. vLLM's Mamba2 prefill gathers `initial_states =
/// where(has_initial_states_p, ssm_state[state_indices_p], 0)` before the call and scatters
/// `ssm_state[state_indices_p] = varlen_states` after it (semantics/ssd_mamba2.md §4.3). The
/// pool arguments are that call with the gather and the scatter folded in: `ssm_state` is the
/// mixer's pool, `has_initial_state` its mask, and the read and write tables are separate
/// because vLLM's `"all"` cache mode reads and writes different blocks
/// (`block_idx_last_computed_token` / `block_idx_last_scheduled_token`; in `"none"`/`"align"`
/// mode both are `state_indices_tensor_p`). The pool is one argument, not a read view plus a
/// written view of the same memory, so that one call holds one writable view of it. Every
/// backend reads every initial state before it writes any final state, so a sequence may read
/// and write its own slot. Host tables are checked by the plan: an entry that is neither the
/// pad nor a slot is refused, and so is a slot written by one sequence and read or written by
/// another (the aliasing rule).
/// - Prefix-caching checkpoints (vLLM 0.33's `store_prefill_checkpoint` of the SSM state,
///   folded into the call): `checkpoint_chunk_indices` `[batch]` i32/i64 names the chunk whose
///   end state is sequence `b`'s checkpoint (-1: none;
///   [`crate::compute_chunk_metadata_with_checkpoints`] places a chunk end on each checkpoint
///   and names it), and `checkpoint_state_indices` `[batch]` the `ssm_state` slot it is written
///   to (a pad entry: not written; a sequence without a checkpoint ignores its entry, as vLLM's
///   null block). The checkpoint slot follows the aliasing rule of the final
///   slot, and may not be the sequence's own final slot. Without returning every chunk's state,
///   the checkpoint costs one state write per sequence.
/// - `scratch`: optional 1-D f32 scratch of at least [`crate::SsdPlan::scratch_len`]
///   elements on the device of `x`; without it a backend allocates per call.
///
/// Writes: every token of `out` (when given), every row of `varlen_states` (when given): the
/// state at the end of each chunk, or each sequence's final state (an empty sequence's final
/// state is its initial state, or zeros), each sequence's final state into the `ssm_state`
/// slot `final_state_indices` names and its checkpoint into the slot
/// `checkpoint_state_indices` names (pads and every other slot are never touched). Reads
/// everything else only.
pub struct MambaChunkScanCombinedVarlenArgs<'a> {
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
    /// State entering each sequence `[batch, H, P, N]`; `None`: zeros (or the pool's, with
    /// `initial_state_indices`, which excludes this argument).
    pub initial_states: Option<TensorRef<'a>>,
    /// State pool `[slots, H, P, N]` (vLLM's `ssm_state`), read through `initial_state_indices`
    /// and written through `final_state_indices`; needs at least one of them.
    pub ssm_state: Option<TensorMut<'a>>,
    /// `[batch]` slot of `ssm_state` each sequence enters with (vLLM's `state_indices_tensor_p`);
    /// a pad entry: zeros. Needs `ssm_state`, excludes `initial_states`.
    pub initial_state_indices: Option<TensorRef<'a>>,
    /// `[batch]` whether each sequence reads its initial state (vLLM's `has_initial_states_p`);
    /// `false` (0): it enters with zeros and nothing is read for it. `None`: every sequence
    /// reads one. Needs `initial_states` or `initial_state_indices`.
    pub has_initial_state: Option<TensorRef<'a>>,
    /// `[batch]` slot of `ssm_state` each sequence's final state is written to; a pad entry:
    /// not written. Needs `ssm_state`.
    pub final_state_indices: Option<TensorRef<'a>>,
    /// `[batch]` chunk whose end state is each sequence's checkpoint (vLLM's
    /// `checkpoint_chunk_idx`, -1 for none). Needs `checkpoint_state_indices`.
    pub checkpoint_chunk_indices: Option<TensorRef<'a>>,
    /// `[batch]` slot of `ssm_state` each sequence's checkpoint is written to (vLLM's
    /// `MambaPrefillCheckpointMetadata.state_indices`); a pad entry: not written. Needs
    /// `ssm_state` and `checkpoint_chunk_indices`.
    pub checkpoint_state_indices: Option<TensorRef<'a>>,
    /// The pad value of the slot tables (SEMANTICS.md rule 3); `None`: no entry is a pad.
    pub pad_slot_id: Option<i64>,
    /// Softplus (threshold 20) on `dt + dt_bias`.
    pub dt_softplus: bool,
    /// Clamp of the processed dt, always applied (vLLM's default `(0, inf)`).
    pub dt_limit: (f32, f32),
    /// Return every chunk's end state instead of each sequence's final state.
    pub return_intermediate_states: bool,
    /// Dtype of the returned states; `None`: `C`'s dtype.
    pub state_dtype: Option<DType>,
    /// The returned states (vLLM's return value), written; `None`: not returned (needs
    /// `return_intermediate_states` false).
    pub varlen_states: Option<TensorMut<'a>>,
    /// Caller-owned f32 scratch.
    pub scratch: Option<TensorMut<'a>>,
}

impl<'a> MambaChunkScanCombinedVarlenArgs<'a> {
    /// A call with the required tensors and vLLM's defaults for the rest: no output, no `D`,
    /// `z` or `dt_bias`, zero initial states, no pool, no checkpoints, no returned states, `dt_softplus`
    /// false, `dt_limit` `(0, inf)`, `state_dtype` `C`'s, no scratch. Set the optional fields
    /// with struct update syntax (`Args { out: Some(..), ..Args::new(..) }`).
    ///
    /// `tables` are, in vLLM's order, `cu_seqlens`, `cu_chunk_seqlens`,
    /// `last_chunk_indices` and `seq_idx`.
    pub fn new(
        x: TensorRef<'a>,
        dt: TensorRef<'a>,
        a: TensorRef<'a>,
        b: TensorRef<'a>,
        c: TensorRef<'a>,
        chunk_size: usize,
        tables: [TensorRef<'a>; 4],
    ) -> Self {
        let [cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx] = tables;
        MambaChunkScanCombinedVarlenArgs {
            x,
            dt,
            a,
            b,
            c,
            chunk_size,
            cu_seqlens,
            cu_chunk_seqlens,
            last_chunk_indices,
            seq_idx,
            out: None,
            d: None,
            z: None,
            dt_bias: None,
            initial_states: None,
            ssm_state: None,
            initial_state_indices: None,
            has_initial_state: None,
            final_state_indices: None,
            checkpoint_chunk_indices: None,
            checkpoint_state_indices: None,
            pad_slot_id: None,
            dt_softplus: false,
            dt_limit: (0.0, f32::INFINITY),
            return_intermediate_states: false,
            state_dtype: None,
            varlen_states: None,
            scratch: None,
        }
    }
}
