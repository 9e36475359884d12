//! GPU tests of ReplaySSM on CUDA (`checkpointing_ssu` and the ring trackers). Each skips with a
//! printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns the skip into a
//! failure. Random cases come from `ssm_conformance::cases::ring_random`, the generator the CPU
//! backend's ReplaySSM tests run too; the oracle is the f64 reference of `ssm_ring`.

// The staging error is the test harness's (large) error enum, on a copy path, never a decode path.
#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use ssm_conformance::cases::ring_random::{
    CkptCase, CkptSpec, Form, TrackerCase, check_ckpt, replayssm_decode_vs_plain_ssu,
};
use ssm_cuda::testing::{
    DeviceCheckpointingSsuArgs, DeviceCommitTrackersArgs, DeviceUpdateTrackersArgs, MirrorError, Mirrored, run_staged,
};
use ssm_cuda::{CudaBackend, CudaError, DeviceErrors};
use ssm_ring::{plan, reference};
use ssm_tensor::{DType, HostTensor, Run};

fn run_cuda(be: &CudaBackend, c: &mut CkptCase) -> Result<(), MirrorError> {
    run_staged::<DeviceCheckpointingSsuArgs>(be, c.args())
}

/// The property matrix (odd dims and dstates, groups, every token form, f32/bf16/f16 pools and
/// activations, i32/i64 tables, pads, empty sequences, both branches) and Mamba2-2.7B-like
/// decode and 4-token shapes: CUDA equals the f64 reference, untouched slots stay bit-identical.
#[test]
fn checkpointing_ssu_matches_the_reference_over_the_matrix() {
    let Some(be) = gpu("checkpointing_ssu_matches_the_reference_over_the_matrix") else { return };
    let mut specs: Vec<CkptSpec> = (0..42).map(CkptSpec::matrix).collect();
    for state in [DType::F32, DType::BF16] {
        specs.push(CkptSpec::mamba2(5, 4, 1, state));
        specs.push(CkptSpec::mamba2(3, 2, 4, state));
        specs.push(CkptSpec { form: Form::Varlen, ..CkptSpec::mamba2(6, 2, 4, state) });
    }
    for (i, spec) in specs.into_iter().enumerate() {
        let base = CkptCase::random(spec, 200 + i as u64);
        let mut want = base.clone();
        reference::checkpointing_ssu_f64(plan(want.args()).unwrap());
        let mut got = base.clone();
        run_cuda(&be, &mut got).unwrap_or_else(|e| panic!("case {i} {spec:?}: {e}"));
        check_ckpt(&base, &got, &want).unwrap_or_else(|e| panic!("case {i} {spec:?}: {e}"));
    }
}

/// Tracker calls with duplicate, pad and out-of-range slots and counters near the i32 limits,
/// over 0 to 5000 rows (past the kernel's 2048-row chunk): CUDA equals the reference bit for
/// bit in every mode (rows applied in order).
#[test]
fn ring_trackers_match_the_reference_bit_for_bit() {
    let Some(be) = gpu("ring_trackers_match_the_reference_bit_for_bit") else { return };
    for (i, rows) in [0usize, 1, 37, 2048, 2049, 5000].into_iter().enumerate() {
        for dtype in [DType::I32, DType::I64] {
            let base = TrackerCase::random(rows, 300, dtype, [DType::I32, DType::I64][i % 2], 50 + i as u64);
            for mode in 0..3 {
                let (mut got, mut want) = (base.clone(), base.clone());
                if mode == 2 {
                    run_staged::<DeviceCommitTrackersArgs>(&be, got.commit_args()).unwrap();
                    reference::commit_replayssm_ring_trackers(plan(want.commit_args()).unwrap());
                } else {
                    run_staged::<DeviceUpdateTrackersArgs>(&be, got.update_args(mode == 1)).unwrap();
                    reference::update_replayssm_ring_trackers(plan(want.update_args(mode == 1)).unwrap());
                }
                for k in 0..3 {
                    assert_eq!(got.trackers[k].bytes(), want.trackers[k].bytes(), "rows {rows} {dtype:?} mode {mode}");
                }
            }
        }
    }
}

