//! The candle adapter against the runtime on the same memory: bit-identical results for
//! contiguous, sliced (non-contiguous) and broadcast candle layouts; in-place writes (the
//! state and out tensors are the ones updated); aliasing, unsupported dtypes and refused calls
//! write nothing.

use candle_core::{DType, Device, IndexOp, Tensor};
use ssm_candle::{ConvUpdateTensors, Error, SsuTensors, causal_conv1d_update, selective_state_update};
use ssm_conformance::gdn_random::SplitMix;
use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{Config, Runtime};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{TensorMut, TensorRef};

fn runtime() -> Runtime {
    Runtime::new(&Config::cpu(Some(2))).unwrap()
}

fn random(r: &mut SplitMix, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.uniform(lo, hi)).collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
}

/// Mamba2 decode on candle tensors: the state pool is a slice of a larger tensor (every other
/// slot: non-contiguous), dt / A / dt_bias / D are per-head tensors broadcast over the head dim
/// (stride 0), bf16 activations; equal, bit for bit, to the runtime on plain host views of the
/// same values.
#[test]
fn ssu_matches_the_runtime_bit_for_bit_on_strided_candle_layouts() {
    let rt = runtime();
    let dev = Device::Cpu;
    let mut r = SplitMix::new(7);
    let (batch, h, p, n, g, slots) = (3usize, 4usize, 6usize, 16usize, 2usize, 5usize);
    let state_vals = random(&mut r, 2 * slots * h * p * n, -1.0, 1.0);
    let big = Tensor::from_vec(state_vals.clone(), (slots, 2, h, p, n), &dev).unwrap();
    let state = big.i((.., 0)).unwrap(); // [slots, h, p, n], slot stride 2·h·p·n
    assert!(!state.is_contiguous());
    let x = Tensor::from_vec(random(&mut r, batch * h * p, -1.0, 1.0), (batch, h, p), &dev)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let dt_h = random(&mut r, batch * h, -2.0, 1.0);
    let dt = Tensor::from_vec(dt_h.clone(), (batch, h, 1), &dev).unwrap().broadcast_as((batch, h, p)).unwrap();
    let a_h = random(&mut r, h, -2.0, -0.1);
    let a = Tensor::from_vec(a_h.clone(), (h, 1, 1), &dev).unwrap().broadcast_as((h, p, n)).unwrap();
    let bias_h = random(&mut r, h, -1.0, 1.0);
    let dt_bias = Tensor::from_vec(bias_h.clone(), (h, 1), &dev).unwrap().broadcast_as((h, p)).unwrap();
    let d_h = random(&mut r, h, 0.5, 1.5);
    let d = Tensor::from_vec(d_h.clone(), (h, 1), &dev).unwrap().broadcast_as((h, p)).unwrap();
    let b = Tensor::from_vec(random(&mut r, batch * g * n, -1.0, 1.0), (batch, g, n), &dev).unwrap();
    let c = Tensor::from_vec(random(&mut r, batch * g * n, -1.0, 1.0), (batch, g, n), &dev).unwrap();
    let slot_table = [4i64, -1, 1];
    let sbi = Tensor::new(&slot_table, &dev).unwrap();
    let out = Tensor::zeros((batch, h, p), DType::BF16, &dev).unwrap();
    let tensors = SsuTensors::new(&state, &x, &dt, &a, &b, &c, &out).d(&d).dt_bias(&dt_bias).state_batch_indices(&sbi);
    selective_state_update(&rt, tensors, true, Some(-1)).unwrap();

    // The same call on host views of the same values.
    let mut want_state = state_vals.clone();
    let mut want_out = vec![ssm_tensor::bf16::ZERO; batch * h * p];
    let x_host: Vec<ssm_tensor::bf16> = x.flatten_all().unwrap().to_vec1().unwrap();
    let (bv, cv) = (values(&b), values(&c));
    let (hs, ps, ns) = (h as isize, p as isize, n as isize);
    let args = SelectiveStateUpdateArgs {
        d: Some(TensorRef::from_slice(&d_h, &[h]).unwrap().with_layout(&[h, p], &[1, 0], 0).unwrap()),
        dt_bias: Some(TensorRef::from_slice(&bias_h, &[h]).unwrap().with_layout(&[h, p], &[1, 0], 0).unwrap()),
        dt_softplus: true,
        state_batch_indices: Some(TensorRef::from_slice(&slot_table, &[batch]).unwrap()),
        pad_slot_id: Some(-1),
        ..SelectiveStateUpdateArgs::new(
            TensorMut::from_slice(&mut want_state, &[slots * 2 * h * p * n])
                .unwrap()
                .with_layout(&[slots, h, p, n], &[2 * hs * ps * ns, ps * ns, ns, 1], 0)
                .unwrap(),
            TensorRef::from_slice(&x_host, &[batch, h, p]).unwrap(),
            TensorRef::from_slice(&dt_h, &[batch, h]).unwrap().with_layout(&[batch, h, p], &[hs, 1, 0], 0).unwrap(),
            TensorRef::from_slice(&a_h, &[h]).unwrap().with_layout(&[h, p, n], &[1, 0, 0], 0).unwrap(),
            TensorRef::from_slice(&bv, &[batch, g, n]).unwrap(),
            TensorRef::from_slice(&cv, &[batch, g, n]).unwrap(),
            TensorMut::from_slice(&mut want_out, &[batch, h, p]).unwrap(),
        )
    };
    rt.selective_state_update(args).unwrap();

    // In place: the slice's parent holds the new state (slots 4 and 1 written, the rest as they were).
    assert_eq!(values(&big), want_state, "state pool");
    assert_ne!(want_state, state_vals, "the call changed the state");
    let got_out: Vec<ssm_tensor::bf16> = out.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(got_out, want_out, "out");
}

