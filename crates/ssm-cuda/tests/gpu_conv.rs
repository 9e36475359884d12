//! GPU tests of the CUDA causal conv1d (`causal_conv1d_update`, `causal_conv1d_fn`). Each
//! skips with a printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns
//! the skip into a failure.
//!
//! Cases come from the one conv case generator, [`ssm_conformance::cases::conv`] (ssm-cpu's
//! property tests draw from it too): odd dims, widths 2–4, both state layouts, strided x, pads
//! 0 / −1 / none, empty sequences, the speculative rolling buffer, prefix-caching columns,
//! varlen prefill with and without initial states, bias and silu on and off, f32/f16/bf16.
//! The CUDA result is compared with the scalar reference over the tensors' whole memory
//! ([`assert_agrees`]): the state bit for bit (it is a copy of storage values), `out` within
//! the dtype's tolerance where written and still NaN where not, state outside the written
//! windows unchanged.

// The staging error is the test harness's (large) error enum, on a copy path, never a decode path.
#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::conv::{Case, MODES, Mode, assert_agrees};
use ssm_conv::ConvStateLayout;
use ssm_conv::reference::{Arithmetic, Reference};
use ssm_cuda::testing::{DeviceConvFnArgs, DeviceConvUpdateArgs, MirrorError, run_staged};
use ssm_cuda::{CudaBackend, CudaError, DeviceErrors};
use ssm_tensor::elem::{read_i64, write_i64};
use ssm_tensor::{DType, HostTensor, Run};

/// Number of elements of `t`.
fn count(t: &HostTensor) -> usize {
    t.bytes().len() / t.dtype.size()
}

fn set_i(t: &mut HostTensor, i: usize, v: i64) {
    let dtype = t.dtype;
    write_i64(t.bytes_mut(), dtype, i, v);
}

fn get_i(t: &HostTensor, i: usize) -> i64 {
    read_i64(t.bytes(), t.dtype, i)
}

/// Runs `case` on the CUDA backend through host↔device staging (the plan sees device tables,
/// so index values are checked by the kernel).
fn run_cuda(case: &mut Case, be: &CudaBackend) -> Result<(), MirrorError> {
    if case.mode == Mode::Prefill {
        run_staged::<DeviceConvFnArgs>(be, case.fn_args())
    } else {
        run_staged::<DeviceConvUpdateArgs>(be, case.update_args())
    }
}

/// The reference's and the CUDA backend's run of `initial`, checked with [`assert_agrees`].
fn check(ctx: &str, initial: &Case, be: &CudaBackend) {
    let (mut want, mut got) = (initial.clone(), initial.clone());
    want.run_on(&Reference { precision: Arithmetic::F32 }).expect("reference");
    run_cuda(&mut got, be).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_agrees(ctx, initial, &want, &got);
}

#[test]
fn conv_matches_the_reference_on_random_cases() {
    let Some(be) = gpu("conv_matches_the_reference_on_random_cases") else { return };
    for (k, dtype) in [DType::F32, DType::F16, DType::BF16].into_iter().enumerate() {
        for seed in 0..12u64 {
            for mode in MODES {
                let initial = Case::random(dtype, mode, 1000 * k as u64 + seed);
                let ctx = format!("{dtype} {mode:?} seed {seed} layout {:?} x {:?}", initial.layout, initial.x.shape);
                check(&ctx, &initial, &be);
            }
        }
    }
}

/// Qwen3-Next decode shapes (dim 8192, width 4, bf16), both layouts, vectorised paths.
#[test]
fn qwen3_next_decode_matches_the_reference() {
    let Some(be) = gpu("qwen3_next_decode_matches_the_reference") else { return };
    for (i, layout) in [ConvStateLayout::StateLenDim, ConvStateLayout::DimStateLen].into_iter().enumerate() {
        let initial = Case::decode(DType::BF16, 8192, 4, 16, layout, 40 + i as u64);
        check(&format!("{layout:?}"), &initial, &be);
    }
}

