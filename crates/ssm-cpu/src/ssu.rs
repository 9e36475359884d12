//! Selective state update on the CPU.
//!
//! Work items are (sequence, head) pairs, run in parallel when the plan says no slot is
//! shared between sequences (`alias_free`), in order otherwise (the reference's order).
//! Inside an item the loop is row-major: each state row `[dstate]` is loaded once, carried
//! in f32 through every token of the sequence (per-token stores in speculative mode), and
//! stored once — one streaming pass over the state, eight lanes at a time.

use half::{bf16, f16};
use ssm_ssu::philox::{round_f16_stochastic, sr_bits};
use ssm_ssu::{ParamForm, Route, SelectiveStateUpdateArgs, SsuPlan, TokenStrides};
use ssm_tensor::{DType, Planned, Run, TensorMut};

use crate::host::{MambaInputs, rd, rd_int, wr};
use crate::lanes::{gather, round8, scatter, softplus_lanes};
use crate::shared::{Scratch, SharedBuf};
use crate::simd::{LANES, Narrow, PowTwo, Real, Simd, SimdKernel, WideLanes, dispatch};
use crate::{CpuBackend, CpuError, require_host};

/// How far ahead the plain decode step prefetches state rows: at least this many rows…
const PREFETCH_ROWS: usize = 4;
/// …and at least this many bytes (a Mamba1 row of 16 f32 is one cache line: four rows ahead
/// would be 256 bytes, too close to hide the latency of a line)…
const PREFETCH_BYTES: usize = 1024;
/// …or this many for a bf16 or f16 state. Three rounds alternating 1 and 4 KiB for every row of the
/// bench (Mamba2-2.7B and Nemotron-H-8B, one and four tokens): bf16 rows 5–14 % more bytes per
/// second at 4 KiB, f32 rows −7 to +9 % (so they keep 1 KiB); Falcon-Mamba's bf16 rows within 2 %.
const PREFETCH_BYTES_16BIT: usize = 4096;
/// The longest speculative step [`spec_rows`] takes (one instantiation per length; vLLM's
/// speculative decoding verifies up to a few draft tokens, longer steps take the general path).
const SPEC_MAX: usize = 4;

struct Inputs<'a> {
    mamba: MambaInputs<'a>,
    d: Option<&'a [u8]>,
    dt_bias: Option<&'a [u8]>,
    z: Option<&'a [u8]>,
    sbi: Option<&'a [u8]>,
    dst: Option<&'a [u8]>,
    nacc: Option<&'a [u8]>,
    cu: Option<&'a [u8]>,
    /// `intermediate_state_indices`.
    entries: Option<&'a [u8]>,
    /// The Philox key of stochastic rounding (`rand_seed`'s value when given).
    seed: u64,
}

/// The decode scales of a block-scaled i16 / i8 state (`state_scale`) and of its intermediate
/// buffer (`intermediate_state_scales`); both `None` for a float state.
#[derive(Clone, Copy)]
struct Scales {
    state: Option<SharedBuf<f32>>,
    buffer: Option<SharedBuf<f32>>,
}

struct Item<'a, 's, St> {
    scratch: &'a mut Scratch<'s>,
    plan: &'a SsuPlan,
    inp: &'a Inputs<'a>,
    state: SharedBuf<St>,
    /// The intermediate-state buffer (the state's element type).
    buffer: Option<SharedBuf<St>>,
    scales: Scales,
    out: SharedBuf<u8>,
    seq: usize,
    head: usize,
    /// Rows `[p0, p1)` of the head (the whole head unless few items split it).
    rows: (usize, usize),
}

impl CpuBackend {
    fn ssu_typed<St: Real>(
        &self,
        plan: &SsuPlan,
        inp: &Inputs<'_>,
        (state, buffer): (SharedBuf<St>, Option<SharedBuf<St>>),
        scales: Scales,
        out: SharedBuf<u8>,
    ) {
        let heads = plan.dims.heads;
        let dim = plan.dims.dim;
        // Few (sequence, head) items (Mamba1: one head per sequence; small batches) leave threads
        // idle: split each head's rows into chunks so that there are about four items per thread.
        // Rows of one head are disjoint state rows and outputs, so chunks never share memory.
        let pairs = plan.dims.seqs * heads;
        let threads = self.par().threads();
        let chunks = if plan.alias_free && threads > 1 && pairs < 4 * threads {
            (4 * threads).div_ceil(pairs.max(1)).min(dim.div_ceil(64)).max(1)
        } else {
            1
        };
        let chunk = dim.div_ceil(chunks);
        let body = |i: usize, scratch: &mut Scratch<'_>| {
            let (pair, k) = (i / chunks, i % chunks);
            let rows = (k * chunk, ((k + 1) * chunk).min(dim));
            dispatch(Item {
                scratch,
                plan,
                inp,
                state,
                buffer,
                scales,
                out,
                seq: pair / heads,
                head: pair % heads,
                rows,
            });
        };
        let per_item = item_scratch(plan, chunk);
        self.for_each_scratch(pairs * chunks, per_item, !plan.alias_free, None, body);
    }
}

/// f32 scratch of one item of `rows` state rows, from the plan's dimensions alone: per token
/// B and C (`nv` each), dt and dA, per token and row the processed dt and z factor, and two
/// rows ([`Bufs`]). A sequence is at most one token (decode), `steps` (dense) or all rows (varlen) long.
fn item_scratch(plan: &SsuPlan, rows: usize) -> usize {
    let len = match plan.route {
        Route::OneToken => 1,
        Route::Dense { steps } => steps,
        Route::Varlen => plan.dims.rows,
    };
    Bufs::len(len, round8(plan.dims.dstate), round8(rows))
}

impl Run<SelectiveStateUpdateArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<SelectiveStateUpdateArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        require_host("state", args.state.device())?;
        fn opt<'t>(t: &Option<ssm_tensor::TensorRef<'t>>) -> Option<&'t [u8]> {
            t.as_ref().and_then(|t| t.host_bytes())
        }
        let mamba = MambaInputs::new([&args.x, &args.dt, &args.a, &args.b, &args.c])?;
        let sbi = opt(&args.state_batch_indices);
        let inp = Inputs {
            mamba,
            d: opt(&args.d),
            dt_bias: opt(&args.dt_bias),
            z: opt(&args.z),
            sbi,
            dst: opt(&args.dst_state_batch_indices).or(sbi),
            nacc: opt(&args.num_accepted_tokens),
            cu: opt(&args.cu_seqlens),
            entries: opt(&args.intermediate_state_indices),
            seed: plan.host_seed(args.rand_seed.as_ref()).unwrap_or(0),
        };
        let out =
            SharedBuf::new(args.out.host_bytes_mut().ok_or(CpuError::NotHost { arg: "out", device: plan.device })?);
        let scale = |t: Option<&mut TensorMut<'_>>, arg: &'static str| -> Result<Option<SharedBuf<f32>>, CpuError> {
            t.map(|t| {
                t.host_data_mut::<f32>().map(SharedBuf::new).map_err(|_| CpuError::NotHost { arg, device: plan.device })
            })
            .transpose()
        };
        let scales = Scales {
            state: scale(args.state_scale.as_mut(), "state_scale")?,
            buffer: scale(args.intermediate_state_scales.as_mut(), "intermediate_state_scales")?,
        };
        let (state, buffer) = (&mut args.state, &mut args.intermediate_states_buffer);
        match plan.dtypes.state {
            DType::F32 => self.ssu_typed(plan, &inp, state_bufs::<f32>(state, buffer, plan)?, scales, out),
            DType::BF16 => self.ssu_typed(plan, &inp, state_bufs::<bf16>(state, buffer, plan)?, scales, out),
            DType::F16 => self.ssu_typed(plan, &inp, state_bufs::<f16>(state, buffer, plan)?, scales, out),
            DType::I16 => self.ssu_typed(plan, &inp, state_bufs::<i16>(state, buffer, plan)?, scales, out),
            DType::I8 => self.ssu_typed(plan, &inp, state_bufs::<i8>(state, buffer, plan)?, scales, out),
            _ => unreachable!("plan admits float, i16 and i8 states only"),
        }
        Ok(())
    }
}

