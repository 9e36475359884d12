//! The op crates' scalar references as [`Target`]s, so that the references are checked against
//! the vectors by the same harness as the backends.
//!
//! This is the one place where the harness plans calls itself (a [`Target`] over a runtime
//! leaves planning to the runtime).

use ssm_tensor::{Planned, Run};

use crate::{Target, TargetError};

pub use ssm_tensor::Arithmetic;

/// Every op crate's reference, in one precision. The ring trackers are integer ops with one
/// reference, used for both precisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference(pub Arithmetic);

fn failed(e: impl std::fmt::Display) -> TargetError {
    TargetError::failed(e)
}

impl Target for Reference {
    fn label(&self) -> String {
        format!("reference-{:?}", self.0).to_lowercase()
    }

    fn selective_state_update(&self, args: ssm_ssu::SelectiveStateUpdateArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        match self.0 {
            Arithmetic::F32 => ssm_ssu::reference::Reference.run(call),
            Arithmetic::F64 => ssm_ssu::reference::ReferenceF64.run(call),
        }
        .map_err(failed)
    }

    fn causal_conv1d_update(&self, args: ssm_conv::CausalConv1dUpdateArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        self.conv().run(call).map_err(failed)
    }

    fn causal_conv1d_fn(&self, args: ssm_conv::CausalConv1dFnArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        self.conv().run(call).map_err(failed)
    }

    fn mamba_chunk_scan_combined_varlen(
        &self,
        args: ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_>,
    ) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        match self.0 {
            Arithmetic::F32 => ssm_ssd::reference::mamba_chunk_scan_combined_varlen(call),
            Arithmetic::F64 => ssm_ssd::reference::mamba_chunk_scan_combined_varlen_f64(call),
        }
        Ok(())
    }

    fn update_replayssm_ring_trackers(&self, args: ssm_ring::UpdateRingTrackersArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        ssm_ring::reference::update_replayssm_ring_trackers(call);
        Ok(())
    }

    fn commit_replayssm_ring_trackers(&self, args: ssm_ring::CommitRingTrackersArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        ssm_ring::reference::commit_replayssm_ring_trackers(call);
        Ok(())
    }

    fn fused_gdn_gating(&self, args: ssm_gdn::FusedGdnGatingArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        self.gdn().run(call).map_err(failed)
    }

    fn fused_recurrent_gated_delta_rule(
        &self,
        args: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    ) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        self.gdn().run(call).map_err(failed)
    }

    fn fused_sigmoid_gating_delta_rule_update(
        &self,
        args: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        self.gdn().run(call).map_err(failed)
    }

    fn chunk_gated_delta_rule(&self, args: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        self.gdn().run(call).map_err(failed)
    }

    fn checkpointing_ssu(&self, args: ssm_ring::CheckpointingSsuArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        match self.0 {
            Arithmetic::F32 => ssm_ring::reference::checkpointing_ssu(call),
            Arithmetic::F64 => ssm_ring::reference::checkpointing_ssu_f64(call),
        }
        Ok(())
    }

    fn copy_rows(&self, args: ssm_tensor::CopyRowsArgs<'_>) -> Result<(), TargetError> {
        let call = Planned::new(args).map_err(failed)?;
        if call.device() != ssm_tensor::Device::Cpu {
            return Err(failed(format!("the reference runs host tensors, got one on {}", call.device())));
        }
        // Moves bytes: the same in both precisions.
        ssm_tensor::copy_rows_reference(call);
        Ok(())
    }
}

impl Reference {
    fn conv(&self) -> ssm_conv::reference::Reference {
        ssm_conv::reference::Reference { precision: self.0 }
    }

    fn gdn(&self) -> ssm_gdn::reference::Reference {
        ssm_gdn::reference::Reference { precision: self.0 }
    }
}
