//! Benchmark pieces for ReplaySSM on CUDA: `checkpointing_ssu` timed as the SSU is
//! ([`crate::bench`]: CUDA-graph replay over rotating pools), on a steady-state
//! speculative decode. Sequence `i`'s slot holds `k = min(W, T·(i mod P))` live history rows,
//! `P = ⌊W / T⌋ + 1` (with `T = 4`, `W = 16`: 0, 4, 8, 12, 16; with `T = 1`, `W = 15`: 0 to 15),
//! the histories a decode that accepts all `T` tokens walks through between two flushes; so one
//! sequence in `P` flushes (`k + T > W`) and writes its checkpoint, the others write no state.
//! The cursors do not move (the op never moves them), so every replay does the same work.
//!
//! Bytes counted per call, the fewest the op must move: every sequence's checkpoint read once,
//! the flushing sequences' checkpoints written once, each sequence's `k` history rows of x, B
//! and dt read, its `T` new rows appended, the new tokens' x, dt, B, C read and out written,
//! the per-head parameters, the slot table and both cursors.

use ssm_ring::CheckpointingSsuArgs;
use ssm_tensor::{DType, Run, TensorError};

use crate::bench::{BenchResult, bench_rotating, fill, tensor_err};
use crate::testing::DeviceBuffer;
use crate::{CudaBackend, CudaError};

/// One ReplaySSM benchmark shape (Mamba2 tied form, bf16 activations and rings, D, dt_bias,
/// softplus, a slot table; dense `[batch, T]` tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplaySsmBenchShape {
    /// Sequences.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Head dim.
    pub dim: usize,
    /// State size.
    pub dstate: usize,
    /// Groups of B/C.
    pub groups: usize,
    /// Checkpoint dtype.
    pub state: DType,
    /// Dtype of x, dt, B, C, out and of the rings.
    pub io: DType,
    /// Tokens per step `T`.
    pub tokens: usize,
    /// Logical window `W` (ring length `W + T`).
    pub window: usize,
}

impl ReplaySsmBenchShape {
    /// Mamba2-2.7B (80 heads, dim 64, dstate 128, one group), window 16 (vLLM's default).
    /// One token a step (`tokens == 1`) takes window 15 instead: a ring of 16 rows, as vLLM's
    /// Triton ReplaySSM decode (`selective_state_update_replayssm_output_only`) keeps 16 rows
    /// (`max_cache_len`) and flushes when the 16th is the current token's.
    pub fn mamba2_2p7b(batch: usize, state: DType, tokens: usize) -> Self {
        ReplaySsmBenchShape {
            batch,
            heads: 80,
            dim: 64,
            dstate: 128,
            groups: 1,
            state,
            io: DType::BF16,
            tokens,
            window: if tokens == 1 { 15 } else { 16 },
        }
    }

    /// A short label, e.g. `replayssm h80 d64 n128 g1 f32 b64 spec4 w16`.
    pub fn label(&self) -> String {
        format!(
            "replayssm h{} d{} n{} g{} {} b{} spec{} w{}",
            self.heads, self.dim, self.dstate, self.groups, self.state, self.batch, self.tokens, self.window
        )
    }

    /// Ring rows `L = W + T`.
    pub fn ring_len(&self) -> usize {
        self.window + self.tokens
    }

    /// Steps `P = ⌊W / T⌋ + 1` between two flushes of one sequence (see the module docs).
    pub fn period(&self) -> usize {
        self.window / self.tokens.max(1) + 1
    }

    /// Live history rows of sequence `i` (see the module docs).
    pub fn history(&self, i: usize) -> usize {
        (self.tokens * (i % self.period())).min(self.window)
    }

    /// Sequences whose call flushes (writes its checkpoint).
    pub fn flushing(&self) -> usize {
        (0..self.batch).filter(|&i| self.history(i) + self.tokens > self.window).count()
    }

