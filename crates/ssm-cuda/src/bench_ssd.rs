//! Benchmark pieces for `cargo xtask bench --op ssd --backend cuda`: the Mamba2 SSD chunked
//! prefill (`mamba_chunk_scan_combined_varlen`) timed as every CUDA bench times its op
//! ([`crate::bench`]: CUDA-graph replay of calls rotating over enough problems to exceed the
//! L2, median replay over the calls in the graph).
//!
//! The call is vLLM's Mamba2 mixer prefill: bf16 x, dt, B, C and out (`[T, H, P]`,
//! `[T, H]`, `[T, G, N]`), f32 A, D and dt_bias per head, softplus, `batch` sequences of
//! `seqlen` tokens each, fresh (no history: chunks aligned to the sequence start), chunk
//! metadata from [`ssm_ssd::compute_chunk_metadata`] on the device, and the state pool
//! `[batch + 1, H, P, N]` read through `initial_state_indices` (every sequence reads a slot,
//! `has_initial_state` true) and written through `final_state_indices`, the same permuted slots,
//! with a caller-owned scratch (no allocation in the graph).
//!
//! Bytes per call ([`SsdBenchShape::bytes`]): x and out `2·T·H·P·e`, dt `T·H·e`, B and C
//! `2·T·G·N·e` (`e` the activation size), and each sequence's state read and written once,
//! `2·batch·H·P·N·s`. FLOPs ([`SsdBenchShape::flops`]), the products' useful work:
//! `4·T·H·P·N` (each token's outer product into its chunk state and its read of the entering
//! state) plus, per chunk of `L` tokens, `L·(L+1)·(G·N + H·P)` (the causal halves of C·Bᵀ and
//! of its product with x).

use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, compute_chunk_metadata};
use ssm_tensor::{DType, Run, TensorError};

use crate::bench::{
    BenchResult, bench_rotating, chunk_lengths, cu_seqlens, fill, permutation, prefill_lengths,
    prefill_sequences_label, tensor_err,
};
use crate::testing::DeviceBuffer;
use crate::{CudaBackend, CudaError};

/// One SSD prefill benchmark shape (see the module docs for the call's form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsdBenchShape {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence (on average, when `varied`).
    pub seqlen: usize,
    /// Whether the sequences' lengths differ ([`prefill_lengths`]: in the ratio 1 : 2 : … :
    /// `batch`, `batch · seqlen` tokens in all).
    pub varied: bool,
    /// Heads `H`.
    pub heads: usize,
    /// Head dim `P`.
    pub dim: usize,
    /// State size `N`.
    pub dstate: usize,
    /// Groups `G`.
    pub groups: usize,
    /// `chunk_size`.
    pub chunk: usize,
    /// State (pool) dtype.
    pub state: DType,
    /// Activation dtype (x, dt, B, C, out).
    pub io: DType,
}

impl SsdBenchShape {
    /// Mamba2-2.7B: H 80, P 64, N 128, G 1, chunk 256, bf16 activations.
    pub fn mamba2_2p7b(batch: usize, seqlen: usize, state: DType) -> Self {
        SsdBenchShape {
            batch,
            seqlen,
            varied: false,
            heads: 80,
            dim: 64,
            dstate: 128,
            groups: 1,
            chunk: 256,
            state,
            io: DType::BF16,
        }
    }

    /// Nemotron-H-8B: H 128, P 64, N 128, G 8, chunk 128, bf16 activations.
    pub fn nemotron_h_8b(batch: usize, seqlen: usize, state: DType) -> Self {
        SsdBenchShape {
            batch,
            seqlen,
            varied: false,
            heads: 128,
            dim: 64,
            dstate: 128,
            groups: 8,
            chunk: 128,
            state,
            io: DType::BF16,
        }
    }

    /// The same prefill with `batch` sequences of varied lengths (see [`prefill_lengths`]).
    pub fn with_varied_lengths(self) -> Self {
        Self { varied: true, ..self }
    }

