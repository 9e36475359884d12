//! ReplaySSM on the CPU: ring trackers (integer loops, rows in order) and the
//! checkpointing SSU.
//!
//! `checkpointing_ssu` runs one work item per (sequence, head). It does not replay the
//! recurrence token by token; it uses the closed form of semantics/ssu.md §7.2 over the
//! concatenated history + new tokens (`cum_j = A·Σ_{i≤j} dt_i`):
//! - no flush: `y_t = exp(cum_t)·(C_t·S0) + Σ_{j≤t} exp(cum_t − cum_j)·dt_j·(C_t·B_j)·x_j + D·x_t`,
//!   reading the checkpoint once and writing no state — the point of ReplaySSM;
//! - flush: `S_k = exp(cum_{k−1})·S0 + Σ_{j<k} exp(cum_{k−1} − cum_j)·dt_j·x_j ⊗ B_j` is
//!   stored, and the outputs use `S_k` plus the new tokens' terms.
//!
//! Then it appends the new tokens at ring rows `(start + k + i) % L` (x and dt per head; B once
//! per group, by the group's first head). Those rows are never live history, so appends
//! do not race with other heads' reads.

use half::{bf16, f16};
use ssm_ring::{
    CheckpointingSsuArgs, CheckpointingSsuPlan, CommitRingTrackersArgs, RingTrackers, TrackerMode, TrackerPlan,
    UpdateRingTrackersArgs,
};
use ssm_tensor::{DType, Planned, Run, TensorMut};

use crate::host::{MambaInputs, host_opt, host_ref, host_shared, rd, rd_int, wr};
use crate::lanes::{axpy, dot, round8};
use crate::shared::{ItemOp, Scratch, SharedBuf};
use crate::simd::{LANES, PowTwo, Simd};
use crate::{CpuBackend, CpuError, require_host};

use ssm_tensor::elem::write_i64 as wr_int;

/// Widens a contiguous row of `dst.len()` elements starting at element `at` of a `dtype` buffer.
///
/// # Safety
/// The row must be inside the buffer and written by no other thread now.
#[inline(always)]
unsafe fn load_row(base: SharedBuf<u8>, dtype: DType, at: usize, dst: &mut [f32]) {
    let n = dst.len();
    // SAFETY: by the caller's contract; the plan admits only float states, aligned for their
    // dtype (views are built from typed or aligned memory).
    unsafe {
        match dtype {
            DType::F32 => dst.copy_from_slice(std::slice::from_raw_parts(base.elems::<f32>(at, n), n)),
            DType::BF16 => {
                let src = std::slice::from_raw_parts(base.elems::<bf16>(at, n), n);
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
            }
            DType::F16 => {
                let src = std::slice::from_raw_parts(base.elems::<f16>(at, n), n);
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
            }
            _ => unreachable!("plan admits float states only"),
        }
    }
}

/// Stores a row (rounded to nearest even) at element `at` of a `dtype` buffer.
///
/// # Safety
/// The row must be inside the buffer and accessed by no other thread now.
#[inline(always)]
unsafe fn store_row(base: SharedBuf<u8>, dtype: DType, at: usize, src: &[f32]) {
    let n = src.len();
    // SAFETY: by the caller's contract.
    unsafe {
        match dtype {
            DType::F32 => std::slice::from_raw_parts_mut(base.elems::<f32>(at, n), n).copy_from_slice(src),
            DType::BF16 => std::slice::from_raw_parts_mut(base.elems::<bf16>(at, n), n)
                .iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = bf16::from_f32(*s)),
            DType::F16 => std::slice::from_raw_parts_mut(base.elems::<f16>(at, n), n)
                .iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = f16::from_f32(*s)),
            _ => unreachable!("plan admits float states only"),
        }
    }
}

fn tracker_bytes<'t>(t: &'t mut TensorMut<'_>, arg: &'static str) -> Result<&'t mut [u8], CpuError> {
    let device = t.device();
    require_host(arg, device)?;
    t.host_bytes_mut().ok_or(CpuError::NotHost { arg, device })
}

struct Inputs<'a> {
    mamba: MambaInputs<'a>,
    d: Option<&'a [u8]>,
    z: Option<&'a [u8]>,
    dt_bias: Option<&'a [u8]>,
    dtypes: [DType; 9],
}

