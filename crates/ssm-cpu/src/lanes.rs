//! The vector helpers every kernel shares, written once against [`Simd`]: `dot`, `axpy`,
//! `scal` over padded f32 rows, and `gather`/`scatter` between f32 rows and stored tensors of a
//! run-time dtype. All are `#[inline(always)]` so that they compile inside the dispatched,
//! feature-enabled kernel body (a call or a closure would lose the caller's target features).

use ssm_tensor::DType;

use crate::shared::SharedBuf;
use crate::simd::{LANES, PowTwo, Real, Simd, with_real};

/// `n` rounded up to whole lanes.
#[inline(always)]
pub(crate) fn round8(n: usize) -> usize {
    n.div_ceil(LANES) * LANES
}

/// `Σ a[i]·b[i]` over `a.len()` elements (a multiple of 8; `b` at least as long), with two
/// accumulators.
#[inline(always)]
pub(crate) fn dot<S: Simd>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (mut a0, mut a1) = (S::splat(0.0), S::splat(0.0));
    let mut c = 0;
    while c + 2 * LANES <= n {
        a0 = S::load(&a[c..]).mul_add(S::load(&b[c..]), a0);
        a1 = S::load(&a[c + LANES..]).mul_add(S::load(&b[c + LANES..]), a1);
        c += 2 * LANES;
    }
    if c < n {
        a0 = S::load(&a[c..]).mul_add(S::load(&b[c..]), a0);
    }
    a0.add(a1).reduce_add()
}

/// `y += alpha·x` over `y.len()` elements (a multiple of 8; `x` at least as long).
#[inline(always)]
pub(crate) fn axpy<S: Simd>(y: &mut [f32], alpha: f32, x: &[f32]) {
    let a = S::splat(alpha);
    let mut c = 0;
    while c < y.len() {
        S::load(&x[c..]).mul_add(a, S::load(&y[c..])).store(&mut y[c..]);
        c += LANES;
    }
}

/// `dst[j·ldd + i] = src[i·lds + j]` for `i < m`, `j < n`, and `dst[j·ldd + i] = 0` for
/// `m ≤ i < mp` (a row padded to whole lanes for the products that read it): whole 8×8 blocks
/// through [`Simd::transpose8`], the edges element by element.
#[inline(always)]
pub(crate) fn transpose<S: Simd>(src: &[f32], lds: usize, m: usize, n: usize, dst: &mut [f32], ldd: usize, mp: usize) {
    let (mb, nb) = (m / LANES * LANES, n / LANES * LANES);
    for i0 in (0..mb).step_by(LANES) {
        for j0 in (0..nb).step_by(LANES) {
            let mut v = [S::splat(0.0); LANES];
            for (r, vr) in v.iter_mut().enumerate() {
                *vr = S::load(&src[(i0 + r) * lds + j0..]);
            }
            let t = S::transpose8(v);
            for (c, tc) in t.iter().enumerate() {
                tc.store(&mut dst[(j0 + c) * ldd + i0..]);
            }
        }
    }
    for i in 0..m {
        let js = if i < mb { nb } else { 0 };
        for j in js..n {
            dst[j * ldd + i] = src[i * lds + j];
        }
    }
    for j in 0..n {
        dst[j * ldd + m..j * ldd + mp].fill(0.0);
    }
}

/// `x *= alpha` over `x.len()` elements (a multiple of 8).
#[inline(always)]
pub(crate) fn scal<S: Simd>(x: &mut [f32], alpha: f32) {
    let a = S::splat(alpha);
    let mut c = 0;
    while c < x.len() {
        S::load(&x[c..]).mul(a).store(&mut x[c..]);
        c += LANES;
    }
}

/// `out[j] = x[off + j·stride]` for `j < out.len()`, widened to f32: a unit-stride run converts
/// 8 elements at a time, any other stride goes element by element.
#[inline(always)]
pub(crate) fn gather<S: Simd>(bytes: &[u8], dtype: DType, off: usize, stride: isize, out: &mut [f32]) {
    #[inline(always)]
    fn run<S: Simd, R: Real + bytemuck::Pod>(bytes: &[u8], off: usize, stride: isize, out: &mut [f32]) {
        let s: &[R] = bytemuck::cast_slice(bytes);
        if stride != 1 {
            let at = |j: usize| (off as isize + j as isize * stride) as usize;
            out.iter_mut().enumerate().for_each(|(j, o)| *o = s[at(j)].to_f32());
            return;
        }
        let src = &s[off..off + out.len()];
        let full = out.len() / LANES * LANES;
        let mut c = 0;
        while c < full {
            R::load::<S>(&src[c..]).store(&mut out[c..]);
            c += LANES;
        }
        for (o, x) in out[full..].iter_mut().zip(&src[full..]) {
            *o = x.to_f32();
        }
    }
    with_real!(dtype, R => run::<S, R>(bytes, off, stride, out))
}

/// Hints that the `n` elements from element `at` on of the `dtype` buffer at `base` will be
/// read or written soon (every cache line of them; an address past the buffer is harmless, a
/// prefetch never faults). For token rows that lie a whole plane of heads apart, which the
/// hardware prefetchers miss.
#[inline(always)]
pub(crate) fn prefetch_row<S: Simd>(base: *const u8, dtype: DType, at: usize, n: usize) {
    let size = dtype.size();
    for line in (0..n * size).step_by(64) {
        S::prefetch(base.wrapping_add(at * size + line));
    }
}

