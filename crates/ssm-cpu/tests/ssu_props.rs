//! Property tests: the CPU SSU against the kernel-faithful reference on fresh random inputs.
//!
//! Cases come from the one SSU case generator, [`ssm_conformance::cases::ssu`] (the GPU tests
//! draw from it too): every route, odd sizes, groups, tied and per-channel forms, pads, varlen
//! with empty sequences, speculative decoding with accepted counts 0..=width, unaligned state
//! rows, aliasing slot tables (which the plan must refuse) and every dtype combination. Every
//! run draws a new seed (printed; set `SSM_TEST_SEED` to replay one). Outputs are poisoned
//! with NaN: every element the reference writes must be written, no other; state slots the
//! reference leaves alone must stay bit-identical.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::{
    base_seed,
    ssu::{Case, Spec},
};
use ssm_cpu::{CpuBackend, Par};
use ssm_ssu::reference::Reference;
use ssm_ssu::{Run, SsuError};
use ssm_tensor::DType;

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-4,
        // A block-scaled i16 row: one step is 1/32767 of its largest magnitude.
        DType::I16 => 3e-4,
        // A block-scaled i8 row: one step is 1/127 of its largest magnitude.
        DType::I8 => 1e-2,
        DType::F16 => 4e-3,
        _ => 2e-2,
    }
}

/// Case `i` of the matrix, drawn from `seed`. Returns whether it wrote intermediate-buffer rows.
fn run_one(seed: u64, i: usize, backend: &CpuBackend) -> bool {
    let spec = Spec::draw(&mut ChaCha8Rng::seed_from_u64(seed), i);
    let initial = Case::build(spec.clone(), seed ^ 0x5eed);
    let (mut want, mut got) = (initial.clone(), initial.clone());
    let ctx = format!("seed {seed}, case {i}: {spec:?}");
    let want_call = match ssm_ssu::plan(want.args()) {
        Ok(call) => call,
        // Aliasing tables are refused (one rule for every family); a refused call writes nothing.
        Err(e @ SsuError::SlotConflict { .. }) if spec.alias => {
            assert_eq!(want.state, initial.state, "{ctx}: refused call wrote the state ({e})");
            assert!(want.out.to_f64_vec().iter().all(|v| v.is_nan()), "{ctx}: refused call wrote out ({e})");
            assert!(matches!(ssm_ssu::plan(got.args()), Err(SsuError::SlotConflict { .. })));
            return false;
        }
        Err(e) => panic!("{ctx}: plan failed: {e}"),
    };
    let got_call = ssm_ssu::plan(got.args()).unwrap();
    assert_eq!(want_call.plan(), got_call.plan());
    Reference.run(want_call).unwrap();
    backend.run(got_call).unwrap();

    let mut buffered = false;
    // Outputs (and the intermediate buffer): written exactly where the reference writes, and close.
    let t = tol(spec.io).max(if spec.state == DType::F32 { 0.0 } else { tol(spec.state) });
    let written_alike = |what: &str, w: Vec<f64>, g: Vec<f64>| {
        let scale = w.iter().filter(|v| v.is_finite()).fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (a, b)) in w.iter().zip(&g).enumerate() {
            assert_eq!(a.is_nan(), b.is_nan(), "{ctx}: {what}[{i}] written by one side only (ref {a}, cpu {b})");
            if !a.is_nan() && a != b {
                assert!((a - b).abs() <= t * (scale + a.abs()), "{ctx}: {what}[{i}] ref {a} cpu {b}");
            }
        }
    };
    written_alike("out", want.out.to_f64_vec(), got.out.to_f64_vec());
    if let (Some(w), Some(g)) = (want.buffer_values(), got.buffer_values()) {
        let w = w.to_f64_vec();
        buffered = w.iter().any(|v| !v.is_nan());
        written_alike("intermediate_states_buffer", w, g.to_f64_vec());
    }
    // State (an integer one dequantized): untouched slots bit-identical (scales included), updated
    // ones close.
    let (sw, sg) = (want.state_values().to_f64_vec(), got.state_values().to_f64_vec());
    let sscale = sw.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    // Stochastic rounding may pick the other neighbour when the f32 values differ in the last bits.
    let st = if spec.sr.is_some() { 2e-3 } else { tol(spec.state) };
    for slot in 0..initial.slots() {
        // A slot is untouched when the reference left every byte of it alone (a single element
        // can round back to its old value, a whole slot cannot).
        if want.slot_bytes(slot) == initial.slot_bytes(slot) {
            assert!(got.slot_bytes(slot) == initial.slot_bytes(slot), "{ctx}: slot {slot} must stay bit-identical");
            continue;
        }
        for i in initial.slot_elements(slot) {
            if sw[i] != sg[i] {
                assert!(
                    (sw[i] - sg[i]).abs() <= st * (sscale + sw[i].abs()),
                    "{ctx}: state[{i}] ref {} cpu {}",
                    sw[i],
                    sg[i]
                );
            }
        }
    }
    if spec.verify.is_some() {
        // Verification without commit never writes the pool (nor its scales).
        assert_eq!(got.state, initial.state, "{ctx}: a verifying call wrote the state");
        assert_eq!(got.state_scale, initial.state_scale, "{ctx}: a verifying call wrote the scales");
    }
    buffered
}

