//! ReplaySSM on the CPU (the tracker conformance vectors run through `ssm-conformance`): the
//! checkpointing SSU against the f64 reference on random rings, and 40-step decodes
//! (one-token with tracker advances; speculative windows committed with random accepted
//! counts) against the plain SSU recurrence on the accepted tokens.

mod common;

use common::{Engine, backends};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::cases::ring::Trackers;
use ssm_cpu::CpuBackend;
use ssm_ring::{CheckpointingSsuArgs, CommitRingTrackersArgs, Run, UpdateRingTrackersArgs, plan, reference};
use ssm_tensor::{DType, TensorMut, TensorRef, bf16};

// ---------------------------------------------------------------------------------------
// A model, the ReplaySSM pools, and one checkpointing step.

fn fill(rng: &mut ChaCha8Rng, n: usize, mut f: impl FnMut(&mut ChaCha8Rng) -> f32) -> Vec<f32> {
    (0..n).map(|_| f(rng)).collect()
}

fn normal(rng: &mut ChaCha8Rng) -> f32 {
    (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 1.7 - 3.4
}

struct Model {
    heads: usize,
    groups: usize,
    dim: usize,
    dstate: usize,
    a: Vec<f32>,
    d: Option<Vec<f32>>,
    dt_bias: Option<Vec<f32>>,
    softplus: bool,
}

impl Model {
    fn random(rng: &mut ChaCha8Rng) -> Self {
        let heads = [2, 4][rng.random_range(0..2)];
        let groups = [1, heads / 2, heads][rng.random_range(0..3)];
        let dim = [3, 8, 12][rng.random_range(0..3)];
        let dstate = [8, 5, 16][rng.random_range(0..3)];
        Model {
            heads,
            groups,
            dim,
            dstate,
            a: fill(rng, heads, |r| -(r.random_range(0.0f32..1.5)).exp()),
            d: rng.random_bool(0.7).then(|| fill(rng, heads, |r| 1.0 + normal(r) * 0.2)),
            dt_bias: rng.random_bool(0.7).then(|| fill(rng, heads, |r| normal(r) * 0.3 - 1.0)),
            softplus: rng.random_bool(0.8),
        }
    }
    fn dt(&self, raw: f32, h: usize) -> f64 {
        let mut v = raw as f64 + self.dt_bias.as_ref().map_or(0.0, |b| b[h] as f64);
        if self.softplus && v <= 20.0 {
            v = v.exp().ln_1p();
        }
        v
    }
}

/// The ReplaySSM pools of `cache` slots, ring length `l`; state and caches in `dtype`.
#[derive(Clone)]
struct Pools {
    cache: usize,
    l: usize,
    dtype: DType,
    state: Vec<f32>,
    state_b: Vec<bf16>,
    x_cache: Vec<f32>,
    b_cache: Vec<f32>,
    dt_cache: Vec<f32>,
    trackers: Trackers,
}

impl Pools {
    fn new(m: &Model, cache: usize, l: usize, dtype: DType, state: Vec<f32>) -> Self {
        let state_b = state.iter().map(|&v| bf16::from_f32(v)).collect();
        Pools {
            cache,
            l,
            dtype,
            state,
            state_b,
            x_cache: vec![0.0; cache * m.heads * l * m.dim],
            b_cache: vec![0.0; cache * m.groups * l * m.dstate],
            dt_cache: vec![0.0; cache * m.heads * l],
            trackers: Trackers::zeros(cache),
        }
    }
    fn state_f32(&self) -> Vec<f32> {
        if self.dtype == DType::BF16 { self.state_b.iter().map(|v| v.to_f32()).collect() } else { self.state.clone() }
    }
}

/// New tokens of one step: `[rows, H, P]` etc. in a one-token, dense or varlen form.
struct Step {
    /// `None`: one-token `[batch, ...]`; `Some((cu, max_seqlen, dense))`.
    varlen: Option<(Vec<i32>, usize, bool)>,
    x: Vec<f32>,
    dt: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    z: Option<Vec<f32>>,
    slots: Vec<i32>,
    pad: Option<i64>,
}

impl Step {
    fn tokens(&self) -> usize {
        self.dt.len()
    }
}

/// Runs one `checkpointing_ssu` call; returns `out` (NaN where nothing was written).
fn run_step(engine: Engine, cpus: &[CpuBackend], m: &Model, pools: &mut Pools, st: &Step) -> Vec<f32> {
    let (h, g, p, n) = (m.heads, m.groups, m.dim, m.dstate);
    let rows = st.tokens() / h;
    let batch = st.slots.len();
    let mut out = vec![f32::NAN; rows * h * p];
    let (lead, cu, max_seqlen): (Vec<usize>, Option<&Vec<i32>>, Option<usize>) = match &st.varlen {
        None => (vec![batch], None, None),
        Some((_, t, true)) => (vec![batch, *t], None, None),
        Some((cu, t, false)) => (vec![rows], Some(cu), Some(*t)),
    };
    let shape = |tail: &[usize]| -> Vec<usize> { lead.iter().chain(tail).copied().collect() };
    let (xs, ds, bs) = (shape(&[h, p]), shape(&[h]), shape(&[g, n]));
    let (cache, l) = (pools.cache, pools.l);
    let state = if pools.dtype == DType::BF16 {
        TensorMut::from_slice(&mut pools.state_b[..], &[cache, h, p, n]).unwrap()
    } else {
        TensorMut::from_slice(&mut pools.state[..], &[cache, h, p, n]).unwrap()
    };
    let args = CheckpointingSsuArgs {
        state,
        x_cache: TensorMut::from_slice(&mut pools.x_cache[..], &[cache, h, l, p]).unwrap(),
        b_cache: TensorMut::from_slice(&mut pools.b_cache[..], &[cache, g, l, n]).unwrap(),
        dt_cache: TensorMut::from_slice(&mut pools.dt_cache[..], &[cache, h, l]).unwrap(),
        ring_start: TensorRef::from_slice(&pools.trackers.ring_start, &[cache]).unwrap(),
        prev_num_accepted_tokens: TensorRef::from_slice(&pools.trackers.prev_num_accepted, &[cache]).unwrap(),
        x: TensorRef::from_slice(&st.x, &xs).unwrap(),
        dt: TensorRef::from_slice(&st.dt, &ds).unwrap(),
        a: TensorRef::from_slice(&m.a, &[h]).unwrap(),
        b: TensorRef::from_slice(&st.b, &bs).unwrap(),
        c: TensorRef::from_slice(&st.c, &bs).unwrap(),
        out: TensorMut::from_slice(&mut out[..], &xs).unwrap(),
        d: m.d.as_ref().map(|d| TensorRef::from_slice(d, &[h]).unwrap()),
        z: st.z.as_ref().map(|z| TensorRef::from_slice(z, &xs).unwrap()),
        dt_bias: m.dt_bias.as_ref().map(|b| TensorRef::from_slice(b, &[h]).unwrap()),
        dt_softplus: m.softplus,
        state_batch_indices: Some(TensorRef::from_slice(&st.slots, &[batch]).unwrap()),
        pad_slot_id: st.pad,
        cu_seqlens: cu.map(|c| TensorRef::from_slice(c, &[batch + 1]).unwrap()),
        max_seqlen,
    };
    let pl = plan(args).unwrap();
    match engine {
        Engine::Ref32 => reference::checkpointing_ssu(pl),
        Engine::Ref64 => reference::checkpointing_ssu_f64(pl),
        Engine::Cpu(k) => cpus[k].run(pl).unwrap(),
    }
    out
}

fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}[{i}] = {g} was written, but must not be");
            continue;
        }
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}[{i}] = {g}, want {w}");
    }
}

