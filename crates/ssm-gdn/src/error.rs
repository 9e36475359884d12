use ssm_tensor::{ArgError, Device};

use crate::StateLayout;

/// Why a GDN call was refused. Every variant names the argument (as vLLM names it), what was
/// expected and what came. Nothing is written when a call fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GdnError {
    /// A tensor argument that does not meet the contract (shape, rank, dtype, device, strides, …).
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// A state tensor does not match the head dimensions in the chosen layout.
    #[error("`{arg}` must have shape {expected} for layout {layout} (HV={hv}, K={k}, V={v}), got {actual:?}")]
    StateShape {
        /// Argument name.
        arg: &'static str,
        /// The layout asked for.
        layout: StateLayout,
        /// The expected shape.
        expected: String,
        /// Value heads (from `v`).
        hv: usize,
        /// head_k_dim (from `k`).
        k: usize,
        /// head_v_dim (from `v`).
        v: usize,
        /// The shape that came.
        actual: Vec<usize>,
    },
    /// The value heads are not a multiple of the q/k heads.
    #[error("value heads HV ({hv}, from `v`) must be a multiple of q/k heads H ({h}, from `q`)")]
    HeadsNotMultiple {
        /// Value heads.
        hv: usize,
        /// q/k heads.
        h: usize,
    },
    /// A head dimension is out of the supported range.
    #[error("`{arg}` head dimension must be in 1..={max}, got {actual}")]
    HeadDim {
        /// Argument name.
        arg: &'static str,
        /// The largest accepted value.
        max: usize,
        /// The value that came.
        actual: usize,
    },
    /// `cu_seqlens` is not a valid list of sequence starts.
    #[error("`cu_seqlens` must be non-decreasing within [0, T={tokens}]; entry {at} is {value} after {prev}")]
    CuSeqlens {
        /// Index of the offending entry.
        at: usize,
        /// Its value.
        value: i64,
        /// The previous entry (for entry 0: 0).
        prev: i64,
        /// Tokens in the call.
        tokens: usize,
    },
    /// A host-resident slot index is out of range.
    #[error("`{arg}` entry (sequence {seq}, column {column}) is {value}; expected the {allowed} (slots={slots})")]
    IndexOutOfRange {
        /// Argument name.
        arg: &'static str,
        /// Sequence (row of the table).
        seq: usize,
        /// Column of the table (0 for 1-D tables).
        column: usize,
        /// The value found.
        value: i64,
        /// What is allowed, e.g. "null block (<= 0) or [1, slots)".
        allowed: &'static str,
        /// Rows of the state pool.
        slots: usize,
    },
    /// A sequence has more tokens than its slot-table row has columns.
    #[error("sequence {seq} has {tokens} tokens but `ssm_state_indices` has {columns} columns (one per token)")]
    TooManyTokens {
        /// The sequence.
        seq: usize,
        /// Its tokens.
        tokens: usize,
        /// Columns of the table.
        columns: usize,
    },
    /// Two sequences would write (or one write and another read) the same state slot.
    #[error(
        "state slot {slot} is {first} by sequence {first_seq} and {second} by sequence {second_seq}; concurrent sequences must use disjoint slots"
    )]
    SlotConflict {
        /// The slot.
        slot: i64,
        /// "written" or "read".
        first: &'static str,
        /// The first sequence.
        first_seq: usize,
        /// "written" or "read".
        second: &'static str,
        /// The second sequence.
        second_seq: usize,
    },
    /// A scalar argument is out of range.
    #[error("`{arg}` must be {expected}, got {actual}")]
    Scalar {
        /// Argument name.
        arg: &'static str,
        /// The accepted range.
        expected: &'static str,
        /// The value that came.
        actual: f64,
    },
    /// The conv part of `gdn_decode_step` was refused.
    #[error("gdn_decode_step's conv update: {0}")]
    Conv(Box<ssm_conv::ConvError>),
    /// Arguments of `gdn_decode_step` that do not describe one decode step.
    #[error("gdn_decode_step: `{arg}` {problem}")]
    DecodeStep {
        /// Argument name.
        arg: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The reference implementation runs on host tensors only.
    #[error("`{arg}` lives on {device}; the reference needs host tensors")]
    NotHost {
        /// Argument name.
        arg: &'static str,
        /// Where it lives.
        device: Device,
    },
}

impl From<ssm_conv::ConvError> for GdnError {
    fn from(e: ssm_conv::ConvError) -> Self {
        GdnError::Conv(Box::new(e))
    }
}
