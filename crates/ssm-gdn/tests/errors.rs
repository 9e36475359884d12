//! Every malformed-input class is refused by the plan with a typed error naming the argument,
//! what was expected and what came (messages pinned by insta snapshots), and nothing is written.

mod common;

use common::{ChunkCase, GatingCase, Gen, RecCase, ints, nan, zeros};
use ssm_gdn::{GdnError, StateLayout};
use ssm_tensor::{DType, Device, HostTensor, TensorMut, TensorRef};

/// A valid call: two sequences of 1 and 2 tokens, H=2, HV=4, K=8, V=4 (K ≠ V), 5 slots.
fn base() -> RecCase {
    let mut g = Gen::new(7);
    RecCase {
        q: g.normal_buf(DType::BF16, &[1, 3, 2, 8], 1.0),
        k: g.normal_buf(DType::BF16, &[1, 3, 2, 8], 1.0),
        v: g.normal_buf(DType::BF16, &[1, 3, 4, 4], 1.0),
        g: g.range_buf(DType::F32, &[1, 3, 4], -1.0, -0.01),
        beta: Some(g.range_buf(DType::F32, &[1, 3, 4], 0.1, 0.9)),
        state: Some(g.normal_buf(DType::F32, &[5, 4, 4, 8], 0.5)),
        final_state: None,
        cu: Some(ints(DType::I32, &[3], &[0, 1, 3])),
        ix: Some(ints(DType::I32, &[2], &[3, 1])),
        na: None,
        o: nan(DType::BF16, &[1, 3, 4, 4]),
        scale: None,
        l2norm: true,
        layout: StateLayout::VK,
    }
}

fn plan_err(case: &mut RecCase) -> GdnError {
    let args = case.args();
    ssm_tensor::Op::plan(&args).expect_err("the plan must refuse this call")
}

#[test]
fn base_case_is_valid() {
    let mut c = base();
    assert!(ssm_tensor::Op::plan(&c.args()).is_ok());
}

#[test]
fn recurrent_shape_errors() {
    let mut c = base();
    c.q = nan(DType::BF16, &[3, 2, 8]);
    insta::assert_snapshot!("q_rank", plan_err(&mut c));

    let mut c = base();
    c.k = nan(DType::BF16, &[1, 3, 2, 16]);
    insta::assert_snapshot!("k_mismatch", plan_err(&mut c));

    let mut c = base();
    c.v = nan(DType::BF16, &[1, 3, 3, 4]);
    insta::assert_snapshot!("hv_not_multiple_of_h", plan_err(&mut c));

    let mut c = base();
    c.g = nan(DType::F32, &[1, 3, 2]);
    insta::assert_snapshot!("g_shape", plan_err(&mut c));

    let mut c = base();
    c.beta = Some(nan(DType::F32, &[1, 3, 4, 2]));
    insta::assert_snapshot!("beta_shape", plan_err(&mut c));

    let mut c = base();
    c.o = nan(DType::BF16, &[1, 3, 4, 8]);
    insta::assert_snapshot!("o_shape", plan_err(&mut c));

    let mut c = base();
    c.q = nan(DType::BF16, &[1, 3, 2, 2000]);
    c.k = nan(DType::BF16, &[1, 3, 2, 2000]);
    insta::assert_snapshot!("head_k_dim_too_large", plan_err(&mut c));

    let mut c = base();
    c.q = nan(DType::BF16, &[2, 3, 2, 8]);
    c.k = nan(DType::BF16, &[2, 3, 2, 8]);
    c.v = nan(DType::BF16, &[2, 3, 4, 4]);
    c.o = nan(DType::BF16, &[2, 3, 4, 4]);
    c.g = nan(DType::F32, &[2, 3, 4]);
    c.beta = None;
    insta::assert_snapshot!("cu_seqlens_needs_batch_1", plan_err(&mut c));
}

