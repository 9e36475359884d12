//! Benchmark pieces for `cargo xtask bench --op gdn --backend cuda` (`bench-cuda-gdn-chunk`):
//! the GDN chunked prefill (`chunk_gated_delta_rule`) timed as every CUDA bench times its op
//! ([`crate::bench`]: CUDA-graph replay of calls rotating over enough problems to exceed the
//! L2, median replay over the calls in the graph).
//!
//! The call is Qwen3-Next's prefill as vLLM makes it: bf16 q/k/v/o (`[1, T, H, K]`,
//! `[1, T, HV, V]`), f32 `g` and bf16 `beta` (`[1, T, HV]`, what `fused_gdn_gating` writes),
//! q/k l2-normalised in the kernel, `batch` sequences of `seqlen` tokens packed with
//! `cu_seqlens`, and the state pool `[batch + 1, HV, V, K]` read through
//! `initial_state_indices` (a permutation of slots 1..=batch, `has_initial_state` true) and
//! written back in place.
//!
//! Bytes per call ([`GdnChunkBenchShape::bytes`]): q and k `2·T·H·K·2`, v and o `2·T·HV·V·2`,
//! g and beta `T·HV·(4 + 2)`, and each sequence's state read and written once,
//! `2·batch·HV·V·K·s`. FLOPs ([`GdnChunkBenchShape::flops`]), the products' useful work per
//! value head: `6·K·V` per token (q·Sᵀ, W·Sᵀ and the state update) plus, per chunk of `L`
//! tokens, `L·(L+1)·(3K + 2V)` (the causal halves of K·Kᵀ and Q·Kᵀ, of A⁻¹·K and A⁻¹·V, and of
//! P·V').

use ssm_gdn::{CHUNK_SIZE, ChunkGatedDeltaRuleArgs, ChunkScratch};
use ssm_tensor::{DType, Run, TensorError};

use crate::bench::{
    BenchResult, bench_rotating, chunk_lengths, cu_seqlens, fill, permutation, prefill_lengths,
    prefill_sequences_label, tensor_err,
};
use crate::testing::DeviceBuffer;
use crate::{CudaBackend, CudaError};

/// One GDN chunked-prefill benchmark shape (see the module docs for the call's form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnChunkBenchShape {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence (on average, when `varied`).
    pub seqlen: usize,
    /// Whether the sequences' lengths differ ([`prefill_lengths`]: in the ratio 1 : 2 : … :
    /// `batch`, `batch · seqlen` tokens in all).
    pub varied: bool,
    /// q/k heads `H`.
    pub heads: usize,
    /// Value heads `HV`.
    pub v_heads: usize,
    /// `head_k_dim`.
    pub k: usize,
    /// `head_v_dim`.
    pub v: usize,
    /// State (pool) dtype.
    pub state: DType,
}

