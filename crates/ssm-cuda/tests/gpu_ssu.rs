//! GPU tests of the CUDA selective state update. Each skips with a printed reason when no GPU
//! (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` (set by `cargo xtask test-gpu` and the GPU
//! bundle's run.sh) turns the skip into a failure.

mod common;

use common::{compare, compare_within, gpu, tolerance};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::base_seed;
use ssm_conformance::cases::ssu::{Case, Spec, Tokens};
use ssm_cuda::testing::{DeviceSsuArgs, MirrorError, StageArgs, run_staged};
use ssm_cuda::{CudaError, DeviceErrors};
use ssm_ssu::reference::Reference;
use ssm_ssu::{SsuAlgorithm, SsuError, StochasticRounding};
use ssm_tensor::{DType, HostTensor, Run};

fn run_reference(case: &mut Case) {
    let args = case.args();
    Reference.run(ssm_tensor::Planned::new(args).expect("host plan")).expect("reference");
}

/// Elements of `got` and `want` must have the same bits.
fn assert_bit_identical(what: &str, got: &HostTensor, want: &HostTensor) {
    let size = want.dtype.size();
    for (e, (g, w)) in got.bytes().chunks(size).zip(want.bytes().chunks(size)).enumerate() {
        assert_eq!(g, w, "{what}: element {e}");
    }
}

/// The largest finite value of `t` (0 if none).
fn max_finite(t: &HostTensor) -> f64 {
    t.to_f64_vec().into_iter().filter(|v| v.is_finite()).fold(0.0, f64::max)
}

/// The state pool against the reference's: a float state within its dtype's tolerance; an
/// integer (i16 / i8) state dequantized, within f32's tolerance plus two quantization steps of
/// its coarsest row (the rounding of an element follows the f32 state across a step boundary).
fn compare_state(got: &Case, want: &Case) -> Result<(), String> {
    match &want.state_scale {
        None => compare("state", &got.state.memory, &want.state.memory),
        Some(scale) => {
            let (atol, rtol) = tolerance(DType::F32);
            let step = max_finite(&scale.memory);
            compare_within("state", &got.state_values(), &want.state_values(), atol + 2.0 * step, rtol)
        }
    }
}

/// The intermediate buffer against the reference's, as [`compare_state`] compares the pool.
fn compare_buffer(got: &Case, want: &Case) -> Result<(), String> {
    let (Some(g), Some(w)) = (got.buffer_values(), want.buffer_values()) else { return Ok(()) };
    match &want.intermediate_state_scales {
        None => compare("intermediate_states_buffer", &g, &w),
        Some(scales) => {
            let (atol, rtol) = tolerance(DType::F32);
            compare_within("intermediate_states_buffer", &g, &w, atol + 2.0 * max_finite(scales), rtol)
        }
    }
}

