//! Register-tiled f32 matrix products on the lanes, `out += alpha·A·B`: `A` read one element at a
//! time through two strides (so a transposed operand needs no copy), `B` and `out` by rows of
//! whole lanes. Shared by the chunked prefills: GDN's WY/UT chunk and Mamba2's SSD stages 2
//! (`xᵀ·(w ⊙ B)`) and 5 (`C·S_inᵀ`, `(C·Bᵀ ⊙ decay)·x`).
//!
//! A tile of `R` output rows × `G` vectors is held in registers over a block of [`KB`] inner
//! terms; the blocks of `B`'s rows it streams (`KB` rows × `G` vectors) stay in L1 while every row
//! tile of the output passes over them. The vectors are the level's widest ([`Simd::Wide`]:
//! sixteen lanes with AVX-512), so each output element sees the same fused multiply-adds in the
//! same order on every x86 level: the AVX-512 products are bit-identical to AVX2's.

use crate::simd::{LANES, Narrow, Simd, WideLanes};

/// Inner terms per pass over `B` (64 rows of a tile's vectors: 4 KiB of two eight-lane vectors,
/// 16 KiB of four sixteen-lane ones).
const KB: usize = 64;

/// The operands of `alpha·A·B` with `kd` inner terms: `A[i][p] = a[i·lda + p·ldp]`,
/// `B[p][j] = b[p·ldb + j]`.
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    pub(crate) kd: usize,
    pub(crate) a: &'a [f32],
    pub(crate) lda: usize,
    pub(crate) ldp: usize,
    pub(crate) b: &'a [f32],
    pub(crate) ldb: usize,
    pub(crate) alpha: f32,
    /// `A` is lower triangular, its zeros stored (`A[i][p] = 0` for `p > i`): terms past a row
    /// tile's last row are skipped.
    pub(crate) lower: bool,
    /// `out` is overwritten with the product instead of accumulated into (its earlier contents
    /// are never read).
    pub(crate) assign: bool,
}

impl<'a> Operands<'a> {
    /// `A·B` with a row-major `A` (`lda` elements per row).
    pub(crate) fn new(kd: usize, a: &'a [f32], lda: usize, b: &'a [f32], ldb: usize) -> Self {
        Operands { kd, a, lda, ldp: 1, b, ldb, alpha: 1.0, lower: false, assign: false }
    }
    /// `Aᵀ·B` for a row-major `A` (`ld` elements per row): `Aᵀ[i][p] = a[p·ld + i]`.
    pub(crate) fn transposed(kd: usize, a: &'a [f32], ld: usize, b: &'a [f32], ldb: usize) -> Self {
        Operands { lda: 1, ldp: ld, ..Operands::new(kd, a, ld, b, ldb) }
    }
    /// The same product times `alpha`.
    pub(crate) fn scaled(self, alpha: f32) -> Self {
        Operands { alpha, ..self }
    }
    /// The same product with `A` lower triangular (see [`Operands::lower`]).
    pub(crate) fn lower(self) -> Self {
        Operands { lower: true, ..self }
    }
    /// The same product written over `out` (see [`Operands::assign`]).
    pub(crate) fn assign(self) -> Self {
        Operands { assign: true, ..self }
    }
}

/// `out[i][..np] += alpha·Σ_{p<kd} A[i][p]·B[p][..np]` for `i < m` (`=` with
/// [`Operands::assign`]); `np` a multiple of 8.
///
/// # Panics
/// If an operand is too short for these extents (checked once, here: the tiles read unchecked).
#[inline(always)]
pub(crate) fn gemm<S: Simd>(m: usize, np: usize, ab: Operands<'_>, out: &mut [f32], ldo: usize) {
    assert!(np.is_multiple_of(LANES), "{np} columns: not whole lanes");
    if m == 0 || np == 0 {
        return;
    }
    if ab.kd == 0 {
        if ab.assign {
            for row in out.chunks_mut(ldo).take(m) {
                row[..np].fill(0.0);
            }
        }
        return;
    }
    assert!((m - 1) * ab.lda + (ab.kd - 1) * ab.ldp < ab.a.len(), "A too short");
    assert!((ab.kd - 1) * ab.ldb + np <= ab.b.len(), "B too short");
    assert!((m - 1) * ldo + np <= out.len(), "out too short");
    let mut p0 = 0;
    while p0 < ab.kd {
        let p1 = (p0 + KB).min(ab.kd);
        // A lower-triangular `A` has no terms of this block in rows above `p0`.
        let mut i = if ab.lower { p0 } else { 0 };
        while i + 6 <= m {
            gemm_rows::<S, 6>(Rows { i, p0, p1 }, np, ab, out, ldo);
            i += 6;
        }
        if i + 4 <= m {
            gemm_rows::<S, 4>(Rows { i, p0, p1 }, np, ab, out, ldo);
            i += 4;
        }
        if i + 2 <= m {
            gemm_rows::<S, 2>(Rows { i, p0, p1 }, np, ab, out, ldo);
            i += 2;
        }
        if i < m {
            gemm_rows::<S, 1>(Rows { i, p0, p1 }, np, ab, out, ldo);
        }
        p0 = p1;
    }
}

