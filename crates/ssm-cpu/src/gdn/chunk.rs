//! The chunked prefill (semantics/gdn_conv.md §2.5): per (sequence, value head), chunks of
//! [`CHUNK_SIZE`] tokens in the WY/UT form with the state held K-major in f32 (see the module
//! doc of [`super`]). Scratch: one [`ChunkLayout`] region per worker, from the caller's `scratch`
//! when it is large enough (see [`ssm_gdn::ChunkScratch`]), else allocated once per call.

use ssm_gdn::plan::{ChunkPlan, ChunkStart, StateView};
use ssm_gdn::{CHUNK_SIZE, ChunkGatedDeltaRuleArgs, StateLayout};
use ssm_tensor::{DType, Planned, Run, TensorRef};

use super::{Io, normalize};
use crate::gemm::{Operands, gemm};
use crate::host::{host_opt, host_ref, rd};
use crate::lanes::{gather, prefetch_row, round8, scal, scatter, transpose};
use crate::shared::{ItemOp, Scratch, SharedBuf};
use crate::simd::{LANES, PowTwo, Simd};
use crate::{CpuBackend, CpuError, require_host};

/// Offsets (in f32 elements) of one worker's chunked-prefill scratch.
#[derive(Clone, Copy)]
struct ChunkLayout {
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

impl ChunkLayout {
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
        ChunkLayout { kp, vp, q, k, w, u, o, kdt, a, pm, gc, bt, len }
    }
}

struct ChunkCtx<'a> {
    plan: &'a ChunkPlan,
    io: Io<'a>,
    g: &'a [u8],
    beta: &'a [u8],
    ix: Option<TensorRef<'a>>,
    has: Option<TensorRef<'a>>,
    layout: ChunkLayout,
}

impl ItemOp for ChunkCtx<'_> {
    #[inline(always)]
    fn run_item<S: Simd + PowTwo>(&self, item: usize, scratch: &mut Scratch<'_>) {
        chunk_item::<S>(self, item, scratch.take(self.layout.len))
    }
}

/// Head `hv` of row `row` of a state tensor as stored: `kd·vd` elements of `dtype` from element
/// `off` of `base`, V-major or K-major.
#[derive(Clone, Copy)]
struct StoredHead {
    base: SharedBuf<u8>,
    dtype: DType,
    off: usize,
    layout: StateLayout,
    kd: usize,
    vd: usize,
}

impl StoredHead {
    fn new(base: SharedBuf<u8>, sv: &StateView, p: &ChunkPlan, row: usize, hv: usize) -> Self {
        let (kd, vd) = (p.dims.k, p.dims.v);
        StoredHead { base, dtype: sv.dtype, off: sv.head(row, hv, kd * vd), layout: p.layout, kd, vd }
    }

    /// Element offset (within the head) of entry (ki, 0) and the stride between its `vi`s.
    fn entry(self, ki: usize) -> (usize, isize) {
        match self.layout {
            StateLayout::VK => (ki, self.kd as isize),
            StateLayout::KV => (ki * self.vd, 1),
        }
    }

    /// Loads the head into the K-major f32 matrix `h` (`[kd][vp]`, zero-padded).
    ///
    /// # Safety
    /// The head must lie in `base` and be written by no other thread now.
    #[inline(always)]
    unsafe fn load<S: Simd>(self, h: &mut [f32]) {
        let (kd, vd, vp, size) = (self.kd, self.vd, round8(self.vd), self.dtype.size());
        // SAFETY: the head block (kd·vd elements from `off`) is in bounds and not written
        // concurrently (caller's contract).
        let bytes = unsafe {
            std::slice::from_raw_parts(self.base.elems::<u8>(self.off * size, kd * vd * size), kd * vd * size)
        };
        for ki in 0..kd {
            let (at, stride) = self.entry(ki);
            let hrow = &mut h[ki * vp..(ki + 1) * vp];
            gather::<S>(bytes, self.dtype, at, stride, &mut hrow[..vd]);
            hrow[vd..].fill(0.0);
        }
    }

