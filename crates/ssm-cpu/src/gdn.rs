//! Gated delta rule on the CPU (semantics/gdn_conv.md §1–§2): gating, the recurrent and
//! speculative decode, and the chunked prefill.
//!
//! Recurrent ops: one rayon item per (sequence, value head). The recurrence is independent
//! per value row `v` of `S` (`S[v,:]` only needs `v[v]`, `k`, `q`, `g`, `β`), so an item walks
//! `V` in blocks whose f32 rows fit a 64 KiB stack tile, and runs every token of the sequence on
//! that block before moving on: each state element is read once and written once per stored
//! token, one streaming pass over the state (read, update in f32, write in place). Lanes run
//! over K for the `[.., V, K]` layout (two reductions per row and token) and over V for the
//! `[.., K, V]` layout (no reductions).
//!
//! Chunked prefill: per (sequence, value head), chunks of 64 tokens in the WY/UT form (§2.5):
//! in-chunk cumsum `G`, `A = strictly_lower(β_i k_i·k_j e^{G_i−G_j})`, `U = (I+A)⁻¹ βV` and
//! `W = (I+A)⁻¹ (β e^G K)` by forward substitution, `V' = U − W H`, outputs
//! `e^{G_i} q_i H + Σ_{j≤i} (q_i·k_j) e^{G_i−G_j} V'_j`, and `H ← e^{G_last} H + Σ_i e^{G_last−G_i} k_i V'_iᵀ`
//! with the state held K-major (`H[k][v] = S[v][k]`) in f32 for the whole sequence. Everything is
//! f32 (vLLM keeps bf16 intermediates), so the result is closer to the f64 recurrence than the peer.
//! Scratch is caller-owned (one slice per worker thread; see `chunk_gated_delta_rule_scratch_size`).

use std::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};
use ssm_gdn::plan::{ChunkPlan, ChunkStart, Gates, GatingPlan, RecurrentPlan, SeqSpan, StartState, StateView};
use ssm_gdn::{
    CHUNK_SIZE, ChunkGatedDeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout,
};
use ssm_tensor::{DType, Planned, Run, TensorRef};

use crate::simd::{LANES, PowTwo, Real, Simd, SimdKernel, dispatch};
use crate::{CpuBackend, CpuError, require_host};

/// f32 elements of the per-item state tile of the recurrent kernels (64 KiB on the stack).
const TILE: usize = 16 * 1024;
/// Most value rows (or columns) in one tile.
const MAX_BLOCK: usize = 2048;

/// A raw pointer that may cross threads.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);
// SAFETY: work items write through it only the elements they own: disjoint (sequence, value
// head) output rows, and state slots that the plan proved no two sequences share when one of
// them writes it (`GdnError::SlotConflict`); per-worker scratch regions are disjoint.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so that closures capture the `Sync` wrapper, not the raw field).
    #[inline(always)]
    fn get(self) -> *mut T {
        self.0
    }
}

#[inline(always)]
fn round8(n: usize) -> usize {
    n.div_ceil(LANES) * LANES
}

#[inline(always)]
fn rd(bytes: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes(bytes[i * 2..i * 2 + 2].try_into().unwrap())).to_f32(),
        DType::F16 => f16::from_bits(u16::from_le_bytes(bytes[i * 2..i * 2 + 2].try_into().unwrap())).to_f32(),
        _ => unreachable!("the plan admits float inputs only"),
    }
}

/// `out[j] = x[off + j·stride]` for `j < out.len()`, widened to f32.
#[inline(always)]
fn gather(bytes: &[u8], dtype: DType, off: usize, stride: isize, out: &mut [f32]) {
    let at = |j: usize| (off as isize + j as isize * stride) as usize;
    match dtype {
        DType::F32 => {
            let s: &[f32] = bytemuck::cast_slice(bytes);
            if stride == 1 {
                out.copy_from_slice(&s[off..off + out.len()]);
            } else {
                out.iter_mut().enumerate().for_each(|(j, o)| *o = s[at(j)]);
            }
        }
        DType::BF16 => {
            let s: &[bf16] = bytemuck::cast_slice(bytes);
            out.iter_mut().enumerate().for_each(|(j, o)| *o = s[at(j)].to_f32());
        }
        DType::F16 => {
            let s: &[f16] = bytemuck::cast_slice(bytes);
            out.iter_mut().enumerate().for_each(|(j, o)| *o = s[at(j)].to_f32());
        }
        _ => unreachable!("the plan admits float inputs only"),
    }
}

/// Writes `vals[j]` (rounded to nearest even) to element `off + j·stride` of a `dtype` buffer.
///
/// # Safety
/// Those elements must lie in the buffer behind `base` and be written by no other thread now.
#[inline(always)]
unsafe fn scatter(base: *mut u8, dtype: DType, off: usize, stride: isize, vals: &[f32]) {
    let at = |j: usize| (off as isize + j as isize * stride) as usize;
    // SAFETY: in bounds and exclusive by the caller's contract; the buffer is aligned for `dtype`
    // (checked when the view was built) and offsets are whole elements.
    unsafe {
        match dtype {
            DType::F32 => vals.iter().enumerate().for_each(|(j, &v)| *base.cast::<f32>().add(at(j)) = v),
            DType::BF16 => {
                vals.iter().enumerate().for_each(|(j, &v)| *base.cast::<bf16>().add(at(j)) = bf16::from_f32(v))
            }
            DType::F16 => vals.iter().enumerate().for_each(|(j, &v)| *base.cast::<f16>().add(at(j)) = f16::from_f32(v)),
            _ => unreachable!("the plan admits float outputs only"),
        }
    }
}

/// [`gather`] with lanes: a unit-stride run converts 8 elements at a time.
#[inline(always)]
fn gather_v<S: Simd>(bytes: &[u8], dtype: DType, off: usize, stride: isize, out: &mut [f32]) {
    #[inline(always)]
    fn run<S: Simd, R: Real + bytemuck::Pod>(bytes: &[u8], off: usize, out: &mut [f32]) {
        let s: &[R] = bytemuck::cast_slice(bytes);
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
    match (dtype, stride) {
        (DType::F32, 1) => run::<S, f32>(bytes, off, out),
        (DType::BF16, 1) => run::<S, bf16>(bytes, off, out),
        (DType::F16, 1) => run::<S, f16>(bytes, off, out),
        _ => gather(bytes, dtype, off, stride, out),
    }
}

/// [`scatter`] with lanes: a unit-stride run rounds and stores 8 elements at a time.
///
/// # Safety
/// As [`scatter`].
#[inline(always)]
unsafe fn scatter_v<S: Simd>(base: *mut u8, dtype: DType, off: usize, stride: isize, vals: &[f32]) {
    /// # Safety
    /// `vals.len()` elements of `R` from element `off` of `base` are in bounds and exclusive.
    #[inline(always)]
    unsafe fn run<S: Simd, R: Real>(base: *mut u8, off: usize, vals: &[f32]) {
        // SAFETY: caller's contract; the buffer is aligned for `R` (checked when the view was built).
        let dst = unsafe { std::slice::from_raw_parts_mut(base.cast::<R>().add(off), vals.len()) };
        let full = vals.len() / LANES * LANES;
        let mut c = 0;
        while c < full {
            R::store::<S>(S::load(&vals[c..]), &mut dst[c..]);
            c += LANES;
        }
        for (d, v) in dst[full..].iter_mut().zip(&vals[full..]) {
            *d = R::from_f32(*v);
        }
    }
    // SAFETY: every arm forwards the caller's contract (in bounds, exclusive, aligned).
    unsafe {
        match (dtype, stride) {
            (DType::F32, 1) => run::<S, f32>(base, off, vals),
            (DType::BF16, 1) => run::<S, bf16>(base, off, vals),
            (DType::F16, 1) => run::<S, f16>(base, off, vals),
            _ => scatter(base, dtype, off, stride, vals),
        }
    }
}

/// Loads `rows × cols` elements (memory row pitch `ld`, from element `off`) into `tile` rows of
/// pitch `tp >= round8(cols)`, widened to f32 and zero-padded.
///
/// # Safety
/// The elements must lie in the buffer behind `base` and be written by no other thread now.
#[inline(always)]
unsafe fn load_tile<S: Simd, R: Real>(
    base: *const u8,
    off: usize,
    ld: usize,
    rows: usize,
    cols: usize,
    tile: &mut [f32],
    tp: usize,
) {
    let full = cols / LANES * LANES;
    for r in 0..rows {
        // SAFETY: row `r` spans `cols` elements inside the buffer, read-only here (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(base.cast::<R>().add(off + r * ld), cols) };
        let dst = &mut tile[r * tp..(r + 1) * tp];
        let mut c = 0;
        while c < full {
            R::load::<S>(&src[c..]).store(&mut dst[c..]);
            c += LANES;
        }
        for c in full..cols {
            dst[c] = src[c].to_f32();
        }
        dst[cols..].iter_mut().for_each(|x| *x = 0.0);
    }
}

/// Stores `rows × cols` tile elements back (rounding to nearest even); the inverse of [`load_tile`].
///
/// # Safety
/// The elements must lie in the buffer behind `base` and be accessed by no other thread now.
#[inline(always)]
unsafe fn store_tile<S: Simd, R: Real>(
    base: *mut u8,
    off: usize,
    ld: usize,
    rows: usize,
    cols: usize,
    tile: &[f32],
    tp: usize,
    stream: bool,
) {
    let full = cols / LANES * LANES;
    let lane_bytes = LANES * std::mem::size_of::<R>();
    let mut streamed = false;
    for r in 0..rows {
        let row = base.cast::<R>().wrapping_add(off + r * ld);
        let src = &tile[r * tp..(r + 1) * tp];
        let mut c = 0;
        // A write-only destination: streaming stores (no read for ownership) where aligned.
        if stream && (row as usize).is_multiple_of(lane_bytes) {
            while c < full {
                // SAFETY: `c + 8 ≤ cols`, inside row `r` (caller's contract), aligned (checked:
                // the row start is, and `c` is a multiple of 8 elements).
                unsafe { R::stream::<S>(S::load(&src[c..]), row.add(c)) };
                c += LANES;
            }
            streamed = true;
        }
        // SAFETY: row `r` spans `cols` elements inside the buffer, owned by this item (caller's contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(row, cols) };
        while c < full {
            R::store(S::load(&src[c..]), &mut dst[c..]);
            c += LANES;
        }
        for c in full..cols {
            dst[c] = R::from_f32(src[c]);
        }
    }
    if streamed {
        S::store_fence();
    }
}

/// [`load_tile`] with the element type chosen at run time.
///
/// # Safety
/// As [`load_tile`].
#[inline(always)]
unsafe fn load_tile_dyn<S: Simd>(
    dtype: DType,
    base: *const u8,
    off: usize,
    ld: usize,
    rows: usize,
    cols: usize,
    tile: &mut [f32],
    tp: usize,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match dtype {
            DType::F32 => load_tile::<S, f32>(base, off, ld, rows, cols, tile, tp),
            DType::BF16 => load_tile::<S, bf16>(base, off, ld, rows, cols, tile, tp),
            DType::F16 => load_tile::<S, f16>(base, off, ld, rows, cols, tile, tp),
            _ => unreachable!("the plan admits f32/bf16/f16 states only"),
        }
    }
}

