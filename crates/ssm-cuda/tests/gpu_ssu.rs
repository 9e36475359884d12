//! GPU tests of the CUDA selective state update. Each skips with a printed reason when no GPU
//! (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` (set by `cargo xtask test-gpu` and the GPU
//! bundle's run.sh) turns the skip into a failure.

mod common;

use common::{Case, CaseSpec, Layout, compare, gpu};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_cuda::cudarc::driver::sys;
use ssm_cuda::testing::{DeviceSsuArgs, MirrorError, run_ssu_mirrored};
use ssm_cuda::{CudaError, DeviceErrors};
use ssm_ssu::StochasticRounding;
use ssm_ssu::reference::Reference;
use ssm_tensor::{DType, Run};

fn run_reference(case: &mut Case) {
    let args = case.args();
    Reference.run(ssm_tensor::Planned::new(args).expect("host plan")).expect("reference");
}

/// The random matrix of the CPU property tests: every route, both parameter forms, every
/// state/io dtype pair, groups, odd sizes, pads (−1 and 0), empty varlen sequences, i32/i64
/// tables, unaligned state rows.
fn matrix() -> Vec<CaseSpec> {
    use DType::{BF16, F16, F32, I32, I64};
    let mut v = Vec::new();
    let floats = [F32, F16, BF16];
    let mut k = 0usize;
    for state in floats {
        for io in floats {
            for layout in [Layout::OneToken, Layout::Varlen, Layout::Dense(3)] {
                for spec in [false, true] {
                    k += 1;
                    let tied = !k.is_multiple_of(3);
                    let odd = k.is_multiple_of(4);
                    v.push(CaseSpec {
                        layout,
                        spec,
                        tied,
                        state,
                        io,
                        index: if k.is_multiple_of(2) { I64 } else { I32 },
                        seqs: [1, 3, 5, 7][k % 4],
                        heads: if odd { 3 } else { 4 },
                        groups: if odd { 1 } else { 2 },
                        dim: if odd { 5 } else { 16 },
                        dstate: if odd { 7 } else { [16, 32, 128][k % 3] },
                        pad: [Some(-1), Some(0), None][k % 3],
                        tables: spec || k % 5 != 1,
                        with_z: k % 2 == 1,
                        with_d: k % 7 != 3,
                        with_dt_bias: k % 5 != 2,
                        softplus: k % 6 != 5,
                        slot_pad: if k % 8 == 3 { 1 } else { 0 },
                        sr: None,
                        zero_a: false,
                    });
                }
            }
        }
    }
    v
}

#[test]
fn cuda_matches_the_reference_on_random_cases() {
    let Some(be) = gpu("cuda_matches_the_reference_on_random_cases") else { return };
    for (i, spec) in matrix().into_iter().enumerate() {
        let mut want = Case::random(spec, 1000 + i as u64);
        let mut got = want.clone();
        let initial = want.state.clone();
        run_reference(&mut want);
        run_ssu_mirrored(&be, got.args()).unwrap_or_else(|e| panic!("case {i} {spec:?}: {e}"));
        compare("out", &got.out, &want.out).unwrap_or_else(|e| panic!("case {i} {spec:?}: {e}"));
        compare("state", &got.state, &want.state).unwrap_or_else(|e| panic!("case {i} {spec:?}: {e}"));
        // Slots no table names stay bit-identical.
        let slot_len = got.state.strides[0] as usize;
        for slot in 0..got.state.shape[0] {
            if got.spec.tables && got.named_slots.contains(&slot) || !got.spec.tables && slot < got.spec.seqs {
                continue;
            }
            for e in slot * slot_len..((slot + 1) * slot_len).min(got.state.len()) {
                assert_eq!(got.state.bits(e), initial.bits(e), "case {i}: untouched slot {slot} changed");
            }
        }
    }
}

