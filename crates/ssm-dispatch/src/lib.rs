//! The facade of ssm-kernels: one [`Runtime`], one method per op.
//!
//! Mirrors vLLM's `ssu_dispatch`: a serde [`Config`] names the backend (`auto`, `cpu`,
//! `cuda`), the SSU algorithm and stochastic rounding; [`Runtime::new`] starts the backends
//! and refuses combinations a backend cannot run. There is no global state.
//!
//! **Where a call runs.** Every op method plans its arguments (the op crate's checks, once;
//! the plan records the one device all tensors live on) and hands the planned call to the
//! backend of that device: host tensors go to the CPU backend, tensors on `cuda:N` to the
//! CUDA backend. `cpu` and `cuda` start one backend; `auto` starts the CPU backend and, when
//! a device is ready, the CUDA backend too, so every op that exists on the CPU stays
//! reachable with host tensors on a GPU host, and device tensors run on the GPU. A call
//! whose device has no backend here is refused ([`Error::WrongDevice`]); an op a backend has
//! no kernel for answers a typed [`ssm_tensor::Unsupported`] (see the table in
//! docs/ARCHITECTURE.md).

mod backend;
mod config;
mod conv;
mod error;
mod gdn;
mod gdn_core;
mod layer_core;
mod mamba2_core;
mod ring;
mod rows;
mod ssd;
mod ssu;

pub use backend::{BackendKind, CudaBackend, Devices};
pub use config::Config;
pub use error::Error;
pub use gdn_core::{GdnAttentionCoreArgs, GdnAttentionMetadata};
pub use mamba2_core::{Mamba2AttentionMetadata, Mamba2MixerCoreArgs};
pub use ring::{ReplaySsmCursors, SelectiveStateUpdateReplaySsm};
pub use ssm_cpu::{CpuBackend, Par};
pub use ssm_tensor::{Op, Planned, Run};

use std::sync::atomic::{AtomicU64, Ordering};

use backend::Backends;
use ssm_tensor::Device;

/// The configured backends and the per-runtime state ops need (the stochastic-rounding seed
/// counter). `Send + Sync`: share one per process or per device.
pub struct Runtime {
    backends: Backends,
    config: Config,
    seed_counter: AtomicU64,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("devices", &self.devices()).field("config", &self.config).finish()
    }
}

impl Runtime {
    /// Validates `config` and starts its backends.
    ///
    /// Errors: an SSU algorithm the backend lacks; `cuda` requested without the `cuda` feature
    /// or without a ready device; a CPU thread pool that would not start.
    pub fn new(config: &Config) -> Result<Self, Error> {
        Self::with_backends(Backends::start(config)?, config)
    }

    /// A runtime whose device calls run on `cuda`, a backend the engine built, e.g. on its own
    /// stream with [`CudaBackend::with_borrowed_stream`], so that the ops are ordered with the
    /// engine's other work and can be captured with it in one CUDA graph. `config.backend`
    /// says whether host tensors run too: `cuda` starts no CPU backend, `auto` and `cpu` start
    /// one. `config.cuda_device` is not used (the backend names its device).
    ///
    /// Errors: as [`Runtime::new`].
    #[cfg(feature = "cuda")]
    pub fn with_cuda_backend(config: &Config, cuda: CudaBackend) -> Result<Self, Error> {
        let cpu = match config.backend {
            BackendKind::Cuda => None,
            BackendKind::Auto | BackendKind::Cpu => Some(backend::cpu(config)?),
        };
        Self::with_backends(Backends { cpu, cuda: Some(cuda) }, config)
    }

    /// Checks `config` against the started backends, and gives the CUDA backend the
    /// configured SSU algorithm.
    fn with_backends(backends: Backends, config: &Config) -> Result<Self, Error> {
        config.check_ssu_algorithm(backends.has_cuda())?;
        backends.set_ssu_algorithm(config.ssu_algorithm);
        Ok(Runtime { backends, config: config.clone(), seed_counter: AtomicU64::new(config.seed) })
    }

    /// The CPU backend, which runs calls on host tensors (absent under `backend: cuda`).
    pub fn cpu(&self) -> Option<&CpuBackend> {
        self.backends.cpu.as_ref()
    }

    /// The CUDA backend, which runs calls on its device's tensors (absent under `backend: cpu`,
    /// without the `cuda` feature, or when `auto` found no ready device).
    pub fn cuda(&self) -> Option<&CudaBackend> {
        self.backends.cuda.as_ref()
    }

    /// The devices whose tensors this runtime runs calls on.
    pub fn devices(&self) -> Devices {
        self.backends.devices()
    }

    /// The configuration the runtime was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The SSU algorithm selected by the configuration.
    pub fn ssu_algorithm(&self) -> ssm_ssu::SsuAlgorithm {
        self.config.ssu_algorithm
    }

    /// Reads and clears the device error word (device-resident indices that were out of
    /// range and skipped). Synchronizes with the device: call it off the hot path.
    /// Always `Ok` without a CUDA backend: CPU plans check host indices before running.
    pub fn check(&self) -> Result<(), Error> {
        self.backends.check()
    }

    /// Runs a planned call (from an op crate's `plan`) on the backend of the device its
    /// tensors live on: the one dispatch path of every op method.
    ///
    /// Errors: [`Error::WrongDevice`] when this runtime has no backend for that device;
    /// else the backend's error (an op without a kernel there: its typed "unsupported").
    pub fn run<A: Op>(&self, call: Planned<A>) -> Result<(), Error>
    where
        CpuBackend: Run<A>,
        CudaBackend: Run<A>,
        Error: From<<CpuBackend as Run<A>>::Error> + From<<CudaBackend as Run<A>>::Error>,
    {
        match (call.device(), &self.backends.cpu, &self.backends.cuda) {
            (Device::Cpu, Some(cpu), _) => Ok(cpu.run(call)?),
            (Device::Cuda(n), _, Some(cuda)) if cuda.ordinal() == n => Ok(cuda.run(call)?),
            (actual, ..) => Err(Error::WrongDevice { op: call.name(), actual, runs_on: self.devices() }),
        }
    }

    /// Plans `args` and runs them: every op method is this one line.
    fn plan_and_run<A: Op>(&self, args: A) -> Result<(), Error>
    where
        CpuBackend: Run<A>,
        CudaBackend: Run<A>,
        Error: From<A::Error> + From<<CpuBackend as Run<A>>::Error> + From<<CudaBackend as Run<A>>::Error>,
    {
        self.run(Planned::new(args)?)
    }

    /// A fresh stochastic-rounding seed (the configured seed, then a counter).
    pub(crate) fn next_seed(&self) -> u64 {
        self.seed_counter.fetch_add(1, Ordering::Relaxed)
    }
}

/// The workspace README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
