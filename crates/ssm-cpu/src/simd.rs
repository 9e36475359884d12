//! Eight-lane f32 SIMD with the instruction set chosen at run time.
//!
//! Kernels are written once against [`Simd`] and run through [`dispatch`]: on an
//! x86-64 CPU with AVX2, FMA and F16C the body is instantiated inside a
//! `#[target_feature]` function with [`Avx2`] lanes (fused multiply-add, hardware
//! f16 conversion); where the CPU also has AVX-512 F/VL/BW/DQ and BF16, inside one
//! with those features too ([`Avx512`]: the same eight lanes with 32 registers,
//! `vcvtneps2bf16` and `vscalefps`, bit-identical to `Avx2`); elsewhere it runs on
//! `wide::f32x8` ([`Portable`]). A downstream crate's plain `cargo build --release`
//! therefore gets the fast path without `-C target-cpu` flags. The x86 paths and the
//! portable one differ only in rounding of `mul_add` (fused or not) and in `exp`'s
//! last ulp, within every tolerance. `SSM_CPU_SIMD=avx2` or `=portable` picks a
//! lesser path (tests of every path on one machine).

use half::{bf16, f16};

/// Lanes per vector.
pub const LANES: usize = 8;

/// Eight f32 lanes. All loads and stores take the first [`LANES`] elements of a slice.
pub trait Simd: Copy + Send + Sync + 'static {
    /// The widest f32 vector of this level, for register-tiled products (`gemm`): sixteen
    /// lanes with AVX-512 ([`Zmm`]), these eight lanes elsewhere ([`Narrow`]).
    type Wide: WideLanes;
    /// `a + v·c` over the wide lanes eight at a time, in their order (`a = v₀·c₀ + a`, then
    /// `v₁·c₁`, …): the same operations, in the same order, as eight-lane code walking those
    /// elements, so a sum over a row is bit for bit the eight-lane loop's.
    fn mul_add_wide(v: Self::Wide, c: Self::Wide, a: Self) -> Self;
    /// Every lane `x`.
    fn splat(x: f32) -> Self;
    /// Loads 8 f32.
    fn load(s: &[f32]) -> Self;
    /// Stores 8 f32.
    fn store(self, s: &mut [f32]);
    /// Loads 8 bf16, widened exactly.
    fn load_bf16(s: &[bf16]) -> Self;
    /// Stores 8 bf16, rounded to nearest even.
    fn store_bf16(self, s: &mut [bf16]);
    /// Loads 8 f16, widened exactly.
    fn load_f16(s: &[f16]) -> Self;
    /// Stores 8 f16, rounded to nearest even.
    fn store_f16(self, s: &mut [f16]);
    /// Lane-wise sum.
    fn add(self, b: Self) -> Self;
    /// Lane-wise difference.
    fn sub(self, b: Self) -> Self;
    /// Lane-wise product.
    fn mul(self, b: Self) -> Self;
    /// `self * b + c` (fused on AVX2+FMA).
    fn mul_add(self, b: Self, c: Self) -> Self;
    /// Lane-wise quotient (IEEE division).
    fn div(self, b: Self) -> Self;
    /// Each lane rounded to bf16 (nearest even, NaN quietened as `half` does), kept as f32:
    /// what storing and reloading bf16 gives, without the memory round trip.
    #[inline(always)]
    fn round_bf16(self) -> Self {
        let mut r = [bf16::ZERO; LANES];
        self.store_bf16(&mut r);
        Self::load_bf16(&r)
    }
    /// [`Simd::round_bf16`] of each vector: the same bits, with one test for the rare lanes
    /// that need the slow rounding where the level has one (AVX-512's subnormal test).
    #[inline(always)]
    fn round_bf16_each<const N: usize>(mut v: [Self; N]) -> [Self; N] {
        // A loop, not `map` with a closure: a closure would not inherit the caller's features.
        for x in v.iter_mut() {
            *x = x.round_bf16();
        }
        v
    }
    /// Each lane rounded to f16 (nearest even), kept as f32.
    #[inline(always)]
    fn round_f16(self) -> Self {
        let mut r = [f16::ZERO; LANES];
        self.store_f16(&mut r);
        Self::load_f16(&r)
    }
    /// [`Simd::round_f16`] of each vector.
    #[inline(always)]
    fn round_f16_each<const N: usize>(mut v: [Self; N]) -> [Self; N] {
        for x in v.iter_mut() {
            *x = x.round_f16();
        }
        v
    }
    /// Lane-wise maximum.
    fn max(self, b: Self) -> Self;
    /// `self`, with +0 in the lanes where `x < t` (ordered: a NaN `x` keeps its lane).
    fn zero_where_lt(self, x: Self, t: Self) -> Self;
    /// Lane-wise `e^x`.
    fn exp(self) -> Self;
    /// Lane-wise silu, `x / (1 + e^-x)` (`x·sigmoid(x)` as the peers compute it).
    #[inline(always)]
    fn silu(self) -> Self {
        self.div(Self::splat(1.0).add(Self::splat(0.0).sub(self).exp()))
    }
    /// Sum of the lanes.
    fn reduce_add(self) -> f32;
    /// Lane `r` of the result is `v[r].reduce_add()`, bit for bit (the same additions in the
    /// same order): eight rows' sums at once, for kernels that keep one accumulator per row.
    #[inline(always)]
    fn reduce_add_rows(v: [Self; LANES]) -> Self {
        let mut s = [0.0f32; LANES];
        for (sr, vr) in s.iter_mut().zip(v) {
            *sr = vr.reduce_add();
        }
        Self::load(&s)
    }
    /// The 8×8 transpose: lane `c` of result `r` is lane `r` of `v[c]`.
    #[inline(always)]
    fn transpose8(v: [Self; LANES]) -> [Self; LANES] {
        let mut m = [[0.0f32; LANES]; LANES];
        for (row, vr) in m.iter_mut().zip(v) {
            vr.store(row);
        }
        let mut out = [Self::splat(0.0); LANES];
        for (r, o) in out.iter_mut().enumerate() {
            *o = Self::load(&std::array::from_fn::<f32, LANES, _>(|c| m[c][r]));
        }
        out
    }
    /// Hints that the cache line holding `p` will be read soon (a no-op where unsupported).
    #[inline(always)]
    fn prefetch<T>(_p: *const T) {}
    /// Stores 8 f32 at `p` bypassing the caches where supported (a plain store elsewhere):
    /// for write-only destinations, which then cost no read for ownership. Follow a batch of
    /// these with [`Simd::store_fence`].
    ///
    /// # Safety
    /// `p` must be valid for writing 8 f32 and 32-byte aligned.
    #[inline(always)]
    unsafe fn stream(self, p: *mut f32) {
        // SAFETY: caller's contract.
        self.store(unsafe { std::slice::from_raw_parts_mut(p, LANES) })
    }
    /// As [`Simd::stream`] for 8 bf16 (rounded as `store_bf16`); `p` 16-byte aligned.
    ///
    /// # Safety
    /// `p` must be valid for writing 8 bf16 and 16-byte aligned.
    #[inline(always)]
    unsafe fn stream_bf16(self, p: *mut bf16) {
        // SAFETY: caller's contract.
        self.store_bf16(unsafe { std::slice::from_raw_parts_mut(p, LANES) })
    }
    /// As [`Simd::stream`] for 8 f16 (rounded as `store_f16`); `p` 16-byte aligned.
    ///
    /// # Safety
    /// `p` must be valid for writing 8 f16 and 16-byte aligned.
    #[inline(always)]
    unsafe fn stream_f16(self, p: *mut f16) {
        // SAFETY: caller's contract.
        self.store_f16(unsafe { std::slice::from_raw_parts_mut(p, LANES) })
    }
    /// Orders earlier streaming stores before later stores (`sfence`; a no-op elsewhere).
    #[inline(always)]
    fn store_fence() {}
}

