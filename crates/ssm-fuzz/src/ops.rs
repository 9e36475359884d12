//! Each fuzzed op: its tensor fields by name, how an args struct is rebuilt over fresh views
//! (scalars copied from a template), its scalar fields, and how the runtime and the reference
//! run it.

use ssm_conformance::{Target, TargetError};
use ssm_tensor::{TensorMut, TensorRef};

use crate::scalar::Scalar;
use crate::spec::{TensorSpec, Views};

/// An op under fuzz. `At<'s>` is its args struct.
pub trait FuzzOp {
    /// The op's name (vLLM's).
    const NAME: &'static str;
    /// The op's args struct.
    type At<'s>;
    /// Every tensor field, in a fixed order.
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec>;
    /// A new args struct over `v`, with every non-tensor field copied from `template`.
    fn respin<'s, 'x: 's>(template: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s>;
    /// Every non-tensor field.
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)>;
    /// Runs the call on a target (a runtime, a staging runtime, a reference); a refusal or
    /// failure as its message.
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError>;
}

fn ro(name: &'static str, t: &TensorRef<'_>) -> TensorSpec {
    TensorSpec::of(name, false, false, Some(*t))
}
fn rw(name: &'static str, t: &TensorMut<'_>) -> TensorSpec {
    TensorSpec::of(name, true, false, Some(t.as_ref()))
}
fn opt(name: &'static str, t: &Option<TensorRef<'_>>) -> TensorSpec {
    TensorSpec::of(name, false, true, *t)
}
fn opt_rw(name: &'static str, t: &Option<TensorMut<'_>>) -> TensorSpec {
    TensorSpec::of(name, true, true, t.as_ref().map(TensorMut::as_ref))
}

