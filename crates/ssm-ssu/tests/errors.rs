//! Every malformed-argument class gets a typed error naming the argument, the expected and
//! the actual value; messages are pinned here. A failed call writes nothing.

use ssm_ssu::{SelectiveStateUpdateArgs, SsuAlgorithm, StochasticRounding};
use ssm_tensor::{DType, HostTensor, TensorRef};

/// A valid Mamba2 decode call: 3 sequences, 4 heads, 2 groups, dim 8, dstate 16, 6 slots.
struct Base {
    state: HostTensor,
    x: HostTensor,
    dt: HostTensor,
    a: HostTensor,
    b: HostTensor,
    c: HostTensor,
    d: HostTensor,
    dt_bias: HostTensor,
    out: HostTensor,
    sbi: HostTensor,
    sbi2: HostTensor,
    nacc: HostTensor,
    cu: HostTensor,
}

fn f(dtype: DType, shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_f32(dtype, shape.to_vec(), &(0..n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect::<Vec<_>>())
}

fn base() -> Base {
    Base {
        state: f(DType::F32, &[6, 4, 8, 16]),
        x: f(DType::BF16, &[3, 4, 8]),
        dt: f(DType::BF16, &[3, 4, 1]),
        a: HostTensor::from_f32(DType::F32, vec![4, 1, 1], &[-1.0, -2.0, -0.5, -1.5]),
        b: f(DType::BF16, &[3, 2, 16]),
        c: f(DType::BF16, &[3, 2, 16]),
        d: f(DType::F32, &[4, 1]),
        dt_bias: f(DType::F32, &[4, 1]),
        out: HostTensor::filled(DType::BF16, vec![3, 4, 8], f32::NAN),
        sbi: HostTensor::from_i64(DType::I32, vec![3], &[1, 2, 3]),
        sbi2: HostTensor::from_i64(DType::I32, vec![3, 2], &[1, 4, 2, 5, 3, 0]),
        nacc: HostTensor::from_i64(DType::I32, vec![3], &[1, 2, 1]),
        cu: HostTensor::from_i64(DType::I32, vec![4], &[0, 1, 2, 3]),
    }
}

impl Base {
    fn args(&mut self) -> SelectiveStateUpdateArgs<'_> {
        SelectiveStateUpdateArgs {
            d: Some(self.d.view().expand(&[4, 8]).unwrap()),
            dt_bias: Some(self.dt_bias.view().expand(&[4, 8]).unwrap()),
            dt_softplus: true,
            state_batch_indices: Some(self.sbi.view()),
            pad_slot_id: Some(0),
            ..SelectiveStateUpdateArgs::new(
                self.state.view_mut(),
                self.x.view(),
                self.dt.view().expand(&[3, 4, 8]).unwrap(),
                self.a.view().expand(&[4, 8, 16]).unwrap(),
                self.b.view(),
                self.c.view(),
                self.out.view_mut(),
            )
        }
    }
}

/// Plans `edit(args)` and returns the error message; the base call itself must plan.
fn err(edit: impl for<'a> FnOnce(&mut SelectiveStateUpdateArgs<'a>, &'a Base)) -> String {
    let mut owned = base();
    let extra = base();
    let before = owned.state.clone();
    let msg = {
        let mut args = owned.args();
        // SAFETY-free trick: `extra` lives as long as `args`' borrows need.
        let extra: &Base = Box::leak(Box::new(extra));
        edit(&mut args, extra);
        match ssm_tensor::Op::plan(&args) {
            Ok(p) => panic!("expected an error, got a plan: {p:?}"),
            Err(e) => e.to_string(),
        }
    };
    assert_eq!(owned.state, before, "a refused call must not write the state");
    msg
}

fn t<'a>(h: &'a HostTensor) -> TensorRef<'a> {
    h.view()
}

#[test]
fn base_call_plans() {
    let mut b = base();
    ssm_tensor::Op::plan(&b.args()).unwrap();
}

#[test]
fn wrong_rank() {
    let bad = Box::leak(Box::new(f(DType::F32, &[6, 4, 8, 16, 1])));
    insta::assert_snapshot!("state_rank", err(|a, _| a.state = bad.view_mut()));
    let r1 = Box::leak(Box::new(f(DType::F32, &[4])));
    insta::assert_snapshot!("x_rank", err(|a, _| a.x = t(r1)));
    insta::assert_snapshot!("a_rank", err(|a, _| a.a = t(r1)));
}