// Indices into `Inputs::dtypes`.
const X: usize = 0;
const DT: usize = 1;
const A: usize = 2;
const B: usize = 3;
const C: usize = 4;
const D: usize = 5;
const Z: usize = 6;
const BIAS: usize = 7;
const OUT: usize = 8;

struct Ctx<'a> {
    p: &'a CheckpointingSsuPlan,
    inp: Inputs<'a>,
    sbi: Option<(&'a [u8], DType)>,
    cu: Option<(&'a [u8], DType)>,
    ring_start: (&'a [u8], DType),
    prev_num: (&'a [u8], DType),
    state: SharedBuf<u8>,
    x_cache: SharedBuf<u8>,
    b_cache: SharedBuf<u8>,
    dt_cache: SharedBuf<f32>,
    out: SharedBuf<u8>,
    dtypes: [DType; 3],
}

impl Ctx<'_> {
    /// `(slot, seq, first token, tokens, ring_start, k)` of sequence `b`, or `None` for a pad
    /// row or an empty sequence (both write nothing).
    fn row(&self, b: usize) -> Option<[usize; 6]> {
        let p = self.p;
        let slot = match (self.sbi, p.index) {
            (Some((bytes, t)), Some(col)) => {
                let v = rd_int(bytes, t, col.at([b]));
                if Some(v) == p.pad_slot_id || v < 0 || v >= p.cache as i64 {
                    return None;
                }
                v as usize
            }
            _ => b,
        };
        let (seq, tok0, n) = match (self.cu, p.cu_seqlens) {
            (Some((bytes, t)), Some(cu)) => {
                let s = rd_int(bytes, t, cu.at([b])) as usize;
                (0, s, rd_int(bytes, t, cu.at([b + 1])) as usize - s)
            }
            _ => (b, 0, p.tokens),
        };
        if n == 0 {
            return None;
        }
        let start = rd_int(self.ring_start.0, self.ring_start.1, p.ring_start.at([slot])) as usize;
        let k = rd_int(self.prev_num.0, self.prev_num.1, p.prev_num_accepted_tokens.at([slot])) as usize;
        Some([slot, seq, tok0, n, start, k])
    }
}

impl ItemOp for Ctx<'_> {
    /// Item `i`: head `i % heads` of sequence `i / heads` (nothing for a pad row or an empty sequence).
    #[inline(always)]
    fn run_item<S: Simd + PowTwo>(&self, i: usize, scratch: &mut Scratch<'_>) {
        let heads = self.p.heads;
        if let Some(row) = self.row(i / heads) {
            ssu_item::<S>(self, row, i % heads, scratch)
        }
    }
}

/// Head `h` of the sequence whose [`Ctx::row`] is `row`.
#[inline(always)]
fn ssu_item<S: Simd + PowTwo>(ctx: &Ctx<'_>, row: [usize; 6], h: usize, scratch: &mut Scratch<'_>) {
    let [slot, seq, tok0, n, start, k] = row;
    let p = ctx.p;
    let inp = &ctx.inp;
    let ty = &inp.dtypes;
    let [state_t, xc_t, bc_t] = ctx.dtypes;
    let (pd, nd, l) = (p.dim, p.dstate, p.ring_len);
    let (pr, nr) = (round8(pd), round8(nd));
    let g = h / p.heads_per_group();
    let m = k + n; // history + new tokens
    let flush = m > p.window;
    let a = rd(inp.mamba.a, ty[A], p.a.at([h, 0]));
    let softplus = |v: f32| if v <= 20.0 { v.exp().ln_1p() } else { v };
    // No closure below may hold lane code: closures are compiled without the caller's
    // target features.
    {
        let need = 2 * m + m * (pr + nr) + n * nr + n * pr + pd * nr;
        let (dts, rest) = scratch.take(need).split_at_mut(m);
        let (cum, rest) = rest.split_at_mut(m);
        let (xs, rest) = rest.split_at_mut(m * pr);
        let (bs, rest) = rest.split_at_mut(m * nr);
        let (cs, rest) = rest.split_at_mut(n * nr);
        let (ys, rest) = rest.split_at_mut(n * pr);
        let srow = &mut rest[..pd * nr];
        // Gather history (ring rows) and new tokens as padded f32 rows.
        for j in 0..m {
            let (xr, br) = (&mut xs[j * pr..(j + 1) * pr], &mut bs[j * nr..(j + 1) * nr]);
            xr.fill(0.0);
            br.fill(0.0);
            if j < k {
                let r = (start + j) % l;
                // SAFETY: live ring rows are only read during this call (appends go to
                // rows k.. after the live window, see the module docs).
                unsafe {
                    dts[j] = ctx.dt_cache.read(p.dt_cache.at([slot, h, r, 0]));
                    load_row(ctx.x_cache, xc_t, p.x_cache.at([slot, h, r, 0]), &mut xr[..pd]);
                    load_row(ctx.b_cache, bc_t, p.b_cache.at([slot, g, r, 0]), &mut br[..nd]);
                }
            } else {
                let t = tok0 + j - k;
                let mut v = rd(inp.mamba.dt, ty[DT], p.dt.at([seq, t, h, 0]));
                if let (Some(bias), Some(bp)) = (inp.dt_bias, p.dt_bias) {
                    v += rd(bias, ty[BIAS], bp.at([h, 0]));
                }
                dts[j] = if p.dt_softplus { softplus(v) } else { v };
                for (q, v) in xr[..pd].iter_mut().enumerate() {
                    *v = rd(inp.mamba.x, ty[X], p.x.at([seq, t, h, q]));
                }
                for (q, v) in br[..nd].iter_mut().enumerate() {
                    *v = rd(inp.mamba.b, ty[B], p.b.at([seq, t, g, q]));
                }
                let cr = &mut cs[(j - k) * nr..(j - k + 1) * nr];
                cr.fill(0.0);
                for (q, v) in cr[..nd].iter_mut().enumerate() {
                    *v = rd(inp.mamba.c, ty[C], p.c.at([seq, t, g, q]));
                }
            }
        }
        let mut acc = 0.0f32;
        for j in 0..m {
            acc += a * dts[j];
            cum[j] = acc;
        }
        // The base state: the checkpoint, or S_k on a flush (stored).
        for q in 0..pd {
            let r = &mut srow[q * nr..(q + 1) * nr];
            r.fill(0.0);
            // SAFETY: the plan checked the slot and the state layout (last stride 1), so
            // the row's `dstate` elements are inside the state; this item owns (slot, h).
            unsafe { load_row(ctx.state, state_t, p.state.at([slot, h, q, 0]), &mut r[..nd]) };
        }
        let (base_cum, first) = if flush && k > 0 {
            let ck = cum[k - 1];
            for q in 0..pd {
                let r = &mut srow[q * nr..(q + 1) * nr];
                let decay = S::splat(ck.exp());
                for i in (0..nr).step_by(LANES) {
                    S::load(&r[i..]).mul(decay).store(&mut r[i..]);
                }
                for j in 0..k {
                    let w = (ck - cum[j]).exp() * dts[j] * xs[j * pr + q];
                    axpy::<S>(r, w, &bs[j * nr..(j + 1) * nr]);
                }
            }
            (ck, k)
        } else {
            (0.0, 0)
        };
        if flush {
            for q in 0..pd {
                // SAFETY: as for the load above; the row is written by this item only.
                unsafe { store_row(ctx.state, state_t, p.state.at([slot, h, q, 0]), &srow[q * nr..q * nr + nd]) };
            }
        }
        // Outputs of the new tokens.
        for t in 0..n {
            let jt = k + t;
            let ct = &cs[t * nr..(t + 1) * nr];
            let yt = &mut ys[t * pr..(t + 1) * pr];
            yt.fill(0.0);
            let scale = (cum[jt] - base_cum).exp();
            for q in 0..pd {
                yt[q] = scale * dot::<S>(&srow[q * nr..(q + 1) * nr], ct);
            }
            for j in first..=jt {
                let w = (cum[jt] - cum[j]).exp() * dts[j] * dot::<S>(ct, &bs[j * nr..(j + 1) * nr]);
                axpy::<S>(yt, w, &xs[j * pr..(j + 1) * pr]);
            }
            let tok = tok0 + t;
            for q in 0..pd {
                let xv = xs[jt * pr + q];
                let mut y = yt[q];
                if let (Some(d), Some(dp)) = (inp.d, p.d) {
                    y += rd(d, ty[D], dp.at([h, q])) * xv;
                }
                if let (Some(z), Some(zp)) = (inp.z, p.z) {
                    let zv = rd(z, ty[Z], zp.at([seq, tok, h, q]));
                    y *= zv / (1.0 + (-zv).exp());
                }
                // SAFETY: token `tok`, head h is written by this item only (plan-checked shape).
                unsafe { wr(ctx.out, ty[OUT], p.out.at([seq, tok, h, q]), y) };
            }
        }
        // Append the new tokens after the live window, on both branches.
        for t in 0..n {
            let r = (start + k + t) % l;
            let j = k + t;
            // SAFETY: ring row r of (slot, h) — and of (slot, g) for the group's first head —
            // is written by this item only, and it is not a live row anyone reads.
            unsafe {
                ctx.dt_cache.write(p.dt_cache.at([slot, h, r, 0]), dts[j]);
                for q in 0..pd {
                    wr(ctx.x_cache, xc_t, p.x_cache.at([slot, h, r, q]), xs[j * pr + q]);
                }
                if h.is_multiple_of(p.heads_per_group()) {
                    for q in 0..nd {
                        wr(ctx.b_cache, bc_t, p.b_cache.at([slot, g, r, q]), bs[j * nr + q]);
                    }
                }
            }
        }
    }
}

impl CpuBackend {
    fn trackers(&self, plan: &TrackerPlan, args: &mut TrackersArgs<'_, '_>) -> Result<(), CpuError> {
        let idx = args
            .index
            .host_bytes()
            .ok_or(CpuError::NotHost { arg: "state_batch_indices", device: args.index.device() })?;
        let idx_t = args.index.dtype();
        let extra = match (args.accepted, args.qsl) {
            (Some(a), Some(q)) => Some((
                a.host_bytes().ok_or(CpuError::NotHost { arg: "num_accepted_tokens", device: a.device() })?,
                a.dtype(),
                q.host_bytes().ok_or(CpuError::NotHost { arg: "query_start_loc", device: q.device() })?,
                q.dtype(),
            )),
            _ => None,
        };
        let tt = plan.tracker_dtype;
        let [rs_s, pa_s, pq_s] = plan.trackers;
        let rs = tracker_bytes(args.rs, "ring_start")?;
        let pa = tracker_bytes(args.pa, "prev_num_accepted")?;
        let pq = tracker_bytes(args.pq, "prev_query_len")?;
        for row in 0..plan.rows {
            let slot = rd_int(idx, idx_t, plan.index.at([row]));
            if !plan.is_valid_slot(slot) {
                continue;
            }
            let s = slot as usize;
            let (ir, ia, iq) = (rs_s.at([s]), pa_s.at([s]), pq_s.at([s]));
            match plan.mode {
                TrackerMode::Reset => {
                    wr_int(rs, tt, ir, 0);
                    wr_int(pa, tt, ia, 0);
                    wr_int(pq, tt, iq, 0);
                }
                TrackerMode::Advance { logical_window, ring_buffer_len } => {
                    let (prev, start) = (rd_int(pa, tt, ia), rd_int(rs, tt, ir));
                    let (start, prev) = ssm_ring::step::advance(start, prev, logical_window, ring_buffer_len);
                    wr_int(rs, tt, ir, start);
                    wr_int(pa, tt, ia, prev);
                }
                TrackerMode::Commit { logical_window, ring_buffer_len } => {
                    let (acc_b, acc_t, qsl_b, qsl_t) = extra.expect("commit plans carry accepted counts");
                    let (acc_s, qsl_s) = (plan.num_accepted_tokens.unwrap(), plan.query_start_loc.unwrap());
                    let (prev, start, prev_q) = (rd_int(pa, tt, ia), rd_int(rs, tt, ir), rd_int(pq, tt, iq));
                    let accepted = rd_int(acc_b, acc_t, acc_s.at([row]));
                    let cur_q =
                        rd_int(qsl_b, qsl_t, qsl_s.at([row + 1])).wrapping_sub(rd_int(qsl_b, qsl_t, qsl_s.at([row])));
                    let (start, prev, cur_q) =
                        ssm_ring::step::commit(start, prev, prev_q, accepted, cur_q, logical_window, ring_buffer_len);
                    wr_int(rs, tt, ir, start);
                    wr_int(pa, tt, ia, prev);
                    wr_int(pq, tt, iq, cur_q);
                }
            }
        }
        Ok(())
    }
}

struct TrackersArgs<'r, 'a> {
    rs: &'r mut TensorMut<'a>,
    pa: &'r mut TensorMut<'a>,
    pq: &'r mut TensorMut<'a>,
    index: &'r ssm_tensor::TensorRef<'a>,
    accepted: Option<&'r ssm_tensor::TensorRef<'a>>,
    qsl: Option<&'r ssm_tensor::TensorRef<'a>>,
}

impl<'r, 'a> TrackersArgs<'r, 'a> {
    /// The trackers and slot table of an update, plus `(num_accepted_tokens,
    /// query_start_loc)` for a commit.
    fn of(
        tr: &'r mut RingTrackers<'a>,
        index: &'r ssm_tensor::TensorRef<'a>,
        commit: Option<(&'r ssm_tensor::TensorRef<'a>, &'r ssm_tensor::TensorRef<'a>)>,
    ) -> Self {
        TrackersArgs {
            rs: &mut tr.ring_start,
            pa: &mut tr.prev_num_accepted,
            pq: &mut tr.prev_query_len,
            index,
            accepted: commit.map(|c| c.0),
            qsl: commit.map(|c| c.1),
        }
    }
}

impl Run<UpdateRingTrackersArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<UpdateRingTrackersArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        self.trackers(&plan, &mut TrackersArgs::of(&mut args.trackers, &args.state_batch_indices, None))
    }
}

