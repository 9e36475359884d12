//! `gdn_decode_step`: one decode step of a Qwen3-Next GDN layer as one call, the conv update of
//! the projected `[q | k | v]` rows followed by the gated delta rule on the conv's output
//! (semantics/gdn_conv.md §2.6 steps 3 and 5, decode-only batch).
//!
//! The step is defined as those two calls, run in that order: `causal_conv1d_update` writes its
//! output rows and conv slots, then `fused_sigmoid_gating_delta_rule_update` reads q, k and v
//! from that output and updates the SSM slots. A backend may run it as one kernel (the CUDA
//! backend does, for the Qwen3-Next decode shapes) only if it writes exactly what the two calls
//! write.
//!
//! Both parts are planned when the arguments are built ([`GdnDecodeStepArgs::new`]), so a step
//! that either part refuses is refused before anything is written.

use ssm_conv::CausalConv1dUpdateArgs;
use ssm_tensor::{Device, Planned, TensorMut, TensorRef};

use crate::{DeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, GdnError, StateLayout};

/// `gdn_decode_step`: `causal_conv1d_update`, then `fused_sigmoid_gating_delta_rule_update` on
/// its output, one token per sequence.
///
/// The recurrence takes vLLM's layer settings: `q` and `k` L2-normalised in the kernel (eps
/// 1e-6), scale `K^-0.5`, the state updated in place through a 1-D slot table (or row `n`
/// without one). Its `q`, `k` and `v` are the conv output's columns `[0, H·K)`, `[H·K, 2·H·K)`
/// and `[2·H·K, 2·H·K + HV·V)`.
pub struct GdnDecodeStepArgs<'a> {
    conv: Planned<CausalConv1dUpdateArgs<'a>>,
    step: Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'a>>,
}

/// The planned conv update and the planned recurrence of a step on a device
/// ([`GdnDecodeStepArgs::device_parts`]).
pub type DeviceParts<'c, 'a> =
    (&'c Planned<CausalConv1dUpdateArgs<'a>>, &'c Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'a>>);

/// What [`GdnDecodeStepArgs::new`] resolved (both parts' plans are in the parts).
#[derive(Debug, Clone, Copy)]
pub struct DecodeStepPlan {
    /// Sequences (one token each).
    pub batch: usize,
    /// q/k heads `H`.
    pub heads: usize,
    /// Where every tensor lives.
    pub device: Device,
}

fn step_err(arg: &'static str, problem: String) -> GdnError {
    GdnError::DecodeStep { arg, problem }
}