/// [`store_tile`] with the element type chosen at run time.
///
/// # Safety
/// As [`store_tile`].
#[inline(always)]
unsafe fn store_tile_dyn<S: Simd>(
    dtype: DType,
    base: *mut u8,
    off: usize,
    ld: usize,
    rows: usize,
    cols: usize,
    tile: &[f32],
    tp: usize,
    stream: bool,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match dtype {
            DType::F32 => store_tile::<S, f32>(base, off, ld, rows, cols, tile, tp, stream),
            DType::BF16 => store_tile::<S, bf16>(base, off, ld, rows, cols, tile, tp, stream),
            DType::F16 => store_tile::<S, f16>(base, off, ld, rows, cols, tile, tp, stream),
            _ => unreachable!("the plan admits f32/bf16/f16 states only"),
        }
    }
}

#[inline(always)]
fn dot<S: Simd>(a: &[f32], b: &[f32], n: usize) -> f32 {
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

/// `y += alpha·x` over `n` (a multiple of 8) elements.
#[inline(always)]
fn axpy<S: Simd>(y: &mut [f32], x: &[f32], alpha: f32, n: usize) {
    let a = S::splat(alpha);
    let mut c = 0;
    while c < n {
        S::load(&x[c..]).mul_add(a, S::load(&y[c..])).store(&mut y[c..]);
        c += LANES;
    }
}

/// `x *= alpha` over `n` (a multiple of 8) elements.
#[inline(always)]
fn scal<S: Simd>(x: &mut [f32], alpha: f32, n: usize) {
    let a = S::splat(alpha);
    let mut c = 0;
    while c < n {
        S::load(&x[c..]).mul(a).store(&mut x[c..]);
        c += LANES;
    }
}

/// L2-normalises (`x·rsqrt(Σx² + eps)`) the first `n` elements when `l2`, then scales them.
#[inline(always)]
fn normalize<S: Simd>(x: &mut [f32], n: usize, l2: bool, eps: f32, scale: f32) {
    let np = round8(n);
    x[n..np].iter_mut().for_each(|e| *e = 0.0);
    let mut f = scale;
    if l2 {
        let ss = dot::<S>(x, x, np);
        f *= 1.0 / (ss + eps).sqrt();
    }
    if f != 1.0 {
        scal::<S>(x, f, np);
    }
}

// ---------------------------------------------------------------------------------------------
// gating

#[inline(always)]
fn softplus(x: f32, beta: f32, threshold: f32) -> f32 {
    let bx = beta * x;
    if bx <= threshold { (1.0 / beta) * (1.0 + bx.exp()).ln() } else { x }
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn gating(plan: &GatingPlan, args: &mut FusedGdnGatingArgs<'_>) {
    let p = plan;
    let (a_log, a, b, dt) = (
        args.a_log.host_bytes().expect("host checked"),
        args.a.host_bytes().expect("host checked"),
        args.b.host_bytes().expect("host checked"),
        args.dt_bias.host_bytes().expect("host checked"),
    );
    let (ad, bd, dd, ld) = (args.a.dtype(), args.b.dtype(), args.dt_bias.dtype(), args.a_log.dtype());
    let bo_dtype = args.beta_output.dtype();
    let g_ptr = args.g.host_bytes_mut().expect("host checked").as_mut_ptr();
    let bo_ptr = args.beta_output.host_bytes_mut().expect("host checked").as_mut_ptr();
    for h in 0..p.v_heads {
        let decay_rate = -rd(a_log, ld, p.a_log.at([h])).exp();
        let bias = rd(dt, dd, p.dt_bias.at([h]));
        for t in 0..p.tokens {
            let x = rd(a, ad, p.a.at([t, h])) + bias;
            let g = decay_rate * softplus(x, p.softplus_beta, p.threshold);
            let beta = sigmoid(rd(b, bd, p.b.at([t, h])));
            // SAFETY: element (t, h) of `g` / `beta_output` is in bounds (plan) and written once,
            // on this thread only.
            unsafe {
                scatter(g_ptr, DType::F32, p.g.at([t, h]), 1, &[g]);
                scatter(bo_ptr, bo_dtype, p.beta_output.at([t, h]), 1, &[beta]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// recurrent ops

enum GateBytes<'a> {
    Given { g: &'a [u8], beta: Option<&'a [u8]> },
    Sigmoid { a_log: &'a [u8], dt_bias: &'a [u8], a: &'a [u8], b: &'a [u8] },
}

struct RecCtx<'a> {
    plan: &'a RecurrentPlan,
    q: &'a [u8],
    k: &'a [u8],
    v: &'a [u8],
    gates: GateBytes<'a>,
    cu: Option<TensorRef<'a>>,
    ix: Option<TensorRef<'a>>,
    na: Option<TensorRef<'a>>,
    state: Option<SyncPtr<u8>>,
    final_state: Option<SyncPtr<u8>>,
    o: SyncPtr<u8>,
}

struct RecItem<'c, 'a> {
    ctx: &'c RecCtx<'a>,
    item: usize,
}

impl SimdKernel for RecItem<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        recurrent_item::<S>(self.ctx, self.item)
    }
}

/// Per-token gate values `(g, β)` of value head `hv`; `β` is written to `beta[..n]` for the
/// value rows `v0..v0+n` (head-wise β varies along V).
#[inline(always)]
fn token_gates(ctx: &RecCtx<'_>, b: usize, t: usize, hv: usize, v0: usize, beta: &mut [f32]) -> f32 {
    match (&ctx.gates, &ctx.plan.gates) {
        (GateBytes::Given { g, beta: bb }, Gates::Given { g: gs, g_dtype, beta: bs }) => {
            let gv = rd(g, *g_dtype, gs.at([b, t, hv]));
            match (bb, bs) {
                (Some(bytes), Some((st, dt))) => gather(bytes, *dt, st.at([b, t, hv, v0]), st.strides[3], beta),
                _ => beta.iter_mut().for_each(|x| *x = 1.0),
            }
            gv
        }
        (
            GateBytes::Sigmoid { a_log, dt_bias, a, b: bb },
            Gates::Sigmoid { a_log: al, dt_bias: db, a: aa, b: bs, softplus_beta, threshold },
        ) => {
            let x = rd(a, aa.1, aa.0.at([b, t, hv])) + rd(dt_bias, db.1, db.0.at([hv]));
            let g = -rd(a_log, al.1, al.0.at([hv])).exp() * softplus(x, *softplus_beta, *threshold);
            let be = sigmoid(rd(bb, bs.1, bs.0.at([b, t, hv])));
            beta.iter_mut().for_each(|x| *x = be);
            g
        }
        _ => unreachable!("gate sources match the plan"),
    }
}

/// One token on a `[nv][kp]` tile of V-major rows: `S *= e^g; u = β(v − S k); S += u kᵀ; o = S q`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_vk<S: Simd>(
    tile: &mut [f32],
    nv: usize,
    kp: usize,
    q: &[f32],
    k: &[f32],
    decay: f32,
    v: &[f32],
    beta: &[f32],
    out: &mut [f32],
) {
    let dv = S::splat(decay);
    for r in 0..nv {
        let row = &mut tile[r * kp..(r + 1) * kp];
        let pred = dot::<S>(row, k, kp) * decay;
        let u = S::splat((v[r] - pred) * beta[r]);
        let (mut o0, mut o1) = (S::splat(0.0), S::splat(0.0));
        let mut c = 0;
        while c + 2 * LANES <= kp {
            let x0 = S::load(&row[c..]).mul_add(dv, u.mul(S::load(&k[c..])));
            let x1 = S::load(&row[c + LANES..]).mul_add(dv, u.mul(S::load(&k[c + LANES..])));
            x0.store(&mut row[c..]);
            x1.store(&mut row[c + LANES..]);
            o0 = x0.mul_add(S::load(&q[c..]), o0);
            o1 = x1.mul_add(S::load(&q[c + LANES..]), o1);
            c += 2 * LANES;
        }
        if c < kp {
            let x0 = S::load(&row[c..]).mul_add(dv, u.mul(S::load(&k[c..])));
            x0.store(&mut row[c..]);
            o0 = x0.mul_add(S::load(&q[c..]), o0);
        }
        out[r] = o0.add(o1).reduce_add();
    }
}

/// One token on `G` lane groups (columns `c..c+8G`) of a `[kd][cp]` K-major tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_kv_group<S: Simd, const G: usize>(
    tile: &mut [f32],
    kd: usize,
    cp: usize,
    c: usize,
    q: &[f32],
    k: &[f32],
    dv: S,
    v: &[f32],
    beta: &[f32],
    out: &mut [f32],
) {
    let mut acc = [S::splat(0.0); G];
    for ki in 0..kd {
        let kk = S::splat(k[ki]);
        let row = &tile[ki * cp + c..ki * cp + c + G * LANES];
        for j in 0..G {
            acc[j] = S::load(&row[j * LANES..]).mul_add(kk, acc[j]);
        }
    }
    let mut u = [S::splat(0.0); G];
    for j in 0..G {
        let at = c + j * LANES;
        u[j] = S::load(&v[at..]).sub(acc[j].mul(dv)).mul(S::load(&beta[at..]));
    }
    let mut o = [S::splat(0.0); G];
    for ki in 0..kd {
        let kk = S::splat(k[ki]);
        let qq = S::splat(q[ki]);
        let row = &mut tile[ki * cp + c..ki * cp + c + G * LANES];
        for j in 0..G {
            let x = S::load(&row[j * LANES..]).mul_add(dv, u[j].mul(kk));
            x.store(&mut row[j * LANES..]);
            o[j] = x.mul_add(qq, o[j]);
        }
    }
    for j in 0..G {
        o[j].store(&mut out[c + j * LANES..]);
    }
}

/// One token on a `[kd][cp]` tile of K-major rows (columns = value rows of `S`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_kv<S: Simd>(
    tile: &mut [f32],
    kd: usize,
    cp: usize,
    q: &[f32],
    k: &[f32],
    decay: f32,
    v: &[f32],
    beta: &[f32],
    out: &mut [f32],
) {
    let dv = S::splat(decay);
    let mut c = 0;
    while c + 4 * LANES <= cp {
        step_kv_group::<S, 4>(tile, kd, cp, c, q, k, dv, v, beta, out);
        c += 4 * LANES;
    }
    while c < cp {
        step_kv_group::<S, 1>(tile, kd, cp, c, q, k, dv, v, beta, out);
        c += LANES;
    }
}