/// The state pool and the intermediate buffer (the plan gave it the state's dtype) as `St`
/// elements shared between items.
fn state_bufs<St: Real>(
    state: &mut TensorMut<'_>,
    buffer: &mut Option<TensorMut<'_>>,
    plan: &SsuPlan,
) -> Result<(SharedBuf<St>, Option<SharedBuf<St>>), CpuError> {
    let s = state.host_data_mut::<St>().map_err(|_| CpuError::NotHost { arg: "state", device: plan.device })?;
    let b = match buffer {
        Some(b) => Some(SharedBuf::new(
            b.host_data_mut::<St>()
                .map_err(|_| CpuError::NotHost { arg: "intermediate_states_buffer", device: plan.device })?,
        )),
        None => None,
    };
    Ok((SharedBuf::new(s), b))
}

impl<St: Real> SimdKernel for Item<'_, '_, St> {
    type Output = ();

    /// The stages of one item: resolve the sequence, gather its per-token vectors, then either
    /// the fused decode pass or the per-row factors and the general row loop.
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        // No closure in this body or the functions it calls may contain lane operations: a
        // closure is compiled without the caller's target features, which would turn every
        // intrinsic into a call. Lane code lives in `#[inline(always)]` functions.
        let Item { scratch, plan, inp, state, buffer, scales, out, seq, head, rows } = self;
        let Some(cx) = SeqCtx::resolve(plan, inp, seq, head) else { return };
        let nv = round8(plan.dims.dstate);
        let rp = round8(rows.1 - rows.0);
        let mut bufs = Bufs::split(scratch.take(Bufs::len(cx.len, nv, rp)), cx.len, nv, rp);
        fill_tokens::<S>(&cx, &mut bufs);
        if cx.plain_one_token(true) {
            match cx.final_store {
                true => decode_rows::<S, St, true>(&cx, &bufs, state, out, rows),
                false => decode_rows::<S, St, false>(&cx, &bufs, state, out, rows),
            }
            return;
        }
        row_factors::<S>(&cx, &mut bufs, rows);
        if cx.plain_one_token(false) {
            match cx.final_store {
                true => channel_rows::<S, St, true>(&cx, &mut bufs, state, out, rows),
                false => channel_rows::<S, St, false>(&cx, &mut bufs, state, out, rows),
            }
            return;
        }
        // The speculative rows advance a whole cache line per token (`L` chunks of the widest
        // lanes), so that each token's streaming stores fill whole lines.
        let line_chunks = 64 / (<S::Wide as WideLanes>::WIDTH * std::mem::size_of::<St>());
        let streamed = match (cx.plain_speculative(), cx.len, line_chunks) {
            (true, 2, 1) => spec_rows::<S, St, 2, 1>(&cx, &bufs, state, out, rows),
            (true, 3, 1) => spec_rows::<S, St, 3, 1>(&cx, &bufs, state, out, rows),
            (true, 4, 1) => spec_rows::<S, St, 4, 1>(&cx, &bufs, state, out, rows),
            (true, 2, 2) => spec_rows::<S, St, 2, 2>(&cx, &bufs, state, out, rows),
            (true, 3, 2) => spec_rows::<S, St, 3, 2>(&cx, &bufs, state, out, rows),
            (true, 4, 2) => spec_rows::<S, St, 4, 2>(&cx, &bufs, state, out, rows),
            (true, 2, 4) => spec_rows::<S, St, 2, 4>(&cx, &bufs, state, out, rows),
            (true, 3, 4) => spec_rows::<S, St, 3, 4>(&cx, &bufs, state, out, rows),
            (true, 4, 4) => spec_rows::<S, St, 4, 4>(&cx, &bufs, state, out, rows),
            _ => general_rows::<S, St>(&cx, &mut bufs, (state, buffer), scales, out, rows),
        };
        if streamed {
            S::store_fence();
        }
    }
}

/// One item's sequence, resolved: its tokens, its slots and what it stores. Scalar reads only
/// (no lanes), so its methods may be called from anywhere.
struct SeqCtx<'a> {
    plan: &'a SsuPlan,
    inp: &'a Inputs<'a>,
    /// Sequence.
    b: usize,
    /// Head and its group.
    h: usize,
    g: usize,
    /// Tokens of the sequence (at least one).
    len: usize,
    /// Row of the token strides' base (the first token in varlen, else the sequence).
    base_row: usize,
    /// Source slot and final destination slot (the sequence itself without a table).
    src: i64,
    dst_final: i64,
    /// The source is not the pad (a pad source starts from zeros).
    live: bool,
    /// Speculative mode with a live source: per-token stores through the destination table.
    spec_dsts: bool,
    /// Non-speculative mode storing the final state.
    final_store: bool,
    /// The intermediate-buffer entry every token's state goes to (a live source, not the pad).
    entry: Option<usize>,
    /// Tied parameters (one dt per token and head).
    tied: bool,
    /// `A[h, 0, 0]`.
    a_head: f32,
}