/// 40 one-token steps of checkpointing SSU + tracker advance on CUDA equal the plain CUDA SSU on
/// the same tokens (the shared decode check), and equal the CPU backend's ReplaySSM.
#[test]
fn replayssm_decode_equals_plain_ssu_and_the_cpu() {
    let Some(be) = gpu("replayssm_decode_equals_plain_ssu_and_the_cpu") else { return };
    let worst = replayssm_decode_vs_plain_ssu(&Mirrored(&be), 17).unwrap();
    eprintln!("cuda: largest |ReplaySSM - plain SSU| over 40 steps: {worst:.2e}");
    let cpu =
        ssm_dispatch::Runtime::new(&ssm_dispatch::Config { replayssm: true, ..ssm_dispatch::Config::cpu(Some(2)) })
            .unwrap();
    for i in 0..12 {
        let spec = CkptSpec::mamba2(4, 3, 1 + i % 4, [DType::F32, DType::BF16][i % 2]);
        let base = CkptCase::random(spec, 300 + i as u64);
        let (mut on_gpu, mut on_cpu) = (base.clone(), base.clone());
        run_cuda(&be, &mut on_gpu).unwrap();
        cpu.checkpointing_ssu(on_cpu.args()).unwrap();
        check_ckpt(&base, &on_gpu, &on_cpu).unwrap_or_else(|e| panic!("case {i}: CUDA vs CPU: {e}"));
    }
}

/// Garbage device index values: slots outside the pool, cursors outside the ring or window, and
/// a broken `cu_seqlens`. No crash, the error word names each, the sequences with a bad value
/// write nothing, the others are still right, and untouched slots stay bit-identical.
#[test]
fn garbage_device_indices_never_escape_their_tensors() {
    let Some(be) = gpu("garbage_device_indices_never_escape_their_tensors") else { return };
    for index in [DType::I32, DType::I64] {
        // No pads in the call itself: every table entry names its own slot (0 stays free).
        let spec = CkptSpec { index, pads: false, ..CkptSpec::mamba2(6, 2, 2, DType::F32) };
        let base = CkptCase::random(spec, 77);
        let cache = base.state.shape[0] as i64;
        let mut table: Vec<i64> = base.sbi.as_ref().unwrap().to_f64_vec().iter().map(|&v| v as i64).collect();
        table[1] = cache; // just past the pool
        table[3] = if index == DType::I64 { 1 << 40 } else { i32::MAX as i64 };
        // Sequence 4's slot gets cursors outside the ring and the window.
        let (mut starts, mut ks) = (cursor_values(&base.ring_start), cursor_values(&base.prev_num));
        let bad = table[4] as usize;
        starts[bad] = spec.ring_len() as i64;
        ks[bad] = spec.window as i64 + 1;
        let mut garbage = base.clone();
        garbage.sbi = Some(HostTensor::from_i64(index, vec![6], &table));
        garbage.ring_start = HostTensor::from_i64(index, vec![cache as usize], &starts);
        garbage.prev_num = HostTensor::from_i64(index, vec![cache as usize], &ks);
        let mut got = garbage.clone();
        let err = run_cuda(&be, &mut got).unwrap_err();
        let want_bits = DeviceErrors::SLOT | DeviceErrors::CURSOR;
        assert!(
            matches!(err, MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(bits))) if bits & want_bits == want_bits),
            "{err}"
        );
        // The reference runs the same call with the bad sequences as pad rows (pad value 0).
        let mut nulled = table.clone();
        for s in [1, 3, 4] {
            nulled[s] = 0;
        }
        let mut reference_case = base.clone();
        reference_case.spec.pads = true;
        reference_case.sbi = Some(HostTensor::from_i64(index, vec![6], &nulled));
        let mut want = reference_case.clone();
        reference::checkpointing_ssu_f64(plan(want.args()).unwrap());
        check_ckpt(&reference_case, &got, &want).unwrap_or_else(|e| panic!("{index:?}: {e}"));
    }
    // cu_seqlens decreasing, past the tokens, and a sequence longer than max_seqlen.
    let spec = CkptSpec { form: Form::Varlen, pads: false, ..CkptSpec::mamba2(3, 2, 2, DType::F32) };
    let base = CkptCase::random(spec, 5);
    let total = base.x.shape[0] as i64;
    for cu in [vec![0, total + 5, 1, -3], vec![0, 3, 3, 3]] {
        let mut got = base.clone();
        got.cu = Some(HostTensor::from_i64(DType::I32, vec![4], &cu));
        let err = run_cuda(&be, &mut got).unwrap_err();
        assert!(
            matches!(err, MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(bits))) if bits & DeviceErrors::CU_SEQLENS != 0),
            "{cu:?}: {err}"
        );
        for (what, before, after) in [
            ("state", &base.state, &got.state),
            ("x_cache", &base.x_cache, &got.x_cache),
            ("B_cache", &base.b_cache, &got.b_cache),
            ("dt_cache", &base.dt_cache, &got.dt_cache),
        ] {
            // Sequence 0 (cu 0..3 or 0..total+5) is bad in both; the others may be valid.
            let slot = base.sbi.as_ref().unwrap().to_f64_vec()[0] as usize;
            let per = before.bytes().len() / before.shape[0];
            let r = slot * per..(slot + 1) * per;
            assert!(before.bytes()[r.clone()] == after.bytes()[r], "{cu:?}: {what} of the bad sequence written");
        }
    }
}

