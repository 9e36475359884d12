//! The speculative rolling buffer, checked against its meaning rather than vLLM's formula:
//! over several steps with random accepted counts (and random step lengths), every output
//! equals the plain causal conv over the accepted history followed by the step's tokens, on
//! the reference and the CPU backend, in both state layouts. Prefill followed by decode
//! equals one long prefill.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conv::reference::{Arithmetic, Reference};
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_cpu::{CpuBackend, Par};
use ssm_tensor::{Run, TensorMut, TensorRef};

/// The plain causal conv of channel `c` at the end of `seq` (f64).
fn naive(seq: &[Vec<f32>], c: usize, w: &[f32], width: usize, bias: f32, silu: bool) -> f64 {
    let t = seq.len();
    let mut acc = bias as f64;
    for j in 0..width {
        // Inputs before the sequence start are zeros.
        if let Some(i) = (t + j).checked_sub(width) {
            acc += w[c * width + j] as f64 * seq[i][c] as f64;
        }
    }
    if silu { acc / (1.0 + (-acc).exp()) } else { acc }
}

fn to_layout(state: &[f32], slots: usize, len: usize, dim: usize, layout: ConvStateLayout) -> Vec<f32> {
    // `state` is (slots, state_len, dim).
    match layout {
        ConvStateLayout::StateLenDim => state.to_vec(),
        ConvStateLayout::DimStateLen => {
            let mut v = vec![0.0; state.len()];
            for s in 0..slots {
                for l in 0..len {
                    for d in 0..dim {
                        v[(s * dim + d) * len + l] = state[(s * len + l) * dim + d];
                    }
                }
            }
            v
        }
    }
}

fn shape(slots: usize, len: usize, dim: usize, layout: ConvStateLayout) -> [usize; 3] {
    match layout {
        ConvStateLayout::StateLenDim => [slots, len, dim],
        ConvStateLayout::DimStateLen => [slots, dim, len],
    }
}

fn run_backend<B: ssm_conv::ConvBackend<E>, E: std::fmt::Debug>(backend: &B, seed: u64, layout: ConvStateLayout) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let width = rng.random_range(2..=4usize);
    let num_spec = rng.random_range(1..=3usize);
    let dim = [5usize, 8, 19][rng.random_range(0..3)];
    let batch = 3;
    let slots = 5;
    let len = width - 1 + num_spec;
    let silu = rng.random_bool(0.5);
    let w: Vec<f32> = (0..dim * width).map(|_| rng.random::<f32>() - 0.5).collect();
    let bias: Vec<f32> = (0..dim).map(|_| rng.random::<f32>() * 0.2).collect();
    let slot_of = [3usize, 1, 4];
    // Accepted history of each sequence; the buffer holds its last width − 1 inputs at offset 0.
    let mut hist: Vec<Vec<Vec<f32>>> = (0..batch)
        .map(|_| (0..rng.random_range(0..6)).map(|_| (0..dim).map(|_| rng.random::<f32>() - 0.5).collect()).collect())
        .collect();
    let mut state_sd = vec![f32::NAN; slots * len * dim];
    for b in 0..batch {
        for col in 0..width - 1 {
            // Column col holds the input width − 1 − col steps back (zeros before the start).
            let back = width - 1 - col;
            for d in 0..dim {
                let v = hist[b].len().checked_sub(back).map_or(0.0, |i| hist[b][i][d]);
                state_sd[(slot_of[b] * len + col) * dim + d] = v;
            }
        }
    }
    let mut state = to_layout(&state_sd, slots, len, dim, layout);
    let mut accepted = vec![1i32; batch];
    let indices: Vec<i32> = slot_of.iter().map(|&s| s as i32).collect();
    for step in 0..4 {
        let lens: Vec<usize> = (0..batch).map(|_| rng.random_range(1..=num_spec + 1)).collect();
        let mut starts = vec![0i32];
        for &l in &lens {
            starts.push(starts.last().unwrap() + l as i32);
        }
        let tokens = *starts.last().unwrap() as usize;
        let x: Vec<f32> = (0..tokens * dim).map(|_| rng.random::<f32>() - 0.5).collect();
        let mut out = vec![f32::NAN; tokens * dim];
        {
            let args = CausalConv1dUpdateArgs {
                x: TensorRef::from_slice(&x, &[tokens, dim]).unwrap(),
                conv_state: TensorMut::from_slice(&mut state, &shape(slots, len, dim, layout)).unwrap(),
                conv_state_layout: layout,
                weight: TensorRef::from_slice(&w, &[dim, width]).unwrap(),
                bias: Some(TensorRef::from_slice(&bias, &[dim]).unwrap()),
                activation: if silu { Activation::Silu } else { Activation::None },
                conv_state_indices: Some(TensorRef::from_slice(&indices, &[batch]).unwrap()),
                num_accepted_tokens: Some(TensorRef::from_slice(&accepted, &[batch]).unwrap()),
                query_start_loc: Some(TensorRef::from_slice(&starts, &[batch + 1]).unwrap()),
                pad_slot_id: Some(0),
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out: TensorMut::from_slice(&mut out, &[tokens, dim]).unwrap(),
            };
            backend.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
        }
        for b in 0..batch {
            let mut seq = hist[b].clone();
            for t in 0..lens[b] {
                let row = starts[b] as usize + t;
                seq.push(x[row * dim..(row + 1) * dim].to_vec());
                for c in 0..dim {
                    let want = naive(&seq, c, &w, width, bias[c], silu);
                    let got = out[row * dim + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "seed {seed} step {step} seq {b} token {t} ch {c}: {got} vs {want}"
                    );
                }
            }
            // Verification accepts a prefix of the step's tokens.
            let a = rng.random_range(1..=lens[b]);
            hist[b].extend((0..a).map(|t| {
                let row = starts[b] as usize + t;
                x[row * dim..(row + 1) * dim].to_vec()
            }));
            accepted[b] = a as i32;
        }
    }
}

