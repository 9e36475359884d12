use serde::{Deserialize, Serialize};

use crate::BackendKind;

/// Runtime configuration (serde; every field has a default, so `{}` is a valid config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `auto` (CUDA when a device is ready, else CPU), `cpu` or `cuda`.
    pub backend: BackendKind,
    /// CUDA device ordinal.
    pub cuda_device: u32,
    /// CPU threads; `None` uses every available core.
    pub cpu_threads: Option<usize>,
    /// SSU algorithm name, as vLLM's `--mamba-ssu-algorithm`: `auto`, `simple`, `vertical`, `horizontal`.
    pub ssu_algorithm: String,
    /// Stochastically round an fp16 SSU state on its final store, with a seed per call.
    pub stochastic_rounding: bool,
    /// Philox rounds for stochastic rounding (0 = Triton's default of 10).
    pub philox_rounds: u32,
    /// First stochastic-rounding seed; each call takes the next value.
    pub seed: u64,
    /// Enable ReplaySSM (the checkpointing SSU; the ring trackers are plain bookkeeping and
    /// always available); `Runtime::new` refuses it on a backend without a kernel.
    pub replayssm: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Auto,
            cuda_device: 0,
            cpu_threads: None,
            ssu_algorithm: "auto".into(),
            stochastic_rounding: false,
            philox_rounds: 0,
            seed: 0,
            replayssm: false,
        }
    }
}

impl Config {
    /// A CPU configuration with the given thread count.
    pub fn cpu(threads: Option<usize>) -> Self {
        Config { backend: BackendKind::Cpu, cpu_threads: threads, ..Config::default() }
    }
}
