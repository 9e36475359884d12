//! Property tests: the CPU causal conv1d against the scalar reference on random calls.
//!
//! Cases come from the one conv case generator, [`ssm_conformance::cases::conv`] (the GPU tests
//! draw from it too): every mode (single, multi-token, varlen, the speculative rolling buffer
//! packed and 3-D, prefix caching, varlen prefill), odd dims, every width, both state layouts,
//! dim-major x, pads, empty sequences, i32/i64 tables, f32/f16/bf16. Each case runs on the
//! sequential and the two-thread backend. Outputs start as NaN: every element that must be written
//! is checked, every other one must keep its poison; the state is bit-identical to the
//! reference's, and every state element outside the written windows keeps its bits.

use std::num::NonZeroUsize;

use ssm_conformance::cases::conv::{Case, MODES, assert_agrees};
use ssm_conv::reference::{Arithmetic, Reference};
use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_cpu::{CpuBackend, Par};
use ssm_tensor::{DType, Planned, Run, TensorMut, TensorRef};

/// Every mode for each seed of `seeds` in `dtype`: reference, then both CPU backends.
fn check(dtype: DType, seeds: std::ops::Range<u64>) {
    let two = CpuBackend::new(Par::Threads(NonZeroUsize::new(2).unwrap())).unwrap();
    let backends = [("seq", CpuBackend::new(Par::Seq).unwrap()), ("threads", two)];
    for seed in seeds {
        for mode in MODES {
            let initial = Case::random(dtype, mode, seed);
            let mut want = initial.clone();
            want.run_on(&Reference { precision: Arithmetic::F32 }).unwrap();
            for (label, backend) in &backends {
                let mut got = initial.clone();
                got.run_on(backend).unwrap();
                let ctx = format!(
                    "{dtype} seed {seed} {mode:?} {label} dim {} width {} layout {:?} x {:?}",
                    initial.dim(),
                    initial.width(),
                    initial.layout,
                    initial.x.strides
                );
                assert_agrees(&ctx, &initial, &want, &got);
            }
        }
    }
}

#[test]
fn conv_cpu_matches_reference_f32() {
    check(DType::F32, 0..60);
}

#[test]
fn conv_cpu_matches_reference_bf16() {
    check(DType::BF16, 100..140);
}

#[test]
fn conv_cpu_matches_reference_f16() {
    check(DType::F16, 200..240);
}

#[test]
fn conv_empty_calls_write_nothing() {
    // dim 0, and a batch of pads only: plans succeed and nothing is written.
    let cpu = CpuBackend::new(Par::Threads(NonZeroUsize::new(2).unwrap())).unwrap();
    for (dim, indices) in [(0usize, [1i32, 2]), (4, [0, 0])] {
        let x = vec![1.0f32; 2 * dim];
        let w = vec![0.5f32; dim * 3];
        let mut state = vec![7.0f32; 3 * 2 * dim];
        let mut out = vec![f32::NAN; 2 * dim];
        let args = CausalConv1dUpdateArgs {
            x: TensorRef::from_slice(&x, &[2, dim]).unwrap(),
            conv_state: TensorMut::from_slice(&mut state, &[3, 2, dim]).unwrap(),
            conv_state_layout: ConvStateLayout::StateLenDim,
            weight: TensorRef::from_slice(&w, &[dim, 3]).unwrap(),
            bias: None,
            activation: Activation::Silu,
            conv_state_indices: Some(TensorRef::from_slice(&indices, &[2]).unwrap()),
            num_accepted_tokens: None,
            query_start_loc: None,
            pad_slot_id: Some(0),
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out: TensorMut::from_slice(&mut out, &[2, dim]).unwrap(),
        };
        cpu.run(Planned::new(args).unwrap()).unwrap();
        assert!(state.iter().all(|&v| v == 7.0));
        assert!(out.iter().all(|v| v.is_nan()));
    }
}
