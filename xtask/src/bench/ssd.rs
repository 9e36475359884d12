//! SSD prefill and ReplaySSM decode bench cases (Mamba2-2.7B: 80 heads × 64 × dstate 128,
//! one group, chunk 256).
//!
//! - `ssd`: `mamba_chunk_scan_combined_varlen`, 2k and 8k tokens split into 1, 4 and 16
//!   fresh sequences, bf16 activations, f32 states, caller-owned scratch. `steps` is the
//!   token count, so tokens/s = steps / seconds.
//! - `replayssm`: one ReplaySSM cycle of `W = 15` one-token decode steps (`L = 16`) at batch
//!   64 through `selective_state_update_replayssm` with tracker updates, f32 checkpoint and
//!   bf16 rings; `steps` = tokens per sequence per call. Compare with `ssu` mamba2-2.7b
//!   batch 64, steps 1 (plain SSU reads and writes the whole state every token).

use ssm_conformance::HostTensor;
use ssm_dispatch::{Config, Runtime, SelectiveStateUpdateReplaySsm};
use ssm_ring::{CheckpointingSsuArgs, RingTrackers};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, compute_chunk_metadata};
use ssm_tensor::{DType, TensorMut};

use super::{BenchCase, fill_tensor, tensor_i32};

const HEADS: usize = 80;
const DIM: usize = 64;
const DSTATE: usize = 128;
const CHUNK: usize = 256;

fn ints(values: &[i32]) -> HostTensor {
    tensor_i32(&[values.len()], values.iter().copied())
}

/// The case list.
pub(crate) fn cases(quick: bool) -> Vec<Box<dyn BenchCase>> {
    let mut v: Vec<Box<dyn BenchCase>> = Vec::new();
    let tokens: &[usize] = if quick { &[2048] } else { &[2048, 8192] };
    for &t in tokens {
        for seqs in [1, 4, 16] {
            v.push(Box::new(SsdCase { tokens: t, seqs }));
        }
    }
    v.push(Box::new(ReplayCase { batch: 64, window: 15 }));
    v
}

struct SsdCase {
    tokens: usize,
    seqs: usize,
}

impl BenchCase for SsdCase {
    fn op(&self) -> &'static str {
        "ssd"
    }
    fn shape(&self) -> String {
        format!("mamba2-2.7b {}k tok", self.tokens / 1024)
    }
    fn state_dtype(&self) -> &'static str {
        "f32"
    }
    fn batch(&self) -> usize {
        self.seqs
    }
    fn steps(&self) -> usize {
        self.tokens
    }
    fn peer_case(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "op": "ssd", "tokens": self.tokens, "seqs": self.seqs, "heads": HEADS, "dim": DIM,
            "dstate": DSTATE, "groups": 1,
        }))
    }

    fn bytes(&self) -> u64 {
        // bf16 x, out; bf16 B, C; bf16 dt; the returned f32 states.
        let t = self.tokens as u64;
        let act = t * (HEADS * DIM) as u64 * 2 * 2;
        let bc = t * DSTATE as u64 * 2 * 2;
        let dt = t * HEADS as u64 * 2;
        let states = (self.seqs * HEADS * DIM * DSTATE * 4) as u64;
        act + bc + dt + states
    }
    fn prepare<'a>(&self, rt: &'a Runtime) -> anyhow::Result<Box<dyn FnMut() -> anyhow::Result<()> + 'a>> {
        let (t, b) = (self.tokens, self.seqs);
        let per = t / b;
        let qsl: Vec<i64> = (0..=b).map(|i| (i * per) as i64).collect();
        let meta = compute_chunk_metadata(&qsl, &vec![0; b], CHUNK);
        let x = fill_tensor(DType::BF16, &[t, HEADS, DIM], 1, 1.0);
        let dt = fill_tensor(DType::BF16, &[t, HEADS], 2, 0.5);
        let a = fill_tensor(DType::F32, &[HEADS], 3, 1.0);
        let a_neg = HostTensor::from_bytes(
            DType::F32,
            vec![HEADS],
            &a.to_f64_vec().iter().flat_map(|v| (-(v.abs() as f32) - 0.1).to_le_bytes()).collect::<Vec<u8>>(),
        );
        let bm = fill_tensor(DType::BF16, &[t, 1, DSTATE], 4, 1.0);
        let cm = fill_tensor(DType::BF16, &[t, 1, DSTATE], 5, 1.0);
        let d = fill_tensor(DType::F32, &[HEADS], 6, 1.0);
        let bias = fill_tensor(DType::F32, &[HEADS], 7, 0.5);
        let cu = ints(&qsl.iter().map(|&v| v as i32).collect::<Vec<_>>());
        let cu_chunk = ints(&meta.cu_chunk_seqlens);
        let last = ints(&meta.last_chunk_indices);
        let seq_idx = ints(&meta.seq_idx);
        let mut out = HostTensor::filled(DType::BF16, vec![t, HEADS, DIM], 0.0);
        let mut states = HostTensor::filled(DType::F32, vec![b, HEADS, DIM, DSTATE], 0.0);
        let mut ws: Vec<f32> = Vec::new();
        Ok(Box::new(move || {
            let tables = [cu.view(), cu_chunk.view(), last.view(), seq_idx.view()];
            let mut args = MambaChunkScanCombinedVarlenArgs {
                out: Some(out.view_mut()),
                d: Some(d.view()),
                dt_bias: Some(bias.view()),
                dt_softplus: true,
                state_dtype: Some(DType::F32),
                varlen_states: Some(states.view_mut()),
                ..MambaChunkScanCombinedVarlenArgs::new(
                    x.view(),
                    dt.view(),
                    a_neg.view(),
                    bm.view(),
                    cm.view(),
                    CHUNK,
                    tables,
                )
            };
            let need = ssm_tensor::Op::plan(&args)?.scratch_len();
            if ws.len() < need {
                ws.resize(need, 0.0);
            }
            args.scratch = Some(TensorMut::from_slice(&mut ws[..need], &[need])?);
            rt.mamba_chunk_scan_combined_varlen(args)?;
            Ok(())
        }))
    }
}