/// `selective_state_update`.
pub struct Ssu;
impl FuzzOp for Ssu {
    const NAME: &'static str = "selective_state_update";
    type At<'s> = ssm_ssu::SelectiveStateUpdateArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        vec![
            rw("state", &a.state),
            ro("x", &a.x),
            ro("dt", &a.dt),
            ro("A", &a.a),
            ro("B", &a.b),
            ro("C", &a.c),
            opt("D", &a.d),
            opt("dt_bias", &a.dt_bias),
            opt("z", &a.z),
            opt("state_batch_indices", &a.state_batch_indices),
            opt("dst_state_batch_indices", &a.dst_state_batch_indices),
            rw("out", &a.out),
            opt("num_accepted_tokens", &a.num_accepted_tokens),
            opt("cu_seqlens", &a.cu_seqlens),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_ssu::SelectiveStateUpdateArgs {
            state: v.m("state"),
            x: v.r("x"),
            dt: v.r("dt"),
            a: v.r("A"),
            b: v.r("B"),
            c: v.r("C"),
            d: v.opt_r("D"),
            dt_bias: v.opt_r("dt_bias"),
            z: v.opt_r("z"),
            state_batch_indices: v.opt_r("state_batch_indices"),
            dst_state_batch_indices: v.opt_r("dst_state_batch_indices"),
            out: v.m("out"),
            num_accepted_tokens: v.opt_r("num_accepted_tokens"),
            cu_seqlens: v.opt_r("cu_seqlens"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("dt_softplus", &mut a.dt_softplus),
            ("pad_slot_id", &mut a.pad_slot_id),
            ("stochastic_rounding", &mut a.stochastic_rounding),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.selective_state_update(a)
    }
}

/// `causal_conv1d_update`.
pub struct ConvUpdate;
impl FuzzOp for ConvUpdate {
    const NAME: &'static str = "causal_conv1d_update";
    type At<'s> = ssm_conv::CausalConv1dUpdateArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        vec![
            ro("x", &a.x),
            rw("conv_state", &a.conv_state),
            ro("weight", &a.weight),
            opt("bias", &a.bias),
            opt("conv_state_indices", &a.conv_state_indices),
            opt("num_accepted_tokens", &a.num_accepted_tokens),
            opt("query_start_loc", &a.query_start_loc),
            opt("block_idx_last_scheduled_token", &a.block_idx_last_scheduled_token),
            opt("initial_state_idx", &a.initial_state_idx),
            rw("out", &a.out),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_conv::CausalConv1dUpdateArgs {
            x: v.r("x"),
            conv_state: v.m("conv_state"),
            weight: v.r("weight"),
            bias: v.opt_r("bias"),
            conv_state_indices: v.opt_r("conv_state_indices"),
            num_accepted_tokens: v.opt_r("num_accepted_tokens"),
            query_start_loc: v.opt_r("query_start_loc"),
            block_idx_last_scheduled_token: v.opt_r("block_idx_last_scheduled_token"),
            initial_state_idx: v.opt_r("initial_state_idx"),
            out: v.m("out"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("conv_state_layout", &mut a.conv_state_layout),
            ("activation", &mut a.activation),
            ("pad_slot_id", &mut a.pad_slot_id),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.causal_conv1d_update(a)
    }
}

/// `causal_conv1d_fn`.
pub struct ConvFn;
impl FuzzOp for ConvFn {
    const NAME: &'static str = "causal_conv1d_fn";
    type At<'s> = ssm_conv::CausalConv1dFnArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        vec![
            ro("x", &a.x),
            ro("weight", &a.weight),
            opt("bias", &a.bias),
            rw("conv_states", &a.conv_states),
            ro("query_start_loc", &a.query_start_loc),
            opt("cache_indices", &a.cache_indices),
            opt("has_initial_state", &a.has_initial_state),
            rw("out", &a.out),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_conv::CausalConv1dFnArgs {
            x: v.r("x"),
            weight: v.r("weight"),
            bias: v.opt_r("bias"),
            conv_states: v.m("conv_states"),
            query_start_loc: v.r("query_start_loc"),
            cache_indices: v.opt_r("cache_indices"),
            has_initial_state: v.opt_r("has_initial_state"),
            out: v.m("out"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("conv_state_layout", &mut a.conv_state_layout),
            ("activation", &mut a.activation),
            ("pad_slot_id", &mut a.pad_slot_id),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.causal_conv1d_fn(a)
    }
}

/// `mamba_chunk_scan_combined_varlen`.
pub struct Ssd;
impl FuzzOp for Ssd {
    const NAME: &'static str = "mamba_chunk_scan_combined_varlen";
    type At<'s> = ssm_ssd::MambaChunkScanCombinedVarlenArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        vec![
            ro("x", &a.x),
            ro("dt", &a.dt),
            ro("A", &a.a),
            ro("B", &a.b),
            ro("C", &a.c),
            ro("cu_seqlens", &a.cu_seqlens),
            ro("cu_chunk_seqlens", &a.cu_chunk_seqlens),
            ro("last_chunk_indices", &a.last_chunk_indices),
            ro("seq_idx", &a.seq_idx),
            opt_rw("out", &a.out),
            opt("D", &a.d),
            opt("z", &a.z),
            opt("dt_bias", &a.dt_bias),
            opt("initial_states", &a.initial_states),
            opt_rw("ssm_state", &a.ssm_state),
            opt("initial_state_indices", &a.initial_state_indices),
            opt("has_initial_state", &a.has_initial_state),
            opt("final_state_indices", &a.final_state_indices),
            opt_rw("varlen_states", &a.varlen_states),
            opt_rw("scratch", &a.scratch),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_ssd::MambaChunkScanCombinedVarlenArgs {
            x: v.r("x"),
            dt: v.r("dt"),
            a: v.r("A"),
            b: v.r("B"),
            c: v.r("C"),
            cu_seqlens: v.r("cu_seqlens"),
            cu_chunk_seqlens: v.r("cu_chunk_seqlens"),
            last_chunk_indices: v.r("last_chunk_indices"),
            seq_idx: v.r("seq_idx"),
            out: v.opt_m("out"),
            d: v.opt_r("D"),
            z: v.opt_r("z"),
            dt_bias: v.opt_r("dt_bias"),
            initial_states: v.opt_r("initial_states"),
            ssm_state: v.opt_m("ssm_state"),
            initial_state_indices: v.opt_r("initial_state_indices"),
            has_initial_state: v.opt_r("has_initial_state"),
            final_state_indices: v.opt_r("final_state_indices"),
            varlen_states: v.opt_m("varlen_states"),
            scratch: v.opt_m("scratch"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("chunk_size", &mut a.chunk_size),
            ("pad_slot_id", &mut a.pad_slot_id),
            ("dt_softplus", &mut a.dt_softplus),
            ("dt_limit", &mut a.dt_limit),
            ("return_intermediate_states", &mut a.return_intermediate_states),
            ("state_dtype", &mut a.state_dtype),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.mamba_chunk_scan_combined_varlen(a)
    }
}

fn trackers(a: &ssm_ring::RingTrackers<'_>) -> [TensorSpec; 3] {
    [
        rw("trackers.ring_start", &a.ring_start),
        rw("trackers.prev_num_accepted", &a.prev_num_accepted),
        rw("trackers.prev_query_len", &a.prev_query_len),
    ]
}

fn respin_trackers<'s>(v: &mut Views<'s>) -> ssm_ring::RingTrackers<'s> {
    ssm_ring::RingTrackers {
        ring_start: v.m("trackers.ring_start"),
        prev_num_accepted: v.m("trackers.prev_num_accepted"),
        prev_query_len: v.m("trackers.prev_query_len"),
    }
}

/// `update_replayssm_ring_trackers`.
pub struct RingUpdate;
impl FuzzOp for RingUpdate {
    const NAME: &'static str = "update_replayssm_ring_trackers";
    type At<'s> = ssm_ring::UpdateRingTrackersArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let mut s = trackers(&a.trackers).to_vec();
        s.push(ro("state_batch_indices", &a.state_batch_indices));
        s
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_ring::UpdateRingTrackersArgs {
            trackers: respin_trackers(v),
            state_batch_indices: v.r("state_batch_indices"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("logical_window", &mut a.logical_window),
            ("ring_buffer_len", &mut a.ring_buffer_len),
            ("pad_slot_id", &mut a.pad_slot_id),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.update_replayssm_ring_trackers(a)
    }
}

/// `commit_replayssm_ring_trackers`.
pub struct RingCommit;
impl FuzzOp for RingCommit {
    const NAME: &'static str = "commit_replayssm_ring_trackers";
    type At<'s> = ssm_ring::CommitRingTrackersArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let mut s = trackers(&a.trackers).to_vec();
        s.push(ro("state_batch_indices", &a.state_batch_indices));
        s.push(ro("num_accepted_tokens", &a.num_accepted_tokens));
        s.push(ro("query_start_loc", &a.query_start_loc));
        s
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_ring::CommitRingTrackersArgs {
            trackers: respin_trackers(v),
            state_batch_indices: v.r("state_batch_indices"),
            num_accepted_tokens: v.r("num_accepted_tokens"),
            query_start_loc: v.r("query_start_loc"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("logical_window", &mut a.logical_window),
            ("ring_buffer_len", &mut a.ring_buffer_len),
            ("pad_slot_id", &mut a.pad_slot_id),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.commit_replayssm_ring_trackers(a)
    }
}

fn gates(a: &ssm_gdn::GateInputs<'_>) -> [TensorSpec; 4] {
    [ro("gates.A_log", &a.a_log), ro("gates.a", &a.a), ro("gates.b", &a.b), ro("gates.dt_bias", &a.dt_bias)]
}

fn respin_gates<'s, 'x: 's>(t: &'s ssm_gdn::GateInputs<'x>, v: &mut Views<'s>) -> ssm_gdn::GateInputs<'s> {
    ssm_gdn::GateInputs {
        a_log: v.r("gates.A_log"),
        a: v.r("gates.a"),
        b: v.r("gates.b"),
        dt_bias: v.r("gates.dt_bias"),
        ..*t
    }
}

fn gate_scalars<'t>(a: &'t mut ssm_gdn::GateInputs<'_>) -> [(&'static str, &'t mut dyn Scalar); 2] {
    [("gates.beta", &mut a.beta), ("gates.threshold", &mut a.threshold)]
}

fn rule(a: &ssm_gdn::DeltaRuleArgs<'_>) -> [TensorSpec; 9] {
    [
        ro("rule.q", &a.q),
        ro("rule.k", &a.k),
        ro("rule.v", &a.v),
        opt_rw("rule.initial_state", &a.initial_state),
        opt_rw("rule.final_state", &a.final_state),
        opt("rule.cu_seqlens", &a.cu_seqlens),
        opt("rule.ssm_state_indices", &a.ssm_state_indices),
        opt("rule.num_accepted_tokens", &a.num_accepted_tokens),
        rw("rule.o", &a.o),
    ]
}

fn respin_rule<'s, 'x: 's>(t: &'s ssm_gdn::DeltaRuleArgs<'x>, v: &mut Views<'s>) -> ssm_gdn::DeltaRuleArgs<'s> {
    ssm_gdn::DeltaRuleArgs {
        q: v.r("rule.q"),
        k: v.r("rule.k"),
        v: v.r("rule.v"),
        initial_state: v.opt_m("rule.initial_state"),
        final_state: v.opt_m("rule.final_state"),
        cu_seqlens: v.opt_r("rule.cu_seqlens"),
        ssm_state_indices: v.opt_r("rule.ssm_state_indices"),
        num_accepted_tokens: v.opt_r("rule.num_accepted_tokens"),
        o: v.m("rule.o"),
        ..*t
    }
}

