//! The facade of ssm-kernels: one [`Runtime`] per device, one method per op.
//!
//! Mirrors vLLM's `ssu_dispatch`: a serde [`Config`] names the backend (`auto`, `cpu`,
//! `cuda`), the SSU algorithm and stochastic rounding; [`Runtime::new`] picks the backend
//! (`auto`: CUDA when a device is ready, else CPU, with a log line like vLLM's triton→cpu
//! override) and refuses combinations a backend cannot run. Each op method builds the op
//! crate's checked plan, checks that every tensor lives on the runtime's device, and
//! forwards to the backend. There is no global state.

mod backend;
mod config;
mod conv;
mod error;
mod gdn;
mod gdn_core;
mod mamba2_core;
mod ring;
mod ssd;
mod ssu;

pub use backend::{Backend, BackendKind, CudaBackend};
pub use config::Config;
pub use error::Error;
pub use gdn_core::{GdnAttentionCoreArgs, GdnAttentionMetadata};
pub use mamba2_core::{Mamba2AttentionMetadata, Mamba2MixerCoreArgs};
pub use ring::SelectiveStateUpdateReplaySsm;
pub use ssm_cpu::Par;

use std::sync::atomic::{AtomicU64, Ordering};

use ssm_tensor::Device;

/// A configured backend and the per-runtime state ops need (the stochastic-rounding seed
/// counter). `Send + Sync`: share one per device.
pub struct Runtime {
    backend: Backend,
    config: Config,
    ssu_algorithm: ssm_ssu::SsuAlgorithm,
    seed_counter: AtomicU64,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("backend", &self.backend.kind()).field("config", &self.config).finish()
    }
}

impl Runtime {
    /// Validates `config` and starts its backend.
    ///
    /// Errors: an SSU algorithm the backend lacks; `cuda` requested without the `cuda` feature or
    /// without a ready device; a CPU thread pool that would not start.
    pub fn new(config: &Config) -> Result<Self, Error> {
        let ssu_algorithm = config.ssu_algorithm;
        let backend = Backend::start(config)?;
        config.check_ssu_algorithm(backend.kind())?;
        // ReplaySSM runs where a backend implements it (the CPU today), like vLLM refusing it
        // on backends without a kernel.
        if config.replayssm && backend.kind() != BackendKind::Cpu {
            return Err(Error::Unsupported { backend: "cuda", what: "ReplaySSM (`replayssm: true`)" });
        }
        Ok(Runtime { backend, config: config.clone(), ssu_algorithm, seed_counter: AtomicU64::new(config.seed) })
    }

    /// The backend in use.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Which kind of backend runs the ops.
    pub fn kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The device every tensor passed to this runtime must live on.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// The configuration the runtime was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The SSU algorithm selected by the configuration.
    pub fn ssu_algorithm(&self) -> ssm_ssu::SsuAlgorithm {
        self.ssu_algorithm
    }

    /// Reads and clears the device error word (device-resident indices that were out of
    /// range and skipped). Synchronizes with the device: call it off the hot path.
    /// Always `Ok` on the CPU, whose plans check host indices before running.
    pub fn check(&self) -> Result<(), Error> {
        self.backend.check()
    }

    /// A fresh stochastic-rounding seed (the configured seed, then a counter).
    pub(crate) fn next_seed(&self) -> u64 {
        self.seed_counter.fetch_add(1, Ordering::Relaxed)
    }
}

/// The README's examples compile and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