/// The f32 vector a register-tiled product runs on ([`Simd::Wide`]): only what such a product
/// needs, through raw pointers (the product checks its extents once, the tiles read unchecked).
pub trait WideLanes: Copy {
    /// Lanes per vector: 8 or 16.
    const WIDTH: usize;
    /// Vectors per row of a product's register tile: 2 with 16 registers (twelve accumulators
    /// for six rows), 4 with AVX-512's 32 (twenty-four).
    const TILE_VECTORS: usize;
    /// Every lane `x`.
    fn splat(x: f32) -> Self;
    /// Loads [`WideLanes::WIDTH`] f32 from `p`.
    ///
    /// # Safety
    /// `p` must be valid for reading `WIDTH` f32 (any alignment).
    unsafe fn load(p: *const f32) -> Self;
    /// Stores [`WideLanes::WIDTH`] f32 to `p`.
    ///
    /// # Safety
    /// `p` must be valid for writing `WIDTH` f32 (any alignment).
    unsafe fn store(self, p: *mut f32);
    /// `self * b + c`, rounded as [`Simd::mul_add`] rounds it.
    fn mul_add(self, b: Self, c: Self) -> Self;
    /// Lane-wise product.
    fn mul(self, b: Self) -> Self;
    /// Lane-wise `e^x`, bit for bit as [`Simd::exp`] of the same level.
    fn exp(self) -> Self;
    /// Lane-wise sum.
    fn add(self, b: Self) -> Self;
    /// Lane-wise difference.
    fn sub(self, b: Self) -> Self;
    /// Lane-wise quotient (IEEE division).
    fn div(self, b: Self) -> Self;
    /// Lane-wise silu, as [`Simd::silu`].
    #[inline(always)]
    fn silu(self) -> Self {
        self.div(Self::splat(1.0).add(Self::splat(0.0).sub(self).exp()))
    }
    /// Each lane of each vector rounded to bf16 and kept as f32, bit for bit as
    /// [`Simd::round_bf16_each`].
    fn round_bf16_each<const N: usize>(v: [Self; N]) -> [Self; N];
    /// Each lane of each vector rounded to f16 and kept as f32, as [`Simd::round_f16_each`].
    fn round_f16_each<const N: usize>(v: [Self; N]) -> [Self; N];
    /// Loads [`WideLanes::WIDTH`] bf16 from `p`, widened exactly.
    ///
    /// # Safety
    /// `p` must be valid for reading `WIDTH` bf16 (any alignment).
    unsafe fn load_bf16(p: *const bf16) -> Self;
    /// Stores the lanes to `p` as bf16, rounded to nearest even bit for bit as
    /// [`Simd::store_bf16`] rounds them.
    ///
    /// # Safety
    /// `p` must be valid for writing `WIDTH` bf16 (any alignment).
    unsafe fn store_bf16(self, p: *mut bf16);
    /// Loads [`WideLanes::WIDTH`] f16 from `p`, widened exactly.
    ///
    /// # Safety
    /// `p` must be valid for reading `WIDTH` f16 (any alignment).
    unsafe fn load_f16(p: *const f16) -> Self;
    /// Stores the lanes to `p` as f16, rounded to nearest even as [`Simd::store_f16`] rounds them.
    ///
    /// # Safety
    /// `p` must be valid for writing `WIDTH` f16 (any alignment).
    unsafe fn store_f16(self, p: *mut f16);
    /// Stores [`WideLanes::WIDTH`] f32 to `p` bypassing the caches where supported, as
    /// [`Simd::stream`] (follow a batch of these with [`Simd::store_fence`]).
    ///
    /// # Safety
    /// `p` must be valid for writing `WIDTH` f32 and aligned to their size (`WIDTH · 4` bytes).
    unsafe fn stream(self, p: *mut f32);
    /// As [`WideLanes::stream`] for bf16, rounded as [`WideLanes::store_bf16`].
    ///
    /// # Safety
    /// `p` must be valid for writing `WIDTH` bf16 and aligned to their size (`WIDTH · 2` bytes).
    unsafe fn stream_bf16(self, p: *mut bf16);
    /// As [`WideLanes::stream`] for f16, rounded as [`WideLanes::store_f16`].
    ///
    /// # Safety
    /// `p` must be valid for writing `WIDTH` f16 and aligned to their size (`WIDTH · 2` bytes).
    unsafe fn stream_f16(self, p: *mut f16);
}

/// A level's own eight lanes as its [`WideLanes`].
#[derive(Clone, Copy)]
pub struct Narrow<S>(S);

impl<S: Simd> Narrow<S> {
    /// `a + self·c`: [`Simd::mul_add_wide`] of a level whose wide lanes are its own eight.
    #[inline(always)]
    pub fn mul_add_to(self, c: Self, a: S) -> S {
        self.0.mul_add(c.0, a)
    }

    /// `f` (a function of the level's vectors, not a closure: see `SimdKernel`) over the eight
    /// lanes inside each of `v`.
    #[inline(always)]
    fn each<const N: usize>(v: [Self; N], f: impl Fn([S; N]) -> [S; N]) -> [Self; N] {
        let mut u = [S::splat(0.0); N];
        for (u, v) in u.iter_mut().zip(v) {
            *u = v.0;
        }
        let mut out = v;
        for (o, r) in out.iter_mut().zip(f(u)) {
            *o = Narrow(r);
        }
        out
    }
}