    /// Bytes one call must move at least (see the module docs).
    pub fn bytes(&self) -> u64 {
        let (h, p, n, g, t) =
            (self.heads as u64, self.dim as u64, self.dstate as u64, self.groups as u64, self.tokens as u64);
        let (io, b) = (self.io.size() as u64, self.batch as u64);
        let slot = h * p * n * self.state.size() as u64;
        let row = h * p * io + g * n * io + h * 4; // one ring row: x, B, dt (f32)
        let history: u64 = (0..self.batch).map(|i| self.history(i) as u64).sum();
        let tokens = b * t * (h * p * io * 2 + h * io + g * n * io * 2);
        b * slot + self.flushing() as u64 * slot + (history + b * t) * row + tokens + 3 * h * 4 + 3 * b * 4
    }
}

/// One pool of the ReplaySSM bench: checkpoints, rings, cursors, tokens and the slot table.
struct Pool {
    state: DeviceBuffer,
    x_cache: DeviceBuffer,
    b_cache: DeviceBuffer,
    dt_cache: DeviceBuffer,
    ring_start: DeviceBuffer,
    prev_num: DeviceBuffer,
    x: DeviceBuffer,
    dt: DeviceBuffer,
    a: DeviceBuffer,
    b: DeviceBuffer,
    c: DeviceBuffer,
    d: DeviceBuffer,
    dt_bias: DeviceBuffer,
    out: DeviceBuffer,
    sbi: DeviceBuffer,
}

impl Pool {
    fn new(be: &CudaBackend, s: &ReplaySsmBenchShape, seed: u64) -> Result<Self, CudaError> {
        let (h, p, n, g, t, l, bt) = (s.heads, s.dim, s.dstate, s.groups, s.tokens, s.ring_len(), s.batch);
        let buf = |elems: usize, dtype: DType| DeviceBuffer::zeroed(be, elems * dtype.size());
        let ints = |v: Vec<i32>| DeviceBuffer::from_host(be, bytemuck::cast_slice(&v));
        // Sequence i uses slot perm[i]; the cursors are indexed by slot.
        let perm = crate::bench::permutation(bt, seed);
        let (mut starts, mut ks) = (vec![0i32; bt], vec![0i32; bt]);
        for (i, &slot) in perm.iter().enumerate() {
            starts[slot as usize] = (slot as usize % l) as i32;
            ks[slot as usize] = s.history(i) as i32;
        }
        let pool = Pool {
            state: buf(bt * h * p * n, s.state)?,
            x_cache: buf(bt * h * l * p, s.io)?,
            b_cache: buf(bt * g * l * n, s.io)?,
            dt_cache: buf(bt * h * l, DType::F32)?,
            ring_start: ints(starts)?,
            prev_num: ints(ks)?,
            x: buf(bt * t * h * p, s.io)?,
            dt: buf(bt * t * h, s.io)?,
            a: buf(h, DType::F32)?,
            b: buf(bt * t * g * n, s.io)?,
            c: buf(bt * t * g * n, s.io)?,
            d: buf(h, DType::F32)?,
            dt_bias: buf(h, DType::F32)?,
            out: buf(bt * t * h * p, s.io)?,
            sbi: ints(perm)?,
        };
        fill(be, pool.state.addr(), bt * h * p * n, s.state, seed, -1.0, 1.0)?;
        fill(be, pool.x_cache.addr(), bt * h * l * p, s.io, seed + 1, -1.0, 1.0)?;
        fill(be, pool.b_cache.addr(), bt * g * l * n, s.io, seed + 2, -1.0, 1.0)?;
        fill(be, pool.dt_cache.addr(), bt * h * l, DType::F32, seed + 3, 0.01, 0.2)?;
        fill(be, pool.x.addr(), bt * t * h * p, s.io, seed + 4, -1.0, 1.0)?;
        fill(be, pool.dt.addr(), bt * t * h, s.io, seed + 5, -3.0, 1.0)?;
        fill(be, pool.a.addr(), h, DType::F32, seed + 6, -2.0, -0.1)?;
        fill(be, pool.b.addr(), bt * t * g * n, s.io, seed + 7, -1.0, 1.0)?;
        fill(be, pool.c.addr(), bt * t * g * n, s.io, seed + 8, -1.0, 1.0)?;
        fill(be, pool.d.addr(), h, DType::F32, seed + 9, -1.0, 1.0)?;
        fill(be, pool.dt_bias.addr(), h, DType::F32, seed + 10, -1.0, 1.0)?;
        Ok(pool)
    }