    /// Stores the K-major f32 matrix `h` as the head.
    ///
    /// # Safety
    /// The head must lie in `base` and be accessed by no other thread now.
    #[inline(always)]
    unsafe fn store<S: Simd>(self, h: &[f32]) {
        let vp = round8(self.vd);
        for ki in 0..self.kd {
            let (at, stride) = self.entry(ki);
            // SAFETY: row ki of the head is in bounds and owned by this item (caller's contract).
            unsafe { scatter::<S>(self.base, self.dtype, self.off + at, stride, &h[ki * vp..ki * vp + self.vd]) };
        }
    }
}

/// One worker's scratch, split by [`ChunkLayout`].
struct ChunkBufs<'w> {
    /// The state `H`, `[kd][vp]`.
    h: &'w mut [f32],
    q: &'w mut [f32],
    k: &'w mut [f32],
    w: &'w mut [f32],
    u: &'w mut [f32],
    o: &'w mut [f32],
    /// `e^{G_last − G_i} k_i`, transposed: `[kd][CHUNK_SIZE]`.
    kdt: &'w mut [f32],
    a: &'w mut [f32],
    p: &'w mut [f32],
    /// In-chunk cumulative gate `G`.
    gc: &'w mut [f32],
    beta: &'w mut [f32],
}

impl<'w> ChunkBufs<'w> {
    fn split(l: &ChunkLayout, ws: &'w mut [f32]) -> Self {
        let (h, rest) = ws[..l.len].split_at_mut(l.q);
        let (q, rest) = rest.split_at_mut(l.k - l.q);
        let (k, rest) = rest.split_at_mut(l.w - l.k);
        let (w, rest) = rest.split_at_mut(l.u - l.w);
        let (u, rest) = rest.split_at_mut(l.o - l.u);
        let (o, rest) = rest.split_at_mut(l.kdt - l.o);
        let (kdt, rest) = rest.split_at_mut(l.a - l.kdt);
        let (a, rest) = rest.split_at_mut(l.pm - l.a);
        let (p, rest) = rest.split_at_mut(l.gc - l.pm);
        let (gc, beta) = rest.split_at_mut(l.bt - l.gc);
        ChunkBufs { h, q, k, w, u, o, kdt, a, p, gc, beta }
    }
}

#[inline(always)]
fn chunk_item<S: Simd>(ctx: &ChunkCtx<'_>, item: usize, ws: &mut [f32]) {
    let p = ctx.plan;
    let d = p.dims;
    let (n, hv) = (item / d.v_heads, item % d.v_heads);
    let (read, write) = match p.start(ctx.ix.as_ref(), ctx.has.as_ref(), n) {
        ChunkStart::Skip => return,
        ChunkStart::Zeros { row } => (None, row),
        ChunkStart::Row(r) => (Some(r), p.inplace.then_some(r)),
    };
    let sp = p.span(ctx.io.cu.as_ref(), n);
    let mut m = ChunkBufs::split(&ctx.layout, ws);
    match read {
        Some(r) => {
            let sv = p.state.as_ref().expect("a row start implies initial_state");
            // SAFETY: head hv of row r is in bounds (plan) and written by no other sequence (plan's
            // slot-conflict check) nor by another item (other heads).
            unsafe { StoredHead::new(ctx.io.state.unwrap(), sv, p, r, hv).load::<S>(m.h) };
        }
        None => m.h.fill(0.0),
    }
    let mut c0 = 0;
    while c0 < sp.len {
        let (t0, cl) = (sp.t0 + c0, CHUNK_SIZE.min(sp.len - c0));
        chunk_inputs::<S>(ctx, sp.b, t0, cl, hv, &mut m);
        chunk_solve::<S>(ctx, cl, &mut m);
        chunk_outputs::<S>(ctx, sp.b, t0, cl, hv, &mut m);
        chunk_state_update::<S>(ctx, cl, &mut m);
        c0 += cl;
    }
    if let (Some(fs), Some(buf)) = (p.final_state.as_ref(), ctx.io.final_state) {
        // SAFETY: row n of `final_state` belongs to sequence n; head hv to this item.
        unsafe { StoredHead::new(buf, fs, p, n, hv).store::<S>(m.h) };
    }
    if let Some(r) = write {
        let sv = p.state.as_ref().expect("in-place writes imply initial_state");
        // SAFETY: row r is touched by this sequence only (plan); head hv by this item only.
        unsafe { StoredHead::new(ctx.io.state.unwrap(), sv, p, r, hv).store::<S>(m.h) };
    }
}

