use ssm_ssu::{SelectiveStateUpdate, SsuBackend, StochasticRounding};

use crate::{Backend, Error, Runtime};

impl Runtime {
    /// vLLM's `selective_state_update`: plans the call (every check, once), checks that
    /// every tensor is on this runtime's device, and runs it on the backend. Writes `out`
    /// and exactly the state slots the tables name. With `stochastic_rounding` enabled in
    /// the config and no seed in `args`, the runtime supplies the next seed.
    ///
    /// No allocation and no host/device synchronisation on the CUDA path.
    pub fn selective_state_update(&self, mut args: SelectiveStateUpdate<'_>) -> Result<(), Error> {
        if self.config.stochastic_rounding
            && args.stochastic_rounding.is_none()
            && args.state.dtype() == ssm_tensor::DType::F16
        {
            args.stochastic_rounding =
                Some(StochasticRounding { seed: self.next_seed(), philox_rounds: self.config.philox_rounds });
        }
        let plan = ssm_ssu::plan(&args)?;
        let expected = self.device();
        if plan.device != expected {
            return Err(Error::WrongDevice { arg: "state", expected, actual: plan.device });
        }
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.selective_state_update(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => Ok(cuda.selective_state_update(&plan, args)?),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }
}