/// Conv update with a `[slots, state_len, dim]` pool (vLLM's SD layout, viewed through a
/// transpose), silu and bias: equal to the runtime bit for bit, written in place.
#[test]
fn conv_update_matches_the_runtime_bit_for_bit() {
    let rt = runtime();
    let dev = Device::Cpu;
    let mut r = SplitMix::new(11);
    let (batch, dim, width, slots) = (3usize, 24usize, 4usize, 4usize);
    let state_vals = random(&mut r, slots * (width - 1) * dim, -1.0, 1.0);
    let conv_state = Tensor::from_vec(state_vals.clone(), (slots, width - 1, dim), &dev).unwrap();
    let x_vals = random(&mut r, batch * dim, -1.0, 1.0);
    let x = Tensor::from_vec(x_vals.clone(), (batch, dim), &dev).unwrap();
    let w_vals = random(&mut r, dim * width, -1.0, 1.0);
    let weight = Tensor::from_vec(w_vals.clone(), (dim, width), &dev).unwrap();
    let bias_vals = random(&mut r, dim, -0.5, 0.5);
    let bias = Tensor::from_vec(bias_vals.clone(), dim, &dev).unwrap();
    let table = [3i32, 0, 2];
    let idx = Tensor::new(&table, &dev).unwrap();
    let out = Tensor::zeros((batch, dim), DType::F32, &dev).unwrap();
    let t = ConvUpdateTensors {
        x: &x,
        conv_state: &conv_state,
        weight: &weight,
        bias: Some(&bias),
        conv_state_indices: Some(&idx),
        out: &out,
    };
    causal_conv1d_update(&rt, t, ConvStateLayout::StateLenDim, Activation::Silu, None).unwrap();

    let (mut want_state, mut want_out) = (state_vals.clone(), vec![0f32; batch * dim]);
    let args = CausalConv1dUpdateArgs {
        x: TensorRef::from_slice(&x_vals, &[batch, dim]).unwrap(),
        conv_state: TensorMut::from_slice(&mut want_state, &[slots, width - 1, dim]).unwrap(),
        conv_state_layout: ConvStateLayout::StateLenDim,
        weight: TensorRef::from_slice(&w_vals, &[dim, width]).unwrap(),
        bias: Some(TensorRef::from_slice(&bias_vals, &[dim]).unwrap()),
        activation: Activation::Silu,
        conv_state_indices: Some(TensorRef::from_slice(&table, &[batch]).unwrap()),
        num_accepted_tokens: None,
        query_start_loc: None,
        pad_slot_id: None,
        block_idx_last_scheduled_token: None,
        initial_state_idx: None,
        out: TensorMut::from_slice(&mut want_out, &[batch, dim]).unwrap(),
    };
    rt.causal_conv1d_update(args).unwrap();
    assert_eq!(values(&conv_state), want_state);
    assert_eq!(values(&out), want_out);
    assert_ne!(want_state, state_vals);
}

