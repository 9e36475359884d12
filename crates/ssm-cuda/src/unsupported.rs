//! The ops the CUDA backend has no kernel for yet: each answers a typed
//! [`ssm_tensor::Unsupported`] naming the op, and writes nothing.

use ssm_tensor::{Op, Planned, Run, Unsupported};

use crate::{CudaBackend, CudaError};

macro_rules! unsupported {
    ($($args:ty),* $(,)?) => {$(
        impl Run<$args> for CudaBackend {
            type Error = CudaError;
            fn run(&self, call: Planned<$args>) -> Result<(), CudaError> {
                self.expect_device(&call)?;
                Err(Unsupported { op: <$args as Op>::NAME, backend: "cuda" }.into())
            }
        }
    )*};
}

unsupported!(ssm_gdn::ChunkGatedDeltaRuleArgs<'_>);

impl ssm_gdn::ChunkScratch for CudaBackend {
    /// No chunked-prefill kernel yet, so no scratch.
    fn chunk_gated_delta_rule_scratch_size(&self, _plan: &ssm_gdn::ChunkPlan) -> usize {
        0
    }
}