    fn args(&mut self, s: &ReplaySsmBenchShape) -> Result<CheckpointingSsuArgs<'_>, TensorError> {
        let (h, p, n, g, t, l, bt) = (s.heads, s.dim, s.dstate, s.groups, s.tokens, s.ring_len(), s.batch);
        let c = |shape: &[usize]| -> Vec<isize> {
            let mut st = vec![1isize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                st[i] = st[i + 1] * shape[i + 1] as isize;
            }
            st
        };
        let tok = [bt, t, h, p];
        let bc = [bt, t, g, n];
        Ok(CheckpointingSsuArgs {
            state: self.state.view_mut(s.state, &[bt, h, p, n], &c(&[bt, h, p, n]), 0)?,
            x_cache: self.x_cache.view_mut(s.io, &[bt, h, l, p], &c(&[bt, h, l, p]), 0)?,
            b_cache: self.b_cache.view_mut(s.io, &[bt, g, l, n], &c(&[bt, g, l, n]), 0)?,
            dt_cache: self.dt_cache.view_mut(DType::F32, &[bt, h, l], &c(&[bt, h, l]), 0)?,
            ring_start: self.ring_start.view(DType::I32, &[bt], &[1], 0)?,
            prev_num_accepted_tokens: self.prev_num.view(DType::I32, &[bt], &[1], 0)?,
            x: self.x.view(s.io, &tok, &c(&tok), 0)?,
            dt: self.dt.view(s.io, &[bt, t, h], &c(&[bt, t, h]), 0)?,
            a: self.a.view(DType::F32, &[h], &[1], 0)?,
            b: self.b.view(s.io, &bc, &c(&bc), 0)?,
            c: self.c.view(s.io, &bc, &c(&bc), 0)?,
            out: self.out.view_mut(s.io, &tok, &c(&tok), 0)?,
            d: Some(self.d.view(DType::F32, &[h], &[1], 0)?),
            z: None,
            dt_bias: Some(self.dt_bias.view(DType::F32, &[h], &[1], 0)?),
            dt_softplus: true,
            state_batch_indices: Some(self.sbi.view(DType::I32, &[bt], &[1], 0)?),
            pad_slot_id: Some(-1),
            cu_seqlens: None,
            max_seqlen: None,
        })
    }
}

/// Times `shape`: CUDA-graph replay of many calls rotating over enough pools to defeat the L2.
pub fn bench_replayssm(
    be: &CudaBackend,
    shape: &ReplaySsmBenchShape,
) -> Result<BenchResult<ReplaySsmBenchShape>, CudaError> {
    bench_rotating(
        be,
        shape,
        shape.bytes(),
        3000,
        |seed| Pool::new(be, shape, seed),
        |p| {
            let args = p.args(shape).map_err(tensor_err)?;
            let call = ssm_ring::plan(args).map_err(|e| CudaError::Unsupported(format!("bench plan: {e}")))?;
            be.run(call)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sequence_in_five_flushes() {
        let s = ReplaySsmBenchShape::mamba2_2p7b(64, DType::F32, 4);
        assert_eq!((0..5).map(|i| s.history(i)).collect::<Vec<_>>(), [0, 4, 8, 12, 16]);
        assert_eq!(s.flushing(), 12);
        let slot = 80 * 64 * 128 * 4;
        // Checkpoints: 64 read, 12 written; far less than the plain speculative SSU's 64 × 5.
        assert!(s.bytes() > (64 + 12) * slot && s.bytes() < (64 + 12) * slot * 2);
        assert_eq!(s.label(), "replayssm h80 d64 n128 g1 f32 b64 spec4 w16");
    }

    #[test]
    fn one_token_steps_flush_one_sequence_in_sixteen() {
        // vLLM's Triton ReplaySSM decode: 16 ring rows, write positions 0..=15, a flush at 15.
        let s = ReplaySsmBenchShape::mamba2_2p7b(64, DType::BF16, 1);
        assert_eq!((s.window, s.ring_len(), s.period()), (15, 16, 16));
        assert_eq!((0..17).map(|i| s.history(i)).collect::<Vec<_>>(), [(0..16).collect(), vec![0]].concat());
        assert_eq!(s.flushing(), 4);
    }
}