impl<'a> GdnDecodeStepArgs<'a> {
    /// Plans both parts of one decode step.
    ///
    /// - `conv`: the conv update of `B` sequences, one token each (`x` `[B, 2·H·K + HV·V]`, no
    ///   `query_start_loc`); its `out` (`[B, 2·H·K + HV·V]`) receives the conv output, which the
    ///   recurrence reads.
    /// - `num_k_heads`: `H`; `K`, `HV` and `V` come from `ssm_state` in `state_layout`.
    /// - `gates`: `A_log`, `a`, `b` (`[B, HV]`), `dt_bias` and the softplus scalars.
    /// - `ssm_state`, `ssm_state_indices` (`[B]`, optional): the pool and its 1-D table (vLLM's
    ///   null-block rule: an index `<= 0` skips the sequence's recurrence).
    /// - `o`: `[B, 1, HV, V]`.
    ///
    /// Errors: [`GdnError::DecodeStep`] for shapes that do not describe one decode step,
    /// [`GdnError::Conv`] for what the conv update refuses, and the recurrence's own errors.
    /// Nothing is written by a refused step.
    pub fn new(
        conv: CausalConv1dUpdateArgs<'a>,
        num_k_heads: usize,
        gates: GateInputs<'a>,
        ssm_state: TensorMut<'a>,
        ssm_state_indices: Option<TensorRef<'a>>,
        state_layout: StateLayout,
        o: TensorMut<'a>,
    ) -> Result<Self, GdnError> {
        let st = ssm_state.shape();
        let [_, hv, a, b] = st[..] else {
            return Err(step_err("ssm_state", format!("must have shape [slots, HV, ·, ·], got {st:?}")));
        };
        let (kd, vd) = state_layout.head_dims(a, b);
        let h = num_k_heads;
        let dim = h
            .checked_mul(kd)
            .and_then(|hk| hk.checked_mul(2))
            .and_then(|qk| hv.checked_mul(vd).and_then(|v| qk.checked_add(v)))
            .ok_or_else(|| {
                step_err("num_k_heads", format!("2·H·K + HV·V overflows (H={h}, K={kd}, HV={hv}, V={vd})"))
            })?;
        if h == 0 {
            return Err(step_err("num_k_heads", "must be at least 1".into()));
        }
        if conv.query_start_loc.is_some() || conv.num_accepted_tokens.is_some() {
            return Err(step_err(
                "conv",
                "must be a one-token update (no `query_start_loc`, no `num_accepted_tokens`)".into(),
            ));
        }
        let out = &conv.out;
        if out.rank() != 2 || out.shape()[1] != dim || conv.x.rank() != 2 || conv.x.shape() != out.shape() {
            return Err(step_err(
                "conv.out",
                format!(
                    "`x` and `out` must both have shape [B, 2·H·K + HV·V = {dim}], got {:?} and {:?}",
                    conv.x.shape(),
                    out.shape()
                ),
            ));
        }
        let batch = out.shape()[0];
        let (s0, s1, off) = (out.strides()[0], out.strides()[1], out.layout().offset());
        let mut conv = conv;
        // SAFETY: the write alias goes to the conv call, the read aliases (q, k, v) to the
        // recurrence. Both are planned calls; they run only through `into_parts`, whose
        // contract makes the conv run (and finish) before the recurrence. The parts are
        // otherwise handed out only for device tensors (`device_parts`), whose views give no
        // host slices.
        let [out_w, out_r] = unsafe { conv.out.aliased() };
        conv.out = out_w;
        // The conv first, as it runs first.
        let conv = Planned::new(conv)?;
        let out_r = out_r.into_ref();
        let view = |shape: [usize; 4], strides: [isize; 4], at: usize| {
            out_r
                .with_layout(&shape, &strides, off + at * s1.unsigned_abs())
                .map_err(|e| step_err("conv.out", format!("cannot be viewed as q/k/v: {e}")))
        };
        if s1 < 0 {
            return Err(step_err("conv.out", "must not have a negative channel stride".into()));
        }
        let hk = h * kd;
        let q = view([batch, 1, h, kd], [s0, s0, kd as isize * s1, s1], 0)?;
        let k = view([batch, 1, h, kd], [s0, s0, kd as isize * s1, s1], hk)?;
        let v = view([batch, 1, hv, vd], [s0, s0, vd as isize * s1, s1], 2 * hk)?;
        let rule = DeltaRuleArgs {
            initial_state: Some(ssm_state),
            ssm_state_indices,
            use_qk_l2norm_in_kernel: true,
            eps: 1e-6,
            state_layout,
            ..DeltaRuleArgs::new(q, k, v, o)
        };
        let step = Planned::new(FusedSigmoidGatingDeltaRuleUpdateArgs { gates, rule })?;
        if conv.device() != step.device() {
            return Err(step_err("ssm_state", format!("lives on {}, the conv on {}", step.device(), conv.device())));
        }
        Ok(GdnDecodeStepArgs { conv, step })
    }

    /// The two planned parts, for a device backend that reads their plans and device addresses
    /// (to fuse or chain them); `None` when the tensors live on the host. Host views would give
    /// slices of the conv output (the recurrence's q/k/v) that outlive the borrow, while the
    /// step writes it.
    pub fn device_parts(&self) -> Option<DeviceParts<'_, 'a>> {
        (self.conv.device() != Device::Cpu).then_some((&self.conv, &self.step))
    }

    /// The two planned calls, for a backend that runs them one after the other.
    ///
    /// # Safety
    /// The recurrence's `q`, `k` and `v` alias the conv's `out`. The caller runs the conv call to
    /// completion before the recurrence starts (or drops it), and keeps no host slice of `q`,
    /// `k` or `v` while the conv call runs.
    pub unsafe fn into_parts(
        self,
    ) -> (Planned<CausalConv1dUpdateArgs<'a>>, Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'a>>) {
        (self.conv, self.step)
    }
}

pub(crate) fn plan_gdn_decode_step(args: &GdnDecodeStepArgs<'_>) -> Result<DecodeStepPlan, GdnError> {
    let d = args.step.plan().dims;
    Ok(DecodeStepPlan { batch: d.seqs, heads: d.heads, device: args.step.device() })
}