#[test]
fn cpu_matches_reference_on_random_cases() {
    let base = base_seed(None);
    let seq = CpuBackend::new(Par::Seq).unwrap();
    let par = CpuBackend::new(Par::Threads(2.try_into().unwrap())).unwrap();
    // 120 cases: every state/io pair meets every route at least twice.
    let (mut buffered, mut quantized) = (0, std::collections::BTreeSet::new());
    for i in 0..120usize {
        let seed = base.wrapping_add(i as u64);
        buffered += usize::from(run_one(seed, i, if i % 2 == 0 { &seq } else { &par }));
        let state = Spec::draw(&mut ChaCha8Rng::seed_from_u64(seed), i).state;
        if matches!(state, DType::I16 | DType::I8) {
            // (state, route): the route cycles with i / 9 (see `Spec::draw`).
            quantized.insert((state.name(), i / 9 % 6));
        }
    }
    assert!(buffered >= 5, "only {buffered} of 120 cases wrote intermediate-buffer rows");
    assert_eq!(quantized.len(), 12, "an integer state missed a route: {quantized:?}");
}

#[test]
fn portable_and_avx2_paths_agree_with_reference() {
    // The run-time choice is made once per process; this test checks whichever path this
    // CPU takes on fixed cases (the other path runs in CI on CPUs without AVX2 and
    // through `SSM_CPU_SIMD=portable`).
    let seq = CpuBackend::new(Par::Seq).unwrap();
    for seed in [1u64, 2, 3, 4, 5, 6, 7, 8] {
        run_one(seed, seed as usize * 7, &seq);
    }
}

