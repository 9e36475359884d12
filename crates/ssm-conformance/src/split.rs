//! Tensor parallelism as engines do it: a layer's heads (and, for Mamba2, its groups; for GDN,
//! its q/k heads) split in two, each half run on its own target from its own thread on its own
//! copy of its half of every tensor (its pool shard), the outputs and pools gathered back. The
//! gathered result must be bit-identical to the whole layer run on one target: every op here
//! is independent across heads, so a split changes no arithmetic.
//!
//! One check per op of the two layer kinds: [`ssu_decode`] and [`ssd_prefill`] (a Mamba2
//! layer), [`gdn_decode`] and [`gdn_chunked_prefill`] (a GDN layer). [`all`] runs the four. The
//! targets are any [`Target`]s: CPU runtimes in CI, CUDA runtimes on two devices (or two on one)
//! on a GPU machine; an op a target has no kernel for is reported, not failed.

use ssm_gdn::{ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, compute_chunk_metadata};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, HostTensor, TensorRef};

use crate::gdn_random::SplitMix;
use crate::{Target, TargetError};

/// Which axis of a tensor carries the split, and by which count.
#[derive(Debug, Clone, Copy)]
enum Axis {
    /// The (value) head axis.
    Head(usize),
    /// The group axis (Mamba2 B/C groups; GDN q/k heads).
    Group(usize),
    /// Not split: both halves get the whole tensor (tables, metadata).
    Shared,
}

/// One tensor of a call.
struct Part {
    t: HostTensor,
    axis: Axis,
    written: bool,
}

fn part(t: HostTensor, axis: Axis) -> Part {
    Part { t, axis, written: false }
}

fn written(t: HostTensor, axis: Axis) -> Part {
    Part { t, axis, written: true }
}

/// Elements `range` of axis `axis` of `t`, as a new contiguous tensor.
fn take(t: &HostTensor, axis: usize, range: std::ops::Range<usize>) -> HostTensor {
    let es = t.dtype.size();
    let outer: usize = t.shape[..axis].iter().product();
    let inner: usize = t.shape[axis + 1..].iter().product::<usize>() * es;
    let n = t.shape[axis];
    let mut bytes = Vec::with_capacity(outer * range.len() * inner);
    for o in 0..outer {
        bytes.extend_from_slice(&t.bytes()[(o * n + range.start) * inner..(o * n + range.end) * inner]);
    }
    let mut shape = t.shape.clone();
    shape[axis] = range.len();
    HostTensor::from_bytes(t.dtype, shape, &bytes)
}

/// The two halves concatenated along `axis`.
fn concat(a: &HostTensor, b: &HostTensor, axis: usize) -> HostTensor {
    let es = a.dtype.size();
    let outer: usize = a.shape[..axis].iter().product();
    let inner: usize = a.shape[axis + 1..].iter().product::<usize>() * es;
    let (na, nb) = (a.shape[axis], b.shape[axis]);
    let mut bytes = Vec::with_capacity(a.bytes().len() + b.bytes().len());
    for o in 0..outer {
        bytes.extend_from_slice(&a.bytes()[o * na * inner..(o + 1) * na * inner]);
        bytes.extend_from_slice(&b.bytes()[o * nb * inner..(o + 1) * nb * inner]);
    }
    let mut shape = a.shape.clone();
    shape[axis] = na + nb;
    HostTensor::from_bytes(a.dtype, shape, &bytes)
}

/// What a split check found: `Ok(true)` bit-identical, `Ok(false)` the op is unsupported on a
/// target (nothing compared), `Err` a difference or a failed call.
pub type SplitResult = Result<bool, String>;