/// Gathers the chunk's tokens `t0..t0 + cl`: normalised `q`, `k`, the values into `U`, the
/// cumulative gate `G` and `β`.
#[inline(always)]
fn chunk_inputs<S: Simd>(ctx: &ChunkCtx<'_>, b: usize, t0: usize, cl: usize, hv: usize, m: &mut ChunkBufs<'_>) {
    let p = ctx.plan;
    let (kd, vd, kp, vp) = (p.dims.k, p.dims.v, ctx.layout.kp, ctx.layout.vp);
    let h = hv / p.dims.group();
    let ((q_at, q_dt), (k_at, k_dt), (v_at, v_dt), (g_at, g_dt), (b_at, b_dt)) = (p.q, p.k, p.v, p.g, p.beta);
    let mut acc = 0.0f32;
    // Token rows lie a whole plane of heads apart: fetch a few tokens ahead.
    const AHEAD: usize = 4;
    for i in 0..cl {
        let tt = t0 + i;
        if i + AHEAD < cl {
            let ta = tt + AHEAD;
            prefetch_row::<S>(ctx.io.q.as_ptr(), q_dt, q_at.at([b, ta, h, 0]), kd);
            prefetch_row::<S>(ctx.io.k.as_ptr(), k_dt, k_at.at([b, ta, h, 0]), kd);
            prefetch_row::<S>(ctx.io.v.as_ptr(), v_dt, v_at.at([b, ta, hv, 0]), vd);
        }
        let qi = &mut m.q[i * kp..(i + 1) * kp];
        gather::<S>(ctx.io.q, q_dt, q_at.at([b, tt, h, 0]), q_at.strides[3], &mut qi[..kd]);
        normalize::<S>(qi, kd, p.l2norm, p.eps, p.scale);
        let ki = &mut m.k[i * kp..(i + 1) * kp];
        gather::<S>(ctx.io.k, k_dt, k_at.at([b, tt, h, 0]), k_at.strides[3], &mut ki[..kd]);
        normalize::<S>(ki, kd, p.l2norm, p.eps, 1.0);
        let ui = &mut m.u[i * vp..(i + 1) * vp];
        gather::<S>(ctx.io.v, v_dt, v_at.at([b, tt, hv, 0]), v_at.strides[3], &mut ui[..vd]);
        ui[vd..].fill(0.0);
        acc += rd(ctx.g, g_dt, g_at.at([b, tt, hv]));
        m.gc[i] = acc;
        m.beta[i] = rd(ctx.beta, b_dt, b_at.at([b, tt, hv]));
    }
}

