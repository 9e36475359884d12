use ssm_tensor::{ArgError, DType};

/// Why a ReplaySSM call was refused. Every variant names the argument (as vLLM and
/// FlashInfer name it), what was expected and what came. Nothing is written when a call fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RingError {
    /// A tensor argument that does not meet the contract (shape, rank, dtype, device, strides, …).
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// The three tracker tensors do not have one entry per state slot each.
    #[error(
        "`ring_start`, `prev_num_accepted` and `prev_query_len` must have the same length and dtype, got lengths {ring_start}, {prev_num_accepted}, {prev_query_len} and dtypes {}, {}, {}",
        .dtypes[0], .dtypes[1], .dtypes[2]
    )]
    TrackerMismatch {
        /// Length of `ring_start`.
        ring_start: usize,
        /// Length of `prev_num_accepted`.
        prev_num_accepted: usize,
        /// Length of `prev_query_len`.
        prev_query_len: usize,
        /// The three dtypes.
        dtypes: [DType; 3],
    },
    /// A scalar argument is out of its range.
    #[error("`{arg}` must be {expected}, got {actual}")]
    Value {
        /// Argument name.
        arg: &'static str,
        /// The accepted range.
        expected: &'static str,
        /// The value that came.
        actual: i64,
    },
    /// The ring cannot hold a window of `T` new tokens: the logical window `W = L − T` is smaller than `T`.
    #[error(
        "the ring of length L = {ring_len} (`x_cache`.shape[2]) leaves a window W = L - T = {window} for T = {tokens} new tokens per sequence; T must be <= W"
    )]
    RingTooShort {
        /// `L`.
        ring_len: usize,
        /// `T`.
        tokens: usize,
        /// `W = L − T` (negative when T > L).
        window: i64,
    },
    /// Two rows of one call name the same state slot (pads excepted); each row writes its
    /// slot, so the result would depend on the order of rows.
    #[error(
        "`{arg}`: slot {slot} is written by sequence {first} and by sequence {second}; sequences of one call must not share a written slot (pads excepted)"
    )]
    SlotConflict {
        /// Argument name.
        arg: &'static str,
        /// The slot.
        slot: usize,
        /// The first row naming it.
        first: usize,
        /// The second row naming it.
        second: usize,
    },
    /// A host-resident slot index is neither the pad value nor in `[0, slots)`.
    #[error("`{arg}`[{row}] = {value} is outside [0, {slots}) and is not the pad value ({pad})")]
    IndexOutOfRange {
        /// Argument name.
        arg: &'static str,
        /// Row of the table.
        row: usize,
        /// The value found.
        value: i64,
        /// Slots in the pool.
        slots: usize,
        /// The pad value, or "none".
        pad: String,
    },
    /// A host-resident ring cursor of a slot the call uses is outside its range.
    #[error("`{arg}`[{slot}] = {value} (slot of sequence {row}) must be in [0, {limit}]")]
    CursorOutOfRange {
        /// `ring_start` or `prev_num_accepted_tokens`.
        arg: &'static str,
        /// The slot.
        slot: usize,
        /// The sequence using it.
        row: usize,
        /// The value found.
        value: i64,
        /// The largest value allowed.
        limit: i64,
    },
    /// `cu_seqlens` is not a valid list of sequence starts.
    #[error(
        "`cu_seqlens` must start at 0, be non-decreasing and end at the token count ({tokens}); entry {at} is {value} after {prev}"
    )]
    CuSeqlens {
        /// Index of the offending entry.
        at: usize,
        /// Its value.
        value: i64,
        /// The previous entry (0 for the first).
        prev: i64,
        /// Packed tokens in `x`.
        tokens: usize,
    },
    /// A varlen sequence is longer than `max_seqlen`.
    #[error("sequence {seq} has {len} tokens, more than `max_seqlen` = {max_seqlen}")]
    SeqTooLong {
        /// The sequence.
        seq: usize,
        /// Its length.
        len: usize,
        /// The declared maximum.
        max_seqlen: usize,
    },
}