#[test]
fn mismatched_sizes() {
    let x_bad = Box::leak(Box::new(f(DType::BF16, &[3, 5, 8])));
    insta::assert_snapshot!("x_heads", err(|a, _| a.x = t(x_bad)));
    let b_bad = Box::leak(Box::new(f(DType::BF16, &[3, 2, 12])));
    insta::assert_snapshot!("b_dstate", err(|a, _| a.b = t(b_bad)));
    let c_bad = Box::leak(Box::new(f(DType::BF16, &[3, 1, 16])));
    insta::assert_snapshot!("c_groups", err(|a, _| a.c = t(c_bad)));
    let b3 = Box::leak(Box::new(f(DType::BF16, &[3, 3, 16])));
    let c3 = Box::leak(Box::new(f(DType::BF16, &[3, 3, 16])));
    insta::assert_snapshot!(
        "heads_not_divisible",
        err(|a, _| {
            a.b = t(b3);
            a.c = t(c3);
        })
    );
    let a_bad = Box::leak(Box::new(f(DType::F32, &[4, 8, 15])));
    insta::assert_snapshot!("a_shape", err(|a, _| a.a = t(a_bad)));
    let d_bad = Box::leak(Box::new(f(DType::F32, &[3, 8])));
    insta::assert_snapshot!("d_shape", err(|a, _| a.d = Some(t(d_bad))));
    let dt_bad = Box::leak(Box::new(f(DType::BF16, &[2, 4, 8])));
    insta::assert_snapshot!("dt_rows", err(|a, _| a.dt = t(dt_bad)));
    let z_bad = Box::leak(Box::new(f(DType::BF16, &[3, 4, 9])));
    insta::assert_snapshot!("z_dim", err(|a, _| a.z = Some(t(z_bad))));
}

#[test]
fn wrong_dtypes() {
    insta::assert_snapshot!("x_int", err(|a, e| a.x = e.sbi.view()));
    let idx = Box::leak(Box::new(f(DType::F32, &[3])));
    insta::assert_snapshot!("indices_float", err(|a, _| a.state_batch_indices = Some(t(idx))));
    let st = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![6, 4, 8, 16], &vec![0; 6 * 4 * 8 * 16])));
    insta::assert_snapshot!("state_int", err(|a, _| a.state = st.view_mut()));
    insta::assert_snapshot!(
        "sr_needs_f16",
        err(|a, _| a.stochastic_rounding = Some(StochasticRounding { seed: 1, philox_rounds: 10 }))
    );
}

#[test]
fn layout_requirements() {
    // state with dstate not contiguous: a transposed view of the last two axes.
    let st = Box::leak(Box::new(f(DType::F32, &[6, 4, 16, 8])));
    insta::assert_snapshot!(
        "state_not_contiguous",
        err(|a, _| a.state = st.view_mut().with_layout(&[6, 4, 8, 16], &[512, 128, 1, 8], 0).unwrap())
    );
    let o = Box::leak(Box::new(f(DType::BF16, &[4, 8])));
    insta::assert_snapshot!(
        "out_overlapping",
        err(|a, _| a.out = o.view_mut().with_layout(&[3, 4, 8], &[0, 8, 1], 0).unwrap())
    );
}

#[test]
fn varlen_and_speculative_arguments() {
    let cu2 = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![2, 2], &[0, 1, 2, 3])));
    insta::assert_snapshot!("cu_seqlens_not_1d", err(|a, _| a.cu_seqlens = Some(t(cu2))));
    let cu_long = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![5], &[0, 1, 2, 3, 3])));
    insta::assert_snapshot!("cu_seqlens_too_long_for_table", err(|a, _| a.cu_seqlens = Some(t(cu_long))));
    let cu_dec = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![4], &[0, 2, 1, 3])));
    insta::assert_snapshot!("cu_seqlens_not_monotone", err(|a, _| a.cu_seqlens = Some(t(cu_dec))));
    let cu_over = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![4], &[0, 1, 2, 4])));
    insta::assert_snapshot!("cu_seqlens_past_rows", err(|a, _| a.cu_seqlens = Some(t(cu_over))));
    insta::assert_snapshot!(
        "nacc_without_indices",
        err(|a, e| {
            a.state_batch_indices = None;
            a.num_accepted_tokens = Some(e.nacc.view());
        })
    );
    insta::assert_snapshot!("nacc_with_1d_table", err(|a, e| a.num_accepted_tokens = Some(e.nacc.view())));
    insta::assert_snapshot!(
        "nacc_with_1d_dst",
        err(|a, e| {
            a.state_batch_indices = Some(e.sbi2.view());
            a.dst_state_batch_indices = Some(e.sbi.view());
            a.num_accepted_tokens = Some(e.nacc.view());
        })
    );
    let nacc_far = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![3], &[1, 3, 1])));
    insta::assert_snapshot!(
        "nacc_past_table",
        err(|a, e| {
            a.state_batch_indices = Some(e.sbi2.view());
            a.num_accepted_tokens = Some(t(nacc_far));
        })
    );
    insta::assert_snapshot!(
        "dst_without_src",
        err(|a, e| {
            a.state_batch_indices = None;
            a.dst_state_batch_indices = Some(e.sbi.view());
        })
    );
    let short = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![2], &[1, 2])));
    insta::assert_snapshot!("table_too_short", err(|a, _| a.state_batch_indices = Some(t(short))));
    let x4 = Box::leak(Box::new(f(DType::BF16, &[3, 1, 4, 8])));
    insta::assert_snapshot!(
        "dense_with_cu_seqlens",
        err(|a, e| {
            a.x = t(x4);
            a.cu_seqlens = Some(e.cu.view());
        })
    );
}