impl<S: Simd> WideLanes for Narrow<S> {
    const WIDTH: usize = LANES;
    const TILE_VECTORS: usize = 2;
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Narrow(S::splat(x))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: `LANES` f32 at `p` are readable (the caller's contract).
        Narrow(S::load(unsafe { std::slice::from_raw_parts(p, LANES) }))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: `LANES` f32 at `p` are writable (the caller's contract).
        self.0.store(unsafe { std::slice::from_raw_parts_mut(p, LANES) })
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        Narrow(self.0.mul_add(b.0, c.0))
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        Narrow(self.0.mul(b.0))
    }
    #[inline(always)]
    fn exp(self) -> Self {
        Narrow(self.0.exp())
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        Narrow(self.0.add(b.0))
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        Narrow(self.0.sub(b.0))
    }
    #[inline(always)]
    fn div(self, b: Self) -> Self {
        Narrow(self.0.div(b.0))
    }
    #[inline(always)]
    fn round_bf16_each<const N: usize>(v: [Self; N]) -> [Self; N] {
        Self::each(v, S::round_bf16_each)
    }
    #[inline(always)]
    fn round_f16_each<const N: usize>(v: [Self; N]) -> [Self; N] {
        Self::each(v, S::round_f16_each)
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self {
        // SAFETY: `LANES` bf16 at `p` are readable (the caller's contract).
        Narrow(S::load_bf16(unsafe { std::slice::from_raw_parts(p, LANES) }))
    }
    #[inline(always)]
    unsafe fn store_bf16(self, p: *mut bf16) {
        // SAFETY: `LANES` bf16 at `p` are writable (the caller's contract).
        self.0.store_bf16(unsafe { std::slice::from_raw_parts_mut(p, LANES) })
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Self {
        // SAFETY: `LANES` f16 at `p` are readable (the caller's contract).
        Narrow(S::load_f16(unsafe { std::slice::from_raw_parts(p, LANES) }))
    }
    #[inline(always)]
    unsafe fn store_f16(self, p: *mut f16) {
        // SAFETY: `LANES` f16 at `p` are writable (the caller's contract).
        self.0.store_f16(unsafe { std::slice::from_raw_parts_mut(p, LANES) })
    }
    #[inline(always)]
    unsafe fn stream(self, p: *mut f32) {
        // SAFETY: the caller's contract is `Simd::stream`'s.
        unsafe { self.0.stream(p) }
    }
    #[inline(always)]
    unsafe fn stream_bf16(self, p: *mut bf16) {
        // SAFETY: the caller's contract is `Simd::stream_bf16`'s.
        unsafe { self.0.stream_bf16(p) }
    }
    #[inline(always)]
    unsafe fn stream_f16(self, p: *mut f16) {
        // SAFETY: the caller's contract is `Simd::stream_f16`'s.
        unsafe { self.0.stream_f16(p) }
    }
}

/// Portable lanes on `wide::f32x8`.
#[derive(Clone, Copy)]
pub struct Portable(wide::f32x8);

impl Portable {
    /// Loads 8 elements of a 16-bit type, widened one by one (exact).
    #[inline(always)]
    fn load_half<R: Real>(s: &[R]) -> Self {
        let s = &s[..8];
        Portable(wide::f32x8::from(std::array::from_fn::<f32, 8, _>(|i| s[i].to_f32())))
    }
    /// Stores 8 lanes to a 16-bit type, each rounded to nearest even.
    #[inline(always)]
    fn store_half<R: Real>(self, s: &mut [R]) {
        for (d, v) in s[..8].iter_mut().zip(self.0.to_array()) {
            *d = R::from_f32(v);
        }
    }
}

impl Simd for Portable {
    type Wide = Narrow<Portable>;
    #[inline(always)]
    fn mul_add_wide(v: Self::Wide, c: Self::Wide, a: Self) -> Self {
        v.mul_add_to(c, a)
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Portable(wide::f32x8::splat(x))
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let a: [f32; 8] = s[..8].try_into().unwrap();
        Portable(wide::f32x8::from(a))
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        s[..8].copy_from_slice(&self.0.to_array());
    }
    #[inline(always)]
    fn load_bf16(s: &[bf16]) -> Self {
        Portable::load_half(s)
    }
    #[inline(always)]
    fn store_bf16(self, s: &mut [bf16]) {
        self.store_half(s)
    }
    #[inline(always)]
    fn load_f16(s: &[f16]) -> Self {
        Portable::load_half(s)
    }
    #[inline(always)]
    fn store_f16(self, s: &mut [f16]) {
        self.store_half(s)
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        Portable(self.0 + b.0)
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        Portable(self.0 - b.0)
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        Portable(self.0 * b.0)
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        Portable(self.0.mul_add(b.0, c.0))
    }
    #[inline(always)]
    fn div(self, b: Self) -> Self {
        Portable(self.0 / b.0)
    }
    #[inline(always)]
    fn max(self, b: Self) -> Self {
        // x86 `maxps` semantics on every target: the second operand when either is NaN (wide's
        // `max` returns the non-NaN lane, which turned `exp(NaN)` into 0 on this path).
        Portable(self.0.simd_gt(b.0).bitselect(self.0, b.0))
    }
    #[inline(always)]
    fn zero_where_lt(self, x: Self, t: Self) -> Self {
        Portable(x.0.simd_lt(t.0).bitselect(wide::f32x8::splat(0.0), self.0))
    }
    #[inline(always)]
    fn exp(self) -> Self {
        exp_poly(self)
    }
    #[inline(always)]
    fn reduce_add(self) -> f32 {
        self.0.reduce_add()
    }
}

/// `e^x` by range reduction to `2^n · e^r`, `|r| ≤ ln2/2`, and a degree-6
/// polynomial (Cephes `expf` coefficients); relative error below 2 ulp over
/// `[-87, 88]`, 0 below -87.3, +inf above 88.7. Written against the lane methods both
/// [`Simd`] + [`PowTwo`] and the sixteen lanes of [`Zmm`] have (`splat`, `add`, `sub`, `mul`,
/// `mul_add`, `max`, `min_`, `scale_pow2`), so that every path computes the same function, bit
/// for bit where the lanes' operations are the same instructions.
macro_rules! exp_poly {
    ($x:expr, $v:ty) => {{
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        // Operand order keeps NaN: max/min return their second operand when either is NaN.
        let x = <$v>::splat(88.8).min_(<$v>::splat(-103.0).max($x));
        // n = round(x·log2 e) through the 1.5·2^23 trick (round to nearest even, no SSE4.1 needed).
        let magic = <$v>::splat(12_582_912.0);
        let n = x.mul_add(<$v>::splat(LOG2E), magic).sub(magic);
        let r = x.sub(n.mul(<$v>::splat(LN2_HI))).sub(n.mul(<$v>::splat(LN2_LO)));
        let mut p = <$v>::splat(1.987_569_1e-4);
        p = p.mul_add(r, <$v>::splat(1.398_199_9e-3));
        p = p.mul_add(r, <$v>::splat(8.333_452e-3));
        p = p.mul_add(r, <$v>::splat(4.166_579_6e-2));
        p = p.mul_add(r, <$v>::splat(0.166_666_66));
        p = p.mul_add(r, <$v>::splat(0.5));
        let r2 = r.mul(r);
        let e = p.mul_add(r2, r.add(<$v>::splat(1.0)));
        e.scale_pow2(n)
    }};
}

/// [`exp_poly!`] on eight lanes.
#[inline(always)]
fn exp_poly<S: Simd + PowTwo>(x: S) -> S {
    exp_poly!(x, S)
}

/// Multiplication by `2^n` for integral `n`, split in two steps so that results
/// down to the subnormal range and up to the largest finite value are exact.
pub trait PowTwo: Sized {
    /// `self · 2^n`, `n` integral in `[-150, 129]`.
    fn scale_pow2(self, n: Self) -> Self;
    /// Lane-wise minimum.
    fn min_(self, b: Self) -> Self;
}

impl PowTwo for Portable {
    #[inline(always)]
    fn scale_pow2(self, n: Self) -> Self {
        let n = n.0.to_array();
        let v = self.0.to_array();
        Portable(wide::f32x8::from(std::array::from_fn::<f32, 8, _>(|i| scale2(v[i], n[i] as i32))))
    }
    #[inline(always)]
    fn min_(self, b: Self) -> Self {
        // x86 `minps` semantics, as `max` above.
        Portable(self.0.simd_lt(b.0).bitselect(self.0, b.0))
    }
}

#[inline(always)]
fn scale2(v: f32, n: i32) -> f32 {
    let h = n / 2;
    v * f32::from_bits(((h + 127) as u32) << 23) * f32::from_bits(((n - h + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512, Ymm, Zmm};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::{bf16, f16};

    use super::{Narrow, PowTwo, Simd, WideLanes};

    /// Eight f32 lanes in a 256-bit register. Only constructed inside [`super::dispatch`]
    /// after the CPU features were detected, so the intrinsics below always run on a CPU that
    /// has them. `X512 = false` is [`Avx2`] (AVX2 + FMA + F16C); `X512 = true` is [`Avx512`]:
    /// the same lanes compiled with AVX-512 F/VL/BW/DQ and BF16, which gives the kernels 32
    /// vector registers, bf16 rounding by `vcvtneps2bf16` and `exp`'s scaling by `vscalefps`,
    /// with results bit-identical to `Avx2`'s.
    #[derive(Clone, Copy)]
    pub struct Ymm<const X512: bool>(__m256);

    /// AVX2 + FMA + F16C lanes.
    pub type Avx2 = Ymm<false>;
    /// AVX2 lanes with AVX-512 (F, VL, BW, DQ, BF16) available: see [`Ymm`].
    pub type Avx512 = Ymm<true>;

    /// Sixteen f32 lanes in a 512-bit register: [`Avx512`]'s [`Simd::Wide`], for register-tiled
    /// products. Only constructed inside the AVX-512 target-feature function of `dispatch`.
    #[derive(Clone, Copy)]
    pub struct Zmm(__m512);

    // SAFETY (impl-wide): `Zmm` values exist only where `Avx512` lanes do (see the module-wide
    // note at `impl Simd for Ymm`), so AVX-512 F is present.
    impl WideLanes for Zmm {
        const WIDTH: usize = 16;
        const TILE_VECTORS: usize = 4;
        #[inline(always)]
        fn splat(x: f32) -> Self {
            // SAFETY: see the impl-wide note.
            unsafe { Zmm(_mm512_set1_ps(x)) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: 16 f32 at `p` are readable (the caller's contract); unaligned load.
            unsafe { Zmm(_mm512_loadu_ps(p)) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: 16 f32 at `p` are writable (the caller's contract); unaligned store.
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn mul_add(self, b: Self, c: Self) -> Self {
            // SAFETY: see the impl-wide note. Fused, as `Ymm::mul_add`.
            unsafe { Zmm(_mm512_fmadd_ps(self.0, b.0, c.0)) }
        }
        #[inline(always)]
        fn mul(self, b: Self) -> Self {
            // SAFETY: see the impl-wide note.
            unsafe { Zmm(_mm512_mul_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn exp(self) -> Self {
            exp_poly!(self, Zmm)
        }
        #[inline(always)]
        fn add(self, b: Self) -> Self {
            // SAFETY: see the impl-wide note.
            unsafe { Zmm(_mm512_add_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn sub(self, b: Self) -> Self {
            // SAFETY: see the impl-wide note.
            unsafe { Zmm(_mm512_sub_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn div(self, b: Self) -> Self {
            // SAFETY: see the impl-wide note.
            unsafe { Zmm(_mm512_div_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn round_bf16_each<const N: usize>(mut v: [Self; N]) -> [Self; N] {
            // SAFETY: see the impl-wide note. `bf16_packed` rounds as `Ymm::round_bf16` (with
            // its own subnormal test); the sixteen results widen exactly by a 16-bit shift.
            // Loops, not closures (which would lose the features).
            unsafe {
                for x in v.iter_mut() {
                    *x = Zmm(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x.bf16_packed()))));
                }
            }
            v
        }
        #[inline(always)]
        fn round_f16_each<const N: usize>(mut v: [Self; N]) -> [Self; N] {
            // SAFETY: see the impl-wide note; nearest even, widened exactly, as `Ymm::round_f16`.
            unsafe {
                for x in v.iter_mut() {
                    *x = Zmm(_mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x.0)));
                }
            }
            v
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const bf16) -> Self {
            // SAFETY: 32 bytes at `p` are readable (the caller's contract); a bf16 widens by a
            // 16-bit shift, as `Ymm::from_bf16_packed`.
            unsafe {
                Zmm(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())))))
            }
        }
        #[inline(always)]
        unsafe fn store_bf16(self, p: *mut bf16) {
            // SAFETY: 32 bytes at `p` are writable (the caller's contract).
            unsafe { _mm256_storeu_si256(p.cast(), self.bf16_packed()) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const f16) -> Self {
            // SAFETY: 32 bytes at `p` are readable (the caller's contract); exact widening.
            unsafe { Zmm(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
        }
        #[inline(always)]
        unsafe fn store_f16(self, p: *mut f16) {
            // SAFETY: 32 bytes at `p` are writable (the caller's contract); nearest even, as
            // `Ymm::store_f16`.
            unsafe { _mm256_storeu_si256(p.cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0)) }
        }
        #[inline(always)]
        unsafe fn stream(self, p: *mut f32) {
            // SAFETY: 64 writable, 64-byte aligned bytes at `p` (the caller's contract).
            unsafe { _mm512_stream_ps(p, self.0) }
        }
        #[inline(always)]
        unsafe fn stream_bf16(self, p: *mut bf16) {
            // SAFETY: 32 writable, 32-byte aligned bytes at `p` (the caller's contract).
            unsafe { _mm256_stream_si256(p.cast(), self.bf16_packed()) }
        }
        #[inline(always)]
        unsafe fn stream_f16(self, p: *mut f16) {
            // SAFETY: 32 writable, 32-byte aligned bytes at `p` (the caller's contract); nearest
            // even, as `store_f16`.
            unsafe { _mm256_stream_si256(p.cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0)) }
        }
    }

    /// The lane operations [`exp_poly!`] needs beyond [`WideLanes`]'s: the same instructions as
    /// `Ymm::<true>`'s (`Avx512`) on sixteen lanes, so `exp` gives its bits.
    impl Zmm {
        #[inline(always)]
        fn max(self, b: Self) -> Self {
            // SAFETY: see the impl-wide note of `impl WideLanes for Zmm`. `maxps` semantics: the
            // second operand when either is NaN.
            unsafe { Zmm(_mm512_max_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn min_(self, b: Self) -> Self {
            // SAFETY: as `max`.
            unsafe { Zmm(_mm512_min_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn scale_pow2(self, n: Self) -> Self {
            // SAFETY: as `max`; `vscalefps`, as `Ymm::<true>::scale_pow2`.
            unsafe { Zmm(_mm512_scalef_ps(self.0, n.0)) }
        }
        /// The sixteen lanes rounded to bf16 bit for bit as [`Simd::store_bf16`] rounds them:
        /// `vcvtneps2bf16`, which treats subnormal inputs as zero, so, as `Ymm::bf16_hw`, a vector
        /// with a subnormal lane takes the eight-lane rounding (`Ymm::bf16_packed`) per half.
        #[inline(always)]
        fn bf16_packed(self) -> __m256i {
            // SAFETY: see the impl-wide note of `impl WideLanes for Zmm`; AVX-512 BF16 is present
            // where `Zmm` values exist. The transmute reinterprets 256 bits.
            unsafe {
                if _mm512_fpclass_ps_mask::<0x20>(self.0) == 0 {
                    return std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(self.0));
                }
                let lo = Ymm::<true>(_mm512_castps512_ps256(self.0)).bf16_packed();
                let hi = Ymm::<true>(_mm512_extractf32x8_ps::<1>(self.0)).bf16_packed();
                _mm256_set_m128i(hi, lo)
            }
        }
    }

    /// Picks [`Simd::Wide`] for each `Ymm` level.
    pub trait Widest: Sized {
        /// [`Simd::Wide`] of this level.
        type Wide: WideLanes;
        /// [`Simd::mul_add_wide`] of this level.
        fn mul_add_wide(v: Self::Wide, c: Self::Wide, a: Self) -> Self;
    }
    impl Widest for Ymm<false> {
        type Wide = Narrow<Ymm<false>>;
        #[inline(always)]
        fn mul_add_wide(v: Self::Wide, c: Self::Wide, a: Self) -> Self {
            v.mul_add_to(c, a)
        }
    }
    impl Widest for Ymm<true> {
        type Wide = Zmm;
        #[inline(always)]
        fn mul_add_wide(v: Zmm, c: Zmm, a: Self) -> Self {
            // SAFETY: `Zmm` values exist only where AVX-512 F is present (see `Zmm`).
            unsafe {
                let a = _mm256_fmadd_ps(_mm512_castps512_ps256(v.0), _mm512_castps512_ps256(c.0), a.0);
                Ymm(_mm256_fmadd_ps(_mm512_extractf32x8_ps::<1>(v.0), _mm512_extractf32x8_ps::<1>(c.0), a))
            }
        }
    }

    // SAFETY (module-wide): `Avx2` values exist only inside the `#[target_feature(enable =
    // "avx2,fma,f16c")]` function, and `Avx512` values only inside the one that adds
    // "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16", that `dispatch` calls after
    // `is_x86_feature_detected!` confirmed those features, so every intrinsic here runs on a CPU
    // that supports it (the AVX-512 ones only in `X512` branches). Loads and stores check the
    // slice length before touching 8 elements.
    impl<const X512: bool> Simd for Ymm<X512>
    where
        Self: Widest,
    {
        type Wide = <Self as Widest>::Wide;
        #[inline(always)]
        fn mul_add_wide(v: Self::Wide, c: Self::Wide, a: Self) -> Self {
            <Self as Widest>::mul_add_wide(v, c, a)
        }
        #[inline(always)]
        fn splat(x: f32) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_set1_ps(x)) }
        }
        #[inline(always)]
        fn load(s: &[f32]) -> Self {
            assert!(s.len() >= 8);
            // SAFETY: 8 elements are in bounds (asserted); unaligned load.
            unsafe { Ymm(_mm256_loadu_ps(s.as_ptr())) }
        }
        #[inline(always)]
        fn store(self, s: &mut [f32]) {
            assert!(s.len() >= 8);
            // SAFETY: 8 elements are in bounds (asserted); unaligned store.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), self.0) }
        }
        #[inline(always)]
        fn load_bf16(s: &[bf16]) -> Self {
            assert!(s.len() >= 8);
            // SAFETY: 16 bytes are in bounds (asserted).
            unsafe { Self::from_bf16_packed(_mm_loadu_si128(s.as_ptr().cast())) }
        }
        #[inline(always)]
        fn store_bf16(self, s: &mut [bf16]) {
            assert!(s.len() >= 8);
            // SAFETY: 16 bytes are in bounds (asserted).
            unsafe { _mm_storeu_si128(s.as_mut_ptr().cast(), self.bf16_packed()) }
        }
        #[inline(always)]
        fn load_f16(s: &[f16]) -> Self {
            assert!(s.len() >= 8);
            // SAFETY: 16 bytes are in bounds (asserted); F16C conversion is exact.
            unsafe { Ymm(_mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()))) }
        }
        #[inline(always)]
        fn store_f16(self, s: &mut [f16]) {
            assert!(s.len() >= 8);
            // SAFETY: 16 bytes are in bounds (asserted); F16C rounds to nearest even.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0);
                _mm_storeu_si128(s.as_mut_ptr().cast(), h)
            }
        }
        #[inline(always)]
        fn add(self, b: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_add_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn sub(self, b: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_sub_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn mul(self, b: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_mul_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn mul_add(self, b: Self, c: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_fmadd_ps(self.0, b.0, c.0)) }
        }
        #[inline(always)]
        fn div(self, b: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_div_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn round_bf16(self) -> Self {
            // SAFETY: see the module-wide note. The same rounding as `store_bf16`, kept in lanes:
            // the rounded bits with the low half cleared.
            unsafe {
                if X512 && let Some(h) = self.bf16_hw() {
                    return Self::from_bf16_packed(h);
                }
                let r = self.bf16_bits();
                Ymm(_mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(0xffff_0000u32 as i32))))
            }
        }
        #[inline(always)]
        fn round_bf16_each<const N: usize>(mut v: [Self; N]) -> [Self; N] {
            // SAFETY: see the module-wide note. One subnormal test for all N vectors (`bf16_hw`'s
            // test); where a lane of any is subnormal, each takes `round_bf16`. Loops, not
            // closures (which would lose the features).
            unsafe {
                if X512 {
                    let mut sub = 0u8;
                    for x in v.iter() {
                        sub |= _mm256_fpclass_ps_mask::<0x20>(x.0);
                    }
                    if sub == 0 {
                        for x in v.iter_mut() {
                            *x = Self::from_bf16_packed(x.bf16_cvt());
                        }
                        return v;
                    }
                }
            }
            for x in v.iter_mut() {
                *x = x.round_bf16();
            }
            v
        }
        #[inline(always)]
        fn round_f16(self) -> Self {
            // SAFETY: see the module-wide note; F16C rounds to nearest even and widens exactly.
            unsafe { Ymm(_mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0))) }
        }
        #[inline(always)]
        fn max(self, b: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_max_ps(self.0, b.0)) }
        }
        #[inline(always)]
        fn zero_where_lt(self, x: Self, t: Self) -> Self {
            // SAFETY: see the module-wide note. `x < t` ordered: false (lane kept) for NaN.
            unsafe { Ymm(_mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x.0, t.0), self.0)) }
        }
        #[inline(always)]
        fn exp(self) -> Self {
            super::exp_poly(self)
        }
        #[inline(always)]
        fn prefetch<T>(p: *const T) {
            Self::prefetch_line(p)
        }
        #[inline(always)]
        unsafe fn stream(self, p: *mut f32) {
            // SAFETY: 8 writable, 32-byte aligned f32 at `p` (caller's contract).
            unsafe { _mm256_stream_ps(p, self.0) }
        }
        #[inline(always)]
        unsafe fn stream_bf16(self, p: *mut bf16) {
            // SAFETY: 16 writable, 16-byte aligned bytes at `p` (caller's contract).
            unsafe { _mm_stream_si128(p.cast(), self.bf16_packed()) }
        }
        #[inline(always)]
        unsafe fn stream_f16(self, p: *mut f16) {
            // SAFETY: 16 writable, 16-byte aligned bytes at `p` (caller's contract); F16C rounds
            // to nearest even.
            unsafe { _mm_stream_si128(p.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(self.0)) }
        }
        #[inline(always)]
        fn store_fence() {
            // SAFETY: a fence has no memory operands.
            unsafe { _mm_sfence() }
        }
        #[inline(always)]
        fn reduce_add(self) -> f32 {
            // SAFETY: see the module-wide note.
            unsafe {
                let lo = _mm256_castps256_ps128(self.0);
                let hi = _mm256_extractf128_ps::<1>(self.0);
                let s = _mm_add_ps(lo, hi);
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
                _mm_cvtss_f32(s)
            }
        }
        #[inline(always)]
        fn transpose8(v: [Self; 8]) -> [Self; 8] {
            // SAFETY: see the module-wide note. Pairs of rows interleaved by elements, then by
            // pairs of elements, then the 128-bit halves exchanged.
            unsafe {
                let x = v.map(|y| y.0);
                let t0 = _mm256_unpacklo_ps(x[0], x[1]);
                let t1 = _mm256_unpackhi_ps(x[0], x[1]);
                let t2 = _mm256_unpacklo_ps(x[2], x[3]);
                let t3 = _mm256_unpackhi_ps(x[2], x[3]);
                let t4 = _mm256_unpacklo_ps(x[4], x[5]);
                let t5 = _mm256_unpackhi_ps(x[4], x[5]);
                let t6 = _mm256_unpacklo_ps(x[6], x[7]);
                let t7 = _mm256_unpackhi_ps(x[6], x[7]);
                let s0 = _mm256_shuffle_ps::<0b01_00_01_00>(t0, t2);
                let s1 = _mm256_shuffle_ps::<0b11_10_11_10>(t0, t2);
                let s2 = _mm256_shuffle_ps::<0b01_00_01_00>(t1, t3);
                let s3 = _mm256_shuffle_ps::<0b11_10_11_10>(t1, t3);
                let s4 = _mm256_shuffle_ps::<0b01_00_01_00>(t4, t6);
                let s5 = _mm256_shuffle_ps::<0b11_10_11_10>(t4, t6);
                let s6 = _mm256_shuffle_ps::<0b01_00_01_00>(t5, t7);
                let s7 = _mm256_shuffle_ps::<0b11_10_11_10>(t5, t7);
                [
                    Ymm(_mm256_permute2f128_ps::<0x20>(s0, s4)),
                    Ymm(_mm256_permute2f128_ps::<0x20>(s1, s5)),
                    Ymm(_mm256_permute2f128_ps::<0x20>(s2, s6)),
                    Ymm(_mm256_permute2f128_ps::<0x20>(s3, s7)),
                    Ymm(_mm256_permute2f128_ps::<0x31>(s0, s4)),
                    Ymm(_mm256_permute2f128_ps::<0x31>(s1, s5)),
                    Ymm(_mm256_permute2f128_ps::<0x31>(s2, s6)),
                    Ymm(_mm256_permute2f128_ps::<0x31>(s3, s7)),
                ]
            }
        }
        #[inline(always)]
        fn reduce_add_rows(v: [Self; 8]) -> Self {
            // SAFETY: see the module-wide note. `reduce_add`'s tree, eight rows at a time:
            // (i, i + 4), then (j, j + 2) of those, then (0, 1).
            unsafe {
                let (l01, l23) = (halves(v[0], v[1]), halves(v[2], v[3]));
                let (l45, l67) = (halves(v[4], v[5]), halves(v[6], v[7]));
                // [A0+A2, A1+A3, C0+C2, C1+C3 | B.., D..] for rows A, B of `l01` and C, D of `l23`.
                let m0123 = _mm256_add_ps(
                    _mm256_shuffle_ps::<0b01_00_01_00>(l01, l23),
                    _mm256_shuffle_ps::<0b11_10_11_10>(l01, l23),
                );
                let m4567 = _mm256_add_ps(
                    _mm256_shuffle_ps::<0b01_00_01_00>(l45, l67),
                    _mm256_shuffle_ps::<0b11_10_11_10>(l45, l67),
                );
                // [r0, r2, r4, r6 | r1, r3, r5, r7]
                let r = _mm256_add_ps(
                    _mm256_shuffle_ps::<0b10_00_10_00>(m0123, m4567),
                    _mm256_shuffle_ps::<0b11_01_11_01>(m0123, m4567),
                );
                Ymm(_mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)))
            }
        }
    }

    /// `[a0+a4 .. a3+a7 | b0+b4 .. b3+b7]`: the first step of `reduce_add` for two rows. A
    /// function, not a closure: a closure would be compiled without the caller's features.
    #[inline(always)]
    fn halves<const X512: bool>(a: Ymm<X512>, b: Ymm<X512>) -> __m256 {
        // SAFETY: see the module-wide note.
        unsafe { _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a.0, b.0), _mm256_permute2f128_ps::<0x31>(a.0, b.0)) }
    }

    impl<const X512: bool> Ymm<X512> {
        /// Each lane's bits rounded to bf16 in the high half (round to nearest even: bits +
        /// 0x7fff + lsb); NaN keeps a quiet payload like `half`. The low half is garbage.
        #[inline(always)]
        fn bf16_bits(self) -> __m256i {
            // SAFETY: see the module-wide note.
            unsafe {
                let bits = _mm256_castps_si256(self.0);
                let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
                let rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb);
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(self.0, self.0));
                let quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x0040_0000));
                _mm256_blendv_epi8(rounded, quiet, nan)
            }
        }