/// FlashInfer's verification modes against vLLM's committing call on the same tensors and
/// backend: the intermediate buffer's row (source slot, token t) holds what the speculative
/// call stores to `dst[b, t]`, `out` is the same, and neither verifying call writes the pool —
/// on the reference and on the CPU backend.
#[test]
fn verification_modes_match_the_committing_call() {
    use ssm_conformance::cases::ssu::{Tokens, Verify};
    let cpu = CpuBackend::new(Par::Threads(2.try_into().unwrap())).unwrap();
    let on_reference = |c: &mut Case| Reference.run(ssm_ssu::plan(c.args()).unwrap()).unwrap();
    let on_cpu = |c: &mut Case| cpu.run(ssm_ssu::plan(c.args()).unwrap()).unwrap();
    for (name, run) in [("reference", &on_reference as &dyn Fn(&mut Case)), ("cpu", &on_cpu)] {
        for (seed, state) in [(71u64, DType::F32), (72, DType::BF16), (73, DType::I16), (75, DType::I8)] {
            let mut s = Spec::mamba2(6, state);
            s.tokens = Tokens::Dense { seqs: 6, steps: 3 };
            s.spec_width = Some(3);
            s.separate_dst = false;
            let mut committed = Case::build(s.clone(), seed);
            run(&mut committed);
            let dst = committed.dst_state_batch_indices.clone().expect("speculative calls store through a table");
            let (sv, nv) =
                (committed.state_batch_indices.clone().unwrap(), committed.num_accepted_tokens.clone().unwrap());
            for verify in [
                Verify::NoUpdate,
                Verify::Buffer { indices: false, spare_steps: 1, no_update: false },
                Verify::Buffer { indices: false, spare_steps: 0, no_update: true },
            ] {
                s.verify = Some(verify);
                let initial = Case::build(s.clone(), seed);
                assert!(initial.x == committed.x, "the same tensors");
                let mut case = initial.clone();
                run(&mut case);
                let ctx = format!("{name} {state} {verify:?}");
                assert!(case.out == committed.out, "{ctx}: out differs from the committing call");
                assert!(case.state == initial.state, "{ctx}: the pool was written");
                let Some(buf) = &case.intermediate_states_buffer else { continue };
                let (row, size, steps) = (s.heads * s.dim * s.dstate, state.size(), buf.shape[1]);
                let mut checked = 0;
                for b in 0..6 {
                    let col = ssm_ssu::start_column(nv.view().elem_i64(b));
                    let src = sv.view().elem_i64(b * 3 + col);
                    for t in 0..3 {
                        let d = dst.view().elem_i64(b * 3 + t);
                        if src == -1 || d == -1 {
                            continue;
                        }
                        let got = &buf.bytes()[(src as usize * steps + t) * row * size..][..row * size];
                        assert!(got == &committed.slot_bytes(d as usize)[..row * size], "{ctx}: seq {b} token {t}");
                        checked += 1;
                    }
                }
                assert!(checked > 6, "{ctx}: only {checked} rows compared");
            }
        }
    }
}

/// The per-channel (Mamba1) one-token decode, which has its own row loop, against the same call
/// made as a one-token speculative step (tables `[seqs, 1]`, one accepted token: the general row
/// loop): `out` and the pool bit for bit. Row counts with a tail of fewer than eight rows, pads,
/// z and D, every float state.
#[test]
fn per_channel_decode_matches_the_general_path() {
    use ssm_tensor::HostTensor;
    let cpu = CpuBackend::new(Par::Threads(2.try_into().unwrap())).unwrap();
    let cases = [
        (81u64, DType::F32, DType::F32, 45usize),
        (82, DType::BF16, DType::F32, 203),
        (83, DType::F16, DType::BF16, 64),
    ];
    for (seed, state, io, dim) in cases {
        let seqs = 5;
        let mut s = Spec::mamba2(seqs, state);
        (s.mamba1, s.tied, s.heads, s.groups, s.dim, s.dstate, s.z, s.io) = (true, false, 1, 1, dim, 16, true, io);
        let mut plain = Case::build(s, seed);
        let mut general = plain.clone();
        let column = |t: &HostTensor| HostTensor::from_bytes(t.dtype, vec![seqs, 1], t.bytes());
        let src = column(plain.state_batch_indices.as_ref().expect("tables"));
        general.dst_state_batch_indices = Some(plain.dst_state_batch_indices.as_ref().map_or(src.clone(), column));
        general.state_batch_indices = Some(src);
        general.num_accepted_tokens = Some(HostTensor::from_i64(DType::I32, vec![seqs], &[1; 5]));
        let initial = plain.state.clone();
        cpu.run(ssm_ssu::plan(plain.args()).unwrap()).unwrap();
        let call = ssm_ssu::plan(general.args()).unwrap();
        assert!(call.plan().spec, "the twin must be a speculative call");
        cpu.run(call).unwrap();
        let ctx = format!("{state} state, {io} io, dim {dim}");
        assert!(plain.state != initial, "{ctx}: nothing was written");
        assert!(plain.out.to_f64_vec().iter().any(|v| !v.is_nan()), "{ctx}: no output");
        assert!(plain.out.bytes() == general.out.bytes(), "{ctx}: out differs from the general path");
        assert!(plain.state == general.state, "{ctx}: the pool differs from the general path");
    }
}

