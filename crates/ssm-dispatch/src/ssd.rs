use ssm_ssd::{MambaChunkScanCombinedVarlen, SsdPlan};

use crate::{Error, Runtime};

impl Runtime {
    /// vLLM's `mamba_chunk_scan_combined_varlen` (Mamba2 SSD chunked prefill): plans the call
    /// (every check, once, including the host chunk metadata; nothing is written when it
    /// fails) and runs it where its tensors live. Writes `out` and `varlen_states` (when given),
    /// the `ssm_state` slots `final_state_indices` names, and the workspace, nothing else
    /// ([`ssm_ssd::MambaChunkScanCombinedVarlen`]).
    ///
    /// The CPU backend allocates its f32 workspace per call unless `args.workspace` holds at
    /// least [`Runtime::ssd_workspace_len`] elements.
    pub fn mamba_chunk_scan_combined_varlen(&self, args: MambaChunkScanCombinedVarlen<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// The f32 workspace (elements) a call with this plan needs: the size query for
    /// `MambaChunkScanCombinedVarlen::workspace`.
    pub fn ssd_workspace_len(plan: &SsdPlan) -> usize {
        plan.workspace_len()
    }
}