impl<'a> SeqCtx<'a> {
    /// Sequence bounds and slots of item (`b`, `h`); `None` for an empty sequence.
    #[inline(always)]
    fn resolve(plan: &'a SsuPlan, inp: &'a Inputs<'a>, b: usize, h: usize) -> Option<Self> {
        let ty = &plan.dtypes;
        let (start, len) = match plan.route {
            Route::OneToken => (b, 1),
            Route::Dense { steps } => (b * steps, steps),
            Route::Varlen => {
                let cu = plan.cu_seqlens.unwrap();
                let t = ty.cu_seqlens.unwrap();
                let lo = rd_int(inp.cu.unwrap(), t, cu.at([b]));
                let hi = rd_int(inp.cu.unwrap(), t, cu.at([b + 1]));
                (lo as usize, (hi - lo) as usize)
            }
        };
        if len == 0 {
            return None;
        }
        let col = match (inp.nacc, plan.num_accepted_tokens) {
            (Some(n), Some(s)) => ssm_ssu::start_column(rd_int(n, ty.num_accepted_tokens.unwrap(), s.at([b]))),
            _ => 0,
        };
        let (src, dst_final) = match (inp.sbi, plan.state_batch_indices, plan.dst_state_batch_indices) {
            (Some(t), Some(tab), Some(dtab)) => {
                let src = rd_int(t, tab.dtype, tab.strides.at([b, col]));
                // A speculative call stores each token to `dst[b, t]` and has no final store: its
                // `dst[b, col]` may lie past a table the plan sized for the tokens only.
                (src, if plan.spec { src } else { rd_int(inp.dst.unwrap(), dtab.dtype, dtab.strides.at([b, col])) })
            }
            _ => (b as i64, b as i64),
        };
        let table = plan.state_batch_indices.is_some();
        let live = !(table && plan.is_pad(src));
        let entry = plan.host_entry(inp.entries, b, src).filter(|_| live).map(|e| e as usize);
        let writes = plan.writes_state();
        Some(SeqCtx {
            plan,
            inp,
            b,
            h,
            g: h / plan.heads_per_group(),
            len,
            base_row: if plan.route == Route::Varlen { start } else { b },
            src,
            dst_final,
            live,
            spec_dsts: writes && plan.spec && live,
            final_store: writes && !plan.spec && live && !(table && plan.is_pad(dst_final)),
            entry,
            tied: plan.form == ParamForm::Tied,
            a_head: rd(inp.mamba.a, ty.a, plan.a.at([h, 0, 0])),
        })
    }

    /// The plain one-token step of the form `tied` (true: [`decode_rows`], false: the
    /// per-channel Mamba1 step, [`channel_rows`]): one token, a live row, no stochastic
    /// rounding, no intermediate buffer, a float state, whole lanes.
    #[inline(always)]
    fn plain_one_token(&self, tied: bool) -> bool {
        let plan = self.plan;
        self.len == 1
            && self.tied == tied
            && self.live
            && !plan.spec
            && plan.stochastic_rounding.is_none()
            && self.entry.is_none()
            && plan.state_scale.is_none()
            && plan.dims.dstate.is_multiple_of(LANES)
    }

    /// All of `A` as f32 elements when it is f32 with unit stride along dstate (the usual
    /// Mamba1 `A = -exp(A_log)`), so that a row's lanes load straight from memory.
    #[inline(always)]
    fn a_f32(&self) -> Option<&'a [f32]> {
        (self.plan.dtypes.a == DType::F32 && self.plan.a.strides[2] == 1)
            .then(|| bytemuck::try_cast_slice::<u8, f32>(self.inp.mamba.a).ok())
            .flatten()
    }

    /// A's row `[h, p, :]` as f32, zero-padded to `buf.len()` (whole lanes): `a_f32`'s own
    /// elements (see [`Self::a_f32`]) when given and the row needs no padding, else widened into
    /// `buf`.
    #[inline(always)]
    fn a_row<'b, S: Simd>(&self, a_f32: Option<&'b [f32]>, p: usize, buf: &'b mut [f32]) -> &'b [f32] {
        let (plan, n_st) = (self.plan, self.plan.dims.dstate);
        let at = plan.a.at([self.h, p, 0]);
        match a_f32 {
            Some(a) if n_st == buf.len() => &a[at..at + n_st],
            _ => {
                gather::<S>(self.inp.mamba.a, plan.dtypes.a, at, plan.a.strides[2], &mut buf[..n_st]);
                buf[n_st..].fill(0.0);
                buf
            }
        }
    }

    /// The plain speculative step: 2 to [`SPEC_MAX`] tokens, tied parameters, a live source
    /// storing every token's state to its destination row, no intermediate buffer, a float
    /// state, rows of whole cache lines of lanes (dstate a multiple of 32: [`spec_rows`]).
    #[inline(always)]
    fn plain_speculative(&self) -> bool {
        let plan = self.plan;
        (2..=SPEC_MAX).contains(&self.len)
            && self.tied
            && self.spec_dsts
            && self.entry.is_none()
            && plan.state_scale.is_none()
            && plan.dims.dstate.is_multiple_of(4 * LANES)
    }

    /// Element offset of token `t` of the sequence in a token-strided tensor.
    #[inline(always)]
    fn tok(&self, ts: &TokenStrides, t: usize) -> isize {
        self.plan.token_base(ts, self.b, self.base_row) + t as isize * ts.tok
    }

    /// dt + dt_bias of (token `t`, row `p`), before softplus.
    #[inline(always)]
    fn dt_raw(&self, t: usize, p: usize) -> f32 {
        let (plan, inp, ty) = (self.plan, self.inp, &self.plan.dtypes);
        let mut v = rd(inp.mamba.dt, ty.dt, plan.dt.at(self.tok(&plan.dt, t), self.h, p));
        if let (Some(bias), Some(s)) = (inp.dt_bias, plan.dt_bias) {
            v += rd(bias, ty.dt_bias.unwrap(), s.at([self.h, p]));
        }
        v
    }

    /// dt of (token `t`, row `p`), after softplus when the plan asks for it.
    #[inline(always)]
    fn dt_of(&self, t: usize, p: usize) -> f32 {
        let v = self.dt_raw(t, p);
        if self.plan.dt_softplus { if v <= 20.0 { (v.exp() + 1.0).ln() } else { v } } else { v }
    }

    /// `D[h, p]` (0 without `D`).
    #[inline(always)]
    fn d_of(&self, p: usize) -> f32 {
        match (self.inp.d, self.plan.d) {
            (Some(d), Some(s)) => rd(d, self.plan.dtypes.d.unwrap(), s.at([self.h, p])),
            _ => 0.0,
        }
    }

    /// `x` of (token `t`, row `p`).
    #[inline(always)]
    fn x_of(&self, t: usize, p: usize) -> f32 {
        let plan = self.plan;
        rd(self.inp.mamba.x, plan.dtypes.x, plan.x.at(self.tok(&plan.x, t), self.h, p))
    }

    /// Writes `y` as `out` of (token `t`, row `p`).
    #[inline(always)]
    fn write_out(&self, out: SharedBuf<u8>, t: usize, p: usize, y: f32) {
        let plan = self.plan;
        // SAFETY: the plan checked `out`'s shape and that its elements do not overlap; token
        // `t` of sequence b, head h, row p is written by this item only.
        unsafe { wr(out, plan.dtypes.out, plan.out.at(self.tok(&plan.out, t), self.h, p), y) };
    }
}

