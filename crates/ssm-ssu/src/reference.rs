//! Kernel-faithful scalar reference (semantics/ssu.md §3.2).
//!
//! It mirrors vLLM's Triton kernel line by line: the state is widened to the accumulator
//! type, carried across the tokens of a sequence, and rounded to its storage type only
//! when stored; outputs come from the un-rounded state. A pad *source* row reads a zero
//! state, still writes `out` and writes no state; in speculative mode token t's state goes
//! to `dst[b, t]` (skipped when that entry is the pad) and there is no final store;
//! `seq_len == 0` writes nothing. A pad destination in non-speculative mode is skipped too
//! (vLLM would write the reserved null block; we never touch a pad slot).
//! `disable_state_update` drops every pool write; an intermediate buffer receives each token's
//! state at (entry, token) instead, and the pool is not written (FlashInfer's semantics,
//! semantics/ssu.md §5.4). An i16 or i8 state is read as `q · state_scale` and every stored row is
//! quantized with its decode scale written beside it ([`crate::quant`], §5.3).
//!
//! [`Reference`] runs it in f32 arithmetic (the peer's), [`ReferenceF64`] in f64 (for
//! error bounds). Both sequence through the batch in order, so aliasing slot tables have a
//! defined result. Host tensors only; slow on purpose.

use ssm_tensor::ArgError;
use ssm_tensor::{DType, Device, TensorError, TensorMut};

use crate::philox::{round_f16_stochastic, sr_bits};
use crate::plan::{ParamForm, Route, host_seq_bounds};
use crate::{Planned, Run, SelectiveStateUpdateArgs, SsuError, SsuPlan};

/// The f32 reference as a backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reference;

/// The f64 reference as a backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceF64;

impl Run<SelectiveStateUpdateArgs<'_>> for Reference {
    type Error = SsuError;
    fn run(&self, call: Planned<SelectiveStateUpdateArgs<'_>>) -> Result<(), SsuError> {
        let (args, plan) = call.into_parts();
        run::<f32>(&plan, args)
    }
}

impl Run<SelectiveStateUpdateArgs<'_>> for ReferenceF64 {
    type Error = SsuError;
    fn run(&self, call: Planned<SelectiveStateUpdateArgs<'_>>) -> Result<(), SsuError> {
        let (args, plan) = call.into_parts();
        run::<f64>(&plan, args)
    }
}

/// Arithmetic of the reference.
trait Acc:
    Copy + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + std::ops::Div<Output = Self> + PartialOrd
{
    const ZERO: Self;
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
}

impl Acc for f32 {
    const ZERO: Self = 0.0;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
}

impl Acc for f64 {
    const ZERO: Self = 0.0;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
}

pub(crate) fn read(bytes: &[u8], dtype: DType, i: usize) -> f64 {
    ssm_tensor::elem::read_f64(bytes, dtype, i)
}

fn read_int(bytes: &[u8], dtype: DType, i: usize) -> i64 {
    ssm_tensor::elem::read_i64(bytes, dtype, i)
}

/// Stores `v` rounded to nearest even in `dtype`.
fn write(bytes: &mut [u8], dtype: DType, i: usize, v: f32) {
    ssm_tensor::elem::write_f32(bytes, dtype, i, v)
}

fn host<'b>(arg: &'static str, b: Option<&'b [u8]>, device: Device) -> Result<&'b [u8], SsuError> {
    b.ok_or(SsuError::from(ArgError::Tensor { arg, source: TensorError::NotHost(device) }))
}

/// The host bytes of a written tensor `arg`, when given.
fn host_mut<'b>(
    arg: &'static str,
    t: Option<&'b mut TensorMut<'_>>,
    device: Device,
) -> Result<Option<&'b mut [u8]>, SsuError> {
    t.map(|t| t.host_bytes_mut().ok_or(SsuError::from(ArgError::Tensor { arg, source: TensorError::NotHost(device) })))
        .transpose()
}

