//! Every error class of `plan` for `mamba_chunk_scan_combined_varlen`, pinned with insta.
//! Each case starts from a valid call and breaks one thing; the outputs are checked to be
//! untouched (the plan fails before anything runs).

use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, SsdError};
use ssm_tensor::{DType, Device, TensorMut, TensorRef};

/// A valid call: 2 sequences of 5 and 3 tokens, chunk 4, H 4, P 3, N 8, G 2.
struct Fixture {
    x: Vec<f32>,
    dt: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    out: Vec<f32>,
    states: Vec<f32>,
    init: Vec<f32>,
    cu_seqlens: Vec<i32>,
    cu_chunk: Vec<i32>,
    last_chunk: Vec<i32>,
    seq_idx: Vec<i32>,
}

const T: usize = 8;
const H: usize = 4;
const P: usize = 3;
const N: usize = 8;
const G: usize = 2;

impl Fixture {
    fn new() -> Self {
        Fixture {
            x: vec![0.5; T * H * P],
            dt: vec![0.1; T * H],
            a: vec![-1.0; H],
            b: vec![0.2; T * G * N],
            c: vec![0.3; T * G * N],
            out: vec![f32::NAN; T * H * P],
            states: vec![f32::NAN; 2 * H * P * N],
            init: vec![0.0; 2 * H * P * N],
            cu_seqlens: vec![0, 5, 8],
            cu_chunk: vec![0, 4, 5, 8],
            last_chunk: vec![1, 2],
            seq_idx: vec![0, 0, 1],
        }
    }
}

fn args<'a>(f: &'a Fixture, out: &'a mut [f32], states: &'a mut [f32]) -> MambaChunkScanCombinedVarlenArgs<'a> {
    let table = |v: &'a [i32]| TensorRef::from_slice(v, &[v.len()]).unwrap();
    MambaChunkScanCombinedVarlenArgs {
        out: Some(TensorMut::from_slice(out, &[T, H, P]).unwrap()),
        initial_states: Some(TensorRef::from_slice(&f.init, &[2, H, P, N]).unwrap()),
        dt_softplus: true,
        varlen_states: Some(TensorMut::from_slice(states, &[2, H, P, N]).unwrap()),
        ..MambaChunkScanCombinedVarlenArgs::new(
            TensorRef::from_slice(&f.x, &[T, H, P]).unwrap(),
            TensorRef::from_slice(&f.dt, &[T, H]).unwrap(),
            TensorRef::from_slice(&f.a, &[H]).unwrap(),
            TensorRef::from_slice(&f.b, &[T, G, N]).unwrap(),
            TensorRef::from_slice(&f.c, &[T, G, N]).unwrap(),
            4,
            [table(&f.cu_seqlens), table(&f.cu_chunk), table(&f.last_chunk), table(&f.seq_idx)],
        )
    }
}

/// Plans `f` after `edit` and returns the refusal's message. `plan` takes the arguments by
/// shared reference, so a refused call cannot have written anything.
fn fail<'a>(f: &'a Fixture, edit: impl FnOnce(&mut MambaChunkScanCombinedVarlenArgs<'a>)) -> String {
    let out: &'a mut [f32] = Box::leak(f.out.clone().into_boxed_slice());
    let states: &'a mut [f32] = Box::leak(f.states.clone().into_boxed_slice());
    let mut a = args(f, out, states);
    edit(&mut a);
    let err: SsdError = ssm_tensor::Op::plan(&a).expect_err("the call must be refused");
    err.to_string()
}

fn with(f: impl FnOnce(&mut Fixture)) -> Fixture {
    let mut fx = Fixture::new();
    f(&mut fx);
    fx
}

#[test]
fn the_fixture_is_valid() {
    let f = Fixture::new();
    let (mut out, mut states) = (f.out.clone(), f.states.clone());
    let p = ssm_tensor::Op::plan(&args(&f, &mut out, &mut states)).unwrap();
    assert_eq!((p.nchunks, p.batch, p.heads_per_group()), (3, 2, 2));
}