/// The item's f32 scratch: per token B (times dt when tied) and C (`nv` each), dt and dA; two
/// rows (the state row and A's row of the per-channel form, where A is not f32 in place); per
/// token and row of the item the processed dt and the z factor (`rp` each).
struct Bufs<'s> {
    bv: &'s mut [f32],
    cv: &'s mut [f32],
    dts: &'s mut [f32],
    das: &'s mut [f32],
    row: &'s mut [f32],
    a_row: &'s mut [f32],
    dt_rows: &'s mut [f32],
    z_rows: &'s mut [f32],
    nv: usize,
    rp: usize,
}

impl<'s> Bufs<'s> {
    /// Elements of the scratch of a sequence of `len` tokens.
    #[inline(always)]
    fn len(len: usize, nv: usize, rp: usize) -> usize {
        len * (2 * nv + 2) + 2 * nv + 2 * len * rp
    }

    #[inline(always)]
    fn split(buf: &'s mut [f32], len: usize, nv: usize, rp: usize) -> Self {
        let (bv, rest) = buf.split_at_mut(len * nv);
        let (cv, rest) = rest.split_at_mut(len * nv);
        let (dts, rest) = rest.split_at_mut(len);
        let (das, rest) = rest.split_at_mut(len);
        let (row, rest) = rest.split_at_mut(nv);
        let (a_row, rest) = rest.split_at_mut(nv);
        let (dt_rows, rest) = rest.split_at_mut(len * rp);
        let z_rows = &mut rest[..len * rp];
        Bufs { bv, cv, dts, das, row, a_row, dt_rows, z_rows, nv, rp }
    }
}

/// Per-token vectors: B (times dt in the tied form) and C, zero-padded to `nv`; tied dt and dA.
#[inline(always)]
fn fill_tokens<S: Simd>(cx: &SeqCtx<'_>, bufs: &mut Bufs<'_>) {
    let (plan, inp, ty, nv) = (cx.plan, cx.inp, &cx.plan.dtypes, bufs.nv);
    let n_st = plan.dims.dstate;
    for t in 0..cx.len {
        let (bb, cb) = (cx.tok(&plan.b, t), cx.tok(&plan.c, t));
        let dtv = if cx.tied { cx.dt_of(t, 0) } else { 1.0 };
        bufs.dts[t] = dtv;
        bufs.das[t] = (cx.a_head * dtv).exp();
        let (brow, crow) = (&mut bufs.bv[t * nv..(t + 1) * nv], &mut bufs.cv[t * nv..(t + 1) * nv]);
        gather::<S>(inp.mamba.b, ty.b, plan.b.at(bb, cx.g, 0), plan.b.dim, &mut brow[..n_st]);
        gather::<S>(inp.mamba.c, ty.c, plan.c.at(cb, cx.g, 0), plan.c.dim, &mut crow[..n_st]);
        brow[n_st..].fill(0.0);
        crow[n_st..].fill(0.0);
        let dts = S::splat(dtv);
        for n in (0..nv).step_by(LANES) {
            S::load(&brow[n..]).mul(dts).store(&mut brow[n..]);
        }
    }
}

/// The plain decode step ([`SeqCtx::plain_one_token`]), eight rows at a time: per row one fused
/// pass, the state read, updated and stored chunk by chunk without the f32 row buffer; per block
/// of rows `x`, `D`, z's factor and `out` in lanes ([`x_rows`], [`finish_rows`]). `STORE`: the
/// final state is stored (`SeqCtx::final_store`).
#[inline(always)]
fn decode_rows<S: Simd + PowTwo, St: Real, const STORE: bool>(
    cx: &SeqCtx<'_>,
    bufs: &Bufs<'_>,
    state: SharedBuf<St>,
    out: SharedBuf<u8>,
    (p_lo, p_hi): (usize, usize),
) {
    let (plan, inp, h, n_st) = (cx.plan, cx.inp, cx.h, cx.plan.dims.dstate);
    let (src, dst) = (cx.src as usize, cx.dst_final as usize);
    let zb = plan.z.map_or(0, |zs| cx.tok(&zs, 0));
    let (bt, ct) = (&bufs.bv[..n_st], &bufs.cv[..n_st]);
    // Rows on the widest lanes where they tile `dstate` (sixteen with AVX-512: half the
    // conversions, updates and stores per element of a 16-bit state), else on eight.
    let wide = n_st.is_multiple_of(<S::Wide as WideLanes>::WIDTH);
    let mut p = p_lo;
    while p < p_hi {
        let m = LANES.min(p_hi - p);
        let xr = x_rows::<S>(cx, 0, p, m);
        let mut acc = [S::splat(0.0); LANES];
        for (r, acc_r) in acc.iter_mut().enumerate().take(m) {
            let q = p + r;
            let sp = state.elems::<St>(plan.state.at([src, h, q, 0]), n_st);
            // Without a final store the destination may be the pad: no address is formed.
            let dp = if STORE { state.elems::<St>(plan.state.at([dst, h, q, 0]), n_st) } else { sp };
            prefetch_ahead::<S, St>(plan, sp, q, p_hi);
            let (da, x) = (bufs.das[0], xr[r]);
            // SAFETY: `bt` and `ct` hold `dstate` elements, a multiple of the lanes' width (of
            // `S::Wide`'s when `wide`, of `LANES` by `plain_one_token`); `sp` and `dp` are rows
            // of the pool that the plan checked and this item owns.
            *acc_r = unsafe {
                if wide {
                    decode_row::<S, S::Wide, St, STORE>(sp, dp, bt, ct, da, x, S::mul_add_wide)
                } else {
                    decode_row::<S, Narrow<S>, St, STORE>(sp, dp, bt, ct, da, x, Narrow::mul_add_to)
                }
            };
        }
        let z = match (inp.z, plan.z) {
            (Some(z), Some(zs)) => {
                let mut v = [0.0f32; LANES];
                gather::<S>(z, plan.dtypes.z.unwrap(), zs.at(zb, h, p), zs.dim, &mut v[..m]);
                Some(S::load(&v).silu())
            }
            _ => None,
        };
        finish_rows::<S>(cx, out, acc, &xr, z, 0, p, m);
        p += m;
    }
}

/// One row of [`decode_rows`] on the lanes `W` (the level's widest, [`Simd::Wide`], or its own
/// eight, [`Narrow`]): each chunk of the state read, updated (`s·dA + B·x`), stored when `STORE`,
/// and multiplied into the row's sum by `sum` ([`Simd::mul_add_wide`] or [`Narrow::mul_add_to`]:
/// eight lanes at a time in the eight-lane order, so the row's sum has the same bits on any `W`).
///
/// # Safety
/// `bt.len() == ct.len() == dstate`, a multiple of `W::WIDTH`; `sp` (and, when `STORE`, `dp`)
/// valid for `dstate` elements of a row this item owns, `sp`'s chunk read before `dp`'s is stored
/// (they may be the same row), through no live reference.
#[inline(always)]
unsafe fn decode_row<S: Simd, W: WideLanes, St: Real, const STORE: bool>(
    sp: *const St,
    dp: *mut St,
    bt: &[f32],
    ct: &[f32],
    da: f32,
    x: f32,
    sum: impl Fn(W, W, S) -> S,
) -> S {
    let (da, xs) = (W::splat(da), W::splat(x));
    let mut a = S::splat(0.0);
    let mut n = 0;
    while n < bt.len() {
        // SAFETY: `n + WIDTH ≤ dstate` (the caller's contract).
        unsafe {
            let v = St::load_wide::<W>(sp.add(n)).mul_add(da, W::load(bt.as_ptr().add(n)).mul(xs));
            if STORE {
                St::store_wide(v, dp.add(n));
            }
            a = sum(v, W::load(ct.as_ptr().add(n)), a);
        }
        n += W::WIDTH;
    }
    a
}

