//! Shared test support of the property and error tests: owned host buffers, owned calls and a
//! deterministic input generator. (The conformance vectors run through `ssm-conformance`.)

#![allow(dead_code, unreachable_pub)]

use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, StateLayout,
};
use ssm_tensor::{DType, HostTensor};

/// A zero tensor of `shape`.
pub fn zeros(dtype: DType, shape: &[usize]) -> HostTensor {
    HostTensor::filled(dtype, shape.to_vec(), 0.0)
}

/// A float tensor filled with NaN (outputs are poisoned before every run).
pub fn nan(dtype: DType, shape: &[usize]) -> HostTensor {
    HostTensor::filled(dtype, shape.to_vec(), f32::NAN)
}

/// An index (or Bool) tensor of `shape` from `values`.
pub fn ints(dtype: DType, shape: &[usize], values: &[i64]) -> HostTensor {
    HostTensor::from_i64(dtype, shape.to_vec(), values)
}

/// Owned buffers of one recurrent call (`fused_recurrent_gated_delta_rule`), for the property
/// and error tests.
#[derive(Clone)]
pub struct RecCase {
    pub q: HostTensor,
    pub k: HostTensor,
    pub v: HostTensor,
    pub g: HostTensor,
    pub beta: Option<HostTensor>,
    pub state: Option<HostTensor>,
    pub final_state: Option<HostTensor>,
    pub cu: Option<HostTensor>,
    pub ix: Option<HostTensor>,
    pub na: Option<HostTensor>,
    pub o: HostTensor,
    pub scale: Option<f32>,
    pub l2norm: bool,
    pub layout: StateLayout,
}

impl RecCase {
    pub fn args(&mut self) -> FusedRecurrentGatedDeltaRuleArgs<'_> {
        FusedRecurrentGatedDeltaRuleArgs {
            g: self.g.view(),
            beta: self.beta.as_ref().map(|b| b.view()),
            rule: DeltaRuleArgs {
                q: self.q.view(),
                k: self.k.view(),
                v: self.v.view(),
                scale: self.scale,
                initial_state: self.state.as_mut().map(|s| s.view_mut()),
                final_state: self.final_state.as_mut().map(|s| s.view_mut()),
                cu_seqlens: self.cu.as_ref().map(|b| b.view()),
                ssm_state_indices: self.ix.as_ref().map(|b| b.view()),
                num_accepted_tokens: self.na.as_ref().map(|b| b.view()),
                use_qk_l2norm_in_kernel: self.l2norm,
                eps: 1e-6,
                state_layout: self.layout,
                o: self.o.view_mut(),
            },
        }
    }

    /// Plans and runs the call on `be`.
    pub fn run<B: ssm_gdn::GdnBackend<E>, E: std::fmt::Debug>(&mut self, be: &B) -> Result<(), String> {
        let args = self.args();
        be.run(ssm_tensor::Planned::new(args).map_err(|e| e.to_string())?).map_err(|e| format!("{e:?}"))
    }
}

/// Owned gating inputs (vLLM's `A_log` `[HV]`, `a` and `b` `[tokens, HV]`, `dt_bias` `[HV]`),
/// as `fused_gdn_gating` and the sigmoid-gated delta rule take them (`beta` 1, threshold 20).
#[derive(Clone)]
pub struct GatingCase {
    pub a_log: HostTensor,
    pub a: HostTensor,
    pub b: HostTensor,
    pub dt_bias: HostTensor,
}

impl GatingCase {
    /// `fused_gdn_gating` of these inputs into `g` and `beta_output`.
    pub fn args<'a>(&'a self, g: &'a mut HostTensor, beta_output: &'a mut HostTensor) -> FusedGdnGatingArgs<'a> {
        FusedGdnGatingArgs {
            gates: GateInputs::new(self.a_log.view(), self.a.view(), self.b.view(), self.dt_bias.view()),
            g: g.view_mut(),
            beta_output: beta_output.view_mut(),
        }
    }

    /// `fused_sigmoid_gating_delta_rule_update` of these gates and `rec`'s tokens, pool, slot
    /// table and output (l2-normalised q and k; no final state, no accepted counts).
    pub fn sigmoid_args<'a>(
        &'a self,
        rec: FusedRecurrentGatedDeltaRuleArgs<'a>,
    ) -> FusedSigmoidGatingDeltaRuleUpdateArgs<'a> {
        FusedSigmoidGatingDeltaRuleUpdateArgs {
            gates: GateInputs::new(self.a_log.view(), self.a.view(), self.b.view(), self.dt_bias.view()),
            rule: DeltaRuleArgs {
                scale: None,
                final_state: None,
                num_accepted_tokens: None,
                use_qk_l2norm_in_kernel: true,
                eps: 1e-6,
                ..rec.rule
            },
        }
    }
}