impl GdnChunkBenchShape {
    /// Qwen3-Next (one GPU): H 16, HV 32, K = V = 128.
    pub fn qwen3_next(batch: usize, seqlen: usize, state: DType) -> Self {
        GdnChunkBenchShape { batch, seqlen, varied: false, heads: 16, v_heads: 32, k: 128, v: 128, state }
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

    /// A short label, e.g. `h16 hv32 k128 v128 f32 4x2048`.
    pub fn label(&self) -> String {
        format!(
            "h{} hv{} k{} v{} {} {}",
            self.heads,
            self.v_heads,
            self.k,
            self.v,
            self.state,
            prefill_sequences_label(self.batch, self.seqlen, self.varied)
        )
    }

    /// Bytes one call must move at least (see the module docs).
    pub fn bytes(&self) -> u64 {
        let (t, h, hv, k, v) =
            (self.tokens() as u64, self.heads as u64, self.v_heads as u64, self.k as u64, self.v as u64);
        2 * t * h * k * 2
            + 2 * t * hv * v * 2
            + t * hv * 6
            + 2 * self.batch as u64 * hv * v * k * self.state.size() as u64
    }

    /// The products' useful FLOPs (see the module docs).
    pub fn flops(&self) -> f64 {
        let (hv, k, v) = (self.v_heads as f64, self.k as f64, self.v as f64);
        let mut intra = 0.0;
        for l in chunk_lengths(&self.lengths(), CHUNK_SIZE) {
            let l = l as f64;
            intra += l * (l + 1.0) * (3.0 * k + 2.0 * v);
        }
        hv * (6.0 * k * v * self.tokens() as f64 + intra)
    }
}

/// Timing of one chunked-prefill shape.
pub type GdnChunkBenchResult = BenchResult<GdnChunkBenchShape>;

// Buffers of a problem, in order: q k v g beta o pool slots has_initial_state cu_seqlens.
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const G: usize = 3;
const BETA: usize = 4;
const POOL: usize = 6;

/// The bytes of `v` as an i32 vector (through `HostTensor`, the one integer encoder).
fn i32_bytes(v: &[i64]) -> Vec<u8> {
    ssm_tensor::HostTensor::from_i64(DType::I32, vec![v.len()], v).bytes().to_vec()
}

struct Problem(Vec<DeviceBuffer>);

impl Problem {
    fn new(be: &CudaBackend, s: &GdnChunkBenchShape, seed: u64) -> Result<Self, CudaError> {
        let (t, h, hv, k, v, b) = (s.tokens(), s.heads, s.v_heads, s.k, s.v, s.batch);
        let cu = cu_seqlens(&s.lengths());
        let slots: Vec<i64> = permutation(b + 1, seed).into_iter().filter(|&x| x != 0).map(i64::from).collect();
        let buf = |elems: usize, dtype: DType| DeviceBuffer::zeroed(be, elems * dtype.size());
        let bufs = vec![
            buf(t * h * k, DType::BF16)?,
            buf(t * h * k, DType::BF16)?,
            buf(t * hv * v, DType::BF16)?,
            buf(t * hv, DType::F32)?,
            buf(t * hv, DType::BF16)?,
            buf(t * hv * v, DType::BF16)?,
            buf((b + 1) * hv * v * k, s.state)?,
            DeviceBuffer::from_host(be, &i32_bytes(&slots))?,
            DeviceBuffer::from_host(be, &vec![1u8; b])?,
            DeviceBuffer::from_host(be, &i32_bytes(&cu))?,
        ];
        fill(be, bufs[Q].addr(), t * h * k, DType::BF16, seed, -1.0, 1.0)?;
        fill(be, bufs[K].addr(), t * h * k, DType::BF16, seed + 1, -1.0, 1.0)?;
        fill(be, bufs[V].addr(), t * hv * v, DType::BF16, seed + 2, -1.0, 1.0)?;
        fill(be, bufs[G].addr(), t * hv, DType::F32, seed + 3, -1.0, -0.001)?;
        fill(be, bufs[BETA].addr(), t * hv, DType::BF16, seed + 4, 0.05, 0.95)?;
        fill(be, bufs[POOL].addr(), (b + 1) * hv * v * k, s.state, seed + 5, -0.5, 0.5)?;
        // The caller's scratch, as an engine passes it: sized by the size query, so that the
        // graph holds no allocation.
        let mut p = Problem(bufs);
        let bad_plan = |e: ssm_gdn::GdnError| CudaError::Unsupported(format!("bench plan: {e}"));
        let n = be.chunk_gated_delta_rule_scratch_size(
            ssm_gdn::plan(p.args(s).map_err(tensor_err)?).map_err(bad_plan)?.plan(),
        );
        p.0.push(buf(n.max(1), DType::F32)?);
        Ok(p)
    }