        /// The eight lanes rounded to bf16 (nearest even; NaN keeps a quiet payload like
        /// `half`), packed into 16 bytes.
        #[inline(always)]
        fn bf16_packed(self) -> __m128i {
            // SAFETY: see the module-wide note.
            unsafe {
                if X512 && let Some(h) = self.bf16_hw() {
                    return h;
                }
                let hi = _mm256_srli_epi32::<16>(self.bf16_bits());
                let packed = _mm256_packus_epi32(hi, hi);
                _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(packed))
            }
        }

        /// `vcvtneps2bf16` (`X512` only): the same rounding as `bf16_bits` (nearest even, NaN
        /// quietened by setting bit 6 of the result), except that it flushes subnormal inputs
        /// to zero; `None` when a lane is subnormal, for the integer rounding to handle.
        #[inline(always)]
        fn bf16_hw(self) -> Option<__m128i> {
            debug_assert!(X512);
            // SAFETY: see the module-wide note: called in `X512` branches only, inside the
            // AVX-512 BF16 target-feature function.
            unsafe {
                if _mm256_fpclass_ps_mask::<0x20>(self.0) != 0 {
                    return None;
                }
            }
            Some(self.bf16_cvt())
        }

        /// `vcvtneps2bf16` (`X512` only) without `bf16_hw`'s subnormal test: for lanes that the
        /// caller tested.
        #[inline(always)]
        fn bf16_cvt(self) -> __m128i {
            debug_assert!(X512);
            // SAFETY: as `bf16_hw`. The transmute reinterprets 128 bits.
            unsafe { std::mem::transmute::<__m128bh, __m128i>(_mm256_cvtneps_pbh(self.0)) }
        }

        /// Eight packed bf16 widened exactly (a 16-bit shift).
        #[inline(always)]
        fn from_bf16_packed(h: __m128i) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))) }
        }

        /// Prefetch into all cache levels; never faults, even for an address past the tensor.
        #[inline(always)]
        pub fn prefetch_line<T>(p: *const T) {
            // SAFETY: prefetch is a hint; it never dereferences or faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
        }
    }

    impl<const X512: bool> PowTwo for Ymm<X512> {
        #[inline(always)]
        fn scale_pow2(self, n: Self) -> Self {
            // SAFETY: see the module-wide note. Two factors 2^h and 2^(n-h), each a normal float
            // (the product rounded once, as `vscalefps` rounds it with AVX-512).
            unsafe {
                if X512 {
                    return Ymm(_mm256_scalef_ps(self.0, n.0));
                }
                let n = _mm256_cvtps_epi32(n.0);
                let h = _mm256_srai_epi32::<1>(n);
                let bias = _mm256_set1_epi32(127);
                let f1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(h, bias)));
                let f2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_sub_epi32(n, h), bias)));
                Ymm(_mm256_mul_ps(_mm256_mul_ps(self.0, f1), f2))
            }
        }
        #[inline(always)]
        fn min_(self, b: Self) -> Self {
            // SAFETY: see the module-wide note.
            unsafe { Ymm(_mm256_min_ps(self.0, b.0)) }
        }
    }
}