/// `rand_seed` replaces the struct's key: a call whose `rand_seed` tensor holds `s` (and whose
/// `stochastic_rounding.seed` is a decoy) stores the bits of a call keyed `s` directly, and not
/// those of the decoy — on the reference and on the CPU backend.
#[test]
fn rand_seed_tensor_is_the_key() {
    use ssm_ssu::StochasticRounding;
    let cpu = CpuBackend::new(Par::Seq).unwrap();
    let mut s = Spec::mamba2(5, DType::F16);
    s.io = DType::F32;
    s.sr = Some(StochasticRounding { seed: 0x1234_5678_9abc_def0, philox_rounds: 0 });
    let direct = Case::build(s.clone(), 3);
    s.rand_seed = true;
    let keyed = Case::build(s.clone(), 3);
    assert!(keyed.rand_seed.is_some());
    let mut decoy = direct.clone();
    decoy.spec.sr = Some(StochasticRounding { seed: !0x1234_5678_9abc_def0, philox_rounds: 0 });
    type Runner<'a> = (&'static str, &'a dyn Fn(&mut Case));
    let runs: [Runner<'_>; 2] = [
        ("reference", &|c: &mut Case| Reference.run(ssm_ssu::plan(c.args()).unwrap()).unwrap()),
        ("cpu", &|c: &mut Case| cpu.run(ssm_ssu::plan(c.args()).unwrap()).unwrap()),
    ];
    for (name, run) in runs {
        let (mut want, mut got, mut other) = (direct.clone(), keyed.clone(), decoy.clone());
        run(&mut want);
        run(&mut got);
        run(&mut other);
        assert!(got.state == want.state, "{name}: rand_seed's key was not used");
        assert!(other.state != want.state, "{name}: the decoy key rounds alike; the test proves nothing");
    }
}

