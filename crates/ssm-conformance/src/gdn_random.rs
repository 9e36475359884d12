//! Random recurrent GDN calls over the property matrix (odd sizes, K ≠ V, null slots, empty
//! sequences, accepted counts, both layouts, f32/bf16 state), and random chunked prefills
//! ([`ChunkCase`]: uneven varlen batches with empty and chunk-boundary lengths, pads, mixed
//! initial states), as owned host tensors: one generator for every backend's property tests
//! (the CUDA tests run it against the reference).

use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedRecurrentGatedDeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs,
    GateInputs, StateLayout,
};
use ssm_tensor::{DType, HostTensor, TensorRef};

/// A small deterministic generator (SplitMix64): no dependency, same stream everywhere.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// A tensor of `shape` with uniform values in `[lo, hi)`.
    pub fn tensor(&mut self, dtype: DType, shape: &[usize], lo: f32, hi: f32) -> HostTensor {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| self.uniform(lo, hi)).collect();
        HostTensor::from_f32(dtype, shape.to_vec(), &vals)
    }
    /// A random permutation of `0..n`.
    pub fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}

/// The shape of one random recurrent call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentSpec {
    /// Sequences `N`.
    pub seqs: usize,
    /// q/k heads `H`.
    pub heads: usize,
    /// Value heads `HV` (a multiple of `heads`).
    pub v_heads: usize,
    /// `head_k_dim`.
    pub k: usize,
    /// `head_v_dim`.
    pub v: usize,
    /// Packed varlen batch (`cu_seqlens`, with empty sequences) rather than dense `[N, T]`.
    pub varlen: bool,
    /// Tokens per sequence at most (varlen) or exactly (dense).
    pub max_len: usize,
    /// Slot table: 0 = none (row `bos`), 1 = `[N]`, 2 = `[N, columns]` with accepted counts.
    pub table: u8,
    /// Columns of a 2-D table.
    pub columns: usize,
    /// State layout.
    pub layout: StateLayout,
    /// State dtype; `None` = no `initial_state`.
    pub state: Option<DType>,
    /// Per-token `final_state` (not in place) of this dtype.
    pub final_state: Option<DType>,
    /// q/k/v/o dtype.
    pub io: DType,
    /// Index table dtype.
    pub index: DType,
    /// In-kernel l2norm.
    pub l2norm: bool,
    /// Head-wise `beta` `[B, T, HV, V]` (the given-gates op).
    pub headwise_beta: bool,
    /// Some accepted counts outside `1..=columns` (zero outputs, no state).
    pub bad_accepted: bool,
}

impl RecurrentSpec {
    /// Qwen3-Next decode: one token per sequence, 1-D table, `[V,K]`, K = V = 128.
    pub fn decode(seqs: usize, state: DType) -> Self {
        RecurrentSpec {
            seqs,
            heads: 2,
            v_heads: 4,
            k: 128,
            v: 128,
            varlen: true,
            max_len: 1,
            table: 1,
            columns: 1,
            layout: StateLayout::VK,
            state: Some(state),
            final_state: None,
            io: DType::BF16,
            index: DType::I32,
            l2norm: true,
            headwise_beta: false,
            bad_accepted: false,
        }
    }

