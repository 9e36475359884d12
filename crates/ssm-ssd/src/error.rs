use ssm_tensor::{ArgError, DType};

/// Why a `mamba_chunk_scan_combined_varlen` call was refused. Every variant names the
/// argument (as vLLM names it), what was expected and what came. Nothing is written when a
/// call fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SsdError {
    /// A tensor argument that does not meet the contract (shape, rank, dtype, device, strides, …).
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// `chunk_size` is not a positive power of two.
    #[error("`chunk_size` must be a power of two, got {0}")]
    ChunkSize(usize),
    /// `dt_limit` is not an interval.
    #[error("`dt_limit` must be (lo, hi) with lo <= hi, got ({lo}, {hi})")]
    DtLimit {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
    /// `seq_idx` does not hold one entry per chunk.
    #[error(
        "`seq_idx` must have one entry per chunk: shape [nchunks={nchunks}] (from `cu_chunk_seqlens` of length {cu_len}), got {actual:?}"
    )]
    SeqIdxLength {
        /// Chunks described by `cu_chunk_seqlens`.
        nchunks: usize,
        /// Length of `cu_chunk_seqlens`.
        cu_len: usize,
        /// Shape of `seq_idx`.
        actual: Vec<usize>,
    },
    /// `initial_states` does not have one row per sequence.
    #[error(
        "`initial_states` must have one state per sequence: shape {expected} (batch from `cu_seqlens`), got {actual:?}"
    )]
    InitialStatesBatch {
        /// The expected shape.
        expected: String,
        /// The shape that came.
        actual: Vec<usize>,
    },
    /// `cu_seqlens` or `cu_chunk_seqlens` is not a valid list of offsets.
    #[error(
        "`{arg}` must start at 0, {rule} and end at the token count ({tokens}); entry {at} is {value} after {prev}"
    )]
    Offsets {
        /// Argument name.
        arg: &'static str,
        /// "be non-decreasing" or "be strictly increasing (no empty chunk)".
        rule: &'static str,
        /// Index of the offending entry.
        at: usize,
        /// Its value.
        value: i64,
        /// The previous entry (0 for the first).
        prev: i64,
        /// Tokens in `x`.
        tokens: usize,
    },
    /// A chunk holds more than `chunk_size` tokens.
    #[error("chunk {chunk} holds tokens [{start}, {end}), {len} tokens, more than `chunk_size` = {chunk_size}")]
    ChunkTooLong {
        /// The chunk.
        chunk: usize,
        /// Its first token.
        start: i64,
        /// One past its last token.
        end: i64,
        /// Its length.
        len: i64,
        /// The chunk size.
        chunk_size: usize,
    },
    /// A `seq_idx` entry is out of range or decreases.
    #[error("`seq_idx`[{chunk}] = {value} must be in [0, batch={batch}) and >= the previous entry ({prev})")]
    SeqIdx {
        /// The chunk.
        chunk: usize,
        /// Its sequence.
        value: i64,
        /// The previous chunk's sequence (-1 for the first chunk).
        prev: i64,
        /// Sequences.
        batch: usize,
    },
    /// A chunk's tokens are not all inside the sequence `seq_idx` names.
    #[error(
        "chunk {chunk} holds tokens [{start}, {end}) but `seq_idx`[{chunk}] = {seq} owns tokens [{seq_start}, {seq_end}): a chunk must not span two sequences"
    )]
    ChunkSpansSequences {
        /// The chunk.
        chunk: usize,
        /// Its first token.
        start: i64,
        /// One past its last token.
        end: i64,
        /// Its sequence.
        seq: i64,
        /// The sequence's first token.
        seq_start: i64,
        /// One past the sequence's last token.
        seq_end: i64,
    },
    /// A `last_chunk_indices` entry is not the last chunk of its sequence.
    #[error(
        "`last_chunk_indices`[{seq}] = {actual}, but the last chunk of sequence {seq} is {expected} (-1: the sequence is empty)"
    )]
    LastChunkIndex {
        /// The sequence.
        seq: usize,
        /// The last chunk with `seq_idx == seq`, or -1.
        expected: i64,
        /// The value found.
        actual: i64,
    },
    /// `state_dtype` disagrees with the `varlen_states` buffer.
    #[error("`varlen_states` must have dtype {expected} (`state_dtype`, default `C`'s dtype), got {actual}")]
    StateDtype {
        /// The state dtype asked for.
        expected: DType,
        /// The buffer's dtype.
        actual: DType,
    },
    /// The caller's scratch is too small or not an f32 host buffer.
    #[error("`scratch` must be a 1-D f32 buffer of at least {needed} elements, got {dtype} with shape {actual:?}")]
    Scratch {
        /// Elements needed.
        needed: usize,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        actual: Vec<usize>,
    },
    /// A host-resident slot index is neither the pad nor a slot of its pool.
    #[error(
        "`{arg}`[{seq}] = {value} is outside [0, {slots}) (the slots of `ssm_state`) and is not the pad value ({pad})"
    )]
    SlotOutOfRange {
        /// The table.
        arg: &'static str,
        /// The sequence (entry of the table).
        seq: usize,
        /// The value found.
        value: i64,
        /// Slots in `ssm_state`.
        slots: usize,
        /// The pad value, or "none".
        pad: String,
    },
    /// A slot written by one sequence is read or written by another (host tables).
    #[error(
        "`final_state_indices`: slot {slot} is written by sequence {writer} and {other_use} by sequence {other}; sequences of one call must not share a written slot (pads excepted)"
    )]
    SlotConflict {
        /// The slot.
        slot: usize,
        /// The (lowest-numbered) sequence writing it.
        writer: usize,
        /// The other sequence.
        other: usize,
        /// "read" (through `initial_state_indices`) or "written".
        other_use: &'static str,
    },
    /// A host-resident checkpoint chunk that is neither -1 nor a chunk of its sequence.
    #[error(
        "`checkpoint_chunk_indices`[{seq}] = {value} must be -1 (no checkpoint) or a chunk of sequence {seq} ({chunks})"
    )]
    CheckpointChunk {
        /// The sequence.
        seq: usize,
        /// The value found.
        value: i64,
        /// The sequence's chunks, "chunks a..=b" or "it has none".
        chunks: String,
    },
    /// A checkpoint slot that another write or read of the call also uses (host tables).
    #[error(
        "`checkpoint_state_indices`: slot {slot} is written by sequence {writer} and {other_use} by sequence {other}, one of them as a checkpoint; a written slot must be used by nothing else in the call (pads excepted)"
    )]
    CheckpointSlotConflict {
        /// The slot.
        slot: usize,
        /// The sequence writing it (a checkpoint or a final state).
        writer: usize,
        /// The other sequence.
        other: usize,
        /// "read" or "written".
        other_use: &'static str,
    },
    /// A sequence's checkpoint slot is its own final slot (host tables).
    #[error(
        "`checkpoint_state_indices`[{seq}] = {slot} is also sequence {seq}'s final slot (`final_state_indices`); a sequence's checkpoint and final state must go to different slots"
    )]
    CheckpointIsFinalSlot {
        /// The sequence.
        seq: usize,
        /// The slot.
        slot: usize,
    },
    /// A checkpoint offset of [`crate::try_compute_chunk_metadata_with_checkpoints`] outside
    /// its sequence.
    #[error(
        "`checkpoint_offsets`[{seq}] = {value} must be 0 (no checkpoint) or inside the sequence's {tokens} new tokens (1..{tokens})"
    )]
    CheckpointOffset {
        /// The sequence.
        seq: usize,
        /// The value found.
        value: i64,
        /// The sequence's new tokens.
        tokens: i64,
    },
}