#[test]
fn host_indices_out_of_range() {
    let bad = Box::leak(Box::new(HostTensor::from_i64(DType::I64, vec![3], &[1, 6, 3])));
    insta::assert_snapshot!("index_past_pool", err(|a, _| a.state_batch_indices = Some(t(bad))));
    let neg = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![3], &[1, -1, 3])));
    insta::assert_snapshot!("negative_index_pad_zero", err(|a, _| a.state_batch_indices = Some(t(neg))));
    let dst_bad = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![3], &[4, 99, 5])));
    insta::assert_snapshot!("dst_index_past_pool", err(|a, _| a.dst_state_batch_indices = Some(t(dst_bad))));
    insta::assert_snapshot!(
        "no_pad_value",
        err(|a, _| {
            a.pad_slot_id = None;
            a.state_batch_indices = Some(t(neg));
        })
    );
}

/// One rule for every family: a slot written by one sequence is read or written by no other
/// sequence of the call (pads excepted), so a host table that aliases is refused.
#[test]
fn aliasing_tables_are_refused() {
    let shared = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![3], &[1, 2, 1])));
    insta::assert_snapshot!("slot_shared", err(|a, _| a.state_batch_indices = Some(t(shared))));
    let dst = Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![3], &[4, 3, 5])));
    insta::assert_snapshot!("slot_written_and_read", err(|a, _| a.dst_state_batch_indices = Some(t(dst))));
    // Pads are not slots: two padded sequences do not alias, and a sequence may update its own slot.
    let pads = HostTensor::from_i64(DType::I32, vec![3], &[0, 2, 0]);
    let mut b = base();
    let mut args = b.args();
    args.state_batch_indices = Some(pads.view());
    ssm_ssu::plan(args).unwrap();
}

#[test]
fn device_mismatch() {
    // SAFETY: the device view is planned only, never dereferenced.
    let dev = unsafe {
        TensorRef::from_device_ptr(0x1000, 96, DType::BF16, ssm_tensor::Device::Cuda(0), &[3, 4, 8], &[32, 8, 1])
    }
    .unwrap();
    insta::assert_snapshot!("x_on_device", err(|a, _| a.x = dev));
}

#[test]
fn unknown_algorithm() {
    let e = "fastest".parse::<SsuAlgorithm>().unwrap_err();
    insta::assert_snapshot!("unknown_algorithm", e.to_string());
    assert_eq!("horizontal".parse::<SsuAlgorithm>().unwrap(), SsuAlgorithm::Horizontal);
}