    /// Each sequence's length.
    pub fn lengths(&self) -> Vec<usize> {
        prefill_lengths(self.batch, self.seqlen, self.varied)
    }

    /// Packed tokens `T`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seqlen
    }

    /// A short label, e.g. `h80 d64 n128 g1 c256 f32 4x2048`.
    pub fn label(&self) -> String {
        format!(
            "h{} d{} n{} g{} c{} {} {}",
            self.heads,
            self.dim,
            self.dstate,
            self.groups,
            self.chunk,
            self.state,
            prefill_sequences_label(self.batch, self.seqlen, self.varied)
        )
    }

    /// Bytes one call must move at least (see the module docs).
    pub fn bytes(&self) -> u64 {
        let (t, h, p, n, g) =
            (self.tokens() as u64, self.heads as u64, self.dim as u64, self.dstate as u64, self.groups as u64);
        let e = self.io.size() as u64;
        2 * t * h * p * e + t * h * e + 2 * t * g * n * e + 2 * self.batch as u64 * h * p * n * self.state.size() as u64
    }

    /// The products' useful FLOPs (see the module docs).
    pub fn flops(&self) -> f64 {
        let (h, p, n, g) = (self.heads as f64, self.dim as f64, self.dstate as f64, self.groups as f64);
        let mut diag = 0.0;
        for l in chunk_lengths(&self.lengths(), self.chunk) {
            let l = l as f64;
            diag += l * (l + 1.0) * (g * n + h * p);
        }
        4.0 * self.tokens() as f64 * h * p * n + diag
    }
}

/// Timing of one SSD shape.
pub type SsdBenchResult = BenchResult<SsdBenchShape>;

/// One problem: its inputs, output, pool, tables, metadata and scratch.
struct Problem {
    bufs: Vec<DeviceBuffer>,
    nchunks: usize,
    scratch_len: usize,
}

// The filled buffers' places in `Problem::bufs` (order: x dt A B C D dt_bias out pool slots
// has_initial_state cu_seqlens cu_chunk_seqlens last_chunk_indices seq_idx scratch).
const X: usize = 0;
const DT: usize = 1;
const A: usize = 2;
const B: usize = 3;
const C: usize = 4;
const D: usize = 5;
const DT_BIAS: usize = 6;
const POOL: usize = 8;

fn i32v(buf: &DeviceBuffer, len: usize) -> Result<ssm_tensor::TensorRef<'_>, TensorError> {
    buf.view(DType::I32, &[len], &[1], 0)
}

/// The bytes of `v` as an i32 vector (through `HostTensor`, the one integer encoder).
fn i32_bytes(v: &[i32]) -> Vec<u8> {
    let wide: Vec<i64> = v.iter().map(|&x| x as i64).collect();
    ssm_tensor::HostTensor::from_i64(DType::I32, vec![v.len()], &wide).bytes().to_vec()
}