/// `A` (strictly lower) and `P` (lower with diagonal), then `U = (I+A)⁻¹ βV` and
/// `W = (I+A)⁻¹ (β e^G K)` by forward substitution, then `V' = U − W·H` (in place in `U`).
#[inline(always)]
fn chunk_solve<S: Simd>(ctx: &ChunkCtx<'_>, cl: usize, m: &mut ChunkBufs<'_>) {
    let (kd, kp, vp, cs) = (ctx.plan.dims.k, ctx.layout.kp, ctx.layout.vp, CHUNK_SIZE);
    let (gc, bt) = (&*m.gc, &*m.beta);
    // `Q·Kᵀ` and `K·Kᵀ` as tiled products over `Kᵀ` (transposed in 8×8 register blocks into the
    // state update's buffer, free until then), on whole lanes of columns; then the decay
    // `e^{G_i − G_j}` (and `β_i` for `A`) on the lower triangle, zeros past it (`P`'s are read by
    // the lower-triangular `P·V'`).
    let cp = round8(cl);
    transpose::<S>(m.k, kp, cl, kd, m.kdt, cs, cp);
    for i in 0..cl {
        m.p[i * cs..i * cs + cp].fill(0.0);
        m.a[i * cs..i * cs + cp].fill(0.0);
    }
    gemm::<S>(cl, cp, Operands::new(kd, m.q, kp, m.kdt, cs), m.p, cs);
    gemm::<S>(cl, cp, Operands::new(kd, m.k, kp, m.kdt, cs), m.a, cs);
    for i in 0..cl {
        let (gi, bi) = (S::splat(gc[i]), S::splat(bt[i]));
        let (pi, ai) = (&mut m.p[i * cs..i * cs + cp], &mut m.a[i * cs..i * cs + cp]);
        for j in (0..round8(i + 1)).step_by(LANES) {
            let decay = gi.sub(S::load(&gc[j..])).exp();
            S::load(&pi[j..]).mul(decay).store(&mut pi[j..]);
            S::load(&ai[j..]).mul(decay.mul(bi)).store(&mut ai[j..]);
        }
        pi[i + 1..].fill(0.0);
        ai[i..].fill(0.0);
    }
    for i in 0..cl {
        scal::<S>(&mut m.u[i * vp..(i + 1) * vp], bt[i]);
        let wi = &mut m.w[i * kp..(i + 1) * kp];
        wi.copy_from_slice(&m.k[i * kp..(i + 1) * kp]);
        scal::<S>(wi, bt[i] * gc[i].exp());
    }
    // The forward substitution in blocks of rows: the rows solved before a block enter it as one
    // product, then each of the block's rows takes the rows above it in the block as a one-row
    // product (held in registers, not an axpy through memory per pair).
    const BLOCK: usize = 16;
    for i0 in (0..cl).step_by(BLOCK) {
        let i1 = (i0 + BLOCK).min(cl);
        if i0 > 0 {
            let a = &m.a[i0 * cs..];
            let (done, rows) = m.u.split_at_mut(i0 * vp);
            gemm::<S>(i1 - i0, vp, Operands::new(i0, a, cs, done, vp).scaled(-1.0), rows, vp);
            let (done, rows) = m.w.split_at_mut(i0 * kp);
            gemm::<S>(i1 - i0, kp, Operands::new(i0, a, cs, done, kp).scaled(-1.0), rows, kp);
        }
        for i in i0 + 1..i1 {
            let a = &m.a[i * cs + i0..];
            let (done, row) = m.u.split_at_mut(i * vp);
            gemm::<S>(1, vp, Operands::new(i - i0, a, cs, &done[i0 * vp..], vp).scaled(-1.0), row, vp);
            let (done, row) = m.w.split_at_mut(i * kp);
            gemm::<S>(1, kp, Operands::new(i - i0, a, cs, &done[i0 * kp..], kp).scaled(-1.0), row, kp);
        }
    }
    gemm::<S>(cl, vp, Operands::new(kd, m.w, kp, m.h, vp).scaled(-1.0), m.u, vp);
}

