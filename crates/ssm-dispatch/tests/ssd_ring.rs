//! The SSD and ReplaySSM entry points of the facade: configuration gate, the combined
//! ReplaySSM step with tracker update, and the SSD prefill against the reference.

use ssm_conformance::cases::ring::Trackers;
use ssm_dispatch::{Config, Error, Runtime, SelectiveStateUpdateReplaySsm};
use ssm_ring::{CheckpointingSsuArgs, UpdateRingTrackersArgs};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, compute_chunk_metadata};
use ssm_tensor::{TensorMut, TensorRef};

const CACHE: usize = 3;
const H: usize = 2;
const P: usize = 4;
const N: usize = 8;
const L: usize = 3;

fn value(i: usize) -> f32 {
    ((i * 7919 % 113) as f32 / 113.0 - 0.5) * 2.0
}

/// The checkpoint pool and the rings of `CACHE` slots (one group).
struct Rings {
    state: Vec<f32>,
    x_cache: Vec<f32>,
    b_cache: Vec<f32>,
    dt_cache: Vec<f32>,
}

struct Pools {
    rings: Rings,
    trackers: Trackers,
}

fn pools() -> Pools {
    let rings = Rings {
        state: (0..CACHE * H * P * N).map(value).collect(),
        x_cache: vec![0.0; CACHE * H * L * P],
        b_cache: vec![0.0; CACHE * L * N],
        dt_cache: vec![0.0; CACHE * H * L],
    };
    Pools { rings, trackers: Trackers::zeros(CACHE) }
}

/// One-token inputs of `rows` sequences (one group, `B = C`), and the slot of each.
struct Tokens {
    x: Vec<f32>,
    dt: Vec<f32>,
    a: [f32; H],
    bc: Vec<f32>,
    slots: Vec<i32>,
}

/// The checkpointing step of `tokens` on `rings` (pad slot 0, softplus on dt), reading the
/// cursors `ring_start` and `prev_num_accepted_tokens`, writing `out` `[rows, H, P]`.
fn step<'c>(
    rings: &'c mut Rings,
    tokens: &'c Tokens,
    out: &'c mut [f32],
    ring_start: TensorRef<'c>,
    prev_num_accepted_tokens: TensorRef<'c>,
) -> CheckpointingSsuArgs<'c> {
    let rows = tokens.slots.len();
    CheckpointingSsuArgs {
        state: TensorMut::from_slice(&mut rings.state, &[CACHE, H, P, N]).unwrap(),
        x_cache: TensorMut::from_slice(&mut rings.x_cache, &[CACHE, H, L, P]).unwrap(),
        b_cache: TensorMut::from_slice(&mut rings.b_cache, &[CACHE, 1, L, N]).unwrap(),
        dt_cache: TensorMut::from_slice(&mut rings.dt_cache, &[CACHE, H, L]).unwrap(),
        ring_start,
        prev_num_accepted_tokens,
        x: TensorRef::from_slice(&tokens.x, &[rows, H, P]).unwrap(),
        dt: TensorRef::from_slice(&tokens.dt, &[rows, H]).unwrap(),
        a: TensorRef::from_slice(&tokens.a, &[H]).unwrap(),
        b: TensorRef::from_slice(&tokens.bc, &[rows, 1, N]).unwrap(),
        c: TensorRef::from_slice(&tokens.bc, &[rows, 1, N]).unwrap(),
        out: TensorMut::from_slice(out, &[rows, H, P]).unwrap(),
        d: None,
        z: None,
        dt_bias: None,
        dt_softplus: true,
        state_batch_indices: Some(TensorRef::from_slice(&tokens.slots, &[rows]).unwrap()),
        pad_slot_id: Some(0),
        cu_seqlens: None,
        max_seqlen: None,
    }
}

