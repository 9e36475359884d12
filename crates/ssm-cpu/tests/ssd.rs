//! SSD chunked prefill on the CPU: property tests against the f64 token-by-token recurrence.
//! (The conformance vectors run through `ssm-conformance`, on the reference and the CPU.)

mod common;

use common::{Engine, backends};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::ssd::{Pool, Problem};
use ssm_cpu::CpuBackend;
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, Run, compute_chunk_metadata, plan, reference};

// ---------------------------------------------------------------------------------------
// Property tests on random problems (the shared generator, `ssm_conformance::cases::ssd`).

/// Runs one engine on a problem (the shared generator's call, planned here).
fn run_engine(engine: Engine, cpus: &[CpuBackend], args: MambaChunkScanCombinedVarlenArgs<'_>) {
    let pl = plan(args).unwrap();
    match engine {
        Engine::Ref32 => reference::mamba_chunk_scan_combined_varlen(pl),
        Engine::Ref64 => reference::mamba_chunk_scan_combined_varlen_f64(pl),
        Engine::Cpu(k) => cpus[k].run(pl).unwrap(),
    }
}

/// The engine-taking form of the generator's runs.
trait RunOn {
    fn run_pooled(
        &self,
        engine: Engine,
        cpus: &[CpuBackend],
        intermediate: bool,
        pool: Option<&mut Pool>,
    ) -> (Vec<f32>, Vec<f32>);
    fn run(&self, engine: Engine, cpus: &[CpuBackend], intermediate: bool) -> (Vec<f32>, Vec<f32>) {
        self.run_pooled(engine, cpus, intermediate, None)
    }
}

impl RunOn for Problem {
    fn run_pooled(
        &self,
        engine: Engine,
        cpus: &[CpuBackend],
        intermediate: bool,
        pool: Option<&mut Pool>,
    ) -> (Vec<f32>, Vec<f32>) {
        self.run_pooled_with(intermediate, pool, |a| run_engine(engine, cpus, a))
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(!g.is_nan(), "{what}[{i}] was not written (NaN poison left)");
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}[{i}] = {g}, want {w}");
    }
}

fn check_problem(pr: &Problem, cpus: &[CpuBackend], label: &str) {
    let (atol, rtol) = if pr.bf16_io { (2e-2, 1e-2) } else { (2e-3, 1e-3) };
    for intermediate in [false, true] {
        let (o64, s64) = pr.run(Engine::Ref64, cpus, intermediate);
        for engine in [Engine::Ref32, Engine::Cpu(0), Engine::Cpu(1)] {
            let (o, s) = pr.run(engine, cpus, intermediate);
            let tag = format!("{label} {engine:?} intermediate={intermediate} bf16={}", pr.bf16_io);
            assert_close(&format!("{tag} out"), &o, &o64, atol, rtol);
            assert_close(&format!("{tag} states"), &s, &s64, 2e-3, 1e-3);
        }
    }
}

/// Uneven varlen batches (resumed and fresh sequences, short first/last chunks, groups < heads
/// and groups = heads, with and without initial states): the chunked CPU kernel and the f32
/// reference equal the f64 token-by-token recurrence, outputs and states (final and
/// intermediate), every element written.
#[test]
fn ssd_matches_the_f64_recurrence_on_uneven_varlen_batches() {
    let cpus = backends();
    let mut rng = ChaCha8Rng::seed_from_u64(0x55d);
    for case in 0..24 {
        let batch = rng.random_range(1..5);
        let seqlens: Vec<usize> = (0..batch).map(|_| rng.random_range(1..40)).collect();
        let computed: Vec<usize> =
            (0..batch).map(|_| if rng.random_bool(0.5) { rng.random_range(0..50) } else { 0 }).collect();
        let pr = Problem::random(&mut rng, seqlens, computed, case % 2 == 0);
        check_problem(&pr, &cpus, &format!("case {case}"));
    }
}

