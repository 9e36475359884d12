use crate::{DType, MAX_RANK};

/// Why a view could not be built or accessed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// More dimensions than a view can hold.
    #[error("rank {rank} exceeds the maximum of {MAX_RANK}")]
    RankTooLarge {
        /// The rank asked for.
        rank: usize,
    },
    /// The element count, or the span of element indices the view reaches, does not fit in
    /// the address space (`isize`), so no memory could hold the view.
    #[error(
        "view of shape {shape:?} with strides {strides:?} at offset {offset} spans more elements than an address can"
    )]
    TooLarge {
        /// Shape of the view.
        shape: Vec<usize>,
        /// Strides of the view.
        strides: Vec<isize>,
        /// Element offset of the view.
        offset: usize,
    },
    /// `shape` and `strides` have different lengths.
    #[error("shape has {shape} dimensions but strides has {strides}")]
    StrideRank {
        /// Length of the shape.
        shape: usize,
        /// Length of the strides.
        strides: usize,
    },
    /// A reachable element lies outside the borrowed memory.
    #[error(
        "view reaches element {reach} (offset {offset}, shape {shape:?}, strides {strides:?}) but the memory holds {len} elements"
    )]
    OutOfBounds {
        /// The first element index past the last reachable one.
        reach: i128,
        /// Element offset of the view.
        offset: usize,
        /// Shape of the view.
        shape: Vec<usize>,
        /// Strides of the view.
        strides: Vec<isize>,
        /// Elements in the borrowed memory.
        len: usize,
    },
    /// A byte slice's length is not a multiple of the element size, or it is misaligned.
    #[error("byte slice of {len} bytes at alignment {align} cannot hold {dtype} elements")]
    BadBytes {
        /// Byte length.
        len: usize,
        /// The largest power of two dividing the address (capped at 16).
        align: usize,
        /// The element type.
        dtype: DType,
    },
    /// Typed access with the wrong element type.
    #[error("tensor holds {actual} elements, {expected} were asked for")]
    DType {
        /// The type asked for.
        expected: DType,
        /// The type the view holds.
        actual: DType,
    },
    /// Host access to a device view.
    #[error("tensor lives on {0}, host access needs a CPU tensor")]
    NotHost(crate::Device),
    /// Contiguous access to a strided view.
    #[error("tensor with shape {shape:?} and strides {strides:?} is not contiguous")]
    NotContiguous {
        /// Shape of the view.
        shape: Vec<usize>,
        /// Strides of the view.
        strides: Vec<isize>,
    },
}