    /// The `i`-th point of the property matrix (odd sizes, K ≠ V, both layouts, f32/bf16
    /// state, decode / varlen / speculative / dense / not-in-place / no-state).
    pub fn matrix(i: usize) -> Self {
        let dims = [(128, 128), (7, 5), (60, 100), (96, 40), (20, 136), (1, 3), (256, 64), (33, 17)];
        let (k, v) = dims[i % dims.len()];
        let heads = 1 + i % 2;
        let route = (i / 2) % 5;
        let mut s = RecurrentSpec {
            seqs: 1 + (i * 7) % 6,
            heads,
            v_heads: heads * (1 + (i / 3) % 3),
            k,
            v,
            varlen: true,
            max_len: 1,
            table: 1,
            columns: 1,
            layout: if i.is_multiple_of(2) { StateLayout::VK } else { StateLayout::KV },
            state: Some(if (i / 4).is_multiple_of(2) { DType::F32 } else { DType::BF16 }),
            final_state: None,
            io: if i.is_multiple_of(3) { DType::F32 } else { DType::BF16 },
            index: if i.is_multiple_of(5) { DType::I64 } else { DType::I32 },
            l2norm: i % 7 != 3,
            headwise_beta: i % 5 == 1,
            bad_accepted: false,
        };
        match route {
            0 => {}
            1 => {
                s.max_len = 3;
            }
            2 => {
                s.table = 2;
                s.columns = 4;
                s.max_len = 4;
                s.bad_accepted = i.is_multiple_of(3);
            }
            3 => {
                s.varlen = false;
                s.max_len = 3;
                s.table = 0;
            }
            _ => {
                s.max_len = 3;
                s.table = if i.is_multiple_of(3) { 0 } else { 2 };
                s.columns = 2;
                s.state = if i % 3 == 1 { None } else { s.state };
                if s.state.is_none() {
                    s.table = 0;
                }
                s.final_state = Some(if i.is_multiple_of(2) { DType::F32 } else { DType::BF16 });
            }
        }
        s
    }
}

/// Owned host tensors of one random recurrent call; both ops' arguments are drawn (precomputed
/// `g`/`beta` and raw `A_log`/`a`/`b`/`dt_bias`), so either op can run it.
#[derive(Debug, Clone)]
pub struct RecurrentCase {
    /// What was drawn.
    pub spec: RecurrentSpec,
    /// `[B, T, H, K]`.
    pub q: HostTensor,
    /// `[B, T, H, K]`.
    pub k: HostTensor,
    /// `[B, T, HV, V]`.
    pub v: HostTensor,
    /// `[B, T, HV]` f32.
    pub g: HostTensor,
    /// `[B, T, HV]` or `[B, T, HV, V]`.
    pub beta: HostTensor,
    /// `[HV]` f32.
    pub a_log: HostTensor,
    /// `[HV]` f32.
    pub dt_bias: HostTensor,
    /// `[B·T, HV]`.
    pub a: HostTensor,
    /// `[B·T, HV]`.
    pub b: HostTensor,
    /// The state pool (slot 0 is the null block).
    pub state: Option<HostTensor>,
    /// Per-token final states.
    pub final_state: Option<HostTensor>,
    /// `[N + 1]`.
    pub cu: Option<HostTensor>,
    /// `[N]` or `[N, columns]`.
    pub ix: Option<HostTensor>,
    /// `[N]`.
    pub na: Option<HostTensor>,
    /// Output, poisoned with NaN.
    pub o: HostTensor,
    /// Tokens per sequence.
    pub lens: Vec<usize>,
}

fn state_shape(layout: StateLayout, rows: usize, hv: usize, k: usize, v: usize) -> Vec<usize> {
    let (d1, d2) = layout.dims(k, v);
    vec![rows, hv, d1, d2]
}

