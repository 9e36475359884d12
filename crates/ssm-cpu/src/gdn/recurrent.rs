//! Items of the recurrent ops (fused recurrent and sigmoid-gated decode): one item per
//! (sequence, value head). Each item resolves its span and start state, picks a path — the
//! multi-token direct decode, the one-token direct decode (rows stream memory to memory), or
//! the f32 tile — and runs the value rows of the head in blocks.

use half::{bf16, f16};
use ssm_gdn::plan::{Gates, RecurrentPlan, SeqSpan, StartState};
use ssm_gdn::reference::{gate, sigmoid};
use ssm_gdn::{FusedRecurrentGatedDeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout};
use ssm_tensor::{DType, Planned, Run, TensorMut, TensorRef};

use super::direct::{Dst, decode_kv_direct, decode_vk_direct, decode_vk_multi};
use super::normalize;
use super::tile::{load_tile_dyn, step_kv, step_vk, store_tile_dyn};
use crate::host::{host_opt, host_ref, host_shared, rd};
use crate::lanes::{gather, round8, scatter};
use crate::shared::{STACK_SCRATCH, Scratch, SharedBuf};
use crate::simd::{LANES, PowTwo, Simd, SimdKernel, dispatch};
use crate::{CpuBackend, CpuError};

/// f32 elements of the per-item state tile of the recurrent kernels (64 KiB).
const TILE: usize = 16 * 1024;
/// Most value rows (or columns) in one tile.
const MAX_BLOCK: usize = 2048;
/// Most tokens the multi-token direct path takes (their destinations live on the stack).
const MULTI_TOKENS: usize = 16;

/// Where the gate inputs of a recurrent op live.
pub(super) enum GateBytes<'a> {
    /// `g` and optional `beta`, given per token.
    Given { g: &'a [u8], beta: Option<&'a [u8]> },
    /// Computed per token from `A_log`, `dt_bias`, `a`, `b`.
    Sigmoid { a_log: &'a [u8], dt_bias: &'a [u8], a: &'a [u8], b: &'a [u8] },
}

/// What every item of one recurrent call reads and writes.
struct RecCtx<'a> {
    plan: &'a RecurrentPlan,
    q: &'a [u8],
    k: &'a [u8],
    v: &'a [u8],
    gates: GateBytes<'a>,
    cu: Option<TensorRef<'a>>,
    ix: Option<TensorRef<'a>>,
    na: Option<TensorRef<'a>>,
    state: Option<SharedBuf<u8>>,
    final_state: Option<SharedBuf<u8>>,
    o: SharedBuf<u8>,
}

struct RecItem<'c, 'a, 's, 't> {
    ctx: &'c RecCtx<'a>,
    item: usize,
    scratch: &'s mut Scratch<'t>,
}

impl SimdKernel for RecItem<'_, '_, '_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        recurrent_item::<S>(self.ctx, self.item, self.scratch)
    }
}

/// Value rows of `S` per block: VK tiles are `[nv][kp]`, KV tiles `[kd][cp]` with `cp = round8(nv)`.
fn block_rows(p: &RecurrentPlan) -> usize {
    let d = p.dims;
    match p.layout {
        StateLayout::VK => (TILE / round8(d.k)).min(MAX_BLOCK).min(d.v),
        StateLayout::KV => ((TILE / d.k) / LANES * LANES).min(MAX_BLOCK).min(round8(d.v)),
    }
}

/// f32 scratch of the block path: the tile (unless direct) and `q`, `k` (`kp`), `v`, `β`, `r`, `o` (`bp`).
fn block_scratch(p: &RecurrentPlan, direct: bool) -> usize {
    let (kp, block) = (round8(p.dims.k), block_rows(p));
    let tile = match (direct, p.layout) {
        (true, _) => 0,
        (false, StateLayout::VK) => block * kp,
        (false, StateLayout::KV) => p.dims.k * round8(block),
    };
    tile + 2 * kp + 4 * round8(block)
}

/// f32 scratch of the multi-token path for `tokens` tokens: per token `[q | k | v | β]`, the
/// decay and the outputs, then a block of four rows.
fn multi_scratch(p: &RecurrentPlan, tokens: usize) -> usize {
    let (kd, vd) = (p.dims.k, p.dims.v);
    tokens * (2 * round8(kd) + 3 * vd + 1) + 4 * kd
}

