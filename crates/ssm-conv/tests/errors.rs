//! Every class of malformed call gets a typed error naming the argument, the expected and
//! the actual value; the messages are pinned by snapshots. `plan_*` takes the arguments by
//! shared reference, so a refused call cannot have written anything; the last test checks
//! that the buffers are untouched anyway.

use half::f16;
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvError, ConvStateLayout};
use ssm_tensor::{DType, Device, Element, TensorMut, TensorRef};

fn leak<T: Element>(v: Vec<T>) -> &'static mut [T] {
    Box::leak(v.into_boxed_slice())
}

fn r<T: Element>(v: Vec<T>, shape: &[usize]) -> TensorRef<'static> {
    TensorRef::from_slice(leak(v), shape).unwrap()
}

fn m<T: Element>(v: Vec<T>, shape: &[usize]) -> TensorMut<'static> {
    TensorMut::from_slice(leak(v), shape).unwrap()
}

/// A valid decode call: batch 3, dim 8, width 4, 6 slots of state_len 3, pad 0.
fn update() -> CausalConv1dUpdateArgs<'static> {
    CausalConv1dUpdateArgs {
        x: r(vec![0.5f32; 24], &[3, 8]),
        conv_state: m(vec![0.25f32; 6 * 8 * 3], &[6, 8, 3]),
        conv_state_layout: ConvStateLayout::DimStateLen,
        weight: r(vec![0.1f32; 32], &[8, 4]),
        bias: Some(r(vec![0.0f32; 8], &[8])),
        activation: Activation::Silu,
        conv_state_indices: Some(r(vec![1i32, 0, 4], &[3])),
        num_accepted_tokens: None,
        query_start_loc: None,
        pad_slot_id: Some(0),
        block_idx_last_scheduled_token: None,
        initial_state_idx: None,
        out: m(vec![0.0f32; 24], &[3, 8]),
    }
}

/// A valid speculative call: 3 sequences of 3, 2, 2 tokens, state_len 5 = width − 1 + 2.
fn spec_update() -> CausalConv1dUpdateArgs<'static> {
    CausalConv1dUpdateArgs {
        x: r(vec![0.5f32; 7 * 8], &[7, 8]),
        conv_state: m(vec![0.25f32; 6 * 5 * 8], &[6, 5, 8]),
        conv_state_layout: ConvStateLayout::StateLenDim,
        weight: r(vec![0.1f32; 32], &[8, 4]),
        bias: None,
        activation: Activation::None,
        conv_state_indices: Some(r(vec![1i32, 2, 3], &[3])),
        num_accepted_tokens: Some(r(vec![1i32, 2, 3], &[3])),
        query_start_loc: Some(r(vec![0i32, 3, 5, 7], &[4])),
        pad_slot_id: Some(0),
        block_idx_last_scheduled_token: None,
        initial_state_idx: None,
        out: m(vec![0.0f32; 7 * 8], &[7, 8]),
    }
}

/// A valid prefill: 3 sequences of 4, 0 and 3 tokens, dim 8, width 4, 5 slots.
fn prefill() -> CausalConv1dFnArgs<'static> {
    CausalConv1dFnArgs {
        x: r(vec![0.5f32; 7 * 8], &[7, 8]),
        weight: r(vec![0.1f32; 32], &[8, 4]),
        bias: None,
        conv_states: m(vec![0.25f32; 5 * 8 * 3], &[5, 8, 3]),
        conv_state_layout: ConvStateLayout::DimStateLen,
        query_start_loc: r(vec![0i32, 4, 4, 7], &[4]),
        cache_indices: Some(r(vec![2i32, 0, 3], &[3])),
        has_initial_state: Some(r(vec![1u8, 0, 0], &[3])),
        activation: Activation::Silu,
        pad_slot_id: Some(0),
        checkpoint_offsets: None,
        checkpoint_state_indices: None,
        out: m(vec![0.0f32; 7 * 8], &[7, 8]),
    }
}