fn rule_scalars<'t>(a: &'t mut ssm_gdn::DeltaRuleArgs<'_>) -> [(&'static str, &'t mut dyn Scalar); 4] {
    [
        ("rule.scale", &mut a.scale),
        ("rule.use_qk_l2norm_in_kernel", &mut a.use_qk_l2norm_in_kernel),
        ("rule.eps", &mut a.eps),
        ("rule.state_layout", &mut a.state_layout),
    ]
}

/// `fused_gdn_gating`.
pub struct GdnGating;
impl FuzzOp for GdnGating {
    const NAME: &'static str = "fused_gdn_gating";
    type At<'s> = ssm_gdn::FusedGdnGatingArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let mut s = gates(&a.gates).to_vec();
        s.push(rw("g", &a.g));
        s.push(rw("beta_output", &a.beta_output));
        s
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_gdn::FusedGdnGatingArgs { gates: respin_gates(&t.gates, v), g: v.m("g"), beta_output: v.m("beta_output") }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        gate_scalars(&mut a.gates).into_iter().collect()
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.fused_gdn_gating(a)
    }
}

/// `fused_recurrent_gated_delta_rule`.
pub struct GdnRecurrent;
impl FuzzOp for GdnRecurrent {
    const NAME: &'static str = "fused_recurrent_gated_delta_rule";
    type At<'s> = ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let mut s = vec![ro("g", &a.g), opt("beta", &a.beta)];
        s.extend(rule(&a.rule));
        s
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_gdn::FusedRecurrentGatedDeltaRuleArgs { g: v.r("g"), beta: v.opt_r("beta"), rule: respin_rule(&t.rule, v) }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        rule_scalars(&mut a.rule).into_iter().collect()
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.fused_recurrent_gated_delta_rule(a)
    }
}

