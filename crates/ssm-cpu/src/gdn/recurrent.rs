//! Items of the recurrent ops (fused recurrent and sigmoid-gated decode): one item per
//! (sequence, value head). Each item resolves its span and start state, picks a path — the
//! multi-token direct decode, the one-token direct decode (rows stream memory to memory), or
//! the f32 tile — and runs the value rows of the head in blocks.

use ssm_gdn::plan::{Gates, RecurrentPlan, SeqSpan, StartState};
use ssm_gdn::reference::{gate, sigmoid};
use ssm_gdn::{DeltaRuleArgs, FusedRecurrentGatedDeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout};
use ssm_tensor::{DType, Planned, Run, TensorRef};

use super::direct::{Dst, HeadRows, MultiStep, decode_kv_direct, decode_kv_multi, decode_vk_direct, decode_vk_multi};
use super::tile::{Block, load_tile, step_kv, step_vk, store_tile};
use super::{Io, Token, normalize};
use crate::host::{host_opt, host_ref, rd};
use crate::lanes::{gather, round8, scatter};
use crate::shared::{ItemOp, STACK_SCRATCH, Scratch};
use crate::simd::{LANES, PowTwo, Simd, WideLanes, with_real};
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
    io: Io<'a>,
    gates: GateBytes<'a>,
    ix: Option<TensorRef<'a>>,
    na: Option<TensorRef<'a>>,
}