/// `O = (e^{G_i} q_i)·H + P·V'`, scattered to `o`.
#[inline(always)]
fn chunk_outputs<S: Simd>(ctx: &ChunkCtx<'_>, b: usize, t0: usize, cl: usize, hv: usize, m: &mut ChunkBufs<'_>) {
    let (kd, vd, kp, vp) = (ctx.plan.dims.k, ctx.plan.dims.v, ctx.layout.kp, ctx.layout.vp);
    let (o_at, o_dt) = ctx.plan.o;
    m.o[..cl * vp].fill(0.0);
    for i in 0..cl {
        scal::<S>(&mut m.q[i * kp..(i + 1) * kp], m.gc[i].exp());
    }
    gemm::<S>(cl, vp, Operands::new(kd, m.q, kp, m.h, vp), m.o, vp);
    // `P` is lower triangular, its upper part the scratch's zeros (never written).
    gemm::<S>(cl, vp, Operands::new(cl, m.p, CHUNK_SIZE, m.u, vp).lower(), m.o, vp);
    for i in 0..cl {
        let at = o_at.at([b, t0 + i, hv, 0]);
        // SAFETY: the output row of (sequence, token t0 + i, head hv) belongs to this item.
        unsafe { scatter::<S>(ctx.io.o, o_dt, at, o_at.strides[3], &m.o[i * vp..i * vp + vd]) };
    }
}

/// `H ← e^{G_last}·H + Σ_i e^{G_last − G_i} k_i V'_iᵀ`.
#[inline(always)]
fn chunk_state_update<S: Simd>(ctx: &ChunkCtx<'_>, cl: usize, m: &mut ChunkBufs<'_>) {
    let (kd, vp, cs) = (ctx.plan.dims.k, ctx.layout.vp, CHUNK_SIZE);
    let glast = m.gc[cl - 1];
    scal::<S>(m.h, glast.exp());
    // `kdt` still holds `Kᵀ` from `chunk_solve`: scale its columns by `e^{G_last − G_i}` (zero past
    // the chunk's tokens, whose columns the product does not read).
    let cp = round8(cl);
    let mut f = [0.0f32; CHUNK_SIZE];
    for (i, v) in f[..cl].iter_mut().enumerate() {
        *v = (glast - m.gc[i]).exp();
    }
    for ki in 0..kd {
        let row = &mut m.kdt[ki * cs..ki * cs + cp];
        for j in (0..cp).step_by(LANES) {
            S::load(&row[j..]).mul(S::load(&f[j..])).store(&mut row[j..]);
        }
    }
    gemm::<S>(kd, vp, Operands::new(cl, m.kdt, cs, m.u, vp), m.h, vp);
}

impl Run<ChunkGatedDeltaRuleArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), CpuError> {
        let (mut a, plan) = call.into_parts();
        let plan = &plan;
        host_opt("initial_state_indices", &a.initial_state_indices)?;
        host_opt("has_initial_state", &a.has_initial_state)?;
        let layout = ChunkLayout::new(plan.dims.k, plan.dims.v);
        let ctx = ChunkCtx {
            plan,
            io: Io::new([&a.q, &a.k, &a.v], &a.cu_seqlens, a.initial_state.as_mut(), a.final_state.as_mut(), &mut a.o)?,
            g: host_ref("g", &a.g)?,
            beta: host_ref("beta", &a.beta)?,
            ix: a.initial_state_indices,
            has: a.has_initial_state,
            layout,
        };
        let given = match a.scratch.as_mut() {
            Some(s) => {
                require_host("scratch", s.device())?;
                let off = s.layout().offset();
                let all = s.host_data_mut::<f32>().expect("the plan checked an f32 scratch");
                Some(&mut all[off..off + plan.scratch_len])
            }
            None => None,
        };
        let items = plan.dims.seqs * plan.dims.v_heads;
        self.for_each_item(items, layout.len, given, &ctx);
        Ok(())
    }
}

impl ssm_gdn::ChunkScratch for CpuBackend {
    fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize {
        let items = plan.dims.seqs * plan.dims.v_heads;
        self.scratch_workers(items) * ChunkLayout::new(plan.dims.k, plan.dims.v).len
    }
}
