//! The direct decode kernels of the recurrent ops: state rows stream from memory to memory
//! (read once, updated in f32 in registers or L1, written once per destination), with no tile.

use std::ops::Range;

use super::Token;
use crate::lanes::{ld, round8, st};
use crate::shared::SharedBuf;
use crate::simd::{LANES, Real, Simd};

/// Prefetches `rows` of a head of `pitch`-element rows at `head`, every cache line of each: a
/// hint that never faults, even for rows past the tensor.
#[inline(always)]
fn prefetch_rows<S: Simd, R>(head: *const R, rows: Range<usize>, pitch: usize) {
    let row_bytes = pitch * std::mem::size_of::<R>();
    for row in rows {
        let line0 = head.wrapping_add(row * pitch).cast::<u8>();
        for line in (0..row_bytes).step_by(64) {
            S::prefetch(line0.wrapping_add(line));
        }
    }
}

/// The dot products with `k` of four rows of `kd` elements (a multiple of 8) from `rows`, as
/// lane sums; with `COPY`, the rows are also stored, widened to f32, at `buf`.
///
/// # Safety
/// `rows` must be valid for reading `4·kd` elements and `kp` for `kd`; with `COPY`, `buf` for
/// writing `4·kd`, with no reference to them live.
#[inline(always)]
unsafe fn block_dots<S: Simd, R: Real, const COPY: bool>(
    rows: *const R,
    kd: usize,
    kp: *const f32,
    buf: *mut f32,
) -> [S; 4] {
    let mut a = [S::splat(0.0); 4];
    let mut c = 0;
    while c < kd {
        // SAFETY: `c + 8 ≤ kd`: inside the four rows, `k` and (with `COPY`) `buf` (caller's contract).
        unsafe {
            let kk = ld::<S, f32>(kp.add(c));
            for (j, aj) in a.iter_mut().enumerate() {
                let x = ld::<S, R>(rows.add(j * kd + c));
                if COPY {
                    st::<S, f32>(x, buf.add(j * kd + c));
                }
                *aj = x.mul_add(kk, *aj);
            }
        }
        c += LANES;
    }
    a
}

/// `u = β(v − e^g·Σa)` of a block of four rows (`v`, `beta` from the block's first row on), as lanes.
#[inline(always)]
fn block_u<S: Simd>(a: &[S; 4], v: &[f32], beta: &[f32], decay: f32) -> [S; 4] {
    let mut u = [S::splat(0.0); 4];
    for j in 0..4 {
        u[j] = S::splat((v[j] - a[j].reduce_add() * decay) * beta[j]);
    }
    u
}

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
pub(super) enum Dst {
    /// Nowhere (a null write slot).
    None,
    /// Back over the rows it read.
    InPlace,
    /// Another head block: base pointer and element offset.
    Other(SharedBuf<u8>, usize),
}

/// The memory of one direct decode: `kd·vd` elements at `src`, written to `dst` (null for none;
/// `src` itself in place).
#[derive(Clone, Copy)]
pub(super) struct HeadRows<R> {
    src: *mut R,
    dst: *mut R,
    kd: usize,
    vd: usize,
}

