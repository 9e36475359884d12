//! GPU tests of the CUDA causal conv1d (`causal_conv1d_update`, `causal_conv1d_fn`). Each
//! skips with a printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns
//! the skip into a failure.
//!
//! Cases are random calls in the style of ssm-cpu's conv property tests (odd dims, widths
//! 2–4, both state layouts, strided x, pads 0 / −1 / none, empty sequences, the speculative
//! rolling buffer, prefix-caching columns, varlen prefill with and without initial states,
//! bias and silu on and off, f32/f16/bf16). The CUDA result is compared with the scalar
//! reference over the tensors' whole memory: the state bit for bit (it is a copy of storage
//! values), `out` within the dtype's tolerance where written and still NaN where not.
//!
//! The generator is this file's own: ssm-cpu's conv property generator lives inside its unit
//! tests (typed `Vec<T>` buffers with an expected-writes oracle), not in a shared crate. Tensors
//! are `ssm_tensor::HostTensor` (strided x and out through `ssm_conformance::cases::StridedHost`).

// The staging error is the test harness's (large) error enum, on a copy path, never a decode path.
#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::StridedHost;
use ssm_conv::reference::{Arithmetic, Reference};
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_cuda::testing::{DeviceConvFnArgs, DeviceConvUpdateArgs, MirrorError, run_staged};
use ssm_cuda::{CudaBackend, CudaError, DeviceErrors};
use ssm_tensor::elem::{read_i64, write_i64};
use ssm_tensor::{DType, HostTensor, Planned, Run};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// x `[batch, dim]`.
    Single,
    /// x `[batch, seqlen, dim]`.
    Multi,
    /// Packed varlen, no speculation.
    Varlen,
    /// Packed varlen with `num_accepted_tokens`.
    SpecVarlen,
    /// x `[batch, seqlen, dim]` with `num_accepted_tokens`.
    Spec3d,
    /// 2-D table with `initial_state_idx` / `block_idx_last_scheduled_token`.
    Apc,
    /// `causal_conv1d_fn`.
    Prefill,
}

const MODES: [Mode; 7] =
    [Mode::Single, Mode::Multi, Mode::Varlen, Mode::SpecVarlen, Mode::Spec3d, Mode::Apc, Mode::Prefill];

/// One random call as host tensors.
#[derive(Clone, Debug)]
struct Case {
    mode: Mode,
    layout: ConvStateLayout,
    activation: Activation,
    pad: Option<i64>,
    x: StridedHost,
    weight: HostTensor,
    bias: Option<HostTensor>,
    state: HostTensor,
    out: StridedHost,
    indices: HostTensor,
    accepted: Option<HostTensor>,
    starts: Option<HostTensor>,
    apc: Option<(HostTensor, HostTensor)>,
    has_init: HostTensor,
}

/// Uniform values in `[-scale, scale)`, rounded into `dtype`.
fn random(dtype: DType, shape: &[usize], rng: &mut ChaCha8Rng, scale: f32) -> HostTensor {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale).collect();
    HostTensor::from_f32(dtype, shape.to_vec(), &v)
}

fn ints(dtype: DType, v: &[i64], shape: &[usize]) -> HostTensor {
    HostTensor::from_i64(dtype, shape.to_vec(), v)
}

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

/// `memory` (`n` elements) seen as `shape` with `strides`.
fn strided(memory: HostTensor, shape: &[usize], strides: &[isize]) -> StridedHost {
    StridedHost { memory, shape: shape.to_vec(), strides: strides.to_vec() }
}