impl ItemOp for RecCtx<'_> {
    #[inline(always)]
    fn run_item<S: Simd + PowTwo>(&self, item: usize, scratch: &mut Scratch<'_>) {
        recurrent_item::<S>(self, item, scratch)
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
/// decay and the outputs, then a block of four rows (V-major) or of [`KV_COLUMNS`] columns
/// (K-major).
fn multi_scratch(p: &RecurrentPlan, tokens: usize) -> usize {
    let (kd, vd) = (p.dims.k, p.dims.v);
    let block = match p.layout {
        StateLayout::VK => 4 * kd,
        StateLayout::KV => KV_COLUMNS * kd,
    };
    tokens * (2 * round8(kd) + 3 * vd + 1) + block
}

/// Most value columns per block of the K-major multi-token path: 64 (256 bytes of each f32 state
/// row) with 32 vector registers, 32 with 16 (the block's three running sums of 64 columns
/// would spill). Interleaved runs, Qwen3-Next 16 × 3 tokens, fraction of copy: 16 columns
/// 0.64–0.66, 32 columns 0.86–0.95 (AVX-512 and AVX2 lanes), 64 columns 0.98–1.02 with AVX-512
/// and 0.77 with AVX2.
const KV_COLUMNS: usize = 8 * LANES;

/// The columns per block [`decode_kv_multi`] takes on the lanes `S` for `vd` value columns.
fn kv_columns<S: Simd>(vd: usize) -> usize {
    // Two vectors of a product tile per 16 registers.
    let most = 2 * LANES * <S::Wide as WideLanes>::TILE_VECTORS;
    [KV_COLUMNS, 4 * LANES].into_iter().find(|&c| c <= most && vd.is_multiple_of(c)).unwrap_or(LANES)
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

/// One (sequence, value head) item of a recurrent call: sequence `n`, value head `hv`, where its
/// tokens are and which state it starts from.
#[derive(Clone, Copy)]
struct Head<'c, 'a> {
    ctx: &'c RecCtx<'a>,
    n: usize,
    hv: usize,
    sp: SeqSpan,
    start: StartState,
}

/// The inputs of token `t` of the item for value rows `v0..v0 + v.len()`: normalised `q`, `k`
/// (padded to `kp`), `v` and `β`; returns the decay `e^g`.
#[inline(always)]
fn token_inputs<S: Simd>(it: Head<'_, '_>, t: usize, v0: usize, [q, k, v, beta]: [&mut [f32]; 4]) -> f32 {
    let Head { ctx, hv, sp, .. } = it;
    let p = ctx.plan;
    let kd = p.dims.k;
    let (b, tt, h) = (sp.b, sp.t0 + t, hv / p.dims.group());
    let ((q_at, q_dtype), (k_at, k_dtype), (v_at, v_dtype)) = (p.q, p.k, p.v);
    gather::<S>(ctx.io.q, q_dtype, q_at.at([b, tt, h, 0]), q_at.strides[3], &mut q[..kd]);
    gather::<S>(ctx.io.k, k_dtype, k_at.at([b, tt, h, 0]), k_at.strides[3], &mut k[..kd]);
    normalize::<S>(q, kd, p.l2norm, p.eps, p.scale);
    normalize::<S>(k, kd, p.l2norm, p.eps, 1.0);
    gather::<S>(ctx.io.v, v_dtype, v_at.at([b, tt, hv, v0]), v_at.strides[3], v);
    token_gates::<S>(ctx, b, tt, hv, v0, beta).exp()
}

#[inline(always)]
fn recurrent_item<S: Simd>(ctx: &RecCtx<'_>, item: usize, scratch: &mut Scratch<'_>) {
    let p = ctx.plan;
    let d = p.dims;
    let (n, hv) = (item / d.v_heads, item % d.v_heads);
    let sp = p.span(ctx.io.cu.as_ref(), n);
    if sp.len == 0 {
        return;
    }
    let start = p.start(ctx.ix.as_ref(), ctx.na.as_ref(), n, &sp);
    let it = Head { ctx, n, hv, sp, start };
    match start {
        StartState::Skip => return,
        StartState::ZeroOutput => return zero_outputs::<S>(it),
        StartState::Zeros | StartState::Row(_) => {}
    }
    // Several tokens from a slot of the pool, stored (if at all) back into the pool: the
    // multi-token direct path (read once, write once per destination).
    let multi_dims = match p.layout {
        StateLayout::VK => d.k.is_multiple_of(LANES) && d.v.is_multiple_of(4),
        StateLayout::KV => d.v.is_multiple_of(LANES),
    };
    if let (StartState::Row(r), true, None) = (start, sp.len > 1, p.final_state)
        && multi_dims
        && sp.len <= MULTI_TOKENS
        && multi_scratch(p, sp.len) <= scratch.len()
    {
        return recurrent_multi::<S>(it, r, scratch);
    }
    run_blocks::<S>(it, direct_target(it), scratch);
}

/// A sequence whose start state is a pad writes zeros to its outputs and nothing else.
#[inline(always)]
fn zero_outputs<S: Simd>(it: Head<'_, '_>) {
    let Head { ctx, hv, sp, .. } = it;
    let (o_at, o_dtype) = ctx.plan.o;
    let vd = ctx.plan.dims.v;
    let zeros = [0.0f32; 64];
    for t in 0..sp.len {
        let mut v0 = 0;
        while v0 < vd {
            let nv = (vd - v0).min(zeros.len());
            let at = o_at.at([sp.b, sp.t0 + t, hv, v0]);
            // SAFETY: row (sequence, token t, head hv) of `o` belongs to this item.
            unsafe { scatter::<S>(ctx.io.o, o_dtype, at, o_at.strides[3], &zeros[..nv]) };
            v0 += nv;
        }
    }
}

/// The direct path's source (dtype, element offset of the head) and destination.
#[derive(Clone, Copy)]
struct Direct {
    dtype: DType,
    src_off: usize,
    dst: Dst,
}

/// Where the direct path applies: one token, read from a slot and written (if at all) to one
/// place of the same dtype, so rows stream from memory to memory with no tile. The K-major
/// direct path needs the whole head in one block (V a multiple of the lanes).
fn direct_target(it: Head<'_, '_>) -> Option<Direct> {
    let Head { ctx, n, hv, sp, start } = it;
    let p = ctx.plan;
    let d = p.dims;
    let head = d.head_elems();
    let kv_direct_ok = d.v.is_multiple_of(LANES) && block_rows(p) >= d.v;
    let StartState::Row(r) = start else { return None };
    if sp.len != 1 || !(p.layout == StateLayout::VK || kv_direct_ok) {
        return None;
    }
    let sv = p.state.expect("a row start implies a pool");
    let (dtype, src_off) = (sv.dtype, sv.head(r, hv, head));
    let dst = match (p.store_row(ctx.ix.as_ref(), n, &sp, 0), p.final_row(&sp, 0)) {
        (Some(w), _) if w == r => Dst::InPlace,
        (Some(w), _) => Dst::Other(ctx.io.state.unwrap(), sv.head(w, hv, head)),
        (None, Some(f)) => {
            let fs = p.final_state.expect("final rows imply final_state");
            if fs.dtype != sv.dtype {
                return None;
            }
            Dst::Other(ctx.io.final_state.unwrap(), fs.head(f, hv, head))
        }
        (None, None) => Dst::None,
    };
    Some(Direct { dtype, src_off, dst })
}

/// Runs every token of the sequence on each block of value rows in turn: through the tile
/// (loaded from the start state, stored to each destination) or directly from memory.
#[inline(always)]
fn run_blocks<S: Simd>(it: Head<'_, '_>, direct: Option<Direct>, scratch: &mut Scratch<'_>) {
    let Head { ctx, hv, sp, .. } = it;
    let p = ctx.plan;
    let d = p.dims;
    let kp = round8(d.k);
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
            load_block::<S>(it, blk, tile);
        }
        for t in 0..sp.len {
            vb[nv..cp].fill(0.0);
            betab[nv..cp].fill(0.0);
            let vecs = [&mut qb[..], &mut kb[..], &mut vb[..nv], &mut betab[..nv]];
            let decay = token_inputs::<S>(it, t, v0, vecs);
            let tok = Token { q: qb, k: kb, decay, v: vb, beta: betab };
            match direct {
                Some(direct) => step_direct::<S>(ctx, direct, blk, tok, [rb, ob]),
                None => match p.layout {
                    StateLayout::VK => step_vk::<S>(tile, nv, kp, tok, ob),
                    StateLayout::KV => step_kv::<S>(tile, d.k, cp, tok, ob),
                },
            }
            let at = o_at.at([sp.b, sp.t0 + t, hv, v0]);
            // SAFETY: the output row of (sequence n, token t, head hv) belongs to this item.
            unsafe { scatter::<S>(ctx.io.o, o_dtype, at, o_at.strides[3], &ob[..nv]) };
            if direct.is_none() {
                store_block::<S>(it, t, blk, tile);
            }
        }
        v0 += nv;
    }
}