/// The random matrix of the CPU property tests (the one generator, `Spec::draw`): every route,
/// both parameter forms, every state/io dtype pair, groups, odd sizes, pads (−1, 0, none),
/// empty varlen sequences, i32/i64 tables, unaligned state rows, fp16 stochastic rounding.
/// Aliasing tables, which a host plan refuses, are a race on the device (its plan cannot read
/// the tables), so those cases check the refusal and are not run.
#[test]
fn cuda_matches_the_reference_on_random_cases() {
    let Some(be) = gpu("cuda_matches_the_reference_on_random_cases") else { return };
    let base = base_seed(Some(1000));
    // 108 cases: every state/io pair meets every route twice.
    let (mut buffered, mut quantized) = (0, 0);
    for i in 0..108usize {
        let seed = base.wrapping_add(i as u64);
        let spec = Spec::draw(&mut ChaCha8Rng::seed_from_u64(seed), i);
        let initial = Case::build(spec.clone(), seed);
        let (mut want, mut got) = (initial.clone(), initial.clone());
        let ctx = format!("seed {seed}, case {i}: {spec:?}");
        match ssm_ssu::plan(want.args()) {
            Ok(call) => Reference.run(call).unwrap_or_else(|e| panic!("{ctx}: reference: {e}")),
            Err(SsuError::SlotConflict { .. }) if spec.alias => continue,
            Err(e) => panic!("{ctx}: host plan: {e}"),
        }
        run_staged::<DeviceSsuArgs>(&be, got.args()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        compare("out", &got.out, &want.out).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        compare_state(&got, &want).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        compare_buffer(&got, &want).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        if let Some(w) = want.buffer_values() {
            buffered += usize::from(w.to_f64_vec().iter().any(|v| !v.is_nan()));
        }
        quantized += usize::from(ssm_ssu::quant::limit(spec.state).is_some());
        if spec.verify.is_some() {
            assert!(got.state == initial.state, "{ctx}: a verifying call wrote the state");
            assert!(got.state_scale == initial.state_scale, "{ctx}: a verifying call wrote the scales");
        }
        // Slots no table names stay bit-identical.
        for (slot, named) in initial.named_slots().into_iter().enumerate() {
            if !named {
                assert!(got.slot_bytes(slot) == initial.slot_bytes(slot), "{ctx}: untouched slot {slot} changed");
            }
        }
    }
    assert!(buffered >= 5, "only {buffered} of 108 cases wrote intermediate-buffer rows");
    assert!(quantized >= 6, "only {quantized} of 108 cases had an integer state");
}

/// Every `ssu_algorithm` tiling (`simple`, `vertical`, `horizontal`, and `auto` back again)
/// computes what the reference does: the Mamba2 shapes of every state dtype and route, and 36
/// cases of the random matrix each. `horizontal` refuses an integer state by name, before any
/// launch, so the refused call leaves the state and the output as they were.
#[test]
fn every_ssu_algorithm_matches_the_reference() {
    let Some(be) = gpu("every_ssu_algorithm_matches_the_reference") else { return };
    let base = base_seed(Some(3000));
    for algorithm in [SsuAlgorithm::Vertical, SsuAlgorithm::Horizontal, SsuAlgorithm::Simple, SsuAlgorithm::Auto] {
        be.set_ssu_algorithm(algorithm);
        assert_eq!(be.ssu_algorithm(), algorithm);
        let refused =
            |spec: &Spec| algorithm == SsuAlgorithm::Horizontal && ssm_ssu::quant::limit(spec.state).is_some();
        let mut ran = 0;
        let specs = mamba2_specs().into_iter().map(|s| (s, 77u64)).chain((0..36usize).map(|i| {
            let seed = base.wrapping_add(i as u64);
            (Spec::draw(&mut ChaCha8Rng::seed_from_u64(seed), i), seed)
        }));
        for (spec, seed) in specs {
            let initial = Case::build(spec.clone(), seed);
            let (mut want, mut got) = (initial.clone(), initial.clone());
            let ctx = format!("{}: seed {seed}: {spec:?}", algorithm.name());
            match ssm_ssu::plan(want.args()) {
                Ok(call) => Reference.run(call).unwrap_or_else(|e| panic!("{ctx}: reference: {e}")),
                Err(SsuError::SlotConflict { .. }) if spec.alias => continue,
                Err(e) => panic!("{ctx}: host plan: {e}"),
            }
            let result = run_staged::<DeviceSsuArgs>(&be, got.args());
            if refused(&spec) {
                match result {
                    Err(MirrorError::Cuda(CudaError::Unsupported(what))) => {
                        assert!(what.contains("`horizontal`"), "{what}")
                    }
                    other => panic!("{ctx}: expected the refusal, got {other:?}"),
                }
                assert!(got.state == initial.state && got.out == initial.out, "{ctx}: a refused call wrote");
                continue;
            }
            result.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            compare("out", &got.out, &want.out).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            compare_state(&got, &want).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            compare_buffer(&got, &want).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            for (slot, named) in initial.named_slots().into_iter().enumerate() {
                if !named {
                    assert!(got.slot_bytes(slot) == initial.slot_bytes(slot), "{ctx}: untouched slot {slot} changed");
                }
            }
            ran += 1;
        }
        assert!(ran >= 30, "{}: only {ran} cases ran", algorithm.name());
    }
    be.set_ssu_algorithm(SsuAlgorithm::Auto);
}

/// The Mamba2 shapes of [`mamba2_shapes_match_the_reference`]: every state dtype one token,
/// dense and varlen routes, speculative and not.
fn mamba2_specs() -> Vec<Spec> {
    let one_token = Tokens::OneToken { seqs: 9 };
    let varlen = || Tokens::Varlen { lens: vec![3, 0, 4, 1, 2, 4, 0, 1, 3] };
    [
        (DType::F32, one_token.clone(), None),
        (DType::BF16, one_token.clone(), None),
        (DType::F16, one_token.clone(), None),
        (DType::I16, one_token.clone(), None),
        (DType::I8, one_token, None),
        (DType::F32, Tokens::Dense { seqs: 9, steps: 4 }, Some(4)),
        (DType::BF16, varlen(), Some(4)),
        (DType::I16, varlen(), Some(4)),
        (DType::I16, Tokens::Dense { seqs: 9, steps: 3 }, None),
        (DType::I8, Tokens::Dense { seqs: 9, steps: 4 }, Some(4)),
        (DType::I8, varlen(), None),
    ]
    .into_iter()
    .map(|(state, tokens, spec_width)| {
        let mut s = Spec::mamba2(9, state);
        s.tokens = tokens;
        s.spec_width = spec_width;
        s
    })
    .collect()
}

#[test]
fn mamba2_shapes_match_the_reference() {
    let Some(be) = gpu("mamba2_shapes_match_the_reference") else { return };
    for (i, s) in mamba2_specs().into_iter().enumerate() {
        let mut want = Case::build(s.clone(), 77 + i as u64);
        let mut got = want.clone();
        run_reference(&mut want);
        run_staged::<DeviceSsuArgs>(&be, got.args()).unwrap();
        compare("out", &got.out, &want.out).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        compare_state(&got, &want).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    }
}

/// Integer-state rows whose new values hold NaN or infinities take the kernels' clamped path,
/// as `ssm_ssu::quant` defines it (NaN → −LIMIT, the maximum ignores NaN; an infinite maximum
/// gives encode 0), and a huge finite row the unclamped one: `x` NaN, ±∞ and 1e30 in four rows
/// of ordinary cases; the non-finite rows' integers and decode scales bit-identical to the
/// reference's, everything else within the usual tolerance. Decode (the tile in storage form) and a dense
/// two-token call (the f32 tile), for i16 and i8.
#[test]
fn integer_rows_with_nan_and_infinity_quantize_as_the_reference() {
    let Some(be) = gpu("integer_rows_with_nan_and_infinity_quantize_as_the_reference") else { return };
    let poked =
        [(0usize, 1usize, 3usize, f32::NAN), (1, 0, 0, f32::INFINITY), (2, 7, 63, f32::NEG_INFINITY), (3, 2, 10, 1e30)];
    for (k, state) in [DType::I16, DType::I8].into_iter().enumerate() {
        for (steps, tokens) in [(1, Tokens::OneToken { seqs: 4 }), (2, Tokens::Dense { seqs: 4, steps: 2 })] {
            let mut s = Spec::mamba2(4, state);
            s.tokens = tokens;
            s.tables = false;
            s.pad_rows = false;
            s.io = DType::F32;
            let mut want = Case::build(s.clone(), 900 + k as u64);
            let (h, p, n) = (s.heads, s.dim, s.dstate);
            for &(b, hh, pp, v) in &poked {
                // Token 0 of sequence b: slot b (no tables) gets the row.
                want.x.view_mut().set_f32(((b * steps) * h + hh) * p + pp, v);
            }
            let mut got = want.clone();
            run_reference(&mut want);
            run_staged::<DeviceSsuArgs>(&be, got.args()).unwrap();
            let ctx = format!("{state} steps {steps}");
            compare("out", &got.out, &want.out).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            compare_state(&got, &want).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let (slot_len, size) = (want.state.strides[0] as usize, state.size());
            let (gs, ws) = (got.state_scale.as_ref().unwrap(), want.state_scale.as_ref().unwrap());
            let scale_slot = ws.strides[0] as usize;
            // The non-finite rows are determined exactly; the 1e30 row's f32 values may differ
            // by an ulp of evaluation order (compared within tolerance above).
            for &(b, hh, pp, v) in poked.iter().filter(|r| !r.3.is_finite()) {
                let at = (b * slot_len + (hh * p + pp) * n) * size;
                let row = at..at + n * size;
                assert!(
                    got.state.memory.bytes()[row.clone()] == want.state.memory.bytes()[row],
                    "{ctx}: x = {v}: integers"
                );
                let sc = (b * scale_slot + hh * p + pp) * 4..(b * scale_slot + hh * p + pp) * 4 + 4;
                assert!(gs.memory.bytes()[sc.clone()] == ws.memory.bytes()[sc], "{ctx}: x = {v}: decode scale");
            }
        }
    }
}

#[test]
fn stochastic_rounding_is_bit_identical_to_the_cpu_reference() {
    let Some(be) = gpu("stochastic_rounding_is_bit_identical_to_the_cpu_reference") else { return };
    // A = 0 makes dA = 1 exactly, so the f32 state is the same on both sides and every bit
    // of the rounded fp16 state must agree; the stored values must differ from plain
    // round-to-nearest somewhere (the bits are really used).
    let one_token = Tokens::OneToken { seqs: 6 };
    for (i, (tokens, dstate, seed)) in [
        (one_token.clone(), 128, 42u64),
        (Tokens::Varlen { lens: vec![2, 0, 3, 1, 3, 2] }, 16, 0xdead_beef_1234),
        (one_token, 7, 7),
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = Spec::mamba2(6, DType::F16);
        s.tokens = tokens;
        s.dstate = dstate;
        s.io = DType::F32;
        s.softplus = false;
        s.zero_a = true;
        s.slot_pad = usize::from(dstate == 7);
        s.sr = Some(StochasticRounding { seed, philox_rounds: if i == 1 { 7 } else { 0 } });
        let mut want = Case::build(s, 500 + i as u64);
        let mut got = want.clone();
        let mut rne = want.clone();
        rne.spec.sr = None;
        run_reference(&mut want);
        run_reference(&mut rne);
        run_staged::<DeviceSsuArgs>(&be, got.args()).unwrap();
        assert_bit_identical(&format!("case {i}: state"), &got.state.memory, &want.state.memory);
        assert!(
            want.state.memory != rne.state.memory,
            "case {i}: stochastic rounding never differed from round-to-nearest"
        );
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
        let mut s = Spec::mamba2(16, [DType::F32, DType::BF16, DType::I16, DType::I8][round % 4]);
        s.index = DType::I64;
        s.heads = 4;
        s.groups = 1;
        s.pad = Some(-1);
        s.spec_width = (round >= 4).then_some(4);
        if round == 3 {
            s.tokens = Tokens::Varlen { lens: (0..16).map(|b| b % 4).collect() };
        }
        let mut case = Case::build(s.clone(), 900 + round as u64);
        let slots = case.slots() as i64;
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
        let tables = [&mut case.state_batch_indices, &mut case.dst_state_batch_indices, &mut case.num_accepted_tokens];
        for t in tables.into_iter().flatten() {
            let mut view = t.view_mut();
            for i in 0..view.numel() {
                if rng.random_range(0..3) == 0 {
                    view.set_i64(i, garbage(&mut rng));
                }
            }
        }
        if let Some(cu) = &mut case.cu_seqlens {
            let mut view = cu.view_mut();
            let i = rng.random_range(1..view.numel());
            view.set_i64(i, garbage(&mut rng));
        }
        let initial = case.clone();
        let result = run_staged::<DeviceSsuArgs>(&be, case.args());
        match result {
            Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => assert_ne!(w, 0),
            Ok(()) => {}
            Err(e) => panic!("round {round}: unexpected error {e}"),
        }
        // Slots that no in-range table entry names are bit-identical.
        for (slot, named) in initial.named_slots().into_iter().enumerate() {
            if !named {
                assert!(case.slot_bytes(slot) == initial.slot_bytes(slot), "round {round}: slot {slot} changed");
            }
        }
        // One-token, non-speculative: a row's out is written iff its entries are valid.
        if s.tokens == (Tokens::OneToken { seqs: 16 }) && s.spec_width.is_none() {
            let sbi = case.state_batch_indices.as_ref().unwrap().view();
            let dst = case.dst_state_batch_indices.as_ref().unwrap().view();
            let out = case.out.to_f64_vec();
            let row = s.heads * s.dim;
            let mut flagged = false;
            for b in 0..16 {
                let (src, d) = (sbi.elem_i64(b), dst.elem_i64(b));
                let ok = |v: i64| v == -1 || (0..slots).contains(&v);
                let valid = src == -1 || (ok(src) && ok(d));
                flagged |= !valid;
                for e in b * row..(b + 1) * row {
                    assert_eq!(!out[e].is_nan(), valid, "round {round}: seq {b} (src {src}, dst {d})");
                }
            }
            assert!(flagged, "round {round}: the garbage left every row valid; the test proves nothing");
        }
    }
}

/// `rand_seed` on the device: one call captured in a CUDA graph, replayed with a new key written
/// into the tensor before each replay, equals the reference run with those keys in turn (bit
/// for bit: `A = 0` keeps the f32 state exact, so every stochastically rounded bit must agree),
/// and the keys really differ in what they store.
#[test]
fn rand_seed_is_read_on_each_graph_replay() {
    use ssm_cuda::cudarc::driver::sys;
    let Some(be) = gpu("rand_seed_is_read_on_each_graph_replay") else { return };
    let mut s = Spec::mamba2(6, DType::F16);
    s.io = DType::F32;
    s.softplus = false;
    s.zero_a = true;
    s.sr = Some(StochasticRounding { seed: 5, philox_rounds: 0 });
    s.rand_seed = true;
    s.pad_rows = false;
    let mut host = Case::build(s, 620);
    let mut staged = DeviceSsuArgs::upload(&be, &host.args()).unwrap();
    be.prewarm_ssu(ssm_ssu::plan(host.args()).unwrap().plan()).unwrap();
    let stream = be.stream().clone();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    DeviceSsuArgs::launch(&be, staged.args().unwrap()).unwrap();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    let mut states = Vec::new();
    for key in [11u64, 0xfeed_beef_0000_0001, 11 ^ (1 << 40)] {
        staged.seed_buffer().unwrap().upload(&(key as i64).to_le_bytes()).unwrap();
        graph.launch().unwrap();
        be.synchronize().unwrap();
        be.check().unwrap();
        host.rand_seed = Some(HostTensor::from_i64(DType::I64, vec![1], &[key as i64]));
        run_reference(&mut host);
        let got = HostTensor::from_bytes(
            host.spec.state,
            host.state.memory.shape.clone(),
            &staged.state_buffer().download().unwrap(),
        );
        assert_bit_identical(&format!("key {key:#x}: state"), &got, &host.state.memory);
        states.push(got);
    }
    // The same start state rounded under two keys differs somewhere (checked on the second and
    // third replay's inputs: the state differs from what the first key's rounding would give).
    let mut again = Case::build(host.spec.clone(), 620);
    again.rand_seed = Some(HostTensor::from_i64(DType::I64, vec![1], &[11]));
    run_reference(&mut again);
    let mut other = Case::build(host.spec.clone(), 620);
    other.rand_seed = Some(HostTensor::from_i64(DType::I64, vec![1], &[0x77]));
    run_reference(&mut other);
    assert!(again.state != other.state, "two keys round alike; the test proves nothing");
    assert_bit_identical("first replay", &states[0], &again.state.memory);
}

/// Garbage `intermediate_state_indices` (and sequences longer than the buffer's steps): no
/// crash, the error word set, the pool untouched, and buffer rows written only for sequences
/// whose entry is valid (each such row equal to the reference's).
#[test]
fn garbage_buffer_entries_never_escape_the_buffer() {
    use ssm_conformance::cases::ssu::Verify;
    let Some(be) = gpu("garbage_buffer_entries_never_escape_the_buffer") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for round in 0..4 {
        let mut s = Spec::mamba2(16, [DType::F32, DType::BF16, DType::I16, DType::I8][round]);
        s.index = DType::I64;
        s.heads = 4;
        s.groups = 1;
        s.separate_dst = false;
        s.pad_rows = false;
        s.spec_width = (round >= 2).then_some(3);
        s.tokens = Tokens::Varlen { lens: (0..16).map(|b| b % 4).collect() };
        s.verify = Some(Verify::Buffer { indices: true, spare_steps: 0, no_update: round == 1 });
        let mut case = Case::build(s.clone(), 1900 + round as u64);
        let entries = case.intermediate_states_buffer.as_ref().unwrap().shape[0] as i64;
        // Sequences whose entry is the pad write no buffer row, so their length is never checked.
        let view = case.intermediate_state_indices.as_ref().unwrap().view();
        let mut pad_entry: Vec<bool> = (0..16).map(|b| view.elem_i64(b) == -1).collect();
        let mut bad = [false; 16];
        {
            let mut view = case.intermediate_state_indices.as_mut().unwrap().view_mut();
            for (b, bad_b) in bad.iter_mut().enumerate() {
                if rng.random_range(0..3) == 0 {
                    let v = match rng.random_range(0..5) {
                        0 => rng.random::<i64>(),
                        1 => -rng.random_range(2..1_000_000i64),
                        2 => entries + rng.random_range(0..1000i64),
                        3 => i64::MIN,
                        _ => i64::MAX,
                    };
                    view.set_i64(b, v);
                    *bad_b = true;
                    pad_entry[b] = false;
                }
            }
        }
        // The steps axis holds 3 tokens; sequences of 3 fit, so shorten the buffer to 2 steps
        // and every 3-token sequence is too long.
        let buf = case.intermediate_states_buffer.as_mut().unwrap();
        let mut shape = buf.shape.clone();
        shape[1] = 2;
        *buf = HostTensor::filled(buf.dtype, shape, f32::NAN);
        if let Some(scales) = case.intermediate_state_scales.as_mut() {
            let mut shape = scales.shape.clone();
            shape[1] = 2;
            *scales = HostTensor::filled(DType::F32, shape, f32::NAN);
        }
        let lens = s.tokens.lens();
        let mut want = case.clone();
        // The reference runs the valid sequences only: the same case with the invalid ones'
        // entries (and the too-long ones') replaced by the pad.
        {
            let mut view = want.intermediate_state_indices.as_mut().unwrap().view_mut();
            for b in 0..16 {
                if bad[b] || lens[b] > 2 {
                    view.set_i64(b, -1);
                }
            }
        }
        let skipped: Vec<bool> = (0..16).map(|b| bad[b] || (lens[b] > 2 && !pad_entry[b])).collect();
        assert!(skipped.iter().any(|&s| s), "round {round}: nothing invalid; the test proves nothing");
        let initial = case.clone();
        match run_staged::<DeviceSsuArgs>(&be, case.args()) {
            Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => assert_ne!(w, 0),
            other => panic!("round {round}: expected the error word, got {other:?}"),
        }
        run_reference(&mut want);
        assert!(case.state == initial.state, "round {round}: the pool was written");
        assert!(case.state_scale == initial.state_scale, "round {round}: the pool's scales were written");
        compare_buffer(&case, &want).unwrap_or_else(|e| panic!("round {round}: {e}"));
        // Out: the valid sequences' rows as the reference's (skipped ones stay NaN on the device).
        let (go, wo) = (case.out.to_f64_vec(), want.out.to_f64_vec());
        let row = s.heads * s.dim;
        let mut start = 0;
        for (b, &len) in lens.iter().enumerate() {
            for e in start * row..(start + len) * row {
                if skipped[b] {
                    assert!(go[e].is_nan(), "round {round}: skipped seq {b} wrote out");
                } else {
                    assert!((go[e] - wo[e]).abs() <= 3.2e-2 + 1.6e-2 * wo[e].abs(), "round {round}: seq {b} out");
                }
            }
            start += len;
        }
    }
}

/// A decode step captured in a CUDA graph and replayed 100 times equals 100 eager calls (an
/// integer state's scales included).
#[test]
fn graph_replay_equals_eager_execution() {
    let Some(be) = gpu("graph_replay_equals_eager_execution") else { return };
    for state in [DType::F32, DType::I16, DType::I8] {
        let mut case = Case::build(Spec::mamba2(32, state), 4242);
        common::assert_graph_replay_equals_eager::<DeviceSsuArgs>(
            &be,
            &case.args(),
            100,
            |a| be.prewarm_ssu(ssm_ssu::plan(a).unwrap().plan()).unwrap(),
            |d| {
                let mut written = vec![d.state_buffer().download().unwrap(), d.out_buffer().download().unwrap()];
                written.extend(d.scale_buffer().map(|b| b.download().unwrap()));
                written
            },
        );
    }
}

/// With `out` given, a call allocates no device memory (free memory is unchanged over many
/// calls, after the kernel was loaded).
#[test]
fn calls_allocate_no_device_memory() {
    let Some(be) = gpu("calls_allocate_no_device_memory") else { return };
    let mut case = Case::build(Spec::mamba2(64, DType::BF16), 31);
    common::assert_calls_allocate_no_device_memory::<DeviceSsuArgs>(&be, &case.args());
}

#[test]
fn host_tensors_are_refused() {
    let Some(be) = gpu("host_tensors_are_refused") else { return };
    let mut case = Case::build(Spec::mamba2(2, DType::F32), 1);
    let args = case.args();
    let err = be.run(ssm_ssu::plan(args).unwrap()).unwrap_err();
    assert!(matches!(err, CudaError::WrongDevice { .. }), "{err}");
}