impl Case {
    fn random(dtype: DType, mode: Mode, seed: u64) -> Case {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dim = [1, 3, 7, 8, 13, 17, 33, 70, 300, 1024, 2056][rng.random_range(0..11)];
        let width = rng.random_range(2..=4usize);
        let batch = rng.random_range(1..=6usize);
        let layout = if rng.random_bool(0.5) { ConvStateLayout::StateLenDim } else { ConvStateLayout::DimStateLen };
        let activation = if rng.random_bool(0.5) { Activation::Silu } else { Activation::None };
        let pad = [Some(0i64), Some(-1), None][rng.random_range(0..3)];
        let index = if rng.random_bool(0.5) { DType::I32 } else { DType::I64 };
        let num_spec = rng.random_range(0..=3usize);
        let cols = if mode == Mode::Apc { 3 } else { 1 };
        // Slot 0 is reserved when it is the pad; three spare slots nobody names.
        let first = usize::from(pad == Some(0));
        let slots = first + batch * cols + 3;
        let mut free: Vec<usize> = (first..slots).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.random_range(0..=i));
        }
        let mut indices: Vec<i64> = free[..batch * cols].iter().map(|&s| s as i64).collect();
        if let Some(p) = pad {
            for b in 0..batch {
                if rng.random_bool(0.25) {
                    indices[b * cols] = p;
                }
            }
        }
        let spec = matches!(mode, Mode::SpecVarlen | Mode::Spec3d);
        let seqlen = match mode {
            Mode::Single | Mode::Apc => 1,
            Mode::Multi => rng.random_range(1..=4),
            Mode::Spec3d => num_spec + 1,
            _ => 0,
        };
        let lens: Vec<usize> = match mode {
            Mode::SpecVarlen => (0..batch).map(|_| rng.random_range(0..=num_spec + 1)).collect(),
            Mode::Varlen => (0..batch).map(|_| rng.random_range(0..=5)).collect(),
            // Long sequences run in several token chunks (64 tokens each).
            Mode::Prefill => (0..batch).map(|_| [0, 1, 2, 3, 17, 64, 65, 200][rng.random_range(0..8)]).collect(),
            _ => vec![seqlen; batch],
        };
        let state_len = width - 1 + if spec { num_spec } else { rng.random_range(0..=2) };
        let tokens: usize = lens.iter().sum();
        let varlen = matches!(mode, Mode::SpecVarlen | Mode::Varlen | Mode::Prefill);
        let (x_shape, rows) = match mode {
            Mode::Single | Mode::Apc => (vec![batch, dim], batch),
            Mode::Multi | Mode::Spec3d => (vec![batch, seqlen, dim], batch * seqlen),
            _ => (vec![tokens, dim], tokens),
        };
        // Token-major storage, or vLLM's dim-major storage seen through permuted strides.
        let dim_major = rng.random_bool(0.3);
        let x_strides: Vec<isize> = match (x_shape.len(), dim_major) {
            (2, false) => vec![dim as isize, 1],
            (2, true) => vec![1, x_shape[0] as isize],
            (_, false) => vec![(seqlen * dim) as isize, dim as isize, 1],
            (_, true) => vec![(seqlen * dim) as isize, 1, seqlen as isize],
        };
        let n = (rows * dim).max(1);
        let x = strided(random(dtype, &[n], &mut rng, 2.0), &x_shape, &x_strides);
        let out = strided(HostTensor::filled(dtype, vec![n], f32::NAN), &x_shape, &x_strides);
        let weight = random(dtype, &[dim, width], &mut rng, 1.0);
        let bias = rng.random_bool(0.5).then(|| random(dtype, &[dim], &mut rng, 0.5));
        let shape = match layout {
            ConvStateLayout::StateLenDim => [slots, state_len, dim],
            ConvStateLayout::DimStateLen => [slots, dim, state_len],
        };
        let state = random(dtype, &shape, &mut rng, 2.0);
        let accepted =
            spec.then(|| (0..batch).map(|_| rng.random_range(1..=(state_len + 2 - width) as i64)).collect::<Vec<_>>());
        let starts = varlen.then(|| {
            let mut s = vec![0i64];
            for &l in &lens {
                s.push(s.last().unwrap() + l as i64);
            }
            s
        });
        let apc = (mode == Mode::Apc).then(|| {
            // Read column 0, write column 1 or 2 (never the pad: pads sit in column 0).
            (vec![0i64; batch], (0..batch).map(|_| rng.random_range(1..=2)).collect::<Vec<i64>>())
        });
        let has_init: Vec<i64> = (0..batch).map(|_| i64::from(rng.random_bool(0.6))).collect();
        Case {
            mode,
            layout,
            activation,
            pad,
            x,
            weight,
            bias,
            state,
            out,
            indices: ints(index, &indices, &if cols == 1 { vec![batch] } else { vec![batch, cols] }),
            accepted: accepted.map(|a| ints(index, &a, &[batch])),
            starts: starts.map(|s| ints(index, &s, &[batch + 1])),
            apc: apc.map(|(i, l)| (ints(index, &i, &[batch]), ints(index, &l, &[batch]))),
            has_init: ints(DType::Bool, &has_init, &[batch]),
        }
    }

    fn update_args(&mut self) -> CausalConv1dUpdateArgs<'_> {
        CausalConv1dUpdateArgs {
            x: self.x.view(),
            conv_state: self.state.view_mut(),
            conv_state_layout: self.layout,
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            activation: self.activation,
            conv_state_indices: Some(self.indices.view()),
            num_accepted_tokens: self.accepted.as_ref().map(|a| a.view()),
            query_start_loc: self.starts.as_ref().map(|s| s.view()),
            pad_slot_id: self.pad,
            block_idx_last_scheduled_token: self.apc.as_ref().map(|(_, l)| l.view()),
            initial_state_idx: self.apc.as_ref().map(|(i, _)| i.view()),
            out: self.out.view_mut(),
        }
    }

    fn fn_args(&mut self) -> CausalConv1dFnArgs<'_> {
        CausalConv1dFnArgs {
            x: self.x.view(),
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            conv_states: self.state.view_mut(),
            conv_state_layout: self.layout,
            query_start_loc: self.starts.as_ref().expect("prefill has starts").view(),
            cache_indices: Some(self.indices.view()),
            has_initial_state: Some(self.has_init.view()),
            activation: self.activation,
            pad_slot_id: self.pad,
            out: self.out.view_mut(),
        }
    }

    fn run_reference(&mut self) {
        let r = Reference { precision: Arithmetic::F32 };
        if self.mode == Mode::Prefill {
            r.run(Planned::new(self.fn_args()).expect("host plan")).expect("reference");
        } else {
            r.run(Planned::new(self.update_args()).expect("host plan")).expect("reference");
        }
    }

    fn run_cuda(&mut self, be: &CudaBackend) -> Result<(), MirrorError> {
        if self.mode == Mode::Prefill {
            run_staged::<DeviceConvFnArgs>(be, self.fn_args())
        } else {
            run_staged::<DeviceConvUpdateArgs>(be, self.update_args())
        }
    }
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        _ => 1e-2,
    }
}

