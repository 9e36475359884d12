//! Every error class of the ReplaySSM plans, pinned with insta. Each case starts from a
//! valid call and breaks one thing. Plans take the arguments by shared reference, so a
//! refused call cannot have written anything.

use ssm_ring::{CheckpointingSsuArgs, CommitRingTrackersArgs, RingError, RingTrackers, UpdateRingTrackersArgs};
use ssm_tensor::{DType, Device, TensorMut, TensorRef};

fn leak<T: Clone>(v: &[T]) -> &'static mut [T] {
    Box::leak(v.to_vec().into_boxed_slice())
}

fn trackers(n: [usize; 3]) -> RingTrackers<'static> {
    RingTrackers {
        ring_start: TensorMut::from_slice(leak(&vec![0i32; n[0]]), &[n[0]]).unwrap(),
        prev_num_accepted: TensorMut::from_slice(leak(&vec![0i32; n[1]]), &[n[1]]).unwrap(),
        prev_query_len: TensorMut::from_slice(leak(&vec![0i32; n[2]]), &[n[2]]).unwrap(),
    }
}

fn slots(v: &[i32]) -> TensorRef<'static> {
    TensorRef::from_slice(leak(v), &[v.len()]).unwrap()
}

fn update(edit: impl FnOnce(&mut UpdateRingTrackersArgs<'static>)) -> Result<(), RingError> {
    let mut a = UpdateRingTrackersArgs {
        trackers: trackers([8, 8, 8]),
        state_batch_indices: slots(&[1, 2]),
        logical_window: Some(4),
        ring_buffer_len: Some(6),
        pad_slot_id: Some(0),
    };
    edit(&mut a);
    ssm_tensor::Op::plan(&a).map(|_| ())
}

fn commit(edit: impl FnOnce(&mut CommitRingTrackersArgs<'static>)) -> Result<(), RingError> {
    let mut a = CommitRingTrackersArgs {
        trackers: trackers([8, 8, 8]),
        state_batch_indices: slots(&[1, 2]),
        num_accepted_tokens: slots(&[1, 2]),
        query_start_loc: slots(&[0, 2, 4]),
        logical_window: 4,
        ring_buffer_len: 6,
        pad_slot_id: Some(0),
    };
    edit(&mut a);
    ssm_tensor::Op::plan(&a).map(|_| ())
}

const CACHE: usize = 4;
const H: usize = 4;
const G: usize = 2;
const P: usize = 3;
const N: usize = 8;
const L: usize = 6;
const B: usize = 2;
const T: usize = 2;

/// A valid dense call: 2 sequences of T = 2 tokens, ring L = 6 (W = 4).
fn ckpt(edit: impl FnOnce(&mut CheckpointingSsuArgs<'static>)) -> Result<(), RingError> {
    let f = |n: usize| leak(&vec![0.1f32; n]);
    let mut a = CheckpointingSsuArgs {
        state: TensorMut::from_slice(f(CACHE * H * P * N), &[CACHE, H, P, N]).unwrap(),
        x_cache: TensorMut::from_slice(f(CACHE * H * L * P), &[CACHE, H, L, P]).unwrap(),
        b_cache: TensorMut::from_slice(f(CACHE * G * L * N), &[CACHE, G, L, N]).unwrap(),
        dt_cache: TensorMut::from_slice(f(CACHE * H * L), &[CACHE, H, L]).unwrap(),
        ring_start: slots(&[0, 5, 2, 0]),
        prev_num_accepted_tokens: slots(&[0, 4, 1, 0]),
        x: TensorRef::from_slice(f(B * T * H * P), &[B, T, H, P]).unwrap(),
        dt: TensorRef::from_slice(f(B * T * H), &[B, T, H]).unwrap(),
        a: TensorRef::from_slice(f(H), &[H]).unwrap(),
        b: TensorRef::from_slice(f(B * T * G * N), &[B, T, G, N]).unwrap(),
        c: TensorRef::from_slice(f(B * T * G * N), &[B, T, G, N]).unwrap(),
        out: TensorMut::from_slice(f(B * T * H * P), &[B, T, H, P]).unwrap(),
        d: Some(TensorRef::from_slice(f(H), &[H]).unwrap()),
        z: None,
        dt_bias: Some(TensorRef::from_slice(f(H), &[H]).unwrap()),
        dt_softplus: true,
        state_batch_indices: Some(slots(&[1, 2])),
        pad_slot_id: Some(0),
        cu_seqlens: None,
        max_seqlen: None,
    };
    edit(&mut a);
    ssm_tensor::Op::plan(&a).map(|_| ())
}

/// Replaces the token tensors by `rows` packed tokens (varlen) or `[B, t]` dense ones.
fn tokens(a: &mut CheckpointingSsuArgs<'static>, lead: &[usize]) {
    let rows: usize = lead.iter().product();
    let shape = |tail: &[usize]| lead.iter().chain(tail).copied().collect::<Vec<usize>>();
    a.x = TensorRef::from_slice(leak(&vec![0.0f32; rows * H * P]), &shape(&[H, P])).unwrap();
    a.dt = TensorRef::from_slice(leak(&vec![0.0f32; rows * H]), &shape(&[H])).unwrap();
    a.b = TensorRef::from_slice(leak(&vec![0.0f32; rows * G * N]), &shape(&[G, N])).unwrap();
    a.c = a.b;
    a.out = TensorMut::from_slice(leak(&vec![0.0f32; rows * H * P]), &shape(&[H, P])).unwrap();
}

fn msg(r: Result<(), RingError>) -> String {
    r.expect_err("the call must be refused").to_string()
}

#[test]
fn the_fixtures_are_valid() {
    update(|_| {}).unwrap();
    update(|a| a.logical_window = None).unwrap();
    commit(|_| {}).unwrap();
    ckpt(|_| {}).unwrap();
    // Varlen and one-token forms of the same pools.
    ckpt(|a| {
        tokens(a, &[3]);
        a.cu_seqlens = Some(slots(&[0, 2, 3]));
        a.max_seqlen = Some(2);
    })
    .unwrap();
    // An out-of-range or pad slot is not an error for the trackers: it is skipped.
    update(|a| a.state_batch_indices = slots(&[0, 99, -3])).unwrap();
}

#[test]
fn tracker_tensors_of_different_lengths() {
    insta::assert_snapshot!(msg(update(|a| a.trackers = trackers([8, 7, 8]))));
}

#[test]
fn tracker_tensors_of_different_dtypes() {
    insta::assert_snapshot!(msg(commit(|a| {
        a.trackers.prev_query_len = TensorMut::from_slice(leak(&[0i64; 8]), &[8]).unwrap();
    })));
}

#[test]
fn tracker_window_without_ring_length() {
    insta::assert_snapshot!(msg(update(|a| a.ring_buffer_len = None)));
}

#[test]
fn tracker_ring_length_not_positive() {
    insta::assert_snapshot!(msg(commit(|a| a.ring_buffer_len = 0)));
}

#[test]
fn tracker_index_dtype() {
    insta::assert_snapshot!(msg(update(|a| {
        a.state_batch_indices = TensorRef::from_slice(leak(&[1.0f32, 2.0]), &[2]).unwrap();
    })));
}

#[test]
fn commit_query_start_loc_too_short() {
    insta::assert_snapshot!(msg(commit(|a| a.query_start_loc = slots(&[0, 2]))));
}

#[test]
fn ring_too_short_for_the_window() {
    // L = 6 and T = 4: W = 2 < T.
    insta::assert_snapshot!(msg(ckpt(|a| {
        tokens(a, &[B, 4]);
    })));
}

#[test]
fn checkpoint_shape_mismatch() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        a.b_cache = TensorMut::from_slice(leak(&[0.0f32; CACHE * G * 5 * N]), &[CACHE, G, 5, N]).unwrap();
    })));
}

