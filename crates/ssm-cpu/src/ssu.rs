//! Selective state update on the CPU.
//!
//! Work items are (sequence, head) pairs, run in parallel when the plan says no slot is
//! shared between sequences (`alias_free`), in order otherwise (the reference's order).
//! Inside an item the loop is row-major: each state row `[dstate]` is loaded once, carried
//! in f32 through every token of the sequence (per-token stores in speculative mode), and
//! stored once — one streaming pass over the state, eight lanes at a time.

use half::{bf16, f16};
use ssm_ssu::philox::{round_f16_stochastic, sr_bits};
use ssm_ssu::{ParamForm, Route, SelectiveStateUpdate, SsuPlan, TokenStrides};
use ssm_tensor::{DType, Planned, Run};

use crate::host::{rd, rd_int, wr};
use crate::lanes::round8;
use crate::shared::{Scratch, SharedBuf};
use crate::simd::{LANES, PowTwo, Real, Simd, SimdKernel, dispatch};
use crate::{CpuBackend, CpuError, require_host};

/// How many state rows ahead the plain decode step prefetches.
const PREFETCH_ROWS: usize = 4;

struct Inputs<'a> {
    x: &'a [u8],
    dt: &'a [u8],
    a: &'a [u8],
    b: &'a [u8],
    c: &'a [u8],
    d: Option<&'a [u8]>,
    dt_bias: Option<&'a [u8]>,
    z: Option<&'a [u8]>,
    sbi: Option<&'a [u8]>,
    dst: Option<&'a [u8]>,
    nacc: Option<&'a [u8]>,
    cu: Option<&'a [u8]>,
}

struct Item<'a, 's, St> {
    scratch: &'a mut Scratch<'s>,
    plan: &'a SsuPlan,
    inp: &'a Inputs<'a>,
    state: SharedBuf<St>,
    out: SharedBuf<u8>,
    seq: usize,
    head: usize,
    /// Rows `[p0, p1)` of the head (the whole head unless few items split it).
    rows: (usize, usize),
}

impl CpuBackend {
    fn ssu_typed<St: Real>(&self, plan: &SsuPlan, inp: &Inputs<'_>, state: SharedBuf<St>, out: SharedBuf<u8>) {
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
            dispatch(Item { scratch, plan, inp, state, out, seq: pair / heads, head: pair % heads, rows });
        };
        let per_item = item_scratch(plan, chunk);
        self.for_each_scratch(pairs * chunks, per_item, !plan.alias_free, None, body);
    }
}

/// f32 scratch of one item of `rows` state rows, from the plan's dimensions alone: per token
/// B and C (`nv` each), dt and dA, per token and row the processed dt and z factor, and three
/// rows. A sequence is at most one token (decode), `steps` (dense) or all rows (varlen) long.
fn item_scratch(plan: &SsuPlan, rows: usize) -> usize {
    let len = match plan.route {
        Route::OneToken => 1,
        Route::Dense { steps } => steps,
        Route::Varlen => plan.dims.rows,
    };
    let nv = round8(plan.dims.dstate);
    len * (2 * nv + 2) + 3 * nv + 2 * len * round8(rows)
}