/// State bit for bit over the whole pool; `out` close where the reference wrote, NaN where not.
fn compare(ctx: &str, got: &Case, want: &Case) {
    let es = want.state.dtype.size();
    for (e, (g, w)) in got.state.bytes().chunks(es).zip(want.state.bytes().chunks(es)).enumerate() {
        assert_eq!(g, w, "{ctx}: state element {e}");
    }
    let tol = tolerance(want.out.memory.dtype);
    for (e, (&g, &w)) in got.out.memory.to_f64_vec().iter().zip(&want.out.memory.to_f64_vec()).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{ctx}: out element {e} written ({g}) where the reference wrote nothing");
        } else {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{ctx}: out element {e}: {g} vs {w}");
        }
    }
}

#[test]
fn conv_matches_the_reference_on_random_cases() {
    let Some(be) = gpu("conv_matches_the_reference_on_random_cases") else { return };
    for (k, dtype) in [DType::F32, DType::F16, DType::BF16].into_iter().enumerate() {
        for seed in 0..12u64 {
            for mode in MODES {
                let mut want = Case::random(dtype, mode, 1000 * k as u64 + seed);
                let mut got = want.clone();
                want.run_reference();
                let ctx = format!("{dtype} {mode:?} seed {seed} layout {:?} x {:?}", want.layout, want.x.shape);
                got.run_cuda(&be).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                compare(&ctx, &got, &want);
            }
        }
    }
}