/// A kernel body generic over the lane type; [`dispatch`] picks the instantiation.
pub trait SimdKernel {
    /// What the kernel returns.
    type Output;
    /// Runs the body with lanes `S`. Mark implementations `#[inline(always)]` so the
    /// body is compiled inside the feature-enabled caller.
    fn run<S: Simd + PowTwo>(self) -> Self::Output;
}

/// Which instruction set [`dispatch`] uses on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// AVX2 + FMA + F16C with AVX-512 F, VL, BW, DQ and BF16 ([`Avx512`]).
    Avx512,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// `wide`'s compile-time baseline (SSE2 on x86-64).
    Portable,
}

/// The instruction set detected once per process. `SSM_CPU_SIMD=portable` forces the portable
/// path, `SSM_CPU_SIMD=avx2` stops at AVX2 on a CPU with AVX-512 (tests of every path).
pub fn simd_level() -> SimdLevel {
    static LEVEL: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let asked = std::env::var("SSM_CPU_SIMD").unwrap_or_default();
        if asked == "portable" {
            return SimdLevel::Portable;
        }
        let best = supported_levels()[0];
        if asked == "avx2" && best == SimdLevel::Avx512 { SimdLevel::Avx2 } else { best }
    })
}

/// Every instruction set this CPU runs, the best first (the portable path always last);
/// detected once per process.
pub fn supported_levels() -> &'static [SimdLevel] {
    static LEVELS: std::sync::OnceLock<Vec<SimdLevel>> = std::sync::OnceLock::new();
    LEVELS.get_or_init(detect_levels)
}