impl Problem {
    fn new(be: &CudaBackend, s: &SsdBenchShape, seed: u64) -> Result<Self, CudaError> {
        let (t, h, p, n, g) = (s.tokens(), s.heads, s.dim, s.dstate, s.groups);
        let cu = cu_seqlens(&s.lengths());
        let m = compute_chunk_metadata(&cu, &vec![0; s.batch], s.chunk);
        let nchunks = m.seq_idx.len();
        let slots = permutation(s.batch + 1, seed).into_iter().filter(|&v| v != 0).collect::<Vec<i32>>();
        let buf = |elems: usize, dtype: DType| DeviceBuffer::zeroed(be, elems * dtype.size());
        let io = s.io;
        let scratch_len = Self::scratch_len(s, nchunks);
        let bufs = vec![
            buf(t * h * p, io)?,
            buf(t * h, io)?,
            buf(h, DType::F32)?,
            buf(t * g * n, io)?,
            buf(t * g * n, io)?,
            buf(h, DType::F32)?,
            buf(h, DType::F32)?,
            buf(t * h * p, io)?,
            buf((s.batch + 1) * h * p * n, s.state)?,
            DeviceBuffer::from_host(be, &i32_bytes(&slots))?,
            DeviceBuffer::from_host(be, &vec![1u8; s.batch])?,
            DeviceBuffer::from_host(be, &i32_bytes(&cu.iter().map(|&v| v as i32).collect::<Vec<_>>()))?,
            DeviceBuffer::from_host(be, &i32_bytes(&m.cu_chunk_seqlens))?,
            DeviceBuffer::from_host(be, &i32_bytes(&m.last_chunk_indices))?,
            DeviceBuffer::from_host(be, &i32_bytes(&m.seq_idx))?,
            buf(scratch_len, DType::F32)?,
        ];
        fill(be, bufs[X].addr(), t * h * p, io, seed, -1.0, 1.0)?;
        fill(be, bufs[DT].addr(), t * h, io, seed + 1, -4.0, 0.0)?;
        fill(be, bufs[A].addr(), h, DType::F32, seed + 2, -2.0, -0.1)?;
        fill(be, bufs[B].addr(), t * g * n, io, seed + 3, -1.0, 1.0)?;
        fill(be, bufs[C].addr(), t * g * n, io, seed + 4, -1.0, 1.0)?;
        fill(be, bufs[D].addr(), h, DType::F32, seed + 5, -1.0, 1.0)?;
        fill(be, bufs[DT_BIAS].addr(), h, DType::F32, seed + 6, -1.0, 1.0)?;
        fill(be, bufs[POOL].addr(), (s.batch + 1) * h * p * n, s.state, seed + 7, -0.5, 0.5)?;
        Ok(Problem { bufs, nchunks, scratch_len })
    }

    /// The scratch a call of `s` needs (its plan's `scratch_len`, from a host plan of the
    /// same shapes).
    fn scratch_len(s: &SsdBenchShape, nchunks: usize) -> usize {
        let q_row = s.chunk.next_multiple_of(8);
        let state_row = s.dstate.next_multiple_of(8);
        let per_chunk = s.heads * q_row * 2 + s.heads * s.dim * state_row + s.groups * s.chunk * q_row;
        nchunks * per_chunk
    }

    fn args(&mut self, s: &SsdBenchShape) -> Result<MambaChunkScanCombinedVarlenArgs<'_>, TensorError> {
        let (t, h, p, n, g) = (s.tokens(), s.heads, s.dim, s.dstate, s.groups);
        let (hi, pi, ni, gi) = (h as isize, p as isize, n as isize, g as isize);
        let io = s.io;
        let (nc, batch) = (self.nchunks, s.batch);
        let [x, dt, a, b, c, d, dt_bias, out, pool, slots, has, cu, cu_chunk, last, seq, scratch] = &mut self.bufs[..]
        else {
            unreachable!("sixteen buffers")
        };
        Ok(MambaChunkScanCombinedVarlenArgs {
            out: Some(out.view_mut(io, &[t, h, p], &[hi * pi, pi, 1], 0)?),
            d: Some(d.view(DType::F32, &[h], &[1], 0)?),
            dt_bias: Some(dt_bias.view(DType::F32, &[h], &[1], 0)?),
            ssm_state: Some(pool.view_mut(s.state, &[batch + 1, h, p, n], &[hi * pi * ni, pi * ni, ni, 1], 0)?),
            initial_state_indices: Some(i32v(slots, batch)?),
            has_initial_state: Some(has.view(DType::Bool, &[batch], &[1], 0)?),
            final_state_indices: Some(i32v(slots, batch)?),
            dt_softplus: true,
            state_dtype: Some(s.state),
            scratch: Some(scratch.view_mut(DType::F32, &[self.scratch_len], &[1], 0)?),
            ..MambaChunkScanCombinedVarlenArgs::new(
                x.view(io, &[t, h, p], &[hi * pi, pi, 1], 0)?,
                dt.view(io, &[t, h], &[hi, 1], 0)?,
                a.view(DType::F32, &[h], &[1], 0)?,
                b.view(io, &[t, g, n], &[gi * ni, ni, 1], 0)?,
                c.view(io, &[t, g, n], &[gi * ni, ni, 1], 0)?,
                s.chunk,
                [i32v(cu, batch + 1)?, i32v(cu_chunk, nc + 1)?, i32v(last, batch)?, i32v(seq, nc)?],
            )
        })
    }
}

