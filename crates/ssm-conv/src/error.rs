use ssm_tensor::ArgError;

/// Why a causal conv1d call was refused. Every variant names the argument (as vLLM names
/// it), what was expected and what came. Nothing is written when a call fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvError {
    /// A tensor argument that does not meet the contract (shape, rank, dtype, device, strides, …).
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// The conv width (last dimension of `weight`) is outside 2..=4.
    #[error("`weight` must have shape [dim, width] with width in 2..=4, got width {actual} (shape {shape:?})")]
    Width {
        /// The width that came.
        actual: usize,
        /// The weight's shape.
        shape: Vec<usize>,
    },
    /// The conv-state buffer is shorter than the window.
    #[error(
        "`{arg}` must hold state_len >= width - 1 = {needed} columns (layout {layout}), got state_len {actual} (shape {shape:?})"
    )]
    StateLen {
        /// Argument name.
        arg: &'static str,
        /// Layout the shape was read with.
        layout: &'static str,
        /// `width − 1`.
        needed: usize,
        /// The state length that came.
        actual: usize,
        /// The state's shape.
        shape: Vec<usize>,
    },
    /// The speculative rolling buffer does not fit in the conv-state buffer.
    #[error(
        "speculative decoding needs `conv_state` state_len >= width - 2 + query length = {needed} (width {width}, query length {query_len}), got state_len {actual}"
    )]
    SpecStateLen {
        /// Needed state length.
        needed: usize,
        /// Conv width.
        width: usize,
        /// Tokens of the sequence that does not fit.
        query_len: usize,
        /// The state length that came.
        actual: usize,
    },
    /// An argument needs another one that was not given, or excludes one that was.
    #[error("`{arg}` {why}")]
    Combination {
        /// The argument given.
        arg: &'static str,
        /// What it needs or excludes.
        why: &'static str,
    },
    /// `query_start_loc` is not a non-decreasing sequence inside `[0, num_tokens]`.
    #[error("`query_start_loc` must be non-decreasing within [0, {num_tokens}] (the tokens of `x`), got {actual:?}")]
    QueryStartLoc {
        /// Tokens in `x`.
        num_tokens: usize,
        /// The values that came.
        actual: Vec<i64>,
    },
    /// A host-resident slot index is neither the pad nor a slot of the pool.
    #[error("`{arg}`{position:?} = {value} is neither the pad slot ({pad}) nor a slot in [0, {slots})")]
    SlotOutOfRange {
        /// Argument name.
        arg: &'static str,
        /// Index of the entry.
        position: Vec<usize>,
        /// Its value.
        value: i64,
        /// The pad value, `None` when no pad was named.
        pad: PadDisplay,
        /// Slots in the pool.
        slots: usize,
    },
    /// A host-resident column index into a 2-D slot table is out of range.
    #[error("`{arg}`[{position}] = {value} must be a column of `conv_state_indices` in [0, {columns})")]
    ColumnOutOfRange {
        /// Argument name.
        arg: &'static str,
        /// Index of the entry.
        position: usize,
        /// Its value.
        value: i64,
        /// Columns of the slot table.
        columns: usize,
    },
    /// A host-resident accepted-token count is outside the range the buffer allows.
    #[error(
        "`num_accepted_tokens`[{position}] = {value} must be in [1, {max}] (state_len {state_len} - width {width} + 2)"
    )]
    AcceptedTokens {
        /// Index of the entry.
        position: usize,
        /// Its value.
        value: i64,
        /// The largest count whose window fits the buffer.
        max: usize,
        /// Physical state length.
        state_len: usize,
        /// Conv width.
        width: usize,
    },
    /// Two sequences of one call would write the same slot, or one writes a slot another reads.
    #[error("`{arg}`: slot {slot} is written by sequence {writer} and also used by sequence {other}")]
    SlotConflict {
        /// Argument name.
        arg: &'static str,
        /// The slot.
        slot: usize,
        /// The sequence writing it.
        writer: usize,
        /// The other sequence using it.
        other: usize,
    },
    /// A host-resident checkpoint offset is neither 0 nor inside its sequence.
    #[error(
        "`checkpoint_offsets`[{seq}] = {value} must be 0 (no checkpoint) or inside the sequence's {tokens} tokens (1..{tokens})"
    )]
    CheckpointOffset {
        /// The sequence.
        seq: usize,
        /// The value found.
        value: i64,
        /// The sequence's tokens.
        tokens: usize,
    },
    /// A sequence's checkpoint would go to the slot its own state is written to.
    #[error(
        "`checkpoint_state_indices`[{seq}] = {slot} is also sequence {seq}'s own slot (`cache_indices`); a sequence's checkpoint and state must go to different slots"
    )]
    CheckpointIsStateSlot {
        /// The sequence.
        seq: usize,
        /// The slot.
        slot: usize,
    },
}

/// The pad value in error messages: the number, or "none".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PadDisplay(pub Option<i64>);

impl std::fmt::Display for PadDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(p) => write!(f, "{p}"),
            None => f.write_str("none"),
        }
    }
}
