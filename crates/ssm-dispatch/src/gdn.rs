use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, ChunkPlan, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GdnBackend,
};
use ssm_tensor::Device;

use crate::{Backend, Error, Runtime};

impl Runtime {
    /// vLLM's `fused_gdn_gating`: `g = −exp(A_log)·softplus(a + dt_bias)`, `β = sigmoid(b)`.
    /// Plans the call (nothing is written when it fails), checks the device and runs it. Writes
    /// every element of `g` and `beta_output`, nothing else ([`ssm_gdn::FusedGdnGatingArgs`]).
    pub fn fused_gdn_gating(&self, args: FusedGdnGatingArgs<'_>) -> Result<(), Error> {
        let plan = ssm_gdn::plan::fused_gdn_gating(&args)?;
        self.check_gdn_device("a", args.a.device())?;
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.fused_gdn_gating(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => Err(Error::Unsupported { backend: "cuda", what: "fused_gdn_gating" }),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    /// vLLM's `fused_recurrent_gated_delta_rule` (decode, varlen, speculative decoding over a
    /// slot pool): plans, checks the device and runs it. Writes the `o` rows of sequences that
    /// are not skipped and the state slots the tables name, nothing else
    /// ([`ssm_gdn::FusedRecurrentGatedDeltaRuleArgs`]). The CPU backend allocates nothing after
    /// its first call on a thread.
    pub fn fused_recurrent_gated_delta_rule(&self, args: FusedRecurrentGatedDeltaRuleArgs<'_>) -> Result<(), Error> {
        let plan = ssm_gdn::plan::fused_recurrent_gated_delta_rule(&args)?;
        self.check_gdn_device("q", plan.device)?;
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.fused_recurrent_gated_delta_rule(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => Err(Error::Unsupported { backend: "cuda", what: "fused_recurrent_gated_delta_rule" }),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    /// vLLM's `fused_sigmoid_gating_delta_rule_update` (the decode path with the gating fused
    /// in): plans, checks the device and runs it; writes as
    /// [`Runtime::fused_recurrent_gated_delta_rule`] does
    /// ([`ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs`]).
    pub fn fused_sigmoid_gating_delta_rule_update(
        &self,
        args: FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), Error> {
        let plan = ssm_gdn::plan::fused_sigmoid_gating_delta_rule_update(&args)?;
        self.check_gdn_device("q", plan.device)?;
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.fused_sigmoid_gating_delta_rule_update(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => {
                Err(Error::Unsupported { backend: "cuda", what: "fused_sigmoid_gating_delta_rule_update" })
            }
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    /// vLLM's `chunk_gated_delta_rule` (chunked varlen prefill) with initial states read from a
    /// pool and final states written back: plans, checks the device and runs it. Writes the `o`
    /// rows of non-pad sequences, `final_state` rows and (in place) their pool rows
    /// ([`ssm_gdn::ChunkGatedDeltaRuleArgs`]).
    ///
    /// The CPU backend allocates its f32 scratch per call unless `args.scratch` holds at least
    /// [`Runtime::chunk_gated_delta_rule_scratch_size`] elements.
    pub fn chunk_gated_delta_rule(&self, args: ChunkGatedDeltaRuleArgs<'_>) -> Result<(), Error> {
        let plan = ssm_gdn::plan::chunk_gated_delta_rule(&args)?;
        self.check_gdn_device("q", plan.device)?;
        match &self.backend {
            Backend::Cpu(cpu) => Ok(cpu.chunk_gated_delta_rule(&plan, args)?),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => Err(Error::Unsupported { backend: "cuda", what: "chunk_gated_delta_rule" }),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    /// f32 scratch elements a chunked prefill with this plan wants on this runtime (the size
    /// query for `ChunkGatedDeltaRuleArgs::scratch`); 0 on backends that need none.
    pub fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize {
        match &self.backend {
            Backend::Cpu(cpu) => cpu.chunk_gated_delta_rule_scratch_size(plan),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => 0,
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    fn check_gdn_device(&self, arg: &'static str, actual: Device) -> Result<(), Error> {
        let expected = self.device();
        if actual != expected {
            return Err(Error::WrongDevice { arg, expected, actual });
        }
        Ok(())
    }
}
