//! Mamba2 SSD chunked prefill on the CPU: vLLM's five stages (semantics/ssd_mamba2.md §1.1,
//! §2.3–§2.7) over a caller-owned f32 scratch laid out by [`SsdPlan::scratch`].
//!
//! 1. per (chunk, head): processed dt (`dt_out`, zero past the chunk's end) and its
//!    `A`-scaled inclusive prefix sum (`dA_cumsum`); then the chunk's own state
//!    `Σ_i exp(dA_last − dA_i)·dt_i·x_i ⊗ B_i` (stage 2);
//!    per (chunk, group): `CB[i, j] = C_i·B_j` for `j ≤ i` (stage 4) — one parallel pass;
//! 2. per (sequence, head): state passing, `S_end[c] = exp(dA_last[c])·S_in[c] + states[c]`
//!    in place, with `S_in` the initial state (or zeros) where `seq_idx` changes, and the
//!    returned states rounded to the state dtype (stage 3);
//! 3. per (chunk, head): outputs `exp(dA_i)·C_i·S_in + Σ_{j≤i} CB_ij·exp(dA_i − dA_j)·dt_j·x_j
//!    + D·x_i`, gated (stage 5);
//! 4. per (sequence, head): the final state (the scratch's end state of the sequence's last
//!    chunk, or the entering state of an empty sequence) into `varlen_states` and into its
//!    `ssm_state` slot, and its checkpoint (the end state of the chunk it names) into its slot.
//!
//! Initial states are read in passes 2 and 3 and final states written only in pass 4, so with
//! one `ssm_state` pool read and written in place every read of an initial state precedes
//! every write of a final state; within pass 4, an item reads (for an empty sequence) only its
//! own sequence's slot, which the plan's aliasing rule keeps away from other sequences' writes.
//!
//! Everything is f32 (no intermediate bf16 rounding, unlike the Triton kernels, so results
//! are closer to the f64 recurrence); inner loops run on eight lanes over `dstate`, `dim` or
//! the chunk's token axis, and stage 2's `xᵀ·(w ⊙ B)` and stage 5's `C·S_inᵀ` and
//! `(CB ⊙ decay)·x` are register-tiled products ([`crate::gemm`]) of the chunk's widened rows.

use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, ScratchLayout, SsdPlan, StateSource};
use ssm_tensor::{DType, Planned, Run, Strided};

use crate::gemm::{Operands, gemm};
use crate::host::{MambaInputs, host_opt, host_ref, host_shared, rd, rd_int, rd_shared};
use crate::lanes::{gather, prefetch_row, round8, scal, scatter, softplus_lanes, transpose};
use crate::shared::{ItemOp, Scratch, SharedBuf};
use crate::simd::{LANES, PowTwo, Simd};
use crate::{CpuBackend, CpuError, require_host};