impl RecurrentCase {
    /// Draws a call of shape `s` from `seed`.
    pub fn random(s: RecurrentSpec, seed: u64) -> Self {
        let mut r = SplitMix::new(seed);
        let n = s.seqs;
        let lens: Vec<usize> = if s.varlen {
            (0..n).map(|_| if s.max_len <= 1 { usize::from(r.below(6) != 0) } else { r.below(s.max_len + 1) }).collect()
        } else {
            vec![s.max_len; n]
        };
        let (bsz, t) = if s.varlen { (1, lens.iter().sum::<usize>()) } else { (n, s.max_len) };
        let (h, hv) = (s.heads, s.v_heads);
        let io = s.io;
        let q = r.tensor(io, &[bsz, t, h, s.k], -1.0, 1.0);
        let k = r.tensor(io, &[bsz, t, h, s.k], -1.0, 1.0);
        let v = r.tensor(io, &[bsz, t, hv, s.v], -1.0, 1.0);
        let g = r.tensor(DType::F32, &[bsz, t, hv], -1.5, -0.001);
        let beta = if s.headwise_beta {
            r.tensor(DType::F32, &[bsz, t, hv, s.v], 0.05, 0.95)
        } else {
            r.tensor(io, &[bsz, t, hv], 0.05, 0.95)
        };
        let a_log = r.tensor(DType::F32, &[hv], -1.0, 1.0);
        let dt_bias = r.tensor(DType::F32, &[hv], -1.0, 1.0);
        let a = r.tensor(io, &[bsz * t, hv], -3.0, 3.0);
        let b = r.tensor(io, &[bsz * t, hv], -3.0, 3.0);
        let cu = s.varlen.then(|| {
            let mut cu = vec![0i64];
            for l in &lens {
                cu.push(cu.last().unwrap() + *l as i64);
            }
            HostTensor::from_i64(s.index, vec![n + 1], &cu)
        });
        // Slot 0 is the null block; each sequence gets its own slots, one per column. Without
        // a table, sequence n reads row bos: the pool has a row per token.
        let cols = if s.table == 2 { s.columns } else { 1 };
        let slots = if s.table == 0 { bsz * t.max(1) + 1 } else { n * cols + 3 };
        let free = r.perm(slots - 1);
        let entries = if s.table == 0 { 0 } else { n * cols };
        let mut table: Vec<i64> = (0..entries).map(|i| (1 + free[i]) as i64).collect();
        for (i, e) in table.iter_mut().enumerate() {
            if r.below(6) == 0 {
                *e = if i % 2 == 0 { 0 } else { -1 };
            }
        }
        let ix = match s.table {
            1 => Some(HostTensor::from_i64(s.index, vec![n], &table)),
            2 => Some(HostTensor::from_i64(s.index, vec![n, cols], &table)),
            _ => None,
        };
        let na = (s.table == 2).then(|| {
            let acc: Vec<i64> = (0..n)
                .map(|_| {
                    if s.bad_accepted && r.below(3) == 0 {
                        [0, cols as i64 + 1][r.below(2)]
                    } else {
                        1 + r.below(cols) as i64
                    }
                })
                .collect();
            HostTensor::from_i64(s.index, vec![n], &acc)
        });
        let state = s.state.map(|d| r.tensor(d, &state_shape(s.layout, slots, hv, s.k, s.v), -0.5, 0.5));
        let final_state = s.final_state.map(|d| {
            let shape = state_shape(s.layout, bsz * t, hv, s.k, s.v);
            HostTensor::filled(d, shape, f32::NAN)
        });
        let o = HostTensor::filled(io, vec![bsz, t, hv, s.v], f32::NAN);
        RecurrentCase { spec: s, q, k, v, g, beta, a_log, dt_bias, a, b, state, final_state, cu, ix, na, o, lens }
    }

