//! SSD chunked prefill on the CPU: property tests against the f64 token-by-token recurrence.
//! (The conformance vectors run through `ssm-conformance`, on the reference and the CPU.)

mod common;

use common::{Engine, backends};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_cpu::CpuBackend;
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, Run, compute_chunk_metadata, plan, reference};
use ssm_tensor::{DType, TensorMut, TensorRef, bf16};

// ---------------------------------------------------------------------------------------
// Property tests on random problems.

/// A random SSD problem in f32 (or bf16 activations), with its chunk metadata.
struct Problem {
    heads: usize,
    dim: usize,
    dstate: usize,
    groups: usize,
    chunk: usize,
    seqlens: Vec<usize>,
    x: Vec<f32>,
    dt: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    d: Option<(Vec<f32>, bool)>,
    z: Option<Vec<f32>>,
    dt_bias: Option<Vec<f32>>,
    init: Option<Vec<f32>>,
    softplus: bool,
    dt_limit: (f32, f32),
    cu_seqlens: Vec<i32>,
    cu_chunk: Vec<i32>,
    seq_idx: Vec<i32>,
    last_chunk: Vec<i32>,
    bf16_io: bool,
}

fn fill(rng: &mut ChaCha8Rng, n: usize, mut f: impl FnMut(&mut ChaCha8Rng) -> f32) -> Vec<f32> {
    (0..n).map(|_| f(rng)).collect()
}

