use ssm_tensor::{ArgError, DType};

/// Why a selective state update was refused. Every variant names the argument (as vLLM
/// names it), what was expected and what came. Nothing is written when a call fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SsuError {
    /// A tensor argument that does not meet the contract (shape, rank, dtype, device, strides, …).
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// A 1-D slot table was given where a 2-D `[seqs, width]` one is needed.
    #[error("`{arg}` must be a 2-D [seqs, width] table {why}, got shape {actual:?}")]
    TableNeeds2D {
        /// Argument name.
        arg: &'static str,
        /// Why 2-D is needed.
        why: &'static str,
        /// The shape that came.
        actual: Vec<usize>,
    },
    /// A slot table has fewer rows than there are sequences.
    #[error("`{arg}` must have at least {needed} rows (one per sequence), got shape {actual:?}")]
    TableTooShort {
        /// Argument name.
        arg: &'static str,
        /// Sequences in the call.
        needed: usize,
        /// The table's shape.
        actual: Vec<usize>,
    },
    /// A slot table is too narrow for a column the call reads.
    #[error("`{arg}` has width {width}, but sequence {seq} needs column {column}")]
    TableTooNarrow {
        /// Argument name.
        arg: &'static str,
        /// The table's width.
        width: usize,
        /// The sequence that needs it.
        seq: usize,
        /// The column needed.
        column: usize,
    },
    /// Two sequences of one call share a slot that one of them writes (pads excepted); the
    /// result would depend on the order of sequences, which device kernels cannot honour.
    #[error(
        "`{arg}`: slot {slot} is written by sequence {writer} and {other_use} by sequence {other}; sequences of one call must not share a written slot (pads excepted)"
    )]
    SlotConflict {
        /// The table that writes the slot.
        arg: &'static str,
        /// The slot.
        slot: usize,
        /// The (lowest-numbered) sequence writing it.
        writer: usize,
        /// The other sequence.
        other: usize,
        /// "read" or "written": what the other sequence does with the slot.
        other_use: &'static str,
    },
    /// A host-resident slot index is neither the pad value nor in `[0, slots)`.
    #[error("`{arg}`[{seq}, {column}] = {value} is outside [0, {slots}) and is not the pad value ({pad})")]
    IndexOutOfRange {
        /// Argument name.
        arg: &'static str,
        /// Sequence (row of the table).
        seq: usize,
        /// Column of the table.
        column: usize,
        /// The value found.
        value: i64,
        /// Slots in the state pool.
        slots: usize,
        /// The pad value, or "none".
        pad: String,
    },
    /// `cu_seqlens` is not a valid list of sequence starts.
    #[error(
        "`cu_seqlens` must be non-decreasing from a value >= 0 up to at most rows ({rows}); entry {at} is {value} after {prev}"
    )]
    CuSeqlens {
        /// Index of the offending entry.
        at: usize,
        /// Its value.
        value: i64,
        /// The previous entry (0 for the first).
        prev: i64,
        /// Token rows in `x`.
        rows: usize,
    },
    /// A dense 4-D `x` was combined with `cu_seqlens`.
    #[error(
        "`cu_seqlens` describes a packed 3-D `x` [rows, heads, dim]; a dense 4-D `x` {actual:?} already fixes the sequence lengths"
    )]
    DenseWithCuSeqlens {
        /// The shape of `x`.
        actual: Vec<usize>,
    },
    /// Stochastic rounding requested for a state that is not fp16.
    #[error("stochastic rounding needs an f16 `state`, got {actual}")]
    StochasticRoundingDtype {
        /// The state's dtype.
        actual: DType,
    },
    /// More Philox rounds than [`StochasticRounding::MAX_ROUNDS`](crate::StochasticRounding::MAX_ROUNDS).
    #[error("`philox_rounds` must be at most {max} (0 = the default of 10), got {rounds}", max = crate::StochasticRounding::MAX_ROUNDS)]
    PhiloxRounds {
        /// The rounds asked for.
        rounds: u32,
    },
    /// An argument excludes another one that was given.
    #[error("`{arg}` {why}")]
    Combination {
        /// The argument given.
        arg: &'static str,
        /// What it excludes, and why.
        why: &'static str,
    },
    /// A sequence has more tokens than the intermediate-state buffer has steps.
    #[error("sequence {seq} has {len} tokens, but `intermediate_states_buffer` holds {steps} steps per entry")]
    IntermediateSteps {
        /// The sequence.
        seq: usize,
        /// Its tokens.
        len: usize,
        /// Steps per buffer entry.
        steps: usize,
    },
    /// A sequence's intermediate-buffer entry is neither the pad nor inside the buffer.
    #[error(
        "sequence {seq}: `intermediate_states_buffer` entry {entry} (from {from}) is outside [0, {entries}) and is not the pad value ({pad})"
    )]
    IntermediateEntry {
        /// The sequence.
        seq: usize,
        /// The entry it names.
        entry: i64,
        /// Where the entry came from.
        from: &'static str,
        /// Entries of the buffer.
        entries: usize,
        /// The pad value, or "none".
        pad: String,
    },
    /// An unknown SSU algorithm name.
    #[error("unknown SSU algorithm `{name}`; expected one of auto, simple, vertical, horizontal")]
    UnknownAlgorithm {
        /// The name given.
        name: String,
    },
}