#[test]
fn speculative_steps_equal_replaying_the_accepted_tokens() {
    let cpu = CpuBackend::new(Par::Threads(std::num::NonZeroUsize::new(2).unwrap())).unwrap();
    for seed in 0..40 {
        for layout in [ConvStateLayout::StateLenDim, ConvStateLayout::DimStateLen] {
            run_backend(&Reference { precision: Arithmetic::F32 }, seed, layout);
            run_backend(&cpu, seed, layout);
        }
    }
}

#[test]
fn prefill_then_decode_equals_one_prefill() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let cpu = CpuBackend::new(Par::Seq).unwrap();
    for _ in 0..30 {
        let width = rng.random_range(2..=4usize);
        let dim = rng.random_range(1..=20usize);
        let total = rng.random_range(1..=30usize);
        let split = rng.random_range(0..=total);
        let x: Vec<f32> = (0..total * dim).map(|_| rng.random::<f32>() - 0.5).collect();
        let w: Vec<f32> = (0..dim * width).map(|_| rng.random::<f32>() - 0.5).collect();
        let run_fn = |x: &[f32], state: &mut [f32], init: bool| -> Vec<f32> {
            let n = x.len() / dim;
            let mut out = vec![f32::NAN; x.len()];
            let starts = [0i32, n as i32];
            let init = [u8::from(init)];
            let args = CausalConv1dFnArgs {
                x: TensorRef::from_slice(x, &[n, dim]).unwrap(),
                weight: TensorRef::from_slice(&w, &[dim, width]).unwrap(),
                bias: None,
                conv_states: TensorMut::from_slice(state, &[2, width - 1, dim]).unwrap(),
                conv_state_layout: ConvStateLayout::StateLenDim,
                query_start_loc: TensorRef::from_slice(&starts, &[2]).unwrap(),
                cache_indices: Some(TensorRef::from_slice(&[1i32], &[1]).unwrap()),
                has_initial_state: Some(TensorRef::from_slice(&init, &[1]).unwrap()),
                activation: Activation::None,
                pad_slot_id: Some(0),
                checkpoint_offsets: None,
                checkpoint_state_indices: None,
                out: TensorMut::from_slice(&mut out, &[n, dim]).unwrap(),
            };
            cpu.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            out
        };
        // One prefill over everything.
        let mut s_all = vec![9.0f32; 2 * (width - 1) * dim];
        let all = run_fn(&x, &mut s_all, false);
        // A prefill of the first part (or nothing), then one-token decodes.
        let mut s = vec![9.0f32; 2 * (width - 1) * dim];
        let mut got = if split > 0 { run_fn(&x[..split * dim], &mut s, false) } else { Vec::new() };
        if split == 0 {
            // No prefill: the slot must start from zeros for the decodes.
            s[(width - 1) * dim..].fill(0.0);
        }
        for t in split..total {
            let mut out = vec![f32::NAN; dim];
            let args = CausalConv1dUpdateArgs {
                x: TensorRef::from_slice(&x[t * dim..(t + 1) * dim], &[1, dim]).unwrap(),
                conv_state: TensorMut::from_slice(&mut s, &[2, width - 1, dim]).unwrap(),
                conv_state_layout: ConvStateLayout::StateLenDim,
                weight: TensorRef::from_slice(&w, &[dim, width]).unwrap(),
                bias: None,
                activation: Activation::None,
                conv_state_indices: Some(TensorRef::from_slice(&[1i32], &[1]).unwrap()),
                num_accepted_tokens: None,
                query_start_loc: None,
                pad_slot_id: Some(0),
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out: TensorMut::from_slice(&mut out, &[1, dim]).unwrap(),
            };
            cpu.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            got.extend(out);
        }
        for (i, (g, a)) in got.iter().zip(&all).enumerate() {
            assert!((g - a).abs() <= 1e-5 * (1.0 + a.abs()), "element {i}: {g} vs {a}");
        }
        // Both paths leave the same window in the slot, and slot 0 (the pad) untouched.
        assert_eq!(s, s_all);
        assert!(s[..(width - 1) * dim].iter().all(|&v| v == 9.0));
    }
}