fn err_update(a: &CausalConv1dUpdateArgs<'_>) -> String {
    match ssm_tensor::Op::plan(a) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn err_fn(a: &CausalConv1dFnArgs<'_>) -> String {
    match ssm_tensor::Op::plan(a) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn valid_calls_plan() {
    assert!(ssm_tensor::Op::plan(&update()).is_ok());
    assert!(ssm_tensor::Op::plan(&spec_update()).is_ok());
    let p = ssm_tensor::Op::plan(&prefill()).unwrap();
    // The empty sequence and the pad write nothing: only two sequences have work.
    assert_eq!(p.seqs.as_ref().unwrap().len(), 2);
}

#[test]
fn width_outside_2_to_4() {
    let mut a = update();
    a.weight = r(vec![0.1f32; 40], &[8, 5]);
    insta::assert_snapshot!("update_width_5", err_update(&a));
    let mut f = prefill();
    f.weight = r(vec![0.1f32; 8], &[8, 1]);
    insta::assert_snapshot!("fn_width_1", err_fn(&f));
}

#[test]
fn state_len_below_width_minus_one() {
    let mut a = update();
    a.conv_state = m(vec![0.0f32; 6 * 8 * 2], &[6, 8, 2]);
    insta::assert_snapshot!("update_state_len_2_width_4", err_update(&a));
    let mut f = prefill();
    f.conv_states = m(vec![0.0f32; 5 * 8], &[5, 8, 1]);
    insta::assert_snapshot!("fn_state_len_1_width_4", err_fn(&f));
}

#[test]
fn speculative_buffer_too_short() {
    let mut a = spec_update();
    a.conv_state = m(vec![0.0f32; 6 * 4 * 8], &[6, 4, 8]);
    insta::assert_snapshot!("update_spec_state_len_4_for_3_tokens", err_update(&a));
}

#[test]
fn wrong_layout_shape() {
    // A (slots, dim, state_len) buffer described as (slots, state_len, dim).
    let mut a = update();
    a.conv_state_layout = ConvStateLayout::StateLenDim;
    insta::assert_snapshot!("update_layout_mismatch", err_update(&a));
    let mut a = update();
    a.conv_state = m(vec![0.0f32; 6 * 8 * 3], &[6, 24]);
    insta::assert_snapshot!("update_state_rank_2", err_update(&a));
}

#[test]
fn query_starts_not_monotone() {
    let mut a = spec_update();
    a.query_start_loc = Some(r(vec![0i32, 3, 2, 7], &[4]));
    insta::assert_snapshot!("update_query_start_loc_decreasing", err_update(&a));
    let mut f = prefill();
    f.query_start_loc = r(vec![0i32, 4, 4, 9], &[4]);
    insta::assert_snapshot!("fn_query_start_loc_past_tokens", err_fn(&f));
    // A table shorter than the batch is refused; a wider one is accepted (vLLM's kernels read
    // the first `batch` entries, and vLLM's own tests pass padded tables).
    let mut f = prefill();
    f.query_start_loc = r(vec![0i32, 2, 4, 7, 9], &[5]);
    insta::assert_snapshot!("fn_query_start_loc_wrong_batch", err_fn(&f));
    let mut f = prefill();
    f.query_start_loc = r(vec![0i32, 4, 7], &[3]);
    assert!(ssm_tensor::Op::plan(&f).is_ok(), "a cache_indices table wider than the batch");
}

#[test]
fn host_index_out_of_range() {
    let mut a = update();
    a.conv_state_indices = Some(r(vec![1i32, 6, 4], &[3]));
    insta::assert_snapshot!("update_slot_past_pool", err_update(&a));
    let mut a = update();
    a.pad_slot_id = None;
    a.conv_state_indices = Some(r(vec![1i32, -1, 4], &[3]));
    insta::assert_snapshot!("update_negative_slot_no_pad", err_update(&a));
    let mut f = prefill();
    f.cache_indices = Some(r(vec![2i64, 0, -1], &[3]));
    insta::assert_snapshot!("fn_negative_slot_pad_0", err_fn(&f));
}

#[test]
fn accepted_counts_out_of_range() {
    let mut a = spec_update();
    a.num_accepted_tokens = Some(r(vec![1i32, 0, 3], &[3]));
    insta::assert_snapshot!("update_accepted_0", err_update(&a));
    let mut a = spec_update();
    a.num_accepted_tokens = Some(r(vec![1i32, 4, 3], &[3]));
    insta::assert_snapshot!("update_accepted_past_buffer", err_update(&a));
}

#[test]
fn slot_conflicts() {
    let mut a = update();
    a.conv_state_indices = Some(r(vec![4i32, 0, 4], &[3]));
    insta::assert_snapshot!("update_duplicate_slot", err_update(&a));
    let mut f = prefill();
    f.cache_indices = Some(r(vec![3i32, 1, 3], &[3]));
    insta::assert_snapshot!("fn_duplicate_slot", err_fn(&f));
    // Prefix caching: sequence 1 writes the slot sequence 0 reads.
    let mut a = update();
    a.conv_state_indices = Some(r(vec![1i32, 2, 3, 1, 5, 0], &[3, 2]));
    a.initial_state_idx = Some(r(vec![0i32, 0, 0], &[3]));
    a.block_idx_last_scheduled_token = Some(r(vec![1i32, 1, 1], &[3]));
    insta::assert_snapshot!("update_apc_write_read_conflict", err_update(&a));
}

#[test]
fn prefix_caching_tables() {
    let mut a = update();
    a.initial_state_idx = Some(r(vec![0i32, 0, 0], &[3]));
    insta::assert_snapshot!("update_apc_half_given", err_update(&a));
    let mut a = update();
    a.initial_state_idx = Some(r(vec![0i32, 0, 0], &[3]));
    a.block_idx_last_scheduled_token = Some(r(vec![1i32, 1, 1], &[3]));
    insta::assert_snapshot!("update_apc_needs_2d_table", err_update(&a));
    let mut a = update();
    a.conv_state_indices = Some(r(vec![1i32, 2, 3, 4, 5, 0], &[3, 2]));
    a.initial_state_idx = Some(r(vec![0i32, 0, 0], &[3]));
    a.block_idx_last_scheduled_token = Some(r(vec![1i32, 2, 1], &[3]));
    insta::assert_snapshot!("update_apc_column_out_of_range", err_update(&a));
}

#[test]
fn dtype_mismatches() {
    let mut a = update();
    a.weight = r(vec![f16::from_f32(0.1); 32], &[8, 4]);
    insta::assert_snapshot!("update_weight_f16_x_f32", err_update(&a));
    let mut a = update();
    a.x = r(vec![1i32; 24], &[3, 8]);
    insta::assert_snapshot!("update_x_int", err_update(&a));
    let mut a = update();
    a.conv_state_indices = Some(r(vec![1.0f32, 0.0, 4.0], &[3]));
    insta::assert_snapshot!("update_indices_f32", err_update(&a));
    let mut f = prefill();
    f.has_initial_state = Some(r(vec![1i32, 0, 0], &[3]));
    insta::assert_snapshot!("fn_has_initial_state_i32", err_fn(&f));
}

#[test]
fn shape_mismatches() {
    let mut a = update();
    a.out = m(vec![0.0f32; 16], &[2, 8]);
    insta::assert_snapshot!("update_out_shape", err_update(&a));
    let mut a = update();
    a.bias = Some(r(vec![0.0f32; 7], &[7]));
    insta::assert_snapshot!("update_bias_len", err_update(&a));
    let mut a = update();
    a.weight = r(vec![0.1f32; 36], &[9, 4]);
    insta::assert_snapshot!("update_weight_dim", err_update(&a));
    let mut a = update();
    a.conv_state_indices = Some(r(vec![1i32, 0], &[2]));
    insta::assert_snapshot!("update_indices_batch", err_update(&a));
    let mut a = update();
    a.x = r(vec![0.5f32; 48], &[1, 3, 2, 8]);
    insta::assert_snapshot!("update_x_rank_4", err_update(&a));
    let mut a = spec_update();
    a.x = r(vec![0.5f32; 7 * 8], &[1, 7, 8]);
    a.out = m(vec![0.0f32; 7 * 8], &[1, 7, 8]);
    insta::assert_snapshot!("update_varlen_x_rank_3", err_update(&a));
    let mut a = spec_update();
    a.num_accepted_tokens = Some(r(vec![1i32, 1], &[2]));
    insta::assert_snapshot!("update_accepted_len", err_update(&a));
    let mut f = prefill();
    f.x = r(vec![0.5f32; 7 * 8], &[8, 7]);
    insta::assert_snapshot!("fn_x_dim_mismatch", err_fn(&f));
}

#[test]
fn written_tensors_overlapping_themselves() {
    let mut a = update();
    a.conv_state = m(vec![0.0f32; 6 * 8 * 3], &[6 * 8 * 3]).with_layout(&[6, 8, 3], &[24, 1, 1], 0).unwrap();
    insta::assert_snapshot!("update_state_overlapping", err_update(&a));
    let mut f = prefill();
    f.out = m(vec![0.0f32; 7 * 8], &[7 * 8]).with_layout(&[7, 8], &[0, 1], 0).unwrap();
    insta::assert_snapshot!("fn_out_broadcast", err_fn(&f));
}

#[test]
fn device_mismatch() {
    let mut a = update();
    // SAFETY: the view is never dereferenced: the plan only compares devices.
    a.weight =
        unsafe { TensorRef::from_device_ptr(0x1000, 32, DType::F32, Device::Cuda(0), &[8, 4], &[4, 1]) }.unwrap();
    insta::assert_snapshot!("update_weight_on_device", err_update(&a));
}

#[test]
fn refused_calls_write_nothing() {
    let mut state = vec![0.25f32; 6 * 8 * 3];
    let mut out = vec![-7.0f32; 24];
    {
        let mut a = update();
        a.conv_state = TensorMut::from_slice(&mut state, &[6, 8, 3]).unwrap();
        a.out = TensorMut::from_slice(&mut out, &[3, 8]).unwrap();
        a.conv_state_indices = Some(r(vec![1i32, 9, 4], &[3]));
        assert!(matches!(ssm_tensor::Op::plan(&a), Err(ConvError::SlotOutOfRange { value: 9, .. })));
    }
    assert!(state.iter().all(|&v| v == 0.25));
    assert!(out.iter().all(|&v| v == -7.0));
}

/// `prefill()` with checkpoints: sequence 0 (slot 2, 4 tokens) after 2 tokens into slot 4,
/// sequence 2 (slot 3, 3 tokens) after 1 token into slot 1; the empty sequence's entry unread.
fn prefill_with_checkpoints(offsets: [i32; 3], slots: [i32; 3]) -> CausalConv1dFnArgs<'static> {
    CausalConv1dFnArgs {
        checkpoint_offsets: Some(r(offsets.to_vec(), &[3])),
        checkpoint_state_indices: Some(r(slots.to_vec(), &[3])),
        ..prefill()
    }
}

#[test]
fn checkpoints() {
    let p = ssm_tensor::Op::plan(&prefill_with_checkpoints([2, 0, 1], [4, -7, 1])).unwrap();
    let ck: Vec<_> = p.seqs.as_ref().unwrap().iter().map(|s| s.checkpoint.map(|k| (k.slot, k.tokens))).collect();
    assert_eq!(ck, [Some((4, 2)), Some((1, 1))]);
    // The pad slot: no checkpoint written.
    let p = ssm_tensor::Op::plan(&prefill_with_checkpoints([2, 0, 1], [0, 0, 1])).unwrap();
    assert_eq!(p.seqs.as_ref().unwrap()[0].checkpoint, None);

    let mut half = prefill();
    half.checkpoint_offsets = Some(r(vec![2i32, 0, 1], &[3]));
    insta::assert_snapshot!("fn_checkpoint_half_given", err_fn(&half));
    insta::assert_snapshot!(
        "fn_checkpoint_offset_past_sequence",
        err_fn(&prefill_with_checkpoints([4, 0, 1], [4, 0, 1]))
    );
    insta::assert_snapshot!("fn_checkpoint_offset_negative", err_fn(&prefill_with_checkpoints([2, 0, -1], [4, 0, 1])));
    insta::assert_snapshot!("fn_checkpoint_is_own_slot", err_fn(&prefill_with_checkpoints([2, 0, 1], [2, 0, 1])));
    insta::assert_snapshot!("fn_checkpoint_slot_conflict", err_fn(&prefill_with_checkpoints([2, 0, 1], [3, 0, 1])));
    insta::assert_snapshot!("fn_checkpoint_same_slot_twice", err_fn(&prefill_with_checkpoints([2, 0, 1], [4, 0, 4])));
    insta::assert_snapshot!("fn_checkpoint_slot_past_pool", err_fn(&prefill_with_checkpoints([2, 0, 1], [5, 0, 1])));
    let mut f = prefill_with_checkpoints([2, 0, 1], [4, 0, 1]);
    f.checkpoint_offsets = Some(r(vec![2.0f32, 0.0, 1.0], &[3]));
    insta::assert_snapshot!("fn_checkpoint_offsets_f32", err_fn(&f));
}
