//! GPU tests of the CUDA gated-delta-rule kernels (`fused_gdn_gating`,
//! `fused_recurrent_gated_delta_rule`, `fused_sigmoid_gating_delta_rule_update`). Each skips with
//! a printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns the skip into a
//! failure. Random cases come from `ssm_conformance::gdn_random`, the generator every backend's
//! property tests share.

// The staging error is the test harness's (large) error enum, on a copy path, never a decode path.
#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec, SplitMix};
use ssm_cuda::testing::{DeviceGdnGatingArgs, DeviceGdnRecurrentArgs, DeviceGdnSigmoidArgs, MirrorError, run_staged};
use ssm_cuda::{CudaBackend, CudaError, DeviceErrors};
use ssm_gdn::reference::Reference;
use ssm_tensor::{DType, HostTensor, Run};

/// Absolute and relative tolerance for values stored as `dtype` (the GPU sums over K in another
/// order than the reference; a 16-bit state may round one ulp apart and carry it on).
fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-4, 2e-3),
        DType::F16 => (4e-3, 4e-3),
        _ => (3e-2, 3e-2),
    }
}

/// NaN must match NaN (unwritten poison); other values within the tolerance of the dtype.
fn close(what: &str, got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    let (atol, rtol) = tolerance(want.dtype);
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
        if g.is_nan() || w.is_nan() {
            if !(g.is_nan() && w.is_nan()) {
                return Err(format!("{what}[{i}]: got {g}, want {w} (one is unwritten)"));
            }
            continue;
        }
        if (g - w).abs() > atol + rtol * w.abs() {
            return Err(format!("{what}[{i}]: got {g}, want {w}"));
        }
    }
    Ok(())
}

/// Slots of `pool` outside `writable` are bit-identical in `before` and `after`.
fn untouched(what: &str, before: &HostTensor, after: &HostTensor, writable: &[usize]) {
    let per_slot = before.bytes().len() / before.shape[0];
    for slot in 0..before.shape[0] {
        if writable.contains(&slot) {
            continue;
        }
        let r = slot * per_slot..(slot + 1) * per_slot;
        assert!(before.bytes()[r.clone()] == after.bytes()[r], "{what}: slot {slot} changed");
    }
}

fn run_cuda_recurrent(be: &CudaBackend, c: &mut RecurrentCase) -> Result<(), MirrorError> {
    run_staged::<DeviceGdnRecurrentArgs>(be, c.recurrent_args())
}

fn run_cuda_sigmoid(be: &CudaBackend, c: &mut RecurrentCase) -> Result<(), MirrorError> {
    run_staged::<DeviceGdnSigmoidArgs>(be, c.sigmoid_args())
}

fn compare_case(what: &str, base: &RecurrentCase, got: &RecurrentCase, want: &RecurrentCase) {
    close(&format!("{what} o"), &got.o, &want.o).unwrap();
    if let (Some(g), Some(w), Some(b)) = (&got.state, &want.state, &base.state) {
        close(&format!("{what} state"), g, w).unwrap();
        untouched(what, b, g, &base.writable_slots());
    }
    if let (Some(g), Some(w)) = (&got.final_state, &want.final_state) {
        close(&format!("{what} final_state"), g, w).unwrap();
    }
}

/// Both recurrent ops against the f32 reference over the property matrix: odd sizes, K ≠ V,
/// null slots, empty sequences, accepted counts (valid and invalid), dense / varlen /
/// speculative / not in place / no state, both layouts, f32 and bf16 state.
#[test]
fn recurrent_ops_match_the_reference_over_the_property_matrix() {
    let Some(be) = gpu("recurrent_ops_match_the_reference_over_the_property_matrix") else { return };
    for i in 0..60 {
        let spec = RecurrentSpec::matrix(i);
        let base = RecurrentCase::random(spec, 1000 + i as u64);
        let what = format!("case {i} {spec:?} lens={:?}", base.lens);

        let mut want = base.clone();
        Reference::F32.run(ssm_gdn::plan(want.recurrent_args()).unwrap()).unwrap();
        let mut got = base.clone();
        run_cuda_recurrent(&be, &mut got).unwrap_or_else(|e| panic!("{what}: {e}"));
        compare_case(&format!("recurrent {what}"), &base, &got, &want);

        let mut want = base.clone();
        Reference::F32.run(ssm_gdn::plan(want.sigmoid_args()).unwrap()).unwrap();
        let mut got = base.clone();
        run_cuda_sigmoid(&be, &mut got).unwrap_or_else(|e| panic!("{what}: {e}"));
        compare_case(&format!("sigmoid {what}"), &base, &got, &want);
    }
}