/// Running a sequence in two calls (the second starting from the first call's final state,
/// its chunks aligned by `compute_chunk_metadata` to the absolute position) gives the same
/// outputs and final state as one call.
#[test]
fn ssd_split_prefill_equals_one_shot() {
    let cpus = backends();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..6 {
        let total = rng.random_range(10..60);
        let cut = rng.random_range(1..total);
        let mut whole = Problem::random(&mut rng, vec![total], vec![0], case % 2 == 1);
        whole.init = None;
        whole.bf16_io = false;
        let (o_all, s_all) = whole.run(Engine::Cpu(1), &cpus, false);
        let first = whole.slice(0, cut, 0, None);
        let mut second = whole.slice(cut, total, cut, None);
        let (o1, s1) = first.run(Engine::Cpu(1), &cpus, false);
        second.init = Some(s1);
        let (o2, s2) = second.run(Engine::Cpu(1), &cpus, false);
        let joined: Vec<f32> = o1.into_iter().chain(o2).collect();
        assert_close(&format!("split {case} out"), &joined, &o_all, 1e-3, 1e-3);
        assert_close(&format!("split {case} state"), &s2, &s_all, 1e-3, 1e-3);
    }
}

/// A prefix-caching checkpoint (a chunk ended on it by `compute_chunk_metadata_with_checkpoints`,
/// its state written to its own slot in the call) equals, bit for bit, the final state of a
/// prefill of the tokens before it; the outputs before it are those of that prefill, bit for bit,
/// and the whole call's final state matches the call without the checkpoint.
#[test]
fn ssd_checkpoint_equals_the_prefill_cut_at_it() {
    let cpus = backends();
    let mut rng = ChaCha8Rng::seed_from_u64(0xc4e);
    for case in 0..8 {
        let total = rng.random_range(3..70);
        let at = rng.random_range(1..total);
        let computed = if case % 2 == 0 { 0 } else { rng.random_range(1..40) };
        let mut whole = Problem::random(&mut rng, vec![total], vec![computed], case % 3 == 0);
        whole.bf16_io = false;
        let (h, p) = (whole.heads, whole.dim);
        let per = h * p * whole.dstate;
        let init: Vec<f32> = (0..per).map(|i| ((i * 29 % 83) as f32) * 0.01 - 0.4).collect();
        let (ckpt, chunk) = whole.with_checkpoint(computed, at);
        let mut pool = Pool::one_checkpoint(&init, chunk);
        let (o_ckpt, _) = ckpt.run_pooled(Engine::Cpu(1), &cpus, false, Some(&mut pool));
        // The prefill of the first `at` tokens, from the same state at the same position.
        let (o_cut, s_cut) = whole.slice(0, at, computed, Some(init.clone())).run(Engine::Cpu(1), &cpus, false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&pool.states[per..]), bits(&s_cut), "case {case}: checkpoint at {at} of {total}");
        assert_eq!(bits(&o_ckpt[..at * h * p]), bits(&o_cut), "case {case}: outputs before the checkpoint");
        whole.init = Some(init);
        let (o_all, s_all) = whole.run(Engine::Cpu(1), &cpus, false);
        assert_close(&format!("case {case} out"), &o_ckpt, &o_all, 1e-3, 1e-3);
        assert_close(&format!("case {case} final"), &pool.states[..per], &s_all, 1e-3, 1e-3);
    }
}