#[test]
fn seq_idx_length_differs_from_the_chunk_count() {
    let f = with(|f| f.seq_idx = vec![0, 1]);
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn cu_chunk_seqlens_not_monotone() {
    let f = with(|f| f.cu_chunk = vec![0, 4, 3, 8]);
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn cu_seqlens_not_monotone() {
    let f = with(|f| f.cu_seqlens = vec![0, 6, 5]);
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn chunk_longer_than_chunk_size() {
    let f = with(|f| {
        f.cu_chunk = vec![0, 5, 8];
        f.seq_idx = vec![0, 1];
        f.last_chunk = vec![0, 1];
    });
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn chunk_spanning_two_sequences() {
    let f = with(|f| {
        f.cu_chunk = vec![0, 4, 8];
        f.seq_idx = vec![0, 1];
        f.last_chunk = vec![0, 1];
    });
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn seq_idx_decreasing_or_out_of_range() {
    let f = with(|f| f.seq_idx = vec![0, 2, 1]);
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn last_chunk_index_wrong() {
    let f = with(|f| f.last_chunk = vec![0, 2]);
    insta::assert_snapshot!(fail(&f, |_| {}));
}

#[test]
fn initial_states_batch_mismatch() {
    let f = Fixture::new();
    insta::assert_snapshot!(fail(&f, |a| {
        a.initial_states = Some(TensorRef::from_slice(&f.init, &[1, H, 2 * P, N]).unwrap());
    }));
}

#[test]
fn chunk_size_not_a_power_of_two() {
    insta::assert_snapshot!(fail(&Fixture::new(), |a| a.chunk_size = 6));
}

#[test]
fn dt_limit_not_an_interval() {
    insta::assert_snapshot!(fail(&Fixture::new(), |a| a.dt_limit = (0.5, 0.1)));
}

#[test]
fn shape_mismatch() {
    let f = Fixture::new();
    insta::assert_snapshot!(fail(&f, |a| a.dt = TensorRef::from_slice(&f.dt, &[H, T]).unwrap()));
}

#[test]
fn dtype_not_accepted() {
    let f = Fixture::new();
    let bad: &'static [i32] = Box::leak(vec![0i32; T * H].into_boxed_slice());
    insta::assert_snapshot!(fail(&f, |a| a.dt = TensorRef::from_slice(bad, &[T, H]).unwrap()));
}

#[test]
fn heads_not_a_multiple_of_groups() {
    let f = Fixture::new();
    insta::assert_snapshot!(fail(&f, |a| {
        a.b = TensorRef::from_slice(&f.b[..T * 3 * 4], &[T, 3, 4]).unwrap();
    }));
}

#[test]
fn x_not_contiguous_along_dim() {
    let f = Fixture::new();
    insta::assert_snapshot!(fail(&f, |a| {
        a.x =
            TensorRef::from_slice(&f.x, &[T, H, P]).unwrap().with_strides(&[1, T as isize, (T * H) as isize]).unwrap();
    }));
}

#[test]
fn tensors_on_different_devices() {
    let f = Fixture::new();
    insta::assert_snapshot!(fail(&f, |a| {
        // SAFETY: the view is never dereferenced; the plan only compares devices.
        a.a = unsafe { TensorRef::from_device_ptr(0x1000, H, DType::F32, Device::Cuda(0), &[H], &[1]) }.unwrap();
    }));
}

#[test]
fn state_dtype_disagrees_with_the_returned_buffer() {
    insta::assert_snapshot!(fail(&Fixture::new(), |a| a.state_dtype = Some(DType::BF16)));
}

#[test]
fn scratch_too_small() {
    let f = Fixture::new();
    let (mut out, mut states, mut ws) = (f.out.clone(), f.states.clone(), vec![0.0f32; 10]);
    let mut a = args(&f, &mut out, &mut states);
    a.scratch = Some(TensorMut::from_slice(&mut ws, &[10]).unwrap());
    insta::assert_snapshot!(ssm_tensor::Op::plan(&a).unwrap_err().to_string());
}

/// A pool of 4 slots and its tables, leaked for the `'static` edits of [`fail`].
fn pool_args(a: &mut MambaChunkScanCombinedVarlenArgs<'static>, init: &[i64], fin: &[i64]) {
    let pool: &'static mut [f32] = Box::leak(vec![0.0f32; 4 * H * P * N].into_boxed_slice());
    let init: &'static [i64] = Box::leak(init.to_vec().into_boxed_slice());
    let fin: &'static [i64] = Box::leak(fin.to_vec().into_boxed_slice());
    a.initial_states = None;
    a.ssm_state = Some(TensorMut::from_slice(pool, &[4, H, P, N]).unwrap());
    a.initial_state_indices = Some(TensorRef::from_slice(init, &[init.len()]).unwrap());
    a.final_state_indices = Some(TensorRef::from_slice(fin, &[fin.len()]).unwrap());
    a.pad_slot_id = Some(-1);
}

fn fixture() -> &'static Fixture {
    Box::leak(Box::new(Fixture::new()))
}

#[test]
fn pool_tables_are_valid() {
    let f = Fixture::new();
    let (mut out, mut states) = (f.out.clone(), f.states.clone());
    let mut a = args(&f, &mut out, &mut states);
    let mut pool = vec![0.0f32; 4 * H * P * N];
    let (init, fin) = ([3i64, -1], [3i64, 0]);
    a.initial_states = None;
    a.ssm_state = Some(TensorMut::from_slice(&mut pool, &[4, H, P, N]).unwrap());
    a.initial_state_indices = Some(TensorRef::from_slice(&init, &[2]).unwrap());
    a.final_state_indices = Some(TensorRef::from_slice(&fin, &[2]).unwrap());
    a.pad_slot_id = Some(-1);
    a.varlen_states = None;
    let p = ssm_tensor::Op::plan(&a).unwrap();
    assert_eq!(p.slots, 4);
}

#[test]
fn slot_index_out_of_range() {
    insta::assert_snapshot!(fail(fixture(), |a| pool_args(a, &[0, 4], &[0, 1])));
}

#[test]
fn final_slot_read_by_another_sequence() {
    insta::assert_snapshot!(fail(fixture(), |a| pool_args(a, &[2, 1], &[1, 3])));
}

#[test]
fn final_slot_written_by_two_sequences() {
    insta::assert_snapshot!(fail(fixture(), |a| pool_args(a, &[-1, -1], &[2, 2])));
}

#[test]
fn slot_table_without_a_pool() {
    let idx: &'static [i64] = &[0, 1];
    insta::assert_snapshot!(fail(fixture(), |a| {
        a.final_state_indices = Some(TensorRef::from_slice(idx, &[2]).unwrap());
    }));
}

#[test]
fn initial_states_and_a_read_table_together() {
    let f = fixture();
    insta::assert_snapshot!(fail(f, |a| {
        pool_args(a, &[0, 1], &[0, 1]);
        a.initial_states = Some(TensorRef::from_slice(&f.init, &[2, H, P, N]).unwrap());
    }));
}

#[test]
fn slot_table_of_the_wrong_length() {
    insta::assert_snapshot!(fail(fixture(), |a| pool_args(a, &[0, 1, 2], &[0, 1])));
}

#[test]
fn pool_of_another_dtype() {
    insta::assert_snapshot!(fail(fixture(), |a| {
        pool_args(a, &[0, 1], &[0, 1]);
        let pool: &'static mut [ssm_tensor::bf16] =
            Box::leak(vec![ssm_tensor::bf16::ZERO; 4 * H * P * N].into_boxed_slice());
        a.ssm_state = Some(TensorMut::from_slice(pool, &[4, H, P, N]).unwrap());
    }));
}

#[test]
fn intermediate_states_without_varlen_states() {
    insta::assert_snapshot!(fail(fixture(), |a| {
        pool_args(a, &[0, 1], &[0, 1]);
        a.varlen_states = None;
        a.return_intermediate_states = true;
    }));
}

/// Checkpoint tables (leaked, as [`pool_args`]'s).
fn checkpoint_args(a: &mut MambaChunkScanCombinedVarlenArgs<'static>, chunks: &[i64], slots: &[i64]) {
    let chunks: &'static [i64] = Box::leak(chunks.to_vec().into_boxed_slice());
    let slots: &'static [i64] = Box::leak(slots.to_vec().into_boxed_slice());
    a.checkpoint_chunk_indices = Some(TensorRef::from_slice(chunks, &[chunks.len()]).unwrap());
    a.checkpoint_state_indices = Some(TensorRef::from_slice(slots, &[slots.len()]).unwrap());
}

/// The refusal of the fixture with a pool (sequences 0 and 1 read and write slots 0 and 1) and
/// the given checkpoint tables.
fn fail_checkpoints(chunks: &[i64], slots: &[i64]) -> String {
    fail(fixture(), |a| {
        pool_args(a, &[0, 1], &[0, 1]);
        checkpoint_args(a, chunks, slots);
    })
}

#[test]
fn checkpoint_tables_are_valid() {
    // Sequence 0 owns chunks 0 and 1, sequence 1 chunk 2; slots 2 and 3 are used by nothing else.
    for (chunks, slots) in
        [([0i64, -1], [2i64, 3]), ([1, 2], [2, 3]), ([0, 2], [3, -1]), ([-1, -1], [0, 1]), ([0, -1], [2, 99])]
    {
        let f = fixture();
        let out: &'static mut [f32] = Box::leak(f.out.clone().into_boxed_slice());
        let states: &'static mut [f32] = Box::leak(f.states.clone().into_boxed_slice());
        let mut a = args(f, out, states);
        pool_args(&mut a, &[0, 1], &[0, 1]);
        a.varlen_states = None;
        checkpoint_args(&mut a, &chunks, &slots);
        let p = ssm_tensor::Op::plan(&a).unwrap_or_else(|e| panic!("{chunks:?} {slots:?}: {e}"));
        assert_eq!(p.checkpoint_chunk_indices.is_some(), p.checkpoint_state_indices.is_some());
    }
}

#[test]
fn checkpoint_chunk_of_another_sequence() {
    insta::assert_snapshot!(fail_checkpoints(&[2, -1], &[2, 3]));
}

#[test]
fn checkpoint_slot_read_by_another_sequence() {
    insta::assert_snapshot!(fail_checkpoints(&[0, -1], &[1, 3]));
}

#[test]
fn checkpoint_slot_is_its_own_final_slot() {
    insta::assert_snapshot!(fail_checkpoints(&[0, -1], &[0, 3]));
}

#[test]
fn checkpoint_slot_out_of_range() {
    insta::assert_snapshot!(fail_checkpoints(&[0, 2], &[2, 9]));
}

#[test]
fn checkpoint_chunks_without_their_slots() {
    let chunks: &'static [i64] = &[0, -1];
    insta::assert_snapshot!(fail(fixture(), |a| {
        pool_args(a, &[0, 1], &[0, 1]);
        a.checkpoint_chunk_indices = Some(TensorRef::from_slice(chunks, &[2]).unwrap());
    }));
}
