use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, ChunkPlan, ChunkScratch, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GdnDecodeStepArgs,
};
use ssm_tensor::Device;

use crate::{Error, Runtime};

impl Runtime {
    /// vLLM's `fused_gdn_gating`: `g = −exp(A_log)·softplus(a + dt_bias)`, `β = sigmoid(b)`.
    /// Plans the call (nothing is written when it fails) and runs it where its tensors live.
    /// Writes every element of `g` and `beta_output`, nothing else
    /// ([`ssm_gdn::FusedGdnGatingArgs`]).
    pub fn fused_gdn_gating(&self, args: FusedGdnGatingArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// vLLM's `fused_recurrent_gated_delta_rule` (decode, varlen, speculative decoding over a
    /// slot pool): plans and runs it. Writes the `o` rows of sequences that are not skipped and
    /// the state slots the tables name, nothing else
    /// ([`ssm_gdn::FusedRecurrentGatedDeltaRuleArgs`]).
    pub fn fused_recurrent_gated_delta_rule(&self, args: FusedRecurrentGatedDeltaRuleArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// vLLM's `fused_sigmoid_gating_delta_rule_update` (the decode path with the gating fused
    /// in): plans and runs it; writes as [`Runtime::fused_recurrent_gated_delta_rule`] does
    /// ([`ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs`]).
    pub fn fused_sigmoid_gating_delta_rule_update(
        &self,
        args: FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// One decode step of a Qwen3-Next GDN layer: `causal_conv1d_update`, then
    /// `fused_sigmoid_gating_delta_rule_update` on its output ([`ssm_gdn::GdnDecodeStepArgs`],
    /// planned when the arguments were built). Writes what the two calls write; on CUDA the route is
    /// chosen per call (`ssm_cuda::gdn::StepRoute`: fused, chained or separate launches).
    pub fn gdn_decode_step(&self, args: GdnDecodeStepArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// vLLM's `chunk_gated_delta_rule` (chunked varlen prefill) with initial states read from a
    /// pool and final states written back: plans and runs it. Writes the `o` rows of non-pad
    /// sequences, `final_state` rows and (in place) their pool rows
    /// ([`ssm_gdn::ChunkGatedDeltaRuleArgs`]).
    ///
    /// Both backends allocate their f32 scratch per call unless `args.scratch` holds at least
    /// [`Runtime::chunk_gated_delta_rule_scratch_size`] elements (CUDA: stream-ordered, so a
    /// call to capture in a CUDA graph passes one).
    pub fn chunk_gated_delta_rule(&self, args: ChunkGatedDeltaRuleArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }

    /// f32 scratch elements a chunked prefill with this plan wants on the backend of the
    /// plan's device (the size query for `ChunkGatedDeltaRuleArgs::scratch`); 0 where none is
    /// needed or no backend runs that device.
    pub fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize {
        match (plan.device, self.cpu(), self.cuda()) {
            (Device::Cpu, Some(cpu), _) => cpu.chunk_gated_delta_rule_scratch_size(plan),
            (Device::Cuda(_), _, Some(cuda)) => cuda.chunk_gated_delta_rule_scratch_size(plan),
            _ => 0,
        }
    }
}
