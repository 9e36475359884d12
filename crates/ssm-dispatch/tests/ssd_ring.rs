//! The SSD and ReplaySSM entry points of the facade: configuration gate, the combined
//! ReplaySSM step with tracker update, and the SSD prefill against the reference.

use ssm_dispatch::{Config, Error, Runtime, SelectiveStateUpdateReplaySsm};
use ssm_ring::{CheckpointingSsu, RingTrackers, UpdateRingTrackers};
use ssm_ssd::{MambaChunkScanCombinedVarlen, compute_chunk_metadata};
use ssm_tensor::{TensorMut, TensorRef};

const CACHE: usize = 3;
const H: usize = 2;
const P: usize = 4;
const N: usize = 8;
const L: usize = 3;

fn value(i: usize) -> f32 {
    ((i * 7919 % 113) as f32 / 113.0 - 0.5) * 2.0
}

struct Pools {
    state: Vec<f32>,
    x_cache: Vec<f32>,
    b_cache: Vec<f32>,
    dt_cache: Vec<f32>,
    ring_start: Vec<i32>,
    prev: Vec<i32>,
    prev_q: Vec<i32>,
}

fn pools() -> Pools {
    Pools {
        state: (0..CACHE * H * P * N).map(value).collect(),
        x_cache: vec![0.0; CACHE * H * L * P],
        b_cache: vec![0.0; CACHE * L * N],
        dt_cache: vec![0.0; CACHE * H * L],
        ring_start: vec![0; CACHE],
        prev: vec![0; CACHE],
        prev_q: vec![0; CACHE],
    }
}

fn replay_config() -> Config {
    Config { replayssm: true, ..Config::cpu(Some(2)) }
}

#[test]
fn the_checkpointing_ssu_needs_the_config_switch() {
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    let mut p = pools();
    let slots = [1i32];
    let (x, dt, a, bc) = (vec![0.5f32; H * P], vec![0.1f32; H], [-1.0f32; H], vec![0.2f32; N]);
    let mut out = vec![f32::NAN; H * P];
    let err = rt
        .selective_state_update_replayssm(SelectiveStateUpdateReplaySsm {
            state: TensorMut::from_slice(&mut p.state, &[CACHE, H, P, N]).unwrap(),
            x_cache: TensorMut::from_slice(&mut p.x_cache, &[CACHE, H, L, P]).unwrap(),
            b_cache: TensorMut::from_slice(&mut p.b_cache, &[CACHE, 1, L, N]).unwrap(),
            dt_cache: TensorMut::from_slice(&mut p.dt_cache, &[CACHE, H, L]).unwrap(),
            trackers: RingTrackers {
                ring_start: TensorMut::from_slice(&mut p.ring_start, &[CACHE]).unwrap(),
                prev_num_accepted: TensorMut::from_slice(&mut p.prev, &[CACHE]).unwrap(),
                prev_query_len: TensorMut::from_slice(&mut p.prev_q, &[CACHE]).unwrap(),
            },
            logical_window: (L - 1) as i64,
            x: TensorRef::from_slice(&x, &[1, H, P]).unwrap(),
            dt: TensorRef::from_slice(&dt, &[1, H]).unwrap(),
            a: TensorRef::from_slice(&a, &[H]).unwrap(),
            b: TensorRef::from_slice(&bc, &[1, 1, N]).unwrap(),
            c: TensorRef::from_slice(&bc, &[1, 1, N]).unwrap(),
            out: TensorMut::from_slice(&mut out, &[1, H, P]).unwrap(),
            d: None,
            z: None,
            dt_bias: None,
            dt_softplus: true,
            state_batch_indices: Some(TensorRef::from_slice(&slots, &[1]).unwrap()),
            pad_slot_id: Some(0),
            cu_seqlens: None,
            max_seqlen: None,
            update_trackers: true,
        })
        .unwrap_err();
    assert!(matches!(err, Error::ReplaySsmDisabled { .. }), "{err}");
    assert!(out.iter().all(|v| v.is_nan()) && p.prev == [0; CACHE], "a refused call wrote");
    assert!(Runtime::new(&replay_config()).is_ok());
}

