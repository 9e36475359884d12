use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, SsdPlan};

use crate::{Error, Runtime};

impl Runtime {
    /// vLLM's `mamba_chunk_scan_combined_varlen` (Mamba2 SSD chunked prefill): plans the call
    /// (every check, once, including the host chunk metadata; nothing is written when it
    /// fails) and runs it where its tensors live. Writes `out` and `varlen_states` (when given),
    /// the `ssm_state` slots `final_state_indices` names, and the scratch, nothing else
    /// ([`ssm_ssd::MambaChunkScanCombinedVarlenArgs`]).
    ///
    /// The CPU backend allocates its f32 scratch per call unless `args.scratch` holds at
    /// least [`Runtime::mamba_chunk_scan_combined_varlen_scratch_size`] elements.
    pub fn mamba_chunk_scan_combined_varlen(&self, args: MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// The f32 scratch (elements) a call with this plan needs: the size query for
    /// `MambaChunkScanCombinedVarlenArgs::scratch`.
    pub fn mamba_chunk_scan_combined_varlen_scratch_size(plan: &SsdPlan) -> usize {
        plan.scratch_len()
    }
}