/// A tile row's place: output rows from `i`, inner terms `p0..p1`.
#[derive(Clone, Copy)]
struct Rows {
    i: usize,
    p0: usize,
    p1: usize,
}

/// Rows `i..i + R` of [`gemm`] over terms `p0..p1`: as many of the level's widest vectors of
/// columns at a time as its registers hold ([`WideLanes::TILE_VECTORS`]: four of sixteen lanes
/// with AVX-512, two of eight with AVX2), then fewer, then eight lanes.
#[inline(always)]
fn gemm_rows<S: Simd, const R: usize>(rows: Rows, np: usize, ab: Operands<'_>, out: &mut [f32], ldo: usize) {
    let rows = if ab.lower { Rows { p1: rows.p1.min(rows.i + R), ..rows } } else { rows };
    let (w, g) = (<S::Wide as WideLanes>::WIDTH, <S::Wide as WideLanes>::TILE_VECTORS);
    let mut c = 0;
    if g >= 4 {
        while c + 4 * w <= np {
            // SAFETY: rows i..i + R < m, terms below kd, columns c..c + 4w ≤ np: inside the
            // extents `gemm` checked.
            unsafe { gemm_tile::<S::Wide, R, 4>(rows, c, ab, out, ldo) };
            c += 4 * w;
        }
    }
    while c + 2 * w <= np {
        // SAFETY: as above, columns c..c + 2w ≤ np.
        unsafe { gemm_tile::<S::Wide, R, 2>(rows, c, ab, out, ldo) };
        c += 2 * w;
    }
    if c + w <= np {
        // SAFETY: as above, columns c..c + w ≤ np.
        unsafe { gemm_tile::<S::Wide, R, 1>(rows, c, ab, out, ldo) };
        c += w;
    }
    if c < np {
        // SAFETY: as above, columns c..c + 8 ≤ np (`np` is whole eight-lane groups).
        unsafe { gemm_tile::<Narrow<S>, R, 1>(rows, c, ab, out, ldo) };
    }
}