fn detect_levels() -> Vec<SimdLevel> {
    let mut levels = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512bf16")
            {
                levels.push(SimdLevel::Avx512);
            }
            levels.push(SimdLevel::Avx2);
        }
    }
    levels.push(SimdLevel::Portable);
    levels
}

/// Runs `k` with the best lanes this CPU supports ([`simd_level`]). No allocation and no
/// feature check per call: the detection is done once per process.
#[inline]
pub fn dispatch<K: SimdKernel>(k: K) -> K::Output {
    run_supported(simd_level(), k)
}

/// Runs `k` with the lanes of `level` when it is one of [`supported_levels`], else portable.
#[inline]
pub fn dispatch_at<K: SimdKernel>(level: SimdLevel, k: K) -> K::Output {
    run_supported(if supported_levels().contains(&level) { level } else { SimdLevel::Portable }, k)
}

/// Runs `k` with the lanes of `level`, which must be one of [`supported_levels`] ([`simd_level`]
/// returns only those).
#[inline]
fn run_supported<K: SimdKernel>(level: SimdLevel, k: K) -> K::Output {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            // SAFETY: `supported_levels` lists Avx512 only after detecting avx2, fma, f16c,
            // avx512f, avx512vl, avx512bw, avx512dq and avx512bf16 (this function's contract).
            unsafe { run_avx512(k) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => {
            // SAFETY: `supported_levels` lists Avx2 only after detecting avx2, fma and f16c.
            unsafe { run_avx2(k) }
        }
        _ => k.run::<Portable>(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<K: SimdKernel>(k: K) -> K::Output {
    k.run::<Avx2>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")]
unsafe fn run_avx512<K: SimdKernel>(k: K) -> K::Output {
    k.run::<Avx512>()
}

/// A state or activation element type the kernels load into and store from lanes.
pub trait Real: ssm_tensor::Element + Copy {
    /// Widens to f32 exactly.
    fn to_f32(self) -> f32;
    /// Rounds an f32 to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Loads 8 elements as f32 lanes.
    fn load<S: Simd>(s: &[Self]) -> S;
    /// Stores 8 lanes, rounding to nearest even.
    fn store<S: Simd>(v: S, s: &mut [Self]);
    /// Each lane rounded to this type and widened back (identity for f32).
    fn round<S: Simd>(v: S) -> S;
    /// Streams 8 lanes to `p` ([`Simd::stream`] and its siblings).
    ///
    /// # Safety
    /// `p` valid for 8 elements and aligned to their size (32 bytes for f32, 16 otherwise).
    unsafe fn stream<S: Simd>(v: S, p: *mut Self);
    /// Loads [`WideLanes::WIDTH`] elements as wide f32 lanes (as [`Real::load`]).
    ///
    /// # Safety
    /// `p` valid for reading `W::WIDTH` elements (any alignment).
    unsafe fn load_wide<W: WideLanes>(p: *const Self) -> W;
    /// Stores wide lanes as [`WideLanes::WIDTH`] elements (as [`Real::store`]).
    ///
    /// # Safety
    /// `p` valid for writing `W::WIDTH` elements (any alignment).
    unsafe fn store_wide<W: WideLanes>(v: W, p: *mut Self);
    /// Each lane of each wide vector rounded to this type and widened back, bit for bit as
    /// [`Real::round`] (identity for f32; for bf16 one subnormal test per vector where the lanes
    /// have one).
    #[inline(always)]
    fn round_each_wide<W: WideLanes, const N: usize>(mut v: [W; N]) -> [W; N] {
        let mut q = [Self::from_f32(0.0); 16];
        for x in v.iter_mut() {
            // SAFETY: `q` holds 16 ≥ `W::WIDTH` elements.
            unsafe {
                Self::store_wide(*x, q.as_mut_ptr());
                *x = Self::load_wide(q.as_ptr());
            }
        }
        v
    }
    /// Streams wide lanes to `p` ([`WideLanes::stream`] and its siblings; a plain
    /// [`Real::store_wide`] for the integer states).
    ///
    /// # Safety
    /// `p` valid for writing `W::WIDTH` elements and aligned to their size.
    #[inline(always)]
    unsafe fn stream_wide<W: WideLanes>(v: W, p: *mut Self) {
        // SAFETY: the caller's contract covers `store_wide`'s.
        unsafe { Self::store_wide(v, p) }
    }
}

/// Runs `$body` with the type alias `$r` naming the element type of the run-time `dtype` (f32,
/// bf16 or f16): one instantiation of a generic body per dtype, the match outside its loops. A
/// macro because a closure cannot be generic over a type.
macro_rules! with_real {
    ($dtype:expr, $r:ident => $body:expr) => {
        match $dtype {
            ssm_tensor::DType::F32 => {
                type $r = f32;
                $body
            }
            ssm_tensor::DType::BF16 => {
                type $r = half::bf16;
                $body
            }
            ssm_tensor::DType::F16 => {
                type $r = half::f16;
                $body
            }
            _ => unreachable!("plans admit f32/bf16/f16 tensors only here"),
        }
    };
}
pub(crate) use with_real;

impl Real for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn load<S: Simd>(s: &[Self]) -> S {
        S::load(s)
    }
    #[inline(always)]
    fn store<S: Simd>(v: S, s: &mut [Self]) {
        v.store(s)
    }
    #[inline(always)]
    fn round<S: Simd>(v: S) -> S {
        v
    }
    #[inline(always)]
    unsafe fn stream<S: Simd>(v: S, p: *mut Self) {
        // SAFETY: caller's contract.
        unsafe { v.stream(p) }
    }
    #[inline(always)]
    unsafe fn load_wide<W: WideLanes>(p: *const Self) -> W {
        // SAFETY: caller's contract.
        unsafe { W::load(p) }
    }
    #[inline(always)]
    unsafe fn store_wide<W: WideLanes>(v: W, p: *mut Self) {
        // SAFETY: caller's contract.
        unsafe { v.store(p) }
    }
    #[inline(always)]
    unsafe fn stream_wide<W: WideLanes>(v: W, p: *mut Self) {
        // SAFETY: caller's contract.
        unsafe { v.stream(p) }
    }
    #[inline(always)]
    fn round_each_wide<W: WideLanes, const N: usize>(v: [W; N]) -> [W; N] {
        v
    }
}

/// `Real` for a 16-bit storage type: conversions from `half`, lane loads, stores, rounding and
/// streaming stores through the `Simd` methods named for it.
macro_rules! real_half {
    ($t:ty, $load:ident, $store:ident, $round:ident, $round_each:ident, $stream:ident) => {
        impl Real for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                <$t>::from_f32(v)
            }
            #[inline(always)]
            fn load<S: Simd>(s: &[Self]) -> S {
                S::$load(s)
            }
            #[inline(always)]
            fn store<S: Simd>(v: S, s: &mut [Self]) {
                v.$store(s)
            }
            #[inline(always)]
            fn round<S: Simd>(v: S) -> S {
                v.$round()
            }
            #[inline(always)]
            unsafe fn stream<S: Simd>(v: S, p: *mut Self) {
                // SAFETY: caller's contract.
                unsafe { v.$stream(p) }
            }
            #[inline(always)]
            unsafe fn load_wide<W: WideLanes>(p: *const Self) -> W {
                // SAFETY: caller's contract.
                unsafe { W::$load(p) }
            }
            #[inline(always)]
            unsafe fn store_wide<W: WideLanes>(v: W, p: *mut Self) {
                // SAFETY: caller's contract.
                unsafe { v.$store(p) }
            }
            #[inline(always)]
            unsafe fn stream_wide<W: WideLanes>(v: W, p: *mut Self) {
                // SAFETY: caller's contract.
                unsafe { W::$stream(v, p) }
            }
            #[inline(always)]
            fn round_each_wide<W: WideLanes, const N: usize>(v: [W; N]) -> [W; N] {
                W::$round_each(v)
            }
        }
    };
}

real_half!(bf16, load_bf16, store_bf16, round_bf16, round_bf16_each, stream_bf16);
real_half!(f16, load_f16, store_f16, round_f16, round_f16_each, stream_f16);

/// The integers of a block-scaled i16 / i8 state (`state_scale`, [`ssm_ssu::quant`]):
/// `to_f32` widens the stored integer and `from_f32` stores an *already encoded* value
/// (clamped to ±LIMIT, rounded to nearest even). The row's scale is the caller's: it multiplies
/// a loaded row by the decode scale and a stored row by the encode scale. Lanes go through
/// scalars (the SSU's quantized rows are the only user).
macro_rules! real_int {
    ($t:ty) => {
        impl Real for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 {
                f32::from(self)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                ssm_ssu::quant::quantize::<$t>(v, 1.0)
            }
            #[inline(always)]
            fn load<S: Simd>(s: &[Self]) -> S {
                let mut v = [0.0f32; LANES];
                v.iter_mut().zip(&s[..LANES]).for_each(|(v, &q)| *v = f32::from(q));
                S::load(&v)
            }
            #[inline(always)]
            fn store<S: Simd>(v: S, s: &mut [Self]) {
                let mut t = [0.0f32; LANES];
                v.store(&mut t);
                s[..LANES].iter_mut().zip(t).for_each(|(q, v)| *q = Self::from_f32(v));
            }
            #[inline(always)]
            fn round<S: Simd>(v: S) -> S {
                let mut q = [0 as $t; LANES];
                Self::store(v, &mut q);
                Self::load(&q)
            }
            #[inline(always)]
            unsafe fn stream<S: Simd>(v: S, p: *mut Self) {
                // SAFETY: caller's contract (8 valid elements at `p`).
                Self::store(v, unsafe { std::slice::from_raw_parts_mut(p, LANES) })
            }
            #[inline(always)]
            unsafe fn load_wide<W: WideLanes>(p: *const Self) -> W {
                let mut v = [0.0f32; 16];
                // SAFETY: caller's contract (`W::WIDTH` ≤ 16 valid elements at `p`).
                let q = unsafe { std::slice::from_raw_parts(p, W::WIDTH) };
                v.iter_mut().zip(q).for_each(|(v, &q)| *v = f32::from(q));
                // SAFETY: `v` holds 16 ≥ `W::WIDTH` f32.
                unsafe { W::load(v.as_ptr()) }
            }
            #[inline(always)]
            unsafe fn store_wide<W: WideLanes>(v: W, p: *mut Self) {
                let mut t = [0.0f32; 16];
                // SAFETY: `t` holds 16 ≥ `W::WIDTH` f32; the caller's contract for `p`.
                let q = unsafe {
                    v.store(t.as_mut_ptr());
                    std::slice::from_raw_parts_mut(p, W::WIDTH)
                };
                q.iter_mut().zip(t).for_each(|(q, v)| *q = Self::from_f32(v));
            }
        }
    };
}