thread_local! {
    /// Per-thread f32 buffers of the recurrent kernels (grown once, then reused).
    static REC_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes this thread's recurrent scratch, grown to at least `n` elements (contents unspecified);
/// hand it back with [`give_rec_scratch`]. A plain take/give (no closure around the kernel body)
/// keeps the body inside the caller's `#[target_feature]` function.
#[inline(always)]
fn take_rec_scratch(n: usize) -> Vec<f32> {
    let mut buf = REC_SCRATCH.with(|cell| cell.take());
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    buf
}

/// Returns the scratch taken by [`take_rec_scratch`].
#[inline(always)]
fn give_rec_scratch(buf: Vec<f32>) {
    REC_SCRATCH.with(|cell| cell.replace(buf));
}

/// Loads 8 elements at `p` as f32 lanes.
///
/// # Safety
/// `p` must be valid for reading 8 elements.
#[inline(always)]
unsafe fn ld<S: Simd, R: Real>(p: *const R) -> S {
    // SAFETY: 8 readable elements at `p` (caller's contract).
    R::load::<S>(unsafe { std::slice::from_raw_parts(p, LANES) })
}

/// Stores 8 lanes at `p` (rounded to `R`).
///
/// # Safety
/// `p` must be valid for writing 8 elements, and no reference to them may be live.
#[inline(always)]
unsafe fn st<S: Simd, R: Real>(v: S, p: *mut R) {
    // SAFETY: 8 writable elements at `p`, not otherwise borrowed (caller's contract).
    R::store::<S>(v, unsafe { std::slice::from_raw_parts_mut(p, LANES) })
}

/// `Σ row[c]·x[c]` over `n` elements of a stored row, widened to f32 (`x` padded to `round8(n)`).
/// Four independent accumulators keep the FMA latency chain off the critical path.
///
/// # Safety
/// `row` must be valid for reading `n` elements.
#[inline(always)]
unsafe fn dot_row<S: Simd, R: Real>(row: *const R, x: &[f32], n: usize) -> f32 {
    let full = n / LANES * LANES;
    let xs = &x[..full];
    let (mut a0, mut a1, mut a2, mut a3) = (S::splat(0.0), S::splat(0.0), S::splat(0.0), S::splat(0.0));
    let mut c = 0;
    while c + 4 * LANES <= full {
        // SAFETY: `c + 32 ≤ full ≤ n`, inside the row (caller's contract).
        unsafe {
            a0 = ld::<S, R>(row.add(c)).mul_add(S::load(&xs[c..]), a0);
            a1 = ld::<S, R>(row.add(c + LANES)).mul_add(S::load(&xs[c + LANES..]), a1);
            a2 = ld::<S, R>(row.add(c + 2 * LANES)).mul_add(S::load(&xs[c + 2 * LANES..]), a2);
            a3 = ld::<S, R>(row.add(c + 3 * LANES)).mul_add(S::load(&xs[c + 3 * LANES..]), a3);
        }
        c += 4 * LANES;
    }
    while c < full {
        // SAFETY: `c + 8 ≤ full ≤ n`, inside the row.
        a0 = unsafe { ld::<S, R>(row.add(c)) }.mul_add(S::load(&xs[c..]), a0);
        c += LANES;
    }
    let mut s = a0.add(a1).add(a2.add(a3)).reduce_add();
    for (c, xc) in x.iter().enumerate().take(n).skip(full) {
        // SAFETY: `c < n`, inside the row.
        s += unsafe { *row.add(c) }.to_f32() * xc;
    }
    s
}

/// Where the direct decode path writes its updated rows.
#[derive(Clone, Copy)]
enum Dst {
    /// Nowhere (a null write slot).
    None,
    /// Back over the rows it read.
    InPlace,
    /// Another head block: base pointer and element offset.
    Other(SyncPtr<u8>, usize),
}

/// Pass 2 of the direct decode on one row: `x = src·e^g + u·k`, stored to `dst` (unless null),
/// returns `Σ x·q`. `dst` may equal `src` (in place). Unrolled by two with named accumulators:
/// an indexed accumulator array spills to the stack and chains every FMA through a
/// store-to-load forward.
///
/// # Safety
/// `src` must be valid for reading `kd` elements; `dst` null or valid for writing `kd` elements
/// (it may be `src` itself, and must not overlap it otherwise); no reference to either is live.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn row_update<S: Simd, R: Real>(
    src: *const R,
    dst: *mut R,
    kd: usize,
    k: &[f32],
    q: &[f32],
    decay: f32,
    ur: f32,
) -> f32 {
    let full = kd / LANES * LANES;
    let (ks, qs) = (&k[..full], &q[..full]);
    let (dv, u) = (S::splat(decay), S::splat(ur));
    let write = !dst.is_null();
    let (mut o0, mut o1) = (S::splat(0.0), S::splat(0.0));
    let mut c = 0;
    while c + 2 * LANES <= full {
        // SAFETY: `c + 16 ≤ full ≤ kd`, inside both rows (caller's contract); each element is
        // read before it is written.
        unsafe {
            let x0 = ld::<S, R>(src.add(c)).mul_add(dv, u.mul(S::load(&ks[c..])));
            let x1 = ld::<S, R>(src.add(c + LANES)).mul_add(dv, u.mul(S::load(&ks[c + LANES..])));
            if write {
                st::<S, R>(x0, dst.add(c));
                st::<S, R>(x1, dst.add(c + LANES));
            }
            o0 = x0.mul_add(S::load(&qs[c..]), o0);
            o1 = x1.mul_add(S::load(&qs[c + LANES..]), o1);
        }
        c += 2 * LANES;
    }
    if c < full {
        // SAFETY: `c + 8 ≤ full ≤ kd`, inside both rows.
        unsafe {
            let x0 = ld::<S, R>(src.add(c)).mul_add(dv, u.mul(S::load(&ks[c..])));
            if write {
                st::<S, R>(x0, dst.add(c));
            }
            o0 = x0.mul_add(S::load(&qs[c..]), o0);
        }
    }
    let mut tail = 0.0f32;
    for c in full..kd {
        // SAFETY: `c < kd`, inside the source row.
        let x = unsafe { *src.add(c) }.to_f32() * decay + ur * k[c];
        if write {
            // SAFETY: `c < kd`, inside the destination row.
            unsafe { *dst.add(c) = R::from_f32(x) };
        }
        tail += x * q[c];
    }
    o0.add(o1).reduce_add() + tail
}