/// Loads a block of the start state into the tile (zeros for a zero start).
#[inline(always)]
fn load_block<S: Simd>(it: Head<'_, '_>, blk: Block, tile: &mut [f32]) {
    let Head { ctx, hv, start, .. } = it;
    let p = ctx.plan;
    match start {
        StartState::Row(r) => {
            let sv = p.state.as_ref().expect("a row start implies a pool");
            let at = sv.head(r, hv, p.dims.head_elems()) + blk.moff;
            // SAFETY: slot r's head hv rows of this block lie in the pool (plan); no other item
            // writes them now (slot conflicts are refused by the plan; other items own other heads).
            unsafe { with_real!(sv.dtype, R => load_tile::<S, R>(ctx.io.state.unwrap(), at, blk, tile)) };
        }
        _ => tile[..blk.tile_len()].fill(0.0),
    }
}

/// Stores the tile after token `t` to the slot it is stored in (if any) and to `final_state`'s
/// row of that token (if any).
#[inline(always)]
fn store_block<S: Simd>(it: Head<'_, '_>, t: usize, blk: Block, tile: &[f32]) {
    let Head { ctx, n, hv, sp, start } = it;
    let p = ctx.plan;
    let head = p.dims.head_elems();
    if let Some(r) = p.store_row(ctx.ix.as_ref(), n, &sp, t) {
        let sv = p.state.as_ref().expect("in-place stores imply a pool");
        // A slot other than the one this sequence started from is write-only here.
        let stream = !matches!(start, StartState::Row(s0) if s0 == r);
        let at = sv.head(r, hv, head) + blk.moff;
        // SAFETY: slot r is written only by this sequence (plan), head hv and these value rows
        // only by this item.
        unsafe { with_real!(sv.dtype, R => store_tile::<S, R>(ctx.io.state.unwrap(), at, blk, tile, stream)) };
    }
    if let Some(r) = p.final_row(&sp, t) {
        let fs = p.final_state.as_ref().expect("final rows imply final_state");
        let at = fs.head(r, hv, head) + blk.moff;
        // SAFETY: row r = bos + t of `final_state` belongs to this sequence's token t; head hv and
        // these value rows to this item.
        unsafe { with_real!(fs.dtype, R => store_tile::<S, R>(ctx.io.final_state.unwrap(), at, blk, tile, true)) };
    }
}

/// One token of the direct path on one block, for the state's dtype and layout.
#[inline(always)]
fn step_direct<S: Simd>(ctx: &RecCtx<'_>, direct: Direct, blk: Block, tok: Token<'_>, [r, o]: [&mut [f32]; 2]) {
    let p = ctx.plan;
    let (kd, vd, nv) = (p.dims.k, p.dims.v, blk.nv);
    let src = ctx.io.state.unwrap();
    let off = direct.src_off + blk.moff;
    let dst = match direct.dst {
        Dst::Other(base, o) => Dst::Other(base, o + blk.moff),
        other => other,
    };
    // SAFETY: rows v0..v0+nv of head hv of the source slot (and of the destination) are in bounds
    // (plan) and touched by this item only: the plan refuses slots shared between sequences when
    // one of them writes; other items own other heads. An `Other` destination is another slot or
    // `final_state`.
    unsafe {
        with_real!(direct.dtype, R => match p.layout {
            StateLayout::VK => decode_vk_direct::<S, R>(HeadRows::new(src, off, dst, [kd, nv]), tok, o),
            StateLayout::KV => decode_kv_direct::<S, R>(HeadRows::new(src, off, dst, [kd, vd]), tok, r, o),
        })
    }
}

