//! [`Target`]: what the harness runs a case on, and [`TargetError`]: how a run can end badly.

use ssm_ssu::SelectiveStateUpdateArgs;

/// Why a [`Target`] did not run an op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// The target has no implementation of the op (reported as skipped, never as a pass).
    Unsupported(String),
    /// The op was refused or failed (reported as a failure).
    Failed(String),
}

impl TargetError {
    /// The answer of a [`Target`] method the target does not implement.
    pub fn unsupported() -> Self {
        TargetError::Unsupported("not supported by this target".into())
    }

    /// A failure with the error's message.
    pub fn failed(e: impl std::fmt::Display) -> Self {
        TargetError::Failed(e.to_string())
    }

    /// As a mapping's `(skipped, message)` pair.
    pub(crate) fn into_produced(self) -> (bool, String) {
        match self {
            TargetError::Unsupported(m) => (true, m),
            TargetError::Failed(m) => (false, m),
        }
    }
}

impl std::fmt::Display for TargetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetError::Unsupported(m) => write!(f, "unsupported: {m}"),
            TargetError::Failed(m) => f.write_str(m),
        }
    }
}

/// The runtime's "this backend has no such op" is a skip; every other error a failure.
impl From<ssm_dispatch::Error> for TargetError {
    fn from(e: ssm_dispatch::Error) -> Self {
        match e {
            ssm_dispatch::Error::Unsupported { .. } => TargetError::Unsupported(e.to_string()),
            other => TargetError::Failed(other.to_string()),
        }
    }
}