/// A small valid SSU call's tensors, for the refusal tests.
struct Small {
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    out: Tensor,
}

fn small() -> Small {
    let dev = Device::Cpu;
    Small {
        state: Tensor::ones((2, 1, 4, 8), DType::F32, &dev).unwrap(),
        x: Tensor::ones((2, 1, 4), DType::F32, &dev).unwrap(),
        dt: Tensor::ones((2, 1, 4), DType::F32, &dev).unwrap(),
        a: Tensor::full(-1f32, (1, 4, 8), &dev).unwrap(),
        b: Tensor::ones((2, 1, 8), DType::F32, &dev).unwrap(),
        c: Tensor::ones((2, 1, 8), DType::F32, &dev).unwrap(),
        out: Tensor::zeros((2, 1, 4), DType::F32, &dev).unwrap(),
    }
}

#[test]
fn a_written_tensor_aliasing_another_argument_is_refused_before_any_write() {
    let rt = runtime();
    let s = small();
    // `x` and `out` share one storage (candle's clone is a second handle on the same memory).
    let out = s.x.clone();
    let err = selective_state_update(&rt, SsuTensors::new(&s.state, &s.x, &s.dt, &s.a, &s.b, &s.c, &out), false, None)
        .unwrap_err();
    assert!(matches!(err, Error::Aliased { written: "out", other: "x" }), "{err}");
    let err =
        selective_state_update(&rt, SsuTensors::new(&s.state, &s.x, &s.dt, &s.a, &s.b, &s.c, &s.state), false, None)
            .unwrap_err();
    assert!(matches!(err, Error::Aliased { written: "state", other: "out" }), "{err}");
    assert_eq!(values(&s.state), vec![1.0; 64], "nothing written");
    assert_eq!(values(&s.x), vec![1.0; 8]);
}

#[test]
fn unsupported_dtypes_and_refused_plans_write_nothing() {
    let rt = runtime();
    let s = small();
    let u8_table = Tensor::new(&[0u8, 1], &Device::Cpu).unwrap();
    let t = SsuTensors::new(&s.state, &s.x, &s.dt, &s.a, &s.b, &s.c, &s.out).state_batch_indices(&u8_table);
    let err = selective_state_update(&rt, t, false, None).unwrap_err();
    assert!(matches!(&err, Error::Unsupported { arg: "state_batch_indices", .. }), "{err}");
    // A C of the wrong dstate: the op's plan refuses it, by name.
    let c = Tensor::ones((2, 1, 5), DType::F32, &Device::Cpu).unwrap();
    let err = selective_state_update(&rt, SsuTensors::new(&s.state, &s.x, &s.dt, &s.a, &s.b, &c, &s.out), false, None)
        .unwrap_err();
    assert!(matches!(&err, Error::Op(_)) && err.to_string().contains('C'), "{err}");
    assert_eq!(values(&s.state), vec![1.0; 64], "nothing written");
    assert_eq!(values(&s.out), vec![0.0; 8]);
}

