//! The kernel-faithful scalar reference (vLLM's Triton `_causal_conv1d_update_kernel` and
//! `_causal_conv1d_fwd_kernel`, semantics/gdn_conv.md §4.3–4.4), one sequence at a time.
//!
//! Per output token t of a sequence, with the history window `h[0..width−1)` (oldest
//! first) followed by `x_t`:
//!
//! ```text
//! acc = bias (f32, or 0)
//! acc += round_T(h[j] · w[j])          j = 0 .. width−2
//! acc += round_T(x_t · w[width−1])
//! acc = silu(acc) = acc / (1 + e^-acc)  when asked
//! out[t] = round_T(acc)
//! ```
//!
//! `round_T` rounds the product to the storage dtype T, as Triton does when it multiplies
//! two bf16/f16 operands (the product has the operands' type before the f32 accumulate;
//! PROVENANCE.md observed it on the bf16 vectors). For f32 it is the identity. The state
//! update is a plain copy of storage values, bit-exact. [`Arithmetic::F64`] computes the
//! same formula in f64 without the product rounding: an independent check of the maths.

use half::{bf16, f16};
use ssm_tensor::{DType, Element, TensorError, TensorMut, TensorRef};

use crate::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvPlan, ConvSeq, Planned, Run};

pub use ssm_tensor::Arithmetic;

/// The scalar reference backend. Host tensors only; one thread; allocates freely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference {
    /// Arithmetic.
    pub precision: Arithmetic,
}

/// A storage dtype of the conv.
trait Storage: Element + Copy {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Storage for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

macro_rules! half_storage {
    ($t:ty) => {
        impl Storage for $t {
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            fn from_f32(v: f32) -> Self {
                <$t>::from_f32(v)
            }
        }
    };
}
half_storage!(bf16);
half_storage!(f16);

impl Run<CausalConv1dUpdateArgs<'_>> for Reference {
    type Error = TensorError;
    fn run(&self, call: Planned<CausalConv1dUpdateArgs<'_>>) -> Result<(), TensorError> {
        let (mut args, plan) = call.into_parts();
        let io = Io {
            x: &args.x,
            weight: &args.weight,
            bias: args.bias.as_ref(),
            state: &mut args.conv_state,
            out: &mut args.out,
        };
        run(self.precision, &plan, io)
    }
}

impl Run<CausalConv1dFnArgs<'_>> for Reference {
    type Error = TensorError;
    fn run(&self, call: Planned<CausalConv1dFnArgs<'_>>) -> Result<(), TensorError> {
        let (mut args, plan) = call.into_parts();
        let io = Io {
            x: &args.x,
            weight: &args.weight,
            bias: args.bias.as_ref(),
            state: &mut args.conv_states,
            out: &mut args.out,
        };
        run(self.precision, &plan, io)
    }
}

/// The tensors one conv call reads (`x`, `weight`, `bias`) and writes (`state`, `out`).
struct Io<'r, 'a> {
    x: &'r TensorRef<'a>,
    weight: &'r TensorRef<'a>,
    bias: Option<&'r TensorRef<'a>>,
    state: &'r mut TensorMut<'a>,
    out: &'r mut TensorMut<'a>,
}

fn run(precision: Arithmetic, plan: &ConvPlan, io: Io<'_, '_>) -> Result<(), TensorError> {
    let Some(seqs) = &plan.seqs else { return Err(TensorError::NotHost(plan.device)) };
    match plan.dtype {
        DType::F32 => run_typed::<f32>(precision, plan, seqs, io),
        DType::F16 => run_typed::<f16>(precision, plan, seqs, io),
        DType::BF16 => run_typed::<bf16>(precision, plan, seqs, io),
        other => Err(TensorError::DType { expected: DType::F32, actual: other }),
    }
}

fn run_typed<T: Storage>(
    precision: Arithmetic,
    plan: &ConvPlan,
    seqs: &[ConvSeq],
    io: Io<'_, '_>,
) -> Result<(), TensorError> {
    let xd = io.x.host_data::<T>()?;
    let wd = io.weight.host_data::<T>()?;
    let bd = match io.bias {
        Some(b) => Some(b.host_data::<T>()?),
        None => None,
    };
    let sd = io.state.host_data_mut::<T>()?;
    let od = io.out.host_data_mut::<T>()?;
    let (w, dim) = (plan.width, plan.dim);
    let st = plan.state;
    let state_at = |slot: usize, col: usize, c: usize| {
        (st.offset as isize + slot as isize * st.slot + col as isize * st.col + c as isize * st.dim) as usize
    };
    for s in seqs {
        for c in 0..dim {
            // Inputs of this channel.
            let xv = |t: usize| xd[(s.x_start + t as isize * plan.x.token + c as isize * plan.x.dim) as usize];
            let old = |col: usize| match s.read_slot {
                Some(r) => sd[state_at(r, col, c)],
                None => T::from_f32(0.0),
            };
            // History window, read before the state is written (read and write slots may be equal).
            let hist: Vec<T> = (0..w - 1).map(|j| old(s.offset + j)).collect();
            // New window: kept history, then the newest inputs.
            let new: Vec<T> = (0..s.state_len)
                .map(
                    |i| if i + s.len < s.state_len { old(s.offset + i + s.shift) } else { xv(i + s.len - s.state_len) },
                )
                .collect();
            if let Some(ws) = s.write_slot {
                for (i, v) in new.into_iter().enumerate() {
                    sd[state_at(ws, i, c)] = v;
                }
            }
            // The checkpoint: the same window after the first `k.tokens` tokens (fn only, so
            // the history is columns [0, width − 1) and the window is width − 1 long).
            if let Some(k) = s.checkpoint {
                for i in 0..w - 1 {
                    let v = if i + k.tokens < w - 1 { hist[i + k.tokens] } else { xv(i + k.tokens - (w - 1)) };
                    sd[state_at(k.slot, i, c)] = v;
                }
            }
            let taps: Vec<T> = (0..w)
                .map(|j| {
                    wd[(plan.weight.offset as isize + c as isize * plan.weight.dim + j as isize * plan.weight.tap)
                        as usize]
                })
                .collect();
            let b = bd.map(|b| {
                let p = plan.bias.expect("bias strides");
                b[(p.offset as isize + c as isize * p.dim) as usize]
            });
            let mut window = hist;
            for t in 0..s.len {
                let xt = xv(t);
                let y = match precision {
                    Arithmetic::F32 => {
                        let mut acc = b.map_or(0.0, |b| b.to_f32());
                        for j in 0..w - 1 {
                            acc += T::from_f32(window[j].to_f32() * taps[j].to_f32()).to_f32();
                        }
                        acc += T::from_f32(xt.to_f32() * taps[w - 1].to_f32()).to_f32();
                        if plan.activation == Activation::Silu {
                            acc /= 1.0 + (-acc).exp();
                        }
                        T::from_f32(acc)
                    }
                    Arithmetic::F64 => {
                        let mut acc = b.map_or(0.0, |b| b.to_f64());
                        for j in 0..w - 1 {
                            acc += window[j].to_f64() * taps[j].to_f64();
                        }
                        acc += xt.to_f64() * taps[w - 1].to_f64();
                        if plan.activation == Activation::Silu {
                            acc /= 1.0 + (-acc).exp();
                        }
                        T::from_f64(acc)
                    }
                };
                window.remove(0);
                window.push(xt);
                od[(s.out_start + t as isize * plan.out.token + c as isize * plan.out.dim) as usize] = y;
            }
        }
    }
    Ok(())
}