/// Scratch per item of a recurrent call: from the plan's dimensions alone, the block path and, as
/// far as the stack allows, the multi-token path.
fn item_scratch(p: &RecurrentPlan) -> usize {
    block_scratch(p, false).max(multi_scratch(p, MULTI_TOKENS).min(STACK_SCRATCH))
}

/// Per-token gate values of value head `hv`: returns `g`, writes `β` for the value rows
/// `v0..v0 + beta.len()` (head-wise β varies along V).
#[inline(always)]
fn token_gates<S: Simd>(ctx: &RecCtx<'_>, b: usize, t: usize, hv: usize, v0: usize, beta: &mut [f32]) -> f32 {
    match (&ctx.gates, &ctx.plan.gates) {
        (GateBytes::Given { g, beta: bb }, Gates::Given { g: gs, g_dtype, beta: bs }) => {
            match (bb, bs) {
                (Some(bytes), Some((st, dt))) => gather::<S>(bytes, *dt, st.at([b, t, hv, v0]), st.strides[3], beta),
                _ => beta.iter_mut().for_each(|x| *x = 1.0),
            }
            rd(g, *g_dtype, gs.at([b, t, hv]))
        }
        (
            GateBytes::Sigmoid { a_log, dt_bias, a, b: bb },
            Gates::Sigmoid { a_log: al, dt_bias: db, a: aa, b: bs, softplus_beta, threshold },
        ) => {
            let a_log = rd(a_log, al.1, al.0.at([hv]));
            let (a, bias) = (rd(a, aa.1, aa.0.at([b, t, hv])), rd(dt_bias, db.1, db.0.at([hv])));
            let be = sigmoid(rd(bb, bs.1, bs.0.at([b, t, hv])));
            beta.iter_mut().for_each(|x| *x = be);
            gate(a_log, a, bias, *softplus_beta, *threshold)
        }
        _ => unreachable!("gate sources match the plan"),
    }
}

/// The inputs of token `tt` for value rows `v0..v0 + v.len()` of head `hv` (key head `h`):
/// normalised `q`, `k` (padded to `kp`), `v` and `β`; returns the decay `e^g`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn token_inputs<S: Simd>(
    ctx: &RecCtx<'_>,
    b: usize,
    tt: usize,
    h: usize,
    hv: usize,
    v0: usize,
    [q, k, v, beta]: [&mut [f32]; 4],
) -> f32 {
    let p = ctx.plan;
    let kd = p.dims.k;
    let ((q_at, q_dtype), (k_at, k_dtype), (v_at, v_dtype)) = (p.q, p.k, p.v);
    gather::<S>(ctx.q, q_dtype, q_at.at([b, tt, h, 0]), q_at.strides[3], &mut q[..kd]);
    gather::<S>(ctx.k, k_dtype, k_at.at([b, tt, h, 0]), k_at.strides[3], &mut k[..kd]);
    normalize::<S>(q, kd, p.l2norm, p.eps, p.scale);
    normalize::<S>(k, kd, p.l2norm, p.eps, 1.0);
    gather::<S>(ctx.v, v_dtype, v_at.at([b, tt, hv, v0]), v_at.strides[3], v);
    token_gates::<S>(ctx, b, tt, hv, v0, beta).exp()
}

#[inline(always)]
fn recurrent_item<S: Simd>(ctx: &RecCtx<'_>, item: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.plan;
    let d = p.dims;
    let (n, hv) = (item / d.v_heads, item % d.v_heads);
    let sp = p.span(ctx.cu.as_ref(), n);
    if sp.len == 0 {
        return;
    }
    let start = p.start(ctx.ix.as_ref(), ctx.na.as_ref(), n, &sp);
    match start {
        StartState::Skip => return,
        StartState::ZeroOutput => return zero_outputs::<S>(ctx, &sp, hv),
        StartState::Zeros | StartState::Row(_) => {}
    }
    // Several tokens from a slot of a V-major pool, stored (if at all) back into the pool:
    // the multi-token direct path (read once, write once per destination).
    if let (StateLayout::VK, StartState::Row(r), true, None) = (p.layout, start, sp.len > 1, p.final_state)
        && d.k.is_multiple_of(LANES)
        && d.v.is_multiple_of(4)
        && sp.len <= MULTI_TOKENS
        && multi_scratch(p, sp.len) <= scratch.len()
    {
        return recurrent_multi::<S>(ctx, n, hv, r, &sp, scratch);
    }
    let direct = direct_target(ctx, n, hv, &sp, start);
    run_blocks::<S>(ctx, n, hv, &sp, start, direct, scratch);
}