/// Qwen3-Next decode shapes (dim 8192, width 4, bf16), both layouts, vectorised paths.
#[test]
fn qwen3_next_decode_matches_the_reference() {
    let Some(be) = gpu("qwen3_next_decode_matches_the_reference") else { return };
    for (i, layout) in [ConvStateLayout::StateLenDim, ConvStateLayout::DimStateLen].into_iter().enumerate() {
        let mut want = decode_case(DType::BF16, 8192, 4, 16, layout, 40 + i as u64);
        let mut got = want.clone();
        want.run_reference();
        got.run_cuda(&be).unwrap();
        compare(&format!("{layout:?}"), &got, &want);
    }
}

/// A decode call: `batch` sequences on slots 2·b + 1 of a pool of 2·batch + 2 slots, pad −1 on
/// the last sequence.
fn decode_case(dtype: DType, dim: usize, width: usize, batch: usize, layout: ConvStateLayout, seed: u64) -> Case {
    let mut c = Case::random(dtype, Mode::Single, seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let slots = 2 * batch + 2;
    c.layout = layout;
    c.pad = Some(-1);
    c.activation = Activation::Silu;
    c.x = strided(random(dtype, &[batch * dim], &mut rng, 2.0), &[batch, dim], &[dim as isize, 1]);
    c.out = strided(HostTensor::filled(dtype, vec![batch * dim], f32::NAN), &[batch, dim], &[dim as isize, 1]);
    c.weight = random(dtype, &[dim, width], &mut rng, 1.0);
    c.bias = Some(random(dtype, &[dim], &mut rng, 0.5));
    let shape = match layout {
        ConvStateLayout::StateLenDim => [slots, width - 1, dim],
        ConvStateLayout::DimStateLen => [slots, dim, width - 1],
    };
    c.state = random(dtype, &shape, &mut rng, 2.0);
    let idx: Vec<i64> = (0..batch).map(|b| if b + 1 == batch { -1 } else { 2 * b as i64 + 1 }).collect();
    c.indices = ints(DType::I32, &idx, &[batch]);
    c.accepted = None;
    c.starts = None;
    c.apc = None;
    c
}

/// Garbage device tables (random i64, negatives, huge, the pad, valid values, accepted counts
/// 0..=width + 1, broken token starts): no crash, the error word is set when something was out
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
        if let Some(a) = &mut case.accepted {
            for i in 0..count(a) {
                set_i(a, i, rng.random_range(0..=width + 1));
            }
        }
        if let Some((i, l)) = &mut case.apc {
            for t in [i, l] {
                for e in 0..count(t) {
                    if rng.random_range(0..4) == 0 {
                        let v = garbage(&mut rng, 3);
                        set_i(t, e, v);
                    }
                }
            }
        }
        if let Some(s) = &mut case.starts
            && rng.random_bool(0.5)
        {
            let i = rng.random_range(0..count(s));
            let v = garbage(&mut rng, 100);
            set_i(s, i, v);
        }
        let initial = case.state.clone();
        match case.run_cuda(&be) {
            Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
                assert_ne!(w, 0);
                flagged += 1;
            }
            Ok(()) => {}
            Err(e) => panic!("round {round} {mode:?}: unexpected error {e}"),
        }
        // Slots that no in-range table entry names are bit-identical.
        let named: std::collections::HashSet<i64> =
            (0..count(&case.indices)).map(|i| get_i(&case.indices, i)).filter(|v| (0..slots).contains(v)).collect();
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
    let mut case = decode_case(DType::BF16, 2048, 4, 8, ConvStateLayout::StateLenDim, 4242);
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
    let mut case = decode_case(DType::BF16, 8192, 4, 64, ConvStateLayout::StateLenDim, 31);
    common::assert_calls_allocate_no_device_memory::<DeviceConvUpdateArgs>(&be, &case.update_args());
}

#[test]
fn host_tensors_are_refused() {
    let Some(be) = gpu("host_tensors_are_refused") else { return };
    let mut case = decode_case(DType::F32, 16, 3, 2, ConvStateLayout::StateLenDim, 1);
    let err = be.run(ssm_conv::plan(case.update_args()).unwrap()).unwrap_err();
    assert!(matches!(err, CudaError::WrongDevice { .. }), "{err}");
}
