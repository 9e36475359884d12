use serde::{Deserialize, Serialize};

use ssm_ssu::SsuAlgorithm;

use crate::{BackendKind, Error};

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
    /// SSU algorithm, spelt as vLLM's `--mamba-ssu-algorithm`: `auto`, `simple`, `vertical`,
    /// `horizontal`. An unknown name fails deserialisation; `Runtime::new` refuses one the
    /// chosen backend does not implement (see [`Config::check_ssu_algorithm`]).
    #[serde(with = "ssu_algorithm_name")]
    pub ssu_algorithm: SsuAlgorithm,
    /// Stochastically round an fp16 SSU state on its final store, with a seed per call.
    pub stochastic_rounding: bool,
    /// Philox rounds for stochastic rounding (0 = Triton's default of 10).
    pub philox_rounds: u32,
    /// First stochastic-rounding seed; each call takes the next value.
    pub seed: u64,
    /// Enable ReplaySSM (the checkpointing SSU; the ring trackers are plain bookkeeping and
    /// always available); both backends have its kernels.
    pub replayssm: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Auto,
            cuda_device: 0,
            cpu_threads: None,
            ssu_algorithm: SsuAlgorithm::Auto,
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

    /// Refuses an SSU algorithm that the started backends cannot honour. The algorithms name
    /// GPU tilings (`simple`, `vertical`, `horizontal`; `auto` picks per shape), which the
    /// CUDA backend has; the CPU backend has one kernel. So `auto` and `simple` are always
    /// accepted, and `vertical` and `horizontal` need a CUDA backend (`has_cuda`): without one
    /// they would select nothing, and are refused rather than silently ignored. With one, host
    /// tensors (backend `auto`) still run the CPU's kernel, whose results every tiling equals.
    ///
    /// Errors: [`Error::Unsupported`] naming the CPU backend and the algorithm.
    pub fn check_ssu_algorithm(&self, has_cuda: bool) -> Result<(), Error> {
        let what = match self.ssu_algorithm {
            SsuAlgorithm::Auto | SsuAlgorithm::Simple => return Ok(()),
            _ if has_cuda => return Ok(()),
            SsuAlgorithm::Vertical => "the `vertical` SSU algorithm (a GPU tiling; the CPU has one SSU kernel)",
            SsuAlgorithm::Horizontal => "the `horizontal` SSU algorithm (a GPU tiling; the CPU has one SSU kernel)",
        };
        Err(Error::Unsupported { backend: "cpu", what })
    }
}

/// Serde for [`SsuAlgorithm`] by vLLM's name (the op crate has no serde dependency). An unknown
/// name is refused with the op crate's own error text, which lists the valid names.
mod ssu_algorithm_name {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};
    use ssm_ssu::SsuAlgorithm;

    pub(super) fn serialize<S: Serializer>(algorithm: &SsuAlgorithm, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(algorithm.name())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SsuAlgorithm, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(D::Error::custom)
    }
}