/// Blocks of four rows of a V-major head (`kd` a multiple of 8, `4·nblk` rows), software
/// pipelined: the loop that updates block `b` (`x = e^g·S + u kᵀ`, stored, `o += x·q`) also
/// accumulates the dot products `S·k` of block `b + 1`, so the dot → `u` dependency of one block
/// overlaps the streaming of the previous one instead of stalling the core. Rows are prefetched
/// `AHEAD` rows ahead (4, the block after the one being dotted: 2, 6, 8, 12 and 16 measured
/// 4–20 % slower, interleaved runs at batch 128).
///
/// # Safety
/// Rows `src + r·kd` (and `dst + r·kd` unless `dst` is null) for `r < 4·nblk` must be valid for
/// `kd` elements and accessed by no other thread; `dst` may equal `src` and must not overlap it
/// otherwise; `k`, `q` hold `kd`, `v`, `beta`, `out` hold `4·nblk` elements.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn vk_blocks4<S: Simd, R: Real>(
    src: *const R,
    dst: *mut R,
    kd: usize,
    nblk: usize,
    q: &[f32],
    k: &[f32],
    decay: f32,
    v: &[f32],
    beta: &[f32],
    out: &mut [f32],
) {
    const AHEAD: usize = 4;
    let rows = 4 * nblk;
    let (kp, qp) = (k[..kd].as_ptr(), q[..kd].as_ptr());
    let row_bytes = kd * std::mem::size_of::<R>();
    let dv = S::splat(decay);
    let write = !dst.is_null();
    // The dot products of block 0.
    let mut a = [S::splat(0.0); 4];
    let mut c = 0;
    while c < kd {
        // SAFETY: `c + 8 ≤ kd`: inside rows 0..4 and `k` (caller's contract).
        unsafe {
            let kk = ld::<S, f32>(kp.add(c));
            for (j, aj) in a.iter_mut().enumerate() {
                *aj = ld::<S, R>(src.add(j * kd + c)).mul_add(kk, *aj);
            }
        }
        c += LANES;
    }
    for b in 0..nblk {
        let r = 4 * b;
        for ahead in r + AHEAD..(r + AHEAD + 4).min(rows) {
            let line0 = src.wrapping_add(ahead * kd).cast::<u8>();
            for line in (0..row_bytes).step_by(64) {
                S::prefetch(line0.wrapping_add(line));
            }
        }
        let mut u = [S::splat(0.0); 4];
        for j in 0..4 {
            u[j] = S::splat((v[r + j] - a[j].reduce_add() * decay) * beta[r + j]);
        }
        let blk = src.wrapping_add(r * kd);
        let wblk = if write { dst.wrapping_add(r * kd) } else { dst };
        let next = blk.wrapping_add(4 * kd);
        let mut o = [S::splat(0.0); 4];
        a = [S::splat(0.0); 4];
        let mut c = 0;
        if b + 1 < nblk {
            while c < kd {
                // SAFETY: `c + 8 ≤ kd`: inside the rows of blocks b and b+1 (source and
                // destination), `k` and `q`; each element of block b is read before it is
                // written, and block b+1 is only read (caller's contract).
                unsafe {
                    let (kk, qq) = (ld::<S, f32>(kp.add(c)), ld::<S, f32>(qp.add(c)));
                    for j in 0..4 {
                        let x = ld::<S, R>(blk.add(j * kd + c)).mul_add(dv, u[j].mul(kk));
                        if write {
                            st::<S, R>(x, wblk.add(j * kd + c));
                        }
                        o[j] = x.mul_add(qq, o[j]);
                        a[j] = ld::<S, R>(next.add(j * kd + c)).mul_add(kk, a[j]);
                    }
                }
                c += LANES;
            }
        } else {
            while c < kd {
                // SAFETY: as above, block b only.
                unsafe {
                    let (kk, qq) = (ld::<S, f32>(kp.add(c)), ld::<S, f32>(qp.add(c)));
                    for j in 0..4 {
                        let x = ld::<S, R>(blk.add(j * kd + c)).mul_add(dv, u[j].mul(kk));
                        if write {
                            st::<S, R>(x, wblk.add(j * kd + c));
                        }
                        o[j] = x.mul_add(qq, o[j]);
                    }
                }
                c += LANES;
            }
        }
        for j in 0..4 {
            out[r + j] = o[j].reduce_add();
        }
    }
}

/// Several tokens on a V-major head straight from memory (`kd` a multiple of 8, `vd` of 4):
/// per block of four rows, the rows are read once into `buf` (with the dots for token 0), then
/// every token updates the block in L1 — one fused pass that stores the rows to that token's
/// destination (if any), accumulates its outputs and already the dots with the next token's
/// key — so the state is read once and written once per destination, as the op requires.
/// `toks` holds per token `[q (kp) | k (kp) | v (vd) | beta (vd)]` (q, k normalised), `decays`
/// per token `e^g`, `dsts` per token the destination element offset in `base`; `outs` receives
/// `T × vd` outputs; `buf` holds `4·kd` f32.
///
/// # Safety
/// The head at element `src_off` of `base` and every destination head (`vd·kd` elements each)
/// must lie in the buffer and be accessed by no other thread now; a destination may be the
/// source head itself (each block is read before it is written).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn decode_vk_multi<S: Simd, R: Real>(
    base: *mut u8,
    src_off: usize,
    dsts: &[Option<usize>],
    kd: usize,
    vd: usize,
    toks: &[f32],
    decays: &[f32],
    outs: &mut [f32],
    buf: &mut [f32],
) {
    const AHEAD: usize = 4;
    let nt = dsts.len();
    let kp = round8(kd);
    let stride = 2 * kp + 2 * vd;
    let (src, root) = (base.cast::<R>().wrapping_add(src_off), base.cast::<R>());
    let row_bytes = kd * std::mem::size_of::<R>();
    let bp = buf[..4 * kd].as_mut_ptr();
    // Streaming stores need every 8-lane chunk aligned to its size: true when the pool and each
    // destination head start aligned and rows are whole multiples of 8 elements.
    let lane_bytes = LANES * std::mem::size_of::<R>();
    let aligned = dsts.iter().flatten().all(|&off| (root.wrapping_add(off) as usize).is_multiple_of(lane_bytes));
    let mut r0 = 0;
    while r0 < vd {
        for ahead in r0 + AHEAD..(r0 + AHEAD + 4).min(vd) {
            let line0 = src.wrapping_add(ahead * kd).cast::<u8>();
            for line in (0..row_bytes).step_by(64) {
                S::prefetch(line0.wrapping_add(line));
            }
        }
        // Read the block once, with the dots for token 0.
        let kp0 = toks[kp..kp + kd].as_ptr();
        let mut a = [S::splat(0.0); 4];
        let mut c = 0;
        while c < kd {
            // SAFETY: rows r0..r0+4 of the source head and `buf` hold `kd` elements each, `c + 8 ≤ kd`
            // (caller's contract); the source is only read here.
            unsafe {
                let kk = ld::<S, f32>(kp0.add(c));
                for (j, aj) in a.iter_mut().enumerate() {
                    let x = ld::<S, R>(src.add((r0 + j) * kd + c));
                    st::<S, f32>(x, bp.add(j * kd + c));
                    *aj = x.mul_add(kk, *aj);
                }
            }
            c += LANES;
        }
        for t in 0..nt {
            let tk = &toks[t * stride..(t + 1) * stride];
            let (qp, kt) = (tk[..kd].as_ptr(), tk[kp..kp + kd].as_ptr());
            let (vt, bt) = (&tk[2 * kp..2 * kp + vd], &tk[2 * kp + vd..2 * kp + 2 * vd]);
            let decay = decays[t];
            let dv = S::splat(decay);
            let mut u = [S::splat(0.0); 4];
            for j in 0..4 {
                u[j] = S::splat((vt[r0 + j] - a[j].reduce_add() * decay) * bt[r0 + j]);
            }
            let dst = dsts[t].map(|off| root.wrapping_add(off + r0 * kd));
            // A destination other than the source head is write-only here: stream it (no read for
            // ownership of lines nobody reads), when its rows are aligned for that.
            let stream = dsts[t].is_some_and(|off| off != src_off) && aligned;
            let next = (t + 1 < nt).then(|| toks[(t + 1) * stride + kp..(t + 1) * stride + kp + kd].as_ptr());
            let mut o = [S::splat(0.0); 4];
            a = [S::splat(0.0); 4];
            let mut c = 0;
            while c < kd {
                // SAFETY: `c + 8 ≤ kd`: inside `buf`'s rows, the destination rows (caller's
                // contract), and the token vectors (`kd ≤ kp`).
                unsafe {
                    let (kk, qq) = (ld::<S, f32>(kt.add(c)), ld::<S, f32>(qp.add(c)));
                    let kn = match next {
                        Some(np) => ld::<S, f32>(np.add(c)),
                        None => S::splat(0.0),
                    };
                    for j in 0..4 {
                        let x = ld::<S, f32>(bp.add(j * kd + c)).mul_add(dv, u[j].mul(kk));
                        st::<S, f32>(x, bp.add(j * kd + c));
                        if let Some(d) = dst {
                            if stream {
                                R::stream::<S>(x, d.add(j * kd + c));
                            } else {
                                st::<S, R>(x, d.add(j * kd + c));
                            }
                        }
                        o[j] = x.mul_add(qq, o[j]);
                        a[j] = x.mul_add(kn, a[j]);
                    }
                }
                c += LANES;
            }
            for j in 0..4 {
                outs[t * vd + r0 + j] = o[j].reduce_add();
            }
        }
        r0 += 4;
    }
    S::store_fence();
}

/// One token on a V-major head straight from memory: each row of `S` is read once (and again
/// from L1), updated in f32 and written once — one streaming pass over the state. Rows go in
/// pipelined blocks of four when `kd` is a multiple of 8 ([`vk_blocks4`]), the rest one by one.
///
/// # Safety
/// `vd` rows of `kd` elements from element `src_off` of `src` (and from the `dst` offset) must lie
/// in their buffers and be accessed by no other thread now; an `Other` destination must not
/// overlap the source rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn decode_vk_direct<S: Simd, R: Real>(
    src: *mut u8,
    src_off: usize,
    dst: Dst,
    kd: usize,
    vd: usize,
    q: &[f32],
    k: &[f32],
    decay: f32,
    v: &[f32],
    beta: &[f32],
    out: &mut [f32],
) {
    let rows = src.cast::<R>().wrapping_add(src_off);
    let dst_rows = match dst {
        Dst::None => std::ptr::null_mut(),
        Dst::InPlace => rows,
        Dst::Other(base, off) => base.get().cast::<R>().wrapping_add(off),
    };
    let nblk = if kd.is_multiple_of(LANES) { vd / 4 } else { 0 };
    if nblk > 0 {
        // SAFETY: rows 0..4·nblk are in bounds and owned by this item (caller's contract).
        unsafe { vk_blocks4::<S, R>(rows, dst_rows, kd, nblk, q, k, decay, v, beta, out) };
    }
    for r in 4 * nblk..vd {
        let s = rows.wrapping_add(r * kd);
        // A null destination (write nowhere) stays null.
        let d = if dst_rows.is_null() { dst_rows } else { dst_rows.wrapping_add(r * kd) };
        // SAFETY: row r is in bounds and owned by this item (caller's contract).
        let pred = unsafe { dot_row::<S, R>(s, k, kd) } * decay;
        let ur = (v[r] - pred) * beta[r];
        // SAFETY: as above; an `Other` row is a distinct block.
        out[r] = unsafe { row_update::<S, R>(s, d, kd, k, q, decay, ur) };
    }
}