/// FlashInfer's verification arguments: `disable_state_update`, `intermediate_states_buffer`
/// and `intermediate_state_indices`. Entries are checked like slots (range, pad, aliasing).
#[test]
fn verification_arguments() {
    fn buf(dtype: DType, shape: &[usize]) -> ssm_tensor::TensorMut<'static> {
        Box::leak(Box::new(HostTensor::filled(dtype, shape.to_vec(), f32::NAN))).view_mut()
    }
    fn ints(v: &[i64]) -> TensorRef<'static> {
        Box::leak(Box::new(HostTensor::from_i64(DType::I32, vec![v.len()], v))).view()
    }
    let ok = [6, 1, 4, 8, 16];
    insta::assert_snapshot!(
        "disable_update_with_dst",
        err(|a, _| {
            a.disable_state_update = true;
            a.dst_state_batch_indices = Some(ints(&[4, 5, 2]));
        })
    );
    insta::assert_snapshot!(
        "buffer_with_dst",
        err(|a, _| {
            a.intermediate_states_buffer = Some(buf(DType::F32, &ok));
            a.dst_state_batch_indices = Some(ints(&[4, 5, 2]));
        })
    );
    insta::assert_snapshot!(
        "buffer_with_stochastic_rounding",
        err(|a, _| {
            a.state = buf(DType::F16, &[6, 4, 8, 16]);
            a.intermediate_states_buffer = Some(buf(DType::F16, &ok));
            a.stochastic_rounding = Some(StochasticRounding { seed: 1, philox_rounds: 0 });
        })
    );
    insta::assert_snapshot!("buffer_dtype", err(|a, _| a.intermediate_states_buffer = Some(buf(DType::BF16, &ok))));
    insta::assert_snapshot!(
        "buffer_rank",
        err(|a, _| a.intermediate_states_buffer = Some(buf(DType::F32, &[6, 4, 8, 16])))
    );
    insta::assert_snapshot!(
        "buffer_shape",
        err(|a, _| a.intermediate_states_buffer = Some(buf(DType::F32, &[6, 1, 4, 7, 16])))
    );
    insta::assert_snapshot!(
        "buffer_no_steps",
        err(|a, _| a.intermediate_states_buffer = Some(buf(DType::F32, &[6, 0, 4, 8, 16])))
    );
    insta::assert_snapshot!(
        "indices_without_buffer",
        err(|a, _| a.intermediate_state_indices = Some(ints(&[0, 1, 2])))
    );
    insta::assert_snapshot!(
        "indices_too_short",
        err(|a, _| {
            a.intermediate_states_buffer = Some(buf(DType::F32, &ok));
            a.intermediate_state_indices = Some(ints(&[0, 1]));
        })
    );
    insta::assert_snapshot!(
        "entry_past_buffer",
        err(|a, _| {
            a.intermediate_states_buffer = Some(buf(DType::F32, &[4, 1, 4, 8, 16]));
            a.intermediate_state_indices = Some(ints(&[1, 9, 2]));
        })
    );
    // Without indices the entry is the source slot (here 3, past a buffer of 3 entries).
    insta::assert_snapshot!(
        "source_slot_past_buffer",
        err(|a, _| a.intermediate_states_buffer = Some(buf(DType::F32, &[3, 1, 4, 8, 16])))
    );
    insta::assert_snapshot!(
        "entry_shared",
        err(|a, _| {
            a.intermediate_states_buffer = Some(buf(DType::F32, &ok));
            a.intermediate_state_indices = Some(ints(&[2, 5, 2]));
        })
    );
    insta::assert_snapshot!(
        "sequence_longer_than_buffer",
        err(|a, e| {
            a.intermediate_states_buffer = Some(buf(DType::F32, &ok));
            a.cu_seqlens = Some(ints(&[0, 0, 3, 3]));
            let _ = e;
        })
    );
    // Pad entries write nothing and may repeat; a verifying call may reuse one source slot.
    let mut b = base();
    let mut args = b.args();
    args.intermediate_states_buffer = Some(buf(DType::F32, &ok));
    args.intermediate_state_indices = Some(ints(&[0, 3, 0]));
    ssm_ssu::plan(args).unwrap();
    let mut b = base();
    let mut args = b.args();
    args.disable_state_update = true;
    args.state_batch_indices = Some(ints(&[1, 1, 1]));
    ssm_ssu::plan(args).unwrap();
}

/// FlashInfer's `rand_seed`: one i64 element, only with stochastic rounding.
#[test]
fn rand_seed_arguments() {
    fn seed(dtype: DType, shape: &[usize]) -> TensorRef<'static> {
        let n = shape.iter().product();
        Box::leak(Box::new(HostTensor::from_i64(dtype, shape.to_vec(), &vec![7; n]))).view()
    }
    insta::assert_snapshot!("rand_seed_without_rounding", err(|a, _| a.rand_seed = Some(seed(DType::I64, &[1]))));
    let sr = |a: &mut SelectiveStateUpdateArgs<'_>| {
        a.state = Box::leak(Box::new(HostTensor::filled(DType::F16, vec![6, 4, 8, 16], 0.0))).view_mut();
        a.stochastic_rounding = Some(StochasticRounding { seed: 1, philox_rounds: 0 });
    };
    insta::assert_snapshot!(
        "rand_seed_dtype",
        err(|a, _| {
            sr(a);
            a.rand_seed = Some(seed(DType::I32, &[1]));
        })
    );
    insta::assert_snapshot!(
        "rand_seed_shape",
        err(|a, _| {
            sr(a);
            a.rand_seed = Some(seed(DType::I64, &[2]));
        })
    );
    let mut b = base();
    let mut args = b.args();
    sr(&mut args);
    args.rand_seed = Some(seed(DType::I64, &[]));
    ssm_ssu::plan(args).unwrap();
}