/// An empty sequence (no chunks, `last_chunk_indices = -1`) returns its initial state.
#[test]
fn ssd_empty_sequence_returns_its_initial_state() {
    let cpus = backends();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut pr = Problem::random(&mut rng, vec![9, 1, 6], vec![0, 0, 3], true);
    // Sequence 1 becomes empty: drop its token and rebuild the metadata by hand.
    let (h, p, g, n) = (pr.heads, pr.dim, pr.groups, pr.dstate);
    let cut = |v: &mut Vec<f32>, w: usize| {
        v.drain(9 * w..10 * w);
    };
    cut(&mut pr.x, h * p);
    cut(&mut pr.dt, h);
    cut(&mut pr.b, g * n);
    cut(&mut pr.c, g * n);
    if let Some(z) = pr.z.as_mut() {
        cut(z, h * p);
    }
    pr.seqlens = vec![9, 0, 6];
    pr.cu_seqlens = vec![0, 9, 9, 15];
    let m = compute_chunk_metadata(&[0, 9, 9, 15], &[0, 0, 3], pr.chunk);
    pr.cu_chunk = m.cu_chunk_seqlens;
    pr.seq_idx = m.seq_idx;
    pr.last_chunk = m.last_chunk_indices;
    assert_eq!(pr.last_chunk[1], -1, "an empty sequence has no chunk");
    pr.init = Some((0..3 * h * p * n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect());
    check_problem(&pr, &cpus, "empty sequence");
    let (_, s) = pr.run(Engine::Cpu(1), &cpus, false);
    let per = h * p * n;
    assert_eq!(&s[per..2 * per], &pr.init.as_ref().unwrap()[per..2 * per]);
}

/// Pool addressing: on random batches (pads, permuted slots, sequences without an initial
/// state, reads and writes of different slots, empty-free uneven varlen, and in two cases of
/// three prefix-caching checkpoints), every engine's pooled call equals, bit for bit, the
/// gather → call → scatter sequence it replaces (for checkpoints: every chunk's state returned
/// and the named ones scattered, as vLLM's `store_prefill_checkpoint`; outputs and the whole
/// pool, so untouched slots keep their bits); the CPU's pooled pool matches the f64
/// reference's.
#[test]
fn ssd_pool_addressing_equals_gather_call_scatter() {
    let cpus = backends();
    let mut rng = ChaCha8Rng::seed_from_u64(0x9001);
    for case in 0..12 {
        let batch = rng.random_range(1..5);
        let seqlens: Vec<usize> = (0..batch).map(|_| rng.random_range(1..30)).collect();
        let computed: Vec<usize> =
            (0..batch).map(|_| if rng.random_bool(0.5) { rng.random_range(0..40) } else { 0 }).collect();
        let mut pr = Problem::random(&mut rng, seqlens, computed, case % 2 == 0);
        let per = pr.heads * pr.dim * pr.dstate;
        let mut pool = Pool::random(&mut rng, batch, per);
        if case % 3 != 0 {
            pool.add_checkpoints(&mut rng, &pr, per);
        }
        let mut ref64 = pool.clone();
        pr.run_pooled(Engine::Ref64, &cpus, false, Some(&mut ref64));
        for engine in [Engine::Ref32, Engine::Cpu(0), Engine::Cpu(1)] {
            let tag = format!("case {case} {engine:?}");
            let mut pooled = pool.clone();
            let (o_pool, _) = pr.run_pooled(engine, &cpus, false, Some(&mut pooled));
            pr.init = Some(pool.gather(per));
            let (o_old, finals) = pr.run(engine, &cpus, false);
            let mut old = pool.clone();
            old.scatter(&finals, per);
            // vLLM's checkpoint store: every chunk's state returned, the named ones scattered.
            let (_, chunk_states) = pr.run(engine, &cpus, true);
            old.scatter_checkpoints(&chunk_states, per);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&o_pool), bits(&o_old), "{tag}: out");
            assert_eq!(bits(&pooled.states), bits(&old.states), "{tag}: pool");
            for (s, chunk) in pool.states.chunks(per).enumerate() {
                if !pool.writes(s) {
                    assert_eq!(bits(chunk), bits(&pooled.states[s * per..(s + 1) * per]), "{tag}: slot {s} touched");
                }
            }
            assert_close(&format!("{tag} pool vs f64"), &pooled.states, &ref64.states, 2e-3, 1e-3);
        }
    }
}