/// A sequence whose start state is a pad writes zeros to its outputs and nothing else.
#[inline(always)]
fn zero_outputs<S: Simd>(ctx: &RecCtx<'_>, sp: &SeqSpan, hv: usize) {
    let (o_at, o_dtype) = ctx.plan.o;
    let vd = ctx.plan.dims.v;
    let zeros = [0.0f32; 64];
    for t in 0..sp.len {
        let mut v0 = 0;
        while v0 < vd {
            let nv = (vd - v0).min(zeros.len());
            let at = o_at.at([sp.b, sp.t0 + t, hv, v0]);
            // SAFETY: row (sequence, token t, head hv) of `o` belongs to this item.
            unsafe { scatter::<S>(ctx.o, o_dtype, at, o_at.strides[3], &zeros[..nv]) };
            v0 += nv;
        }
    }
}

/// The direct path's source (dtype, element offset of the head) and destination: one token,
/// read from a slot and written (if at all) to one place of the same dtype, so rows stream from
/// memory to memory with no tile. The K-major direct path needs the whole head in one block
/// (V a multiple of the lanes).
fn direct_target(
    ctx: &RecCtx<'_>,
    n: usize,
    hv: usize,
    sp: &SeqSpan,
    start: StartState,
) -> Option<(DType, usize, Dst)> {
    let p = ctx.plan;
    let d = p.dims;
    let head = d.head_elems();
    let kv_direct_ok = d.v.is_multiple_of(LANES) && block_rows(p) >= d.v;
    let StartState::Row(r) = start else { return None };
    if sp.len != 1 || !(p.layout == StateLayout::VK || kv_direct_ok) {
        return None;
    }
    let sv = p.state.expect("a row start implies a pool");
    let src_off = sv.head(r, hv, head);
    match (p.store_row(ctx.ix.as_ref(), n, sp, 0), p.final_row(sp, 0)) {
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

/// One block of value rows `v0..v0 + nv` of a head: where it lies in memory (element offset
/// `moff` in the head, row pitch `ld`, `rows × cols`) and in the tile (row pitch `tp`).
#[derive(Clone, Copy)]
struct Block {
    nv: usize,
    moff: usize,
    ld: usize,
    rows: usize,
    cols: usize,
    tp: usize,
}

impl Block {
    fn new(p: &RecurrentPlan, v0: usize, nv: usize) -> Self {
        let (kd, vd) = (p.dims.k, p.dims.v);
        match p.layout {
            StateLayout::VK => Block { nv, moff: v0 * kd, ld: kd, rows: nv, cols: kd, tp: round8(kd) },
            StateLayout::KV => Block { nv, moff: v0, ld: vd, rows: kd, cols: nv, tp: round8(nv) },
        }
    }
}

/// Runs every token of the sequence on each block of value rows in turn: through the tile
/// (loaded from the start state, stored to each destination) or directly from memory.
#[inline(always)]
fn run_blocks<S: Simd>(
    ctx: &RecCtx<'_>,
    n: usize,
    hv: usize,
    sp: &SeqSpan,
    start: StartState,
    direct: Option<(DType, usize, Dst)>,
    scratch: &mut Scratch<'_>,
) {
    let p = ctx.plan;
    let d = p.dims;
    let (h, kp) = (hv / d.group(), round8(d.k));
    let block = block_rows(p);
    let bp = round8(block);
    let (o_at, o_dtype) = p.o;
    let tile_len = block_scratch(p, direct.is_some()) - 2 * kp - 4 * bp;
    let buf = scratch.take(block_scratch(p, direct.is_some()));
    let (tile, rest) = buf.split_at_mut(tile_len);
    let (qb, rest) = rest.split_at_mut(kp);
    let (kb, rest) = rest.split_at_mut(kp);
    let (vb, rest) = rest.split_at_mut(bp);
    let (betab, rest) = rest.split_at_mut(bp);
    let (rb, ob) = rest.split_at_mut(bp);
    let mut v0 = 0;
    while v0 < d.v {
        let blk = Block::new(p, v0, block.min(d.v - v0));
        let (nv, cp) = (blk.nv, round8(blk.nv));
        if direct.is_none() {
            load_block::<S>(ctx, hv, start, blk, tile);
        }
        for t in 0..sp.len {
            vb[nv..cp].fill(0.0);
            betab[nv..cp].fill(0.0);
            let vecs = [&mut qb[..], &mut kb[..], &mut vb[..nv], &mut betab[..nv]];
            let decay = token_inputs::<S>(ctx, sp.b, sp.t0 + t, h, hv, v0, vecs);
            match direct {
                Some((dtype, src_off, dst)) => {
                    step_direct::<S>(ctx, dtype, src_off, dst, blk, [qb, kb], decay, [vb, betab, rb, ob])
                }
                None => match p.layout {
                    StateLayout::VK => step_vk::<S>(tile, nv, kp, qb, kb, decay, vb, betab, ob),
                    StateLayout::KV => step_kv::<S>(tile, d.k, cp, qb, kb, decay, vb, betab, ob),
                },
            }
            let at = o_at.at([sp.b, sp.t0 + t, hv, v0]);
            // SAFETY: the output row of (sequence n, token t, head hv) belongs to this item.
            unsafe { scatter::<S>(ctx.o, o_dtype, at, o_at.strides[3], &ob[..nv]) };
            if direct.is_none() {
                store_block::<S>(ctx, n, hv, sp, t, start, blk, tile);
            }
        }
        v0 += nv;
    }
}

/// Loads a block of the start state into the tile (zeros for a zero start).
#[inline(always)]
fn load_block<S: Simd>(ctx: &RecCtx<'_>, hv: usize, start: StartState, blk: Block, tile: &mut [f32]) {
    let p = ctx.plan;
    let Block { moff, ld, rows, cols, tp, .. } = blk;
    match start {
        StartState::Row(r) => {
            let sv = p.state.as_ref().expect("a row start implies a pool");
            let at = sv.head(r, hv, p.dims.head_elems()) + moff;
            // SAFETY: slot r's head hv rows of this block lie in the pool (plan); no other item
            // writes them now (slot conflicts are refused by the plan; other items own other heads).
            unsafe { load_tile_dyn::<S>(sv.dtype, ctx.state.unwrap(), at, ld, rows, cols, tile, tp) };
        }
        _ => tile[..rows * tp].fill(0.0),
    }
}

/// Stores the tile after token `t` to the slot it is stored in (if any) and to `final_state`'s
/// row of that token (if any).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn store_block<S: Simd>(
    ctx: &RecCtx<'_>,
    n: usize,
    hv: usize,
    sp: &SeqSpan,
    t: usize,
    start: StartState,
    blk: Block,
    tile: &[f32],
) {
    let p = ctx.plan;
    let head = p.dims.head_elems();
    let Block { moff, ld, rows, cols, tp, .. } = blk;
    if let Some(r) = p.store_row(ctx.ix.as_ref(), n, sp, t) {
        let sv = p.state.as_ref().expect("in-place stores imply a pool");
        // A slot other than the one this sequence started from is write-only here.
        let stream = !matches!(start, StartState::Row(s0) if s0 == r);
        let at = sv.head(r, hv, head) + moff;
        // SAFETY: slot r is written only by this sequence (plan), head hv and these value rows
        // only by this item.
        unsafe { store_tile_dyn::<S>(sv.dtype, ctx.state.unwrap(), at, ld, rows, cols, tile, tp, stream) };
    }
    if let Some(r) = p.final_row(sp, t) {
        let fs = p.final_state.as_ref().expect("final rows imply final_state");
        let at = fs.head(r, hv, head) + moff;
        // SAFETY: row r = bos + t of `final_state` belongs to this sequence's token t; head hv and
        // these value rows to this item.
        unsafe { store_tile_dyn::<S>(fs.dtype, ctx.final_state.unwrap(), at, ld, rows, cols, tile, tp, true) };
    }
}

/// One token of the direct path on one block, for the state's dtype and layout.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn step_direct<S: Simd>(
    ctx: &RecCtx<'_>,
    dtype: DType,
    src_off: usize,
    dst: Dst,
    blk: Block,
    [q, k]: [&[f32]; 2],
    decay: f32,
    [v, beta, r, o]: [&mut [f32]; 4],
) {
    let p = ctx.plan;
    let (kd, vd, nv) = (p.dims.k, p.dims.v, blk.nv);
    let src = ctx.state.unwrap();
    let off = src_off + blk.moff;
    let dst = match dst {
        Dst::Other(base, o) => Dst::Other(base, o + blk.moff),
        other => other,
    };
    // SAFETY: rows v0..v0+nv of head hv of the source slot (and of the destination) are in bounds
    // (plan) and touched by this item only: the plan refuses slots shared between sequences when
    // one of them writes; other items own other heads. An `Other` destination is another slot or
    // `final_state`.
    unsafe {
        match (p.layout, dtype) {
            (StateLayout::VK, DType::F32) => decode_vk_direct::<S, f32>(src, off, dst, kd, nv, q, k, decay, v, beta, o),
            (StateLayout::VK, DType::BF16) => {
                decode_vk_direct::<S, bf16>(src, off, dst, kd, nv, q, k, decay, v, beta, o)
            }
            (StateLayout::VK, DType::F16) => decode_vk_direct::<S, f16>(src, off, dst, kd, nv, q, k, decay, v, beta, o),
            (StateLayout::KV, DType::F32) => {
                decode_kv_direct::<S, f32>(src, off, dst, kd, vd, q, k, decay, v, beta, r, o)
            }
            (StateLayout::KV, DType::BF16) => {
                decode_kv_direct::<S, bf16>(src, off, dst, kd, vd, q, k, decay, v, beta, r, o)
            }
            (StateLayout::KV, DType::F16) => {
                decode_kv_direct::<S, f16>(src, off, dst, kd, vd, q, k, decay, v, beta, r, o)
            }
            _ => unreachable!("the plan admits f32/bf16/f16 states only"),
        }
    }
}