#[test]
fn checkpoint_dt_cache_dtype() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        a.dt_cache = TensorMut::from_slice(leak(&[ssm_tensor::bf16::ZERO; CACHE * H * L]), &[CACHE, H, L]).unwrap();
    })));
}

#[test]
fn checkpoint_heads_not_a_multiple_of_groups() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        a.b_cache = TensorMut::from_slice(leak(&[0.0f32; CACHE * 3 * L * N]), &[CACHE, 3, L, N]).unwrap();
    })));
}

#[test]
fn checkpoint_dt_not_per_head() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        a.dt = TensorRef::from_slice(leak(&[0.0f32; B * T * H * P]), &[B, T, H, P]).unwrap();
    })));
}

#[test]
fn checkpoint_devices_differ() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        // SAFETY: the view is never dereferenced; the plan only compares devices.
        a.c = unsafe {
            TensorRef::from_device_ptr(
                0x1000,
                B * T * G * N,
                DType::F32,
                Device::Cuda(0),
                &[B, T, G, N],
                &[(T * G * N) as isize, (G * N) as isize, N as isize, 1],
            )
        }
        .unwrap();
    })));
}

#[test]
fn checkpoint_slot_out_of_range() {
    insta::assert_snapshot!(msg(ckpt(|a| a.state_batch_indices = Some(slots(&[1, 7])))));
}

/// The aliasing rule of every family: two rows may not write one slot (pads excepted).
#[test]
fn checkpoint_rows_share_a_slot() {
    insta::assert_snapshot!(msg(ckpt(|a| a.state_batch_indices = Some(slots(&[2, 2])))));
}

#[test]
fn checkpoint_cursor_out_of_range() {
    insta::assert_snapshot!(msg(ckpt(|a| a.prev_num_accepted_tokens = slots(&[0, 5, 1, 0]))));
}

#[test]
fn checkpoint_varlen_needs_max_seqlen() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        tokens(a, &[3]);
        a.cu_seqlens = Some(slots(&[0, 2, 3]));
    })));
}

#[test]
fn checkpoint_cu_seqlens_invalid() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        tokens(a, &[3]);
        a.cu_seqlens = Some(slots(&[0, 2, 1]));
        a.max_seqlen = Some(2);
    })));
}

#[test]
fn checkpoint_sequence_longer_than_max_seqlen() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        tokens(a, &[3]);
        a.cu_seqlens = Some(slots(&[0, 3, 3]));
        a.max_seqlen = Some(2);
    })));
}

#[test]
fn checkpoint_state_not_contiguous() {
    insta::assert_snapshot!(msg(ckpt(|a| {
        let s = TensorMut::from_slice(leak(&[0.0f32; CACHE * H * P * N]), &[CACHE, H, P, N]).unwrap();
        a.state =
            s.with_layout(&[CACHE, H, P, N], &[(H * P * N) as isize, (P * N) as isize, 1, P as isize], 0).unwrap();
    })));
}