/// A block-scaled integer state over a long decode: 512 steps of a Mamba2 head on the CPU
/// backend, once with a `dtype` state (quantized at every step) and once with an f32 state, both
/// from the same (quantized) start and the same random inputs. Returns the largest output error
/// and final-state error, each relative to the largest f32 value (printed).
fn integer_state_against_f32(dtype: DType) -> (f64, f64) {
    use rand::Rng;
    use ssm_tensor::HostTensor;
    let cpu = CpuBackend::new(Par::Seq).unwrap();
    let (batch, heads, dim, dstate, steps) = (4usize, 2usize, 16usize, 32usize, 512usize);
    let rows = batch * heads * dim;
    let rng = &mut ChaCha8Rng::seed_from_u64(0x1616);
    let mut normal = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| (rng.random::<f32>() + rng.random::<f32>() + rng.random::<f32>() - 1.5) * 2.0 * scale).collect()
    };
    // The start: random rows quantized, the f32 twin holding exactly their values.
    let start = normal(rows * dstate, 0.5);
    let (mut ints, mut scale) = (Vec::with_capacity(rows * dstate), vec![0f32; rows]);
    for (r, sc) in scale.iter_mut().enumerate() {
        let (q, decode) = ssm_ssu::quant::quantize_row_as(dtype, &start[r * dstate..(r + 1) * dstate]);
        ints.extend(q);
        *sc = decode;
    }
    let shape = vec![batch, heads, dim, dstate];
    let mut q_state = HostTensor::from_i64(dtype, shape.clone(), &ints);
    let mut q_scale = HostTensor::from_f32(DType::F32, vec![batch, heads, dim], &scale);
    let dequant: Vec<f32> = (0..rows * dstate).map(|i| ints[i] as f32 * scale[i / dstate]).collect();
    let mut f32_state = HostTensor::from_f32(DType::F32, shape, &dequant);
    let a = HostTensor::from_f32(DType::F32, vec![heads, 1, 1], &[-0.8, -2.5]);
    let (mut out_err, mut out_max) = (0f64, 0f64);
    for _ in 0..steps {
        let x = HostTensor::from_f32(DType::F32, vec![batch, heads, dim], &normal(rows, 1.0));
        let dt = HostTensor::from_f32(DType::F32, vec![batch, heads, 1], &normal(batch * heads, 1.0));
        let b = HostTensor::from_f32(DType::F32, vec![batch, 1, dstate], &normal(batch * dstate, 1.0));
        let c = HostTensor::from_f32(DType::F32, vec![batch, 1, dstate], &normal(batch * dstate, 1.0));
        let mut outs = Vec::new();
        for quantized in [false, true] {
            let mut out = HostTensor::filled(DType::F32, vec![batch, heads, dim], f32::NAN);
            let args = ssm_ssu::SelectiveStateUpdateArgs {
                dt_softplus: true,
                state_scale: quantized.then(|| q_scale.view_mut()),
                ..ssm_ssu::SelectiveStateUpdateArgs::new(
                    if quantized { q_state.view_mut() } else { f32_state.view_mut() },
                    x.view(),
                    dt.view().expand(&[batch, heads, dim]).unwrap(),
                    a.view().expand(&[heads, dim, dstate]).unwrap(),
                    b.view(),
                    c.view(),
                    out.view_mut(),
                )
            };
            cpu.run(ssm_ssu::plan(args).unwrap()).unwrap();
            outs.push(out.to_f64_vec());
        }
        for (w, g) in outs[0].iter().zip(&outs[1]) {
            out_err = out_err.max((w - g).abs());
            out_max = out_max.max(w.abs());
        }
    }
    let (sf, qs, sc) = (f32_state.to_f64_vec(), q_state.to_f64_vec(), q_scale.to_f64_vec());
    let state_max = sf.iter().fold(0f64, |m, v| m.max(v.abs()));
    let state_err = (0..sf.len()).map(|i| (qs[i] * sc[i / dstate] - sf[i]).abs()).fold(0f64, f64::max);
    eprintln!(
        "{dtype} vs f32 state over {steps} steps: out max |err| {out_err:.3e} (max |out| {out_max:.3}), \
         final state max |err| {state_err:.3e} (max |state| {state_max:.3})"
    );
    (out_err / out_max, state_err / state_max)
}

/// FlashInfer's int16 state over a long decode (`integer_state_against_f32`): outputs and final
/// states within 1e-4 of the largest f32 values (measured: 1.1e-5 and 1.5e-5): the per-step
/// rounding (half a step of 1/32767 of each row's maximum) decays with the state instead of
/// accumulating.
#[test]
fn int16_state_tracks_f32_over_a_long_decode() {
    let (out, state) = integer_state_against_f32(DType::I16);
    assert!(out <= 1e-4, "out drifted: {out:e} of the largest output");
    assert!(state <= 1e-4, "state drifted: {state:e} of the largest state");
}

/// The i8 state over the same long decode (`integer_state_against_f32`): outputs and final states
/// within 1e-2 of the largest f32 values (measured: 2.9e-3 and 3.9e-3, about half a step of
/// 1/127 of a row's maximum: the rounding decays with the state as for i16, 258 times coarser).
#[test]
fn int8_state_tracks_f32_over_a_long_decode() {
    let (out, state) = integer_state_against_f32(DType::I8);
    assert!(out <= 1e-2, "out drifted: {out:e} of the largest output");
    assert!(state <= 1e-2, "state drifted: {state:e} of the largest state");
}