/// [`decode_vk_multi`] for one (sequence, value head) item of at most [`MULTI_TOKENS`] tokens:
/// gathers and normalises every token's q/k, v and gates, runs the rows, scatters the outputs.
#[inline(always)]
fn recurrent_multi<S: Simd>(ctx: &RecCtx<'_>, n: usize, hv: usize, r: usize, sp: &SeqSpan, scratch: &mut Scratch<'_>) {
    let p = ctx.plan;
    let d = p.dims;
    let (kd, vd, nt, h) = (d.k, d.v, sp.len, hv / d.group());
    let kp = round8(kd);
    let stride = 2 * kp + 2 * vd;
    let (o_at, o_dtype) = p.o;
    let sv = p.state.expect("a row start implies a pool");
    let head = d.head_elems();
    let buf = scratch.take(multi_scratch(p, nt));
    let (toks, rest) = buf.split_at_mut(nt * stride);
    let (decays, rest) = rest.split_at_mut(nt);
    let (outs, rows) = rest.split_at_mut(nt * vd);
    for t in 0..nt {
        let tk = &mut toks[t * stride..(t + 1) * stride];
        let (qb, rest) = tk.split_at_mut(kp);
        let (kb, rest) = rest.split_at_mut(kp);
        let (vb, betab) = rest.split_at_mut(vd);
        decays[t] = token_inputs::<S>(ctx, sp.b, sp.t0 + t, h, hv, 0, [qb, kb, vb, betab]);
    }
    let mut dsts = [None; MULTI_TOKENS];
    for (t, dst) in dsts.iter_mut().enumerate().take(nt) {
        *dst = p.store_row(ctx.ix.as_ref(), n, sp, t).map(|w| sv.head(w, hv, head));
    }
    let (base, src_off, dsts) = (ctx.state.unwrap(), sv.head(r, hv, head), &dsts[..nt]);
    // SAFETY: the source head and every destination head of this (sequence, value head) are in
    // the pool (plan) and touched by this item only: the plan refuses slots shared between
    // sequences when one of them writes; other items own other heads.
    unsafe {
        match sv.dtype {
            DType::F32 => decode_vk_multi::<S, f32>(base, src_off, dsts, kd, vd, toks, decays, outs, rows),
            DType::BF16 => decode_vk_multi::<S, bf16>(base, src_off, dsts, kd, vd, toks, decays, outs, rows),
            DType::F16 => decode_vk_multi::<S, f16>(base, src_off, dsts, kd, vd, toks, decays, outs, rows),
            _ => unreachable!("the plan admits f32/bf16/f16 states only"),
        }
    }
    for t in 0..nt {
        let at = o_at.at([sp.b, sp.t0 + t, hv, 0]);
        // SAFETY: the output row of (sequence n, token t, head hv) belongs to this item.
        unsafe { scatter::<S>(ctx.o, o_dtype, at, o_at.strides[3], &outs[t * vd..(t + 1) * vd]) };
    }
}