/// Prefetches the state row [`PREFETCH_ROWS`] rows (or [`PREFETCH_BYTES`], [`PREFETCH_BYTES_16BIT`]
/// for a bf16 or f16 state, whichever is further) after row `q` (whose first element is at `row`) while that is still one of the item's rows
/// (`< p_hi`), every cache line of it, so that several rows of loads are in flight. A hint
/// only: it never faults.
#[inline(always)]
fn prefetch_ahead<S: Simd, St: Real>(plan: &SsuPlan, row: *const St, q: usize, p_hi: usize) {
    let row_bytes = plan.dims.dstate * std::mem::size_of::<St>();
    let bytes = if matches!(St::DTYPE, DType::BF16 | DType::F16) { PREFETCH_BYTES_16BIT } else { PREFETCH_BYTES };
    let rows = PREFETCH_ROWS.max(bytes / row_bytes.max(1));
    if q + rows < p_hi {
        let ahead = row.wrapping_offset(rows as isize * plan.state.strides[2]).cast::<u8>();
        for line in (0..row_bytes).step_by(64) {
            S::prefetch(ahead.wrapping_add(line));
        }
    }
}

/// `x` of rows `p..p + m` of token `t` as f32, zeros past `m`.
#[inline(always)]
fn x_rows<S: Simd>(cx: &SeqCtx<'_>, t: usize, p: usize, m: usize) -> [f32; LANES] {
    let plan = cx.plan;
    let mut xr = [0.0f32; LANES];
    gather::<S>(cx.inp.mamba.x, plan.dtypes.x, plan.x.at(cx.tok(&plan.x, t), cx.h, p), plan.x.dim, &mut xr[..m]);
    xr
}

/// The end of a block of rows `p..p + m` of token `t`: `y = Σ + x·D` lane-wise from the rows'
/// accumulators (`acc[r]` of row `p + r`; [`Simd::reduce_add_rows`]), times z's factor when given,
/// written to `out`. The same operations as the scalar `acc.reduce_add() + x·D` per row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn finish_rows<S: Simd>(
    cx: &SeqCtx<'_>,
    out: SharedBuf<u8>,
    acc: [S; LANES],
    xr: &[f32; LANES],
    z: Option<S>,
    t: usize,
    p: usize,
    m: usize,
) {
    let (plan, inp, ty) = (cx.plan, cx.inp, &cx.plan.dtypes);
    let mut d = [0.0f32; LANES];
    if let (Some(dv), Some(s)) = (inp.d, plan.d) {
        gather::<S>(dv, ty.d.unwrap(), s.at([cx.h, p]), s.strides[1], &mut d[..m]);
    }
    let mut y = S::reduce_add_rows(acc).add(S::load(xr).mul(S::load(&d)));
    if let Some(z) = z {
        y = y.mul(z);
    }
    let mut yr = [0.0f32; LANES];
    y.store(&mut yr);
    // SAFETY: the plan checked `out`'s shape and that its elements do not overlap; rows
    // `p..p + m` of this token and head are written by this item only.
    unsafe { scatter::<S>(out, ty.out, plan.out.at(cx.tok(&plan.out, t), cx.h, p), plan.out.dim, &yr[..m]) };
}

/// The plain per-channel decode step ([`SeqCtx::plain_one_token`], Mamba1's decode), eight
/// rows at a time: per row one fused pass as [`decode_rows`], with the row's `exp(A·dt)` and
/// `B·dt` in lanes and no f32 row buffer; per block of rows `x`, `D`, the z factor and `out` in
/// lanes and the eight row sums reduced together ([`Simd::reduce_add_rows`]). The same operations
/// in the same order as [`general_rows`] with [`channel_step`] (bit-identical); the row factors
/// (dt after softplus, z's factor) were computed before by [`row_factors`]. `STORE`: the final
/// state is stored (`SeqCtx::final_store`).
#[inline(always)]
fn channel_rows<S: Simd + PowTwo, St: Real, const STORE: bool>(
    cx: &SeqCtx<'_>,
    bufs: &mut Bufs<'_>,
    state: SharedBuf<St>,
    out: SharedBuf<u8>,
    (p_lo, p_hi): (usize, usize),
) {
    let (plan, inp, h, n_st) = (cx.plan, cx.inp, cx.h, cx.plan.dims.dstate);
    let (src, dst) = (cx.src as usize, cx.dst_final as usize);
    let has_z = inp.z.is_some() && plan.z.is_some();
    let a_f32 = cx.a_f32();
    // A 16-bit state's rows on the widest lanes where they tile `dstate` (sixteen with AVX-512:
    // one `exp` per sixteen elements of a Mamba1 row of 16), else on eight. Falcon-Mamba-7B,
    // two builds alternating twice, µs per call at batch 8 / 64 / 256: bf16 2–4 % less time on
    // sixteen lanes, f32 3–7 % more (so f32 rows stay on eight).
    let wide = std::mem::size_of::<St>() < 4 && n_st.is_multiple_of(<S::Wide as WideLanes>::WIDTH);
    let mut p = p_lo;
    while p < p_hi {
        let m = LANES.min(p_hi - p);
        let at = p - p_lo;
        let xr = x_rows::<S>(cx, 0, p, m);
        let mut acc = [S::splat(0.0); LANES];
        for (r, acc_r) in acc.iter_mut().enumerate().take(m) {
            let q = p + r;
            let a_row = cx.a_row::<S>(a_f32, q, bufs.a_row);
            let sp = state.elems::<St>(plan.state.at([src, h, q, 0]), n_st);
            // Without a final store the destination may be the pad: no address is formed.
            let dp = if STORE { state.elems::<St>(plan.state.at([dst, h, q, 0]), n_st) } else { sp };
            prefetch_ahead::<S, St>(plan, sp, q, p_hi);
            let (dt, x, bt, ct) = (bufs.dt_rows[at + r], xr[r], &bufs.bv[..n_st], &bufs.cv[..n_st]);
            // SAFETY: A's row, `bt` and `ct` hold `dstate` elements, a multiple of the lanes'
            // width (of `S::Wide`'s when `wide`, of `LANES` by `plain_one_token`); `sp` and `dp`
            // are rows of the pool that the plan checked and this item owns.
            *acc_r = unsafe {
                if wide {
                    channel_row::<S, S::Wide, St, STORE>(sp, dp, (&a_row[..n_st], bt, ct), dt, x, S::mul_add_wide)
                } else {
                    channel_row::<S, Narrow<S>, St, STORE>(sp, dp, (&a_row[..n_st], bt, ct), dt, x, Narrow::mul_add_to)
                }
            };
        }
        let z = if has_z { Some(S::load(&bufs.z_rows[at..])) } else { None };
        finish_rows::<S>(cx, out, acc, &xr, z, 0, p, m);
        p += m;
    }
}

