//! Scalar reference of `mamba_chunk_scan_combined_varlen`: the sequential recurrence of
//! semantics/ssd_mamba2.md §1 and §2.11, token by token, chunk by chunk, in f32
//! ([`mamba_chunk_scan_combined_varlen`]) or f64 ([`mamba_chunk_scan_combined_varlen_f64`]).
//! The running state is carried un-rounded across chunks; `varlen_states` rows are rounded
//! to the state dtype when stored. Slow and allocating on purpose: it is the oracle.
//!
//! With pool addressing, a sequence reads its initial state when its first chunk opens,
//! writes its checkpoint after the chunk its checkpoint names and its final state after its
//! last chunk; the plan's aliasing rule makes this order equal to "every read before any
//! write" (no other sequence reads a slot a sequence writes).

use crate::Planned;
use crate::{MambaChunkScanCombinedVarlenArgs, SsdPlan, StateSource};
use ssm_tensor::Strided;

pub use ssm_tensor::Precision;

/// `dt` processing of stage 1: `+ dt_bias`, softplus (threshold 20) when asked, then the
/// `dt_limit` clamp, always.
pub fn process_dt<F: Precision>(raw: F, bias: Option<F>, softplus: bool, (lo, hi): (f32, f32)) -> F {
    let mut v = match bias {
        Some(b) => raw + b,
        None => raw,
    };
    if softplus && v <= F::of(20.0) {
        v = v.exp().ln_1p();
    }
    if v < F::of(lo) {
        v = F::of(lo);
    }
    if v > F::of(hi) {
        v = F::of(hi);
    }
    v
}

/// The f32 reference.
pub fn mamba_chunk_scan_combined_varlen(call: Planned<MambaChunkScanCombinedVarlenArgs<'_>>) {
    let (args, plan) = call.into_parts();
    let plan = &plan;
    run::<f32>(plan, args)
}

/// The f64 reference (stores round to each tensor's dtype).
pub fn mamba_chunk_scan_combined_varlen_f64(call: Planned<MambaChunkScanCombinedVarlenArgs<'_>>) {
    let (args, plan) = call.into_parts();
    let plan = &plan;
    run::<f64>(plan, args)
}

fn run<F: Precision>(p: &SsdPlan, mut args: MambaChunkScanCombinedVarlenArgs<'_>) {
    let (hh, pd, nd) = (p.heads, p.dim, p.dstate);
    let per_head = pd * nd;
    let ratio = p.heads_per_group();
    let mut s = vec![F::ZERO; hh * per_head];
    fn host<'t>(t: &Option<ssm_tensor::TensorRef<'t>>) -> Option<&'t [u8]> {
        t.as_ref().and_then(|t| t.host_bytes())
    }
    let init = |args: &MambaChunkScanCombinedVarlenArgs<'_>, seq: usize, s: &mut [F]| {
        let src = p.initial_source(host(&args.initial_state_indices), host(&args.has_initial_state), seq);
        let mut read = |f: &dyn Fn(usize, usize, usize) -> f32| {
            for (e, v) in s.iter_mut().enumerate() {
                let (h, r) = (e / per_head, e % per_head);
                *v = F::of(f(h, r / nd, r % nd));
            }
        };
        match (src, &args.initial_states, p.initial_states, &args.ssm_state, p.ssm_state) {
            (Some(StateSource::InitialStates(row)), Some(t), Some(ip), ..) => {
                read(&|h, pp, n| t.elem_f32(ip.at([row, h, pp, n])))
            }
            (Some(StateSource::Pool(slot)), _, _, Some(t), Some(sp)) => {
                let t = t.as_ref();
                read(&|h, pp, n| t.elem_f32(sp.at([slot, h, pp, n])))
            }
            _ => s.iter_mut().for_each(|v| *v = F::ZERO),
        }
    };
    let store = |t: Option<&mut ssm_tensor::TensorMut<'_>>, at: Option<Strided<4>>, row: usize, s: &[F]| {
        let (Some(t), Some(at)) = (t, at) else { return };
        for (e, v) in s.iter().enumerate() {
            let (h, r) = (e / per_head, e % per_head);
            t.set_f32(at.at([row, h, r / nd, r % nd]), v.f32());
        }
    };
    // The returned row of sequence `seq` (or chunk), and its final state into its pool slot.
    let finish = |args: &mut MambaChunkScanCombinedVarlenArgs<'_>, seq: usize, s: &[F]| {
        if !p.return_intermediate_states {
            store(args.varlen_states.as_mut(), p.varlen_states, seq, s);
        }
        if let Some(slot) = p.final_slot(host(&args.final_state_indices), seq) {
            store(args.ssm_state.as_mut(), p.ssm_state, slot, s);
        }
    };
    for c in 0..p.nchunks {
        let seq = p.seq_of(&args, c);
        if p.opens_sequence(&args, c) {
            init(&args, seq, &mut s);
        }
        let (start, end) = p.chunk(&args, c);
        for t in start..end {
            for h in 0..hh {
                let g = h / ratio;
                let bias = args.dt_bias.as_ref().zip(p.dt_bias).map(|(b, bp)| F::of(b.elem_f32(bp.at([h]))));
                let dt = process_dt(F::of(args.dt.elem_f32(p.dt.at([t, h, 0]))), bias, p.dt_softplus, p.dt_limit);
                let decay = (F::of(args.a.elem_f32(p.a.at([h]))) * dt).exp();
                let sh = &mut s[h * per_head..(h + 1) * per_head];
                for pp in 0..pd {
                    let xv = F::of(args.x.elem_f32(p.x.at([t, h, pp])));
                    let mut y = F::ZERO;
                    for n in 0..nd {
                        let bv = F::of(args.b.elem_f32(p.b.at([t, g, n])));
                        let cv = F::of(args.c.elem_f32(p.c.at([t, g, n])));
                        let v = sh[pp * nd + n] * decay + dt * xv * bv;
                        sh[pp * nd + n] = v;
                        y = y + v * cv;
                    }
                    if let (Some(d), Some(dp)) = (&args.d, p.d) {
                        y = y + F::of(d.elem_f32(dp.at([h, pp, 0]))) * xv;
                    }
                    if let (Some(z), Some(zp)) = (&args.z, p.z) {
                        let zv = F::of(z.elem_f32(zp.at([t, h, pp])));
                        y = y * zv / (F::of(1.0) + (F::ZERO - zv).exp());
                    }
                    if let (Some(o), Some(op)) = (args.out.as_mut(), p.out) {
                        o.set_f32(op.at([t, h, pp]), y.f32());
                    }
                }
            }
        }
        if p.return_intermediate_states {
            store(args.varlen_states.as_mut(), p.varlen_states, c, &s);
        }
        if let Some((chunk, slot)) =
            p.checkpoint(host(&args.checkpoint_chunk_indices), host(&args.checkpoint_state_indices), seq)
            && chunk == c
        {
            store(args.ssm_state.as_mut(), p.ssm_state, slot, &s);
        }
        if p.last_chunk(&args, seq) == c as i64 {
            finish(&mut args, seq, &s);
        }
    }
    // An empty sequence returns the state it entered with.
    for b in 0..p.batch {
        if p.last_chunk(&args, b) < 0 {
            init(&args, b, &mut s);
            finish(&mut args, b, &s);
        }
    }
}