/// Writes `vals[j]` (rounded to nearest even) to element `off + j·stride` of a `dtype` buffer:
/// a unit-stride run rounds and stores 8 elements at a time.
///
/// # Safety
/// Those elements must lie in `dst` and be accessed by no other thread now.
#[inline(always)]
pub(crate) unsafe fn scatter<S: Simd>(dst: SharedBuf<u8>, dtype: DType, off: usize, stride: isize, vals: &[f32]) {
    /// # Safety
    /// As [`scatter`].
    #[inline(always)]
    unsafe fn run<S: Simd, R: Real>(dst: SharedBuf<u8>, off: usize, stride: isize, vals: &[f32]) {
        if stride != 1 {
            for (j, &v) in vals.iter().enumerate() {
                let at = (off as isize + j as isize * stride) as usize;
                // SAFETY: element `at` is in `dst` and exclusive (caller's contract; bounds
                // checked in debug builds); views are aligned for their dtype.
                unsafe { *dst.elems::<R>(at, 1) = R::from_f32(v) };
            }
            return;
        }
        // SAFETY: caller's contract (bounds checked in debug builds by `elems`).
        let out = unsafe { std::slice::from_raw_parts_mut(dst.elems::<R>(off, vals.len()), vals.len()) };
        let full = vals.len() / LANES * LANES;
        let mut c = 0;
        while c < full {
            R::store::<S>(S::load(&vals[c..]), &mut out[c..]);
            c += LANES;
        }
        for (d, v) in out[full..].iter_mut().zip(&vals[full..]) {
            *d = R::from_f32(*v);
        }
    }
    // SAFETY: forwards the caller's contract.
    unsafe { with_real!(dtype, R => run::<S, R>(dst, off, stride, vals)) }
}

/// Loads 8 elements at `p` as f32 lanes.
///
/// # Safety
/// `p` must be valid for reading 8 elements.
#[inline(always)]
pub(crate) unsafe fn ld<S: Simd, R: Real>(p: *const R) -> S {
    // SAFETY: 8 readable elements at `p` (caller's contract).
    R::load::<S>(unsafe { std::slice::from_raw_parts(p, LANES) })
}

/// Stores 8 lanes at `p` (rounded to `R`).
///
/// # Safety
/// `p` must be valid for writing 8 elements, and no reference to them may be live.
#[inline(always)]
pub(crate) unsafe fn st<S: Simd, R: Real>(v: S, p: *mut R) {
    // SAFETY: 8 writable elements at `p`, not otherwise borrowed (caller's contract).
    R::store::<S>(v, unsafe { std::slice::from_raw_parts_mut(p, LANES) })
}

/// `ln(1 + e^v)` lane-wise, as `max(v, 0) + ln1p(e^-|v|)`: `ln1p(u)` for `u ∈ (0, 1]` is
/// `2·atanh(u / (2 + u))`, an odd series in `s = u / (2 + u) ≤ 1/3` summed to `s^15` (truncation
/// below 2e-9). Within a few ulp of the scalar `ln(e^v + 1)` (threshold 20: above it the
/// correction is below half an ulp of `v`, so the result is `v` as there). NaN stays NaN.
#[inline(always)]
pub(crate) fn softplus_lanes<S: Simd + PowTwo>(v: S) -> S {
    let zero = S::splat(0.0);
    let neg_abs = zero.sub(v.max(zero.sub(v)));
    let u = neg_abs.exp();
    let s = u.div(S::splat(2.0).add(u));
    let s2 = s.mul(s);
    let mut poly = S::splat(1.0 / 15.0);
    for c in [1.0 / 13.0, 1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0] {
        poly = poly.mul_add(s2, S::splat(c));
    }
    v.max(zero).add(S::splat(2.0).mul(s).mul(poly))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{SimdKernel, dispatch_at, supported_levels};

    struct Transpose {
        m: usize,
        n: usize,
    }
    impl SimdKernel for &Transpose {
        type Output = (Vec<f32>, Vec<f32>);
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let (lds, ldd) = (self.n + 3, self.m + 5);
            let src: Vec<f32> = (0..self.m * lds).map(|k| k as f32 * 0.5 - 7.0).collect();
            let mut dst = vec![f32::NAN; self.n * ldd];
            transpose::<S>(&src, lds, self.m, self.n, &mut dst, ldd, self.m + 3);
            (src, dst)
        }
    }

    /// Whole 8×8 blocks, row and column edges and a matrix smaller than a block, on every
    /// level: each element lands at its transposed place, the padding is +0.0 and nothing else
    /// is written.
    #[test]
    fn transpose_matches_the_definition_on_every_level() {
        for (m, n) in [(64, 128), (13, 21), (8, 8), (5, 3), (17, 8), (8, 17)] {
            for &level in supported_levels() {
                let (src, dst) = dispatch_at(level, &Transpose { m, n });
                let (lds, ldd) = (n + 3, m + 5);
                for (k, &d) in dst.iter().enumerate() {
                    let (j, i) = (k / ldd, k % ldd);
                    if i < m {
                        assert_eq!(d, src[i * lds + j], "{level:?} {m}×{n}: ({i}, {j})");
                    } else if i < m + 3 {
                        assert_eq!(d.to_bits(), 0, "{level:?} {m}×{n}: padding ({i}, {j}) not +0.0");
                    } else {
                        assert!(d.is_nan(), "{level:?} {m}×{n}: wrote past the padding of column {j}");
                    }
                }
            }
        }
    }
}