/// `selective_state_update_replayssm` of `tokens` on `p`, advancing the trackers (`W = L − 1`).
fn replayssm_step(rt: &Runtime, p: &mut Pools, tokens: &Tokens, out: &mut [f32]) -> Result<(), Box<Error>> {
    let rings = &mut p.rings;
    rt.selective_state_update_replayssm(SelectiveStateUpdateReplaySsm::new(
        p.trackers.views(),
        (L - 1) as i64,
        true,
        |cursors| step(rings, tokens, out, cursors.ring_start, cursors.prev_num_accepted_tokens),
    ))
    .map_err(Box::new)
}

fn replay_config() -> Config {
    Config { replayssm: true, ..Config::cpu(Some(2)) }
}

#[test]
fn the_checkpointing_ssu_needs_the_config_switch() {
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    let mut p = pools();
    let tokens = Tokens { x: vec![0.5; H * P], dt: vec![0.1; H], a: [-1.0; H], bc: vec![0.2; N], slots: vec![1] };
    let mut out = vec![f32::NAN; H * P];
    let err = replayssm_step(&rt, &mut p, &tokens, &mut out).unwrap_err();
    assert!(matches!(*err, Error::ReplaySsmDisabled { .. }), "{err}");
    assert!(out.iter().all(|v| v.is_nan()) && p.trackers == Trackers::zeros(CACHE), "a refused call wrote");
    assert!(Runtime::new(&replay_config()).is_ok());
}

/// A tracker update the plan refuses (`prev_query_len` one slot short) stops the whole call
/// before the step, which alone would have been accepted, writes anything.
#[test]
fn a_refused_tracker_update_leaves_the_step_unrun() {
    let rt = Runtime::new(&replay_config()).unwrap();
    let mut p = pools();
    let before = (p.rings.state.clone(), p.trackers.clone());
    let tokens = Tokens { x: vec![0.5; H * P], dt: vec![0.1; H], a: [-1.0; H], bc: vec![0.2; N], slots: vec![1] };
    let mut out = vec![f32::NAN; H * P];
    let rings = &mut p.rings;
    let mut trackers = p.trackers.views();
    trackers.prev_query_len = trackers.prev_query_len.with_layout(&[CACHE - 1], &[1], 0).unwrap();
    let err = rt
        .selective_state_update_replayssm(SelectiveStateUpdateReplaySsm::new(trackers, (L - 1) as i64, true, |c| {
            step(rings, &tokens, &mut out, c.ring_start, c.prev_num_accepted_tokens)
        }))
        .unwrap_err();
    assert!(matches!(err, Error::Ring(_)), "{err}");
    assert!(out.iter().all(|v| v.is_nan()), "a refused call wrote `out`");
    assert!(p.rings.x_cache.iter().all(|&v| v == 0.0), "a refused call wrote the ring");
    assert_eq!((p.rings.state, p.trackers), before, "a refused call wrote");
}

