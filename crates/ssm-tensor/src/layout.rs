use crate::TensorError;

/// The largest rank a view can have. SSM ops use at most 5 (`[slots, heads, dim, dstate]` plus a broadcast axis).
pub const MAX_RANK: usize = 6;

/// Shape, strides (in elements) and element offset of a view, stored inline so that
/// building a view never allocates.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    rank: u8,
    shape: [usize; MAX_RANK],
    strides: [isize; MAX_RANK],
    offset: usize,
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("offset", &self.offset)
            .finish()
    }
}

impl Layout {
    /// A contiguous (row-major) layout of `shape`.
    pub fn contiguous(shape: &[usize]) -> Result<Self, TensorError> {
        let strides = contiguous_strides(shape)?;
        Self::new(shape, &strides[..shape.len()], 0)
    }

    /// A layout from explicit strides (elements; 0 = broadcast) and an element offset.
    pub fn new(shape: &[usize], strides: &[isize], offset: usize) -> Result<Self, TensorError> {
        if shape.len() > MAX_RANK {
            return Err(TensorError::RankTooLarge { rank: shape.len() });
        }
        if shape.len() != strides.len() {
            return Err(TensorError::StrideRank { shape: shape.len(), strides: strides.len() });
        }
        let mut l = Layout { rank: shape.len() as u8, shape: [0; MAX_RANK], strides: [0; MAX_RANK], offset };
        l.shape[..shape.len()].copy_from_slice(shape);
        l.strides[..shape.len()].copy_from_slice(strides);
        Ok(l)
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Extent of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.rank()]
    }

    /// Stride of each dimension, in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides[..self.rank()]
    }

    /// Element offset of element `[0, …, 0]`.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of logical elements (product of the shape).
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Range of element indices `[lo, hi)` the view reaches, or `None` when it is empty.
    pub fn reach(&self) -> Option<(i128, i128)> {
        if self.numel() == 0 {
            return None;
        }
        let (mut lo, mut hi) = (self.offset as i128, self.offset as i128);
        for (&n, &s) in self.shape().iter().zip(self.strides()) {
            let span = (n as i128 - 1) * s as i128;
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        Some((lo, hi + 1))
    }

    /// Checks that every reachable element lies in `[0, len)`.
    pub fn check_bounds(&self, len: usize) -> Result<(), TensorError> {
        match self.reach() {
            Some((lo, hi)) if lo < 0 || hi > len as i128 => Err(TensorError::OutOfBounds {
                reach: if lo < 0 { lo } else { hi },
                offset: self.offset,
                shape: self.shape().to_vec(),
                strides: self.strides().to_vec(),
                len,
            }),
            _ => Ok(()),
        }
    }

    /// Whether the view is row-major contiguous (size-1 dimensions may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&n, &s) in self.shape().iter().zip(self.strides()).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected *= n as isize;
        }
        true
    }

    /// Element index of a multi-index (unchecked against the shape; debug-asserted).
    #[inline]
    pub fn index(&self, idx: &[usize]) -> usize {
        debug_assert_eq!(idx.len(), self.rank());
        let mut off = self.offset as isize;
        for (i, (&k, &s)) in idx.iter().zip(self.strides()).enumerate() {
            debug_assert!(k < self.shape[i]);
            off += k as isize * s;
        }
        off as usize
    }
}

pub(crate) fn contiguous_strides(shape: &[usize]) -> Result<[isize; MAX_RANK], TensorError> {
    if shape.len() > MAX_RANK {
        return Err(TensorError::RankTooLarge { rank: shape.len() });
    }
    let mut strides = [0isize; MAX_RANK];
    let mut acc = 1isize;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc *= shape[d] as isize;
    }
    Ok(strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_reach_and_broadcast() {
        let l = Layout::contiguous(&[2, 3, 4]).unwrap();
        assert_eq!(l.strides(), &[12, 4, 1]);
        assert_eq!(l.reach(), Some((0, 24)));
        assert!(l.is_contiguous());
        let b = Layout::new(&[4, 64, 16], &[1, 0, 0], 0).unwrap();
        assert_eq!(b.reach(), Some((0, 4)));
        assert!(!b.is_contiguous());
        assert!(b.check_bounds(4).is_ok());
        assert!(b.check_bounds(3).is_err());
    }

    #[test]
    fn negative_strides_are_bounded() {
        let l = Layout::new(&[3], &[-1], 2).unwrap();
        assert_eq!(l.reach(), Some((0, 3)));
        let bad = Layout::new(&[3], &[-1], 1).unwrap();
        assert!(bad.check_bounds(10).is_err());
    }
}
