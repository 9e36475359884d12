//! Mamba2 SSD chunked prefill: vLLM's `mamba_chunk_scan_combined_varlen` (MATE's
//! `ssd_combined_fwd_varlen`) over a packed varlen batch with chunk metadata.
//!
//! Semantics (SEMANTICS.md "SSD prefill", semantics/ssd_mamba2.md): per sequence and head,
//! `S_t = exp(A·dt_t)·S_{t−1} + dt_t·x_t ⊗ B_t`, `y_t = S_t·C_t + D·x_t` (then `·silu(z)`),
//! with `dt = clamp(softplus?(dt + dt_bias), dt_limit)`. Chunk `c` covers
//! `cu_chunk_seqlens[c]..cu_chunk_seqlens[c+1]` of sequence `seq_idx[c]`; a chunk whose
//! `seq_idx` differs from the previous one starts from `initial_states[seq_idx[c]]` (or
//! zeros); `states[c]` is the state at the **end** of chunk c; short chunks may appear
//! anywhere.
//!
//! Pieces: [`MambaChunkScanCombinedVarlen`] (args), [`plan`] (every check, once),
//! `impl Run<MambaChunkScanCombinedVarlen> for …` (what a backend implements), [`reference`] (sequential recurrence, f32
//! and f64), and [`compute_chunk_metadata`] (vLLM's metadata builder).

mod args;
mod error;
mod metadata;
mod plan;
pub mod reference;

pub use args::MambaChunkScanCombinedVarlen;
pub use error::SsdError;
pub use metadata::{ChunkMetadata, compute_chunk_metadata};
pub use plan::{IoDtypes, SsdPlan, Strided1, Strided3, Strided4, WorkspaceLayout};
pub use ssm_tensor::{Op, Planned, Run};

impl Op for MambaChunkScanCombinedVarlen<'_> {
    const NAME: &'static str = "mamba_chunk_scan_combined_varlen";
    type Plan = SsdPlan;
    type Error = SsdError;
    fn plan(&self) -> Result<SsdPlan, SsdError> {
        plan::plan(self)
    }
    fn device(plan: &SsdPlan) -> ssm_tensor::Device {
        plan.device
    }
}

/// Checks one call (shapes, dtypes, strides and devices of every tensor, and, for host
/// tensors, every index value it reads) and keeps the arguments with their plan. Backends
/// trust the plan: they write `out` (when given) and `varlen_states`, nothing else besides
/// the workspace.
pub fn plan(args: MambaChunkScanCombinedVarlen<'_>) -> Result<Planned<MambaChunkScanCombinedVarlen<'_>>, SsdError> {
    Planned::new(args)
}

/// A backend of the SSD prefill, with one error type `E`: every backend implements it (through
/// its `Run` impls), and generic harnesses take it as their bound.
pub trait SsdBackend<E>: for<'a> Run<MambaChunkScanCombinedVarlen<'a>, Error = E> {}

impl<E, B: for<'a> Run<MambaChunkScanCombinedVarlen<'a>, Error = E>> SsdBackend<E> for B {}