/// Block-scaled integer states (FlashInfer's int16, and i8): `state_scale` exactly with an
/// i16 / i8 state, f32, one scale per row; `intermediate_state_scales` exactly with an integer
/// buffer; no stochastic rounding with it.
#[test]
fn int16_state_arguments() {
    fn buf(dtype: DType, shape: &[usize]) -> ssm_tensor::TensorMut<'static> {
        Box::leak(Box::new(HostTensor::filled(dtype, shape.to_vec(), 0.0))).view_mut()
    }
    fn scales(shape: &[usize]) -> ssm_tensor::TensorMut<'static> {
        Box::leak(Box::new(HostTensor::filled(DType::F32, shape.to_vec(), 1.0))).view_mut()
    }
    let i16_state = |a: &mut SelectiveStateUpdateArgs<'_>| a.state = buf(DType::I16, &[6, 4, 8, 16]);
    insta::assert_snapshot!("i16_without_scale", err(|a, _| i16_state(a)));
    insta::assert_snapshot!("scale_with_float_state", err(|a, _| a.state_scale = Some(scales(&[6, 4, 8]))));
    insta::assert_snapshot!(
        "scale_dtype",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(buf(DType::BF16, &[6, 4, 8]));
        })
    );
    insta::assert_snapshot!(
        "scale_shape",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(scales(&[6, 4, 7]));
        })
    );
    insta::assert_snapshot!(
        "scale_rank",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(scales(&[6, 32]));
        })
    );
    insta::assert_snapshot!(
        "scale_with_rounding",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(scales(&[6, 4, 8]));
            a.stochastic_rounding = Some(StochasticRounding { seed: 1, philox_rounds: 0 });
        })
    );
    let ok = [6, 1, 4, 8, 16];
    insta::assert_snapshot!(
        "i16_buffer_without_scales",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(scales(&[6, 4, 8, 1]));
            a.intermediate_states_buffer = Some(buf(DType::I16, &ok));
        })
    );
    insta::assert_snapshot!(
        "buffer_scales_shape",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(scales(&[6, 4, 8]));
            a.intermediate_states_buffer = Some(buf(DType::I16, &ok));
            a.intermediate_state_scales = Some(scales(&[6, 2, 4, 8]));
        })
    );
    insta::assert_snapshot!(
        "buffer_scales_with_float_buffer",
        err(|a, _| {
            a.intermediate_states_buffer = Some(buf(DType::F32, &ok));
            a.intermediate_state_scales = Some(scales(&[6, 1, 4, 8]));
        })
    );
    insta::assert_snapshot!(
        "buffer_scales_without_buffer",
        err(|a, _| a.intermediate_state_scales = Some(scales(&[6, 1, 4, 8])))
    );
    let i8_state = |a: &mut SelectiveStateUpdateArgs<'_>| a.state = buf(DType::I8, &[6, 4, 8, 16]);
    insta::assert_snapshot!("i8_without_scale", err(|a, _| i8_state(a)));
    insta::assert_snapshot!(
        "i8_buffer_without_scales",
        err(|a, _| {
            i8_state(a);
            a.state_scale = Some(scales(&[6, 4, 8]));
            a.intermediate_states_buffer = Some(buf(DType::I8, &ok));
        })
    );
    insta::assert_snapshot!(
        "i8_buffer_with_i16_state",
        err(|a, _| {
            i16_state(a);
            a.state_scale = Some(scales(&[6, 4, 8]));
            a.intermediate_states_buffer = Some(buf(DType::I8, &ok));
            a.intermediate_state_scales = Some(scales(&[6, 1, 4, 8]));
        })
    );
    // Accepted: scales with or without a trailing axis of 1, and a scaled buffer.
    for (dtype, set) in [(DType::I16, &i16_state as &dyn Fn(&mut SelectiveStateUpdateArgs<'_>)), (DType::I8, &i8_state)]
    {
        let mut b = base();
        let mut args = b.args();
        set(&mut args);
        args.state_scale = Some(scales(&[6, 4, 8, 1]));
        args.intermediate_states_buffer = Some(buf(dtype, &ok));
        args.intermediate_state_scales = Some(scales(&[6, 1, 4, 8]));
        ssm_ssu::plan(args).unwrap();
    }
}