/// The Qwen3-Next decode step (sigmoid-gated delta rule, bf16 q/k/v, l2norm, a slot table):
/// equal to the runtime bit for bit, the pool and `o` written in place.
#[test]
fn gdn_decode_matches_the_runtime_bit_for_bit() {
    use ssm_gdn::{DeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs};
    let rt = runtime();
    let dev = Device::Cpu;
    let mut r = SplitMix::new(13);
    let (b, h, hv, k, v, slots) = (3usize, 2usize, 4usize, 16usize, 8usize, 5usize);
    let bf = |r: &mut SplitMix, n: usize| -> Vec<ssm_tensor::bf16> {
        random(r, n, -1.0, 1.0).into_iter().map(ssm_tensor::bf16::from_f32).collect()
    };
    let (qv, kv, vv) = (bf(&mut r, b * h * k), bf(&mut r, b * h * k), bf(&mut r, b * hv * v));
    let (a_log, dt_bias) = (random(&mut r, hv, -1.0, 1.0), random(&mut r, hv, -1.0, 1.0));
    let (av, bv) = (random(&mut r, b * hv, -2.0, 2.0), random(&mut r, b * hv, -2.0, 2.0));
    let state_vals = random(&mut r, slots * hv * v * k, -0.5, 0.5);
    let table = [4i64, 1, 2];
    let t = |vals: Vec<f32>, shape: &[usize]| Tensor::from_vec(vals, shape, &dev).unwrap();
    let tb = |vals: &[ssm_tensor::bf16], shape: &[usize]| Tensor::from_vec(vals.to_vec(), shape, &dev).unwrap();
    let (q, kk, vt) = (tb(&qv, &[b, 1, h, k]), tb(&kv, &[b, 1, h, k]), tb(&vv, &[b, 1, hv, v]));
    let (a_log_t, dt_bias_t) = (t(a_log.clone(), &[hv]), t(dt_bias.clone(), &[hv]));
    let (a_t, b_t) = (t(av.clone(), &[b, hv]), t(bv.clone(), &[b, hv]));
    let state = t(state_vals.clone(), &[slots, hv, v, k]);
    let idx = Tensor::new(&table, &dev).unwrap();
    let o = Tensor::zeros((b, 1, hv, v), DType::F32, &dev).unwrap();
    let tensors = ssm_candle::GdnDecodeTensors {
        a_log: &a_log_t,
        a: &a_t,
        b: &b_t,
        dt_bias: &dt_bias_t,
        q: &q,
        k: &kk,
        v: &vt,
        initial_state: &state,
        ssm_state_indices: Some(&idx),
        cu_seqlens: None,
        o: &o,
    };
    ssm_candle::fused_sigmoid_gating_delta_rule_update(&rt, tensors, None, true).unwrap();

    let (mut want_state, mut want_o) = (state_vals.clone(), vec![0f32; b * hv * v]);
    let args = FusedSigmoidGatingDeltaRuleUpdateArgs {
        gates: GateInputs::new(
            TensorRef::from_slice(&a_log, &[hv]).unwrap(),
            TensorRef::from_slice(&av, &[b, hv]).unwrap(),
            TensorRef::from_slice(&bv, &[b, hv]).unwrap(),
            TensorRef::from_slice(&dt_bias, &[hv]).unwrap(),
        ),
        rule: DeltaRuleArgs {
            initial_state: Some(TensorMut::from_slice(&mut want_state, &[slots, hv, v, k]).unwrap()),
            ssm_state_indices: Some(TensorRef::from_slice(&table, &[b]).unwrap()),
            use_qk_l2norm_in_kernel: true,
            ..DeltaRuleArgs::new(
                TensorRef::from_slice(&qv, &[b, 1, h, k]).unwrap(),
                TensorRef::from_slice(&kv, &[b, 1, h, k]).unwrap(),
                TensorRef::from_slice(&vv, &[b, 1, hv, v]).unwrap(),
                TensorMut::from_slice(&mut want_o, &[b, 1, hv, v]).unwrap(),
            )
        },
    };
    rt.fused_sigmoid_gating_delta_rule_update(args).unwrap();
    assert_eq!(values(&state), want_state);
    assert_eq!(values(&o), want_o);
    assert_ne!(want_state, state_vals);
}