impl Run<SelectiveStateUpdate<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<SelectiveStateUpdate<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        require_host("state", args.state.device())?;
        fn host<'t>(t: &ssm_tensor::TensorRef<'t>) -> Option<&'t [u8]> {
            t.host_bytes()
        }
        fn opt<'t>(t: &Option<ssm_tensor::TensorRef<'t>>) -> Option<&'t [u8]> {
            t.as_ref().and_then(|t| t.host_bytes())
        }
        let (Some(x), Some(dt), Some(a), Some(b), Some(c)) =
            (host(&args.x), host(&args.dt), host(&args.a), host(&args.b), host(&args.c))
        else {
            return Err(CpuError::NotHost { arg: "x", device: args.x.device() });
        };
        let sbi = opt(&args.state_batch_indices);
        let inp = Inputs {
            x,
            dt,
            a,
            b,
            c,
            d: opt(&args.d),
            dt_bias: opt(&args.dt_bias),
            z: opt(&args.z),
            sbi,
            dst: opt(&args.dst_state_batch_indices).or(sbi),
            nacc: opt(&args.num_accepted_tokens),
            cu: opt(&args.cu_seqlens),
        };
        let out =
            SharedBuf::new(args.out.host_bytes_mut().ok_or(CpuError::NotHost { arg: "out", device: plan.device })?);
        match plan.dtypes.state {
            DType::F32 => {
                let s = args
                    .state
                    .host_data_mut::<f32>()
                    .map_err(|_| CpuError::NotHost { arg: "state", device: plan.device })?;
                self.ssu_typed(plan, &inp, SharedBuf::new(s), out)
            }
            DType::BF16 => {
                let s = args
                    .state
                    .host_data_mut::<bf16>()
                    .map_err(|_| CpuError::NotHost { arg: "state", device: plan.device })?;
                self.ssu_typed(plan, &inp, SharedBuf::new(s), out)
            }
            DType::F16 => {
                let s = args
                    .state
                    .host_data_mut::<f16>()
                    .map_err(|_| CpuError::NotHost { arg: "state", device: plan.device })?;
                self.ssu_typed(plan, &inp, SharedBuf::new(s), out)
            }
            _ => unreachable!("plan admits float states only"),
        }
        Ok(())
    }
}

