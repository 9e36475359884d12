//! GPU tests of the CUDA chunked prefill (`chunk_gated_delta_rule`, kernels/gdn_chunk.cu). Each
//! skips with a printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns the
//! skip into a failure. Random cases come from `ssm_conformance::gdn_random::ChunkCase`, the
//! generator the CPU backend's test runs as well.

// The staging error is the test harness's (large) error enum, on a copy path, never a decode path.
#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use ssm_conformance::gdn_random::{CHUNK_PAD, ChunkCase, ChunkSpec, check_chunk};
use ssm_cuda::testing::{DeviceChunkArgs, MirrorError, run_staged};
use ssm_cuda::{CudaError, DeviceErrors};
use ssm_gdn::reference::Reference;
use ssm_gdn::{ChunkGatedDeltaRuleArgs, ChunkScratch};
use ssm_tensor::{DType, HostTensor, Planned, Run};

/// Tolerance of the tensor-core prefill against the f64 recurrence, by operand type: vLLM's
/// rounding points (A⁻¹, W, U, V', the chunk-start state and P in the input dtype) cost a few
/// units in the last place of the operand type per chunk.
fn tolerance(io: DType) -> (f64, f64) {
    match io {
        DType::F32 => (3e-3, 3e-3),
        DType::F16 => (6e-3, 6e-3),
        _ => (3e-2, 3e-2),
    }
}

fn reference(case: &ChunkCase) -> ChunkCase {
    let mut want = case.clone();
    Reference::F64.run(Planned::new(want.args()).unwrap()).unwrap();
    want
}

#[test]
fn chunk_matches_the_f64_recurrence_on_the_shared_matrix() {
    let Some(be) = gpu("chunk_matches_the_f64_recurrence_on_the_shared_matrix") else { return };
    for i in 0..8 {
        for seed in 0..2u64 {
            let spec = ChunkSpec::matrix(i);
            let base = ChunkCase::random(spec, 0xc0ffee + i as u64 + 100 * seed);
            let want = reference(&base);
            let mut got = base.clone();
            // Seed 0 lets the call allocate its scratch; seed 1 passes the size query's scratch,
            // poisoned with NaN (the kernels write every element before they read it).
            if seed == 0 {
                run_staged::<DeviceChunkArgs>(&be, got.args()).unwrap_or_else(|e| panic!("case {i}: {e}"));
            } else {
                let n = be.chunk_gated_delta_rule_scratch_size(Planned::new(got.args()).unwrap().plan());
                assert!(n > 0, "case {i}: the CUDA prefill asks for scratch");
                let mut scratch = HostTensor::filled(DType::F32, vec![n], f32::NAN);
                let args = ChunkGatedDeltaRuleArgs { scratch: Some(scratch.view_mut()), ..got.args() };
                run_staged::<DeviceChunkArgs>(&be, args).unwrap_or_else(|e| panic!("case {i}: {e}"));
            }
            let (atol, rtol) = tolerance(spec.io);
            check_chunk(&got, &want, atol, rtol)
                .unwrap_or_else(|e| panic!("case {i} seed {seed} {spec:?} lens {:?}: {e}", base.lens));
        }
    }
}

/// Qwen3-Next's prefill shape at a scale where every block runs many chunks: 32 value heads over
/// 16 q/k heads, K = V = 128, one 1000-token and one 1500-token sequence.
#[test]
fn chunk_matches_the_f64_recurrence_on_qwen3_next_shapes() {
    let Some(be) = gpu("chunk_matches_the_f64_recurrence_on_qwen3_next_shapes") else { return };
    let spec = ChunkSpec { seqs: 2, heads: 16, v_heads: 32, max_len: 300, ..ChunkSpec::matrix(0) };
    let mut base = ChunkCase::random(spec, 7);
    // Longer sequences than the matrix draws: rebuild with explicit lengths.
    let lens = [1000usize, 1500];
    let t: usize = lens.iter().sum();
    let mut r = ssm_conformance::gdn_random::SplitMix::new(11);
    base.q = r.tensor(DType::BF16, &[1, t, 16, 128], -1.0, 1.0);
    base.k = r.tensor(DType::BF16, &[1, t, 16, 128], -1.0, 1.0);
    base.v = r.tensor(DType::BF16, &[1, t, 32, 128], -1.0, 1.0);
    base.g = r.tensor(DType::F32, &[1, t, 32], -0.3, -0.001);
    base.beta = r.tensor(DType::BF16, &[1, t, 32], 0.05, 0.95);
    base.cu = Some(HostTensor::from_i64(DType::I32, vec![3], &[0, 1000, t as i64]));
    base.ix = Some(HostTensor::from_i64(DType::I64, vec![2], &[3, 1]));
    base.has = Some(HostTensor::from_i64(DType::Bool, vec![2], &[1, 0]));
    base.o = HostTensor::filled(DType::BF16, vec![1, t, 32, 128], f32::NAN);
    base.lens = lens.to_vec();
    let want = reference(&base);
    let mut got = base.clone();
    run_staged::<DeviceChunkArgs>(&be, got.args()).unwrap();
    let (atol, rtol) = tolerance(DType::BF16);
    check_chunk(&got, &want, atol, rtol).unwrap();
}