/// `selective_state_update_replayssm` = `checkpointing_ssu` then an advance of the trackers,
/// over several steps (both branches), bit for bit.
#[test]
fn combined_replayssm_step_equals_its_parts() {
    let rt = Runtime::new(&replay_config()).unwrap();
    let (mut a, mut b) = (pools(), pools());
    let slots = [2i32, 0];
    let a_log = [-0.5f32, -1.0];
    for step in 0..5 {
        let x: Vec<f32> = (0..2 * H * P).map(|i| value(i + 31 * step)).collect();
        let dt: Vec<f32> = (0..2 * H).map(|i| value(i + 7 * step) * 0.3).collect();
        let bc: Vec<f32> = (0..2 * N).map(|i| value(i + 11 * step)).collect();
        let (mut out_a, mut out_b) = (vec![f32::NAN; 2 * H * P], vec![f32::NAN; 2 * H * P]);
        rt.selective_state_update_replayssm(SelectiveStateUpdateReplaySsm {
            state: TensorMut::from_slice(&mut a.state, &[CACHE, H, P, N]).unwrap(),
            x_cache: TensorMut::from_slice(&mut a.x_cache, &[CACHE, H, L, P]).unwrap(),
            b_cache: TensorMut::from_slice(&mut a.b_cache, &[CACHE, 1, L, N]).unwrap(),
            dt_cache: TensorMut::from_slice(&mut a.dt_cache, &[CACHE, H, L]).unwrap(),
            trackers: RingTrackers {
                ring_start: TensorMut::from_slice(&mut a.ring_start, &[CACHE]).unwrap(),
                prev_num_accepted: TensorMut::from_slice(&mut a.prev, &[CACHE]).unwrap(),
                prev_query_len: TensorMut::from_slice(&mut a.prev_q, &[CACHE]).unwrap(),
            },
            logical_window: (L - 1) as i64,
            x: TensorRef::from_slice(&x, &[2, H, P]).unwrap(),
            dt: TensorRef::from_slice(&dt, &[2, H]).unwrap(),
            a: TensorRef::from_slice(&a_log, &[H]).unwrap(),
            b: TensorRef::from_slice(&bc, &[2, 1, N]).unwrap(),
            c: TensorRef::from_slice(&bc, &[2, 1, N]).unwrap(),
            out: TensorMut::from_slice(&mut out_a, &[2, H, P]).unwrap(),
            d: None,
            z: None,
            dt_bias: None,
            dt_softplus: true,
            state_batch_indices: Some(TensorRef::from_slice(&slots, &[2]).unwrap()),
            pad_slot_id: Some(0),
            cu_seqlens: None,
            max_seqlen: None,
            update_trackers: true,
        })
        .unwrap();
        rt.checkpointing_ssu(CheckpointingSsu {
            state: TensorMut::from_slice(&mut b.state, &[CACHE, H, P, N]).unwrap(),
            x_cache: TensorMut::from_slice(&mut b.x_cache, &[CACHE, H, L, P]).unwrap(),
            b_cache: TensorMut::from_slice(&mut b.b_cache, &[CACHE, 1, L, N]).unwrap(),
            dt_cache: TensorMut::from_slice(&mut b.dt_cache, &[CACHE, H, L]).unwrap(),
            ring_start: TensorRef::from_slice(&b.ring_start, &[CACHE]).unwrap(),
            prev_num_accepted_tokens: TensorRef::from_slice(&b.prev, &[CACHE]).unwrap(),
            x: TensorRef::from_slice(&x, &[2, H, P]).unwrap(),
            dt: TensorRef::from_slice(&dt, &[2, H]).unwrap(),
            a: TensorRef::from_slice(&a_log, &[H]).unwrap(),
            b: TensorRef::from_slice(&bc, &[2, 1, N]).unwrap(),
            c: TensorRef::from_slice(&bc, &[2, 1, N]).unwrap(),
            out: TensorMut::from_slice(&mut out_b, &[2, H, P]).unwrap(),
            d: None,
            z: None,
            dt_bias: None,
            dt_softplus: true,
            state_batch_indices: Some(TensorRef::from_slice(&slots, &[2]).unwrap()),
            pad_slot_id: Some(0),
            cu_seqlens: None,
            max_seqlen: None,
        })
        .unwrap();
        rt.update_replayssm_ring_trackers(UpdateRingTrackers {
            trackers: RingTrackers {
                ring_start: TensorMut::from_slice(&mut b.ring_start, &[CACHE]).unwrap(),
                prev_num_accepted: TensorMut::from_slice(&mut b.prev, &[CACHE]).unwrap(),
                prev_query_len: TensorMut::from_slice(&mut b.prev_q, &[CACHE]).unwrap(),
            },
            state_batch_indices: TensorRef::from_slice(&slots, &[2]).unwrap(),
            logical_window: Some((L - 1) as i64),
            ring_buffer_len: Some(L as i64),
            pad_slot_id: Some(0),
        })
        .unwrap();
        // Row 1 is the pad (slot 0): nothing written.
        assert!(out_a[H * P..].iter().all(|v| v.is_nan()));
        assert_eq!(out_a[..H * P], out_b[..H * P]);
        assert_eq!((&a.state, &a.x_cache, &a.dt_cache), (&b.state, &b.x_cache, &b.dt_cache));
        assert_eq!((&a.ring_start, &a.prev), (&b.ring_start, &b.prev));
    }
    // W = 2, L = 3: steps 3 and 5 flush (start 0 -> 2 -> 1), leaving one live row.
    assert_eq!((a.ring_start[2], a.prev[2]), (1, 1), "5 tokens with W = 2 must have flushed twice");
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
        let args = MambaChunkScanCombinedVarlen {
            x: TensorRef::from_slice(&x, &[t, h, p]).unwrap(),
            dt: TensorRef::from_slice(&dt, &[t, h]).unwrap(),
            a: TensorRef::from_slice(&a, &[h]).unwrap(),
            b: TensorRef::from_slice(&bc, &[t, 1, n]).unwrap(),
            c: TensorRef::from_slice(&bc, &[t, 1, n]).unwrap(),
            chunk_size: 4,
            cu_seqlens: TensorRef::from_slice(&cu, &[3]).unwrap(),
            cu_chunk_seqlens: TensorRef::from_slice(&m.cu_chunk_seqlens, &[m.cu_chunk_seqlens.len()]).unwrap(),
            last_chunk_indices: TensorRef::from_slice(&m.last_chunk_indices, &[2]).unwrap(),
            seq_idx: TensorRef::from_slice(&m.seq_idx, &[m.seq_idx.len()]).unwrap(),
            out: Some(TensorMut::from_slice(&mut out, &[t, h, p]).unwrap()),
            d: None,
            z: None,
            dt_bias: None,
            initial_states: None,
            ssm_state: None,
            initial_state_indices: None,
            has_initial_state: None,
            final_state_indices: None,
            pad_slot_id: None,
            dt_softplus: true,
            dt_limit: (0.0, f32::INFINITY),
            return_intermediate_states: false,
            state_dtype: None,
            varlen_states: Some(TensorMut::from_slice(&mut states, &[2, h, p, n]).unwrap()),
            workspace: None,
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
