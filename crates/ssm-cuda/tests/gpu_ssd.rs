//! GPU tests of the SSD chunked prefill (`mamba_chunk_scan_combined_varlen`) on CUDA. Each
//! skips with a printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns
//! the skip into a failure. Random problems come from `ssm_conformance::cases::ssd`, the
//! generator the CPU backend's SSD tests run too; the oracle is the f64 token-by-token
//! recurrence of `ssm_ssd::reference`. (The golden vectors run through `gpu_conformance`.)

// The staging error is the test harness's (large) error enum, on a copy path, never a decode path.
#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::ssd::{Pool, Problem};
use ssm_cuda::testing::{DeviceSsdArgs, MirrorError, run_staged};
use ssm_cuda::{CudaBackend, CudaError, DeviceErrors};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, plan, reference};

fn f64_ref(a: MambaChunkScanCombinedVarlenArgs<'_>) {
    reference::mamba_chunk_scan_combined_varlen_f64(plan(a).unwrap())
}

/// Runs `pr` on CUDA (every tensor staged, so the metadata is checked on the device).
fn cuda(be: &CudaBackend, pr: &Problem, intermediate: bool, pool: Option<&mut Pool>) -> (Vec<f32>, Vec<f32>) {
    pr.run_pooled_with(intermediate, pool, |a| run_staged::<DeviceSsdArgs>(be, a).unwrap())
}

/// Every element written (no NaN poison left) and `max |got - want| <= tol · max(1, max |want|)`:
/// tensor-core operands round to bf16 or tf32, so the error scales with the largest value.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let mut worst = (0.0f32, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(!g.is_nan(), "{what}[{i}] was not written (NaN poison left)");
        let e = (g - w).abs();
        if e > worst.0 {
            worst = (e, i);
        }
    }
    assert!(
        worst.0 <= tol * scale,
        "{what}: |got - want| = {} at {} (got {}, want {}), above {tol} x {scale}",
        worst.0,
        worst.1,
        got[worst.1],
        want[worst.1]
    );
}

/// bf16 operands (bf16 activations) or tf32 (f32 activations).
fn tol(pr: &Problem) -> f32 {
    if pr.bf16_io { 2e-2 } else { 4e-3 }
}

fn check(be: &CudaBackend, pr: &Problem, label: &str) {
    check_against(be, pr, label, &references(pr));
}

/// The f64 recurrence's outputs and states of `pr`, without and with every chunk's state.
fn references(pr: &Problem) -> [(Vec<f32>, Vec<f32>); 2] {
    [false, true].map(|intermediate| pr.run_with(intermediate, f64_ref))
}

/// [`check`] with the references computed beforehand (`references`).
fn check_against(be: &CudaBackend, pr: &Problem, label: &str, refs: &[(Vec<f32>, Vec<f32>); 2]) {
    for (intermediate, (o64, s64)) in [false, true].into_iter().zip(refs) {
        let (o, s) = cuda(be, pr, intermediate, None);
        let tag = format!("{label} intermediate={intermediate} bf16={}", pr.bf16_io);
        assert_close(&format!("{tag} out"), &o, o64, tol(pr));
        assert_close(&format!("{tag} states"), &s, s64, tol(pr));
    }
}

fn seqs(rng: &mut ChaCha8Rng, batch: usize, max_len: usize, max_computed: usize) -> (Vec<usize>, Vec<usize>) {
    let seqlens = (0..batch).map(|_| rng.random_range(1..max_len)).collect();
    let computed =
        (0..batch).map(|_| if rng.random_bool(0.5) { rng.random_range(0..max_computed) } else { 0 }).collect();
    (seqlens, computed)
}

/// The CPU tests' matrix (odd head dims and dstates, chunks 4–16, groups < and = heads, D, z,
/// dt_bias, initial states, dt_limit, f32 and bf16 activations, resumed sequences with short
/// first chunks): CUDA equals the f64 recurrence, outputs and states (final and per chunk).
#[test]
fn ssd_matches_the_f64_recurrence_on_uneven_varlen_batches() {
    let Some(be) = gpu("ssd_matches_the_f64_recurrence_on_uneven_varlen_batches") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(0x55d);
    for case in 0..24 {
        let batch = rng.random_range(1..5);
        let (seqlens, computed) = seqs(&mut rng, batch, 40, 50);
        let pr = Problem::random(&mut rng, seqlens, computed, case % 2 == 0);
        check(&be, &pr, &format!("case {case}"));
    }
}

