use crate::TensorError;

/// The largest rank a view can have. SSM ops use at most 5 (`[slots, heads, dim, dstate]` plus a broadcast axis).
pub const MAX_RANK: usize = 6;

/// Shape, strides (in elements) and element offset of a view, stored inline so that
/// building a view never allocates.
///
/// Every `Layout` that exists satisfies the invariant [`Layout::new`] checks: its element
/// count fits in `usize`, and the offset of every element it reaches (and of the offset
/// itself) fits in `isize`. So `numel`, `reach` and `index` cannot overflow, whatever
/// shape, strides and offset a caller asked for.
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
    ///
    /// Refused with [`TensorError::TooLarge`] when the element count overflows `usize`, or
    /// when the offset or any element the view reaches lies outside `0..=isize::MAX` as a
    /// signed sum (no memory could hold it; accepting it would let later index arithmetic wrap).
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
        let too_large = || TensorError::TooLarge { shape: shape.to_vec(), strides: strides.to_vec(), offset };
        if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() || offset > isize::MAX as usize {
            return Err(too_large());
        }
        if !shape.contains(&0) {
            // Each span is at most (2^64 − 1)·2^63 < 2^127 in magnitude; their sum is checked.
            let (mut lo, mut hi) = (offset as i128, offset as i128);
            for (&n, &s) in shape.iter().zip(strides) {
                let span = (n as i128 - 1) * s as i128;
                let side = if span < 0 { &mut lo } else { &mut hi };
                *side = side.checked_add(span).ok_or_else(too_large)?;
            }
            if lo < -(isize::MAX as i128) || hi > isize::MAX as i128 {
                return Err(too_large());
            }
        }
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

    /// Number of logical elements (product of the shape; cannot overflow, see the invariant).
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

    /// Whether distinct in-shape indices always reach distinct elements, so that a written
    /// view can be filled from several threads. Sufficient condition, checked: sorted by
    /// |stride|, each axis of extent > 1 steps past everything the smaller axes reach. An
    /// empty view is disjoint. (No arithmetic here can overflow: see the type's invariant.)
    pub fn is_disjoint(&self) -> bool {
        let mut axes = [(0usize, 0usize); MAX_RANK];
        let mut len = 0;
        for (&n, &s) in self.shape().iter().zip(self.strides()) {
            if n == 0 {
                return true;
            }
            if n > 1 {
                axes[len] = (s.unsigned_abs(), n);
                len += 1;
            }
        }
        axes[..len].sort_unstable();
        let mut reach = 0usize;
        for &(stride, n) in &axes[..len] {
            if stride <= reach {
                return false;
            }
            reach += (n - 1) * stride;
        }
        true
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
        // Past the largest stride a valid layout can have, the layout itself is refused
        // (`Layout::new`), so saturating here never yields an accepted layout.
        acc = acc.saturating_mul(isize::try_from(shape[d]).unwrap_or(isize::MAX));
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
    fn spans_past_the_address_space_are_refused() {
        // 2^61 · 8 · 8 elements wrap to 0 in a usize product.
        assert!(matches!(Layout::contiguous(&[1, 1 << 61, 8, 8]), Err(TensorError::TooLarge { .. })));
        assert!(matches!(Layout::new(&[2, 2], &[isize::MAX, 1], 0), Err(TensorError::TooLarge { .. })));
        assert!(matches!(Layout::new(&[3], &[1], usize::MAX), Err(TensorError::TooLarge { .. })));
        let huge = Layout::new(&[usize::MAX, usize::MAX, 2], &[isize::MIN, isize::MIN, isize::MIN], 0);
        assert!(matches!(huge, Err(TensorError::TooLarge { .. })));
        // Empty views reach nothing, whatever their strides.
        assert!(Layout::new(&[0, 5], &[isize::MAX, isize::MIN], 0).is_ok());
    }

    #[test]
    fn disjoint_views() {
        assert!(Layout::contiguous(&[3, 4]).unwrap().is_disjoint());
        assert!(Layout::new(&[3, 4], &[-4, 1], 8).unwrap().is_disjoint());
        assert!(!Layout::new(&[3, 4], &[1, 1], 0).unwrap().is_disjoint());
        assert!(!Layout::new(&[3, 4], &[4, 0], 0).unwrap().is_disjoint());
        assert!(Layout::new(&[1, 4], &[0, 1], 0).unwrap().is_disjoint());
        assert!(Layout::new(&[0, 4], &[0, 0], 0).unwrap().is_disjoint());
    }

    #[test]
    fn negative_strides_are_bounded() {
        let l = Layout::new(&[3], &[-1], 2).unwrap();
        assert_eq!(l.reach(), Some((0, 3)));
        let bad = Layout::new(&[3], &[-1], 1).unwrap();
        assert!(bad.check_bounds(10).is_err());
    }
}