/// `fused_sigmoid_gating_delta_rule_update`.
pub struct GdnSigmoid;
impl FuzzOp for GdnSigmoid {
    const NAME: &'static str = "fused_sigmoid_gating_delta_rule_update";
    type At<'s> = ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let mut s = gates(&a.gates).to_vec();
        s.extend(rule(&a.rule));
        s
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs {
            gates: respin_gates(&t.gates, v),
            rule: respin_rule(&t.rule, v),
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        let mut s: Vec<_> = gate_scalars(&mut a.gates).into_iter().collect();
        s.extend(rule_scalars(&mut a.rule));
        s
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.fused_sigmoid_gating_delta_rule_update(a)
    }
}

/// `chunk_gated_delta_rule`.
pub struct GdnChunk;
impl FuzzOp for GdnChunk {
    const NAME: &'static str = "chunk_gated_delta_rule";
    type At<'s> = ssm_gdn::ChunkGatedDeltaRuleArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        vec![
            ro("q", &a.q),
            ro("k", &a.k),
            ro("v", &a.v),
            ro("g", &a.g),
            ro("beta", &a.beta),
            opt_rw("initial_state", &a.initial_state),
            opt("initial_state_indices", &a.initial_state_indices),
            opt("has_initial_state", &a.has_initial_state),
            opt_rw("final_state", &a.final_state),
            opt("cu_seqlens", &a.cu_seqlens),
            rw("o", &a.o),
            opt_rw("scratch", &a.scratch),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_gdn::ChunkGatedDeltaRuleArgs {
            q: v.r("q"),
            k: v.r("k"),
            v: v.r("v"),
            g: v.r("g"),
            beta: v.r("beta"),
            initial_state: v.opt_m("initial_state"),
            initial_state_indices: v.opt_r("initial_state_indices"),
            has_initial_state: v.opt_r("has_initial_state"),
            final_state: v.opt_m("final_state"),
            cu_seqlens: v.opt_r("cu_seqlens"),
            o: v.m("o"),
            scratch: v.opt_m("scratch"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("scale", &mut a.scale),
            ("pad_slot_id", &mut a.pad_slot_id),
            ("inplace_final_state", &mut a.inplace_final_state),
            ("use_qk_l2norm_in_kernel", &mut a.use_qk_l2norm_in_kernel),
            ("eps", &mut a.eps),
            ("state_layout", &mut a.state_layout),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.chunk_gated_delta_rule(a)
    }
}

/// The GDN layer core (`gdn_attention_core`).
pub struct GdnCore;
impl FuzzOp for GdnCore {
    const NAME: &'static str = "gdn_attention_core";
    type At<'s> = ssm_dispatch::GdnAttentionCoreArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let m = &a.metadata;
        vec![
            ro("mixed_qkv", &a.mixed_qkv),
            ro("b", &a.b),
            ro("a", &a.a),
            ro("conv_weight", &a.conv_weight),
            opt("conv_bias", &a.conv_bias),
            rw("conv_state", &a.conv_state),
            rw("ssm_state", &a.ssm_state),
            ro("A_log", &a.a_log),
            ro("dt_bias", &a.dt_bias),
            rw("core_attn_out", &a.core_attn_out),
            opt("metadata.has_initial_state", &m.has_initial_state),
            opt("metadata.spec_query_start_loc", &m.spec_query_start_loc),
            opt("metadata.non_spec_query_start_loc", &m.non_spec_query_start_loc),
            opt("metadata.spec_state_indices_tensor", &m.spec_state_indices_tensor),
            opt("metadata.non_spec_state_indices_tensor", &m.non_spec_state_indices_tensor),
            opt("metadata.spec_token_indx", &m.spec_token_indx),
            opt("metadata.non_spec_token_indx", &m.non_spec_token_indx),
            opt("metadata.num_accepted_tokens", &m.num_accepted_tokens),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_dispatch::GdnAttentionCoreArgs {
            mixed_qkv: v.r("mixed_qkv"),
            b: v.r("b"),
            a: v.r("a"),
            conv_weight: v.r("conv_weight"),
            conv_bias: v.opt_r("conv_bias"),
            conv_state: v.m("conv_state"),
            ssm_state: v.m("ssm_state"),
            a_log: v.r("A_log"),
            dt_bias: v.r("dt_bias"),
            core_attn_out: v.m("core_attn_out"),
            metadata: ssm_dispatch::GdnAttentionMetadata {
                has_initial_state: v.opt_r("metadata.has_initial_state"),
                spec_query_start_loc: v.opt_r("metadata.spec_query_start_loc"),
                non_spec_query_start_loc: v.opt_r("metadata.non_spec_query_start_loc"),
                spec_state_indices_tensor: v.opt_r("metadata.spec_state_indices_tensor"),
                non_spec_state_indices_tensor: v.opt_r("metadata.non_spec_state_indices_tensor"),
                spec_token_indx: v.opt_r("metadata.spec_token_indx"),
                non_spec_token_indx: v.opt_r("metadata.non_spec_token_indx"),
                num_accepted_tokens: v.opt_r("metadata.num_accepted_tokens"),
                ..t.metadata
            },
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        let m = &mut a.metadata;
        vec![
            ("activation", &mut a.activation),
            ("conv_state_layout", &mut a.conv_state_layout),
            ("ssm_state_layout", &mut a.ssm_state_layout),
            ("num_k_heads", &mut a.num_k_heads),
            ("pad_slot_id", &mut a.pad_slot_id),
            ("metadata.num_prefills", &mut m.num_prefills),
            ("metadata.num_prefill_tokens", &mut m.num_prefill_tokens),
            ("metadata.num_decodes", &mut m.num_decodes),
            ("metadata.num_decode_tokens", &mut m.num_decode_tokens),
            ("metadata.num_spec_decodes", &mut m.num_spec_decodes),
            ("metadata.num_spec_decode_tokens", &mut m.num_spec_decode_tokens),
            ("metadata.num_actual_tokens", &mut m.num_actual_tokens),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.gdn_attention_core(a)
    }
}

/// The Mamba2 layer core (`mamba2_mixer_core`).
pub struct Mamba2Core;
impl FuzzOp for Mamba2Core {
    const NAME: &'static str = "mamba2_mixer_core";
    type At<'s> = ssm_dispatch::Mamba2MixerCoreArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        let m = &a.metadata;
        vec![
            ro("xbc", &a.xbc),
            ro("dt", &a.dt),
            ro("conv_weight", &a.conv_weight),
            opt("conv_bias", &a.conv_bias),
            rw("conv_state", &a.conv_state),
            rw("ssm_state", &a.ssm_state),
            ro("A", &a.a),
            opt("D", &a.d),
            opt("dt_bias", &a.dt_bias),
            opt_rw("conv_out", &a.conv_out),
            rw("out", &a.out),
            opt("metadata.query_start_loc_p", &m.query_start_loc_p),
            opt("metadata.has_initial_states_p", &m.has_initial_states_p),
            opt("metadata.seq_idx_p", &m.seq_idx_p),
            opt("metadata.cu_chunk_seqlen_p", &m.cu_chunk_seqlen_p),
            opt("metadata.last_chunk_indices_p", &m.last_chunk_indices_p),
            opt("metadata.state_indices_tensor_p", &m.state_indices_tensor_p),
            opt("metadata.state_indices_tensor_d", &m.state_indices_tensor_d),
            opt("metadata.query_start_loc_d", &m.query_start_loc_d),
            opt("metadata.num_accepted_tokens", &m.num_accepted_tokens),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_dispatch::Mamba2MixerCoreArgs {
            xbc: v.r("xbc"),
            dt: v.r("dt"),
            conv_weight: v.r("conv_weight"),
            conv_bias: v.opt_r("conv_bias"),
            conv_state: v.m("conv_state"),
            ssm_state: v.m("ssm_state"),
            a: v.r("A"),
            d: v.opt_r("D"),
            dt_bias: v.opt_r("dt_bias"),
            conv_out: v.opt_m("conv_out"),
            out: v.m("out"),
            metadata: ssm_dispatch::Mamba2AttentionMetadata {
                query_start_loc_p: v.opt_r("metadata.query_start_loc_p"),
                has_initial_states_p: v.opt_r("metadata.has_initial_states_p"),
                seq_idx_p: v.opt_r("metadata.seq_idx_p"),
                cu_chunk_seqlen_p: v.opt_r("metadata.cu_chunk_seqlen_p"),
                last_chunk_indices_p: v.opt_r("metadata.last_chunk_indices_p"),
                state_indices_tensor_p: v.opt_r("metadata.state_indices_tensor_p"),
                state_indices_tensor_d: v.opt_r("metadata.state_indices_tensor_d"),
                query_start_loc_d: v.opt_r("metadata.query_start_loc_d"),
                num_accepted_tokens: v.opt_r("metadata.num_accepted_tokens"),
                ..t.metadata
            },
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        let m = &mut a.metadata;
        vec![
            ("activation", &mut a.activation),
            ("conv_state_layout", &mut a.conv_state_layout),
            ("num_groups", &mut a.num_groups),
            ("pad_slot_id", &mut a.pad_slot_id),
            ("metadata.num_prefills", &mut m.num_prefills),
            ("metadata.num_prefill_tokens", &mut m.num_prefill_tokens),
            ("metadata.num_decodes", &mut m.num_decodes),
            ("metadata.num_decode_tokens", &mut m.num_decode_tokens),
            ("metadata.prep_initial_states", &mut m.prep_initial_states),
            ("metadata.chunk_size", &mut m.chunk_size),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.mamba2_mixer_core(a)
    }
}

/// `checkpointing_ssu` (ReplaySSM's replaying SSU).
pub struct Checkpoint;
impl FuzzOp for Checkpoint {
    const NAME: &'static str = "checkpointing_ssu";
    type At<'s> = ssm_ring::CheckpointingSsuArgs<'s>;
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
        vec![
            rw("state", &a.state),
            rw("x_cache", &a.x_cache),
            rw("B_cache", &a.b_cache),
            rw("dt_cache", &a.dt_cache),
            ro("ring_start", &a.ring_start),
            ro("prev_num_accepted_tokens", &a.prev_num_accepted_tokens),
            ro("x", &a.x),
            ro("dt", &a.dt),
            ro("A", &a.a),
            ro("B", &a.b),
            ro("C", &a.c),
            rw("out", &a.out),
            opt("D", &a.d),
            opt("z", &a.z),
            opt("dt_bias", &a.dt_bias),
            opt("state_batch_indices", &a.state_batch_indices),
            opt("cu_seqlens", &a.cu_seqlens),
        ]
    }
    fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
        ssm_ring::CheckpointingSsuArgs {
            state: v.m("state"),
            x_cache: v.m("x_cache"),
            b_cache: v.m("B_cache"),
            dt_cache: v.m("dt_cache"),
            ring_start: v.r("ring_start"),
            prev_num_accepted_tokens: v.r("prev_num_accepted_tokens"),
            x: v.r("x"),
            dt: v.r("dt"),
            a: v.r("A"),
            b: v.r("B"),
            c: v.r("C"),
            out: v.m("out"),
            d: v.opt_r("D"),
            z: v.opt_r("z"),
            dt_bias: v.opt_r("dt_bias"),
            state_batch_indices: v.opt_r("state_batch_indices"),
            cu_seqlens: v.opt_r("cu_seqlens"),
            ..*t
        }
    }
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
        vec![
            ("dt_softplus", &mut a.dt_softplus),
            ("pad_slot_id", &mut a.pad_slot_id),
            ("max_seqlen", &mut a.max_seqlen),
        ]
    }
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
        t.checkpointing_ssu(a)
    }
}