/// Random rings (cursors anywhere legal, both branches), random forms (one-token, dense,
/// varlen with empty sequences), pad rows, groups < heads, f32 and bf16 pools: the CPU
/// kernel (closed form) and the f32 reference equal the f64 reference recurrence — outputs,
/// stored checkpoints, every ring row; pad rows and untouched slots stay bit-identical.
#[test]
fn checkpointing_ssu_matches_the_f64_reference_on_random_rings() {
    let cpus = backends();
    let mut rng = ChaCha8Rng::seed_from_u64(0xc5);
    for case in 0..40 {
        let m = Model::random(&mut rng);
        let (h, g, p, n) = (m.heads, m.groups, m.dim, m.dstate);
        let form = case % 3; // 0 one-token, 1 dense, 2 varlen
        let t = if form == 0 { 1 } else { rng.random_range(1..4) };
        let w = rng.random_range(t..t + 5);
        let l = w + t;
        let cache = 6;
        let dtype = if rng.random_bool(0.3) { DType::BF16 } else { DType::F32 };
        let mut pools = Pools::new(&m, cache, l, dtype, fill(&mut rng, cache * h * p * n, |r| normal(r) * 0.5));
        pools.x_cache = fill(&mut rng, pools.x_cache.len(), normal);
        pools.b_cache = fill(&mut rng, pools.b_cache.len(), normal);
        pools.dt_cache = fill(&mut rng, pools.dt_cache.len(), |r| r.random_range(0.01..0.5));
        for s in 0..cache {
            pools.trackers.ring_start[s] = rng.random_range(0..l as i32);
            pools.trackers.prev_num_accepted[s] = rng.random_range(0..=w as i32);
        }
        let batch = rng.random_range(1..5);
        let pad = Some(5i64);
        let mut slots: Vec<i32> = (0..5).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rng.random_range(0..=i));
        }
        slots.truncate(batch);
        if batch > 1 && rng.random_bool(0.5) {
            slots[rng.random_range(0..batch)] = 5;
        }
        let (varlen, rows) = match form {
            0 => (None, batch),
            1 => (Some((vec![], t, true)), batch * t),
            _ => {
                let mut cu = vec![0i32];
                for _ in 0..batch {
                    cu.push(cu.last().unwrap() + rng.random_range(0..=t as i32));
                }
                let rows = *cu.last().unwrap() as usize;
                (Some((cu, t, false)), rows)
            }
        };
        let st = Step {
            varlen,
            x: fill(&mut rng, rows * h * p, normal),
            dt: fill(&mut rng, rows * h, |r| normal(r) * 0.5),
            b: fill(&mut rng, rows * g * n, normal),
            c: fill(&mut rng, rows * g * n, normal),
            z: rng.random_bool(0.3).then(|| fill(&mut rng, rows * h * p, normal)),
            slots,
            pad,
        };
        let mut want_pools = pools.clone();
        let want = run_step(Engine::Ref64, &cpus, &m, &mut want_pools, &st);
        for engine in [Engine::Ref32, Engine::Cpu(0), Engine::Cpu(1)] {
            let mut got_pools = pools.clone();
            let got = run_step(engine, &cpus, &m, &mut got_pools, &st);
            let tag = format!("case {case} {engine:?} form {form} T {t} W {w} {dtype:?}");
            let (atol, rtol) = if dtype == DType::BF16 { (2e-2, 1e-2) } else { (1e-3, 1e-3) };
            assert_close(&format!("{tag} out"), &got, &want, atol, rtol);
            assert_close(&format!("{tag} state"), &got_pools.state_f32(), &want_pools.state_f32(), atol, rtol);
            assert_close(&format!("{tag} x_cache"), &got_pools.x_cache, &want_pools.x_cache, 0.0, 0.0);
            assert_close(&format!("{tag} B_cache"), &got_pools.b_cache, &want_pools.b_cache, 0.0, 0.0);
            assert_close(&format!("{tag} dt_cache"), &got_pools.dt_cache, &want_pools.dt_cache, 1e-6, 1e-6);
        }
        // Slot 5 (the pad value) and slots not in the batch are bit-identical.
        let used: Vec<usize> = st.slots.iter().filter(|&&s| s != 5).map(|&s| s as usize).collect();
        let per = h * p * n;
        for s in (0..cache).filter(|s| !used.contains(s)) {
            assert_eq!(&want_pools.state_f32()[s * per..(s + 1) * per], &pools.state_f32()[s * per..(s + 1) * per]);
            let xr = h * l * p;
            assert_eq!(&want_pools.x_cache[s * xr..(s + 1) * xr], &pools.x_cache[s * xr..(s + 1) * xr]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 40-step decodes against the plain SSU recurrence.

/// Plain SSU (f64): one token into `s` (`[H, P, N]`), returns `y` `[H, P]`.
fn ssu_token(m: &Model, s: &mut [f64], x: &[f32], dt: &[f32], b: &[f32], c: &[f32], z: Option<&[f32]>) -> Vec<f64> {
    let (h, p, n) = (m.heads, m.dim, m.dstate);
    let ratio = h / m.groups;
    let mut y = vec![0.0; h * p];
    for hh in 0..h {
        let g = hh / ratio;
        let dtv = m.dt(dt[hh], hh);
        let decay = (m.a[hh] as f64 * dtv).exp();
        for pp in 0..p {
            let xv = x[hh * p + pp] as f64;
            let mut acc = 0.0;
            for nn in 0..n {
                let e = &mut s[(hh * p + pp) * n + nn];
                *e = *e * decay + dtv * xv * b[g * n + nn] as f64;
                acc += *e * c[g * n + nn] as f64;
            }
            acc += m.d.as_ref().map_or(0.0, |d| d[hh] as f64) * xv;
            if let Some(z) = z {
                let zv = z[hh * p + pp] as f64;
                acc *= zv / (1.0 + (-zv).exp());
            }
            y[hh * p + pp] = acc;
        }
    }
    y
}

fn tracker_update(engine: Engine, cpus: &[CpuBackend], pools: &mut Pools, slots: &[i32], pad: Option<i64>, w: i64) {
    let l = pools.l as i64;
    let args = UpdateRingTrackersArgs {
        trackers: pools.trackers.views(),
        state_batch_indices: TensorRef::from_slice(slots, &[slots.len()]).unwrap(),
        logical_window: Some(w),
        ring_buffer_len: Some(l),
        pad_slot_id: pad,
    };
    let p = plan(args).unwrap();
    match engine {
        Engine::Cpu(k) => cpus[k].run(p).unwrap(),
        _ => reference::update_replayssm_ring_trackers(p),
    }
}

#[allow(clippy::too_many_arguments)]
fn tracker_commit(
    engine: Engine,
    cpus: &[CpuBackend],
    pools: &mut Pools,
    slots: &[i32],
    pad: Option<i64>,
    accepted: &[i32],
    qsl: &[i32],
    w: i64,
) {
    let l = pools.l as i64;
    let args = CommitRingTrackersArgs {
        trackers: pools.trackers.views(),
        state_batch_indices: TensorRef::from_slice(slots, &[slots.len()]).unwrap(),
        num_accepted_tokens: TensorRef::from_slice(accepted, &[accepted.len()]).unwrap(),
        query_start_loc: TensorRef::from_slice(qsl, &[qsl.len()]).unwrap(),
        logical_window: w,
        ring_buffer_len: l,
        pad_slot_id: pad,
    };
    let p = plan(args).unwrap();
    match engine {
        Engine::Cpu(k) => cpus[k].run(p).unwrap(),
        _ => reference::commit_replayssm_ring_trackers(p),
    }
}

/// Slots of the three live sequences and the pad row (slot 0 is the pad value).
const SLOTS: [i32; 4] = [3, 1, 0, 4];
const PAD: Option<i64> = Some(0);

/// A random model, the initial states of a 5-slot pool (f32, ring length `l`), the pools, and
/// the oracle's f64 copy of the initial state of each of [`SLOTS`].
fn start_slots(rng: &mut ChaCha8Rng, l: usize) -> (Model, Vec<f32>, Pools, Vec<Vec<f64>>) {
    let m = Model::random(rng);
    let cache = 5;
    let per = m.heads * m.dim * m.dstate;
    let init = fill(rng, cache * per, |r| normal(r) * 0.5);
    let pools = Pools::new(&m, cache, l, DType::F32, init.clone());
    let oracle = SLOTS
        .iter()
        .map(|&s| init[s as usize * per..(s as usize + 1) * per].iter().map(|&v| v as f64).collect())
        .collect();
    (m, init, pools, oracle)
}

/// 40 one-token steps: `checkpointing_ssu` then `update_replayssm_ring_trackers` (advance)
/// after each; outputs equal plain SSU on the same tokens, the pad row writes nothing, and
/// at the end checkpoint + replayed ring equals the recurrence's state.
#[test]
fn replayssm_one_token_decode_equals_plain_ssu() {
    let cpus = backends();
    for (seed, engine) in [(1u64, Engine::Cpu(1)), (2, Engine::Cpu(0)), (3, Engine::Ref32)] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (w, l) = (4usize, 5usize);
        let (m, init, mut pools, mut oracle) = start_slots(&mut rng, l);
        let (h, g, p, n) = (m.heads, m.groups, m.dim, m.dstate);
        let per = h * p * n;
        let batch = SLOTS.len();
        for step in 0..40 {
            let st = Step {
                varlen: None,
                x: fill(&mut rng, batch * h * p, normal),
                dt: fill(&mut rng, batch * h, |r| normal(r) * 0.5),
                b: fill(&mut rng, batch * g * n, normal),
                c: fill(&mut rng, batch * g * n, normal),
                z: None,
                slots: SLOTS.to_vec(),
                pad: PAD,
            };
            let out = run_step(engine, &cpus, &m, &mut pools, &st);
            tracker_update(engine, &cpus, &mut pools, &SLOTS, PAD, w as i64);
            for (bi, &slot) in SLOTS.iter().enumerate() {
                let got = &out[bi * h * p..(bi + 1) * h * p];
                if Some(slot as i64) == PAD {
                    assert!(got.iter().all(|v| v.is_nan()), "step {step}: the pad row wrote out");
                    continue;
                }
                let tok = |v: &[f32], w: usize| v[bi * w..(bi + 1) * w].to_vec();
                let y = ssu_token(
                    &m,
                    &mut oracle[bi],
                    &tok(&st.x, h * p),
                    &tok(&st.dt, h),
                    &tok(&st.b, g * n),
                    &tok(&st.c, g * n),
                    None,
                );
                let want: Vec<f32> = y.iter().map(|&v| v as f32).collect();
                assert_close(&format!("{engine:?} step {step} seq {bi}"), got, &want, 1e-3, 1e-3);
            }
        }
        assert_eq!(&pools.state[..per], &init[..per], "the pad slot's state was touched");
        assert_eq!(
            (pools.trackers.ring_start[0], pools.trackers.prev_num_accepted[0]),
            (0, 0),
            "the pad slot's trackers moved"
        );
        check_materialized(&m, &pools, &oracle);
    }
}

/// Checkpoint + replay of the live ring rows equals the oracle's running state.
fn check_materialized(m: &Model, pools: &Pools, oracle: &[Vec<f64>]) {
    let (h, g, p, n, l) = (m.heads, m.groups, m.dim, m.dstate, pools.l);
    let ratio = h / g;
    let per = h * p * n;
    for (bi, &slot) in SLOTS.iter().enumerate() {
        if Some(slot as i64) == PAD {
            continue;
        }
        let s = slot as usize;
        let mut st: Vec<f64> = pools.state[s * per..(s + 1) * per].iter().map(|&v| v as f64).collect();
        let (start, k) = (pools.trackers.ring_start[s] as usize, pools.trackers.prev_num_accepted[s] as usize);
        for j in 0..k {
            let r = (start + j) % l;
            for hh in 0..h {
                let dtv = pools.dt_cache[(s * h + hh) * l + r] as f64;
                let decay = (m.a[hh] as f64 * dtv).exp();
                for pp in 0..p {
                    let xv = pools.x_cache[((s * h + hh) * l + r) * p + pp] as f64;
                    for nn in 0..n {
                        let bv = pools.b_cache[((s * g + hh / ratio) * l + r) * n + nn] as f64;
                        let e = &mut st[(hh * p + pp) * n + nn];
                        *e = *e * decay + dtv * xv * bv;
                    }
                }
            }
        }
        for (i, (&a, &b)) in st.iter().zip(&oracle[bi]).enumerate() {
            assert!((a - b).abs() <= 1e-3 + 1e-3 * b.abs(), "materialized state of seq {bi} [{i}]: {a} vs {b}");
        }
    }
}

/// 40 speculative steps (varlen, up to T = 3 tokens per sequence, W = 4, L = W + T):
/// before each step `commit_replayssm_ring_trackers` folds in the previous step's random
/// accepted counts; outputs of every token (accepted or not) equal plain SSU from the state
/// after all accepted tokens so far; the pad row writes nothing.
#[test]
fn replayssm_speculative_decode_with_random_acceptance_equals_plain_ssu() {
    let cpus = backends();
    for (seed, engine) in [(10u64, Engine::Cpu(1)), (11, Engine::Cpu(0)), (12, Engine::Ref32)] {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (t_max, w) = (3usize, 4usize);
        let l = w + t_max;
        let (m, init, mut pools, mut oracle) = start_slots(&mut rng, l);
        let (h, g, p, n) = (m.heads, m.groups, m.dim, m.dstate);
        let per = h * p * n;
        let batch = SLOTS.len();
        let mut accepted = vec![0i32; batch];
        let mut flushes = 0;
        for step in 0..40 {
            let lens: Vec<usize> = (0..batch).map(|_| rng.random_range(1..=t_max)).collect();
            let mut cu = vec![0i32];
            for &len in &lens {
                cu.push(cu.last().unwrap() + len as i32);
            }
            tracker_commit(engine, &cpus, &mut pools, &SLOTS, PAD, &accepted, &cu, w as i64);
            for (bi, &s) in SLOTS.iter().enumerate() {
                if Some(s as i64) != PAD && pools.trackers.prev_num_accepted[s as usize] as usize + lens[bi] > w {
                    flushes += 1;
                }
            }
            let rows = *cu.last().unwrap() as usize;
            let st = Step {
                varlen: Some((cu.clone(), t_max, false)),
                x: fill(&mut rng, rows * h * p, normal),
                dt: fill(&mut rng, rows * h, |r| normal(r) * 0.5),
                b: fill(&mut rng, rows * g * n, normal),
                c: fill(&mut rng, rows * g * n, normal),
                z: rng.random_bool(0.5).then(|| fill(&mut rng, rows * h * p, normal)),
                slots: SLOTS.to_vec(),
                pad: PAD,
            };
            let out = run_step(engine, &cpus, &m, &mut pools, &st);
            for (bi, &slot) in SLOTS.iter().enumerate() {
                let r0 = cu[bi] as usize;
                if Some(slot as i64) == PAD {
                    assert!(out[r0 * h * p..(r0 + lens[bi]) * h * p].iter().all(|v| v.is_nan()), "pad row wrote out");
                    accepted[bi] = 1;
                    continue;
                }
                accepted[bi] = rng.random_range(1..=lens[bi] as i32);
                let mut s = oracle[bi].clone();
                for t in 0..lens[bi] {
                    let r = r0 + t;
                    let tok = |v: &[f32], w: usize| v[r * w..(r + 1) * w].to_vec();
                    let z = st.z.as_ref().map(|z| tok(z, h * p));
                    let y = ssu_token(
                        &m,
                        &mut s,
                        &tok(&st.x, h * p),
                        &tok(&st.dt, h),
                        &tok(&st.b, g * n),
                        &tok(&st.c, g * n),
                        z.as_deref(),
                    );
                    let want: Vec<f32> = y.iter().map(|&v| v as f32).collect();
                    assert_close(
                        &format!("{engine:?} step {step} seq {bi} token {t}"),
                        &out[r * h * p..(r + 1) * h * p],
                        &want,
                        1e-3,
                        1e-3,
                    );
                    if t + 1 == accepted[bi] as usize {
                        oracle[bi] = s.clone();
                    }
                }
            }
        }
        assert!(flushes > 5, "the test must exercise the flush branch (got {flushes} flushes)");
        // Fold in the last step's acceptance, then the ring + checkpoint is the oracle's state.
        tracker_commit(engine, &cpus, &mut pools, &SLOTS, PAD, &accepted, &[0, 0, 0, 0, 0], w as i64);
        check_materialized(&m, &pools, &oracle);
        assert_eq!(&pools.state[..per], &init[..per], "the pad slot's state was touched");
    }
}

// ---------------------------------------------------------------------------------------
// The shared generator (`ssm_conformance::cases::ring_random`), which the GPU tests run too.

/// The property matrix of the shared generator: each CPU backend equals the f64 reference.
#[test]
fn shared_checkpointing_matrix_matches_the_f64_reference() {
    use ssm_conformance::cases::ring_random::{CkptCase, CkptSpec, check_ckpt};
    let cpus = backends();
    for i in 0..42 {
        let spec = CkptSpec::matrix(i);
        let base = CkptCase::random(spec, 100 + i as u64);
        let mut want = base.clone();
        reference::checkpointing_ssu_f64(plan(want.args()).unwrap());
        for (k, cpu) in cpus.iter().enumerate() {
            let mut got = base.clone();
            cpu.run(plan(got.args()).unwrap()).unwrap();
            check_ckpt(&base, &got, &want).unwrap_or_else(|e| panic!("case {i} cpu {k} {spec:?}: {e}"));
        }
    }
}

/// Tracker calls with duplicate, pad and out-of-range slots over more rows than one GPU chunk:
/// the CPU backend equals the reference bit for bit in every mode.
#[test]
fn shared_tracker_cases_match_the_reference() {
    use ssm_conformance::cases::ring_random::TrackerCase;
    let cpu = &backends()[0];
    for (i, rows) in [0usize, 1, 37, 2048, 2049, 5000].into_iter().enumerate() {
        for dtype in [DType::I32, DType::I64] {
            let base = TrackerCase::random(rows, 300, dtype, [DType::I32, DType::I64][i % 2], i as u64);
            for mode in 0..3 {
                let (mut got, mut want) = (base.clone(), base.clone());
                match mode {
                    2 => {
                        cpu.run(plan(got.commit_args()).unwrap()).unwrap();
                        reference::commit_replayssm_ring_trackers(plan(want.commit_args()).unwrap());
                    }
                    _ => {
                        cpu.run(plan(got.update_args(mode == 1)).unwrap()).unwrap();
                        reference::update_replayssm_ring_trackers(plan(want.update_args(mode == 1)).unwrap());
                    }
                }
                for k in 0..3 {
                    assert_eq!(got.trackers[k].bytes(), want.trackers[k].bytes(), "rows {rows} {dtype:?} mode {mode}");
                }
            }
        }
    }
}

/// The shared 40-step decode: ReplaySSM outputs equal the plain SSU's on the same tokens.
#[test]
fn shared_replayssm_decode_equals_plain_ssu() {
    use ssm_conformance::cases::ring_random::replayssm_decode_vs_plain_ssu;
    for (k, cpu) in backends().iter().enumerate() {
        let worst = replayssm_decode_vs_plain_ssu(cpu, 11 + k as u64).unwrap();
        eprintln!("cpu {k}: largest |ReplaySSM - plain SSU| over 40 steps: {worst:.2e}");
    }
}