/// The tensors of a recurrent call other than its gates.
struct RecTensors<'r, 'a> {
    q: &'r TensorRef<'a>,
    k: &'r TensorRef<'a>,
    v: &'r TensorRef<'a>,
    /// `cu_seqlens`, `ssm_state_indices`, `num_accepted_tokens`.
    idx: [&'r Option<TensorRef<'a>>; 3],
    initial_state: Option<&'r mut TensorMut<'a>>,
    final_state: Option<&'r mut TensorMut<'a>>,
    o: &'r mut TensorMut<'a>,
}

impl CpuBackend {
    /// Runs every (sequence, value head) item, each with [`item_scratch`] f32 of scratch (on its
    /// stack unless the dimensions are unusually large).
    fn run_recurrent(&self, plan: &RecurrentPlan, gates: GateBytes<'_>, t: RecTensors<'_, '_>) -> Result<(), CpuError> {
        let [cu, ix, na] = t.idx;
        host_opt("cu_seqlens", cu)?;
        host_opt("ssm_state_indices", ix)?;
        host_opt("num_accepted_tokens", na)?;
        let ctx = RecCtx {
            plan,
            q: host_ref("q", t.q)?,
            k: host_ref("k", t.k)?,
            v: host_ref("v", t.v)?,
            gates,
            cu: *cu,
            ix: *ix,
            na: *na,
            state: t.initial_state.map(|s| host_shared("initial_state", s)).transpose()?,
            final_state: t.final_state.map(|s| host_shared("final_state", s)).transpose()?,
            o: host_shared("o", t.o)?,
        };
        let d = plan.dims;
        self.for_each_scratch(d.seqs * d.v_heads, item_scratch(plan), false, None, |item, scratch| {
            dispatch(RecItem { ctx: &ctx, item, scratch })
        });
        Ok(())
    }
}

