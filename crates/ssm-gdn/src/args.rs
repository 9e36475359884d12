use ssm_tensor::{TensorMut, TensorRef};

/// How one value head's `V × K` state matrix `S` (with `o = S q`) is stored in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateLayout {
    /// `[slots, HV, V, K]`, K contiguous: vLLM's GPU layout since PR#33291.
    VK,
    /// `[slots, HV, K, V]`, V contiguous: FLA's default and vLLM's CPU kernels.
    KV,
}

impl StateLayout {
    /// The per-head matrix dimensions `(rows, cols)` as stored, given `head_k_dim` and `head_v_dim`.
    pub fn dims(self, k: usize, v: usize) -> (usize, usize) {
        match self {
            StateLayout::VK => (v, k),
            StateLayout::KV => (k, v),
        }
    }

    /// The inverse of [`dims`](Self::dims): `(head_k_dim, head_v_dim)` of a head matrix stored as
    /// `rows × cols`.
    pub fn head_dims(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            StateLayout::VK => (cols, rows),
            StateLayout::KV => (rows, cols),
        }
    }

    /// The shape's name, e.g. `[slots, HV, V, K]`.
    pub fn name(self) -> &'static str {
        match self {
            StateLayout::VK => "[slots, HV, V, K]",
            StateLayout::KV => "[slots, HV, K, V]",
        }
    }
}

impl std::fmt::Display for StateLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0)` (vLLM `gdn_linear_attn.py`).
///
/// For every token `t` and value head `h`:
/// `x = a[t,h] + dt_bias[h]` (in f32), `sp = x·β_sp <= threshold ? ln(1 + e^{β_sp·x})/β_sp : x`,
/// `g[t,h] = −exp(A_log[h])·sp`, `beta_output[t,h] = sigmoid(b[t,h])`.
///
/// Writes every element of `g` and `beta_output`, nothing else.
pub struct FusedGdnGatingArgs<'a> {
    /// `A_log`, `a`, `b`, `dt_bias` (`a` and `b` `[T, HV]`) and the softplus scalars.
    pub gates: GateInputs<'a>,
    /// Output `[1, T, HV]` or `[T, HV]`, f32.
    pub g: TensorMut<'a>,
    /// Output `[1, T, HV]` or `[T, HV]`, any float dtype (vLLM uses `b`'s dtype).
    pub beta_output: TensorMut<'a>,
}

/// vLLM's gating inputs, shared by [`FusedGdnGatingArgs`] (which writes the gates out) and
/// [`FusedSigmoidGatingDeltaRuleUpdateArgs`] (which computes them per token inside the
/// delta rule): `g = −exp(A_log)·softplus(a + dt_bias)`, `β = sigmoid(b)`.
pub struct GateInputs<'a> {
    /// `[HV]`, any float dtype (vLLM: f32).
    pub a_log: TensorRef<'a>,
    /// Per token and value head (`[T, HV]`, or `[B·T, HV]` / `[B, T, HV]` in the fused op),
    /// any float dtype.
    pub a: TensorRef<'a>,
    /// As `a`: the delta-rule β logits.
    pub b: TensorRef<'a>,
    /// `[HV]`, any float dtype.
    pub dt_bias: TensorRef<'a>,
    /// Softplus β (vLLM's `beta` argument, default 1.0); not the delta-rule β.
    pub beta: f32,
    /// Softplus threshold (default 20.0).
    pub threshold: f32,
}

impl<'a> GateInputs<'a> {
    /// The four tensors with vLLM's default softplus β 1.0 and threshold 20.0.
    pub fn new(a_log: TensorRef<'a>, a: TensorRef<'a>, b: TensorRef<'a>, dt_bias: TensorRef<'a>) -> Self {
        GateInputs { a_log, a, b, dt_bias, beta: 1.0, threshold: 20.0 }
    }
}

/// `fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, inplace_final_state,
/// cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel)`.
///
/// Per sequence `n` (tokens `cu_seqlens[n]..cu_seqlens[n+1]`, or row `n` of a dense batch) and
/// value head `hv` (q/k head `hv / (HV/H)`), per token: optional l2norm of q and k
/// (`x·rsqrt(Σx² + eps)`), `q *= scale`, `S *= exp(g)`, `u = β(v − S k)`, `S += u kᵀ`, `o = S q`.
///
/// Initial state (semantics/gdn_conv.md §2.1):
/// - no `initial_state`: zeros;
/// - no `ssm_state_indices`: row `bos` (the sequence's first token offset, as vLLM does);
/// - 1-D indices: slot `ssm_state_indices[n]`; 2-D: column `num_accepted_tokens[n] − 1`
///   (column 0 without `num_accepted_tokens`).
///
/// States written:
/// - `final_state` given (vLLM's `inplace_final_state=False`): the state after every token
///   `τ` to `final_state[τ]` (global token index), `initial_state` untouched;
/// - otherwise, with 2-D indices, the state after token `t` to slot `ssm_state_indices[n, t]`;
///   with 1-D indices, the state after the last token to `ssm_state_indices[n]` (vLLM only calls
///   this with one token per sequence, where both agree); without indices, to row `bos`.
///
/// Null slots: a read index `<= 0` skips the sequence (no `o` rows, no state writes); a write
/// index `<= 0` skips that store. An invalid `num_accepted_tokens[n]` (outside `1..=columns`)
/// writes zeros to the sequence's `o` rows and leaves every state unchanged.
pub struct FusedRecurrentGatedDeltaRuleArgs<'a> {
    /// `[B, T, HV]` log-space decay, any float dtype.
    pub g: TensorRef<'a>,
    /// `[B, T, HV]` or head-wise `[B, T, HV, V]`; `None` means all ones.
    pub beta: Option<TensorRef<'a>>,
    /// Tokens, states, tables, options and output.
    pub rule: DeltaRuleArgs<'a>,
}