#[test]
fn state_layout_errors() {
    // K and V swapped: a [slots, HV, K, V] pool passed as [slots, HV, V, K].
    let mut c = base();
    c.state = Some(nan(DType::F32, &[5, 4, 8, 4]));
    insta::assert_snapshot!("state_kv_mismatch_vk", plan_err(&mut c));

    let mut c = base();
    c.layout = StateLayout::KV;
    insta::assert_snapshot!("state_kv_mismatch_kv", plan_err(&mut c));

    let mut c = base();
    c.state = Some(nan(DType::F32, &[5, 4, 32]));
    insta::assert_snapshot!("state_rank", plan_err(&mut c));

    let mut c = base();
    c.ix = None;
    c.final_state = Some(nan(DType::F32, &[2, 4, 4, 8]));
    insta::assert_snapshot!("final_state_rows", plan_err(&mut c));

    // Slots laid out with the value rows strided (a transposed view of a [.., K, V] buffer).
    let mut c = base();
    let err = {
        let mut args = c.args();
        let st = args.rule.initial_state.take().unwrap();
        args.rule.initial_state = Some(st.with_layout(&[5, 4, 4, 8], &[128, 32, 1, 4], 0).unwrap());
        ssm_tensor::Op::plan(&args).unwrap_err()
    };
    insta::assert_snapshot!("state_strides", err);
}

#[test]
fn dtype_and_device_errors() {
    let mut c = base();
    c.q = zeros(DType::I32, &[1, 3, 2, 8]);
    insta::assert_snapshot!("q_dtype", plan_err(&mut c));

    let mut c = base();
    c.state = Some(zeros(DType::I64, &[5, 4, 4, 8]));
    insta::assert_snapshot!("state_dtype", plan_err(&mut c));

    let mut c = base();
    c.ix = Some(HostTensor::from_f32(DType::F32, vec![2], &[3.0, 1.0]));
    insta::assert_snapshot!("indices_dtype", plan_err(&mut c));

    let mut c = base();
    let err = {
        let mut args = c.args();
        // SAFETY: the view is never dereferenced; the plan only reads its metadata.
        args.g =
            unsafe { TensorRef::from_device_ptr(0x1000, 12, DType::F32, Device::Cuda(0), &[1, 3, 4], &[12, 4, 1]) }
                .unwrap();
        ssm_tensor::Op::plan(&args).unwrap_err()
    };
    insta::assert_snapshot!("device_mismatch", err);
}

#[test]
fn index_errors() {
    let mut c = base();
    c.cu = Some(ints(DType::I32, &[3], &[0, 2, 1]));
    insta::assert_snapshot!("cu_seqlens_not_monotone", plan_err(&mut c));

    let mut c = base();
    c.cu = Some(ints(DType::I64, &[3], &[0, 1, 4]));
    insta::assert_snapshot!("cu_seqlens_past_end", plan_err(&mut c));

    let mut c = base();
    c.ix = Some(ints(DType::I32, &[2], &[3, 5]));
    insta::assert_snapshot!("index_out_of_range", plan_err(&mut c));

    let mut c = base();
    c.ix = Some(ints(DType::I32, &[2], &[2, 2]));
    insta::assert_snapshot!("slot_conflict", plan_err(&mut c));

    let mut c = base();
    c.ix = Some(ints(DType::I32, &[2, 1], &[3, 1]));
    insta::assert_snapshot!("too_many_tokens_for_columns", plan_err(&mut c));

    let mut c = base();
    c.na = Some(ints(DType::I32, &[2], &[1, 1]));
    insta::assert_snapshot!("num_accepted_needs_2d", plan_err(&mut c));

    let mut c = base();
    c.ix = Some(ints(DType::I32, &[1], &[3]));
    insta::assert_snapshot!("indices_too_few_rows", plan_err(&mut c));
}

#[test]
fn scalar_and_overlap_errors() {
    let mut c = base();
    c.scale = Some(-1.0);
    insta::assert_snapshot!("scale_not_positive", plan_err(&mut c));

    let mut c = base();
    let err = {
        let mut args = c.args();
        let o = std::mem::replace(&mut args.rule.o, TensorMut::from_slice::<f32>(&mut [], &[0]).unwrap());
        args.rule.o = o.with_layout(&[1, 3, 4, 4], &[0, 4, 0, 1], 0).unwrap();
        ssm_tensor::Op::plan(&args).unwrap_err()
    };
    insta::assert_snapshot!("o_overlapping", err);
}

/// Gating inputs of 3 tokens, HV = 4 (every value NaN: only the checks run).
fn gating() -> GatingCase {
    GatingCase {
        a_log: nan(DType::F32, &[4]),
        a: nan(DType::BF16, &[3, 4]),
        b: nan(DType::BF16, &[3, 4]),
        dt_bias: nan(DType::BF16, &[4]),
    }
}