    fn args(&mut self, s: &GdnChunkBenchShape) -> Result<ChunkGatedDeltaRuleArgs<'_>, TensorError> {
        let (t, h, hv, k, v, b) = (s.tokens(), s.heads, s.v_heads, s.k, s.v, s.batch);
        let (hi, hvi, ki, vi) = (h as isize, hv as isize, k as isize, v as isize);
        let (main, rest) = self.0.split_at_mut(10);
        let [q, kk, vv, g, beta, o, pool, slots, has, cu] = main else { unreachable!("ten buffers") };
        let scratch = match rest.first_mut() {
            Some(w) => {
                let n = w.len() / 4;
                Some(w.view_mut(DType::F32, &[n], &[1], 0)?)
            }
            None => None,
        };
        let bf = DType::BF16;
        Ok(ChunkGatedDeltaRuleArgs {
            scratch,
            initial_state: Some(pool.view_mut(s.state, &[b + 1, hv, v, k], &[hvi * vi * ki, vi * ki, ki, 1], 0)?),
            initial_state_indices: Some(slots.view(DType::I32, &[b], &[1], 0)?),
            has_initial_state: Some(has.view(DType::Bool, &[b], &[1], 0)?),
            inplace_final_state: true,
            cu_seqlens: Some(cu.view(DType::I32, &[b + 1], &[1], 0)?),
            use_qk_l2norm_in_kernel: true,
            ..ChunkGatedDeltaRuleArgs::new(
                q.view(bf, &[1, t, h, k], &[0, hi * ki, ki, 1], 0)?,
                kk.view(bf, &[1, t, h, k], &[0, hi * ki, ki, 1], 0)?,
                vv.view(bf, &[1, t, hv, v], &[0, hvi * vi, vi, 1], 0)?,
                g.view(DType::F32, &[1, t, hv], &[0, hvi, 1], 0)?,
                beta.view(bf, &[1, t, hv], &[0, hvi, 1], 0)?,
                o.view_mut(bf, &[1, t, hv, v], &[0, hvi * vi, vi, 1], 0)?,
            )
        })
    }
}

/// Times `shape`: CUDA-graph replay of calls rotating over enough problems to defeat the L2.
pub fn bench_gdn_chunk(be: &CudaBackend, shape: &GdnChunkBenchShape) -> Result<GdnChunkBenchResult, CudaError> {
    let bad_plan = |e: ssm_gdn::GdnError| CudaError::Unsupported(format!("bench plan: {e}"));
    bench_rotating(
        be,
        shape,
        shape.bytes(),
        5000,
        |seed| Problem::new(be, shape, seed),
        |p| be.run(ssm_gdn::plan(p.args(shape).map_err(tensor_err)?).map_err(bad_plan)?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_flops_of_qwen3_next_prefill() {
        let s = GdnChunkBenchShape::qwen3_next(2, 100, DType::F32);
        let t = 200u64;
        assert_eq!(s.bytes(), 2 * t * 16 * 128 * 2 + 2 * t * 32 * 128 * 2 + t * 32 * 6 + 2 * 2 * 32 * 128 * 128 * 4);
        // 100 tokens: chunks of 64 and 36, per sequence.
        let intra = (64.0 * 65.0 + 36.0 * 37.0) * (5.0 * 128.0);
        assert_eq!(s.flops(), 32.0 * (6.0 * 128.0 * 128.0 * 200.0 + 2.0 * intra));
        assert_eq!(s.label(), "h16 hv32 k128 v128 f32 2x100");
        // Three varied sequences, 300 tokens: 50, 100 and 150, chunked 50; 64 + 36; 64 + 64 + 22.
        let v = GdnChunkBenchShape::qwen3_next(3, 100, DType::F32).with_varied_lengths();
        assert_eq!(v.lengths(), [50, 100, 150]);
        let intra = (50.0 * 51.0 + 3.0 * 64.0 * 65.0 + 36.0 * 37.0 + 22.0 * 23.0) * (5.0 * 128.0);
        assert_eq!(v.flops(), 32.0 * (6.0 * 128.0 * 128.0 * 300.0 + intra));
        assert_eq!(v.label(), "h16 hv32 k128 v128 f32 3v300");
    }
}
