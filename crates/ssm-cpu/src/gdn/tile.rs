//! The f32 tile path of the recurrent ops: a block of value rows of one head is loaded into a
//! stack tile (widened to f32), every token runs on it in L1/L2, and it is stored back to each
//! destination. Used where the direct paths do not apply (several tokens with `final_state`,
//! zero starts, K-major heads wider than a tile, mixed dtypes).

use ssm_gdn::StateLayout;
use ssm_gdn::plan::RecurrentPlan;

use super::Token;
use crate::lanes::{dot, round8};
use crate::shared::SharedBuf;
use crate::simd::{LANES, Real, Simd};

/// One block of value rows `v0..v0 + nv` of a head: where it lies in memory (element offset
/// `moff` in the head, row pitch `ld`, `rows × cols`) and in the tile (row pitch `tp`).
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub(super) nv: usize,
    pub(super) moff: usize,
    ld: usize,
    rows: usize,
    cols: usize,
    tp: usize,
}

impl Block {
    pub(super) fn new(p: &RecurrentPlan, v0: usize, nv: usize) -> Self {
        let (kd, vd) = (p.dims.k, p.dims.v);
        match p.layout {
            StateLayout::VK => Block { nv, moff: v0 * kd, ld: kd, rows: nv, cols: kd, tp: round8(kd) },
            StateLayout::KV => Block { nv, moff: v0, ld: vd, rows: kd, cols: nv, tp: round8(nv) },
        }
    }

    /// The tile elements the block fills.
    pub(super) fn tile_len(self) -> usize {
        self.rows * self.tp
    }
}

/// Loads the block (its first element at element `at` of `base`) into `tile`, widened to f32
/// and zero-padded to the tile's row pitch.
///
/// # Safety
/// The block's elements must lie in the buffer `base` and be written by no other thread now.
#[inline(always)]
pub(super) unsafe fn load_tile<S: Simd, R: Real>(base: SharedBuf<u8>, at: usize, blk: Block, tile: &mut [f32]) {
    let Block { ld, rows, cols, tp, .. } = blk;
    let full = cols / LANES * LANES;
    for r in 0..rows {
        // SAFETY: row `r` spans `cols` elements inside the buffer, read-only here (caller's contract).
        let src = unsafe { std::slice::from_raw_parts(base.elems::<R>(at + r * ld, cols), cols) };
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

/// Stores the tile back to the block at element `at` of `base` (rounding to nearest even); the
/// inverse of [`load_tile`]. `stream`: the destination is write-only (streaming stores where aligned).
///
/// # Safety
/// The block's elements must lie in the buffer `base` and be accessed by no other thread now.
#[inline(always)]
pub(super) unsafe fn store_tile<S: Simd, R: Real>(
    base: SharedBuf<u8>,
    at: usize,
    blk: Block,
    tile: &[f32],
    stream: bool,
) {
    let Block { ld, rows, cols, tp, .. } = blk;
    let full = cols / LANES * LANES;
    let lane_bytes = LANES * std::mem::size_of::<R>();
    let mut streamed = false;
    for r in 0..rows {
        let row = base.elems::<R>(at + r * ld, cols);
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

/// One token on a `[nv][kp]` tile of V-major rows: `S *= e^g; u = β(v − S k); S += u kᵀ; o = S q`.
#[inline(always)]
pub(super) fn step_vk<S: Simd>(tile: &mut [f32], nv: usize, kp: usize, tok: Token<'_>, out: &mut [f32]) {
    let Token { q, k, decay, v, beta } = tok;
    let dv = S::splat(decay);
    for r in 0..nv {
        let row = &mut tile[r * kp..(r + 1) * kp];
        let pred = dot::<S>(row, k) * decay;
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
fn step_kv_group<S: Simd, const G: usize>(
    tile: &mut [f32],
    kd: usize,
    cp: usize,
    c: usize,
    tok: Token<'_>,
    out: &mut [f32],
) {
    let Token { q, k, decay, v, beta } = tok;
    let dv = S::splat(decay);
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
pub(super) fn step_kv<S: Simd>(tile: &mut [f32], kd: usize, cp: usize, tok: Token<'_>, out: &mut [f32]) {
    let mut c = 0;
    while c + 4 * LANES <= cp {
        step_kv_group::<S, 4>(tile, kd, cp, c, tok, out);
        c += 4 * LANES;
    }
    while c < cp {
        step_kv_group::<S, 1>(tile, kd, cp, c, tok, out);
        c += LANES;
    }
}
