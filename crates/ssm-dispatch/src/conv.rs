use ssm_conv::{CausalConv1dFnArgs, CausalConv1dUpdateArgs};

use crate::{Error, Runtime};

impl Runtime {
    /// vLLM's `causal_conv1d_update` (decode, speculative rolling buffer, prefix caching):
    /// plans the call (every check, once; nothing is written when it fails) and runs it where
    /// its tensors live. Writes the `out` rows of non-pad, non-empty sequences and the state
    /// windows the plan names, nothing else ([`ssm_conv::CausalConv1dUpdateArgs`]).
    ///
    /// The CPU backend allocates nothing.
    pub fn causal_conv1d_update(&self, args: CausalConv1dUpdateArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// vLLM's `causal_conv1d_fn` (varlen prefill): plans and runs it. Writes the `out` rows of
    /// non-pad sequences and columns `[0, width − 1)` of their slots
    /// ([`ssm_conv::CausalConv1dFnArgs`]).
    pub fn causal_conv1d_fn(&self, args: CausalConv1dFnArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }
}