fn run<F: Acc>(plan: &SsuPlan, mut args: SelectiveStateUpdateArgs<'_>) -> Result<(), SsuError> {
    let dev = plan.device;
    let x = host("x", args.x.host_bytes(), dev)?;
    let dt = host("dt", args.dt.host_bytes(), dev)?;
    let a = host("A", args.a.host_bytes(), dev)?;
    let bb = host("B", args.b.host_bytes(), dev)?;
    let cc = host("C", args.c.host_bytes(), dev)?;
    let d = args.d.as_ref().map(|t| host("D", t.host_bytes(), dev)).transpose()?;
    let dt_bias = args.dt_bias.as_ref().map(|t| host("dt_bias", t.host_bytes(), dev)).transpose()?;
    let z = args.z.as_ref().map(|t| host("z", t.host_bytes(), dev)).transpose()?;
    let sbi =
        args.state_batch_indices.as_ref().map(|t| host("state_batch_indices", t.host_bytes(), dev)).transpose()?;
    let dst = match &args.dst_state_batch_indices {
        Some(t) => Some(host("dst_state_batch_indices", t.host_bytes(), dev)?),
        None => sbi,
    };
    let nacc =
        args.num_accepted_tokens.as_ref().map(|t| host("num_accepted_tokens", t.host_bytes(), dev)).transpose()?;
    let cu = args.cu_seqlens;
    let ty = plan.dtypes;
    let out = host_mut("out", Some(&mut args.out), dev)?.expect("given");
    let state = host_mut("state", Some(&mut args.state), dev)?.expect("given");
    let entry_ints = args
        .intermediate_state_indices
        .as_ref()
        .map(|t| host("intermediate_state_indices", t.host_bytes(), dev))
        .transpose()?;
    let mut buffer = host_mut("intermediate_states_buffer", args.intermediate_states_buffer.as_mut(), dev)?;
    let mut scales = host_mut("state_scale", args.state_scale.as_mut(), dev)?;
    let mut buffer_scales = host_mut("intermediate_state_scales", args.intermediate_state_scales.as_mut(), dev)?;
    let writes_state = plan.writes_state();
    if let Some(t) = &args.rand_seed {
        host("rand_seed", t.host_bytes(), dev)?;
    }
    // The Philox key: from `rand_seed` when given (host, checked above).
    let seed = plan.host_seed(args.rand_seed.as_ref()).unwrap_or(0);

    let sd = plan.dims;
    let (heads, dim, dstate) = (sd.heads, sd.dim, sd.dstate);
    let hpg = plan.heads_per_group();
    let tied = plan.form == ParamForm::Tied;
    let softplus = |v: F| if v <= F::from_f64(20.0) { (v.exp() + F::from_f64(1.0)).ln() } else { v };
    let mut s = vec![F::ZERO; dim * dstate];

    for b in 0..sd.seqs {
        let (start, len) = host_seq_bounds(plan, cu.as_ref(), b);
        if len == 0 {
            continue;
        }
        let col = match (nacc, plan.num_accepted_tokens) {
            (Some(n), Some(st)) => crate::start_column(read_int(n, ty.num_accepted_tokens.unwrap(), st.at([b]))),
            _ => 0,
        };
        let (src, dst_final) = match (sbi, plan.state_batch_indices) {
            (Some(t), Some(tab)) => {
                let dtab = plan.dst_state_batch_indices.unwrap();
                let src = read_int(t, tab.dtype, tab.strides.at([b, col]));
                // Speculative calls store per token (`dst[b, t]`) and never read `dst[b, col]`.
                (src, if plan.spec { src } else { read_int(dst.unwrap(), dtab.dtype, dtab.strides.at([b, col])) })
            }
            _ => (b as i64, b as i64),
        };
        let live = !(plan.state_batch_indices.is_some() && plan.is_pad(src));
        // The intermediate-buffer entry of the sequence (FlashInfer's `icache_idx`).
        let entry = plan.host_entry(entry_ints, b, src).filter(|_| live);
        let base_row = match plan.route {
            Route::Varlen => start,
            _ => b,
        };
        for h in 0..heads {
            let g = h / hpg;
            for p in 0..dim {
                // An i16 / i8 row is `q · scale` (a pad source reads zeros and no scale).
                let decode = match (&scales, plan.state_scale) {
                    (Some(sc), Some(st)) if live => F::from_f64(read(sc, DType::F32, st.at([src as usize, h, p]))),
                    _ => F::from_f64(1.0),
                };
                for n in 0..dstate {
                    s[p * dstate + n] = if live {
                        F::from_f64(read(state, ty.state, plan.state.at([src as usize, h, p, n]))) * decode
                    } else {
                        F::ZERO
                    };
                }
            }
            for t in 0..len {
                let tok = |ts: &crate::TokenStrides| plan.token_base(ts, b, base_row) + t as isize * ts.tok;
                let (xb, dtb, bbase, cbase, ob) =
                    (tok(&plan.x), tok(&plan.dt), tok(&plan.b), tok(&plan.c), tok(&plan.out));
                for p in 0..dim {
                    let pp = if tied { 0 } else { p };
                    let mut dtv = F::from_f64(read(dt, ty.dt, plan.dt.at(dtb, h, pp)));
                    if let (Some(bias), Some(st)) = (dt_bias, plan.dt_bias) {
                        dtv = dtv + F::from_f64(read(bias, ty.dt_bias.unwrap(), st.at([h, pp])));
                    }
                    if plan.dt_softplus {
                        dtv = softplus(dtv);
                    }
                    let xv = F::from_f64(read(x, ty.x, plan.x.at(xb, h, p)));
                    for n in 0..dstate {
                        let av = if tied {
                            F::from_f64(read(a, ty.a, plan.a.at([h, 0, 0])))
                        } else {
                            F::from_f64(read(a, ty.a, plan.a.at([h, p, n])))
                        };
                        let da = (av * dtv).exp();
                        let bv = F::from_f64(read(bb, ty.b, plan.b.at(bbase, g, n)));
                        let i = p * dstate + n;
                        s[i] = s[i] * da + (bv * dtv) * xv;
                    }
                }
                if let (Some(ip), Some(e), Some(buf)) = (plan.intermediate, entry, buffer.as_deref_mut()) {
                    let e = e as usize;
                    for p in 0..dim {
                        let scale = match (buffer_scales.as_deref_mut(), ip.scales) {
                            (Some(b), Some(st)) => Some((b, st.at([e, t, h, p]))),
                            _ => None,
                        };
                        store_row(buf, ty.state, |n| ip.at(e, t, h, p, n), &s[p * dstate..(p + 1) * dstate], scale);
                    }
                }
                if plan.spec && live && writes_state {
                    let dtab = plan.dst_state_batch_indices.unwrap();
                    let ds = read_int(dst.unwrap(), dtab.dtype, dtab.strides.at([b, t]));
                    if !plan.is_pad(ds) {
                        let ds = ds as usize;
                        for p in 0..dim {
                            let scale = pool_scale(scales.as_deref_mut(), plan, ds, h, p);
                            store_row(
                                state,
                                ty.state,
                                |n| plan.state.at([ds, h, p, n]),
                                &s[p * dstate..(p + 1) * dstate],
                                scale,
                            );
                        }
                    }
                }
                for p in 0..dim {
                    let mut y = F::ZERO;
                    for n in 0..dstate {
                        y = y + s[p * dstate + n] * F::from_f64(read(cc, ty.c, plan.c.at(cbase, g, n)));
                    }
                    let xv = F::from_f64(read(x, ty.x, plan.x.at(xb, h, p)));
                    if let (Some(dd), Some(st)) = (d, plan.d) {
                        y = y + xv * F::from_f64(read(dd, ty.d.unwrap(), st.at([h, p])));
                    }
                    if let (Some(zz), Some(zs)) = (z, plan.z) {
                        let zv = F::from_f64(read(zz, ty.z.unwrap(), zs.at(tok(&zs), h, p)));
                        let sig = F::from_f64(1.0) / (F::from_f64(1.0) + (F::from_f64(-1.0) * zv).exp());
                        y = y * zv * sig;
                    }
                    let oi = plan.out.at(ob, h, p);
                    write(out, ty.out, oi, y.to_f32());
                }
            }
            if writes_state && !plan.spec && live && !(plan.state_batch_indices.is_some() && plan.is_pad(dst_final)) {
                let dst_final = dst_final as usize;
                for p in 0..dim {
                    let row = &s[p * dstate..(p + 1) * dstate];
                    let Some(sr) = plan.stochastic_rounding else {
                        let scale = pool_scale(scales.as_deref_mut(), plan, dst_final, h, p);
                        store_row(state, ty.state, |n| plan.state.at([dst_final, h, p, n]), row, scale);
                        continue;
                    };
                    let st = plan.state.strides;
                    for (n, v) in row.iter().enumerate() {
                        let idx = plan.state.at([dst_final, h, p, n]);
                        let pair = (src as isize * st[0]
                            + h as isize * st[1]
                            + p as isize * st[2]
                            + (n - n % 2) as isize * st[3]) as u64;
                        let r = sr_bits(seed, sr.rounds(), pair, n % 2 == 1);
                        state[idx * 2..idx * 2 + 2].copy_from_slice(&round_f16_stochastic(v.to_f32(), r).to_le_bytes());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Where the decode scale of pool row (`slot`, `h`, `p`) goes: with an i16 / i8 state only.
fn pool_scale<'s>(
    scales: Option<&'s mut [u8]>,
    plan: &SsuPlan,
    slot: usize,
    h: usize,
    p: usize,
) -> Option<(&'s mut [u8], usize)> {
    Some((scales?, plan.state_scale?.at([slot, h, p])))
}

/// Stores one state row (`row[n]` to element `at(n)` of `dst`): rounded to nearest in a float
/// dtype, or quantized to i16 / i8 with its decode scale written to `scale` ([`crate::quant`]).
fn store_row<F: Acc>(
    dst: &mut [u8],
    dtype: DType,
    at: impl Fn(usize) -> usize,
    row: &[F],
    scale: Option<(&mut [u8], usize)>,
) {
    match scale {
        None => {
            for (n, v) in row.iter().enumerate() {
                write(dst, dtype, at(n), v.to_f32());
            }
        }
        Some((sc, si)) => {
            let row: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
            let (q, decode) = crate::quant::quantize_row_as(dtype, &row);
            for (n, qi) in q.iter().enumerate() {
                ssm_tensor::elem::write_i64(dst, dtype, at(n), *qi);
            }
            ssm_tensor::elem::write_f32(sc, DType::F32, si, decode);
        }
    }
}