#[test]
fn gating_errors() {
    let gating = gating();
    let (mut g, mut beta) = (nan(DType::BF16, &[1, 3, 4]), nan(DType::BF16, &[1, 3, 4]));
    insta::assert_snapshot!("gating_g_dtype", ssm_tensor::Op::plan(&gating.args(&mut g, &mut beta)).unwrap_err());

    let (mut g, mut beta) = (nan(DType::F32, &[1, 3, 4]), nan(DType::BF16, &[3, 3, 4]));
    let err = ssm_tensor::Op::plan(&gating.args(&mut g, &mut beta)).unwrap_err();
    insta::assert_snapshot!("gating_beta_output_shape", err);
}

#[test]
fn sigmoid_gating_errors() {
    let mut c = base();
    let gating = GatingCase { a: nan(DType::BF16, &[3, 2]), ..gating() };
    let args = gating.sigmoid_args(c.args());
    insta::assert_snapshot!("sigmoid_a_shape", ssm_tensor::Op::plan(&args).unwrap_err());
}

fn chunk_base() -> ChunkCase {
    let mut g = Gen::new(11);
    ChunkCase {
        q: g.normal_buf(DType::BF16, &[1, 5, 1, 8], 1.0),
        k: g.normal_buf(DType::BF16, &[1, 5, 1, 8], 1.0),
        v: g.normal_buf(DType::BF16, &[1, 5, 2, 4], 1.0),
        g: g.range_buf(DType::F32, &[1, 5, 2], -1.0, -0.01),
        beta: g.range_buf(DType::BF16, &[1, 5, 2], 0.1, 0.9),
        state: Some(g.normal_buf(DType::F32, &[4, 2, 4, 8], 0.5)),
        indices: Some(ints(DType::I32, &[2], &[2, 3])),
        has_initial_state: Some(ints(DType::Bool, &[2], &[1, 0])),
        pad_slot_id: Some(-1),
        inplace: true,
        final_state: None,
        cu: Some(ints(DType::I32, &[3], &[0, 2, 5])),
        o: nan(DType::BF16, &[1, 5, 2, 4]),
        scratch: None,
        layout: StateLayout::VK,
    }
}

fn chunk_err(c: &mut ChunkCase) -> GdnError {
    ssm_tensor::Op::plan(&c.args()).expect_err("the plan must refuse this call")
}

#[test]
fn chunk_errors() {
    let mut c = chunk_base();
    assert!(ssm_tensor::Op::plan(&c.args()).is_ok());

    let mut c = chunk_base();
    c.indices = Some(ints(DType::I32, &[2], &[2, 4]));
    insta::assert_snapshot!("chunk_index_out_of_range", chunk_err(&mut c));

    let mut c = chunk_base();
    c.indices = Some(ints(DType::I32, &[2], &[3, 3]));
    insta::assert_snapshot!("chunk_slot_conflict", chunk_err(&mut c));

    let mut c = chunk_base();
    c.state = None;
    c.indices = None;
    insta::assert_snapshot!("chunk_inplace_needs_state", chunk_err(&mut c));

    let mut c = chunk_base();
    c.state = None;
    c.indices = None;
    c.inplace = false;
    insta::assert_snapshot!("chunk_has_initial_state_needs_state", chunk_err(&mut c));

    let mut c = chunk_base();
    c.cu = Some(ints(DType::I32, &[3], &[0, 3, 2]));
    insta::assert_snapshot!("chunk_cu_seqlens_not_monotone", chunk_err(&mut c));

    let mut c = chunk_base();
    c.layout = StateLayout::KV;
    insta::assert_snapshot!("chunk_state_layout", chunk_err(&mut c));

    let mut c = chunk_base();
    c.scratch = Some(nan(DType::BF16, &[64]));
    insta::assert_snapshot!("chunk_scratch_dtype", chunk_err(&mut c));
}

#[test]
fn nothing_is_written_on_failure() {
    let cpu = ssm_cpu::CpuBackend::new(ssm_cpu::Par::Seq).unwrap();
    let mut c = base();
    c.ix = Some(ints(DType::I32, &[2], &[2, 2]));
    let before = c.clone();
    let err = c.run(&cpu).unwrap_err();
    assert!(err.contains("state slot 2"), "{err}");
    assert_eq!(c.state.as_ref().unwrap().bytes(), before.state.as_ref().unwrap().bytes());
    assert_eq!(c.o.bytes(), before.o.bytes());

    let mut c = chunk_base();
    c.indices = Some(ints(DType::I32, &[2], &[2, 9]));
    let before = c.clone();
    assert!(c.run(&cpu).is_err());
    assert_eq!(c.state.as_ref().unwrap().bytes(), before.state.as_ref().unwrap().bytes());
    assert_eq!(c.o.bytes(), before.o.bytes());
}