/// Garbage device tables (random i64, negatives, huge, the pad, valid values, accepted counts
/// 0..=width + 1, broken token starts, checkpoint offsets and slots): no crash, the error word is set when something was out
/// of range, and no slot outside the in-range table values changes.
#[test]
fn garbage_indices_never_escape_their_tensors() {
    let Some(be) = gpu("garbage_indices_never_escape_their_tensors") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let mut flagged = 0;
    for round in 0..30 {
        let mode = MODES[round % MODES.len()];
        let mut case = Case::random([DType::F32, DType::BF16][round % 2], mode, 5000 + round as u64);
        let slots = case.state.shape[0] as i64;
        let width = case.weight.shape[1] as i64;
        let garbage = |rng: &mut ChaCha8Rng, range: i64| -> i64 {
            match rng.random_range(0..7) {
                0 => rng.random::<i32>() as i64,
                1 => -rng.random_range(2..1_000_000i64),
                2 => range + rng.random_range(0..1000i64),
                3 => i32::MIN as i64,
                4 => i32::MAX as i64,
                5 => -1,
                _ => rng.random_range(0..range.max(1)),
            }
        };
        for i in 0..count(&case.indices) {
            if rng.random_range(0..3) == 0 {
                let v = garbage(&mut rng, slots);
                set_i(&mut case.indices, i, v);
            }
        }
        if let Some(a) = &mut case.num_accepted_tokens {
            for i in 0..count(a) {
                set_i(a, i, rng.random_range(0..=width + 1));
            }
        }
        for t in [&mut case.initial_state_idx, &mut case.block_idx_last_scheduled_token].into_iter().flatten() {
            for e in 0..count(t) {
                if rng.random_range(0..4) == 0 {
                    let v = garbage(&mut rng, 3);
                    set_i(t, e, v);
                }
            }
        }
        // Checkpoint offsets (0, inside, past the sequence, negative) and slots.
        if let Some(o) = &mut case.checkpoint_offsets {
            for i in 0..count(o) {
                if rng.random_range(0..3) == 0 {
                    let v = garbage(&mut rng, 80);
                    set_i(o, i, v);
                }
            }
        }
        if let Some(c) = &mut case.checkpoint_state_indices {
            for i in 0..count(c) {
                if rng.random_range(0..3) == 0 {
                    let v = garbage(&mut rng, slots);
                    set_i(c, i, v);
                }
            }
        }
        if let Some(s) = &mut case.query_start_loc
            && rng.random_bool(0.5)
        {
            let i = rng.random_range(0..count(s));
            let v = garbage(&mut rng, 100);
            set_i(s, i, v);
        }
        let initial = case.state.clone();
        match run_cuda(&mut case, &be) {
            Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
                assert_ne!(w, 0);
                flagged += 1;
            }
            Ok(()) => {}
            Err(e) => panic!("round {round} {mode:?}: unexpected error {e}"),
        }
        // Slots that no in-range table entry names are bit-identical.
        let ck = case.checkpoint_state_indices.as_ref();
        let named: std::collections::HashSet<i64> = (0..count(&case.indices))
            .map(|i| get_i(&case.indices, i))
            .chain(ck.into_iter().flat_map(|c| (0..count(c)).map(|i| get_i(c, i))))
            .filter(|v| (0..slots).contains(v))
            .collect();
        let slot_bytes = case.state.bytes().len() / slots as usize;
        for slot in 0..slots {
            if named.contains(&slot) {
                continue;
            }
            let r = slot as usize * slot_bytes..(slot as usize + 1) * slot_bytes;
            assert!(case.state.bytes()[r.clone()] == initial.bytes()[r], "round {round} {mode:?}: slot {slot} changed");
        }
    }
    assert!(flagged > 0, "the garbage never set the error word; the test proves nothing");
}

/// A decode step captured in a CUDA graph and replayed 50 times equals 50 eager calls.
#[test]
fn graph_replay_equals_eager_execution() {
    let Some(be) = gpu("graph_replay_equals_eager_execution") else { return };
    let mut case = Case::decode(DType::BF16, 2048, 4, 8, ConvStateLayout::StateLenDim, 4242);
    common::assert_graph_replay_equals_eager::<DeviceConvUpdateArgs>(
        &be,
        &case.update_args(),
        50,
        |a| be.prewarm_conv_update(&ssm_conv::plan(a).unwrap()).unwrap(),
        |d| vec![d.state_buffer().download().unwrap(), d.out_buffer().download().unwrap()],
    );
}

/// With `out` given, calls allocate no device memory (free memory is unchanged over many
/// calls, after the kernel was loaded).
#[test]
fn calls_allocate_no_device_memory() {
    let Some(be) = gpu("calls_allocate_no_device_memory") else { return };
    let mut case = Case::decode(DType::BF16, 8192, 4, 64, ConvStateLayout::StateLenDim, 31);
    common::assert_calls_allocate_no_device_memory::<DeviceConvUpdateArgs>(&be, &case.update_args());
}

#[test]
fn host_tensors_are_refused() {
    let Some(be) = gpu("host_tensors_are_refused") else { return };
    let mut case = Case::decode(DType::F32, 16, 3, 2, ConvStateLayout::StateLenDim, 1);
    let err = be.run(ssm_conv::plan(case.update_args()).unwrap()).unwrap_err();
    assert!(matches!(err, CudaError::WrongDevice { .. }), "{err}");
}