real_int!(i16);
real_int!(i8);

#[cfg(test)]
mod tests {
    use super::*;

    struct RoundTrip(Vec<f32>);
    impl SimdKernel for RoundTrip {
        type Output = (Vec<f32>, Vec<bf16>, Vec<f16>, f32);
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let mut e = vec![0.0; self.0.len()];
            let mut b = vec![bf16::ZERO; self.0.len()];
            let mut h = vec![f16::ZERO; self.0.len()];
            let mut sum = S::splat(0.0);
            for i in (0..self.0.len()).step_by(8) {
                let v = S::load(&self.0[i..]);
                v.exp().store(&mut e[i..]);
                v.store_bf16(&mut b[i..]);
                v.store_f16(&mut h[i..]);
                sum = sum.add(S::load_bf16(&b[i..]).mul(S::load_f16(&h[i..])));
            }
            (e, b, h, sum.reduce_add())
        }
    }

    fn check_level(level: SimdLevel) {
        let xs: Vec<f32> = (0..4096)
            .map(|i| (i as f32 - 2048.0) * 0.0521 + 0.013)
            .chain([-104.0, -87.5, -50.0, 0.0, 1e-8, 88.5, 100.0, f32::NAN])
            .collect();
        let (e, b, h, _) = dispatch_at(level, RoundTrip(xs.clone()));
        for (i, &x) in xs.iter().enumerate() {
            let want = (x as f64).exp();
            if x.is_nan() {
                assert!(e[i].is_nan() && b[i].is_nan() && h[i].is_nan());
                continue;
            }
            let got = e[i] as f64;
            if want < 1e-38 {
                assert!(got.abs() <= 2e-38, "exp({x}) = {got}");
            } else if want > f32::MAX as f64 {
                assert!(got.is_infinite(), "exp({x}) = {got}");
            } else {
                assert!(((got - want) / want).abs() < 3e-7, "exp({x}) = {got}, want {want}");
            }
            assert_eq!(b[i].to_bits(), bf16::from_f32(x).to_bits(), "bf16 of {x}");
            assert_eq!(h[i].to_bits(), f16::from_f32(x).to_bits(), "f16 of {x}");
        }
    }

    /// `round_bf16`/`round_f16` in lanes, and their `_each` forms four vectors at a time, against
    /// `half`'s scalar rounding, on ties, subnormals, infinities, NaN and random bit patterns
    /// (every path this CPU has, the portable one last; the inputs' length a multiple of 32).
    struct Rounds(Vec<f32>);
    impl SimdKernel for Rounds {
        type Output = [Vec<f32>; 4];
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let n = self.0.len();
            let [mut b, mut h, mut be, mut he] = [vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]];
            for i in (0..n).step_by(8) {
                let v = S::load(&self.0[i..]);
                v.round_bf16().store(&mut b[i..]);
                v.round_f16().store(&mut h[i..]);
            }
            for i in (0..n).step_by(32) {
                let v: [S; 4] = std::array::from_fn(|k| S::load(&self.0[i + 8 * k..]));
                for (k, r) in S::round_bf16_each(v).into_iter().enumerate() {
                    r.store(&mut be[i + 8 * k..]);
                }
                for (k, r) in S::round_f16_each(v).into_iter().enumerate() {
                    r.store(&mut he[i + 8 * k..]);
                }
            }
            [b, h, be, he]
        }
    }

    /// 4096 random bit patterns (xorshift from `seed`), then ties, subnormals, values past f16's
    /// range, infinity and NaN, then `extra`, padded with 0.5 to a multiple of `multiple`.
    fn rounding_inputs(seed: u64, extra: &[f32], multiple: usize) -> Vec<f32> {
        let mut x = seed;
        let mut xs: Vec<f32> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                f32::from_bits(x as u32)
            })
            .collect();
        xs.extend([1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 1e-40, -1e-45, 65520.0, 1e5, f32::INFINITY, f32::NAN]);
        xs.extend(extra);
        while !xs.len().is_multiple_of(multiple) {
            xs.push(0.5);
        }
        xs
    }

    #[test]
    fn lane_rounding_matches_half() {
        let xs = rounding_inputs(0x2545_f491_4f6c_dd1d, &[], 32);
        for [b, h, be, he] in supported_levels().iter().map(|&l| dispatch_at(l, Rounds(xs.clone()))) {
            for (i, &v) in xs.iter().enumerate() {
                let (wb, wh) = (bf16::from_f32(v).to_f32().to_bits(), f16::from_f32(v).to_f32().to_bits());
                assert_eq!(b[i].to_bits(), wb, "bf16 of {v:e}");
                assert_eq!(h[i].to_bits(), wh, "f16 of {v:e}");
                assert_eq!(be[i].to_bits(), wb, "bf16 (each) of {v:e}");
                assert_eq!(he[i].to_bits(), wh, "f16 (each) of {v:e}");
            }
        }
    }

    /// The level's wide lanes ([`Simd::Wide`]): bf16 and f16 stores round as `half` does (the
    /// inputs of `lane_rounding_matches_half`: ties, subnormals, NaN), streaming stores write
    /// the plain stores' bits, loads widen exactly, and `mul_add_wide` sums as the eight-lane
    /// `mul_add` walk does, bit for bit.
    struct WideRounds(Vec<f32>);
    /// 64 bytes on a cache line: a streaming store's aligned destination.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);
    type WideOut = (Vec<bf16>, Vec<f16>, Vec<f32>, [[f32; LANES]; 2], (Vec<Line>, Vec<Line>, Vec<Line>));
    impl SimdKernel for WideRounds {
        type Output = WideOut;
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let (n, w) = (self.0.len(), S::Wide::WIDTH);
            let (mut b, mut h) = (vec![bf16::ZERO; n], vec![f16::ZERO; n]);
            let mut back = vec![0.0f32; n];
            let mut streamed =
                [vec![Line([0; 64]); n * 4 / 64], vec![Line([0; 64]); n * 2 / 64], vec![Line([0; 64]); n * 2 / 64]];
            let (mut wide_sum, mut lane_sum) = (S::splat(0.0), S::splat(0.0));
            for i in (0..n).step_by(w) {
                // SAFETY: `n` is a multiple of 32 ≥ `w`; every access is inside the vectors, and
                // the streamed ones are 64-byte aligned, so each `w`-element chunk is aligned to
                // its size.
                unsafe {
                    let v = S::Wide::load(self.0.as_ptr().add(i));
                    v.store_bf16(b.as_mut_ptr().add(i));
                    v.store_f16(h.as_mut_ptr().add(i));
                    v.stream(streamed[0].as_mut_ptr().cast::<f32>().add(i));
                    v.stream_bf16(streamed[1].as_mut_ptr().cast::<bf16>().add(i));
                    v.stream_f16(streamed[2].as_mut_ptr().cast::<f16>().add(i));
                    S::Wide::load_bf16(b.as_ptr().add(i)).store(back.as_mut_ptr().add(i));
                    let f = S::Wide::load_f16(h.as_ptr().add(i));
                    wide_sum = S::mul_add_wide(S::Wide::load_bf16(b.as_ptr().add(i)), f, wide_sum);
                }
            }
            for i in (0..n).step_by(LANES) {
                lane_sum = S::load_bf16(&b[i..]).mul_add(S::load_f16(&h[i..]), lane_sum);
            }
            let mut sums = [[0.0f32; LANES]; 2];
            wide_sum.store(&mut sums[0]);
            lane_sum.store(&mut sums[1]);
            S::store_fence();
            let [f, sb, sh] = streamed;
            (b, h, back, sums, (f, sb, sh))
        }
    }

    #[test]
    fn wide_lanes_round_widen_and_sum_as_the_eight_lane_ones() {
        let ramp: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) * 0.37).collect();
        let xs = rounding_inputs(0x9e37_79b9_7f4a_7c15, &ramp, 32);
        for &level in supported_levels().iter() {
            let (b, h, back, [wide_sum, lane_sum], (sf, sb, sh)) = dispatch_at(level, WideRounds(xs.clone()));
            let bits = |lines: &[Line], size: usize, i: usize| {
                let at = &lines[i * size / 64].0[i * size % 64..][..size];
                at.iter().rev().fold(0u32, |acc, &byte| acc << 8 | u32::from(byte))
            };
            for (i, &v) in xs.iter().enumerate() {
                assert_eq!(b[i].to_bits(), bf16::from_f32(v).to_bits(), "{level:?}: bf16 of {v:e}");
                assert_eq!(h[i].to_bits(), f16::from_f32(v).to_bits(), "{level:?}: f16 of {v:e}");
                assert_eq!(back[i].to_bits(), b[i].to_f32().to_bits(), "{level:?}: bf16 widened");
                assert_eq!(bits(&sf, 4, i), v.to_bits(), "{level:?}: f32 streamed");
                assert_eq!(bits(&sb, 2, i), u32::from(b[i].to_bits()), "{level:?}: bf16 streamed");
                assert_eq!(bits(&sh, 2, i), u32::from(h[i].to_bits()), "{level:?}: f16 streamed");
            }
            for (w, l) in wide_sum.iter().zip(lane_sum) {
                assert!(w.to_bits() == l.to_bits() || (w.is_nan() && l.is_nan()), "{level:?}: {w} against {l}");
            }
        }
    }

    /// [`WideLanes`]'s `exp`, `silu` and bf16/f16 rounding against [`Simd`]'s of the same level,
    /// bit for bit: per operation, the wide result and the eight-lane one.
    struct WideOps(Vec<f32>);
    impl SimdKernel for WideOps {
        type Output = [(Vec<f32>, Vec<f32>); 4];
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let n = self.0.len();
            let mut out: [(Vec<f32>, Vec<f32>); 4] = Default::default();
            for (w, l) in out.iter_mut() {
                (*w, *l) = (vec![0.0f32; n], vec![0.0f32; n]);
            }
            for i in (0..n).step_by(S::Wide::WIDTH) {
                // SAFETY: `n` is a multiple of 16 ≥ `WIDTH`; every access is inside the vectors.
                unsafe {
                    let v = S::Wide::load(self.0.as_ptr().add(i));
                    let [b] = S::Wide::round_bf16_each([v]);
                    let [h] = S::Wide::round_f16_each([v]);
                    for (k, r) in [v.exp(), v.silu(), b, h].into_iter().enumerate() {
                        r.store(out[k].0.as_mut_ptr().add(i));
                    }
                }
            }
            for i in (0..n).step_by(LANES) {
                let v = S::load(&self.0[i..]);
                let [b] = S::round_bf16_each([v]);
                for (k, r) in [v.exp(), v.silu(), b, v.round_f16()].into_iter().enumerate() {
                    r.store(&mut out[k].1[i..]);
                }
            }
            out
        }
    }

    #[test]
    fn wide_ops_are_the_eight_lane_ops() {
        let ramp: Vec<f32> = (0..4096).map(|i| -110.0 + i as f32 * 0.0517).collect();
        let xs = rounding_inputs(0x51f1_5eed_0dd5_eed5, &ramp, 16);
        for &level in supported_levels().iter() {
            let got = dispatch_at(level, WideOps(xs.clone()));
            for ((wide, lanes), op) in got.iter().zip(["exp", "silu", "bf16", "f16"]) {
                for (i, (w, l)) in wide.iter().zip(lanes).enumerate() {
                    assert_eq!(w.to_bits(), l.to_bits(), "{level:?}: {op}({:e}) {w:e} against {l:e}", xs[i]);
                }
            }
        }
    }

    /// `reduce_add_rows` against eight `reduce_add` calls, bit for bit (random magnitudes and
    /// signs, so that the order of the additions shows in the last bits).
    struct RowSums(Vec<f32>);
    impl SimdKernel for RowSums {
        type Output = Vec<(f32, f32)>;
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let mut got = Vec::new();
            for block in self.0.chunks_exact(64) {
                let v: [S; LANES] = std::array::from_fn(|r| S::load(&block[r * LANES..]));
                let mut rows = [0.0f32; LANES];
                S::reduce_add_rows(v).store(&mut rows);
                got.extend(rows.iter().zip(v).map(|(&g, vr)| (g, vr.reduce_add())));
            }
            got
        }
    }

    #[test]
    fn row_sums_match_reduce_add() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let xs: Vec<f32> = (0..64 * 64)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((x % 13) as i32 - 6)
            })
            .collect();
        for got in supported_levels().iter().map(|&l| dispatch_at(l, RowSums(xs.clone()))) {
            for (i, (g, want)) in got.into_iter().enumerate() {
                assert_eq!(g.to_bits(), want.to_bits(), "row {i}: {g} against {want}");
            }
        }
    }

    /// The AVX-512 lanes give the AVX2 lanes' results bit for bit (`exp` scaled by `vscalefps`,
    /// bf16 rounded by `vcvtneps2bf16` or, with a subnormal lane, by the integer sequence),
    /// over the whole range of `exp`, subnormals and NaN; checked where the CPU has both.
    #[test]
    fn avx512_lanes_match_avx2_bit_for_bit() {
        if !supported_levels().contains(&SimdLevel::Avx512) {
            eprintln!("skipping avx512_lanes_match_avx2_bit_for_bit: this CPU has no AVX-512 BF16");
            return;
        }
        let mut xs: Vec<f32> = (0..8192).map(|i| (i as f32 - 4096.0) * 0.0257 + 0.0031).collect();
        xs.extend([-103.5, -87.4, -1e-41, 1e-40, 2e-39, 88.7, 89.0, f32::NAN, f32::INFINITY, -f32::INFINITY]);
        while !xs.len().is_multiple_of(8) {
            xs.push(0.25);
        }
        let (e2, b2, _, s2) = dispatch_at(SimdLevel::Avx2, RoundTrip(xs.clone()));
        let (e5, b5, _, s5) = dispatch_at(SimdLevel::Avx512, RoundTrip(xs.clone()));
        for (i, &x) in xs.iter().enumerate() {
            assert_eq!(e2[i].to_bits(), e5[i].to_bits(), "exp({x:e})");
            assert_eq!(b2[i].to_bits(), b5[i].to_bits(), "bf16 of {x:e}");
        }
        assert_eq!(s2.to_bits(), s5.to_bits(), "sum");
    }

    struct ZeroBelow(Vec<f32>, Vec<f32>);
    impl SimdKernel for ZeroBelow {
        type Output = Vec<f32>;
        #[inline(always)]
        fn run<S: Simd + PowTwo>(self) -> Self::Output {
            let mut out = vec![0.0; self.0.len()];
            for i in (0..self.0.len()).step_by(LANES) {
                S::load(&self.0[i..]).zero_where_lt(S::load(&self.1[i..]), S::splat(-1.0)).store(&mut out[i..]);
            }
            out
        }
    }

    /// `zero_where_lt` on every path: zero where `x < t`, the value kept where `x ≥ t` and
    /// where `x` is NaN.
    #[test]
    fn zero_where_lt_keeps_nan_and_ties() {
        let v: Vec<f32> = (0..16).map(|i| i as f32 + 0.5).collect();
        let x = [-2.0, -1.0, -0.5, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -1.000_001, 0.0];
        let x: Vec<f32> = x.iter().chain(x.iter().rev()).copied().collect();
        for &level in supported_levels() {
            let got = dispatch_at(level, ZeroBelow(v.clone(), x.clone()));
            for i in 0..16 {
                let want = if x[i] < -1.0 { 0.0 } else { v[i] };
                assert_eq!(got[i].to_bits(), want.to_bits(), "{level:?} lane {i}: x {}", x[i]);
            }
        }
    }

    #[test]
    fn every_path_agrees_with_scalar() {
        for &level in supported_levels() {
            check_level(level);
        }
        // The portable path, whatever this CPU supports.
        let xs: Vec<f32> = (0..64).map(|i| i as f32 * 0.37 - 11.0).collect();
        let (e, ..) = RoundTrip(xs.clone()).run::<Portable>();
        for (x, g) in xs.iter().zip(e) {
            let want = (*x as f64).exp();
            assert!(((g as f64 - want) / want).abs() < 3e-7);
        }
    }
}
