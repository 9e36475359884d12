//! Running the suite on a CUDA runtime: the cases are host tensors, so [`Staged`] copies each
//! call's tensors to the runtime's device, runs the runtime's op there, and copies the outputs
//! back ([`ssm_cuda::testing::stage`], the one staging implementation, with a per-op mapping).

use ssm_cuda::testing::MirrorError;
use ssm_dispatch::Runtime;
use ssm_ssu::SelectiveStateUpdate;

use crate::{Target, TargetError};

/// A runtime whose calls get host tensors staged onto its device. On a CPU runtime the calls go
/// straight through. Ops the CUDA backend has no kernel for are reported as unsupported
/// (skipped) rather than run on host tensors.
#[derive(Debug)]
pub struct Staged {
    rt: Runtime,
    label: String,
}

impl Staged {
    /// Wraps `rt`, shown as `label` in reports.
    pub fn new(rt: Runtime, label: impl Into<String>) -> Self {
        Staged { rt, label: label.into() }
    }
}

/// Ops the CUDA backend has no kernel for (so nothing to stage): straight through on a CPU
/// runtime, unsupported on a CUDA one.
macro_rules! unstaged {
    ($($op:ident: $args:ty),* $(,)?) => {
        $(fn $op(&self, args: $args) -> Result<(), TargetError> {
            match self.rt.cuda() {
                None => Ok(self.rt.$op(args)?),
                Some(_) => Err(TargetError::Unsupported(format!("the cuda backend has no `{}`", stringify!($op)))),
            }
        })*
    };
}

impl Target for Staged {
    fn label(&self) -> String {
        self.label.clone()
    }

    // The staging closure's error is the staging's own (large) error enum; this is the test
    // harness's copy path, never a decode path.
    #[allow(clippy::result_large_err)]
    fn selective_state_update(&self, args: SelectiveStateUpdate<'_>) -> Result<(), TargetError> {
        match self.rt.cuda() {
            Some(cuda) => ssm_cuda::testing::stage_ssu(cuda, args, |dev_args| {
                self.rt.selective_state_update(dev_args).map_err(|e| MirrorError::Run(e.to_string()))
            })
            .map_err(TargetError::failed),
            None => Ok(self.rt.selective_state_update(args)?),
        }
    }

    #[allow(clippy::result_large_err)]
    fn causal_conv1d_update(&self, args: ssm_conv::CausalConv1dUpdateArgs<'_>) -> Result<(), TargetError> {
        match self.rt.cuda() {
            Some(cuda) => ssm_cuda::testing::stage_conv_update(cuda, args, |dev_args| {
                self.rt.causal_conv1d_update(dev_args).map_err(|e| MirrorError::Run(e.to_string()))
            })
            .map_err(TargetError::failed),
            None => Ok(self.rt.causal_conv1d_update(args)?),
        }
    }

    #[allow(clippy::result_large_err)]
    fn causal_conv1d_fn(&self, args: ssm_conv::CausalConv1dFnArgs<'_>) -> Result<(), TargetError> {
        match self.rt.cuda() {
            Some(cuda) => ssm_cuda::testing::stage_conv_fn(cuda, args, |dev_args| {
                self.rt.causal_conv1d_fn(dev_args).map_err(|e| MirrorError::Run(e.to_string()))
            })
            .map_err(TargetError::failed),
            None => Ok(self.rt.causal_conv1d_fn(args)?),
        }
    }

    unstaged! {
        mamba_chunk_scan_combined_varlen: ssm_ssd::MambaChunkScanCombinedVarlen<'_>,
        update_replayssm_ring_trackers: ssm_ring::UpdateRingTrackers<'_>,
        commit_replayssm_ring_trackers: ssm_ring::CommitRingTrackers<'_>,
        fused_gdn_gating: ssm_gdn::FusedGdnGatingArgs<'_>,
        fused_recurrent_gated_delta_rule: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
        fused_sigmoid_gating_delta_rule_update: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
        chunk_gated_delta_rule: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>,
    }
}