/// One token on a K-major head straight from memory (`V` a multiple of 8). Pass 1 reads the
/// head once, four rows at a time, for both `p = Sᵀk` and `r = Sᵀq`; then `u = β(v − e^g·p)` and
/// `o = e^g·r + (k·q)·u` (the output of the updated state without reading it again); pass 2
/// (only when the state is written) re-reads the head from L2 and stores `e^g·S + k uᵀ`.
/// `v` is overwritten with `u`, `r` is scratch, `out` receives `o`.
///
/// # Safety
/// `kd·vd` elements from element `src_off` of `src` (and from the `dst` offset) must lie in their
/// buffers and be accessed by no other thread now; an `Other` destination must not overlap the
/// source; `vd` is a multiple of 8; `q`, `k` hold `kd`, `v`, `beta`, `r`, `out` hold `vd` elements.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn decode_kv_direct<S: Simd, R: Real>(
    src: *mut u8,
    src_off: usize,
    dst: Dst,
    kd: usize,
    vd: usize,
    q: &[f32],
    k: &[f32],
    decay: f32,
    v: &mut [f32],
    beta: &[f32],
    r: &mut [f32],
    out: &mut [f32],
) {
    const AHEAD: usize = 8;
    let head = src.cast::<R>().wrapping_add(src_off);
    let dst_head = match dst {
        Dst::None => std::ptr::null_mut(),
        Dst::InPlace => head,
        Dst::Other(base, off) => base.get().cast::<R>().wrapping_add(off),
    };
    let (pp, rp) = (out[..vd].as_mut_ptr(), r[..vd].as_mut_ptr());
    let row_bytes = vd * std::mem::size_of::<R>();
    out[..vd].fill(0.0);
    r[..vd].fill(0.0);
    let mut ki = 0;
    while ki < kd {
        // Four rows at a time (one load and store of each running sum per four rows), then one.
        let n = if ki + 4 <= kd { 4 } else { 1 };
        for a in ki + AHEAD..(ki + AHEAD + n).min(kd) {
            let ahead = head.wrapping_add(a * vd).cast::<u8>();
            for line in (0..row_bytes).step_by(64) {
                S::prefetch(ahead.wrapping_add(line));
            }
        }
        let row0 = head.wrapping_add(ki * vd);
        if n == 4 {
            let kk = [S::splat(k[ki]), S::splat(k[ki + 1]), S::splat(k[ki + 2]), S::splat(k[ki + 3])];
            let qq = [S::splat(q[ki]), S::splat(q[ki + 1]), S::splat(q[ki + 2]), S::splat(q[ki + 3])];
            let mut c = 0;
            while c < vd {
                // SAFETY: rows ki..ki+4 of the head hold `vd` elements each; `c + 8 ≤ vd`
                // (a multiple of 8) inside `out` and `r` (caller's contract).
                unsafe {
                    let (mut p, mut rr) = (ld::<S, f32>(pp.add(c)), ld::<S, f32>(rp.add(c)));
                    for j in 0..4 {
                        let sj = ld::<S, R>(row0.add(j * vd + c));
                        p = sj.mul_add(kk[j], p);
                        rr = sj.mul_add(qq[j], rr);
                    }
                    st::<S, f32>(p, pp.add(c));
                    st::<S, f32>(rr, rp.add(c));
                }
                c += LANES;
            }
        } else {
            let (k0, q0) = (S::splat(k[ki]), S::splat(q[ki]));
            let mut c = 0;
            while c < vd {
                // SAFETY: as above, one row.
                unsafe {
                    let s0 = ld::<S, R>(row0.add(c));
                    st::<S, f32>(s0.mul_add(k0, ld::<S, f32>(pp.add(c))), pp.add(c));
                    st::<S, f32>(s0.mul_add(q0, ld::<S, f32>(rp.add(c))), rp.add(c));
                }
                c += LANES;
            }
        }
        ki += n;
    }
    let kq: f32 = k[..kd].iter().zip(&q[..kd]).map(|(a, b)| a * b).sum();
    let (dv, kqv) = (S::splat(decay), S::splat(kq));
    let mut c = 0;
    while c < vd {
        let u = S::load(&v[c..]).sub(S::load(&out[c..]).mul(dv)).mul(S::load(&beta[c..]));
        u.store(&mut v[c..]);
        S::load(&r[c..]).mul(dv).add(kqv.mul(u)).store(&mut out[c..]);
        c += LANES;
    }
    if dst_head.is_null() {
        return;
    }
    let up = v[..vd].as_ptr();
    // Pass 2 runs from L2 and leaves the memory idle: meanwhile prefetch the start of the block
    // that follows this head (the next value head of the same slot, usually this thread's next
    // item), two lines per row, a quarter of a head. A hint: never faults, harmless if unused.
    let next = head.wrapping_add(kd * vd).cast::<u8>();
    for ki in 0..kd {
        S::prefetch(next.wrapping_add(ki * 128));
        S::prefetch(next.wrapping_add(ki * 128 + 64));
        let kk = S::splat(k[ki]);
        let (row, w) = (head.wrapping_add(ki * vd), dst_head.wrapping_add(ki * vd));
        let mut c = 0;
        while c < vd {
            // SAFETY: row ki of the source and destination heads holds `vd` elements, `c + 8 ≤ vd`;
            // each element is read before it is written (in place) or the blocks are disjoint.
            unsafe {
                let x = ld::<S, R>(row.add(c)).mul_add(dv, ld::<S, f32>(up.add(c)).mul(kk));
                st::<S, R>(x, w.add(c));
            }
            c += LANES;
        }
    }
}

/// [`decode_vk_multi`] for one (sequence, value head) item: gathers and normalises every
/// token's q/k, v and gates, runs the rows, scatters the outputs.
#[inline(always)]
fn recurrent_multi<S: Simd>(ctx: &RecCtx<'_>, n: usize, hv: usize, h: usize, r: usize, sp: &SeqSpan) {
    let p = ctx.plan;
    let d = p.dims;
    let (kd, vd, nt) = (d.k, d.v, sp.len);
    let kp = round8(kd);
    let stride = 2 * kp + 2 * vd;
    let (q_at, q_dtype) = p.q;
    let (k_at, k_dtype) = p.k;
    let (v_at, v_dtype) = p.v;
    let (o_at, o_dtype) = p.o;
    let sv = p.state.expect("a row start implies a pool");
    let head = d.head_elems();
    let mut scratch = take_rec_scratch(nt * (stride + 1 + vd) + 4 * kd);
    {
        let (toks, rest) = scratch.split_at_mut(nt * stride);
        let (decays, rest) = rest.split_at_mut(nt);
        let (outs, buf) = rest.split_at_mut(nt * vd);
        for t in 0..nt {
            let tt = sp.t0 + t;
            let tk = &mut toks[t * stride..(t + 1) * stride];
            let (qb, rest) = tk.split_at_mut(kp);
            let (kb, rest) = rest.split_at_mut(kp);
            let (vb, betab) = rest.split_at_mut(vd);
            gather_v::<S>(ctx.q, q_dtype, q_at.at([sp.b, tt, h, 0]), q_at.strides[3], &mut qb[..kd]);
            gather_v::<S>(ctx.k, k_dtype, k_at.at([sp.b, tt, h, 0]), k_at.strides[3], &mut kb[..kd]);
            qb[kd..].fill(0.0);
            kb[kd..].fill(0.0);
            normalize::<S>(qb, kd, p.l2norm, p.eps, p.scale);
            normalize::<S>(kb, kd, p.l2norm, p.eps, 1.0);
            gather_v::<S>(ctx.v, v_dtype, v_at.at([sp.b, tt, hv, 0]), v_at.strides[3], vb);
            decays[t] = token_gates(ctx, sp.b, tt, hv, 0, betab).exp();
        }
        let dsts: [Option<usize>; 16] = std::array::from_fn(|t| {
            (t < nt).then(|| p.store_row(ctx.ix.as_ref(), n, sp, t).map(|w| sv.head(w, hv, head))).flatten()
        });
        let mut dyn_dsts = Vec::new();
        let dsts: &[Option<usize>] = if nt <= 16 {
            &dsts[..nt]
        } else {
            dyn_dsts.extend((0..nt).map(|t| p.store_row(ctx.ix.as_ref(), n, sp, t).map(|w| sv.head(w, hv, head))));
            &dyn_dsts
        };
        let base = ctx.state.unwrap().get();
        let src_off = sv.head(r, hv, head);
        // SAFETY: the source head and every destination head of this (sequence, value head) are
        // in the pool (plan) and touched by this item only: the plan refuses slots shared between
        // sequences when one of them writes; other items own other heads.
        unsafe {
            match sv.dtype {
                DType::F32 => decode_vk_multi::<S, f32>(base, src_off, dsts, kd, vd, toks, decays, outs, buf),
                DType::BF16 => decode_vk_multi::<S, bf16>(base, src_off, dsts, kd, vd, toks, decays, outs, buf),
                DType::F16 => decode_vk_multi::<S, f16>(base, src_off, dsts, kd, vd, toks, decays, outs, buf),
                _ => unreachable!("the plan admits f32/bf16/f16 states only"),
            }
        }
        for t in 0..nt {
            let at = o_at.at([sp.b, sp.t0 + t, hv, 0]);
            // SAFETY: the output row of (sequence n, token t, head hv) belongs to this item.
            unsafe { scatter_v::<S>(ctx.o.get(), o_dtype, at, o_at.strides[3], &outs[t * vd..(t + 1) * vd]) };
        }
    }
    give_rec_scratch(scratch);
}