impl<St: Real> SimdKernel for Item<'_, '_, St> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        // No closure below may contain lane operations: a closure is compiled without the
        // caller's target features, which would turn every intrinsic into a call.
        let Item { scratch, plan, inp, state, out, seq: b, head: h, rows: (p_lo, p_hi) } = self;
        let ty = &plan.dtypes;
        let dims = &plan.dims;
        let n_st = dims.dstate;

        // Sequence bounds.
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
            return;
        }
        let col = match (inp.nacc, plan.num_accepted_tokens) {
            (Some(n), Some(s)) => (rd_int(n, ty.num_accepted_tokens.unwrap(), s.at([b])) - 1).max(0) as usize,
            _ => 0,
        };
        let (src, dst_final) = match (inp.sbi, plan.state_batch_indices, plan.dst_state_batch_indices) {
            (Some(t), Some(tab), Some(dtab)) => (
                rd_int(t, tab.dtype, tab.strides.at([b, col])),
                rd_int(inp.dst.unwrap(), dtab.dtype, dtab.strides.at([b, col])),
            ),
            _ => (b as i64, b as i64),
        };
        let live = !(plan.state_batch_indices.is_some() && plan.is_pad(src));
        let g = h / plan.heads_per_group();
        let base_row = if plan.route == Route::Varlen { start } else { b };
        let tok = |ts: &TokenStrides, t: usize| plan.token_base(ts, b, base_row) + t as isize * ts.tok;
        let tied = plan.form == ParamForm::Tied;
        let softplus = |v: f32| if v <= 20.0 { (v.exp() + 1.0).ln() } else { v };
        // dt + dt_bias of (token t, row p), before softplus (scalar: no lanes in closures).
        let dt_raw = |t: usize, p: usize| {
            let mut v = rd(inp.dt, ty.dt, plan.dt.at(tok(&plan.dt, t), h, p));
            if let (Some(bias), Some(s)) = (inp.dt_bias, plan.dt_bias) {
                v += rd(bias, ty.dt_bias.unwrap(), s.at([h, p]));
            }
            v
        };
        let dt_of = |t: usize, p: usize| {
            let v = dt_raw(t, p);
            if plan.dt_softplus { softplus(v) } else { v }
        };
        let a_head = rd(inp.a, ty.a, plan.a.at([h, 0, 0]));
        let spec_dsts = plan.spec && live;
        let final_store = !plan.spec && live && !(plan.state_batch_indices.is_some() && plan.is_pad(dst_final));

        // Per-token vectors: B (times dt in the tied form), C; tied scalars dt and dA.
        let nv = n_st.div_ceil(LANES) * LANES;
        {
            // Per token and row of this item: the processed dt (per-channel form) and the z gate
            // factor, computed eight rows at a time below.
            let rp = (p_hi - p_lo).div_ceil(LANES) * LANES;
            let need = len * (2 * nv + 2) + 3 * nv + 2 * len * rp;
            let (bv, rest) = scratch.take(need).split_at_mut(len * nv);
            let (cv, rest) = rest.split_at_mut(len * nv);
            let (dts, rest) = rest.split_at_mut(len);
            let (das, rest) = rest.split_at_mut(len);
            let (row, rest) = rest.split_at_mut(nv);
            let (da_row, rest) = rest.split_at_mut(nv);
            let (bdt_row, rest) = rest.split_at_mut(nv);
            let (dt_rows, rest) = rest.split_at_mut(len * rp);
            let z_rows = &mut rest[..len * rp];
            for t in 0..len {
                let (bb, cb) = (tok(&plan.b, t), tok(&plan.c, t));
                let dtv = if tied { dt_of(t, 0) } else { 1.0 };
                dts[t] = dtv;
                das[t] = (a_head * dtv).exp();
                for n in 0..nv {
                    let (bval, cval) = if n < n_st {
                        (rd(inp.b, ty.b, plan.b.at(bb, g, n)), rd(inp.c, ty.c, plan.c.at(cb, g, n)))
                    } else {
                        (0.0, 0.0)
                    };
                    bv[t * nv + n] = bval * dtv;
                    cv[t * nv + n] = cval;
                }
            }

            // The plain decode step (one token, tied parameters, a live row, no stochastic
            // rounding): one fused pass per row, state read, updated and stored chunk by chunk
            // without the f32 row buffer.
            if len == 1 && tied && live && !plan.spec && plan.stochastic_rounding.is_none() && n_st % LANES == 0 {
                let (xb, ob, zb) = (tok(&plan.x, 0), tok(&plan.out, 0), plan.z.map_or(0, |zs| tok(&zs, 0)));
                let (da, bt, ct) = (S::splat(das[0]), &bv[..nv], &cv[..nv]);
                for p in p_lo..p_hi {
                    let xv = rd(inp.x, ty.x, plan.x.at(xb, h, p));
                    let xs = S::splat(xv);
                    let src_off = plan.state.at([src as usize, h, p, 0]);
                    let dst_off = plan.state.at([dst_final as usize, h, p, 0]);
                    // Keep several rows of loads in flight: prefetch the row PREFETCH_ROWS ahead
                    // (a hint only; an address past the head is harmless).
                    if p + PREFETCH_ROWS < p_hi {
                        let ahead = plan.state.at([src as usize, h, p + PREFETCH_ROWS, 0]);
                        let row_bytes = n_st * std::mem::size_of::<St>();
                        for line in (0..row_bytes).step_by(64) {
                            S::prefetch(state.elems::<St>(ahead, 0).cast::<u8>().wrapping_add(line));
                        }
                    }
                    let mut acc = S::splat(0.0);
                    for n in (0..n_st).step_by(LANES) {
                        // SAFETY: both rows were checked by the plan and belong to this item;
                        // each chunk is read through a slice that ends before the write below
                        // (source and destination may be the same row).
                        let v = St::load::<S>(unsafe {
                            std::slice::from_raw_parts(state.elems::<St>(src_off + n, LANES), LANES)
                        })
                        .mul_add(da, S::load(&bt[n..]).mul(xs));
                        if final_store {
                            // SAFETY: as above; no other reference to this chunk is alive.
                            St::store(v, unsafe {
                                std::slice::from_raw_parts_mut(state.elems::<St>(dst_off + n, LANES), LANES)
                            });
                        }
                        acc = v.mul_add(S::load(&ct[n..]), acc);
                    }
                    let d_p = match (inp.d, plan.d) {
                        (Some(d), Some(s)) => rd(d, ty.d.unwrap(), s.at([h, p])),
                        _ => 0.0,
                    };
                    let mut y = acc.reduce_add() + xv * d_p;
                    if let (Some(z), Some(zs)) = (inp.z, plan.z) {
                        let zv = rd(z, ty.z.unwrap(), zs.at(zb, h, p));
                        y *= zv / (1.0 + (-zv).exp());
                    }
                    // SAFETY: out element (token, h, p) belongs to this item (see below).
                    unsafe { wr(out, ty.out, plan.out.at(ob, h, p), y) };
                }
                return;
            }

            // The scalar per-row work of the general path, eight rows at a time: softplus of
            // dt + dt_bias (per-channel form; the tied form has it per token above) and z's silu
            // factor, so that no row pays scalar `exp`/`ln` calls.
            let has_z = inp.z.is_some() && plan.z.is_some();
            for t in 0..len {
                let zb = plan.z.map_or(0, |zs| tok(&zs, t));
                let mut p = p_lo;
                while p < p_hi {
                    let m = LANES.min(p_hi - p);
                    let at = t * rp + (p - p_lo);
                    if !tied {
                        let mut v = [0.0f32; LANES];
                        for (k, vk) in v.iter_mut().enumerate().take(m) {
                            *vk = dt_raw(t, p + k);
                        }
                        let lanes = S::load(&v);
                        let lanes = if plan.dt_softplus { softplus_lanes(lanes) } else { lanes };
                        lanes.store(&mut dt_rows[at..]);
                    }
                    if has_z {
                        let (z, zs) = (inp.z.unwrap(), plan.z.unwrap());
                        let mut v = [0.0f32; LANES];
                        for (k, vk) in v.iter_mut().enumerate().take(m) {
                            *vk = rd(z, ty.z.unwrap(), zs.at(zb, h, p + k));
                        }
                        let zl = S::load(&v);
                        zl.div(S::splat(1.0).add(S::splat(0.0).sub(zl).exp())).store(&mut z_rows[at..]);
                    }
                    p += LANES;
                }
            }
            let mut streamed = false;
            for p in p_lo..p_hi {
                // Load the row (zeros for a pad source), widened to f32.
                if live {
                    let off = plan.state.at([src as usize, h, p, 0]);
                    // SAFETY: the plan checked `src` against the pool and the state layout, so
                    // `off..off + dstate` is inside the state; this item owns (src, h) now.
                    let srow = unsafe { std::slice::from_raw_parts(state.elems::<St>(off, n_st), n_st) };
                    load_row::<S, St>(srow, row);
                } else {
                    row.iter_mut().for_each(|v| *v = 0.0);
                }
                let d_p = match (inp.d, plan.d) {
                    (Some(d), Some(s)) => rd(d, ty.d.unwrap(), s.at([h, p])),
                    _ => 0.0,
                };
                for t in 0..len {
                    let (xb, ob) = (tok(&plan.x, t), tok(&plan.out, t));
                    let ds = match (spec_dsts, plan.dst_state_batch_indices) {
                        (true, Some(dtab)) => rd_int(inp.dst.unwrap(), dtab.dtype, dtab.strides.at([b, t])),
                        _ => 0,
                    };
                    let xv = rd(inp.x, ty.x, plan.x.at(xb, h, p));
                    let bt = &bv[t * nv..(t + 1) * nv];
                    let ct = &cv[t * nv..(t + 1) * nv];
                    let mut acc = S::splat(0.0);
                    if tied {
                        let (da, xs) = (S::splat(das[t]), S::splat(xv));
                        for n in (0..nv).step_by(LANES) {
                            let s = S::load(&row[n..]).mul_add(da, S::load(&bt[n..]).mul(xs));
                            s.store(&mut row[n..]);
                            acc = s.mul_add(S::load(&ct[n..]), acc);
                        }
                    } else {
                        let dtv = dt_rows[t * rp + (p - p_lo)];
                        let dtl = S::splat(dtv);
                        // A's row [h, p, :]: straight from memory when it is f32 with unit stride
                        // (the usual Mamba1 `A = -exp(A_log)`), else element by element.
                        let a0 = plan.a.at([h, p, 0]);
                        let a_row: Option<&[f32]> = (ty.a == DType::F32 && plan.a.strides[2] == 1)
                            .then(|| bytemuck::try_cast_slice::<u8, f32>(inp.a).ok())
                            .flatten()
                            .map(|a| &a[a0..a0 + n_st]);
                        for n in (0..nv).step_by(LANES) {
                            let av = match a_row {
                                Some(ar) if n + LANES <= n_st => S::load(&ar[n..]),
                                _ => {
                                    let mut av = [0.0f32; LANES];
                                    for (k, a) in av.iter_mut().enumerate() {
                                        if n + k < n_st {
                                            *a = rd(inp.a, ty.a, plan.a.at([h, p, n + k]));
                                        }
                                    }
                                    S::load(&av)
                                }
                            };
                            av.mul(dtl).exp().store(&mut da_row[n..]);
                            S::load(&bt[n..]).mul(dtl).store(&mut bdt_row[n..]);
                        }
                        let xs = S::splat(xv);
                        for n in (0..nv).step_by(LANES) {
                            let s = S::load(&row[n..]).mul_add(S::load(&da_row[n..]), S::load(&bdt_row[n..]).mul(xs));
                            s.store(&mut row[n..]);
                            acc = s.mul_add(S::load(&ct[n..]), acc);
                        }
                    }
                    if spec_dsts && !plan.is_pad(ds) {
                        let off = plan.state.at([ds as usize, h, p, 0]);
                        // `ds` was checked by the plan; (ds, h) is owned by this item
                        // (alias_free) or items run in order.
                        let dptr = state.elems::<St>(off, n_st);
                        // A token's column other than the source is write-only in this call:
                        // streaming stores skip the read for ownership of its lines.
                        let lane_bytes = LANES * std::mem::size_of::<St>();
                        if ds != src && n_st.is_multiple_of(LANES) && (dptr as usize).is_multiple_of(lane_bytes) {
                            for n in (0..n_st).step_by(LANES) {
                                // SAFETY: `n + 8 ≤ dstate`, inside the destination row; aligned
                                // (checked above); no reference to the row is alive.
                                unsafe { St::stream::<S>(S::load(&row[n..]), dptr.add(n)) };
                            }
                            streamed = true;
                        } else {
                            // SAFETY: as above.
                            let drow = unsafe { std::slice::from_raw_parts_mut(dptr, n_st) };
                            store_row::<S, St>(row, drow);
                        }
                    }
                    let mut y = acc.reduce_add() + xv * d_p;
                    if has_z {
                        y *= z_rows[t * rp + (p - p_lo)];
                    }
                    // SAFETY: the plan checked `out`'s shape and that its elements do not overlap;
                    // token (t) of sequence b, head h, row p is written by this item only.
                    unsafe { wr(out, ty.out, plan.out.at(ob, h, p), y) };
                }
                if final_store {
                    let off = plan.state.at([dst_final as usize, h, p, 0]);
                    // SAFETY: `dst_final` was checked by the plan; (dst_final, h) is owned by this item.
                    let drow = unsafe { std::slice::from_raw_parts_mut(state.elems::<St>(off, n_st), n_st) };
                    match plan.stochastic_rounding {
                        None => store_row::<S, St>(row, drow),
                        Some(sr) => {
                            let st = plan.state.strides;
                            let base = src as isize * st[0] + h as isize * st[1] + p as isize * st[2];
                            for n in 0..n_st {
                                let pair = (base + (n - n % 2) as isize * st[3]) as u64;
                                let r = sr_bits(sr.seed, sr.rounds(), pair, n % 2 == 1);
                                let v = round_f16_stochastic(row[n], r);
                                // The plan admits stochastic rounding for f16 states only.
                                drow[n] = St::from_f32(v.to_f32());
                            }
                        }
                    }
                }
            }
            if streamed {
                S::store_fence();
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

/// `ln(1 + e^v)` lane-wise, as `max(v, 0) + ln1p(e^-|v|)`: `ln1p(u)` for `u ∈ (0, 1]` is
/// `2·atanh(u / (2 + u))`, an odd series in `s = u / (2 + u) ≤ 1/3` summed to `s^15` (truncation
/// below 2e-9). Within a few ulp of the scalar `ln(e^v + 1)` (threshold 20: above it the
/// correction is below half an ulp of `v`, so the result is `v` as there). NaN stays NaN.
#[inline(always)]
fn softplus_lanes<S: Simd + PowTwo>(v: S) -> S {
    let zero = S::splat(0.0);
    let neg_abs = zero.sub(v.max(zero.sub(v)));
    let u = neg_abs.exp();
    let s = u.div(S::splat(2.0).add(u));
    let s2 = s.mul(s);
    let mut poly = S::splat(1.0 / 15.0);
    for c in [1.0 / 13.0, 1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0] {
        poly = poly.mul_add(s2, S::splat(c));
    }
    v.max(zero).add(S::splat(2.0).mul(s).mul(poly))
}
