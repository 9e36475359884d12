//! Gated delta rule cases onto [`ssm_gdn`]'s arguments: `fused_gdn_gating`,
//! `fused_recurrent_gated_delta_rule`, `fused_sigmoid_gating_delta_rule_update` and
//! `chunk_gated_delta_rule`. The vectors hold vLLM's GPU state layout `[slots, HV, V, K]`
//! ([`StateLayout::VK`]; the [`crate::Variant::GdnKv`] run hands them over transposed, as
//! [`StateLayout::KV`], and transposes the results back); in-place states come back as `out.initial_state`, per-token or per-sequence
//! states as `out.final_state`, outputs as `out.o`. The recurrent ops' skipped (null-block) rows
//! are NaN in the files and are not compared.

use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, StateLayout,
};
use ssm_tensor::DType;

use crate::{Case, HostTensor, Produced, Target};

/// The layout states are handed over in, and the conversion from/to the stored `VK` layout
/// (a transpose is its own inverse).
fn layout(kv: bool) -> (StateLayout, fn(HostTensor) -> HostTensor) {
    if kv { (StateLayout::KV, |t| t.transpose_last2()) } else { (StateLayout::VK, |t| t) }
}

/// vLLM's l2norm eps (the GDN Triton kernels hard-code it).
const EPS: f32 = 1e-6;

fn missing(n: &str) -> (bool, String) {
    (false, format!("input `{n}` missing"))
}

fn f32_arg(case: &Case, name: &str, default: f32) -> f32 {
    case.arg(name).and_then(|v| v.as_f64()).map(|x| x as f32).unwrap_or(default)
}

fn bool_arg(case: &Case, name: &str, default: bool) -> bool {
    case.arg(name).and_then(|v| v.as_bool()).unwrap_or(default)
}

fn scale(case: &Case) -> Option<f32> {
    case.arg("scale").and_then(|v| v.as_f64()).map(|x| x as f32)
}

/// The gating inputs of a `fused_gdn_gating` or `fused_sigmoid_gating_delta_rule_update` case.
fn gate_inputs(case: &Case) -> Result<GateInputs<'_>, (bool, String)> {
    let req = |n: &'static str| case.input_view(n).ok_or_else(|| missing(n));
    Ok(GateInputs {
        a_log: req("A_log")?,
        a: req("a")?,
        b: req("b")?,
        dt_bias: req("dt_bias")?,
        beta: f32_arg(case, "beta", 1.0),
        threshold: f32_arg(case, "threshold", 20.0),
    })
}

/// Runs a `fused_gdn_gating` case: outputs `g` (f32) and `beta_output` (in `b`'s dtype), `[1, T, HV]`.
pub(crate) fn run_gating(target: &dyn Target, case: &Case) -> Produced {
    let a = case.input("a").ok_or_else(|| missing("a"))?;
    let b = case.input("b").ok_or_else(|| missing("b"))?;
    let &[t, hv] = a.shape.as_slice() else {
        return Err((false, format!("a has shape {:?}, expected [T, HV]", a.shape)));
    };
    let mut g = HostTensor::filled(DType::F32, vec![1, t, hv], f32::NAN);
    let mut beta = HostTensor::filled(b.dtype, vec![1, t, hv], f32::NAN);
    let args = FusedGdnGatingArgs { gates: gate_inputs(case)?, g: g.view_mut(), beta_output: beta.view_mut() };
    target.fused_gdn_gating(args).map_err(crate::TargetError::into_produced)?;
    Ok(vec![("g".into(), g), ("beta_output".into(), beta)])
}

/// The buffers of a recurrent case: output `o` (q's dtype, NaN-poisoned), the pool (cloned) and,
/// when not in place, the per-token `final_state`.
struct RecurrentBuffers {
    o: HostTensor,
    state: Option<HostTensor>,
    final_state: Option<HostTensor>,
}

impl RecurrentBuffers {
    fn new(case: &Case, kv: bool) -> Result<Self, (bool, String)> {
        let (_, conv) = layout(kv);
        let q = case.input("q").ok_or_else(|| missing("q"))?;
        let v = case.input("v").ok_or_else(|| missing("v"))?;
        let state = case.input("initial_state").cloned().map(conv);
        let final_state = if bool_arg(case, "inplace_final_state", true) {
            None
        } else {
            let s = state.as_ref().ok_or_else(|| missing("initial_state"))?;
            let mut shape = s.shape.clone();
            shape[0] = q.shape[0] * q.shape[1];
            Some(HostTensor::filled(s.dtype, shape, f32::NAN))
        };
        // (NaN-filled: its shape already follows the converted state's.)
        Ok(RecurrentBuffers { o: HostTensor::filled(q.dtype, v.shape.clone(), f32::NAN), state, final_state })
    }