#[inline(always)]
fn recurrent_item<S: Simd>(ctx: &RecCtx<'_>, item: usize) {
    let p = ctx.plan;
    let d = p.dims;
    let (n, hv) = (item / d.v_heads, item % d.v_heads);
    let sp = p.span(ctx.cu.as_ref(), n);
    if sp.len == 0 {
        return;
    }
    let start = p.start(ctx.ix.as_ref(), ctx.na.as_ref(), n, &sp);
    let (o_at, o_dtype) = p.o;
    let o_row = |t: usize, v0: usize| o_at.at([sp.b, sp.t0 + t, hv, v0]);
    match start {
        StartState::Skip => return,
        StartState::ZeroOutput => {
            let zeros = [0.0f32; 64];
            for t in 0..sp.len {
                let mut v0 = 0;
                while v0 < d.v {
                    let nv = (d.v - v0).min(zeros.len());
                    // SAFETY: row (sequence n, token t, head hv) of `o` belongs to this item.
                    unsafe { scatter(ctx.o.get(), o_dtype, o_row(t, v0), o_at.strides[3], &zeros[..nv]) };
                    v0 += nv;
                }
            }
            return;
        }
        StartState::Zeros | StartState::Row(_) => {}
    }
    let h = hv / d.group();
    let head = d.head_elems();
    let kp = round8(d.k);
    let (q_at, q_dtype) = p.q;
    let (k_at, k_dtype) = p.k;
    let (v_at, v_dtype) = p.v;
    // Rows of S per block: VK tiles are [nv][kp], KV tiles are [kd][cp] with cp = round8(nv).
    let block = match p.layout {
        StateLayout::VK => (TILE / kp).min(MAX_BLOCK).min(d.v),
        StateLayout::KV => ((TILE / d.k) / LANES * LANES).min(MAX_BLOCK).min(round8(d.v)),
    };
    let bp = round8(block);
    // Several tokens from a slot of a V-major pool, stored (if at all) back into the pool:
    // the multi-token direct path (read once, write once per destination).
    if let (StateLayout::VK, StartState::Row(r), true, None) = (p.layout, start, sp.len > 1, p.final_state)
        && d.k.is_multiple_of(LANES)
        && d.v.is_multiple_of(4)
    {
        recurrent_multi::<S>(ctx, n, hv, h, r, &sp);
        return;
    }
    // Direct path: one token, read from a slot and written (if at all) to one place of
    // the same dtype: no tile, rows stream from memory to memory.
    // The K-major direct path handles a whole head at once (V a multiple of the lanes).
    let kv_direct_ok = d.v.is_multiple_of(LANES) && block >= d.v;
    let direct = match (p.layout, start, sp.len) {
        (layout, StartState::Row(r), 1) if layout == StateLayout::VK || kv_direct_ok => {
            let sv = p.state.expect("a row start implies a pool");
            let src_off = sv.head(r, hv, head);
            match (p.store_row(ctx.ix.as_ref(), n, &sp, 0), p.final_row(&sp, 0)) {
                (Some(w), _) if w == r => Some((sv.dtype, src_off, Dst::InPlace)),
                (Some(w), _) => Some((sv.dtype, src_off, Dst::Other(ctx.state.unwrap(), sv.head(w, hv, head)))),
                (None, Some(f)) => {
                    let fs = p.final_state.expect("final rows imply final_state");
                    (fs.dtype == sv.dtype)
                        .then(|| (sv.dtype, src_off, Dst::Other(ctx.final_state.unwrap(), fs.head(f, hv, head))))
                }
                (None, None) => Some((sv.dtype, src_off, Dst::None)),
            }
        }
        _ => None,
    };
    let tile_len = if direct.is_some() { 0 } else { TILE };
    let mut scratch = take_rec_scratch(tile_len + 2 * kp + 4 * bp);
    {
        let (tile, rest) = scratch.split_at_mut(tile_len);
        let (qb, rest) = rest.split_at_mut(kp);
        let (kb, rest) = rest.split_at_mut(kp);
        let (vb, rest) = rest.split_at_mut(bp);
        let (betab, rest) = rest.split_at_mut(bp);
        let (rb, ob) = rest.split_at_mut(bp);
        let mut v0 = 0;
        while v0 < d.v {
            let nv = block.min(d.v - v0);
            let cp = round8(nv);
            // Tile geometry in memory (element offset of the block, row pitch, rows, columns) and in the tile.
            let (moff, ld, rows, cols, tp) = match p.layout {
                StateLayout::VK => (v0 * d.k, d.k, nv, d.k, kp),
                StateLayout::KV => (v0, d.v, d.k, nv, cp),
            };
            if direct.is_none() {
                match start {
                    StartState::Row(r) => {
                        let sv = p.state.as_ref().expect("a row start implies a pool");
                        // SAFETY: slot r's head hv rows of this block lie in the pool (plan); no other
                        // item writes them now (slot conflicts are refused by the plan; other items
                        // own other heads or other value rows).
                        unsafe {
                            load_tile_dyn::<S>(
                                sv.dtype,
                                ctx.state.unwrap().get(),
                                sv.head(r, hv, head) + moff,
                                ld,
                                rows,
                                cols,
                                tile,
                                tp,
                            )
                        };
                    }
                    _ => tile[..rows * tp].iter_mut().for_each(|x| *x = 0.0),
                }
            }
            for t in 0..sp.len {
                let tt = sp.t0 + t;
                gather_v::<S>(ctx.q, q_dtype, q_at.at([sp.b, tt, h, 0]), q_at.strides[3], &mut qb[..d.k]);
                gather_v::<S>(ctx.k, k_dtype, k_at.at([sp.b, tt, h, 0]), k_at.strides[3], &mut kb[..d.k]);
                normalize::<S>(qb, d.k, p.l2norm, p.eps, p.scale);
                normalize::<S>(kb, d.k, p.l2norm, p.eps, 1.0);
                gather_v::<S>(ctx.v, v_dtype, v_at.at([sp.b, tt, hv, v0]), v_at.strides[3], &mut vb[..nv]);
                vb[nv..cp].iter_mut().for_each(|x| *x = 0.0);
                let g = token_gates(ctx, sp.b, tt, hv, v0, &mut betab[..nv]);
                betab[nv..cp].iter_mut().for_each(|x| *x = 0.0);
                let decay = g.exp();
                if let Some((dtype, src_off, dst)) = direct {
                    let src = ctx.state.unwrap().get();
                    let (off, dst) = match dst {
                        Dst::Other(base, o) => (src_off + moff, Dst::Other(base, o + moff)),
                        other => (src_off + moff, other),
                    };
                    // SAFETY: rows v0..v0+nv of head hv of the source slot (and of the destination)
                    // are in bounds (plan) and touched by this item only: the plan refuses slots
                    // shared between sequences when one of them writes; other items own other
                    // heads. An `Other` destination is another slot or `final_state`.
                    unsafe {
                        match (p.layout, dtype) {
                            (StateLayout::VK, DType::F32) => {
                                decode_vk_direct::<S, f32>(src, off, dst, d.k, nv, qb, kb, decay, vb, betab, ob)
                            }
                            (StateLayout::VK, DType::BF16) => {
                                decode_vk_direct::<S, bf16>(src, off, dst, d.k, nv, qb, kb, decay, vb, betab, ob)
                            }
                            (StateLayout::VK, DType::F16) => {
                                decode_vk_direct::<S, f16>(src, off, dst, d.k, nv, qb, kb, decay, vb, betab, ob)
                            }
                            (StateLayout::KV, DType::F32) => {
                                decode_kv_direct::<S, f32>(src, off, dst, d.k, d.v, qb, kb, decay, vb, betab, rb, ob)
                            }
                            (StateLayout::KV, DType::BF16) => {
                                decode_kv_direct::<S, bf16>(src, off, dst, d.k, d.v, qb, kb, decay, vb, betab, rb, ob)
                            }
                            (StateLayout::KV, DType::F16) => {
                                decode_kv_direct::<S, f16>(src, off, dst, d.k, d.v, qb, kb, decay, vb, betab, rb, ob)
                            }
                            _ => unreachable!("the plan admits f32/bf16/f16 states only"),
                        }
                    }
                } else {
                    match p.layout {
                        StateLayout::VK => step_vk::<S>(tile, nv, kp, qb, kb, decay, vb, betab, ob),
                        StateLayout::KV => step_kv::<S>(tile, d.k, cp, qb, kb, decay, vb, betab, ob),
                    }
                }
                // SAFETY: the output row of (sequence n, token t, head hv) belongs to this item.
                unsafe { scatter_v::<S>(ctx.o.get(), o_dtype, o_row(t, v0), o_at.strides[3], &ob[..nv]) };
                if direct.is_some() {
                    continue;
                }
                if let Some(r) = p.store_row(ctx.ix.as_ref(), n, &sp, t) {
                    let sv = p.state.as_ref().expect("in-place stores imply a pool");
                    // A slot other than the one this sequence started from is write-only here.
                    let stream = !matches!(start, StartState::Row(s0) if s0 == r);
                    // SAFETY: slot r is written only by this sequence (plan), head hv and these value
                    // rows only by this item.
                    unsafe {
                        store_tile_dyn::<S>(
                            sv.dtype,
                            ctx.state.unwrap().get(),
                            sv.head(r, hv, head) + moff,
                            ld,
                            rows,
                            cols,
                            tile,
                            tp,
                            stream,
                        )
                    };
                }
                if let Some(r) = p.final_row(&sp, t) {
                    let fs = p.final_state.as_ref().expect("final rows imply final_state");
                    // SAFETY: row r = bos + t of `final_state` belongs to this sequence's token t;
                    // head hv and these value rows to this item.
                    unsafe {
                        store_tile_dyn::<S>(
                            fs.dtype,
                            ctx.final_state.unwrap().get(),
                            fs.head(r, hv, head) + moff,
                            ld,
                            rows,
                            cols,
                            tile,
                            tp,
                            true,
                        )
                    };
                }
            }
            v0 += nv;
        }
    }
    give_rec_scratch(scratch);
}

fn host_ref<'a>(arg: &'static str, t: &TensorRef<'a>) -> Result<&'a [u8], CpuError> {
    require_host(arg, t.device())?;
    Ok(t.host_bytes().expect("host checked"))
}

fn opt_host(arg: &'static str, t: Option<&TensorRef<'_>>) -> Result<(), CpuError> {
    match t {
        Some(t) => require_host(arg, t.device()),
        None => Ok(()),
    }
}

struct RecOut<'r, 'a> {
    initial_state: Option<&'r mut ssm_tensor::TensorMut<'a>>,
    final_state: Option<&'r mut ssm_tensor::TensorMut<'a>>,
    o: &'r mut ssm_tensor::TensorMut<'a>,
}