    /// The `fused_recurrent_gated_delta_rule` call over these tensors.
    pub fn recurrent_args(&mut self) -> FusedRecurrentGatedDeltaRuleArgs<'_> {
        let (_, g, beta, rule) = self.parts(None);
        FusedRecurrentGatedDeltaRuleArgs { g, beta: Some(beta), rule }
    }

    /// The `fused_sigmoid_gating_delta_rule_update` call over these tensors (its own `beta`
    /// scalars: softplus β 1, threshold 20).
    pub fn sigmoid_args(&mut self) -> FusedSigmoidGatingDeltaRuleUpdateArgs<'_> {
        let (gates, _, _, rule) = self.parts(Some(0.25));
        FusedSigmoidGatingDeltaRuleUpdateArgs { gates, rule }
    }

    /// Views of both ops' inputs, borrowed field by field: the raw gates, the precomputed `g`
    /// and `beta`, and the delta rule with `scale`.
    fn parts(&mut self, scale: Option<f32>) -> (GateInputs<'_>, TensorRef<'_>, TensorRef<'_>, DeltaRuleArgs<'_>) {
        let gates = GateInputs::new(self.a_log.view(), self.a.view(), self.b.view(), self.dt_bias.view());
        let rule = DeltaRuleArgs {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            scale,
            initial_state: self.state.as_mut().map(|s| s.view_mut()),
            final_state: self.final_state.as_mut().map(|s| s.view_mut()),
            cu_seqlens: self.cu.as_ref().map(|t| t.view()),
            ssm_state_indices: self.ix.as_ref().map(|t| t.view()),
            num_accepted_tokens: self.na.as_ref().map(|t| t.view()),
            use_qk_l2norm_in_kernel: self.spec.l2norm,
            eps: 1e-6,
            state_layout: self.spec.layout,
            o: self.o.view_mut(),
        };
        (gates, self.g.view(), self.beta.view(), rule)
    }

    /// Slots of the pool a sequence of this call may write (every positive table entry, or
    /// every row without a table); all other slots must stay bit-identical.
    pub fn writable_slots(&self) -> Vec<usize> {
        match &self.ix {
            Some(ix) => ix.to_f64_vec().iter().filter(|&&x| x > 0.0).map(|&x| x as usize).collect(),
            None => (0..self.state.as_ref().map_or(0, |s| s.shape[0])).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_matrix_point_plans_and_runs_on_the_reference() {
        use ssm_gdn::reference::Reference;
        use ssm_tensor::Run;
        for i in 0..40 {
            let spec = RecurrentSpec::matrix(i);
            let mut c = RecurrentCase::random(spec, i as u64);
            let call = ssm_gdn::plan(c.recurrent_args()).unwrap_or_else(|e| panic!("{i} {spec:?}: {e}"));
            Reference::F32.run(call).unwrap();
            let mut c = RecurrentCase::random(spec, i as u64);
            let call = ssm_gdn::plan(c.sigmoid_args()).unwrap_or_else(|e| panic!("{i} {spec:?}: {e}"));
            Reference::F32.run(call).unwrap();
        }
    }
}

/// The shape of one random `chunk_gated_delta_rule` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkSpec {
    /// Sequences `N`.
    pub seqs: usize,
    /// q/k heads `H`.
    pub heads: usize,
    /// Value heads `HV` (a multiple of `heads`).
    pub v_heads: usize,
    /// `head_k_dim`.
    pub k: usize,
    /// `head_v_dim`.
    pub v: usize,
    /// Longest sequence (lengths are drawn from the chunk-boundary set up to it).
    pub max_len: usize,
    /// q/k/v/o and beta dtype.
    pub io: DType,
    /// The pool's dtype (`None`: no initial state at all).
    pub state: Option<DType>,
    /// `initial_state_indices` (with a pad and `has_initial_state`) into a larger pool, written
    /// in place; else `initial_state` row `n` is sequence `n`'s, read only.
    pub pool: bool,
    /// A `final_state` output of this dtype.
    pub final_state: Option<DType>,
    /// Varlen (`cu_seqlens`, `B = 1`); else a dense batch of `max_len` tokens per sequence.
    pub varlen: bool,
    /// L2-normalise q and k in the kernel (vLLM's prefill always does); without it q and k are
    /// drawn at `1/√K` scale.
    pub l2norm: bool,
    /// State layout.
    pub layout: StateLayout,
}

impl ChunkSpec {
    /// Case `i` of the property matrix (cycled): Qwen3-Next's shape and dtypes, f16 and f32
    /// activations, K ≠ V, K not a multiple of 64 and V not of 32 (nor of 8), GVA, both layouts, bf16 and
    /// f32 pools, dense batches, no state, no l2norm, long multi-chunk sequences.
    pub fn matrix(i: usize) -> Self {
        use DType::{BF16, F16, F32};
        let base = ChunkSpec {
            seqs: 3,
            heads: 2,
            v_heads: 4,
            k: 128,
            v: 128,
            max_len: 130,
            io: BF16,
            state: Some(F32),
            pool: true,
            final_state: Some(F32),
            varlen: true,
            l2norm: true,
            layout: StateLayout::VK,
        };
        match i % 8 {
            0 => base,
            1 => ChunkSpec { io: F16, k: 64, v: 32, v_heads: 6, pool: false, layout: StateLayout::KV, ..base },
            2 => ChunkSpec { io: F32, k: 64, v: 40, heads: 1, v_heads: 3, ..base },
            3 => ChunkSpec { k: 100, v: 76, state: Some(BF16), final_state: None, seqs: 4, ..base },
            4 => ChunkSpec { k: 32, v: 16, state: None, pool: false, varlen: false, max_len: 70, seqs: 2, ..base },
            5 => ChunkSpec { l2norm: false, k: 64, v: 64, layout: StateLayout::KV, ..base },
            6 => ChunkSpec { io: F16, state: Some(BF16), max_len: 300, seqs: 2, heads: 1, v_heads: 2, ..base },
            _ => ChunkSpec { seqs: 9, heads: 4, v_heads: 8, max_len: 66, final_state: Some(BF16), ..base },
        }
    }
}