/// `fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, beta=1.0,
/// threshold=20.0, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
/// num_accepted_tokens, use_qk_l2norm_in_kernel)`.
///
/// Exactly [`FusedRecurrentGatedDeltaRuleArgs`] with `g = −exp(A_log)·softplus(a + dt_bias)` and
/// the delta-rule `β = sigmoid(b)` computed per token in f32 inside the kernel.
pub struct FusedSigmoidGatingDeltaRuleUpdateArgs<'a> {
    /// `A_log`, `a`, `b`, `dt_bias` (`a` and `b` `[B·T, HV]` or `[B, T, HV]`) and the softplus
    /// scalars.
    pub gates: GateInputs<'a>,
    /// Tokens, states, tables, options and output, as in [`FusedRecurrentGatedDeltaRuleArgs`].
    pub rule: DeltaRuleArgs<'a>,
}

/// What both recurrent ops ([`FusedRecurrentGatedDeltaRuleArgs`],
/// [`FusedSigmoidGatingDeltaRuleUpdateArgs`]) take besides their gates: vLLM's arguments from
/// `q` on, in one place so that the two ops cannot drift apart.
pub struct DeltaRuleArgs<'a> {
    /// `[B, T, H, K]`, any float dtype.
    pub q: TensorRef<'a>,
    /// `[B, T, H, K]`, any float dtype.
    pub k: TensorRef<'a>,
    /// `[B, T, HV, V]`, any float dtype.
    pub v: TensorRef<'a>,
    /// Scale applied to q; `None` means `K^-0.5`.
    pub scale: Option<f32>,
    /// The state pool `[slots, HV, V, K]` or `[slots, HV, K, V]` (see `state_layout`), f32/bf16/f16.
    pub initial_state: Option<TensorMut<'a>>,
    /// Per-token states `[B·T, HV, …]` (vLLM's `inplace_final_state=False`); `None` = in place.
    pub final_state: Option<TensorMut<'a>>,
    /// `[N + 1]` token offsets (requires `B == 1`).
    pub cu_seqlens: Option<TensorRef<'a>>,
    /// `[N]` or `[N, columns]` slot indices into `initial_state` (I32/I64).
    pub ssm_state_indices: Option<TensorRef<'a>>,
    /// `[N]` accepted-token counts of the previous step (needs 2-D indices).
    pub num_accepted_tokens: Option<TensorRef<'a>>,
    /// L2-normalise q and k in the kernel.
    pub use_qk_l2norm_in_kernel: bool,
    /// The l2norm eps, added to the sum of squares (vLLM: 1e-6).
    pub eps: f32,
    /// How `initial_state` / `final_state` store each head's matrix.
    pub state_layout: StateLayout,
    /// Output `[B, T, HV, V]`, any float dtype (vLLM: q's dtype).
    pub o: TensorMut<'a>,
}