#[test]
fn mamba2_shapes_match_the_reference() {
    let Some(be) = gpu("mamba2_shapes_match_the_reference") else { return };
    for (i, (state, layout, spec)) in [
        (DType::F32, Layout::OneToken, false),
        (DType::BF16, Layout::OneToken, false),
        (DType::F16, Layout::OneToken, false),
        (DType::F32, Layout::Dense(4), true),
        (DType::BF16, Layout::Varlen, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = CaseSpec::mamba2(9, state);
        s.layout = layout;
        s.spec = spec;
        let mut want = Case::random(s, 77 + i as u64);
        let mut got = want.clone();
        run_reference(&mut want);
        run_ssu_mirrored(&be, got.args()).unwrap();
        compare("out", &got.out, &want.out).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        compare("state", &got.state, &want.state).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    }
}

#[test]
fn stochastic_rounding_is_bit_identical_to_the_cpu_reference() {
    let Some(be) = gpu("stochastic_rounding_is_bit_identical_to_the_cpu_reference") else { return };
    // A = 0 makes dA = 1 exactly, so the f32 state is the same on both sides and every bit
    // of the rounded fp16 state must agree; the stored values must differ from plain
    // round-to-nearest somewhere (the bits are really used).
    for (i, (layout, dstate, seed)) in
        [(Layout::OneToken, 128, 42u64), (Layout::Varlen, 16, 0xdead_beef_1234), (Layout::OneToken, 7, 7)]
            .into_iter()
            .enumerate()
    {
        let mut s = CaseSpec::mamba2(6, DType::F16);
        s.layout = layout;
        s.dstate = dstate;
        s.io = DType::F32;
        s.softplus = false;
        s.zero_a = true;
        s.slot_pad = usize::from(dstate == 7);
        s.sr = Some(StochasticRounding { seed, philox_rounds: if i == 1 { 7 } else { 0 } });
        let mut want = Case::random(s, 500 + i as u64);
        let mut got = want.clone();
        let mut rne = want.clone();
        rne.spec.sr = None;
        run_reference(&mut want);
        run_reference(&mut rne);
        run_ssu_mirrored(&be, got.args()).unwrap();
        let mut differs_from_rne = 0;
        for e in 0..want.state.len() {
            assert_eq!(got.state.bits(e), want.state.bits(e), "case {i}: state element {e}");
            differs_from_rne += usize::from(want.state.bits(e) != rne.state.bits(e));
        }
        assert!(differs_from_rne > 0, "case {i}: stochastic rounding never differed from round-to-nearest");
        compare("out", &got.out, &want.out).unwrap();
    }
}

/// Garbage slot tables (random i64, negatives, huge, the pad, valid slots): no crash, the
/// error word is set, rows with invalid entries write nothing, and no slot outside the
/// in-range table values changes.
#[test]
fn garbage_indices_never_escape_their_tensors() {
    let Some(be) = gpu("garbage_indices_never_escape_their_tensors") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    for round in 0..6 {
        let mut s = CaseSpec::mamba2(16, [DType::F32, DType::BF16][round % 2]);
        s.index = DType::I64;
        s.heads = 4;
        s.groups = 1;
        s.pad = Some(-1);
        s.spec = round >= 4;
        s.layout = if round == 3 { Layout::Varlen } else { Layout::OneToken };
        let mut case = Case::random(s, 900 + round as u64);
        let slots = case.state.shape[0] as i64;
        let garbage = |rng: &mut ChaCha8Rng| -> i64 {
            match rng.random_range(0..7) {
                0 => rng.random::<i64>(),
                1 => -rng.random_range(2..1_000_000i64),
                2 => slots + rng.random_range(0..1000i64),
                3 => i64::MIN,
                4 => i64::MAX,
                5 => -1,
                _ => rng.random_range(0..slots),
            }
        };
        for t in [&mut case.sbi, &mut case.dst].into_iter().flatten() {
            for i in 0..t.len() {
                if rng.random_range(0..3) == 0 {
                    t.set_i(i, garbage(&mut rng));
                }
            }
        }
        if let Some(n) = &mut case.nacc {
            for i in 0..n.len() {
                if rng.random_range(0..3) == 0 {
                    n.set_i(i, garbage(&mut rng));
                }
            }
        }
        if let Some(cu) = &mut case.cu {
            let i = rng.random_range(1..cu.len());
            cu.set_i(i, garbage(&mut rng));
        }
        let initial = case.state.clone();
        let result = run_ssu_mirrored(&be, case.args());
        match result {
            Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => assert_ne!(w, 0),
            Ok(()) => {}
            Err(e) => panic!("round {round}: unexpected error {e}"),
        }
        // Slots that no in-range table entry names are bit-identical.
        let mut named = std::collections::HashSet::new();
        for t in [&case.sbi, &case.dst].into_iter().flatten() {
            for i in 0..t.len() {
                let v = t.get(i) as i64;
                if (0..slots).contains(&v) {
                    named.insert(v as usize);
                }
            }
        }
        let slot_len = case.state.strides[0] as usize;
        for slot in 0..slots as usize {
            if named.contains(&slot) {
                continue;
            }
            for e in slot * slot_len..(slot + 1) * slot_len {
                assert_eq!(case.state.bits(e), initial.bits(e), "round {round}: slot {slot} changed");
            }
        }
        // One-token, non-speculative: a row's out is written iff its entries are valid.
        if s.layout == Layout::OneToken && !s.spec {
            let (sbi, dst) = (case.sbi.as_ref().unwrap(), case.dst.as_ref().unwrap());
            let row = s.heads * s.dim;
            let mut flagged = false;
            for b in 0..s.seqs {
                let (src, d) = (sbi.get(b) as i64, dst.get(b) as i64);
                let ok = |v: i64| v == -1 || (0..slots).contains(&v);
                let valid = src == -1 || (ok(src) && ok(d));
                flagged |= !valid;
                for e in b * row..(b + 1) * row {
                    assert_eq!(!case.out.get(e).is_nan(), valid, "round {round}: seq {b} (src {src}, dst {d})");
                }
            }
            assert!(flagged, "round {round}: the garbage left every row valid; the test proves nothing");
        }
    }
}

/// A decode step captured in a CUDA graph and replayed 100 times equals 100 eager calls.
#[test]
fn graph_replay_equals_eager_execution() {
    let Some(be) = gpu("graph_replay_equals_eager_execution") else { return };
    let mut case = Case::random(CaseSpec::mamba2(32, DType::F32), 4242);
    let mut eager = DeviceSsuArgs::upload(&be, &case.args()).unwrap();
    let mut graphed = DeviceSsuArgs::upload(&be, &case.args()).unwrap();
    be.prewarm_ssu(ssm_ssu::plan(eager.args().unwrap()).unwrap().plan()).unwrap();
    for _ in 0..100 {
        be.run(ssm_ssu::plan(eager.args().unwrap()).unwrap()).unwrap();
    }
    be.synchronize().unwrap();
    let stream = be.stream().clone();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    be.run(ssm_ssu::plan(graphed.args().unwrap()).unwrap()).unwrap();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    for _ in 0..100 {
        graph.launch().unwrap();
    }
    be.synchronize().unwrap();
    be.check().unwrap();
    assert_eq!(eager.state_buffer().download().unwrap(), graphed.state_buffer().download().unwrap(), "state");
    assert_eq!(eager.out_buffer().download().unwrap(), graphed.out_buffer().download().unwrap(), "out");
}

/// With `out` given, a call allocates no device memory (free memory is unchanged over many
/// calls, after the kernel was loaded).
#[test]
fn calls_allocate_no_device_memory() {
    let Some(be) = gpu("calls_allocate_no_device_memory") else { return };
    let mut case = Case::random(CaseSpec::mamba2(64, DType::BF16), 31);
    let mut dev = DeviceSsuArgs::upload(&be, &case.args()).unwrap();
    be.run(ssm_ssu::plan(dev.args().unwrap()).unwrap()).unwrap();
    be.synchronize().unwrap();
    let (free_before, _) = be.mem_info().unwrap();
    for _ in 0..200 {
        let args = dev.args().unwrap();
        be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
    }
    be.synchronize().unwrap();
    let (free_after, _) = be.mem_info().unwrap();
    assert_eq!(free_before, free_after, "device memory changed over 200 calls");
    be.check().unwrap();
}

#[test]
fn host_tensors_are_refused() {
    let Some(be) = gpu("host_tensors_are_refused") else { return };
    let mut case = Case::random(CaseSpec::mamba2(2, DType::F32), 1);
    let args = case.args();
    let err = be.run(ssm_ssu::plan(args).unwrap()).unwrap_err();
    assert!(matches!(err, CudaError::WrongDevice { .. }), "{err}");
}