struct ReplayCase {
    batch: usize,
    window: usize,
}

impl ReplayCase {
    fn ring(&self) -> usize {
        self.window + 1
    }
}

impl BenchCase for ReplayCase {
    fn op(&self) -> &'static str {
        "replayssm"
    }
    fn shape(&self) -> String {
        format!("mamba2-2.7b W{}", self.window)
    }
    fn state_dtype(&self) -> &'static str {
        "f32"
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn steps(&self) -> usize {
        self.window
    }
    /// One cycle of `W` steps per sequence: the checkpoint is read every step and written
    /// once; step `i` (1-based) replays `i` history rows (x bf16, B bf16, dt f32) and appends
    /// one; bf16 x / out, B / C and dt per token.
    fn bytes(&self) -> u64 {
        let w = self.window as u64;
        let slot = (HEADS * DIM * DSTATE * 4) as u64;
        let row = (HEADS * DIM * 2 + DSTATE * 2 + HEADS * 4) as u64;
        let ring = row * (w * (w + 1) / 2 + w);
        let tokens = w * ((HEADS * DIM) as u64 * 2 * 2 + DSTATE as u64 * 2 * 2 + HEADS as u64 * 2);
        self.batch as u64 * (slot * (w + 1) + ring + tokens)
    }
    fn prepare<'a>(&self, rt: &'a Runtime) -> anyhow::Result<Box<dyn FnMut() -> anyhow::Result<()> + 'a>> {
        let replay = Runtime::new(&Config { replayssm: true, ..rt.config().clone() })?;
        let (b, l, w) = (self.batch, self.ring(), self.window);
        let mut state = fill_tensor(DType::F32, &[b, HEADS, DIM, DSTATE], 11, 0.5);
        let mut x_cache = HostTensor::filled(DType::BF16, vec![b, HEADS, l, DIM], 0.0);
        let mut b_cache = HostTensor::filled(DType::BF16, vec![b, 1, l, DSTATE], 0.0);
        let mut dt_cache = HostTensor::filled(DType::F32, vec![b, HEADS, l], 0.0);
        let mut ring_start = ints(&vec![0; b]);
        let mut prev = ints(&vec![0; b]);
        let mut prev_q = ints(&vec![0; b]);
        let slots = ints(&(0..b as i32).collect::<Vec<_>>());
        let x = fill_tensor(DType::BF16, &[b, HEADS, DIM], 12, 1.0);
        let dt = fill_tensor(DType::BF16, &[b, HEADS], 13, 0.5);
        let a = HostTensor::from_bytes(
            DType::F32,
            vec![HEADS],
            &(0..HEADS).flat_map(|h| (-0.5 - h as f32 * 0.01).to_le_bytes()).collect::<Vec<u8>>(),
        );
        let bm = fill_tensor(DType::BF16, &[b, 1, DSTATE], 14, 1.0);
        let cm = fill_tensor(DType::BF16, &[b, 1, DSTATE], 15, 1.0);
        let d = fill_tensor(DType::F32, &[HEADS], 16, 1.0);
        let mut out = HostTensor::filled(DType::BF16, vec![b, HEADS, DIM], 0.0);
        Ok(Box::new(move || {
            for _ in 0..w {
                let trackers = RingTrackers {
                    ring_start: ring_start.view_mut(),
                    prev_num_accepted: prev.view_mut(),
                    prev_query_len: prev_q.view_mut(),
                };
                replay.selective_state_update_replayssm(SelectiveStateUpdateReplaySsm::new(
                    trackers,
                    w as i64,
                    true,
                    |cursors| CheckpointingSsuArgs {
                        state: state.view_mut(),
                        x_cache: x_cache.view_mut(),
                        b_cache: b_cache.view_mut(),
                        dt_cache: dt_cache.view_mut(),
                        ring_start: cursors.ring_start,
                        prev_num_accepted_tokens: cursors.prev_num_accepted_tokens,
                        x: x.view(),
                        dt: dt.view(),
                        a: a.view(),
                        b: bm.view(),
                        c: cm.view(),
                        out: out.view_mut(),
                        d: Some(d.view()),
                        z: None,
                        dt_bias: None,
                        dt_softplus: true,
                        state_batch_indices: Some(slots.view()),
                        pad_slot_id: None,
                        cu_seqlens: None,
                        max_seqlen: None,
                    },
                ))?;
            }
            Ok(())
        }))
    }
}