/// The Qwen3-Next prefill (chunked gated delta rule, bf16 q/k/v, l2norm, varlen with an empty
/// sequence, a pad, a slot starting from zeros): equal to the runtime bit for bit, the pool and
/// `o` written in place, the pad's slot untouched.
#[test]
fn gdn_prefill_matches_the_runtime_bit_for_bit() {
    use ssm_gdn::ChunkGatedDeltaRuleArgs;
    let rt = runtime();
    let dev = Device::Cpu;
    let mut r = SplitMix::new(17);
    let (h, hv, k, v, slots) = (2usize, 4usize, 16usize, 8usize, 6usize);
    let cu = [0i64, 70, 70, 75, 140];
    let (n, t) = (cu.len() - 1, cu[cu.len() - 1] as usize);
    let bf = |r: &mut SplitMix, n: usize| -> Vec<ssm_tensor::bf16> {
        random(r, n, -1.0, 1.0).into_iter().map(ssm_tensor::bf16::from_f32).collect()
    };
    let (qv, kv, vv) = (bf(&mut r, t * h * k), bf(&mut r, t * h * k), bf(&mut r, t * hv * v));
    let gv = random(&mut r, t * hv, -0.5, -0.01);
    let betav = random(&mut r, t * hv, 0.1, 0.9);
    let state_vals = random(&mut r, slots * hv * v * k, -0.5, 0.5);
    let (table, has) = ([4i64, 1, -1, 2], [1i64, 0, 1, 1]);
    let tb = |vals: &[ssm_tensor::bf16], shape: &[usize]| Tensor::from_vec(vals.to_vec(), shape, &dev).unwrap();
    let t32 = |vals: &[f32], shape: &[usize]| Tensor::from_vec(vals.to_vec(), shape, &dev).unwrap();
    let (q, kk, vt) = (tb(&qv, &[1, t, h, k]), tb(&kv, &[1, t, h, k]), tb(&vv, &[1, t, hv, v]));
    let (g, beta) = (t32(&gv, &[1, t, hv]), t32(&betav, &[1, t, hv]));
    let state = t32(&state_vals, &[slots, hv, v, k]);
    let (idx, has_t, cu_t) =
        (Tensor::new(&table, &dev).unwrap(), Tensor::new(&has, &dev).unwrap(), Tensor::new(&cu, &dev).unwrap());
    let o = Tensor::zeros((1, t, hv, v), DType::F32, &dev).unwrap();
    let tensors = ssm_candle::GdnPrefillTensors {
        q: &q,
        k: &kk,
        v: &vt,
        g: &g,
        beta: &beta,
        initial_state: &state,
        initial_state_indices: &idx,
        has_initial_state: Some(&has_t),
        cu_seqlens: Some(&cu_t),
        o: &o,
    };
    ssm_candle::chunk_gated_delta_rule(&rt, tensors, None, Some(-1), true).unwrap();

    let (mut want_state, mut want_o) = (state_vals.clone(), vec![0f32; t * hv * v]);
    let args = ChunkGatedDeltaRuleArgs {
        initial_state: Some(TensorMut::from_slice(&mut want_state, &[slots, hv, v, k]).unwrap()),
        initial_state_indices: Some(TensorRef::from_slice(&table, &[n]).unwrap()),
        has_initial_state: Some(TensorRef::from_slice(&has, &[n]).unwrap()),
        pad_slot_id: Some(-1),
        inplace_final_state: true,
        cu_seqlens: Some(TensorRef::from_slice(&cu, &[n + 1]).unwrap()),
        use_qk_l2norm_in_kernel: true,
        ..ChunkGatedDeltaRuleArgs::new(
            TensorRef::from_slice(&qv, &[1, t, h, k]).unwrap(),
            TensorRef::from_slice(&kv, &[1, t, h, k]).unwrap(),
            TensorRef::from_slice(&vv, &[1, t, hv, v]).unwrap(),
            TensorRef::from_slice(&gv, &[1, t, hv]).unwrap(),
            TensorRef::from_slice(&betav, &[1, t, hv]).unwrap(),
            TensorMut::from_slice(&mut want_o, &[1, t, hv, v]).unwrap(),
        )
    };
    rt.chunk_gated_delta_rule(args).unwrap();
    assert_eq!(values(&state), want_state);
    assert_eq!(values(&o), want_o);
    let per = hv * v * k;
    for s in [0usize, 3, 5] {
        assert_eq!(values(&state)[s * per..(s + 1) * per], state_vals[s * per..(s + 1) * per], "slot {s} untouched");
    }
    assert_ne!(values(&state)[per..2 * per], state_vals[per..2 * per], "slot 1 (started from zeros) written");
    // The pad's tokens (70..75) are not written.
    assert!(values(&o)[70 * hv * v..75 * hv * v].iter().all(|&x| x == 0.0));
}