impl<'a> DeltaRuleArgs<'a> {
    /// `q`, `k`, `v` and the output with vLLM's defaults for the rest: scale `K^-0.5`, no
    /// state (zeros, nothing written), no tables, no l2norm, eps 1e-6, the `[V, K]` layout. Set
    /// the others with struct update syntax (`DeltaRuleArgs { cu_seqlens: .., ..DeltaRuleArgs::new(..) }`).
    pub fn new(q: TensorRef<'a>, k: TensorRef<'a>, v: TensorRef<'a>, o: TensorMut<'a>) -> Self {
        DeltaRuleArgs {
            q,
            k,
            v,
            scale: None,
            initial_state: None,
            final_state: None,
            cu_seqlens: None,
            ssm_state_indices: None,
            num_accepted_tokens: None,
            use_qk_l2norm_in_kernel: false,
            eps: 1e-6,
            state_layout: StateLayout::VK,
            o,
        }
    }
}

/// `chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
/// cu_seqlens, use_qk_l2norm_in_kernel)`, extended with a state pool.
///
/// Computes the same function as the recurrence of [`FusedRecurrentGatedDeltaRuleArgs`]
/// (semantics/gdn_conv.md §2.5), sequence by sequence, in chunks of 64 tokens that never cross
/// a sequence boundary.
///
/// Initial state of sequence `n`: zeros without `initial_state` or when
/// `has_initial_state[n]` is false; else row `initial_state_indices[n]` of `initial_state`
/// (row `n` without indices). An index equal to `pad_slot_id` skips the sequence entirely
/// (no `o` rows, no `final_state` row, no pool write).
///
/// Final state of sequence `n`: to `final_state[n]` when given (f32 or any float), and, when
/// `inplace_final_state`, back into the row it was read from (`initial_state_indices[n]`, or `n`).
pub struct ChunkGatedDeltaRuleArgs<'a> {
    /// `[B, T, H, K]`.
    pub q: TensorRef<'a>,
    /// `[B, T, H, K]`.
    pub k: TensorRef<'a>,
    /// `[B, T, HV, V]`.
    pub v: TensorRef<'a>,
    /// `[B, T, HV]`, log-space decay.
    pub g: TensorRef<'a>,
    /// `[B, T, HV]`.
    pub beta: TensorRef<'a>,
    /// Scale; `None` means `K^-0.5`.
    pub scale: Option<f32>,
    /// Dense `[N, HV, …]` initial states or a pool `[slots, HV, …]` (with indices).
    pub initial_state: Option<TensorMut<'a>>,
    /// `[N]` rows of `initial_state` (I32/I64).
    pub initial_state_indices: Option<TensorRef<'a>>,
    /// `[N]` bool: false = start from zeros whatever the slot holds.
    pub has_initial_state: Option<TensorRef<'a>>,
    /// The index value that marks a padded sequence (no default; `None` = no pads).
    pub pad_slot_id: Option<i64>,
    /// Write each final state back into its `initial_state` row.
    pub inplace_final_state: bool,
    /// Output `[N, HV, …]` final states (vLLM's `output_final_state=True`).
    pub final_state: Option<TensorMut<'a>>,
    /// `[N + 1]` token offsets (requires `B == 1`).
    pub cu_seqlens: Option<TensorRef<'a>>,
    /// L2-normalise q and k in the kernel.
    pub use_qk_l2norm_in_kernel: bool,
    /// The l2norm eps (vLLM: 1e-6).
    pub eps: f32,
    /// How the states store each head's matrix.
    pub state_layout: StateLayout,
    /// Output `[B, T, HV, V]`.
    pub o: TensorMut<'a>,
    /// Optional f32 scratch (`[n]`, contiguous, host) of at least
    /// [`ChunkScratch::chunk_gated_delta_rule_scratch_size`](crate::ChunkScratch::chunk_gated_delta_rule_scratch_size) elements.
    pub scratch: Option<TensorMut<'a>>,
}

impl<'a> ChunkGatedDeltaRuleArgs<'a> {
    /// The tokens, gates and output with vLLM's defaults for the rest: scale `K^-0.5`, zero
    /// initial states, no pool, no pads, no final states, no l2norm, eps 1e-6, the `[V, K]`
    /// layout, a dense batch, no caller scratch. Set the others with struct update syntax.
    pub fn new(
        q: TensorRef<'a>,
        k: TensorRef<'a>,
        v: TensorRef<'a>,
        g: TensorRef<'a>,
        beta: TensorRef<'a>,
        o: TensorMut<'a>,
    ) -> Self {
        ChunkGatedDeltaRuleArgs {
            q,
            k,
            v,
            g,
            beta,
            scale: None,
            initial_state: None,
            initial_state_indices: None,
            has_initial_state: None,
            pad_slot_id: None,
            inplace_final_state: false,
            final_state: None,
            cu_seqlens: None,
            use_qk_l2norm_in_kernel: false,
            eps: 1e-6,
            state_layout: StateLayout::VK,
            o,
            scratch: None,
        }
    }
}
