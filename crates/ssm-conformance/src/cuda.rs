//! Running the suite on a CUDA runtime: the cases are host tensors, so [`Staged`] copies each
//! call's tensors to the runtime's device, runs the runtime's op there, and copies the outputs
//! back ([`ssm_cuda::testing::stage`], the one staging implementation, with a per-op mapping:
//! [`ssm_cuda::testing::StageArgs`]).

use ssm_cuda::testing::{
    DeviceCheckpointingSsuArgs, DeviceChunkArgs, DeviceCommitTrackersArgs, DeviceConvFnArgs, DeviceConvUpdateArgs,
    DeviceGdnGatingArgs, DeviceGdnRecurrentArgs, DeviceGdnSigmoidArgs, DeviceSsdArgs, DeviceSsuArgs,
    DeviceUpdateTrackersArgs, MirrorError, stage,
};
use ssm_dispatch::Runtime;

use crate::{Target, TargetError};

/// A runtime whose calls get host tensors staged onto its device. On a CPU runtime the calls go
/// straight through.
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

/// Ops with a CUDA kernel: on a CUDA runtime each call is staged ([`stage`] with the op's
/// [`ssm_cuda::testing::StageArgs`] mapping) and the runtime's op runs on the device copies; on
/// a CPU runtime the call goes straight through.
macro_rules! staged {
    ($($op:ident: $args:ty => $staging:ty),* $(,)?) => {
        // The staging closure's error is the staging's own (large) error enum; this is the test
        // harness's copy path, never a decode path.
        $(#[allow(clippy::result_large_err)]
        fn $op(&self, args: $args) -> Result<(), TargetError> {
            match self.rt.cuda() {
                Some(cuda) => stage::<$staging>(cuda, args, |dev_args| {
                    self.rt.$op(dev_args).map_err(|e| MirrorError::Run(e.to_string()))
                })
                .map_err(TargetError::failed),
                None => Ok(self.rt.$op(args)?),
            }
        })*
    };
}

impl Target for Staged {
    fn label(&self) -> String {
        self.label.clone()
    }

    staged! {
        selective_state_update: ssm_ssu::SelectiveStateUpdateArgs<'_> => DeviceSsuArgs,
        causal_conv1d_update: ssm_conv::CausalConv1dUpdateArgs<'_> => DeviceConvUpdateArgs,
        causal_conv1d_fn: ssm_conv::CausalConv1dFnArgs<'_> => DeviceConvFnArgs,
        fused_gdn_gating: ssm_gdn::FusedGdnGatingArgs<'_> => DeviceGdnGatingArgs,
        fused_recurrent_gated_delta_rule: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_> => DeviceGdnRecurrentArgs,
        fused_sigmoid_gating_delta_rule_update: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_> => DeviceGdnSigmoidArgs,
        update_replayssm_ring_trackers: ssm_ring::UpdateRingTrackersArgs<'_> => DeviceUpdateTrackersArgs,
        commit_replayssm_ring_trackers: ssm_ring::CommitRingTrackersArgs<'_> => DeviceCommitTrackersArgs,
        checkpointing_ssu: ssm_ring::CheckpointingSsuArgs<'_> => DeviceCheckpointingSsuArgs,
        mamba_chunk_scan_combined_varlen: ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_> => DeviceSsdArgs,
        chunk_gated_delta_rule: ssm_gdn::ChunkGatedDeltaRuleArgs<'_> => DeviceChunkArgs,
    }
}