/// Runs `call` on the whole `parts` on `whole` and on each half on `halves[i]` (each half from
/// its own thread), gathers the written parts and compares them bit for bit.
fn check<T: Target + Sync>(
    op: &str,
    whole: &T,
    halves: [&T; 2],
    parts: Vec<Part>,
    (heads, groups): (usize, usize),
    call: fn(&T, &mut [HostTensor]) -> Result<(), TargetError>,
) -> SplitResult {
    let unsupported = |e: &TargetError| matches!(e, TargetError::Unsupported(_));
    let mut full: Vec<HostTensor> = parts.iter().map(|p| p.t.clone()).collect();
    match call(whole, &mut full) {
        Err(e) if unsupported(&e) => return Ok(false),
        Err(e) => return Err(format!("{op}, whole layer: {e}")),
        Ok(()) => {}
    }
    let half_parts = |i: usize| -> Vec<HostTensor> {
        let (h, g) = (heads / 2, groups / 2);
        parts
            .iter()
            .map(|p| match p.axis {
                Axis::Head(a) => take(&p.t, a, i * h..(i + 1) * h),
                Axis::Group(a) => take(&p.t, a, i * g..(i + 1) * g),
                Axis::Shared => p.t.clone(),
            })
            .collect()
    };
    let (mut p0, mut p1) = (half_parts(0), half_parts(1));
    let (r0, r1) = std::thread::scope(|s| {
        let t0 = s.spawn(|| call(halves[0], &mut p0));
        let t1 = s.spawn(|| call(halves[1], &mut p1));
        (t0.join().expect("half 0 panicked"), t1.join().expect("half 1 panicked"))
    });
    for (i, r) in [r0, r1].into_iter().enumerate() {
        match r {
            Err(e) if unsupported(&e) => return Ok(false),
            Err(e) => return Err(format!("{op}, half {i}: {e}")),
            Ok(()) => {}
        }
    }
    for (k, p) in parts.iter().enumerate().filter(|(_, p)| p.written) {
        if full[k].bytes() == p.t.bytes() {
            return Err(format!("{op}: the whole layer left written tensor {k} as it was; nothing to compare"));
        }
        let gathered = match p.axis {
            Axis::Head(a) | Axis::Group(a) => concat(&p0[k], &p1[k], a),
            Axis::Shared => unreachable!("written tensors are split"),
        };
        if gathered.bytes() != full[k].bytes() {
            let (g, w) = (gathered.to_f64_vec(), full[k].to_f64_vec());
            let i = g.iter().zip(&w).position(|(a, b)| a.to_bits() != b.to_bits()).unwrap_or(0);
            return Err(format!("{op}: written tensor {k} differs at element {i}: split {} vs whole {}", g[i], w[i]));
        }
    }
    Ok(true)
}

fn f32s(r: &mut SplitMix, shape: &[usize], lo: f32, hi: f32) -> HostTensor {
    r.tensor(DType::F32, shape, lo, hi)
}

fn ints(shape: &[usize], v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::I32, shape.to_vec(), v)
}

/// A per-head tensor `t` (`[H]`) broadcast to `[H, rest…]` (the tied Mamba2 parameters).
fn tied<'t>(t: &'t HostTensor, rest: &[usize]) -> TensorRef<'t> {
    let shape: Vec<usize> = std::iter::once(t.shape[0]).chain(rest.iter().copied()).collect();
    let strides: Vec<isize> = std::iter::once(1).chain(rest.iter().map(|_| 0)).collect();
    t.view().with_layout(&shape, &strides, 0).expect("a broadcast of a per-head tensor")
}

/// Mamba2 decode: 8 heads of dim 16, dstate 32, 4 groups, 6 sequences (one a pad row) over a
/// pool of 9 slots, tied `dt`/`A`/`dt_bias`/`D`, z gate, bf16 activations.
pub fn ssu_decode<T: Target + Sync>(whole: &T, halves: [&T; 2], seed: u64) -> SplitResult {
    let (b, h, p, n, g, slots) = (6, 8, 16, 32, 4, 9);
    let mut r = SplitMix::new(seed);
    let bf = |r: &mut SplitMix, shape: &[usize]| r.tensor(DType::BF16, shape, -1.0, 1.0);
    let parts = vec![
        written(f32s(&mut r, &[slots, h, p, n], -1.0, 1.0), Axis::Head(1)),
        written(HostTensor::filled(DType::BF16, vec![b, h, p], f32::NAN), Axis::Head(1)),
        part(bf(&mut r, &[b, h, p]), Axis::Head(1)),
        part(f32s(&mut r, &[b, h], -3.0, 1.0), Axis::Head(1)),
        part(f32s(&mut r, &[h], -2.0, -0.1), Axis::Head(0)),
        part(bf(&mut r, &[b, g, n]), Axis::Group(1)),
        part(bf(&mut r, &[b, g, n]), Axis::Group(1)),
        part(f32s(&mut r, &[h], 0.5, 1.5), Axis::Head(0)),
        part(f32s(&mut r, &[h], -1.0, 1.0), Axis::Head(0)),
        part(bf(&mut r, &[b, h, p]), Axis::Head(1)),
        part(ints(&[b], &[7, 2, -1, 0, 5, 8]), Axis::Shared),
    ];
    check("selective_state_update", whole, halves, parts, (h, g), |t, v| {
        let (h, p, n) = (v[0].shape[1], v[0].shape[2], v[0].shape[3]);
        let b = v[1].shape[0];
        let [state, out, x, dt, a, bb, c, d, bias, z, sbi] = v else { unreachable!("11 parts") };
        t.selective_state_update(SelectiveStateUpdateArgs {
            d: Some(tied(d, &[p])),
            dt_bias: Some(tied(bias, &[p])),
            z: Some(z.view()),
            dt_softplus: true,
            state_batch_indices: Some(sbi.view()),
            pad_slot_id: Some(-1),
            ..SelectiveStateUpdateArgs::new(
                state.view_mut(),
                x.view(),
                dt.view().with_layout(&[b, h, p], &[h as isize, 1, 0], 0).expect("dt broadcast"),
                tied(a, &[p, n]),
                bb.view(),
                c.view(),
                out.view_mut(),
            )
        })
    })
}