    /// The delta-rule arguments both recurrent ops share: the case's tokens, tables and
    /// scalars over these buffers.
    fn rule<'a>(&'a mut self, case: &'a Case, kv: bool) -> Result<DeltaRuleArgs<'a>, (bool, String)> {
        let view = |n: &str| case.input_view(n);
        let req = |n: &'static str| view(n).ok_or_else(|| missing(n));
        Ok(DeltaRuleArgs {
            q: req("q")?,
            k: req("k")?,
            v: req("v")?,
            scale: scale(case),
            initial_state: self.state.as_mut().map(|s| s.view_mut()),
            final_state: self.final_state.as_mut().map(|s| s.view_mut()),
            cu_seqlens: view("cu_seqlens"),
            ssm_state_indices: view("ssm_state_indices"),
            num_accepted_tokens: view("num_accepted_tokens"),
            use_qk_l2norm_in_kernel: bool_arg(case, "use_qk_l2norm_in_kernel", false),
            eps: EPS,
            state_layout: layout(kv).0,
            o: self.o.view_mut(),
        })
    }

    fn produced(self, kv: bool) -> Vec<(String, HostTensor)> {
        let (_, conv) = layout(kv);
        let mut out = vec![("o".to_string(), self.o)];
        match (self.final_state, self.state) {
            (Some(f), _) => out.push(("final_state".into(), conv(f))),
            (None, Some(s)) => out.push(("initial_state".into(), conv(s))),
            (None, None) => {}
        }
        out
    }
}

/// Runs a `fused_recurrent_gated_delta_rule` case.
pub(crate) fn run_recurrent(target: &dyn Target, case: &Case, kv: bool) -> Produced {
    let mut bufs = RecurrentBuffers::new(case, kv)?;
    let view = |n: &str| case.input_view(n);
    let req = |n: &'static str| view(n).ok_or_else(|| missing(n));
    let args = FusedRecurrentGatedDeltaRuleArgs { g: req("g")?, beta: view("beta"), rule: bufs.rule(case, kv)? };
    target.fused_recurrent_gated_delta_rule(args).map_err(crate::TargetError::into_produced)?;
    Ok(bufs.produced(kv))
}

/// Runs a `fused_sigmoid_gating_delta_rule_update` case.
pub(crate) fn run_sigmoid(target: &dyn Target, case: &Case, kv: bool) -> Produced {
    if bool_arg(case, "is_kda", false) {
        return Err((true, "KDA (per-channel decay) is not a GDN op".into()));
    }
    let mut bufs = RecurrentBuffers::new(case, kv)?;
    let args = FusedSigmoidGatingDeltaRuleUpdateArgs { gates: gate_inputs(case)?, rule: bufs.rule(case, kv)? };
    target.fused_sigmoid_gating_delta_rule_update(args).map_err(crate::TargetError::into_produced)?;
    Ok(bufs.produced(kv))
}

/// Runs a `chunk_gated_delta_rule` case: vLLM's dense `initial_state` `[N, HV, V, K]` (read
/// only), `final_state` f32 `[N, HV, V, K]` when `output_final_state`.
pub(crate) fn run_chunk(target: &dyn Target, case: &Case, kv: bool) -> Produced {
    let (state_layout, conv) = layout(kv);
    let q = case.input("q").ok_or_else(|| missing("q"))?;
    let v = case.input("v").ok_or_else(|| missing("v"))?;
    let k = case.input("k").ok_or_else(|| missing("k"))?;
    let seqs = match case.input("cu_seqlens") {
        Some(cu) => cu.shape[0].saturating_sub(1),
        None => q.shape[0],
    };
    let (hv, kd, vd) = (v.shape[2], k.shape[3], v.shape[3]);
    let mut o = HostTensor::filled(q.dtype, v.shape.clone(), f32::NAN);
    let mut state = case.input("initial_state").cloned().map(conv);
    let mut final_state = bool_arg(case, "output_final_state", false)
        .then(|| conv(HostTensor::filled(DType::F32, vec![seqs, hv, vd, kd], f32::NAN)));
    let view = |n: &str| case.input_view(n);
    let req = |n: &'static str| view(n).ok_or_else(|| missing(n));
    let args = ChunkGatedDeltaRuleArgs {
        q: req("q")?,
        k: req("k")?,
        v: req("v")?,
        g: req("g")?,
        beta: req("beta")?,
        scale: scale(case),
        initial_state: state.as_mut().map(|s| s.view_mut()),
        initial_state_indices: None,
        has_initial_state: None,
        pad_slot_id: None,
        inplace_final_state: false,
        final_state: final_state.as_mut().map(|s| s.view_mut()),
        cu_seqlens: view("cu_seqlens"),
        use_qk_l2norm_in_kernel: bool_arg(case, "use_qk_l2norm_in_kernel", false),
        eps: EPS,
        state_layout,
        o: o.view_mut(),
        scratch: None,
    };
    target.chunk_gated_delta_rule(args).map_err(crate::TargetError::into_produced)?;
    let mut out = vec![("o".to_string(), o)];
    if let Some(f) = final_state {
        out.push(("final_state".into(), conv(f)));
    }
    Ok(out)
}