/// Times `shape`: CUDA-graph replay of calls rotating over enough problems to defeat the L2.
pub fn bench_ssd(be: &CudaBackend, shape: &SsdBenchShape) -> Result<SsdBenchResult, CudaError> {
    let bad_plan = |e: ssm_ssd::SsdError| CudaError::Unsupported(format!("bench plan: {e}"));
    bench_rotating(
        be,
        shape,
        shape.bytes(),
        3000,
        |seed| Problem::new(be, shape, seed),
        |p| be.run(ssm_ssd::plan(p.args(shape).map_err(tensor_err)?).map_err(bad_plan)?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_flops_of_mamba2_prefill() {
        let s = SsdBenchShape::mamba2_2p7b(2, 300, DType::F32);
        let t = 600u64;
        let act = 2 * t * 80 * 64 * 2 + t * 80 * 2 + 2 * t * 128 * 2;
        assert_eq!(s.bytes(), act + 2 * 2 * 80 * 64 * 128 * 4);
        // 300 tokens: a chunk of 256 and one of 44, per sequence.
        let diag = (256.0 * 257.0 + 44.0 * 45.0) * (128.0 + 80.0 * 64.0);
        assert_eq!(s.flops(), 4.0 * 600.0 * 80.0 * 64.0 * 128.0 + 2.0 * diag);
        assert_eq!(s.label(), "h80 d64 n128 g1 c256 f32 2x300");
    }

    #[test]
    fn scratch_matches_the_plan() {
        // The plan of a host call of the same shapes asks for the same scratch.
        let s = SsdBenchShape {
            heads: 4,
            dim: 8,
            dstate: 16,
            groups: 2,
            chunk: 16,
            ..SsdBenchShape::mamba2_2p7b(2, 40, DType::F32)
        };
        let t = s.tokens();
        let cu: Vec<i64> = vec![0, 40, 80];
        let m = compute_chunk_metadata(&cu, &[0, 0], s.chunk);
        let nc = m.seq_idx.len();
        let x = vec![0f32; t * 32];
        let dt = vec![0f32; t * 4];
        let a = vec![0f32; 4];
        let bc = vec![0f32; t * 32];
        let cu32: Vec<i32> = cu.iter().map(|&v| v as i32).collect();
        fn r<'v>(v: &'v [f32], sh: &[usize]) -> ssm_tensor::TensorRef<'v> {
            ssm_tensor::TensorRef::from_slice(v, sh).unwrap()
        }
        fn i(v: &[i32], n: usize) -> ssm_tensor::TensorRef<'_> {
            ssm_tensor::TensorRef::from_slice(v, &[n]).unwrap()
        }
        let args = MambaChunkScanCombinedVarlenArgs::new(
            r(&x, &[t, 4, 8]),
            r(&dt, &[t, 4]),
            r(&a, &[4]),
            r(&bc, &[t, 2, 16]),
            r(&bc, &[t, 2, 16]),
            16,
            [i(&cu32, 3), i(&m.cu_chunk_seqlens, nc + 1), i(&m.last_chunk_indices, 2), i(&m.seq_idx, nc)],
        );
        let planned = ssm_ssd::plan(args).unwrap();
        assert_eq!(Problem::scratch_len(&s, nc), planned.plan().scratch_len());
    }
}