/// Model shapes and every chunk size the kernels tile: Mamba2-2.7B-like (P 64, N 128, G 1,
/// chunk 256), Nemotron-Nano-like (P 80, G < H, chunk 128), chunk 64 with N 64, a chunk of 16
/// with odd sizes, and sequences several chunks long with resumed (short) first chunks.
#[test]
fn ssd_matches_the_f64_recurrence_on_model_shapes() {
    let Some(be) = gpu("ssd_matches_the_f64_recurrence_on_model_shapes") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(0x2b7);
    let shapes: [[usize; 5]; 5] =
        [[4, 1, 64, 128, 256], [4, 2, 80, 128, 128], [6, 3, 32, 64, 64], [3, 1, 19, 13, 16], [2, 2, 128, 256, 128]];
    let mut cases = Vec::new();
    for (i, shape) in shapes.into_iter().enumerate() {
        for bf16 in [true, false] {
            let batch = rng.random_range(1..4);
            let (seqlens, computed) = seqs(&mut rng, batch, 3 * shape[4] + 7, 2 * shape[4]);
            let mut pr = Problem::random_shaped(&mut rng, seqlens, computed, shape);
            pr.bf16_io = bf16;
            cases.push((format!("shape {i} {shape:?}"), pr));
        }
    }
    // The f64 recurrence of these shapes takes most of the test's time: the cases in parallel.
    let refs = ssm_cuda::compile::parallel_map(&cases, |(_, pr)| references(pr));
    for ((label, pr), r) in cases.iter().zip(&refs) {
        check_against(&be, pr, label, r);
    }
}

/// Pool addressing on CUDA: the pooled call (in two cases of three with prefix-caching
/// checkpoints) equals, bit for bit, the gather → call → scatter sequence it replaces (for
/// checkpoints: every chunk's state returned and the named ones scattered; outputs and the
/// whole pool; untouched slots keep their bits), and the pool matches the f64 reference's.
#[test]
fn ssd_pool_addressing_equals_gather_call_scatter() {
    let Some(be) = gpu("ssd_pool_addressing_equals_gather_call_scatter") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(0x9001);
    for case in 0..10 {
        let batch = rng.random_range(1..5);
        let (seqlens, computed) = seqs(&mut rng, batch, 30, 40);
        let mut pr = Problem::random(&mut rng, seqlens, computed, case % 2 == 0);
        let per = pr.heads * pr.dim * pr.dstate;
        let mut pool = Pool::random(&mut rng, batch, per);
        if case % 3 != 0 {
            pool.add_checkpoints(&mut rng, &pr, per);
        }
        let mut ref64 = pool.clone();
        pr.run_pooled_with(false, Some(&mut ref64), f64_ref);
        let mut pooled = pool.clone();
        let (o_pool, _) = cuda(&be, &pr, false, Some(&mut pooled));
        pr.init = Some(pool.gather(per));
        let (o_old, finals) = cuda(&be, &pr, false, None);
        let mut old = pool.clone();
        old.scatter(&finals, per);
        let (_, chunk_states) = cuda(&be, &pr, true, None);
        old.scatter_checkpoints(&chunk_states, per);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&o_pool), bits(&o_old), "case {case}: out");
        assert_eq!(bits(&pooled.states), bits(&old.states), "case {case}: pool");
        for (s, chunk) in pool.states.chunks(per).enumerate() {
            if !pool.writes(s) {
                assert_eq!(bits(chunk), bits(&pooled.states[s * per..(s + 1) * per]), "case {case}: slot {s} touched");
            }
        }
        assert_close(&format!("case {case} pool vs f64"), &pooled.states, &ref64.states, tol(&pr));
    }
}

/// A prefix-caching checkpoint on CUDA equals the final state of a prefill cut at it (and the
/// outputs before it are that prefill's), as on the CPU.
#[test]
fn ssd_checkpoint_equals_the_prefill_cut_at_it() {
    let Some(be) = gpu("ssd_checkpoint_equals_the_prefill_cut_at_it") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(0xc4e);
    for case in 0..6 {
        let total = rng.random_range(3..300);
        let at = rng.random_range(1..total);
        let computed = if case % 2 == 0 { 0 } else { rng.random_range(1..300) };
        let whole = Problem::random(&mut rng, vec![total], vec![computed], case % 3 == 0);
        let per = whole.heads * whole.dim * whole.dstate;
        let init: Vec<f32> = (0..per).map(|i| ((i * 29 % 83) as f32) * 0.01 - 0.4).collect();
        let (ckpt, chunk) = whole.with_checkpoint(computed, at);
        let mut pool = Pool::one_checkpoint(&init, chunk);
        let (o_ckpt, _) = cuda(&be, &ckpt, false, Some(&mut pool));
        let cut = whole.slice(0, at, computed, Some(init));
        let (o_cut, s_cut) = cuda(&be, &cut, false, None);
        let tag = format!("case {case}: checkpoint at {at} of {total}");
        assert_close(&tag, &pool.states[per..], &s_cut, tol(&whole));
        assert_close(&format!("{tag}, outputs"), &o_ckpt[..o_cut.len()], &o_cut, tol(&whole));
    }
}