/// `selective_state_update_replayssm` = `checkpointing_ssu` then an advance of the trackers,
/// over several steps (both branches), bit for bit.
#[test]
fn combined_replayssm_step_equals_its_parts() {
    let rt = Runtime::new(&replay_config()).unwrap();
    let (mut a, mut b) = (pools(), pools());
    for i in 0..5 {
        let tokens = Tokens {
            x: (0..2 * H * P).map(|j| value(j + 31 * i)).collect(),
            dt: (0..2 * H).map(|j| value(j + 7 * i) * 0.3).collect(),
            a: [-0.5, -1.0],
            bc: (0..2 * N).map(|j| value(j + 11 * i)).collect(),
            slots: vec![2, 0],
        };
        let (mut out_a, mut out_b) = (vec![f32::NAN; 2 * H * P], vec![f32::NAN; 2 * H * P]);
        replayssm_step(&rt, &mut a, &tokens, &mut out_a).unwrap();
        let cursors = &b.trackers;
        rt.checkpointing_ssu(step(
            &mut b.rings,
            &tokens,
            &mut out_b,
            TensorRef::from_slice(&cursors.ring_start, &[CACHE]).unwrap(),
            TensorRef::from_slice(&cursors.prev_num_accepted, &[CACHE]).unwrap(),
        ))
        .unwrap();
        rt.update_replayssm_ring_trackers(UpdateRingTrackersArgs {
            trackers: b.trackers.views(),
            state_batch_indices: TensorRef::from_slice(&tokens.slots, &[2]).unwrap(),
            logical_window: Some((L - 1) as i64),
            ring_buffer_len: Some(L as i64),
            pad_slot_id: Some(0),
        })
        .unwrap();
        // Row 1 is the pad (slot 0): nothing written.
        assert!(out_a[H * P..].iter().all(|v| v.is_nan()));
        assert_eq!(out_a[..H * P], out_b[..H * P]);
        let (ra, rb) = (&a.rings, &b.rings);
        assert_eq!((&ra.state, &ra.x_cache, &ra.dt_cache), (&rb.state, &rb.x_cache, &rb.dt_cache));
        assert_eq!(
            (&a.trackers.ring_start, &a.trackers.prev_num_accepted),
            (&b.trackers.ring_start, &b.trackers.prev_num_accepted)
        );
    }
    // W = 2, L = 3: steps 3 and 5 flush (start 0 -> 2 -> 1), leaving one live row.
    let t = &a.trackers;
    assert_eq!((t.ring_start[2], t.prev_num_accepted[2]), (1, 1), "5 tokens with W = 2 must have flushed twice");
}

#[test]
fn ssd_prefill_through_the_runtime_equals_the_reference() {
    let rt = Runtime::new(&Config::cpu(Some(2))).unwrap();
    let (t, h, p, n) = (11usize, 2usize, 4usize, 8usize);
    let x: Vec<f32> = (0..t * h * p).map(value).collect();
    let dt: Vec<f32> = (0..t * h).map(|i| value(i + 5) * 0.5).collect();
    let a = [-0.7f32, -1.3];
    let bc: Vec<f32> = (0..t * n).map(|i| value(i + 3)).collect();
    let cu = [0i32, 7, 11];
    let m = compute_chunk_metadata(&[0, 7, 11], &[3, 0], 4);
    let run = |reference: bool| {
        let mut out = vec![f32::NAN; t * h * p];
        let mut states = vec![f32::NAN; 2 * h * p * n];
        let tables = [
            TensorRef::from_slice(&cu, &[3]).unwrap(),
            TensorRef::from_slice(&m.cu_chunk_seqlens, &[m.cu_chunk_seqlens.len()]).unwrap(),
            TensorRef::from_slice(&m.last_chunk_indices, &[2]).unwrap(),
            TensorRef::from_slice(&m.seq_idx, &[m.seq_idx.len()]).unwrap(),
        ];
        let args = MambaChunkScanCombinedVarlenArgs {
            out: Some(TensorMut::from_slice(&mut out, &[t, h, p]).unwrap()),
            dt_softplus: true,
            varlen_states: Some(TensorMut::from_slice(&mut states, &[2, h, p, n]).unwrap()),
            ..MambaChunkScanCombinedVarlenArgs::new(
                TensorRef::from_slice(&x, &[t, h, p]).unwrap(),
                TensorRef::from_slice(&dt, &[t, h]).unwrap(),
                TensorRef::from_slice(&a, &[h]).unwrap(),
                TensorRef::from_slice(&bc, &[t, 1, n]).unwrap(),
                TensorRef::from_slice(&bc, &[t, 1, n]).unwrap(),
                4,
                tables,
            )
        };
        if reference {
            let plan = ssm_tensor::Planned::new(args).unwrap();
            ssm_ssd::reference::mamba_chunk_scan_combined_varlen_f64(plan);
        } else {
            rt.mamba_chunk_scan_combined_varlen(args).unwrap();
        }
        (out, states)
    };
    let (got, want) = (run(false), run(true));
    for (g, w) in got.0.iter().chain(&got.1).zip(want.0.iter().chain(&want.1)) {
        assert!((g - w).abs() <= 1e-4 + 1e-4 * w.abs(), "{g} vs {w}");
    }
}