/// Host bytes and dtypes of every input, read by all stages.
struct Inputs<'a> {
    mamba: MambaInputs<'a>,
    d: Option<(&'a [u8], DType)>,
    z: Option<&'a [u8]>,
    dt_bias: Option<(&'a [u8], DType)>,
    init: Option<(&'a [u8], DType)>,
    init_idx: Option<&'a [u8]>,
    has_init: Option<&'a [u8]>,
    final_idx: Option<&'a [u8]>,
    ck_chunk: Option<&'a [u8]>,
    ck_slot: Option<&'a [u8]>,
    cu_chunk: (&'a [u8], DType),
    seq_idx: (&'a [u8], DType),
    last_chunk: (&'a [u8], DType),
    a_dtype: DType,
}

struct Ctx<'a> {
    p: &'a SsdPlan,
    w: ScratchLayout,
    inp: Inputs<'a>,
    ws: SharedBuf<f32>,
    out: Option<SharedBuf<u8>>,
    states_out: Option<SharedBuf<u8>>,
    pool: Option<SharedBuf<u8>>,
}

impl Ctx<'_> {
    fn chunk(&self, c: usize) -> (usize, usize) {
        let (b, t) = self.inp.cu_chunk;
        let s = rd_int(b, t, self.p.cu_chunk_seqlens.at([c])) as usize;
        let e = rd_int(b, t, self.p.cu_chunk_seqlens.at([c + 1])) as usize;
        (s, e)
    }
    fn seq(&self, c: usize) -> usize {
        let (b, t) = self.inp.seq_idx;
        rd_int(b, t, self.p.seq_idx.at([c])) as usize
    }
    fn opens(&self, c: usize) -> bool {
        c == 0 || self.seq(c) != self.seq(c - 1)
    }
    fn last_chunk(&self, b: usize) -> i64 {
        let (bytes, t) = self.inp.last_chunk;
        rd_int(bytes, t, self.p.last_chunk_indices.at([b]))
    }
    /// A scratch slice.
    ///
    /// # Safety
    /// `off..off + len` must be inside the scratch and not written by another thread now.
    #[allow(clippy::mut_from_ref)]
    unsafe fn ws(&self, off: usize, len: usize) -> &mut [f32] {
        // SAFETY: by the caller's contract.
        unsafe { self.ws.slice_mut(off, len) }
    }
    fn dt_row_off(&self, c: usize, h: usize) -> usize {
        (c * self.p.heads + h) * self.w.q_row
    }
    fn state_off(&self, c: usize, h: usize) -> usize {
        self.w.states + (c * self.p.heads + h) * self.p.dim * self.w.state_row
    }
    fn cb_off(&self, c: usize, g: usize) -> usize {
        self.w.cb + (c * self.p.groups + g) * self.p.chunk_rows * self.w.q_row
    }
    /// Widens `rows` consecutive tokens of a `[T, i, j]` tensor at `(first, i)` into
    /// `dst` rows of `row` elements (zero tails).
    #[inline(always)]
    fn widen<S: Simd>(
        &self,
        bytes: &[u8],
        dtype: DType,
        s: Strided<3>,
        first: usize,
        rows: usize,
        i: usize,
        n: usize,
        row: usize,
        dst: &mut [f32],
    ) {
        // Token rows lie a whole `[i, j]` plane apart: fetch a few rows ahead.
        const AHEAD: usize = 8;
        for r in 0..rows {
            if r + AHEAD < rows {
                prefetch_row::<S>(bytes.as_ptr(), dtype, s.at([first + r + AHEAD, i, 0]), n);
            }
            let d = &mut dst[r * row..(r + 1) * row];
            gather::<S>(bytes, dtype, s.at([first + r, i, 0]), s.strides[2], &mut d[..n]);
            d[n..].fill(0.0);
        }
    }
}

/// The passes of the prefill, in order, each over its own work items.
#[derive(Clone, Copy)]
enum Pass {
    /// Stages 1, 2 and 4: [`chunk_item`].
    Chunks,
    /// Stage 3: [`pass_item`].
    States,
    /// Stage 5: [`scan_item`].
    Scan,
    /// The final states: [`final_item`].
    Final,
}

/// One pass over the call's context.
struct PassRun<'a> {
    ctx: &'a Ctx<'a>,
    pass: Pass,
}

impl ItemOp for PassRun<'_> {
    #[inline(always)]
    fn run_item<S: Simd + PowTwo>(&self, item: usize, scratch: &mut Scratch<'_>) {
        match self.pass {
            Pass::Chunks => chunk_item::<S>(self.ctx, item, scratch),
            Pass::States => pass_item::<S>(self.ctx, item, scratch),
            Pass::Scan => scan_item::<S>(self.ctx, item, scratch),
            Pass::Final => final_item::<S>(self.ctx, item, scratch),
        }
    }
}

/// Stage 1 + 2 for (chunk, head), or stage 4 for (chunk, group).
#[inline(always)]
fn chunk_item<S: Simd + PowTwo>(ctx: &Ctx<'_>, item: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.p;
    let per_chunk = p.heads + p.groups;
    let (c, k) = (item / per_chunk, item % per_chunk);
    if k < p.heads { chunk_state::<S>(ctx, c, k, scratch) } else { chunk_cb::<S>(ctx, c, k - p.heads, scratch) }
}

#[inline(always)]
fn chunk_state<S: Simd + PowTwo>(ctx: &Ctx<'_>, c: usize, h: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.p;
    let inp = &ctx.inp;
    let (q_row, nr) = (ctx.w.q_row, ctx.w.state_row);
    let (s, e) = ctx.chunk(c);
    let len = e - s;
    let g = h / p.heads_per_group();
    // SAFETY: the dt_out / dA_cumsum rows and the states block of (c, h) belong to this item.
    let (dt_out, da, st) = unsafe {
        (
            ctx.ws(ctx.w.dt_out + ctx.dt_row_off(c, h), q_row),
            ctx.ws(ctx.w.da_cumsum + ctx.dt_row_off(c, h), q_row),
            ctx.ws(ctx.state_off(c, h), p.dim * nr),
        )
    };
    // Stage 1: dt processing (bias, softplus in lanes, clamp), zero padding, A-scaled cumsum.
    let a = rd(inp.mamba.a, inp.a_dtype, p.a.at([h]));
    let bias = inp.dt_bias.map(|(b, t)| rd(b, t, p.dt_bias.unwrap().at([h])));
    let (lo, hi) = p.dt_limit;
    gather::<S>(inp.mamba.dt, p.io_dtypes.dt, p.dt.at([s, h, 0]), p.dt.strides[0], &mut dt_out[..len]);
    dt_out[len..].fill(0.0);
    if bias.is_some() || p.dt_softplus {
        for j in (0..round8(len)).step_by(LANES) {
            let mut v = S::load(&dt_out[j..]);
            if let Some(b) = bias {
                v = v.add(S::splat(b));
            }
            if p.dt_softplus {
                v = softplus_lanes(v);
            }
            v.store(&mut dt_out[j..]);
        }
    }
    let mut cum = 0.0f32;
    for i in 0..q_row {
        let v = if i < len { dt_out[i].max(lo).min(hi) } else { 0.0 };
        dt_out[i] = v;
        cum += a * v;
        da[i] = cum;
    }
    // Stage 2: the chunk's own state decayed to the chunk's end, `st[pp][n] = Σ_i x_i[pp]·w_i·B_i[n]`
    // with `w_i = e^{dA_last − dA_i}·dt_i`: a `[dim × len]·[len × dstate]` product of the
    // chunk's widened rows.
    let da_last = da[len.max(1) - 1];
    let pr = round8(p.dim);
    let (xs, rest) = scratch.take(len * (pr + nr) + q_row).split_at_mut(len * pr);
    let (bw, wts) = rest.split_at_mut(len * nr);
    ctx.widen::<S>(inp.mamba.x, p.io_dtypes.x, p.x, s, len, h, p.dim, pr, xs);
    ctx.widen::<S>(inp.mamba.b, p.io_dtypes.b, p.b, s, len, g, p.dstate, nr, bw);
    let (last, zero) = (S::splat(da_last), S::splat(0.0));
    for j in (0..q_row).step_by(LANES) {
        decay_v(last.sub(S::load(&da[j..])).min_(zero)).mul(S::load(&dt_out[j..])).store(&mut wts[j..]);
    }
    for i in 0..len {
        scal::<S>(&mut bw[i * nr..(i + 1) * nr], wts[i]);
    }
    gemm::<S>(p.dim, nr, Operands::transposed(len, xs, pr, bw, nr).assign(), st, nr);
}

#[inline(always)]
fn chunk_cb<S: Simd + PowTwo>(ctx: &Ctx<'_>, c: usize, g: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.p;
    let (q_row, nr) = (ctx.w.q_row, ctx.w.state_row);
    let (s, e) = ctx.chunk(c);
    let len = e - s;
    // SAFETY: the CB block of (c, g) belongs to this item.
    let cb = unsafe { ctx.ws(ctx.cb_off(c, g), p.chunk_rows * q_row) };
    let lp = round8(len);
    let (cs, rest) = scratch.take(2 * len * nr + p.dstate * lp).split_at_mut(len * nr);
    let (bs, bt) = rest.split_at_mut(len * nr);
    ctx.widen::<S>(ctx.inp.mamba.c, p.io_dtypes.c, p.c, s, len, g, p.dstate, nr, cs);
    ctx.widen::<S>(ctx.inp.mamba.b, p.io_dtypes.b, p.b, s, len, g, p.dstate, nr, bs);
    // `CB = C·Bᵀ` over `Bᵀ` (`[dstate × lp]`), in blocks of rows that stop at the block's
    // diagonal; the terms past each row's diagonal are then zeroed.
    transpose::<S>(bs, nr, len, p.dstate, bt, lp, lp);
    for i0 in (0..len).step_by(CB_ROWS) {
        let rows = CB_ROWS.min(len - i0);
        let ab = Operands::new(p.dstate, &cs[i0 * nr..], nr, bt, lp).assign();
        gemm::<S>(rows, round8(i0 + rows), ab, &mut cb[i0 * q_row..], q_row);
    }
    for i in 0..len {
        cb[i * q_row + i + 1..(i + 1) * q_row].fill(0.0);
    }
}

/// Rows of stage 4's `C·Bᵀ` per product: each block of rows computes the columns up to its
/// last row only.
const CB_ROWS: usize = 48;

/// Stage 3 for (sequence, head).
#[inline(always)]
fn pass_item<S: Simd + PowTwo>(ctx: &Ctx<'_>, item: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.p;
    let nr = ctx.w.state_row;
    let (b, h) = (item / p.heads, item % p.heads);
    let last = ctx.last_chunk(b);
    let per = p.dim * nr;
    let sin = scratch.take(per);
    {
        if last < 0 {
            // An empty sequence: its final state is written in the last pass.
            return;
        }
        load_init::<S>(ctx, b, h, sin);
        let last = last as usize;
        let mut first = last;
        while first > 0 && !ctx.opens(first) {
            first -= 1;
        }
        for c in first..=last {
            // SAFETY: the states blocks of this sequence's chunks, head h, belong to this item.
            let st = unsafe { ctx.ws(ctx.state_off(c, h), per) };
            let da_last = {
                // SAFETY: dA_cumsum is only read in this stage.
                let da = unsafe { ctx.ws(ctx.w.da_cumsum + ctx.dt_row_off(c, h), ctx.w.q_row) };
                decay(da[p.chunk_rows - 1])
            };
            let decay = S::splat(da_last);
            for i in (0..per).step_by(LANES) {
                let v = S::load(&sin[i..]).mul_add(decay, S::load(&st[i..]));
                v.store(&mut st[i..]);
                v.store(&mut sin[i..]);
            }
            if p.return_intermediate_states
                && let (Some(dst), Some(at)) = (ctx.states_out, p.varlen_states)
            {
                // SAFETY: row `c`, head `h` of `varlen_states` is written by this item only.
                unsafe { store_state::<S>(ctx, dst, at, c, h, st) };
            }
        }
    }
}

/// The last pass, for (sequence, head): the final state into `varlen_states[b, h]` (without
/// intermediate states) and into `ssm_state[final_state_indices[b], h]`, and the checkpoint
/// chunk's end state into `ssm_state[checkpoint_state_indices[b], h]`.
#[inline(always)]
fn final_item<S: Simd>(ctx: &Ctx<'_>, item: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.p;
    let per = p.dim * ctx.w.state_row;
    let (b, h) = (item / p.heads, item % p.heads);
    if let (Some(pool), Some(at), Some((chunk, slot))) =
        (ctx.pool, p.ssm_state, p.checkpoint(ctx.inp.ck_chunk, ctx.inp.ck_slot, b))
    {
        // SAFETY: stage 3 is done, the scratch is only read from here on; slot `slot` is
        // written by sequence `b` alone (its checkpoint, never its final slot) and read by no
        // other sequence (the plan's aliasing rule); head `h` of it by this item only.
        unsafe { store_state::<S>(ctx, pool, at, slot, h, &*ctx.ws(ctx.state_off(chunk, h), per)) };
    }
    let slot = p.final_slot(ctx.inp.final_idx, b);
    let returned = ctx.states_out.zip(p.varlen_states).filter(|_| !p.return_intermediate_states);
    let pooled = ctx.pool.zip(p.ssm_state).zip(slot);
    if returned.is_none() && pooled.is_none() {
        return;
    }
    let last = ctx.last_chunk(b);
    let fin: &[f32] = if last < 0 {
        // An empty sequence returns the state it entered with.
        let sin = scratch.take(per);
        load_init::<S>(ctx, b, h, sin);
        sin
    } else {
        // SAFETY: stage 3 is done; the scratch is only read from here on.
        unsafe { &*ctx.ws(ctx.state_off(last as usize, h), per) }
    };
    if let Some((dst, at)) = returned {
        // SAFETY: row `b`, head `h` of `varlen_states` is written by this item only.
        unsafe { store_state::<S>(ctx, dst, at, b, h, fin) };
    }
    if let Some(((dst, at), slot)) = pooled {
        // SAFETY: slot `slot` is written by sequence `b` alone and read by no other sequence
        // (the plan's aliasing rule); head `h` of it by this item only.
        unsafe { store_state::<S>(ctx, dst, at, slot, h, fin) };
    }
}

/// The state entering sequence `b`, head `h` (its initial state, its `ssm_state` slot, or
/// zeros), as padded f32 rows.
#[inline(always)]
fn load_init<S: Simd>(ctx: &Ctx<'_>, b: usize, h: usize, dst: &mut [f32]) {
    let p = ctx.p;
    let nr = ctx.w.state_row;
    dst.fill(0.0);
    match p.initial_source(ctx.inp.init_idx, ctx.inp.has_init, b) {
        Some(StateSource::InitialStates(row)) => {
            if let (Some((bytes, t)), Some(ip)) = (ctx.inp.init, p.initial_states) {
                for pp in 0..p.dim {
                    let d = &mut dst[pp * nr..pp * nr + p.dstate];
                    gather::<S>(bytes, t, ip.at([row, h, pp, 0]), ip.strides[3], d);
                }
            }
        }
        Some(StateSource::Pool(slot)) => {
            if let (Some(pool), Some(sp)) = (ctx.pool, p.ssm_state) {
                let (t, size) = (p.state_dtype, p.state_dtype.size());
                for pp in 0..p.dim {
                    let d = &mut dst[pp * nr..pp * nr + p.dstate];
                    let at = sp.at([slot, h, pp, 0]);
                    if sp.strides[3] == 1 {
                        // SAFETY: the plan checked the slot and `ssm_state`'s shape, so the row's
                        // bytes lie in the pool; pool slots are written only in the last pass,
                        // after every read of this one, so nothing writes them now.
                        let row = unsafe {
                            std::slice::from_raw_parts(pool.elems::<u8>(at * size, d.len() * size), d.len() * size)
                        };
                        gather::<S>(row, t, 0, 1, d);
                    } else {
                        for (n, v) in d.iter_mut().enumerate() {
                            // SAFETY: as above, element by element.
                            *v = unsafe { rd_shared(pool, t, sp.at([slot, h, pp, n])) };
                        }
                    }
                }
            }
        }
        None => {}
    }
}

/// Stores padded f32 rows as `dst[row, h]` (`varlen_states` or `ssm_state`, addressed by
/// `at`), rounded to the state dtype.
///
/// # Safety
/// `at` must address `dst` as the plan checked it, and row `row`, head `h` of `dst` must be
/// accessed by no other thread now.
#[inline(always)]
unsafe fn store_state<S: Simd>(ctx: &Ctx<'_>, dst: SharedBuf<u8>, at: Strided<4>, row: usize, h: usize, src: &[f32]) {
    let p = ctx.p;
    let nr = ctx.w.state_row;
    for pp in 0..p.dim {
        // SAFETY: in bounds and exclusive (caller's contract).
        unsafe {
            scatter::<S>(dst, p.state_dtype, at.at([row, h, pp, 0]), at.strides[3], &src[pp * nr..pp * nr + p.dstate])
        };
    }
}

/// Stage 5 for (chunk, head).
#[inline(always)]
fn scan_item<S: Simd + PowTwo>(ctx: &Ctx<'_>, item: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.p;
    let inp = &ctx.inp;
    let (q_row, nr) = (ctx.w.q_row, ctx.w.state_row);
    let (c, h) = (item / p.heads, item % p.heads);
    let g = h / p.heads_per_group();
    let (s, e) = ctx.chunk(c);
    let len = e - s;
    let pr = round8(p.dim);
    let per = p.dim * nr;
    // SAFETY: stages 1–4 are done; this stage only reads the scratch.
    let (dt_out, da, cb) = unsafe {
        (
            &*ctx.ws(ctx.w.dt_out + ctx.dt_row_off(c, h), q_row),
            &*ctx.ws(ctx.w.da_cumsum + ctx.dt_row_off(c, h), q_row),
            &*ctx.ws(ctx.cb_off(c, g), p.chunk_rows * q_row),
        )
    };
    let opens = ctx.opens(c);
    let has_prev = !opens || p.initial_states.is_some() || p.initial_state_indices.is_some();
    let buf = scratch.take(scan_scratch(p, &ctx.w));
    let (xs, rest) = buf.split_at_mut(len * pr);
    let (cs, rest) = rest.split_at_mut(len * nr);
    let (ys, rest) = rest.split_at_mut(len * pr);
    let (wm, rest) = rest.split_at_mut(len * q_row);
    let (sin_buf, rest) = rest.split_at_mut(per);
    let (sin_t, rest) = rest.split_at_mut(p.dstate * pr);
    let (dvec, rest) = rest.split_at_mut(pr);
    let (zrow, fact) = rest.split_at_mut(pr);
    ctx.widen::<S>(inp.mamba.x, p.io_dtypes.x, p.x, s, len, h, p.dim, pr, xs);
    // Off-diagonal: the entering state seen through C, decayed to each token:
    // `y_i = e^{dA_i}·C_i·S_inᵀ`, a `[len × dstate]·[dstate × dim]` product.
    if has_prev {
        ctx.widen::<S>(inp.mamba.c, p.io_dtypes.c, p.c, s, len, g, p.dstate, nr, cs);
        let sin: &[f32] = if opens {
            load_init::<S>(ctx, ctx.seq(c), h, sin_buf);
            sin_buf
        } else {
            // SAFETY: read only in this stage.
            unsafe { &*ctx.ws(ctx.state_off(c - 1, h), per) }
        };
        transpose::<S>(sin, nr, p.dim, p.dstate, sin_t, pr, pr);
        gemm::<S>(len, pr, Operands::new(p.dstate, cs, nr, sin_t, pr).assign(), ys, pr);
        // Each row's decay, in lanes (`fact` is free until `diag_weights` fills it).
        let dec = &mut fact[..q_row];
        for j in (0..q_row).step_by(LANES) {
            decay_v(S::load(&da[j..])).store(&mut dec[j..]);
        }
        for i in 0..len {
            scal::<S>(&mut ys[i * pr..(i + 1) * pr], dec[i]);
        }
    }
    // Diagonal block: `y_i += Σ_{j≤i} CB_ij·e^{min(dA_i − dA_j, 0)}·dt_j·x_j`, a lower-triangular
    // `[len × len]·[len × dim]` product (the weights past the diagonal stored as zeros).
    diag_weights::<S>(len, q_row, da, dt_out, cb, wm, fact);
    let diag = Operands::new(len, wm, q_row, xs, pr).lower();
    gemm::<S>(len, pr, if has_prev { diag } else { diag.assign() }, ys, pr);
    // `D·x`, the gate `z·σ(z)`, the output row.
    let out = ctx.out.expect("stage 5 runs only with an output");
    let out_dtype = p.io_dtypes.out.expect("output dtype");
    let op = p.out.expect("output strides");
    let d = inp.d.zip(p.d);
    if let Some(((bytes, t), dp)) = d {
        for (pp, v) in dvec.iter_mut().enumerate() {
            *v = if pp < p.dim { rd(bytes, t, dp.at([h, pp, 0])) } else { 0.0 };
        }
    }
    let z = inp.z.zip(p.z).zip(p.io_dtypes.z);
    for i in 0..len {
        if i + TAIL_AHEAD < len {
            if let Some(((bytes, zp), zt)) = z {
                prefetch_row::<S>(bytes.as_ptr(), zt, zp.at([s + i + TAIL_AHEAD, h, 0]), p.dim);
            }
            // The lines of a row of unit stride (the layout vLLM passes; a hint only).
            prefetch_row::<S>(out.elems::<u8>(0, 0), out_dtype, op.at([s + i + TAIL_AHEAD, h, 0]), p.dim);
        }
        let (xi, yi) = (&xs[i * pr..(i + 1) * pr], &mut ys[i * pr..(i + 1) * pr]);
        if d.is_some() {
            for k in (0..pr).step_by(LANES) {
                S::load(&dvec[k..]).mul_add(S::load(&xi[k..]), S::load(&yi[k..])).store(&mut yi[k..]);
            }
        }
        if let Some(((bytes, zp), zt)) = z {
            gather::<S>(bytes, zt, zp.at([s + i, h, 0]), zp.strides[2], &mut zrow[..p.dim]);
            zrow[p.dim..].fill(0.0);
            for k in (0..pr).step_by(LANES) {
                S::load(&yi[k..]).mul(S::load(&zrow[k..]).silu()).store(&mut yi[k..]);
            }
        }
        // SAFETY: the plan checked `out`'s shape and that its elements do not overlap; token
        // s+i, head h is written by this (chunk, head) item only.
        unsafe { scatter::<S>(out, out_dtype, op.at([s + i, h, 0]), op.strides[2], &yi[..p.dim]) };
    }
}

/// Token rows ahead of the one being finished whose `z` and output rows stage 5 prefetches.
const TAIL_AHEAD: usize = 8;

/// f32 scratch of one stage-5 item: x, C and output rows, the diagonal block's weights, an
/// entering state and its transpose, `D`, a `z` row and [`diag_weights`]' factors.
fn scan_scratch(p: &SsdPlan, w: &ScratchLayout) -> usize {
    let (len, nr, pr) = (p.chunk_rows, w.state_row, round8(p.dim));
    len * (2 * pr + nr + w.q_row) + p.dim * nr + p.dstate * pr + 2 * pr + fact_len(w.q_row)
}

/// The exponent below which a decay `e^x` of the prefill is taken as 0: `ln 2^-100`.
///
/// Long chunks of fast-decaying heads reach decays of `e^-100` and less. Their products with
/// `dt`, `B` or `CB` then fall below `f32::MIN_POSITIVE`, and every product instruction with a
/// subnormal result or operand takes a microcode assist on Intel cores: the SSD prefill of 2048
/// tokens in one sequence ran 7× slower there (470 ms against 70 ms with the flush-to-zero mode
/// on, Xeon, 2 threads). A decay below `2^-100` scales its term to less than `2^-76` of the
/// term's own `x`, invisible in an f32 output unless that output is itself below about
/// `1e-23`; vLLM's GPU kernels flush the same decays (`ex2.approx.ftz`) below `2^-126`.
pub(crate) const DECAY_FLOOR: f32 = -69.314_72;

/// `e^x`, or 0 for `x < DECAY_FLOOR` (NaN stays NaN).
#[inline(always)]
fn decay(x: f32) -> f32 {
    if x < DECAY_FLOOR { 0.0 } else { x.exp() }
}

/// [`decay`] in lanes: the exponent clamped at the floor before `exp` (no subnormal inside it),
/// the lanes below the floor then zeroed.
#[inline(always)]
fn decay_v<S: Simd + PowTwo>(x: S) -> S {
    let floor = S::splat(DECAY_FLOOR);
    floor.max(x).exp().zero_where_lt(x, floor)
}

/// f32 of [`diag_weights`]' factors for chunk rows of `q_row`: one per column, and two per
/// block of eight columns (padded to whole lanes).
fn fact_len(q_row: usize) -> usize {
    q_row + 2 * round8(q_row / LANES)
}

/// The weights of stage 5's diagonal block, `W_ij = CB_ij·e^{min(dA_i − dA_j, 0)}·dt_j` for
/// `j ≤ i` and 0 past the diagonal, as `len` rows of `q_row` (`fact`: [`fact_len`] elements).
///
/// Where `dA` does not increase along the chunk (`A·dt ≤ 0`, every real model), the decay of a
/// block of eight columns `J` lying wholly at or before row `i` factors through the block's last
/// column `l`: `e^{dA_i − dA_j} = e^{dA_i − dA_l}·e^{dA_l − dA_j}`, both factors at most 1 (no
/// overflow), the second shared by every row. A row then costs one vector `exp` per eight such
/// blocks plus one for the block holding its diagonal, instead of one per block. Otherwise (or
/// with a NaN) every block takes the direct `exp` of the clamped difference.
#[inline(always)]
fn diag_weights<S: Simd + PowTwo>(
    len: usize,
    q_row: usize,
    da: &[f32],
    dt: &[f32],
    cb: &[f32],
    wm: &mut [f32],
    fact: &mut [f32],
) {
    let nb = q_row / LANES;
    let (g, rest) = fact.split_at_mut(q_row);
    let (last, f) = rest.split_at_mut(round8(nb));
    let monotone = (1..len).all(|i| da[i] <= da[i - 1]);
    if monotone {
        for jb in 0..nb {
            let l = da[jb * LANES + LANES - 1];
            last[jb] = l;
            let j = jb * LANES;
            decay_v(S::splat(l).sub(S::load(&da[j..]))).mul(S::load(&dt[j..])).store(&mut g[j..]);
        }
        last[nb..].fill(0.0);
    }
    for i in 0..len {
        let dai = S::splat(da[i]);
        let cbi = &cb[i * q_row..(i + 1) * q_row];
        let wi = &mut wm[i * q_row..(i + 1) * q_row];
        // Blocks wholly at or before row i (their last column ≤ i) take the factored decay.
        let full = if monotone { (i + 1) / LANES } else { 0 };
        for jb in (0..full).step_by(LANES) {
            decay_v(dai.sub(S::load(&last[jb..]))).store(&mut f[jb..]);
        }
        let floor = S::splat(DECAY_FLOOR);
        for jb in 0..full {
            let j = jb * LANES;
            // Both factors are at least e^DECAY_FLOOR where kept; the lanes whose whole decay is
            // below it are zeroed before the product, so that it cannot underflow.
            let gj = S::load(&g[j..]).zero_where_lt(dai.sub(S::load(&da[j..])), floor);
            S::splat(f[jb]).mul(gj).mul(S::load(&cbi[j..])).store(&mut wi[j..]);
        }
        for j in (full * LANES..round8(i + 1)).step_by(LANES) {
            let dec = decay_v(dai.sub(S::load(&da[j..])).min_(S::splat(0.0)));
            dec.mul(S::load(&dt[j..])).mul(S::load(&cbi[j..])).store(&mut wi[j..]);
        }
        wi[i + 1..].fill(0.0);
    }
}

/// f32 scratch of one item of any stage, from the plan's dimensions alone (the largest: stage 2's
/// x and weighted B rows of a chunk with the rows' weights, stage 4's C, B and Bᵀ rows, or stage 5's [`scan_scratch`]).
fn item_scratch(p: &SsdPlan, w: &ScratchLayout) -> usize {
    let (len, nr, pr) = (p.chunk_rows, w.state_row, round8(p.dim));
    (len * (pr + nr) + w.q_row).max(2 * len * nr + p.dstate * round8(len)).max(scan_scratch(p, w))
}

impl CpuBackend {
    /// Elements of f32 scratch a `mamba_chunk_scan_combined_varlen` call needs for
    /// `plan` (the size query; pass a buffer at least this long as `scratch` to avoid a
    /// per-call allocation).
    pub fn mamba_chunk_scan_combined_varlen_scratch_size(plan: &SsdPlan) -> usize {
        plan.scratch_len()
    }
}

impl Run<MambaChunkScanCombinedVarlenArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<MambaChunkScanCombinedVarlenArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        let inp = Inputs {
            mamba: MambaInputs::new([&args.x, &args.dt, &args.a, &args.b, &args.c])?,
            d: host_opt("D", &args.d)?,
            z: host_opt("z", &args.z)?.map(|(b, _)| b),
            dt_bias: host_opt("dt_bias", &args.dt_bias)?,
            init: host_opt("initial_states", &args.initial_states)?,
            init_idx: host_opt("initial_state_indices", &args.initial_state_indices)?.map(|(b, _)| b),
            has_init: host_opt("has_initial_state", &args.has_initial_state)?.map(|(b, _)| b),
            final_idx: host_opt("final_state_indices", &args.final_state_indices)?.map(|(b, _)| b),
            ck_chunk: host_opt("checkpoint_chunk_indices", &args.checkpoint_chunk_indices)?.map(|(b, _)| b),
            ck_slot: host_opt("checkpoint_state_indices", &args.checkpoint_state_indices)?.map(|(b, _)| b),
            cu_chunk: (host_ref("cu_chunk_seqlens", &args.cu_chunk_seqlens)?, args.cu_chunk_seqlens.dtype()),
            seq_idx: (host_ref("seq_idx", &args.seq_idx)?, args.seq_idx.dtype()),
            last_chunk: (host_ref("last_chunk_indices", &args.last_chunk_indices)?, args.last_chunk_indices.dtype()),
            a_dtype: args.a.dtype(),
        };
        let states_out = args.varlen_states.as_mut().map(|t| host_shared("varlen_states", t)).transpose()?;
        let pool = args.ssm_state.as_mut().map(|t| host_shared("ssm_state", t)).transpose()?;
        let out = match args.out.as_mut() {
            Some(o) => {
                require_host("out", o.device())?;
                Some(SharedBuf::new(o.host_bytes_mut().expect("host checked")))
            }
            None => None,
        };
        let w = plan.scratch();
        let mut owned = Vec::new();
        let ws: &mut [f32] = match (args.scratch.as_mut(), plan.scratch_offset) {
            (Some(t), Some(off)) => {
                let device = t.device();
                require_host("scratch", device)?;
                let all = t.host_data_mut::<f32>().map_err(|_| CpuError::NotHost { arg: "scratch", device })?;
                &mut all[off..off + w.len]
            }
            _ => {
                owned.resize(w.len, 0.0f32);
                &mut owned
            }
        };
        let ctx = Ctx { p: plan, w, inp, ws: SharedBuf::new(ws), out, states_out, pool };
        let ctx = &ctx;
        let per_item = item_scratch(plan, &w);
        let run = |pass, n| self.for_each_item(n, per_item, None, &PassRun { ctx, pass });
        // Stages 1, 2 (per chunk and head) and 4 (per chunk and group).
        run(Pass::Chunks, plan.nchunks * (plan.heads + plan.groups));
        // Stage 3 (per sequence and head).
        run(Pass::States, plan.batch * plan.heads);
        // Stage 5 (per chunk and head).
        if ctx.out.is_some() {
            run(Pass::Scan, plan.nchunks * plan.heads);
        }
        // Final states (per sequence and head), after every read of an initial state.
        run(Pass::Final, plan.batch * plan.heads);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Portable;

    /// The factored decay (non-increasing `dA`, steep enough that far blocks underflow) and the
    /// direct one (an increasing step) against `CB·e^{min(dA_i − dA_j, 0)}·dt` in f64.
    #[test]
    fn diag_weights_match_the_formula() {
        let (len, q_row) = (45, 48);
        // steep 3.0 reaches decays of e^-140, below DECAY_FLOOR and the normal range.
        for (steep, rising) in [(0.05f32, false), (3.0, false), (0.05, true)] {
            let dt: Vec<f32> = (0..q_row).map(|j| if j < len { 0.5 + (j % 7) as f32 * 0.1 } else { 0.0 }).collect();
            let mut da = vec![0.0f32; q_row];
            let mut cum = 0.0;
            for j in 0..q_row {
                cum += if rising && j == 20 { 0.7 } else { -steep * dt[j] };
                da[j] = cum;
            }
            let cb: Vec<f32> = (0..len * q_row)
                .map(|k| if k % q_row <= k / q_row { ((k * 31) % 17) as f32 / 9.0 - 0.8 } else { 0.0 })
                .collect();
            let mut wm = vec![f32::NAN; len * q_row];
            let mut fact = vec![f32::NAN; fact_len(q_row)];
            diag_weights::<Portable>(len, q_row, &da, &dt, &cb, &mut wm, &mut fact);
            for i in 0..len {
                for j in 0..q_row {
                    let want = if j <= i {
                        let dec = (f64::from(da[i]) - f64::from(da[j])).min(0.0).exp();
                        f64::from(cb[i * q_row + j]) * dec * f64::from(dt[j])
                    } else {
                        0.0
                    };
                    let got = f64::from(wm[i * q_row + j]);
                    assert!(
                        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "({i}, {j}) steep {steep} rising {rising}: {got} vs {want}"
                    );
                    // No subnormal weight (DECAY_FLOOR): zero where the decay is below the floor.
                    let w = wm[i * q_row + j];
                    assert!(w == 0.0 || w.abs() >= f32::MIN_POSITIVE, "({i}, {j}) steep {steep}: subnormal {w:e}");
                    if j <= i && f64::from(da[i]) - f64::from(da[j]) < f64::from(DECAY_FLOOR) - 1e-3 {
                        assert_eq!(w, 0.0, "({i}, {j}) steep {steep}: below the floor");
                    }
                }
            }
        }
    }
}