/// One row of [`channel_rows`] on the lanes `W` (as [`decode_row`]): per chunk `dA = e^(A·dt)`,
/// `s·dA + (B·dt)·x` stored when `STORE`, and summed with `C` by `sum`, eight lanes at a time in
/// the eight-lane order.
///
/// # Safety
/// `a`, `bt` and `ct` hold `dstate` elements, a multiple of `W::WIDTH`; `sp` (and, when `STORE`,
/// `dp`) valid for `dstate` elements of a row this item owns, `sp`'s chunk read before `dp`'s is
/// stored (they may be the same row), through no live reference.
#[inline(always)]
unsafe fn channel_row<S: Simd, W: WideLanes, St: Real, const STORE: bool>(
    sp: *const St,
    dp: *mut St,
    (a, bt, ct): (&[f32], &[f32], &[f32]),
    dt: f32,
    x: f32,
    sum: impl Fn(W, W, S) -> S,
) -> S {
    let (dtl, xs) = (W::splat(dt), W::splat(x));
    let mut acc = S::splat(0.0);
    let mut n = 0;
    while n < bt.len() {
        // SAFETY: `n + WIDTH ≤ dstate` (the caller's contract).
        unsafe {
            let da = W::load(a.as_ptr().add(n)).mul(dtl).exp();
            let bdt = W::load(bt.as_ptr().add(n)).mul(dtl);
            let v = St::load_wide::<W>(sp.add(n)).mul_add(da, bdt.mul(xs));
            if STORE {
                St::store_wide(v, dp.add(n));
            }
            acc = sum(v, W::load(ct.as_ptr().add(n)), acc);
        }
        n += W::WIDTH;
    }
    acc
}

/// The plain speculative step ([`SeqCtx::plain_speculative`]) of `T` tokens: per row, a cache
/// line of the source row at a time (`L` chunks of the level's widest lanes, [`Simd::Wide`]) is
/// read once and carried in registers through the tokens, stored after each token to that token's
/// destination row (streaming stores for a row other than the source, each token's filling whole
/// lines), and folded into the token's output sum eight lanes at a time in the eight-lane order
/// ([`Simd::mul_add_wide`]). The same operations in the same order as [`general_rows`]
/// (bit-identical), without its f32 row buffer written and read back per token or its per-(row,
/// token) reads of the destination table. Rows go eight at a time, each token's `x`, `D`, z's
/// factor and `out` in lanes ([`x_rows`], [`finish_rows`]). `L · S::Wide::WIDTH` elements make a
/// 64-byte line of `St` (the caller picks `L`; at most 4). Returns whether streaming stores were
/// issued (the caller fences).
#[inline(always)]
fn spec_rows<S: Simd + PowTwo, St: Real, const T: usize, const L: usize>(
    cx: &SeqCtx<'_>,
    bufs: &Bufs<'_>,
    state: SharedBuf<St>,
    out: SharedBuf<u8>,
    (p_lo, p_hi): (usize, usize),
) -> bool {
    let (plan, h, n_st, nv) = (cx.plan, cx.h, cx.plan.dims.dstate, bufs.nv);
    let w = <S::Wide as WideLanes>::WIDTH;
    debug_assert_eq!(L * w * std::mem::size_of::<St>(), 64);
    let src = cx.src as usize;
    // Each token's destination slot (`None`: the pad, no store), read once per item.
    let mut dst = [None; T];
    for (t, d) in dst.iter_mut().enumerate() {
        let ds = match plan.dst_state_batch_indices {
            Some(dtab) => rd_int(cx.inp.dst.unwrap(), dtab.dtype, dtab.strides.at([cx.b, t])),
            None => 0,
        };
        *d = (!plan.is_pad(ds)).then_some(ds as usize);
    }
    let mut da = [S::Wide::splat(0.0); T];
    for t in 0..T {
        da[t] = S::Wide::splat(bufs.das[t]);
    }
    let has_z = cx.inp.z.is_some() && plan.z.is_some();
    let chunk_bytes = w * std::mem::size_of::<St>();
    let mut streamed = false;
    let mut p = p_lo;
    while p < p_hi {
        let m = LANES.min(p_hi - p);
        let mut xr = [[0.0f32; LANES]; T];
        for (t, x) in xr.iter_mut().enumerate() {
            *x = x_rows::<S>(cx, t, p, m);
        }
        let mut acc = [[S::splat(0.0); LANES]; T];
        for r in 0..m {
            let q = p + r;
            let sp = state.elems::<St>(plan.state.at([src, h, q, 0]), n_st);
            prefetch_ahead::<S, St>(plan, sp, q, p_hi);
            let mut xs = [S::Wide::splat(0.0); T];
            let (mut dptr, mut stream) = ([std::ptr::null_mut::<St>(); T], [false; T]);
            for t in 0..T {
                xs[t] = S::Wide::splat(xr[t][r]);
                if let Some(d) = dst[t] {
                    // `d` was checked by the plan; (d, h) is owned by this item (alias_free) or
                    // items run in order. A row other than the source is write-only here.
                    dptr[t] = state.elems::<St>(plan.state.at([d, h, q, 0]), n_st);
                    stream[t] = d != src && (dptr[t] as usize).is_multiple_of(chunk_bytes);
                }
            }
            let mut a = [S::splat(0.0); T];
            for n in (0..n_st).step_by(L * w) {
                let mut v = [S::Wide::splat(0.0); L];
                for (l, vl) in v.iter_mut().enumerate() {
                    // SAFETY: the plan checked `src` against the pool; `n + L·w ≤ dstate` (whole
                    // lines); every chunk of the line is read before any store below (a
                    // destination may be the source row), through no live reference.
                    *vl = unsafe { St::load_wide::<S::Wide>(sp.add(n + l * w)) };
                }
                for t in 0..T {
                    for (l, vl) in v.iter_mut().enumerate() {
                        // SAFETY: `t·nv + n + (l + 1)·w ≤ (t + 1)·nv`: inside token t's B.
                        let b = unsafe { S::Wide::load(bufs.bv.as_ptr().add(t * nv + n + l * w)) };
                        *vl = vl.mul_add(da[t], b.mul(xs[t]));
                    }
                    if let Some(dp) = dst[t].map(|_| dptr[t]) {
                        for (l, &vl) in v.iter().enumerate() {
                            // SAFETY: inside the destination row (`n + L·w ≤ dstate`), aligned
                            // to the chunk when streaming (checked above); no reference to it
                            // alive.
                            unsafe {
                                if stream[t] {
                                    St::stream_wide(vl, dp.add(n + l * w));
                                } else {
                                    St::store_wide(vl, dp.add(n + l * w));
                                }
                            }
                        }
                    }
                    for (l, &vl) in v.iter().enumerate() {
                        // SAFETY: as B's load above, inside token t's C.
                        let c = unsafe { S::Wide::load(bufs.cv.as_ptr().add(t * nv + n + l * w)) };
                        a[t] = S::mul_add_wide(vl, c, a[t]);
                    }
                }
            }
            for t in 0..T {
                acc[t][r] = a[t];
                streamed |= stream[t];
            }
        }
        for t in 0..T {
            let z = if has_z { Some(S::load(&bufs.z_rows[t * bufs.rp + (p - p_lo)..])) } else { None };
            finish_rows::<S>(cx, out, acc[t], &xr[t], z, t, p, m);
        }
        p += m;
    }
    streamed
}