impl CpuBackend {
    #[allow(clippy::too_many_arguments)]
    fn run_recurrent(
        &self,
        plan: &RecurrentPlan,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        gates: GateBytes<'_>,
        idx: [Option<TensorRef<'_>>; 3],
        out: RecOut<'_, '_>,
    ) -> Result<(), CpuError> {
        let [cu, ix, na] = idx;
        opt_host("cu_seqlens", cu.as_ref())?;
        opt_host("ssm_state_indices", ix.as_ref())?;
        opt_host("num_accepted_tokens", na.as_ref())?;
        let ptr = |arg: &'static str, t: &mut ssm_tensor::TensorMut<'_>| -> Result<SyncPtr<u8>, CpuError> {
            require_host(arg, t.device())?;
            Ok(SyncPtr(t.host_bytes_mut().expect("host checked").as_mut_ptr()))
        };
        let state = match out.initial_state {
            Some(s) => Some(ptr("initial_state", s)?),
            None => None,
        };
        let final_state = match out.final_state {
            Some(s) => Some(ptr("final_state", s)?),
            None => None,
        };
        let o = ptr("o", out.o)?;
        let ctx = RecCtx {
            plan,
            q: host_ref("q", q)?,
            k: host_ref("k", k)?,
            v: host_ref("v", v)?,
            gates,
            cu,
            ix,
            na,
            state,
            final_state,
            o,
        };
        let d = plan.dims;
        self.for_each(d.seqs * d.v_heads, |item| dispatch(RecItem { ctx: &ctx, item }));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// chunked prefill

/// Offsets (in f32 elements) of one worker's chunked-prefill scratch.
#[derive(Clone, Copy)]
struct ChunkScratch {
    kp: usize,
    vp: usize,
    q: usize,
    k: usize,
    w: usize,
    u: usize,
    o: usize,
    kdt: usize,
    a: usize,
    pm: usize,
    gc: usize,
    bt: usize,
    len: usize,
}

impl ChunkScratch {
    fn new(kd: usize, vd: usize) -> Self {
        let c = CHUNK_SIZE;
        let (kp, vp) = (round8(kd), round8(vd));
        let q = kd * vp;
        let k = q + c * kp;
        let w = k + c * kp;
        let u = w + c * kp;
        let o = u + c * vp;
        let kdt = o + c * vp;
        let a = kdt + kd * c;
        let pm = a + c * c;
        let gc = pm + c * c;
        let bt = gc + c;
        let len = bt + c;
        ChunkScratch { kp, vp, q, k, w, u, o, kdt, a, pm, gc, bt, len }
    }
}

/// `out[i][..np] += alpha·Σ_{p<kd} a[i·lda + p]·b[p·ldb + ..np]` for `i < m`; `np` a multiple of 8.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm<S: Simd>(
    m: usize,
    kd: usize,
    np: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    out: &mut [f32],
    ldo: usize,
    alpha: f32,
) {
    let mut i = 0;
    while i + 2 <= m {
        let mut c = 0;
        while c + 4 * LANES <= np {
            gemm_tile::<S, 2, 4>(i, c, kd, a, lda, b, ldb, out, ldo, alpha);
            c += 4 * LANES;
        }
        while c < np {
            gemm_tile::<S, 2, 1>(i, c, kd, a, lda, b, ldb, out, ldo, alpha);
            c += LANES;
        }
        i += 2;
    }
    if i < m {
        let mut c = 0;
        while c + 4 * LANES <= np {
            gemm_tile::<S, 1, 4>(i, c, kd, a, lda, b, ldb, out, ldo, alpha);
            c += 4 * LANES;
        }
        while c < np {
            gemm_tile::<S, 1, 1>(i, c, kd, a, lda, b, ldb, out, ldo, alpha);
            c += LANES;
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm_tile<S: Simd, const R: usize, const G: usize>(
    i: usize,
    c: usize,
    kd: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    out: &mut [f32],
    ldo: usize,
    alpha: f32,
) {
    let mut acc = [[S::splat(0.0); G]; R];
    for p in 0..kd {
        let brow = &b[p * ldb + c..p * ldb + c + G * LANES];
        // A plain loop, not `array::from_fn`: a closure would not inherit the caller's target features.
        let mut bv = [S::splat(0.0); G];
        for j in 0..G {
            bv[j] = S::load(&brow[j * LANES..]);
        }
        for r in 0..R {
            let av = S::splat(a[(i + r) * lda + p] * alpha);
            for j in 0..G {
                acc[r][j] = bv[j].mul_add(av, acc[r][j]);
            }
        }
    }
    for r in 0..R {
        let orow = &mut out[(i + r) * ldo + c..(i + r) * ldo + c + G * LANES];
        for j in 0..G {
            S::load(&orow[j * LANES..]).add(acc[r][j]).store(&mut orow[j * LANES..]);
        }
    }
}

struct ChunkCtx<'a> {
    plan: &'a ChunkPlan,
    q: &'a [u8],
    k: &'a [u8],
    v: &'a [u8],
    g: &'a [u8],
    beta: &'a [u8],
    cu: Option<TensorRef<'a>>,
    ix: Option<TensorRef<'a>>,
    has: Option<TensorRef<'a>>,
    state: Option<SyncPtr<u8>>,
    final_state: Option<SyncPtr<u8>>,
    o: SyncPtr<u8>,
    layout: ChunkScratch,
}

struct ChunkItem<'c, 'a, 's> {
    ctx: &'c ChunkCtx<'a>,
    item: usize,
    ws: &'s mut [f32],
}

impl SimdKernel for ChunkItem<'_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        chunk_item::<S>(self.ctx, self.item, self.ws)
    }
}

/// Loads head `hv` of row `row` of a state tensor into the K-major f32 matrix `h` (`[kd][vp]`).
///
/// # Safety
/// The head block must lie in the buffer behind `base` and be written by no other thread now.
unsafe fn load_h(
    base: *const u8,
    sv: &StateView,
    layout: StateLayout,
    row: usize,
    hv: usize,
    kd: usize,
    vd: usize,
    vp: usize,
    h: &mut [f32],
) {
    let off = sv.head(row, hv, kd * vd);
    // SAFETY: the head block (kd·vd elements from `off`) is in bounds and not written concurrently.
    let bytes = unsafe { std::slice::from_raw_parts(base.add(off * sv.dtype.size()), kd * vd * sv.dtype.size()) };
    for ki in 0..kd {
        for vi in 0..vp {
            h[ki * vp + vi] = if vi < vd {
                let e = match layout {
                    StateLayout::VK => vi * kd + ki,
                    StateLayout::KV => ki * vd + vi,
                };
                rd(bytes, sv.dtype, e)
            } else {
                0.0
            };
        }
    }
}

/// Stores the K-major f32 matrix `h` as head `hv` of row `row` of a state tensor.
///
/// # Safety
/// The head block must lie in the buffer behind `base` and be accessed by no other thread now.
unsafe fn store_h(
    base: *mut u8,
    sv: &StateView,
    layout: StateLayout,
    row: usize,
    hv: usize,
    kd: usize,
    vd: usize,
    vp: usize,
    h: &[f32],
) {
    let off = sv.head(row, hv, kd * vd);
    let mut line = [0.0f32; 1];
    for ki in 0..kd {
        for vi in 0..vd {
            let e = match layout {
                StateLayout::VK => vi * kd + ki,
                StateLayout::KV => ki * vd + vi,
            };
            line[0] = h[ki * vp + vi];
            // SAFETY: element `off + e` is in the head block, owned by this item (caller's contract).
            unsafe { scatter(base, sv.dtype, off + e, 1, &line) };
        }
    }
}

#[inline(always)]
fn chunk_item<S: Simd>(ctx: &ChunkCtx<'_>, item: usize, ws: &mut [f32]) {
    let p = ctx.plan;
    let d = p.dims;
    let (n, hv) = (item / d.v_heads, item % d.v_heads);
    let start = p.start(ctx.ix.as_ref(), ctx.has.as_ref(), n);
    let (read, write) = match start {
        ChunkStart::Skip => return,
        ChunkStart::Zeros { row } => (None, row),
        ChunkStart::Row(r) => (Some(r), p.inplace.then_some(r)),
    };
    let sp = p.span(ctx.cu.as_ref(), n);
    let h_idx = hv / d.group();
    let l = ctx.layout;
    let (kd, vd, kp, vp, cs) = (d.k, d.v, l.kp, l.vp, CHUNK_SIZE);
    let (hbuf, rest) = ws[..l.len].split_at_mut(l.q);
    let (qm, rest) = rest.split_at_mut(l.k - l.q);
    let (km, rest) = rest.split_at_mut(l.w - l.k);
    let (wm, rest) = rest.split_at_mut(l.u - l.w);
    let (um, rest) = rest.split_at_mut(l.o - l.u);
    let (om, rest) = rest.split_at_mut(l.kdt - l.o);
    let (kdt, rest) = rest.split_at_mut(l.a - l.kdt);
    let (am, rest) = rest.split_at_mut(l.pm - l.a);
    let (pm, rest) = rest.split_at_mut(l.gc - l.pm);
    let (gc, bt) = rest.split_at_mut(l.bt - l.gc);
    match read {
        Some(r) => {
            let sv = p.state.as_ref().expect("a row start implies initial_state");
            // SAFETY: head hv of row r is in bounds (plan) and written by no other sequence (plan's
            // slot-conflict check) nor by another item (other heads).
            unsafe { load_h(ctx.state.unwrap().0, sv, p.layout, r, hv, kd, vd, vp, hbuf) };
        }
        None => hbuf.iter_mut().for_each(|x| *x = 0.0),
    }
    let (q_at, q_dt) = p.q;
    let (k_at, k_dt) = p.k;
    let (v_at, v_dt) = p.v;
    let (g_at, g_dt) = p.g;
    let (b_at, b_dt) = p.beta;
    let (o_at, o_dt) = p.o;
    let mut c0 = 0;
    while c0 < sp.len {
        let cl = cs.min(sp.len - c0);
        let mut acc = 0.0f32;
        for i in 0..cl {
            let tt = sp.t0 + c0 + i;
            let qi = &mut qm[i * kp..(i + 1) * kp];
            gather_v::<S>(ctx.q, q_dt, q_at.at([sp.b, tt, h_idx, 0]), q_at.strides[3], &mut qi[..kd]);
            normalize::<S>(qi, kd, p.l2norm, p.eps, p.scale);
            let ki = &mut km[i * kp..(i + 1) * kp];
            gather_v::<S>(ctx.k, k_dt, k_at.at([sp.b, tt, h_idx, 0]), k_at.strides[3], &mut ki[..kd]);
            normalize::<S>(ki, kd, p.l2norm, p.eps, 1.0);
            let ui = &mut um[i * vp..(i + 1) * vp];
            gather_v::<S>(ctx.v, v_dt, v_at.at([sp.b, tt, hv, 0]), v_at.strides[3], &mut ui[..vd]);
            ui[vd..].iter_mut().for_each(|x| *x = 0.0);
            acc += rd(ctx.g, g_dt, g_at.at([sp.b, tt, hv]));
            gc[i] = acc;
            bt[i] = rd(ctx.beta, b_dt, b_at.at([sp.b, tt, hv]));
        }
        // A (strictly lower) and P (lower with diagonal).
        for i in 0..cl {
            let qi = &qm[i * kp..(i + 1) * kp];
            let ki = &km[i * kp..(i + 1) * kp];
            for j in 0..=i {
                let kj = &km[j * kp..(j + 1) * kp];
                let decay = (gc[i] - gc[j]).exp();
                pm[i * cs + j] = dot::<S>(qi, kj, kp) * decay;
                if j < i {
                    am[i * cs + j] = bt[i] * dot::<S>(ki, kj, kp) * decay;
                }
            }
        }
        // U = (I+A)⁻¹ βV and W = (I+A)⁻¹ (β e^G K), by forward substitution.
        for i in 0..cl {
            scal::<S>(&mut um[i * vp..(i + 1) * vp], bt[i], vp);
            let wi = &mut wm[i * kp..(i + 1) * kp];
            wi.copy_from_slice(&km[i * kp..(i + 1) * kp]);
            scal::<S>(wi, bt[i] * gc[i].exp(), kp);
            for j in 0..i {
                let aij = -am[i * cs + j];
                let (uj, ui) = um.split_at_mut(i * vp);
                axpy::<S>(&mut ui[..vp], &uj[j * vp..(j + 1) * vp], aij, vp);
                let (wj, wi) = wm.split_at_mut(i * kp);
                axpy::<S>(&mut wi[..kp], &wj[j * kp..(j + 1) * kp], aij, kp);
            }
        }
        // V' = U − W·H (in place in `um`).
        gemm::<S>(cl, kd, vp, wm, kp, hbuf, vp, um, vp, -1.0);
        // O = (e^{G_i} q_i)·H + P·V'.
        om[..cl * vp].iter_mut().for_each(|x| *x = 0.0);
        for i in 0..cl {
            scal::<S>(&mut qm[i * kp..(i + 1) * kp], gc[i].exp(), kp);
        }
        gemm::<S>(cl, kd, vp, qm, kp, hbuf, vp, om, vp, 1.0);
        gemm::<S>(cl, cl, vp, pm, cs, um, vp, om, vp, 1.0);
        for i in 0..cl {
            let tt = sp.t0 + c0 + i;
            // SAFETY: the output row of (sequence n, token tt, head hv) belongs to this item.
            unsafe {
                scatter_v::<S>(ctx.o.0, o_dt, o_at.at([sp.b, tt, hv, 0]), o_at.strides[3], &om[i * vp..i * vp + vd])
            };
        }
        // H ← e^{G_last}·H + Σ_i e^{G_last − G_i} k_i V'_iᵀ.
        let glast = gc[cl - 1];
        scal::<S>(hbuf, glast.exp(), kd * vp);
        for i in 0..cl {
            let f = (glast - gc[i]).exp();
            for ki in 0..kd {
                kdt[ki * cs + i] = km[i * kp + ki] * f;
            }
        }
        gemm::<S>(kd, cl, vp, kdt, cs, um, vp, hbuf, vp, 1.0);
        c0 += cl;
    }
    if let (Some(fs), Some(ptr)) = (p.final_state.as_ref(), ctx.final_state) {
        // SAFETY: row n of `final_state` belongs to sequence n; head hv to this item.
        unsafe { store_h(ptr.0, fs, p.layout, n, hv, kd, vd, vp, hbuf) };
    }
    if let Some(r) = write {
        let sv = p.state.as_ref().expect("in-place writes imply initial_state");
        // SAFETY: row r is touched by this sequence only (plan); head hv by this item only.
        unsafe { store_h(ctx.state.unwrap().0, sv, p.layout, r, hv, kd, vd, vp, hbuf) };
    }
}

impl Run<FusedGdnGatingArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedGdnGatingArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        for (arg, d) in [
            ("A_log", args.a_log.device()),
            ("a", args.a.device()),
            ("b", args.b.device()),
            ("dt_bias", args.dt_bias.device()),
            ("g", args.g.device()),
            ("beta_output", args.beta_output.device()),
        ] {
            require_host(arg, d)?;
        }
        gating(plan, &mut args);
        Ok(())
    }
}