/// [`decode_vk_multi`] or [`decode_kv_multi`] for one (sequence, value head) item of at most
/// [`MULTI_TOKENS`] tokens:
/// gathers and normalises every token's q/k, v and gates, runs the rows, scatters the outputs.
#[inline(always)]
fn recurrent_multi<S: Simd>(it: Head<'_, '_>, r: usize, scratch: &mut Scratch<'_>) {
    let Head { ctx, n, hv, sp, .. } = it;
    let p = ctx.plan;
    let d = p.dims;
    let (kd, vd, nt) = (d.k, d.v, sp.len);
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
        decays[t] = token_inputs::<S>(it, t, 0, [qb, kb, vb, betab]);
    }
    let mut dsts = [None; MULTI_TOKENS];
    for (t, dst) in dsts.iter_mut().enumerate().take(nt) {
        *dst = p.store_row(ctx.ix.as_ref(), n, &sp, t).map(|w| sv.head(w, hv, head));
    }
    let (base, src_off, dsts) = (ctx.io.state.unwrap(), sv.head(r, hv, head), &dsts[..nt]);
    let step = MultiStep { base, src_off, dsts, kd, vd, toks, decays };
    // SAFETY: the source head and every destination head of this (sequence, value head) are in
    // the pool (plan) and touched by this item only: the plan refuses slots shared between
    // sequences when one of them writes; other items own other heads.
    unsafe {
        with_real!(sv.dtype, R => match p.layout {
            StateLayout::VK => decode_vk_multi::<S, R>(step, outs, rows),
            StateLayout::KV => match kv_columns::<S>(vd) / LANES {
                8 => decode_kv_multi::<S, R, 8>(step, outs, rows),
                4 => decode_kv_multi::<S, R, 4>(step, outs, rows),
                _ => decode_kv_multi::<S, R, 1>(step, outs, rows),
            },
        })
    };
    for t in 0..nt {
        let at = o_at.at([sp.b, sp.t0 + t, hv, 0]);
        // SAFETY: the output row of (sequence n, token t, head hv) belongs to this item.
        unsafe { scatter::<S>(ctx.io.o, o_dtype, at, o_at.strides[3], &outs[t * vd..(t + 1) * vd]) };
    }
}

impl CpuBackend {
    /// Runs every (sequence, value head) item, each with [`item_scratch`] f32 of scratch (on its
    /// stack unless the dimensions are unusually large). `idx`: `ssm_state_indices`,
    /// `num_accepted_tokens`.
    fn run_recurrent(
        &self,
        plan: &RecurrentPlan,
        gates: GateBytes<'_>,
        r: &mut DeltaRuleArgs<'_>,
    ) -> Result<(), CpuError> {
        let io =
            Io::new([&r.q, &r.k, &r.v], &r.cu_seqlens, r.initial_state.as_mut(), r.final_state.as_mut(), &mut r.o)?;
        let (ix, na) = (&r.ssm_state_indices, &r.num_accepted_tokens);
        host_opt("ssm_state_indices", ix)?;
        host_opt("num_accepted_tokens", na)?;
        let ctx = RecCtx { plan, io, gates, ix: *ix, na: *na };
        let d = plan.dims;
        self.for_each_item(d.seqs * d.v_heads, item_scratch(plan), None, &ctx);
        Ok(())
    }
}

impl Run<FusedRecurrentGatedDeltaRuleArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedRecurrentGatedDeltaRuleArgs<'_>>) -> Result<(), CpuError> {
        let (mut a, plan) = call.into_parts();
        let gates = GateBytes::Given { g: host_ref("g", &a.g)?, beta: host_opt("beta", &a.beta)?.map(|(b, _)| b) };
        self.run_recurrent(&plan, gates, &mut a.rule)
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
        self.run_recurrent(&plan, gates, &mut a.rule)
    }
}

impl Run<ssm_gdn::GdnDecodeStepArgs<'_>> for CpuBackend {
    type Error = CpuError;
    /// The conv update, then the recurrence on its output, each with this backend's kernel.
    fn run(&self, call: Planned<ssm_gdn::GdnDecodeStepArgs<'_>>) -> Result<(), CpuError> {
        let (args, _) = call.into_parts();
        // SAFETY: the conv call returns only when its output is written; the recurrence runs
        // after it, and no host slice of q/k/v is held in between.
        let (conv, step) = unsafe { args.into_parts() };
        self.run(conv)?;
        self.run(step)
    }
}