const SSD_CHUNK: usize = 64;

/// Mamba2 SSD prefill: 3 sequences of 70, 1 and 130 tokens (chunk 64, the second resumed from
/// its pool slot), 8 heads of dim 16, dstate 32, 2 groups, pool initial and final states.
pub fn ssd_prefill<T: Target + Sync>(whole: &T, halves: [&T; 2], seed: u64) -> SplitResult {
    let (h, p, n, g, slots) = (8, 16, 32, 2, 5);
    let cu = [0i64, 70, 71, 201];
    let total = 201;
    let m = compute_chunk_metadata(&cu, &[0, 37, 0], SSD_CHUNK);
    let wide = |v: &[i32]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
    let mut r = SplitMix::new(seed);
    let parts = vec![
        written(f32s(&mut r, &[slots, h, p, n], -0.5, 0.5), Axis::Head(1)),
        written(HostTensor::filled(DType::F32, vec![total, h, p], f32::NAN), Axis::Head(1)),
        part(f32s(&mut r, &[total, h, p], -1.0, 1.0), Axis::Head(1)),
        part(f32s(&mut r, &[total, h], -3.0, 0.5), Axis::Head(1)),
        part(f32s(&mut r, &[h], -2.0, -0.1), Axis::Head(0)),
        part(f32s(&mut r, &[total, g, n], -1.0, 1.0), Axis::Group(1)),
        part(f32s(&mut r, &[total, g, n], -1.0, 1.0), Axis::Group(1)),
        part(f32s(&mut r, &[h], 0.5, 1.5), Axis::Head(0)),
        part(f32s(&mut r, &[h], -1.0, 1.0), Axis::Head(0)),
        part(ints(&[4], &cu), Axis::Shared),
        part(ints(&[m.cu_chunk_seqlens.len()], &wide(&m.cu_chunk_seqlens)), Axis::Shared),
        part(ints(&[m.last_chunk_indices.len()], &wide(&m.last_chunk_indices)), Axis::Shared),
        part(ints(&[m.seq_idx.len()], &wide(&m.seq_idx)), Axis::Shared),
        part(ints(&[3], &[1, 3, 4]), Axis::Shared),
        part(HostTensor::from_i64(DType::Bool, vec![3], &[0, 1, 0]), Axis::Shared),
    ];
    check("mamba_chunk_scan_combined_varlen", whole, halves, parts, (h, g), |t, v| {
        let [pool, out, x, dt, a, b, c, d, bias, cu, cc, last, seq, idx, has] = v else { unreachable!("15 parts") };
        t.mamba_chunk_scan_combined_varlen(MambaChunkScanCombinedVarlenArgs {
            out: Some(out.view_mut()),
            d: Some(d.view()),
            dt_bias: Some(bias.view()),
            ssm_state: Some(pool.view_mut()),
            initial_state_indices: Some(idx.view()),
            has_initial_state: Some(has.view()),
            final_state_indices: Some(idx.view()),
            dt_softplus: true,
            ..MambaChunkScanCombinedVarlenArgs::new(
                x.view(),
                dt.view(),
                a.view(),
                b.view(),
                c.view(),
                SSD_CHUNK,
                [cu.view(), cc.view(), last.view(), seq.view()],
            )
        })
    })
}