/// Garbage device-resident values: a slot out of range and a `cu_seqlens` range past the tokens.
/// The call completes (no fault; the bundle runs this under compute-sanitizer), the error word
/// names the kind, the bad sequence writes nothing, the others are right, untouched slots keep
/// their bits, and a clean call after it succeeds.
#[test]
fn chunk_garbage_device_indices_are_skipped_and_reported() {
    let Some(be) = gpu("chunk_garbage_device_indices_are_skipped_and_reported") else { return };
    let expect_bits = |res: Result<(), MirrorError>, bit: u32, what: &str| match res {
        Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
            assert!(w & bit != 0, "{what}: error word {w:#x} lacks {bit:#x}")
        }
        other => panic!("{what}: expected InvalidIndices, got {other:?}"),
    };
    let spec = ChunkSpec { seqs: 4, ..ChunkSpec::matrix(0) };
    let base = ChunkCase::random(spec, 99);
    let ix = base.ix.as_ref().unwrap().to_f64_vec();
    let bad = (0..4).find(|&n| ix[n] as i64 != CHUNK_PAD).unwrap();
    // The same call with the bad sequence as a pad is what the good sequences must produce.
    let mut as_pad = base.clone();
    let mut table: Vec<i64> = ix.iter().map(|&x| x as i64).collect();
    table[bad] = CHUNK_PAD;
    as_pad.ix = Some(HostTensor::from_i64(DType::I64, vec![4], &table));
    let want = reference(&as_pad);
    let mut got = base.clone();
    table[bad] = 1 << 40;
    got.ix = Some(HostTensor::from_i64(DType::I64, vec![4], &table));
    expect_bits(run_staged::<DeviceChunkArgs>(&be, got.args()), DeviceErrors::SLOT, "slot out of range");
    got.ix = as_pad.ix.clone();
    let (atol, rtol) = tolerance(spec.io);
    check_chunk(&got, &want, atol, rtol).unwrap();

    let mut got = base.clone();
    let mut cu: Vec<i64> = base.cu.as_ref().unwrap().to_f64_vec().iter().map(|&x| x as i64).collect();
    cu[2] = 1 << 30;
    got.cu = Some(HostTensor::from_i64(DType::I32, vec![5], &cu));
    expect_bits(run_staged::<DeviceChunkArgs>(&be, got.args()), DeviceErrors::CU_SEQLENS, "cu_seqlens past the tokens");
    // Sequences 0 and 3 have good ranges; 1 and 2 were skipped whole (their rows and slots
    // untouched).
    let o = got.o.to_f64_vec();
    let per_tok = spec.v_heads * spec.v;
    let (lo, hi) = (cu[1] as usize, cu[3] as usize);
    assert!(o[lo * per_tok..hi * per_tok].iter().all(|x| x.is_nan()), "a skipped sequence wrote o");

    // The error word was read and cleared: a clean call succeeds.
    let mut clean = base.clone();
    run_staged::<DeviceChunkArgs>(&be, clean.args()).unwrap();
    check_chunk(&clean, &reference(&base), atol, rtol).unwrap();
}

/// f32 q/k/v (tf32 operands) at K = 128, the widest key the kernels hold, with V past one
/// state tile.
#[test]
fn chunk_f32_operands_at_k_128_match_the_f64_recurrence() {
    let Some(be) = gpu("chunk_f32_operands_at_k_128_match_the_f64_recurrence") else { return };
    let spec = ChunkSpec { io: DType::F32, k: 128, v: 72, ..ChunkSpec::matrix(0) };
    let base = ChunkCase::random(spec, 21);
    let want = reference(&base);
    let mut got = base.clone();
    run_staged::<DeviceChunkArgs>(&be, got.args()).unwrap();
    let (atol, rtol) = tolerance(DType::F32);
    check_chunk(&got, &want, atol, rtol).unwrap_or_else(|e| panic!("lens {:?}: {e}", base.lens));
}

/// What the kernels do not hold is refused by name before anything runs: K past 128.
#[test]
fn chunk_refuses_what_it_does_not_hold() {
    let Some(be) = gpu("chunk_refuses_what_it_does_not_hold") else { return };
    for (io, k) in [(DType::BF16, 256), (DType::F32, 256)] {
        let spec = ChunkSpec { io, k, v: 32, ..ChunkSpec::matrix(0) };
        let mut case = ChunkCase::random(spec, 5);
        let before = case.clone();
        let res = run_staged::<DeviceChunkArgs>(&be, case.args());
        match res {
            Err(MirrorError::Cuda(CudaError::Unsupported(msg))) => {
                assert!(msg.contains(&format!("K = {k}")), "{msg}")
            }
            other => panic!("{io:?} K={k}: expected Unsupported, got {other:?}"),
        }
        assert!(case.o.bytes() == before.o.bytes(), "a refused call wrote o");
        assert!(
            case.state.as_ref().unwrap().bytes() == before.state.as_ref().unwrap().bytes(),
            "a refused call wrote the pool"
        );
    }
}