impl<R> HeadRows<R> {
    /// From element `src_off` of `src`, to where `dst` says.
    #[inline(always)]
    pub(super) fn new(src: SharedBuf<u8>, src_off: usize, dst: Dst, [kd, vd]: [usize; 2]) -> Self {
        let rows = src.elems::<R>(src_off, kd * vd);
        let dst = match dst {
            Dst::None => std::ptr::null_mut(),
            Dst::InPlace => rows,
            Dst::Other(base, off) => base.elems::<R>(off, kd * vd),
        };
        HeadRows { src: rows, dst, kd, vd }
    }
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
#[inline(always)]
unsafe fn vk_blocks4<S: Simd, R: Real>(
    src: *const R,
    dst: *mut R,
    kd: usize,
    nblk: usize,
    tok: Token<'_>,
    out: &mut [f32],
) {
    const AHEAD: usize = 4;
    let rows = 4 * nblk;
    let (kp, qp) = (tok.k[..kd].as_ptr(), tok.q[..kd].as_ptr());
    let dv = S::splat(tok.decay);
    let write = !dst.is_null();
    // SAFETY: rows 0..4 and `k` hold `kd` elements (caller's contract).
    let mut a = unsafe { block_dots::<S, R, false>(src, kd, kp, std::ptr::null_mut()) };
    for b in 0..nblk {
        let r = 4 * b;
        prefetch_rows::<S, R>(src, r + AHEAD..(r + AHEAD + 4).min(rows), kd);
        let u = block_u::<S>(&a, &tok.v[r..], &tok.beta[r..], tok.decay);
        let blk = src.wrapping_add(r * kd);
        let wblk = if write { dst.wrapping_add(r * kd) } else { dst };
        // SAFETY: rows of blocks b (and b+1 when it exists) are in bounds and owned by this item
        // (caller's contract).
        let o = unsafe {
            if b + 1 < nblk {
                block_pass::<S, R, true>(blk, wblk, kd, [kp, qp], dv, u, &mut a)
            } else {
                block_pass::<S, R, false>(blk, wblk, kd, [kp, qp], dv, u, &mut a)
            }
        };
        for j in 0..4 {
            out[r + j] = o[j].reduce_add();
        }
    }
}

/// The update of one block of four rows in [`vk_blocks4`]: `x = e^g·S + u kᵀ` stored to `wblk`
/// (unless null), returns `o = Σ x·q` per row; with `NEXT`, `a` receives the dot products of the
/// next block's rows with `k` (else `a` is zeroed).
///
/// # Safety
/// Rows `blk + j·kd` and `wblk + j·kd` (unless null) for `j < 4`, and with `NEXT` the four rows
/// after `blk`, must be valid for `kd` elements (a multiple of 8), `kp`, `qp` for `kd` f32, and
/// be accessed by no other thread; `wblk` may equal `blk` and must not overlap it otherwise.
#[inline(always)]
unsafe fn block_pass<S: Simd, R: Real, const NEXT: bool>(
    blk: *const R,
    wblk: *mut R,
    kd: usize,
    [kp, qp]: [*const f32; 2],
    dv: S,
    u: [S; 4],
    a: &mut [S; 4],
) -> [S; 4] {
    let write = !wblk.is_null();
    let next = blk.wrapping_add(4 * kd);
    let mut o = [S::splat(0.0); 4];
    *a = [S::splat(0.0); 4];
    let mut c = 0;
    while c < kd {
        // SAFETY: `c + 8 ≤ kd`: inside the rows of this block (source and destination), of the
        // next one when `NEXT`, `k` and `q`; each element of this block is read before it is
        // written, and the next block is only read (caller's contract).
        unsafe {
            let (kk, qq) = (ld::<S, f32>(kp.add(c)), ld::<S, f32>(qp.add(c)));
            for j in 0..4 {
                let x = ld::<S, R>(blk.add(j * kd + c)).mul_add(dv, u[j].mul(kk));
                if write {
                    st::<S, R>(x, wblk.add(j * kd + c));
                }
                o[j] = x.mul_add(qq, o[j]);
                if NEXT {
                    a[j] = ld::<S, R>(next.add(j * kd + c)).mul_add(kk, a[j]);
                }
            }
        }
        c += LANES;
    }
    o
}

/// The inputs of a multi-token step straight from memory ([`decode_vk_multi`],
/// [`decode_kv_multi`]): the pool `base`, the source head at element `src_off`, per token the
/// destination head's element offset (`None`: not stored), the head's `kd × vd` extents, per
/// token `[q (kp) | k (kp) | v (vd) | beta (vd)]` (q, k normalised) in `toks` and `e^g` in `decays`.
#[derive(Clone, Copy)]
pub(super) struct MultiStep<'a> {
    pub(super) base: SharedBuf<u8>,
    pub(super) src_off: usize,
    pub(super) dsts: &'a [Option<usize>],
    pub(super) kd: usize,
    pub(super) vd: usize,
    pub(super) toks: &'a [f32],
    pub(super) decays: &'a [f32],
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
#[inline(always)]
pub(super) unsafe fn decode_vk_multi<S: Simd, R: Real>(step: MultiStep<'_>, outs: &mut [f32], buf: &mut [f32]) {
    let MultiStep { base, src_off, dsts, kd, vd, toks, decays } = step;
    const AHEAD: usize = 4;
    let nt = dsts.len();
    let kp = round8(kd);
    let stride = 2 * kp + 2 * vd;
    let src = base.elems::<R>(src_off, vd * kd);
    let bp = buf[..4 * kd].as_mut_ptr();
    // Streaming stores need every 8-lane chunk aligned to its size: true when the pool and each
    // destination head start aligned and rows are whole multiples of 8 elements.
    let lane_bytes = LANES * std::mem::size_of::<R>();
    let aligned = dsts.iter().flatten().all(|&off| (base.elems::<R>(off, vd * kd) as usize).is_multiple_of(lane_bytes));
    let mut r0 = 0;
    while r0 < vd {
        prefetch_rows::<S, R>(src, r0 + AHEAD..(r0 + AHEAD + 4).min(vd), kd);
        // Read the block once into `buf`, with the dots for token 0.
        let kp0 = toks[kp..kp + kd].as_ptr();
        // SAFETY: rows r0..r0+4 of the source head and `buf` hold `kd` elements each (caller's
        // contract); the source is only read here.
        let mut a = unsafe { block_dots::<S, R, true>(src.wrapping_add(r0 * kd), kd, kp0, bp) };
        for t in 0..nt {
            let tk = &toks[t * stride..(t + 1) * stride];
            let (qp, kt) = (tk[..kd].as_ptr(), tk[kp..kp + kd].as_ptr());
            let (vt, bt) = (&tk[2 * kp..2 * kp + vd], &tk[2 * kp + vd..2 * kp + 2 * vd]);
            let decay = decays[t];
            let dv = S::splat(decay);
            let u = block_u::<S>(&a, &vt[r0..], &bt[r0..], decay);
            let dst = dsts[t].map(|off| base.elems::<R>(off + r0 * kd, 4 * kd));
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

/// Several tokens on a K-major head straight from memory (`vd` a multiple of `8G`): per block of
/// `8G` value columns (one cache line of each f32 row with `G = 2`), the block is read once into
/// `buf` (`kd × 8G` f32, in L1) with the dots `Sᵀk` of token 0, prefetched [`AHEAD_KV`] rows
/// ahead; then every token updates the block in one fused pass that stores each row to that
/// token's destination (if any), accumulates its outputs and already the dots with the next
/// token's key. The same operations in the same order as the tile path's `step_kv` (its two
/// passes per token; bit for bit), with the state read once and written once per destination.
/// Arguments as [`decode_vk_multi`]'s; `buf` holds `kd · 8G` f32.
///
/// # Safety
/// As [`decode_vk_multi`].
#[inline(always)]
pub(super) unsafe fn decode_kv_multi<S: Simd, R: Real, const G: usize>(
    step: MultiStep<'_>,
    outs: &mut [f32],
    buf: &mut [f32],
) {
    let MultiStep { base, src_off, dsts, kd, vd, toks, decays } = step;
    let (nt, kp, w) = (dsts.len(), round8(kd), G * LANES);
    let stride = 2 * kp + 2 * vd;
    let src = base.elems::<R>(src_off, vd * kd);
    let bp = buf[..kd * w].as_mut_ptr();
    // Streaming stores need every 8-lane chunk aligned to its size: true when each destination
    // head starts aligned (rows are whole multiples of 8 elements).
    let lane_bytes = LANES * std::mem::size_of::<R>();
    let aligned = dsts.iter().flatten().all(|&off| (base.elems::<R>(off, vd * kd) as usize).is_multiple_of(lane_bytes));
    let mut c0 = 0;
    while c0 < vd {
        // Read the block once into `buf`, with the dots for token 0.
        let k0 = &toks[kp..kp + kd];
        let mut a = [S::splat(0.0); G];
        for (ki, &k0i) in k0.iter().enumerate() {
            let ahead = src.wrapping_add((ki + AHEAD_KV) * vd + c0).cast::<u8>();
            S::prefetch(ahead);
            S::prefetch(ahead.wrapping_add(w * std::mem::size_of::<R>() - 1));
            let kk = S::splat(k0i);
            for (j, aj) in a.iter_mut().enumerate() {
                // SAFETY: row ki, columns c0 + 8j.. + 8 of the source head (`c0 + 8G ≤ vd`) and
                // of `buf` (`kd · 8G` f32) are in bounds (caller's contract); the source is only
                // read here.
                unsafe {
                    let s = ld::<S, R>(src.add(ki * vd + c0 + j * LANES));
                    st::<S, f32>(s, bp.add(ki * w + j * LANES));
                    *aj = s.mul_add(kk, *aj);
                }
            }
        }
        for t in 0..nt {
            let tk = &toks[t * stride..(t + 1) * stride];
            let (qt, kt) = (&tk[..kd], &tk[kp..kp + kd]);
            let (vt, bt) = (&tk[2 * kp..2 * kp + vd], &tk[2 * kp + vd..2 * kp + 2 * vd]);
            let dv = S::splat(decays[t]);
            let mut u = [S::splat(0.0); G];
            for (j, uj) in u.iter_mut().enumerate() {
                let at = c0 + j * LANES;
                *uj = S::load(&vt[at..]).sub(a[j].mul(dv)).mul(S::load(&bt[at..]));
            }
            let dst = dsts[t].map(|off| base.elems::<R>(off + c0, (kd - 1) * vd + w));
            // A destination other than the source head is write-only here: stream it.
            let stream = dsts[t].is_some_and(|off| off != src_off) && aligned;
            let next = (t + 1 < nt).then(|| &toks[(t + 1) * stride + kp..(t + 1) * stride + kp + kd]);
            let mut o = [S::splat(0.0); G];
            a = [S::splat(0.0); G];
            for ki in 0..kd {
                let (kk, qq) = (S::splat(kt[ki]), S::splat(qt[ki]));
                let kn = next.map_or(S::splat(0.0), |kn| S::splat(kn[ki]));
                for j in 0..G {
                    // SAFETY: as above, inside `buf` and the destination head's rows (caller's
                    // contract), aligned to the chunk when streaming (checked above).
                    unsafe {
                        let x = ld::<S, f32>(bp.add(ki * w + j * LANES)).mul_add(dv, u[j].mul(kk));
                        st::<S, f32>(x, bp.add(ki * w + j * LANES));
                        if let Some(d) = dst {
                            if stream {
                                R::stream::<S>(x, d.add(ki * vd + j * LANES));
                            } else {
                                st::<S, R>(x, d.add(ki * vd + j * LANES));
                            }
                        }
                        o[j] = x.mul_add(qq, o[j]);
                        if next.is_some() {
                            a[j] = x.mul_add(kn, a[j]);
                        }
                    }
                }
            }
            for (j, oj) in o.iter().enumerate() {
                oj.store(&mut outs[t * vd + c0 + j * LANES..]);
            }
        }
        c0 += w;
    }
    S::store_fence();
}

/// How many rows ahead [`decode_kv_multi`] prefetches the block it reads.
const AHEAD_KV: usize = 8;

/// One token on a V-major head straight from memory: each row of `S` is read once (and again
/// from L1), updated in f32 and written once — one streaming pass over the state. Rows go in
/// pipelined blocks of four when `kd` is a multiple of 8 ([`vk_blocks4`]), the rest one by one.
///
/// # Safety
/// `vd` rows of `kd` elements at `head.src` (and at `head.dst` unless null) must be valid and
/// accessed by no other thread now; `head.dst` may equal `head.src` and must not overlap it
/// otherwise.
#[inline(always)]
pub(super) unsafe fn decode_vk_direct<S: Simd, R: Real>(head: HeadRows<R>, tok: Token<'_>, out: &mut [f32]) {
    let HeadRows { src: rows, dst: dst_rows, kd, vd } = head;
    let Token { q, k, decay, v, beta } = tok;
    let nblk = if kd.is_multiple_of(LANES) { vd / 4 } else { 0 };
    if nblk > 0 {
        // SAFETY: rows 0..4·nblk are in bounds and owned by this item (caller's contract).
        unsafe { vk_blocks4::<S, R>(rows, dst_rows, kd, nblk, tok, out) };
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
/// `r` is scratch (`r`, then `u`), `out` receives `o`.
///
/// # Safety
/// `kd·vd` elements at `rows.src` (and at `rows.dst` unless null) must be valid and accessed by
/// no other thread now; `rows.dst` may equal `rows.src` and must not overlap it otherwise; `vd` is
/// a multiple of 8; `q`, `k` hold `kd`, `v`, `beta`, `r`, `out` hold `vd` elements.
#[inline(always)]
pub(super) unsafe fn decode_kv_direct<S: Simd, R: Real>(
    rows: HeadRows<R>,
    tok: Token<'_>,
    r: &mut [f32],
    out: &mut [f32],
) {
    const AHEAD: usize = 8;
    let HeadRows { src: head, dst: dst_head, kd, vd } = rows;
    let Token { q, k, decay, v, beta } = tok;
    let (pp, rp) = (out[..vd].as_mut_ptr(), r[..vd].as_mut_ptr());
    out[..vd].fill(0.0);
    r[..vd].fill(0.0);
    let mut ki = 0;
    while ki < kd {
        // Four rows at a time (one load and store of each running sum per four rows), then one.
        let n = if ki + 4 <= kd { 4 } else { 1 };
        prefetch_rows::<S, R>(head, ki + AHEAD..(ki + AHEAD + n).min(kd), vd);
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
        S::load(&r[c..]).mul(dv).add(kqv.mul(u)).store(&mut out[c..]);
        u.store(&mut r[c..]);
        c += LANES;
    }
    if dst_head.is_null() {
        return;
    }
    let up = r[..vd].as_ptr();
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