/// Qwen3-Next-like GDN decode (`fused_sigmoid_gating_delta_rule_update`): 4 q/k heads and 8
/// value heads of 32, 5 sequences (one on the null slot 0) over a pool of 8, l2norm, bf16 q/k/v.
pub fn gdn_decode<T: Target + Sync>(whole: &T, halves: [&T; 2], seed: u64) -> SplitResult {
    let (b, h, hv, k, v, slots) = (5, 4, 8, 32, 32, 8);
    let mut r = SplitMix::new(seed);
    let bf = |r: &mut SplitMix, shape: &[usize]| r.tensor(DType::BF16, shape, -1.0, 1.0);
    let parts = vec![
        written(f32s(&mut r, &[slots, hv, v, k], -0.5, 0.5), Axis::Head(1)),
        written(HostTensor::filled(DType::BF16, vec![b, 1, hv, v], f32::NAN), Axis::Head(2)),
        part(bf(&mut r, &[b, 1, h, k]), Axis::Group(2)),
        part(bf(&mut r, &[b, 1, h, k]), Axis::Group(2)),
        part(bf(&mut r, &[b, 1, hv, v]), Axis::Head(2)),
        part(f32s(&mut r, &[hv], -1.0, 1.0), Axis::Head(0)),
        part(bf(&mut r, &[b, hv]), Axis::Head(1)),
        part(bf(&mut r, &[b, hv]), Axis::Head(1)),
        part(f32s(&mut r, &[hv], -1.0, 1.0), Axis::Head(0)),
        part(ints(&[b], &[3, 0, 6, 1, 7]), Axis::Shared),
    ];
    check("fused_sigmoid_gating_delta_rule_update", whole, halves, parts, (hv, h), |t, v| {
        let [state, o, q, k, vv, a_log, a, b, bias, idx] = v else { unreachable!("10 parts") };
        t.fused_sigmoid_gating_delta_rule_update(FusedSigmoidGatingDeltaRuleUpdateArgs {
            gates: GateInputs::new(a_log.view(), a.view(), b.view(), bias.view()),
            rule: DeltaRuleArgs {
                initial_state: Some(state.view_mut()),
                ssm_state_indices: Some(idx.view()),
                use_qk_l2norm_in_kernel: true,
                ..DeltaRuleArgs::new(q.view(), k.view(), vv.view(), o.view_mut())
            },
        })
    })
}

/// GDN chunked prefill (`chunk_gated_delta_rule`): 3 sequences of 50, 0 and 90 tokens packed,
/// 2 q/k heads and 4 value heads of 32, pool initial states (one sequence from zeros), final
/// states written back in place.
pub fn gdn_chunked_prefill<T: Target + Sync>(whole: &T, halves: [&T; 2], seed: u64) -> SplitResult {
    let (h, hv, k, v, slots) = (2, 4, 32, 32, 5);
    let cu = [0i64, 50, 50, 140];
    let total = 140;
    let mut r = SplitMix::new(seed);
    let parts = vec![
        written(f32s(&mut r, &[slots, hv, v, k], -0.5, 0.5), Axis::Head(1)),
        written(HostTensor::filled(DType::F32, vec![1, total, hv, v], f32::NAN), Axis::Head(2)),
        part(f32s(&mut r, &[1, total, h, k], -1.0, 1.0), Axis::Group(2)),
        part(f32s(&mut r, &[1, total, h, k], -1.0, 1.0), Axis::Group(2)),
        part(f32s(&mut r, &[1, total, hv, v], -1.0, 1.0), Axis::Head(2)),
        part(f32s(&mut r, &[1, total, hv], -0.5, -0.01), Axis::Head(2)),
        part(f32s(&mut r, &[1, total, hv], 0.1, 0.9), Axis::Head(2)),
        part(ints(&[4], &cu), Axis::Shared),
        part(ints(&[3], &[2, 4, 1]), Axis::Shared),
        part(HostTensor::from_i64(DType::Bool, vec![3], &[1, 1, 0]), Axis::Shared),
    ];
    check("chunk_gated_delta_rule", whole, halves, parts, (hv, h), |t, v| {
        let [state, o, q, k, vv, g, beta, cu, idx, has] = v else { unreachable!("10 parts") };
        t.chunk_gated_delta_rule(ChunkGatedDeltaRuleArgs {
            initial_state: Some(state.view_mut()),
            initial_state_indices: Some(idx.view()),
            has_initial_state: Some(has.view()),
            inplace_final_state: true,
            cu_seqlens: Some(cu.view()),
            use_qk_l2norm_in_kernel: true,
            ..ChunkGatedDeltaRuleArgs::new(q.view(), k.view(), vv.view(), g.view(), beta.view(), o.view_mut())
        })
    })
}

/// The four checks; returns `(op, compared)` for each (`compared` false: a target has no
/// kernel for the op), or the first difference.
pub fn all<T: Target + Sync>(whole: &T, halves: [&T; 2], seed: u64) -> Result<Vec<(&'static str, bool)>, String> {
    Ok(vec![
        ("selective_state_update", ssu_decode(whole, halves, seed)?),
        ("mamba_chunk_scan_combined_varlen", ssd_prefill(whole, halves, seed + 1)?),
        ("fused_sigmoid_gating_delta_rule_update", gdn_decode(whole, halves, seed + 2)?),
        ("chunk_gated_delta_rule", gdn_chunked_prefill(whole, halves, seed + 3)?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_and_concat_are_inverse() {
        let t = HostTensor::from_i64(DType::I32, vec![2, 4, 3], &(0..24).collect::<Vec<_>>());
        let (a, b) = (take(&t, 1, 0..2), take(&t, 1, 2..4));
        assert_eq!(a.to_f64_vec()[..6], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(concat(&a, &b, 1).bytes(), t.bytes());
    }
}