/// The scalar per-row work of the general path, eight rows at a time: softplus of dt + dt_bias
/// (per-channel form; the tied form has it per token) and z's silu factor, so that no row pays
/// scalar `exp`/`ln` calls.
#[inline(always)]
fn row_factors<S: Simd + PowTwo>(cx: &SeqCtx<'_>, bufs: &mut Bufs<'_>, (p_lo, p_hi): (usize, usize)) {
    let (plan, inp, ty, h) = (cx.plan, cx.inp, &cx.plan.dtypes, cx.h);
    let z = inp.z.zip(plan.z);
    for t in 0..cx.len {
        let (zb, db) = (plan.z.map_or(0, |zs| cx.tok(&zs, t)), cx.tok(&plan.dt, t));
        let mut p = p_lo;
        while p < p_hi {
            let m = LANES.min(p_hi - p);
            let at = t * bufs.rp + (p - p_lo);
            if !cx.tied {
                // dt + dt_bias of eight rows (`SeqCtx::dt_raw`'s sum, lane-wise).
                let (mut v, mut bias) = ([0.0f32; LANES], [0.0f32; LANES]);
                gather::<S>(inp.mamba.dt, ty.dt, plan.dt.at(db, h, p), plan.dt.dim, &mut v[..m]);
                let mut lanes = S::load(&v);
                if let (Some(b), Some(s)) = (inp.dt_bias, plan.dt_bias) {
                    gather::<S>(b, ty.dt_bias.unwrap(), s.at([h, p]), s.strides[1], &mut bias[..m]);
                    lanes = lanes.add(S::load(&bias));
                }
                let lanes = if plan.dt_softplus { softplus_lanes(lanes) } else { lanes };
                lanes.store(&mut bufs.dt_rows[at..]);
            }
            if let Some((z, zs)) = z {
                let mut v = [0.0f32; LANES];
                gather::<S>(z, ty.z.unwrap(), zs.at(zb, h, p), zs.dim, &mut v[..m]);
                let zl = S::load(&v);
                zl.silu().store(&mut bufs.z_rows[at..]);
            }
            p += LANES;
        }
    }
}

/// The general path: each state row loaded once (zeros for a pad source), carried in f32
/// through every token (per-token stores in speculative mode and to the intermediate buffer)
/// and stored once. An i16 / i8 state's rows are scaled on load and quantized on every store, their
/// decode scales written beside them. Returns whether streaming stores were issued (the caller
/// fences).
#[inline(always)]
fn general_rows<S: Simd + PowTwo, St: Real>(
    cx: &SeqCtx<'_>,
    bufs: &mut Bufs<'_>,
    (state, buffer): (SharedBuf<St>, Option<SharedBuf<St>>),
    scales: Scales,
    out: SharedBuf<u8>,
    (p_lo, p_hi): (usize, usize),
) -> bool {
    let (plan, h, n_st) = (cx.plan, cx.h, cx.plan.dims.dstate);
    let has_z = cx.inp.z.is_some() && plan.z.is_some();
    let mut streamed = false;
    for p in p_lo..p_hi {
        if cx.live {
            let off = plan.state.at([cx.src as usize, h, p, 0]);
            // SAFETY: the plan checked `src` against the pool and the state layout, so
            // `off..off + dstate` is inside the state; this item owns (src, h) now.
            let srow = unsafe { std::slice::from_raw_parts(state.elems::<St>(off, n_st), n_st) };
            load_row::<S, St>(srow, bufs.row);
            if let (Some(sc), Some(st)) = (scales.state, plan.state_scale) {
                // SAFETY: the plan checked the scale tensor's shape against the pool's; (src, h) is
                // this item's.
                let decode = unsafe { *sc.elems::<f32>(st.at([cx.src as usize, h, p]), 1) };
                bufs.row[..n_st].iter_mut().for_each(|v| *v *= decode);
            }
        } else {
            bufs.row.iter_mut().for_each(|v| *v = 0.0);
        }
        let d_p = cx.d_of(p);
        for t in 0..cx.len {
            let ds = match (cx.spec_dsts, plan.dst_state_batch_indices) {
                (true, Some(dtab)) => rd_int(cx.inp.dst.unwrap(), dtab.dtype, dtab.strides.at([cx.b, t])),
                _ => 0,
            };
            let xv = cx.x_of(t, p);
            let at = t * bufs.rp + (p - p_lo);
            let acc = if cx.tied { tied_step::<S>(bufs, t, xv) } else { channel_step::<S>(cx, bufs, t, p, at, xv) };
            if cx.spec_dsts && !plan.is_pad(ds) {
                let off = plan.state.at([ds as usize, h, p, 0]);
                // `ds` was checked by the plan; (ds, h) is owned by this item (alias_free) or
                // items run in order. A column other than the source is write-only here.
                let dptr = state.elems::<St>(off, n_st);
                match (scales.state, plan.state_scale) {
                    (Some(sc), Some(st)) => {
                        store_scaled_row(dptr, n_st, bufs.row, sc.elems::<f32>(st.at([ds as usize, h, p]), 1))
                    }
                    _ => streamed |= store_token_row::<S, St>(dptr, n_st, bufs.row, ds != cx.src),
                }
            }
            if let (Some(e), Some(ip), Some(buffer)) = (cx.entry, plan.intermediate, buffer) {
                // The plan checked the entry and the step against the buffer; entry rows are
                // owned by this item (alias_free) or items run in order. Write-only.
                let dptr = buffer.elems::<St>(ip.at(e, t, h, p, 0), n_st);
                match (scales.buffer, ip.scales) {
                    (Some(sc), Some(st)) => {
                        store_scaled_row(dptr, n_st, bufs.row, sc.elems::<f32>(st.at([e, t, h, p]), 1))
                    }
                    _ => streamed |= store_token_row::<S, St>(dptr, n_st, bufs.row, true),
                }
            }
            let mut y = acc + xv * d_p;
            if has_z {
                y *= bufs.z_rows[at];
            }
            cx.write_out(out, t, p, y);
        }
        if cx.final_store {
            final_store_row::<S, St>(cx, state, scales, bufs.row, p);
        }
    }
    streamed
}