fn normal(rng: &mut ChaCha8Rng) -> f32 {
    // Sum of uniforms: close enough to N(0, 1) for test data.
    (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 1.7 - 3.4
}

impl Problem {
    fn tokens(&self) -> usize {
        self.seqlens.iter().sum()
    }

    fn random(rng: &mut ChaCha8Rng, seqlens: Vec<usize>, computed: Vec<usize>, groups_lt_heads: bool) -> Self {
        let heads = [2, 4, 6][rng.random_range(0..3)];
        let groups = if groups_lt_heads { [1, heads / 2][rng.random_range(0..2)] } else { heads };
        let dim = [5, 8, 16, 19][rng.random_range(0..4)];
        let dstate = [4, 8, 16, 13][rng.random_range(0..4)];
        let chunk = [4, 8, 16][rng.random_range(0..3)];
        let t: usize = seqlens.iter().sum();
        let batch = seqlens.len();
        let x = fill(rng, t * heads * dim, normal);
        let softplus = rng.random_bool(0.7);
        let dt = if softplus {
            fill(rng, t * heads, |r| normal(r) * 0.5 - 1.0)
        } else {
            fill(rng, t * heads, |r| r.random_range(-0.05..0.4))
        };
        let a = fill(rng, heads, |r| -(r.random_range(0.0f32..2.0)).exp());
        let b = fill(rng, t * groups * dstate, normal);
        let c = fill(rng, t * groups * dstate, normal);
        let d = match rng.random_range(0..3) {
            0 => None,
            1 => Some((fill(rng, heads, |r| 1.0 + normal(r) * 0.3), false)),
            _ => Some((fill(rng, heads * dim, |r| 1.0 + normal(r) * 0.3), true)),
        };
        let z = rng.random_bool(0.4).then(|| fill(rng, t * heads * dim, normal));
        let dt_bias = rng.random_bool(0.6).then(|| fill(rng, heads, |r| normal(r) * 0.3));
        let init = rng.random_bool(0.6).then(|| fill(rng, batch * heads * dim * dstate, |r| normal(r) * 0.5));
        let dt_limit = if rng.random_bool(0.3) { (0.01, 0.3) } else { (0.0, f32::INFINITY) };
        let mut cu = vec![0i64];
        for &l in &seqlens {
            cu.push(cu.last().unwrap() + l as i64);
        }
        let comp: Vec<i64> = computed.iter().map(|&c| c as i64).collect();
        let m = compute_chunk_metadata(&cu, &comp, chunk);
        Problem {
            heads,
            dim,
            dstate,
            groups,
            chunk,
            x,
            dt,
            a,
            b,
            c,
            d,
            z,
            dt_bias,
            init,
            softplus,
            dt_limit,
            cu_seqlens: cu.iter().map(|&v| v as i32).collect(),
            cu_chunk: m.cu_chunk_seqlens,
            seq_idx: m.seq_idx,
            last_chunk: m.last_chunk_indices,
            seqlens,
            bf16_io: rng.random_bool(0.3),
        }
    }

    /// Runs one engine; returns (out, states) as f32, NaN-poisoned before the call.
    fn run(&self, engine: Engine, cpus: &[CpuBackend], intermediate: bool) -> (Vec<f32>, Vec<f32>) {
        self.run_pooled(engine, cpus, intermediate, None)
    }

    /// [`Problem::run`], with the initial states read from and the final states written to
    /// `pool` (`[slots, H, P, N]` f32) through its tables when given (then `init` is unused and
    /// the returned states are empty).
    fn run_pooled(
        &self,
        engine: Engine,
        cpus: &[CpuBackend],
        intermediate: bool,
        pool: Option<&mut Pool>,
    ) -> (Vec<f32>, Vec<f32>) {
        let (t, h, p, n, g) = (self.tokens(), self.heads, self.dim, self.dstate, self.groups);
        let batch = self.seqlens.len();
        let nchunks = self.seq_idx.len();
        let rows = if intermediate { nchunks } else { batch };
        let to_bf = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<bf16>>();
        let (xb, bb, cb, zb) = (to_bf(&self.x), to_bf(&self.b), to_bf(&self.c), self.z.as_deref().map(to_bf));
        let mut out = vec![f32::NAN; t * h * p];
        let mut out_b = vec![bf16::NAN; t * h * p];
        let mut states = vec![f32::NAN; rows * h * p * n];
        macro_rules! io {
            ($f:expr, $b:expr, $shape:expr) => {
                if self.bf16_io {
                    TensorRef::from_slice(&$b[..], $shape).unwrap()
                } else {
                    TensorRef::from_slice(&$f[..], $shape).unwrap()
                }
            };
        }
        let out_view = if self.bf16_io {
            TensorMut::from_slice(&mut out_b[..], &[t, h, p]).unwrap()
        } else {
            TensorMut::from_slice(&mut out[..], &[t, h, p]).unwrap()
        };
        let args = MambaChunkScanCombinedVarlenArgs {
            x: io!(self.x, xb, &[t, h, p]),
            dt: TensorRef::from_slice(&self.dt, &[t, h]).unwrap(),
            a: TensorRef::from_slice(&self.a, &[h]).unwrap(),
            b: io!(self.b, bb, &[t, g, n]),
            c: io!(self.c, cb, &[t, g, n]),
            chunk_size: self.chunk,
            cu_seqlens: TensorRef::from_slice(&self.cu_seqlens, &[batch + 1]).unwrap(),
            cu_chunk_seqlens: TensorRef::from_slice(&self.cu_chunk, &[nchunks + 1]).unwrap(),
            last_chunk_indices: TensorRef::from_slice(&self.last_chunk, &[batch]).unwrap(),
            seq_idx: TensorRef::from_slice(&self.seq_idx, &[nchunks]).unwrap(),
            out: Some(out_view),
            d: self.d.as_ref().map(|(d, per_dim)| {
                let shape: Vec<usize> = if *per_dim { vec![h, p] } else { vec![h] };
                TensorRef::from_slice(d, &shape).unwrap()
            }),
            z: match (&self.z, &zb) {
                (Some(z), Some(zb)) => Some(io!(z, zb, &[t, h, p])),
                _ => None,
            },
            dt_bias: self.dt_bias.as_ref().map(|b| TensorRef::from_slice(b, &[h]).unwrap()),
            initial_states: self.init.as_ref().map(|s| TensorRef::from_slice(s, &[batch, h, p, n]).unwrap()),
            ssm_state: None,
            initial_state_indices: None,
            has_initial_state: None,
            final_state_indices: None,
            pad_slot_id: None,
            dt_softplus: self.softplus,
            dt_limit: self.dt_limit,
            return_intermediate_states: intermediate,
            state_dtype: Some(DType::F32),
            varlen_states: Some(TensorMut::from_slice(&mut states[..], &[rows, h, p, n]).unwrap()),
            scratch: None,
        };
        let mut args = args;
        if let Some(pool) = pool {
            let slots = pool.states.len() / (h * p * n);
            args.initial_states = None;
            args.varlen_states = None;
            args.ssm_state = Some(TensorMut::from_slice(&mut pool.states[..], &[slots, h, p, n]).unwrap());
            args.initial_state_indices = Some(TensorRef::from_slice(&pool.read, &[batch]).unwrap());
            args.has_initial_state = Some(TensorRef::from_slice(&pool.has_init, &[batch]).unwrap());
            args.final_state_indices = Some(TensorRef::from_slice(&pool.write, &[batch]).unwrap());
            args.pad_slot_id = Some(PAD);
        }
        let pl = plan(args).unwrap();
        match engine {
            Engine::Ref32 => reference::mamba_chunk_scan_combined_varlen(pl),
            Engine::Ref64 => reference::mamba_chunk_scan_combined_varlen_f64(pl),
            Engine::Cpu(k) => cpus[k].run(pl).unwrap(),
        }
        if self.bf16_io {
            out = out_b.iter().map(|v| v.to_f32()).collect();
        }
        (out, states)
    }
}

/// The pad of the pool tests' slot tables.
const PAD: i64 = -1;

/// A state pool with its tables: sequence `b` reads slot `read[b]` (where `has_init[b]`) and
/// writes slot `write[b]`; `PAD` entries read zeros / write nothing.
#[derive(Clone)]
struct Pool {
    states: Vec<f32>,
    read: Vec<i64>,
    write: Vec<i64>,
    has_init: Vec<u8>,
}

impl Pool {
    /// Random slots for `batch` sequences in a pool with 3 spare slots: permuted, some pads,
    /// some sequences reading nothing, some reading one slot and writing another (never one
    /// another sequence uses).
    fn random(rng: &mut ChaCha8Rng, batch: usize, per: usize) -> Self {
        let slots = 2 * batch + 3;
        let mut order: Vec<i64> = (0..slots as i64).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let (mut read, mut write, mut has_init) = (vec![], vec![], vec![]);
        for b in 0..batch {
            let own = order[2 * b];
            read.push(if rng.random_bool(0.2) { PAD } else { own });
            write.push(match rng.random_range(0..5) {
                0 => PAD,
                1 => order[2 * b + 1],
                _ => own,
            });
            has_init.push(rng.random_bool(0.75) as u8);
        }
        let states = (0..slots * per).map(|i| ((i * 37 % 101) as f32) * 0.01 - 0.5).collect();
        Pool { states, read, write, has_init }
    }

    /// vLLM's gather: `where(has_init, pool[read], 0)` as `[batch, H, P, N]`.
    fn gather(&self, per: usize) -> Vec<f32> {
        let mut init = vec![0.0; self.read.len() * per];
        for (b, (&s, &has)) in self.read.iter().zip(&self.has_init).enumerate() {
            if has != 0 && s != PAD {
                init[b * per..(b + 1) * per].copy_from_slice(&self.states[s as usize * per..(s as usize + 1) * per]);
            }
        }
        init
    }

    /// vLLM's scatter: `pool[write] = finals` (pads skipped).
    fn scatter(&mut self, finals: &[f32], per: usize) {
        for (b, &s) in self.write.iter().enumerate() {
            if s != PAD {
                self.states[s as usize * per..(s as usize + 1) * per].copy_from_slice(&finals[b * per..(b + 1) * per]);
            }
        }
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
        let (h, p, n, g) = (whole.heads, whole.dim, whole.dstate, whole.groups);
        let part = |from: usize, to: usize, init: Option<Vec<f32>>| {
            let sl = |v: &[f32], w: usize| v[from * w..to * w].to_vec();
            let len = to - from;
            let m = compute_chunk_metadata(&[0, len as i64], &[from as i64], whole.chunk);
            Problem {
                seqlens: vec![len],
                x: sl(&whole.x, h * p),
                dt: sl(&whole.dt, h),
                b: sl(&whole.b, g * n),
                c: sl(&whole.c, g * n),
                z: whole.z.as_ref().map(|z| sl(z, h * p)),
                a: whole.a.clone(),
                d: whole.d.clone(),
                dt_bias: whole.dt_bias.clone(),
                init,
                cu_seqlens: vec![0, len as i32],
                cu_chunk: m.cu_chunk_seqlens,
                seq_idx: m.seq_idx,
                last_chunk: m.last_chunk_indices,
                ..Problem::random(&mut ChaCha8Rng::seed_from_u64(0), vec![1], vec![0], false)
            }
        };
        let mut first = part(0, cut, None);
        let mut second = part(cut, total, None);
        for pr in [&mut first, &mut second] {
            pr.heads = h;
            pr.dim = p;
            pr.dstate = n;
            pr.groups = g;
            pr.chunk = whole.chunk;
            pr.softplus = whole.softplus;
            pr.dt_limit = whole.dt_limit;
            pr.bf16_io = false;
        }
        let (o1, s1) = first.run(Engine::Cpu(1), &cpus, false);
        second.init = Some(s1);
        let (o2, s2) = second.run(Engine::Cpu(1), &cpus, false);
        let joined: Vec<f32> = o1.into_iter().chain(o2).collect();
        assert_close(&format!("split {case} out"), &joined, &o_all, 1e-3, 1e-3);
        assert_close(&format!("split {case} state"), &s2, &s_all, 1e-3, 1e-3);
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
    pr.last_chunk[1] = -1;
    pr.init = Some((0..3 * h * p * n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect());
    check_problem(&pr, &cpus, "empty sequence");
    let (_, s) = pr.run(Engine::Cpu(1), &cpus, false);
    let per = h * p * n;
    assert_eq!(&s[per..2 * per], &pr.init.as_ref().unwrap()[per..2 * per]);
}

/// Pool addressing: on random batches (pads, permuted slots, sequences without an initial
/// state, reads and writes of different slots, empty-free uneven varlen), every engine's pooled
/// call equals, bit for bit, the gather → call → scatter sequence it replaces (outputs and the
/// whole pool, so untouched slots keep their bits); the CPU's pooled pool matches the f64
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
        let pool = Pool::random(&mut rng, batch, per);
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
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&o_pool), bits(&o_old), "{tag}: out");
            assert_eq!(bits(&pooled.states), bits(&old.states), "{tag}: pool");
            for (s, chunk) in pool.states.chunks(per).enumerate() {
                if !pool.write.contains(&(s as i64)) {
                    assert_eq!(bits(chunk), bits(&pooled.states[s * per..(s + 1) * per]), "{tag}: slot {s} touched");
                }
            }
            assert_close(&format!("{tag} pool vs f64"), &pooled.states, &ref64.states, 2e-3, 1e-3);
        }
    }
}