/// Owned tensors of one random `chunk_gated_delta_rule` call (outputs poisoned with NaN).
#[derive(Debug, Clone)]
pub struct ChunkCase {
    /// The shape it was drawn from.
    pub spec: ChunkSpec,
    /// `[B, T, H, K]`.
    pub q: HostTensor,
    /// `[B, T, H, K]`.
    pub k: HostTensor,
    /// `[B, T, HV, V]`.
    pub v: HostTensor,
    /// `[B, T, HV]` f32, log-space decay.
    pub g: HostTensor,
    /// `[B, T, HV]`.
    pub beta: HostTensor,
    /// The initial states: a pool (with `ix`) or one row per sequence.
    pub state: Option<HostTensor>,
    /// `[N]` pool rows; the pad value −1 marks a skipped sequence.
    pub ix: Option<HostTensor>,
    /// `[N]` bool.
    pub has: Option<HostTensor>,
    /// `[N, HV, …]`.
    pub final_state: Option<HostTensor>,
    /// `[N + 1]`.
    pub cu: Option<HostTensor>,
    /// `[B, T, HV, V]`.
    pub o: HostTensor,
    /// Tokens per sequence.
    pub lens: Vec<usize>,
}

/// The pad value of [`ChunkCase`]'s tables.
pub const CHUNK_PAD: i64 = -1;

impl ChunkCase {
    /// Draws a call of shape `s` from `seed`.
    pub fn random(s: ChunkSpec, seed: u64) -> Self {
        const LENS: [usize; 9] = [0, 1, 5, 63, 64, 65, 127, 130, 300];
        let mut r = SplitMix::new(seed);
        let n = s.seqs;
        let lens: Vec<usize> = if s.varlen {
            let pool: Vec<usize> = LENS.iter().copied().filter(|&l| l <= s.max_len).collect();
            let mut lens: Vec<usize> = (0..n).map(|_| pool[r.below(pool.len())]).collect();
            lens[r.below(n)] = s.max_len;
            lens
        } else {
            vec![s.max_len; n]
        };
        let (bsz, t) = if s.varlen { (1, lens.iter().sum::<usize>()) } else { (n, s.max_len) };
        let (h, hv) = (s.heads, s.v_heads);
        let qk = if s.l2norm { 1.0 } else { 1.0 / (s.k as f32).sqrt() };
        let q = r.tensor(s.io, &[bsz, t, h, s.k], -qk, qk);
        let k = r.tensor(s.io, &[bsz, t, h, s.k], -qk, qk);
        let v = r.tensor(s.io, &[bsz, t, hv, s.v], -1.0, 1.0);
        let g = r.tensor(DType::F32, &[bsz, t, hv], -0.7, -0.001);
        let beta = r.tensor(s.io, &[bsz, t, hv], 0.05, 0.95);
        let cu = s.varlen.then(|| {
            let mut cu = vec![0i64];
            for l in &lens {
                cu.push(cu.last().unwrap() + *l as i64);
            }
            HostTensor::from_i64(DType::I32, vec![n + 1], &cu)
        });
        let rows = if s.pool { n + 3 } else { n };
        let state = s.state.map(|d| r.tensor(d, &state_shape(s.layout, rows, hv, s.k, s.v), -0.5, 0.5));
        let (ix, has) = if s.pool && s.state.is_some() {
            let free = r.perm(rows);
            let mut table: Vec<i64> = (0..n).map(|i| free[i] as i64).collect();
            table[r.below(n)] = CHUNK_PAD;
            let has: Vec<i64> = (0..n).map(|_| i64::from(r.below(3) != 0)).collect();
            (
                Some(HostTensor::from_i64(DType::I64, vec![n], &table)),
                Some(HostTensor::from_i64(DType::Bool, vec![n], &has)),
            )
        } else {
            (None, None)
        };
        let final_state =
            s.final_state.map(|d| HostTensor::filled(d, state_shape(s.layout, n, hv, s.k, s.v), f32::NAN));
        let o = HostTensor::filled(s.io, vec![bsz, t, hv, s.v], f32::NAN);
        ChunkCase { spec: s, q, k, v, g, beta, state, ix, has, final_state, cu, o, lens }
    }