/// Owned buffers of one chunked-prefill call.
#[derive(Clone)]
pub struct ChunkCase {
    pub q: HostTensor,
    pub k: HostTensor,
    pub v: HostTensor,
    pub g: HostTensor,
    pub beta: HostTensor,
    pub state: Option<HostTensor>,
    pub indices: Option<HostTensor>,
    pub has_initial_state: Option<HostTensor>,
    pub pad_slot_id: Option<i64>,
    pub inplace: bool,
    pub final_state: Option<HostTensor>,
    pub cu: Option<HostTensor>,
    pub o: HostTensor,
    pub scratch: Option<HostTensor>,
    pub layout: StateLayout,
}

impl ChunkCase {
    pub fn args(&mut self) -> ChunkGatedDeltaRuleArgs<'_> {
        ChunkGatedDeltaRuleArgs {
            q: self.q.view(),
            k: self.k.view(),
            v: self.v.view(),
            g: self.g.view(),
            beta: self.beta.view(),
            scale: None,
            initial_state: self.state.as_mut().map(|s| s.view_mut()),
            initial_state_indices: self.indices.as_ref().map(|b| b.view()),
            has_initial_state: self.has_initial_state.as_ref().map(|b| b.view()),
            pad_slot_id: self.pad_slot_id,
            inplace_final_state: self.inplace,
            final_state: self.final_state.as_mut().map(|s| s.view_mut()),
            cu_seqlens: self.cu.as_ref().map(|b| b.view()),
            use_qk_l2norm_in_kernel: true,
            eps: 1e-6,
            state_layout: self.layout,
            o: self.o.view_mut(),
            scratch: self.scratch.as_mut().map(|s| s.view_mut()),
        }
    }

    /// Plans and runs the call on `be`.
    pub fn run<B: ssm_gdn::GdnBackend<E>, E: std::fmt::Debug>(&mut self, be: &B) -> Result<(), String> {
        let args = self.args();
        be.run(ssm_tensor::Planned::new(args).map_err(|e| e.to_string())?).map_err(|e| format!("{e:?}"))
    }
}

/// A deterministic generator for test inputs.
pub struct Gen(rand_chacha::ChaCha8Rng);

impl Gen {
    pub fn new(seed: u64) -> Gen {
        use rand::SeedableRng;
        Gen(rand_chacha::ChaCha8Rng::seed_from_u64(seed))
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        use rand::Rng;
        self.0.random_range(lo..hi)
    }
    pub fn below(&mut self, n: usize) -> usize {
        use rand::Rng;
        self.0.random_range(0..n)
    }
    pub fn normal_buf(&mut self, dtype: DType, shape: &[usize], scale: f32) -> HostTensor {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| (self.uniform(-1.0, 1.0) + self.uniform(-1.0, 1.0)) * scale).collect();
        HostTensor::from_f32(dtype, shape.to_vec(), &vals)
    }
    pub fn range_buf(&mut self, dtype: DType, shape: &[usize], lo: f32, hi: f32) -> HostTensor {
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

/// Elementwise `|a − b| <= atol + rtol·|b|`, where both must be finite (or both NaN when
/// `nan_ok`); returns a description of the first mismatches.
pub fn close(what: &str, got: &HostTensor, want: &HostTensor, atol: f64, rtol: f64) -> Result<(), String> {
    assert_eq!(got.shape, want.shape, "{what}");
    let mut bad = Vec::new();
    for i in 0..want.view().numel() {
        let (g, w) = (got.view().elem_f64(i), want.view().elem_f64(i));
        let ok =
            if w.is_nan() || g.is_nan() { w.is_nan() && g.is_nan() } else { (g - w).abs() <= atol + rtol * w.abs() };
        if !ok {
            bad.push((i, g, w));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {} of {} off; first {:?}", bad.len(), want.view().numel(), &bad[..bad.len().min(6)]))
    }
}
