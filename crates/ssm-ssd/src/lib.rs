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
//! Pieces: [`MambaChunkScanCombinedVarlenArgs`] (args), [`plan`] (every check, once),
//! [`SsdBackend`] (a backend's `Run` impl), [`reference`](mod@reference) (sequential recurrence, f32 and
//! f64), and [`compute_chunk_metadata`] (vLLM's metadata builder).

mod args;
mod error;
mod metadata;
mod plan;
pub mod reference;

pub use args::MambaChunkScanCombinedVarlenArgs;
pub use error::SsdError;
pub use metadata::{
    ChunkMetadata, compute_chunk_metadata, compute_chunk_metadata_with_checkpoints, try_compute_chunk_metadata,
    try_compute_chunk_metadata_with_checkpoints,
};
pub use plan::{IoDtypes, ScratchLayout, SsdPlan, StateSource};
pub use ssm_tensor::{Op, Planned, Run};

ssm_tensor::op_family! {
    /// A backend of the SSD prefill.
    family SsdBackend, error SsdError;
    MambaChunkScanCombinedVarlenArgs => "mamba_chunk_scan_combined_varlen", SsdPlan, plan::plan_mamba_chunk_scan_combined_varlen;
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