fn cursor_values(t: &HostTensor) -> Vec<i64> {
    t.to_f64_vec().iter().map(|&v| v as i64).collect()
}

/// A decode step's checkpointing SSU, and the tracker advance, captured in CUDA graphs and
/// replayed, equal eager execution.
#[test]
fn graph_replay_equals_eager_execution() {
    let Some(be) = gpu("ring graph_replay_equals_eager_execution") else { return };
    let mut case = CkptCase::random(CkptSpec::mamba2(16, 4, 1, DType::F32), 4242);
    common::assert_graph_replay_equals_eager::<DeviceCheckpointingSsuArgs>(
        &be,
        &case.args(),
        20,
        |a| be.prewarm_checkpointing_ssu(&plan(a).unwrap()).unwrap(),
        |d| vec![d.state_buffer().download().unwrap(), d.out_buffer().download().unwrap()],
    );
    let mut trackers = TrackerCase::random(300, 64, DType::I32, DType::I32, 9);
    common::assert_graph_replay_equals_eager::<DeviceUpdateTrackersArgs>(
        &be,
        &trackers.update_args(false),
        20,
        |a| be.prewarm_update_ring_trackers(&plan(a).unwrap()).unwrap(),
        |d| d.tracker_buffers(),
    );
}

/// A call allocates no device memory (free memory unchanged over many calls).
#[test]
fn calls_allocate_no_device_memory() {
    let Some(be) = gpu("ring calls_allocate_no_device_memory") else { return };
    let mut case = CkptCase::random(CkptSpec::mamba2(32, 4, 4, DType::BF16), 31);
    common::assert_calls_allocate_no_device_memory::<DeviceCheckpointingSsuArgs>(&be, &case.args());
    let mut trackers = TrackerCase::random(100, 64, DType::I64, DType::I32, 3);
    common::assert_calls_allocate_no_device_memory::<DeviceCommitTrackersArgs>(&be, &trackers.commit_args());
}

#[test]
fn host_tensors_are_refused() {
    let Some(be) = gpu("ring host_tensors_are_refused") else { return };
    let mut case = CkptCase::random(CkptSpec::mamba2(2, 2, 1, DType::F32), 1);
    let err = be.run(plan(case.args()).unwrap()).unwrap_err();
    assert!(matches!(err, CudaError::WrongDevice { .. }), "{err}");
}

/// A window too large for one block's shared memory is refused by name, before any launch.
#[test]
fn oversized_rings_are_refused_by_name() {
    let Some(be) = gpu("ring oversized_rings_are_refused_by_name") else { return };
    let spec = CkptSpec { window: 60, ..CkptSpec::mamba2(1, 1, 4, DType::F32) };
    let mut case = CkptCase::random(CkptSpec { dstate: 256, ..spec }, 2);
    let err = run_cuda(&be, &mut case).unwrap_err();
    assert!(matches!(&err, MirrorError::Cuda(CudaError::Unsupported(m)) if m.contains("shared memory")), "{err}");
}
