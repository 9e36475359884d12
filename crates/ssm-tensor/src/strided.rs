//! The one strided addressing formula of the workspace: element `idx` of an `R`-D tensor is
//! at `offset + Σ idx[d]·strides[d]` in the borrowed memory.

use crate::{ArgError, Layout};

/// Element offset and strides of a tensor seen as an `R`-D array (after the op's unsqueeze
/// rules). Broadcast axes have stride 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided<const R: usize> {
    /// Element offset of element `[0; R]` in the borrowed memory.
    pub offset: isize,
    /// Strides in elements (0 = broadcast).
    pub strides: [isize; R],
}

impl<const R: usize> Strided<R> {
    /// From an element offset and strides.
    ///
    /// # Panics
    /// If `offset` exceeds `isize::MAX` (no view can: its memory would not fit the address space).
    pub fn new(offset: usize, strides: [isize; R]) -> Self {
        Strided { offset: isize::try_from(offset).expect("view offsets fit in isize"), strides }
    }

    /// From the element offset of `layout` (the view of argument `arg`) and the strides the plan
    /// reads it with (after the op's unsqueeze and broadcast rules).
    ///
    /// # Errors
    /// [`ArgError::Overflow`] if the offset does not fit in `isize`.
    pub fn for_arg(arg: &'static str, layout: &Layout, strides: [isize; R]) -> Result<Self, ArgError> {
        match isize::try_from(layout.offset()) {
            Ok(offset) => Ok(Strided { offset, strides }),
            Err(_) => Err(ArgError::Overflow {
                arg,
                what: "element offset",
                shape: layout.shape().to_vec(),
                strides: layout.strides().to_vec(),
            }),
        }
    }

    /// The offset and strides of a rank-`R` layout; `None` if the rank differs or the offset
    /// does not fit in `isize`.
    pub fn from_layout(layout: &Layout) -> Option<Self> {
        let strides = layout.strides().try_into().ok()?;
        Some(Strided { offset: isize::try_from(layout.offset()).ok()?, strides })
    }

    /// Element index of `idx` in the borrowed memory. The caller (a plan) has checked that
    /// `idx` is inside the shape, so the result is in bounds of the view.
    #[inline(always)]
    pub fn at(&self, idx: [usize; R]) -> usize {
        let mut o = self.offset;
        for d in 0..R {
            o += idx[d] as isize * self.strides[d];
        }
        o as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_like_the_layout() {
        let l = Layout::new(&[2, 3], &[-3, 1], 3).unwrap();
        let s = Strided::<2>::from_layout(&l).unwrap();
        assert_eq!(s.at([1, 2]), l.index(&[1, 2]));
        assert!(Strided::<3>::from_layout(&l).is_none());
        assert_eq!(Strided::new(5, [2]).at([3]), 11);
    }
}
