//! Gated delta rule on the CPU (semantics/gdn_conv.md §1–§2): gating, the recurrent and
//! speculative decode, and the chunked prefill.
//!
//! Recurrent ops: one work item per (sequence, value head). The recurrence is independent
//! per value row `v` of `S` (`S[v,:]` only needs `v[v]`, `k`, `q`, `g`, `β`), so an item walks
//! `V` in blocks whose f32 rows fit a 64 KiB tile on the item's stack, and runs every token of the sequence on
//! that block before moving on: each state element is read once and written once per stored
//! token, one streaming pass over the state (read, update in f32, write in place). Lanes run
//! over K for the `[.., V, K]` layout (two reductions per row and token) and over V for the
//! `[.., K, V]` layout (no reductions).
//!
//! Chunked prefill: per (sequence, value head), chunks of 64 tokens in the WY/UT form (§2.5):
//! in-chunk cumsum `G`, `A = strictly_lower(β_i k_i·k_j e^{G_i−G_j})`, `U = (I+A)⁻¹ βV` and
//! `W = (I+A)⁻¹ (β e^G K)` by forward substitution, `V' = U − W H`, outputs
//! `e^{G_i} q_i H + Σ_{j≤i} (q_i·k_j) e^{G_i−G_j} V'_j`, and `H ← e^{G_last} H + Σ_i e^{G_last−G_i} k_i V'_iᵀ`
//! with the state held K-major (`H[k][v] = S[v][k]`) in f32 for the whole sequence. Everything is
//! f32 (vLLM keeps bf16 intermediates), so the result is closer to the f64 recurrence than the peer.
//! Scratch is caller-owned (one slice per worker thread; see `chunk_gated_delta_rule_scratch_size`).
//!
//! Files follow the data flow: [`gating`] (the fused gate op and the gate formulas),
//! [`recurrent`] (items of the recurrent ops: spans, starts, which path), [`tile`] (the f32 tile
//! path), [`direct`] (memory-to-memory decode kernels), [`chunk`] (the chunked prefill).

mod chunk;
mod direct;
mod gating;
mod recurrent;
mod tile;

use ssm_tensor::{TensorMut, TensorRef};

use crate::CpuError;
use crate::host::{host_opt, host_ref, host_shared};
use crate::lanes::{dot, round8, scal};
use crate::shared::SharedBuf;
use crate::simd::Simd;

/// The host memory every GDN state op reads (`q`, `k`, `v`, `cu_seqlens`) and writes (the state
/// pool `initial_state`, `final_state`, `o`).
struct Io<'a> {
    q: &'a [u8],
    k: &'a [u8],
    v: &'a [u8],
    cu: Option<TensorRef<'a>>,
    state: Option<SharedBuf<u8>>,
    final_state: Option<SharedBuf<u8>>,
    o: SharedBuf<u8>,
}

impl<'a> Io<'a> {
    /// The tensors' host memory, or [`CpuError::NotHost`] naming the first that is not.
    fn new(
        [q, k, v]: [&TensorRef<'a>; 3],
        cu_seqlens: &Option<TensorRef<'a>>,
        initial_state: Option<&mut TensorMut<'_>>,
        final_state: Option<&mut TensorMut<'_>>,
        o: &mut TensorMut<'_>,
    ) -> Result<Self, CpuError> {
        host_opt("cu_seqlens", cu_seqlens)?;
        Ok(Io {
            q: host_ref("q", q)?,
            k: host_ref("k", k)?,
            v: host_ref("v", v)?,
            cu: *cu_seqlens,
            state: initial_state.map(|s| host_shared("initial_state", s)).transpose()?,
            final_state: final_state.map(|s| host_shared("final_state", s)).transpose()?,
            o: host_shared("o", o)?,
        })
    }
}

/// One token's inputs to a block of value rows: normalised `q` and `k` (zero-padded to whole
/// lanes), the decay `e^g`, and `v` and `β` of the block's rows.
#[derive(Clone, Copy)]
struct Token<'a> {
    q: &'a [f32],
    k: &'a [f32],
    decay: f32,
    v: &'a [f32],
    beta: &'a [f32],
}

/// L2-normalises (`x·rsqrt(Σx² + eps)`) the first `n` elements when `l2`, then scales them;
/// zeroes `x[n..round8(n)]`.
#[inline(always)]
fn normalize<S: Simd>(x: &mut [f32], n: usize, l2: bool, eps: f32, scale: f32) {
    let np = round8(n);
    let x = &mut x[..np];
    x[n..].iter_mut().for_each(|e| *e = 0.0);
    let mut f = scale;
    if l2 {
        let ss = dot::<S>(x, x);
        f *= 1.0 / (ss + eps).sqrt();
    }
    if f != 1.0 {
        scal::<S>(x, f);
    }
}
