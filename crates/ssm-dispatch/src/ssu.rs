use ssm_ssu::{SelectiveStateUpdateArgs, StochasticRounding};

use crate::{Error, Runtime};

impl Runtime {
    /// vLLM's `selective_state_update`: plans the call (every check, once) and runs it on the
    /// backend of the device its tensors live on. Writes `out` and exactly the state slots the
    /// tables name. With `stochastic_rounding` enabled in the config and no seed in `args`,
    /// the runtime supplies the next seed.
    ///
    /// No allocation and no host/device synchronisation on the CUDA path.
    pub fn selective_state_update(&self, args: SelectiveStateUpdateArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(self.with_config_rounding(args))
    }

    /// `args` with the configured stochastic rounding filled in (f16 state, none given): what
    /// every SSU call of the runtime plans, the layer cores' included.
    pub(crate) fn with_config_rounding<'a>(
        &self,
        mut args: SelectiveStateUpdateArgs<'a>,
    ) -> SelectiveStateUpdateArgs<'a> {
        if self.config.stochastic_rounding
            && args.stochastic_rounding.is_none()
            && args.state.dtype() == ssm_tensor::DType::F16
        {
            args.stochastic_rounding =
                Some(StochasticRounding { seed: self.next_seed(), philox_rounds: self.config.philox_rounds });
        }
        args
    }
}