/// Qwen3-Next decode shapes (K = V = 128, 32 value heads over 16 q/k heads), f32 and bf16 state.
#[test]
fn qwen3_next_decode_matches_the_reference() {
    let Some(be) = gpu("qwen3_next_decode_matches_the_reference") else { return };
    for state in [DType::F32, DType::BF16] {
        let spec = RecurrentSpec { heads: 16, v_heads: 32, ..RecurrentSpec::decode(48, state) };
        let base = RecurrentCase::random(spec, 77);
        let mut want = base.clone();
        Reference::F32.run(ssm_gdn::plan(want.sigmoid_args()).unwrap()).unwrap();
        let mut got = base.clone();
        run_cuda_sigmoid(&be, &mut got).unwrap();
        compare_case(&format!("qwen3-next decode state={state}"), &base, &got, &want);
    }
}

#[test]
fn gating_matches_the_reference() {
    let Some(be) = gpu("gating_matches_the_reference") else { return };
    let mut r = SplitMix::new(5);
    for (t, hv, io) in [(1, 1, DType::F32), (37, 12, DType::BF16), (513, 32, DType::F16), (3, 7, DType::F32)] {
        let a_log = r.tensor(DType::F32, &[hv], -1.0, 1.0);
        let dt_bias = r.tensor(DType::F32, &[hv], -1.0, 1.0);
        let a = r.tensor(io, &[t, hv], -30.0, 30.0);
        let b = r.tensor(io, &[t, hv], -5.0, 5.0);
        let run = |g: &mut HostTensor, beta: &mut HostTensor, cuda: bool| {
            let args = ssm_gdn::FusedGdnGatingArgs {
                gates: ssm_gdn::GateInputs::new(a_log.view(), a.view(), b.view(), dt_bias.view()),
                g: g.view_mut(),
                beta_output: beta.view_mut(),
            };
            if cuda {
                run_staged::<DeviceGdnGatingArgs>(&be, args).unwrap();
            } else {
                Reference::F32.run(ssm_gdn::plan(args).unwrap()).unwrap();
            }
        };
        let (mut gw, mut bw) =
            (HostTensor::filled(DType::F32, vec![1, t, hv], f32::NAN), HostTensor::filled(io, vec![t, hv], f32::NAN));
        let (mut gg, mut bg) = (gw.clone(), bw.clone());
        run(&mut gw, &mut bw, false);
        run(&mut gg, &mut bg, true);
        close("g", &gg, &gw).unwrap();
        close("beta_output", &bg, &bw).unwrap();
        assert!(gg.to_f64_vec().iter().all(|x| x.is_finite()), "every g written");
    }
}

