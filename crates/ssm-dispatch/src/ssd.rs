use ssm_ssd::{MambaChunkScanCombinedVarlen, SsdBackend, SsdPlan};

use crate::{Backend, Error, Runtime};

impl Runtime {
    /// vLLM's `mamba_chunk_scan_combined_varlen` (Mamba2 SSD chunked prefill): plans the call
    /// (every check, once, including the host chunk metadata; nothing is written when it
    /// fails), checks that every tensor is on this runtime's device, and runs it. Writes
    /// `out` (when given), `varlen_states` and the workspace, nothing else
    /// ([`ssm_ssd::MambaChunkScanCombinedVarlen`]).
    ///
    /// The CPU backend allocates its f32 workspace per call unless `args.workspace` holds at
    /// least [`Runtime::ssd_workspace_len`] elements. The CUDA backend has no SSD kernel yet
    /// ([`Error::Unsupported`]).
    pub fn mamba_chunk_scan_combined_varlen(&self, args: MambaChunkScanCombinedVarlen<'_>) -> Result<(), Error> {
        let plan = ssm_ssd::plan(&args)?;
        let expected = self.device();
        if args.x.device() != expected {
            return Err(Error::WrongDevice { arg: "x", expected, actual: args.x.device() });
        }
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.mamba_chunk_scan_combined_varlen(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => Err(Error::Unsupported { backend: "cuda", what: "mamba_chunk_scan_combined_varlen" }),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    /// The f32 workspace (elements) a call with this plan needs: the size query for
    /// `MambaChunkScanCombinedVarlen::workspace`.
    pub fn ssd_workspace_len(plan: &SsdPlan) -> usize {
        plan.workspace_len()
    }
}