/// Something that can run the ops on host tensors: a runtime, or a staging wrapper that
/// copies to a device and back. Each op family adds a method; the default says "not
/// supported", which the report shows as skipped.
pub trait Target {
    /// Shown in reports, e.g. `cpu-1t`.
    fn label(&self) -> String;
    /// Runs `selective_state_update` on host tensors.
    fn selective_state_update(&self, _args: SelectiveStateUpdateArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `causal_conv1d_update` on host tensors.
    fn causal_conv1d_update(&self, _args: ssm_conv::CausalConv1dUpdateArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `causal_conv1d_fn` on host tensors.
    fn causal_conv1d_fn(&self, _args: ssm_conv::CausalConv1dFnArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `mamba_chunk_scan_combined_varlen` on host tensors.
    fn mamba_chunk_scan_combined_varlen(
        &self,
        _args: ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_>,
    ) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `update_replayssm_ring_trackers` on host tensors.
    fn update_replayssm_ring_trackers(&self, _args: ssm_ring::UpdateRingTrackersArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `commit_replayssm_ring_trackers` on host tensors.
    fn commit_replayssm_ring_trackers(&self, _args: ssm_ring::CommitRingTrackersArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `fused_gdn_gating` on host tensors.
    fn fused_gdn_gating(&self, _args: ssm_gdn::FusedGdnGatingArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `fused_recurrent_gated_delta_rule` on host tensors.
    fn fused_recurrent_gated_delta_rule(
        &self,
        _args: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    ) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `fused_sigmoid_gating_delta_rule_update` on host tensors.
    fn fused_sigmoid_gating_delta_rule_update(
        &self,
        _args: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `chunk_gated_delta_rule` on host tensors.
    fn chunk_gated_delta_rule(&self, _args: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `checkpointing_ssu` (ReplaySSM's replaying SSU) on host tensors (no golden vectors:
    /// the fuzz harness calls it).
    fn checkpointing_ssu(&self, _args: ssm_ring::CheckpointingSsuArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs the GDN layer core on host tensors (no golden vectors: the fuzz harness and the
    /// reliability tests call it).
    fn gdn_attention_core(&self, _args: ssm_dispatch::GdnAttentionCoreArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs the Mamba2 layer core on host tensors (as [`Target::gdn_attention_core`]).
    fn mamba2_mixer_core(&self, _args: ssm_dispatch::Mamba2MixerCoreArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
    /// Runs `copy_rows` (the layer cores' row gather and scatter) on host tensors (no golden
    /// vectors: the fuzz harness calls it).
    fn copy_rows(&self, _args: ssm_tensor::CopyRowsArgs<'_>) -> Result<(), TargetError> {
        Err(TargetError::unsupported())
    }
}

/// The runtime runs host tensors as given (a CPU runtime; see [`crate::cuda`] for staging onto a
/// device). Its label is `runtime`: callers that want another name wrap it in [`Labeled`].
impl Target for ssm_dispatch::Runtime {
    fn label(&self) -> String {
        "runtime".into()
    }
    fn selective_state_update(&self, args: SelectiveStateUpdateArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::selective_state_update(self, args).map_err(TargetError::from)
    }
    fn causal_conv1d_update(&self, args: ssm_conv::CausalConv1dUpdateArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::causal_conv1d_update(self, args).map_err(TargetError::from)
    }
    fn causal_conv1d_fn(&self, args: ssm_conv::CausalConv1dFnArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::causal_conv1d_fn(self, args).map_err(TargetError::from)
    }
    fn mamba_chunk_scan_combined_varlen(
        &self,
        args: ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_>,
    ) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::mamba_chunk_scan_combined_varlen(self, args).map_err(TargetError::from)
    }
    fn update_replayssm_ring_trackers(&self, args: ssm_ring::UpdateRingTrackersArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::update_replayssm_ring_trackers(self, args).map_err(TargetError::from)
    }
    fn commit_replayssm_ring_trackers(&self, args: ssm_ring::CommitRingTrackersArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::commit_replayssm_ring_trackers(self, args).map_err(TargetError::from)
    }
    fn fused_gdn_gating(&self, args: ssm_gdn::FusedGdnGatingArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::fused_gdn_gating(self, args).map_err(TargetError::from)
    }
    fn fused_recurrent_gated_delta_rule(
        &self,
        args: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    ) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::fused_recurrent_gated_delta_rule(self, args).map_err(TargetError::from)
    }
    fn fused_sigmoid_gating_delta_rule_update(
        &self,
        args: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::fused_sigmoid_gating_delta_rule_update(self, args).map_err(TargetError::from)
    }
    fn chunk_gated_delta_rule(&self, args: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::chunk_gated_delta_rule(self, args).map_err(TargetError::from)
    }
    fn checkpointing_ssu(&self, args: ssm_ring::CheckpointingSsuArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::checkpointing_ssu(self, args).map_err(TargetError::from)
    }
    fn gdn_attention_core(&self, args: ssm_dispatch::GdnAttentionCoreArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::gdn_attention_core(self, args).map_err(TargetError::from)
    }
    fn mamba2_mixer_core(&self, args: ssm_dispatch::Mamba2MixerCoreArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::mamba2_mixer_core(self, args).map_err(TargetError::from)
    }
    fn copy_rows(&self, args: ssm_tensor::CopyRowsArgs<'_>) -> Result<(), TargetError> {
        ssm_dispatch::Runtime::copy_rows(self, args).map_err(TargetError::from)
    }
}

/// A target under another name in reports (e.g. a runtime as `cpu-1t`).
#[derive(Debug)]
pub struct Labeled<T>(pub T, pub String);

/// Calls `$m!` with every op but `selective_state_update` as `name: ArgsType` pairs (the
/// one list of the ops' signatures that the forwarding impls are generated from).
macro_rules! non_ssu_ops {
    ($m:ident) => {
        $m! {
            causal_conv1d_update: ssm_conv::CausalConv1dUpdateArgs<'_>,
            causal_conv1d_fn: ssm_conv::CausalConv1dFnArgs<'_>,
            mamba_chunk_scan_combined_varlen: ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_>,
            update_replayssm_ring_trackers: ssm_ring::UpdateRingTrackersArgs<'_>,
            commit_replayssm_ring_trackers: ssm_ring::CommitRingTrackersArgs<'_>,
            fused_gdn_gating: ssm_gdn::FusedGdnGatingArgs<'_>,
            fused_recurrent_gated_delta_rule: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
            fused_sigmoid_gating_delta_rule_update: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
            chunk_gated_delta_rule: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>,
            checkpointing_ssu: ssm_ring::CheckpointingSsuArgs<'_>,
            gdn_attention_core: ssm_dispatch::GdnAttentionCoreArgs<'_>,
            mamba2_mixer_core: ssm_dispatch::Mamba2MixerCoreArgs<'_>,
            copy_rows: ssm_tensor::CopyRowsArgs<'_>,
        }
    };
}
#[allow(unused_imports)] // staging targets list their ops explicitly
pub(crate) use non_ssu_ops;

macro_rules! forward {
    ($($op:ident: $args:ty),* $(,)?) => {
        $(fn $op(&self, args: $args) -> Result<(), TargetError> {
            self.0.$op(args)
        })*
    };
}

impl<T: Target> Target for Labeled<T> {
    fn label(&self) -> String {
        self.1.clone()
    }
    fn selective_state_update(&self, args: SelectiveStateUpdateArgs<'_>) -> Result<(), TargetError> {
        self.0.selective_state_update(args)
    }
    non_ssu_ops!(forward);
}