/// Garbage index values in device tables: no crash, the error word says which, the sequences
/// with a bad value write nothing (outputs stay poisoned), untouched slots stay bit-identical,
/// the valid sequences are still right.
#[test]
fn garbage_device_indices_never_escape_their_tensors() {
    let Some(be) = gpu("garbage_device_indices_never_escape_their_tensors") else { return };
    for index in [DType::I32, DType::I64] {
        for layout in [ssm_gdn::StateLayout::VK, ssm_gdn::StateLayout::KV] {
            let spec =
                RecurrentSpec { index, layout, varlen: false, max_len: 1, ..RecurrentSpec::decode(6, DType::F32) };
            let mut base = RecurrentCase::random(spec, 9);
            let slots = base.state.as_ref().unwrap().shape[0] as i64;
            let mut table: Vec<i64> = (0..6).map(|n| 1 + n as i64).collect();
            table[1] = slots; // just past the pool
            table[3] = if index == DType::I64 { 1 << 40 } else { i32::MAX as i64 };
            base.ix = Some(HostTensor::from_i64(index, vec![6], &table));
            let mut got = base.clone();
            let err = run_cuda_sigmoid(&be, &mut got).unwrap_err();
            assert!(
                matches!(err, MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(bits))) if bits & DeviceErrors::SLOT != 0),
                "{err}"
            );
            // The valid sequences as the reference computes them (bad rows marked null there).
            let mut want = base.clone();
            let mut nulled = table.clone();
            nulled[1] = 0;
            nulled[3] = 0;
            want.ix = Some(HostTensor::from_i64(index, vec![6], &nulled));
            Reference::F32.run(ssm_gdn::plan(want.sigmoid_args()).unwrap()).unwrap();
            close("o", &got.o, &want.o).unwrap();
            let writable: Vec<usize> = nulled.iter().filter(|&&s| s > 0).map(|&s| s as usize).collect();
            untouched("garbage", base.state.as_ref().unwrap(), got.state.as_ref().unwrap(), &writable);
            close("state", got.state.as_ref().unwrap(), want.state.as_ref().unwrap()).unwrap();
        }
    }
    // A broken cu_seqlens (decreasing, past the tokens) and a speculative table with a bad
    // destination column.
    let spec = RecurrentSpec { max_len: 3, ..RecurrentSpec::decode(3, DType::BF16) };
    let mut base = case_where(spec, |c| c.lens.iter().sum::<usize>() > 0);
    let t = base.q.shape[1] as i64;
    base.cu = Some(HostTensor::from_i64(DType::I32, vec![4], &[0, t + 5, 1, -3]));
    let mut got = base.clone();
    let err = run_cuda_recurrent(&be, &mut got).unwrap_err();
    assert!(
        matches!(err, MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(bits))) if bits & DeviceErrors::CU_SEQLENS != 0),
        "{err}"
    );
    assert!(got.o.to_f64_vec().iter().all(|x| x.is_nan()), "no output written");
    assert_eq!(got.state.as_ref().unwrap().bytes(), base.state.as_ref().unwrap().bytes(), "no state written");

    let spec = RecurrentSpec { table: 2, columns: 2, max_len: 2, ..RecurrentSpec::decode(2, DType::F32) };
    let mut base = case_where(spec, |c| c.lens[0] == 2);
    let slots = base.state.as_ref().unwrap().shape[0] as i64;
    base.ix = Some(HostTensor::from_i64(DType::I32, vec![2, 2], &[1, slots + 7, 2, 3]));
    base.na = Some(HostTensor::from_i64(DType::I32, vec![2], &[1, 1]));
    let mut got = base.clone();
    let err = run_cuda_recurrent(&be, &mut got).unwrap_err();
    assert!(matches!(err, MirrorError::Cuda(CudaError::InvalidIndices(_))), "{err}");
    untouched("spec garbage", base.state.as_ref().unwrap(), got.state.as_ref().unwrap(), &[2, 3]);
}

/// The first random case of `spec` (seeds 0, 1, …) for which `pred` holds.
fn case_where(spec: RecurrentSpec, pred: impl Fn(&RecurrentCase) -> bool) -> RecurrentCase {
    (0..1000).map(|seed| RecurrentCase::random(spec, seed)).find(|c| pred(c)).expect("a seed with the wanted lengths")
}

/// A decode step captured in a CUDA graph and replayed 50 times equals 50 eager calls.
#[test]
fn graph_replay_equals_eager_execution() {
    let Some(be) = gpu("gdn graph_replay_equals_eager_execution") else { return };
    let mut case = RecurrentCase::random(RecurrentSpec::decode(32, DType::F32), 4242);
    common::assert_graph_replay_equals_eager::<DeviceGdnSigmoidArgs>(
        &be,
        &case.sigmoid_args(),
        50,
        |a| be.prewarm_gdn_recurrent(ssm_gdn::plan(a).unwrap().plan()).unwrap(),
        |d| {
            vec![
                d.state_buffer().expect("a decode case has a state").download().unwrap(),
                d.out_buffer().download().unwrap(),
            ]
        },
    );
}

/// A call allocates no device memory (free memory unchanged over many calls, after the kernel
/// was loaded).
#[test]
fn calls_allocate_no_device_memory() {
    let Some(be) = gpu("gdn calls_allocate_no_device_memory") else { return };
    let mut case = RecurrentCase::random(RecurrentSpec::decode(64, DType::BF16), 31);
    common::assert_calls_allocate_no_device_memory::<DeviceGdnSigmoidArgs>(&be, &case.sigmoid_args());
}

#[test]
fn host_tensors_are_refused() {
    let Some(be) = gpu("gdn host_tensors_are_refused") else { return };
    let mut case = RecurrentCase::random(RecurrentSpec::decode(2, DType::F32), 1);
    let err = be.run(ssm_gdn::plan(case.sigmoid_args()).unwrap()).unwrap_err();
    assert!(matches!(err, CudaError::WrongDevice { .. }), "{err}");
}