impl Run<FusedRecurrentGatedDeltaRuleArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedRecurrentGatedDeltaRuleArgs<'_>>) -> Result<(), CpuError> {
        let (args, plan) = call.into_parts();
        let plan = &plan;
        let FusedRecurrentGatedDeltaRuleArgs {
            q,
            k,
            v,
            g,
            beta,
            cu_seqlens,
            ssm_state_indices,
            num_accepted_tokens,
            mut initial_state,
            mut final_state,
            mut o,
            ..
        } = args;
        let gates = GateBytes::Given {
            g: host_ref("g", &g)?,
            beta: match &beta {
                Some(b) => Some(host_ref("beta", b)?),
                None => None,
            },
        };
        let out = RecOut { initial_state: initial_state.as_mut(), final_state: final_state.as_mut(), o: &mut o };
        self.run_recurrent(plan, &q, &k, &v, gates, [cu_seqlens, ssm_state_indices, num_accepted_tokens], out)
    }
}

impl Run<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>>) -> Result<(), CpuError> {
        let (args, plan) = call.into_parts();
        let plan = &plan;
        let FusedSigmoidGatingDeltaRuleUpdateArgs {
            a_log,
            a,
            b,
            dt_bias,
            q,
            k,
            v,
            cu_seqlens,
            ssm_state_indices,
            num_accepted_tokens,
            mut initial_state,
            mut final_state,
            mut o,
            ..
        } = args;
        let gates = GateBytes::Sigmoid {
            a_log: host_ref("A_log", &a_log)?,
            dt_bias: host_ref("dt_bias", &dt_bias)?,
            a: host_ref("a", &a)?,
            b: host_ref("b", &b)?,
        };
        let out = RecOut { initial_state: initial_state.as_mut(), final_state: final_state.as_mut(), o: &mut o };
        self.run_recurrent(plan, &q, &k, &v, gates, [cu_seqlens, ssm_state_indices, num_accepted_tokens], out)
    }
}

impl Run<ChunkGatedDeltaRuleArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), CpuError> {
        let (args, plan) = call.into_parts();
        let plan = &plan;
        let ChunkGatedDeltaRuleArgs {
            q,
            k,
            v,
            g,
            beta,
            cu_seqlens,
            initial_state_indices,
            has_initial_state,
            mut initial_state,
            mut final_state,
            mut o,
            mut scratch,
            ..
        } = args;
        opt_host("cu_seqlens", cu_seqlens.as_ref())?;
        opt_host("initial_state_indices", initial_state_indices.as_ref())?;
        opt_host("has_initial_state", has_initial_state.as_ref())?;
        let ptr = |arg: &'static str, t: &mut ssm_tensor::TensorMut<'_>| -> Result<SyncPtr<u8>, CpuError> {
            require_host(arg, t.device())?;
            Ok(SyncPtr(t.host_bytes_mut().expect("host checked").as_mut_ptr()))
        };
        let state = match initial_state.as_mut() {
            Some(s) => Some(ptr("initial_state", s)?),
            None => None,
        };
        let final_ptr = match final_state.as_mut() {
            Some(s) => Some(ptr("final_state", s)?),
            None => None,
        };
        let o_ptr = ptr("o", &mut o)?;
        let layout = ChunkScratch::new(plan.dims.k, plan.dims.v);
        let items = plan.dims.seqs * plan.dims.v_heads;
        if items == 0 {
            return Ok(());
        }
        let workers = self.par().threads().min(items).max(1);
        let need = workers * layout.len;
        let mut owned = Vec::new();
        let ws: &mut [f32] = match scratch.as_mut() {
            Some(s) if plan.scratch_len >= need => {
                require_host("scratch", s.device())?;
                let off = s.layout().offset();
                &mut s.host_data_mut::<f32>().expect("the plan checked an f32 scratch")[off..off + need]
            }
            _ => {
                owned.resize(need, 0.0f32);
                &mut owned
            }
        };
        let ws_ptr = SyncPtr(ws.as_mut_ptr());
        let ctx = ChunkCtx {
            plan,
            q: host_ref("q", &q)?,
            k: host_ref("k", &k)?,
            v: host_ref("v", &v)?,
            g: host_ref("g", &g)?,
            beta: host_ref("beta", &beta)?,
            cu: cu_seqlens,
            ix: initial_state_indices,
            has: has_initial_state,
            state,
            final_state: final_ptr,
            o: o_ptr,
            layout,
        };
        let next = AtomicUsize::new(0);
        self.for_each(workers, |w| {
            // SAFETY: `for_each` calls this closure once per worker index w, so each worker owns
            // the disjoint region [w·len, (w+1)·len) of the scratch for the whole call.
            let mine = unsafe { std::slice::from_raw_parts_mut(ws_ptr.get().add(w * layout.len), layout.len) };
            loop {
                let item = next.fetch_add(1, Ordering::Relaxed);
                if item >= items {
                    break;
                }
                dispatch(ChunkItem { ctx: &ctx, item, ws: &mut *mine });
            }
        });
        Ok(())
    }
}

impl ssm_gdn::ChunkScratch for CpuBackend {
    fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize {
        let items = plan.dims.seqs * plan.dims.v_heads;
        let workers = self.par().threads().min(items).max(1);
        workers * ChunkScratch::new(plan.dims.k, plan.dims.v).len
    }
}