    /// The call over these tensors (vLLM's defaults otherwise: scale `K^-0.5`, eps 1e-6).
    pub fn args(&mut self) -> ChunkGatedDeltaRuleArgs<'_> {
        let pooled = self.ix.is_some();
        ChunkGatedDeltaRuleArgs {
            initial_state: self.state.as_mut().map(|s| s.view_mut()),
            initial_state_indices: self.ix.as_ref().map(|t| t.view()),
            has_initial_state: self.has.as_ref().map(|t| t.view()),
            pad_slot_id: pooled.then_some(CHUNK_PAD),
            inplace_final_state: pooled,
            final_state: self.final_state.as_mut().map(|s| s.view_mut()),
            cu_seqlens: self.cu.as_ref().map(|t| t.view()),
            use_qk_l2norm_in_kernel: self.spec.l2norm,
            state_layout: self.spec.layout,
            ..ChunkGatedDeltaRuleArgs::new(
                self.q.view(),
                self.k.view(),
                self.v.view(),
                self.g.view(),
                self.beta.view(),
                self.o.view_mut(),
            )
        }
    }

    /// Whether sequence `n` is a pad (skipped: no output, no state).
    pub fn is_pad(&self, n: usize) -> bool {
        self.ix.as_ref().is_some_and(|ix| ix.to_f64_vec()[n] as i64 == CHUNK_PAD)
    }

    /// Pool rows the call may write (the non-pad table entries; none without a table).
    pub fn writable_slots(&self) -> Vec<usize> {
        match &self.ix {
            Some(ix) => ix.to_f64_vec().iter().filter(|&&x| x >= 0.0).map(|&x| x as usize).collect(),
            None => Vec::new(),
        }
    }
}

/// Compares a backend's run of a [`ChunkCase`] (`got`) with the reference's run of the same
/// case (`want`): `o`, `final_state` and the pool within `atol + rtol·|want|` (`rtol` at least
/// two units in the last place of a 16-bit tensor's storage type), NaN exactly where
/// the reference left NaN (rows of pads stay unwritten), and every pool row the call may not
/// write bit-identical.
pub fn check_chunk(got: &ChunkCase, want: &ChunkCase, atol: f64, rtol: f64) -> Result<(), String> {
    let close = |what: &str, g: &HostTensor, w: &HostTensor| -> Result<(), String> {
        let rtol = match w.dtype {
            DType::BF16 => rtol.max(2.0 / 256.0),
            DType::F16 => rtol.max(2.0 / 2048.0),
            _ => rtol,
        };
        for (i, (g, w)) in g.to_f64_vec().into_iter().zip(w.to_f64_vec()).enumerate() {
            let ok = if g.is_nan() || w.is_nan() {
                g.is_nan() && w.is_nan()
            } else {
                (g - w).abs() <= atol + rtol * w.abs()
            };
            if !ok {
                return Err(format!("{what}[{i}]: got {g}, want {w} (atol {atol}, rtol {rtol})"));
            }
        }
        Ok(())
    };
    close("o", &got.o, &want.o)?;
    if let (Some(g), Some(w)) = (&got.final_state, &want.final_state) {
        close("final_state", g, w)?;
    }
    if let (Some(g), Some(w)) = (&got.state, &want.state) {
        close("initial_state (pool)", g, w)?;
        let writable = want.writable_slots();
        let per = w.bytes().len() / w.shape[0];
        for slot in (0..w.shape[0]).filter(|s| !writable.contains(s)) {
            if g.bytes()[slot * per..(slot + 1) * per] != w.bytes()[slot * per..(slot + 1) * per] {
                return Err(format!("pool slot {slot} is not the call's, yet it changed"));
            }
        }
    }
    Ok(())
}