/// One `R × G·V::WIDTH` tile of the output over terms `p0..p1`, in registers.
///
/// # Safety
/// Rows `i..i + R`, terms `p0..p1` and columns `c..c + G·V::WIDTH` must lie within the extents
/// that [`gemm`] checked against the operands' lengths.
#[inline(always)]
unsafe fn gemm_tile<V: WideLanes, const R: usize, const G: usize>(
    Rows { i, p0, p1 }: Rows,
    c: usize,
    ab: Operands<'_>,
    out: &mut [f32],
    ldo: usize,
) {
    let Operands { a, lda, ldp, b, ldb, alpha, .. } = ab;
    // The first block of terms writes over `out` when the product is assigned.
    let fresh = ab.assign && p0 == 0;
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let mut acc = [[V::splat(0.0); G]; R];
    for p in p0..p1 {
        // SAFETY: row p of B, columns c..c + G·WIDTH, and A's elements (i + r, p) are in bounds
        // (the caller's contract).
        unsafe {
            let brow = bp.add(p * ldb + c);
            let mut bv = [V::splat(0.0); G];
            for j in 0..G {
                bv[j] = V::load(brow.add(j * V::WIDTH));
            }
            for r in 0..R {
                let av = V::splat(*ap.add((i + r) * lda + p * ldp));
                for j in 0..G {
                    acc[r][j] = bv[j].mul_add(av, acc[r][j]);
                }
            }
        }
    }
    let al = V::splat(alpha);
    let op = out.as_mut_ptr();
    for r in 0..R {
        for j in 0..G {
            // SAFETY: row i + r, columns c + j·WIDTH.. + WIDTH of `out` are in bounds (the caller's
            // contract); `out` is borrowed mutably, so nothing else aliases it.
            unsafe {
                let o = op.add((i + r) * ldo + c + j * V::WIDTH);
                // `acc·alpha + 0` rounds as the product alone: the same bits as a zeroed `out`.
                acc[r][j].mul_add(al, if fresh { V::splat(0.0) } else { V::load(o) }).store(o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{PowTwo, SimdKernel, SimdLevel, dispatch_at, supported_levels};

    /// One product of the test's shapes, `out` its initial value, on the lanes `dispatch_at`
    /// picks.
    struct Product {
        m: usize,
        np: usize,
        kd: usize,
        transposed: bool,
        lower: bool,
        assign: bool,
    }

    const fn val(k: usize) -> f32 {
        ((k * 7919) % 23) as f32 / 8.0 - 1.4
    }

    impl Product {
        fn lda(&self) -> usize {
            if self.transposed { self.m + 3 } else { self.kd + 5 }
        }
        fn a(&self) -> Vec<f32> {
            let ld = self.lda();
            (0..ld * self.kd.max(self.m) + 8)
                .map(|k| {
                    let (i, p) = if self.transposed { (k % ld, k / ld) } else { (k / ld, k % ld) };
                    if self.lower && p > i { 0.0 } else { val(k) }
                })
                .collect()
        }
        fn b(&self) -> Vec<f32> {
            (0..self.kd * (self.np + 8)).map(|k| val(k + 3)).collect()
        }
        fn ldo(&self) -> usize {
            self.np + 16
        }
        fn operands<'a>(&self, a: &'a [f32], b: &'a [f32]) -> Operands<'a> {
            let (ld, ldb) = (self.lda(), self.np + 8);
            let ab = if self.transposed {
                Operands::transposed(self.kd, a, ld, b, ldb)
            } else {
                Operands::new(self.kd, a, ld, b, ldb)
            }
            .scaled(-0.5);
            let ab = if self.assign { ab.assign() } else { ab };
            if self.lower { ab.lower() } else { ab }
        }
    }

    impl SimdKernel for &Product {
        type Output = Vec<f32>;
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Vec<f32> {
            let (a, b) = (self.a(), self.b());
            let mut out: Vec<f32> = (0..self.m * self.ldo()).map(|k| val(k + 11)).collect();
            gemm::<S>(self.m, self.np, self.operands(&a, &b), &mut out, self.ldo());
            out
        }
    }

    /// Every shape class (row tails, column tails of sixteen and eight lanes, several term
    /// blocks, transposed and lower triangular `A`, accumulated or assigned) on every lane level against the plain triple
    /// loop; the x86 levels bit for bit alike.
    #[test]
    fn matches_the_triple_loop_on_every_level() {
        for (m, np, kd) in [(1, 8, 1), (5, 24, 70), (9, 40, 130), (13, 56, 9), (7, 104, 33), (64, 128, 256), (3, 16, 0)]
        {
            let classes = [(false, false), (true, false), (false, true)];
            for ((transposed, lower), assign) in classes.into_iter().flat_map(|c| [(c, false), (c, true)]) {
                if lower && m > kd {
                    continue;
                }
                let pr = Product { m, np, kd, transposed, lower, assign };
                let (a, b, ldo) = (pr.a(), pr.b(), pr.ldo());
                let ab = pr.operands(&a, &b);
                let mut want: Vec<f32> = (0..m * ldo).map(|k| val(k + 11)).collect();
                for i in 0..m {
                    for j in 0..np {
                        let s: f64 =
                            (0..kd).map(|p| f64::from(a[i * ab.lda + p * ab.ldp]) * f64::from(b[p * ab.ldb + j])).sum();
                        let w = &mut want[i * ldo + j];
                        *w = if assign { 0.0 } else { *w } + (-0.5 * s) as f32;
                    }
                }
                let mut x86: Option<Vec<f32>> = None;
                for &level in supported_levels() {
                    let out = dispatch_at(level, &pr);
                    for (k, (g, w)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                            "{level:?} m {m} np {np} kd {kd} at {k}: {g} vs {w}"
                        );
                    }
                    if level == SimdLevel::Portable {
                        continue;
                    }
                    match &x86 {
                        Some(first) => assert!(
                            first.iter().zip(&out).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{level:?} differs from the other x86 level: m {m} np {np} kd {kd}"
                        ),
                        None => x86 = Some(out),
                    }
                }
            }
        }
    }
}