/// Garbage device-resident metadata and slots: a chunk bound past the tokens, a `seq_idx` and a
/// `last_chunk_indices` entry out of range, slots out of range, checkpoint chunks of another
/// sequence or out of range and a checkpoint slot out of range. The call completes (no fault;
/// the bundle runs this under compute-sanitizer), the error word names the kind, untouched
/// slots keep their bits, and a clean call after it succeeds.
#[test]
fn ssd_garbage_device_metadata_is_skipped_and_reported() {
    let Some(be) = gpu("ssd_garbage_device_metadata_is_skipped_and_reported") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(0xbad);
    let base = Problem::random(&mut rng, vec![9, 14, 5], vec![0, 3, 0], true);
    let per = base.heads * base.dim * base.dstate;
    let run = |pr: &Problem, pool: Option<&mut Pool>| {
        let mut res = None;
        pr.run_pooled_with(false, pool, |a| res = Some(run_staged::<DeviceSsdArgs>(&be, a)));
        res.expect("ran")
    };
    let expect_bits = |res: Result<(), MirrorError>, bit: u32, what: &str| match res {
        Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
            assert!(w & bit != 0, "{what}: error word {w:#x} lacks {bit:#x}")
        }
        other => panic!("{what}: expected InvalidIndices, got {other:?}"),
    };
    let tokens = base.tokens() as i32;
    let mut pr = base.clone();
    let n = pr.cu_chunk.len();
    pr.cu_chunk[n - 2] = tokens + 1000;
    expect_bits(run(&pr, None), DeviceErrors::CU_SEQLENS, "cu_chunk_seqlens past the tokens");
    let mut pr = base.clone();
    pr.seq_idx[0] = 77;
    pr.init = Some(vec![0.5; 3 * per]);
    expect_bits(run(&pr, None), DeviceErrors::CU_SEQLENS, "seq_idx out of range");
    let mut pr = base.clone();
    pr.last_chunk[1] = 1 << 20;
    expect_bits(run(&pr, None), DeviceErrors::CU_SEQLENS, "last_chunk_indices out of range");
    let mut pool = Pool::random(&mut rng, 3, per);
    pool.read[0] = 1 << 30;
    pool.has_init[0] = 1;
    pool.write[2] = -7;
    let before = pool.clone();
    expect_bits(run(&base, Some(&mut pool)), DeviceErrors::SLOT, "slots out of range");
    for (s, chunk) in before.states.chunks(per).enumerate() {
        if !before.write.contains(&(s as i64)) || before.write[2] == s as i64 {
            let same = chunk.iter().zip(&pool.states[s * per..(s + 1) * per]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "slot {s} was touched");
        }
    }
    // Checkpoints: another sequence's chunk, a negative chunk other than -1, and a slot out of
    // range. Each is skipped and reported; no checkpoint slot changes.
    let mut pool = Pool::random(&mut rng, 3, per);
    pool.add_checkpoints(&mut rng, &base, per);
    let first_ckpt_slot = pool.states.len() / per - 3;
    let (chunks, slots) = pool.checkpoints.as_mut().expect("added");
    *chunks = vec![base.last_chunk[2] as i64, base.last_chunk[1] as i64, -5];
    *slots = vec![first_ckpt_slot as i64, 1 << 30, (first_ckpt_slot + 2) as i64];
    let before = pool.clone();
    match run(&base, Some(&mut pool)) {
        Err(MirrorError::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
            let want = DeviceErrors::CU_SEQLENS | DeviceErrors::SLOT;
            assert_eq!(w & want, want, "garbage checkpoints: error word {w:#x}");
        }
        other => panic!("garbage checkpoints: expected InvalidIndices, got {other:?}"),
    }
    for s in first_ckpt_slot..first_ckpt_slot + 3 {
        let (a, b) = (&before.states[s * per..(s + 1) * per], &pool.states[s * per..(s + 1) * per]);
        assert!(a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits()), "checkpoint slot {s} was touched");
    }
    // The error word was read and cleared: a clean call succeeds.
    let (o, _) = cuda(&be, &base, false, None);
    assert!(o.iter().all(|v| v.is_finite()));
}
