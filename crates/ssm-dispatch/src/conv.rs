use ssm_conv::{CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvBackend, ConvPlan};

use crate::{Backend, Error, Runtime};

impl Runtime {
    /// vLLM's `causal_conv1d_update` (decode, speculative rolling buffer, prefix caching):
    /// plans the call (every check, once; nothing is written when it fails), checks that every
    /// tensor is on this runtime's device, and runs it. Writes the `out` rows of non-pad,
    /// non-empty sequences and the state windows the plan names, nothing else
    /// ([`ssm_conv::CausalConv1dUpdateArgs`]).
    ///
    /// The CPU backend allocates nothing. The CUDA backend has no conv kernels yet
    /// ([`Error::Unsupported`]).
    pub fn causal_conv1d_update(&self, args: CausalConv1dUpdateArgs<'_>) -> Result<(), Error> {
        let plan = ssm_conv::plan_update(&args)?;
        self.check_conv_device(&plan)?;
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.causal_conv1d_update(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => Err(Error::Unsupported { backend: "cuda", what: "causal_conv1d_update" }),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    /// vLLM's `causal_conv1d_fn` (varlen prefill): plans, checks devices and runs it. Writes
    /// the `out` rows of non-pad sequences and columns `[0, width − 1)` of their slots
    /// ([`ssm_conv::CausalConv1dFnArgs`]).
    pub fn causal_conv1d_fn(&self, args: CausalConv1dFnArgs<'_>) -> Result<(), Error> {
        let plan = ssm_conv::plan_fn(&args)?;
        self.check_conv_device(&plan)?;
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.causal_conv1d_fn(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => Err(Error::Unsupported { backend: "cuda", what: "causal_conv1d_fn" }),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    fn check_conv_device(&self, plan: &ConvPlan) -> Result<(), Error> {
        let expected = self.device();
        if plan.device != expected {
            return Err(Error::WrongDevice { arg: "x", expected, actual: plan.device });
        }
        Ok(())
    }
}