/// Token `t` of the tied form on the row: `s = s·dA + B·dt·x`; returns `Σ s·C`.
#[inline(always)]
fn tied_step<S: Simd + PowTwo>(bufs: &mut Bufs<'_>, t: usize, xv: f32) -> f32 {
    let nv = bufs.nv;
    let (bt, ct) = (&bufs.bv[t * nv..(t + 1) * nv], &bufs.cv[t * nv..(t + 1) * nv]);
    let (da, xs) = (S::splat(bufs.das[t]), S::splat(xv));
    let mut acc = S::splat(0.0);
    for n in (0..nv).step_by(LANES) {
        let s = S::load(&bufs.row[n..]).mul_add(da, S::load(&bt[n..]).mul(xs));
        s.store(&mut bufs.row[n..]);
        acc = s.mul_add(S::load(&ct[n..]), acc);
    }
    acc.reduce_add()
}

/// Token `t` of the per-channel form on row `p`: `s = s·exp(A·dt) + B·dt·x` with the row's dt
/// (at `at` of the row factors); returns `Σ s·C`.
#[inline(always)]
fn channel_step<S: Simd + PowTwo>(cx: &SeqCtx<'_>, bufs: &mut Bufs<'_>, t: usize, p: usize, at: usize, xv: f32) -> f32 {
    let nv = bufs.nv;
    let (bt, ct) = (&bufs.bv[t * nv..(t + 1) * nv], &bufs.cv[t * nv..(t + 1) * nv]);
    let (dtl, xs) = (S::splat(bufs.dt_rows[at]), S::splat(xv));
    let a_row = cx.a_row::<S>(cx.a_f32(), p, bufs.a_row);
    let mut acc = S::splat(0.0);
    for n in (0..nv).step_by(LANES) {
        let da = S::load(&a_row[n..]).mul(dtl).exp();
        let s = S::load(&bufs.row[n..]).mul_add(da, S::load(&bt[n..]).mul(dtl).mul(xs));
        s.store(&mut bufs.row[n..]);
        acc = s.mul_add(S::load(&ct[n..]), acc);
    }
    acc.reduce_add()
}

/// Stores the row after a token at `dptr` (a speculative destination slot's row, or an
/// intermediate-buffer row: `n_st` = dstate elements the plan checked and this item owns). A row that
/// is `write_only` in this call gets streaming stores, which skip the read for ownership of its
/// lines. Returns whether it used them.
#[inline(always)]
fn store_token_row<S: Simd + PowTwo, St: Real>(dptr: *mut St, n_st: usize, row: &[f32], write_only: bool) -> bool {
    let lane_bytes = LANES * std::mem::size_of::<St>();
    if write_only && n_st.is_multiple_of(LANES) && (dptr as usize).is_multiple_of(lane_bytes) {
        for n in (0..n_st).step_by(LANES) {
            // SAFETY: `n + 8 ≤ dstate`, inside the destination row; aligned (checked above); no
            // reference to the row is alive.
            unsafe { St::stream::<S>(S::load(&row[n..]), dptr.add(n)) };
        }
        true
    } else {
        // SAFETY: as above.
        let drow = unsafe { std::slice::from_raw_parts_mut(dptr, n_st) };
        store_row::<S, St>(row, drow);
        false
    }
}

/// Stores a row of a block-scaled state at `dptr` (`n_st` elements the plan checked and
/// this item owns) quantized as [`ssm_ssu::quant`] defines it, and its decode scale at
/// `scale` (checked and owned alike). `St` is `i16` or `i8` (the plan admits scales with them
/// only).
#[inline(always)]
fn store_scaled_row<St: Real>(dptr: *mut St, n_st: usize, row: &[f32], scale: *mut f32) {
    use ssm_ssu::quant::{limit, row_amax, scales};
    let lim = limit(St::DTYPE).expect("the plan admits scales with an integer state only");
    let (encode, decode) = scales(row_amax(&row[..n_st]), lim);
    // SAFETY: as documented above; no other reference to the row or the scale is alive.
    let drow = unsafe { std::slice::from_raw_parts_mut(dptr, n_st) };
    for (q, &v) in drow.iter_mut().zip(row) {
        *q = St::from_f32(v * encode);
    }
    // SAFETY: as above.
    unsafe { *scale = decode };
}

/// Stores the final row into the destination slot (stochastic rounding if the plan asks;
/// quantized with its scale for an i16 / i8 state).
#[inline(always)]
fn final_store_row<S: Simd + PowTwo, St: Real>(
    cx: &SeqCtx<'_>,
    state: SharedBuf<St>,
    scales: Scales,
    row: &[f32],
    p: usize,
) {
    let (plan, h, n_st) = (cx.plan, cx.h, cx.plan.dims.dstate);
    let off = plan.state.at([cx.dst_final as usize, h, p, 0]);
    if let (Some(sc), Some(st)) = (scales.state, plan.state_scale) {
        // `dst_final` was checked by the plan; (dst_final, h) is owned by this item.
        let scale = sc.elems::<f32>(st.at([cx.dst_final as usize, h, p]), 1);
        store_scaled_row(state.elems::<St>(off, n_st), n_st, row, scale);
        return;
    }
    // SAFETY: `dst_final` was checked by the plan; (dst_final, h) is owned by this item.
    let drow = unsafe { std::slice::from_raw_parts_mut(state.elems::<St>(off, n_st), n_st) };
    match plan.stochastic_rounding {
        None => store_row::<S, St>(row, drow),
        Some(sr) => {
            let st = plan.state.strides;
            let base = cx.src as isize * st[0] + h as isize * st[1] + p as isize * st[2];
            for n in 0..n_st {
                let pair = (base + (n - n % 2) as isize * st[3]) as u64;
                let r = sr_bits(cx.inp.seed, sr.rounds(), pair, n % 2 == 1);
                let v = round_f16_stochastic(row[n], r);
                // The plan admits stochastic rounding for f16 states only.
                drow[n] = St::from_f32(v.to_f32());
            }
        }
    }
}

#[inline(always)]
fn load_row<S: Simd, St: Real>(src: &[St], row: &mut [f32]) {
    let n = src.len();
    let full = n / LANES * LANES;
    for i in (0..full).step_by(LANES) {
        St::load::<S>(&src[i..]).store(&mut row[i..]);
    }
    for i in full..n {
        row[i] = src[i].to_f32();
    }
    for v in &mut row[n..] {
        *v = 0.0;
    }
}

#[inline(always)]
fn store_row<S: Simd, St: Real>(row: &[f32], dst: &mut [St]) {
    let n = dst.len();
    let full = n / LANES * LANES;
    for i in (0..full).step_by(LANES) {
        St::store(S::load(&row[i..]), &mut dst[i..]);
    }
    for i in full..n {
        dst[i] = St::from_f32(row[i]);
    }
}