impl Run<CommitRingTrackersArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<CommitRingTrackersArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let commit = Some((&args.num_accepted_tokens, &args.query_start_loc));
        self.trackers(&plan, &mut TrackersArgs::of(&mut args.trackers, &args.state_batch_indices, commit))
    }
}

/// f32 scratch of one (sequence, head) item, from the plan's dimensions alone: `m ≤ ring_len +
/// tokens` history and new tokens (dt, cumsum, x and B rows), the new tokens' C and outputs, and
/// the base state.
fn item_scratch(p: &CheckpointingSsuPlan) -> usize {
    let (pr, nr) = (round8(p.dim), round8(p.dstate));
    let (m, n) = (p.ring_len + p.tokens, p.tokens);
    2 * m + m * (pr + nr) + n * nr + n * pr + p.dim * nr
}

impl Run<CheckpointingSsuArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<CheckpointingSsuArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        let (host, idx) = (host_ref, host_opt);
        let sbi = idx("state_batch_indices", &args.state_batch_indices)?;
        let cu = idx("cu_seqlens", &args.cu_seqlens)?;
        let ring_start = (host("ring_start", &args.ring_start)?, args.ring_start.dtype());
        let prev_num =
            (host("prev_num_accepted_tokens", &args.prev_num_accepted_tokens)?, args.prev_num_accepted_tokens.dtype());
        let opt = |t: &Option<ssm_tensor::TensorRef<'_>>| t.as_ref().map(|t| t.dtype()).unwrap_or(DType::F32);
        let inp = Inputs {
            mamba: MambaInputs::new([&args.x, &args.dt, &args.a, &args.b, &args.c])?,
            d: args.d.as_ref().map(|t| host("D", t)).transpose()?,
            z: args.z.as_ref().map(|t| host("z", t)).transpose()?,
            dt_bias: args.dt_bias.as_ref().map(|t| host("dt_bias", t)).transpose()?,
            dtypes: [
                args.x.dtype(),
                args.dt.dtype(),
                args.a.dtype(),
                args.b.dtype(),
                args.c.dtype(),
                opt(&args.d),
                opt(&args.z),
                opt(&args.dt_bias),
                args.out.dtype(),
            ],
        };
        let dtypes = [args.state.dtype(), args.x_cache.dtype(), args.b_cache.dtype()];
        let ptr = host_shared;
        let state = ptr("state", &mut args.state)?;
        let x_cache = ptr("x_cache", &mut args.x_cache)?;
        let b_cache = ptr("B_cache", &mut args.b_cache)?;
        let out = ptr("out", &mut args.out)?;
        let dt_cache = ptr("dt_cache", &mut args.dt_cache)?.cast::<f32>();
        let ctx = Ctx { p: plan, inp, sbi, cu, ring_start, prev_num, state, x_cache, b_cache, dt_cache, out, dtypes };
        self.for_each_item(plan.batch * plan.heads, item_scratch(plan), None, &ctx);
        Ok(())
    }
}