impl Run<FusedRecurrentGatedDeltaRuleArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedRecurrentGatedDeltaRuleArgs<'_>>) -> Result<(), CpuError> {
        let (mut a, plan) = call.into_parts();
        let gates = GateBytes::Given { g: host_ref("g", &a.g)?, beta: host_opt("beta", &a.beta)?.map(|(b, _)| b) };
        let tensors = RecTensors {
            q: &a.rule.q,
            k: &a.rule.k,
            v: &a.rule.v,
            idx: [&a.rule.cu_seqlens, &a.rule.ssm_state_indices, &a.rule.num_accepted_tokens],
            initial_state: a.rule.initial_state.as_mut(),
            final_state: a.rule.final_state.as_mut(),
            o: &mut a.rule.o,
        };
        self.run_recurrent(&plan, gates, tensors)
    }
}

impl Run<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>>) -> Result<(), CpuError> {
        let (mut a, plan) = call.into_parts();
        let gates = GateBytes::Sigmoid {
            a_log: host_ref("A_log", &a.gates.a_log)?,
            dt_bias: host_ref("dt_bias", &a.gates.dt_bias)?,
            a: host_ref("a", &a.gates.a)?,
            b: host_ref("b", &a.gates.b)?,
        };
        let tensors = RecTensors {
            q: &a.rule.q,
            k: &a.rule.k,
            v: &a.rule.v,
            idx: [&a.rule.cu_seqlens, &a.rule.ssm_state_indices, &a.rule.num_accepted_tokens],
            initial_state: a.rule.initial_state.as_mut(),
            final_state: a.rule.final_state.as_mut(),
            o: &mut a.rule.o,
        };
        self.run_recurrent(&plan, gates, tensors)
    }
}
