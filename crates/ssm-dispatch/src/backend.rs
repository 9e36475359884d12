use serde::{Deserialize, Serialize};
use ssm_cpu::{CpuBackend, Par};
use ssm_tensor::Device;

use crate::{Config, Error};

/// Which backends a [`Config`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Both: the CPU backend for host tensors, and the CUDA backend for device tensors when
    /// a device is ready. Each call runs where its tensors live.
    #[default]
    Auto,
    /// The CPU backend only.
    Cpu,
    /// The CUDA backend only.
    Cuda,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(BackendKind::Auto),
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            o => Err(format!("unknown backend `{o}`; expected auto, cpu or cuda")),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Auto => "auto",
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        })
    }
}

#[cfg(feature = "cuda")]
pub use ssm_cuda::CudaBackend;

/// Stand-in for the CUDA backend in builds without the `cuda` feature: it cannot be
/// constructed (`Runtime::new` answers [`Error::NotCompiledWithCuda`] for `cuda`), so it runs
/// every op and can never be reached.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum CudaBackend {}

#[cfg(not(feature = "cuda"))]
impl<A: ssm_tensor::Op> ssm_tensor::Run<A> for CudaBackend {
    type Error = std::convert::Infallible;
    fn run(&self, _call: ssm_tensor::Planned<A>) -> Result<(), Self::Error> {
        match *self {}
    }
}

#[cfg(not(feature = "cuda"))]
impl ssm_gdn::ChunkScratch for CudaBackend {
    fn chunk_gated_delta_rule_scratch_size(&self, _plan: &ssm_gdn::ChunkPlan) -> usize {
        match *self {}
    }
}

#[cfg(not(feature = "cuda"))]
impl CudaBackend {
    /// Unreachable: no value of this type exists.
    pub fn ordinal(&self) -> u32 {
        match *self {}
    }
    fn check(&self) -> Result<(), Error> {
        match *self {}
    }
}

/// The devices a runtime runs calls on: the host (its CPU backend) and at most one CUDA
/// device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Devices {
    /// Host tensors run on the CPU backend.
    pub cpu: bool,
    /// Tensors on this CUDA device run on the CUDA backend.
    pub cuda: Option<u32>,
}

impl Devices {
    /// Whether a call whose tensors live on `device` runs here.
    pub fn contains(&self, device: Device) -> bool {
        match device {
            Device::Cpu => self.cpu,
            Device::Cuda(n) => self.cuda == Some(n),
        }
    }
}

impl std::fmt::Display for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.cpu, self.cuda) {
            (true, Some(n)) => write!(f, "cpu and cuda:{n}"),
            (false, Some(n)) => write!(f, "cuda:{n}"),
            (true, None) => f.write_str("cpu"),
            (false, None) => f.write_str("no device"),
        }
    }
}

/// The backends one runtime drives: built once by `Runtime::new`.
#[derive(Debug)]
pub(crate) struct Backends {
    pub(crate) cpu: Option<CpuBackend>,
    pub(crate) cuda: Option<CudaBackend>,
}

impl Backends {
    pub(crate) fn start(config: &Config) -> Result<Self, Error> {
        match config.backend {
            BackendKind::Cpu => Ok(Backends { cpu: Some(cpu(config)?), cuda: None }),
            BackendKind::Cuda => Ok(Backends { cpu: None, cuda: Some(cuda(config)?) }),
            BackendKind::Auto => {
                let cuda = match cuda(config) {
                    Ok(c) => {
                        log::info!("ssm-dispatch: backend auto -> cpu for host tensors, cuda:{}", config.cuda_device);
                        Some(c)
                    }
                    Err(why) => {
                        log::info!("ssm-dispatch: backend auto -> cpu only ({why})");
                        None
                    }
                };
                Ok(Backends { cpu: Some(cpu(config)?), cuda })
            }
        }
    }

    pub(crate) fn devices(&self) -> Devices {
        Devices { cpu: self.cpu.is_some(), cuda: self.cuda.as_ref().map(|c| c.ordinal()) }
    }

    pub(crate) fn has_cuda(&self) -> bool {
        self.cuda.is_some()
    }

    /// Gives the CUDA backend (if any) the SSU algorithm its calls run.
    pub(crate) fn set_ssu_algorithm(&self, algorithm: ssm_ssu::SsuAlgorithm) {
        #[cfg(feature = "cuda")]
        if let Some(c) = &self.cuda {
            c.set_ssu_algorithm(algorithm);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = algorithm;
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        match &self.cuda {
            #[cfg(feature = "cuda")]
            Some(c) => Ok(c.check()?),
            #[cfg(not(feature = "cuda"))]
            Some(c) => c.check(),
            None => Ok(()),
        }
    }
}

pub(crate) fn cpu(config: &Config) -> Result<CpuBackend, Error> {
    let par = match config.cpu_threads {
        None => Par::all_cores(),
        Some(0) | Some(1) => Par::Seq,
        Some(n) => Par::Threads(std::num::NonZeroUsize::new(n).expect("n > 1")),
    };
    Ok(CpuBackend::new(par)?)
}

#[cfg(feature = "cuda")]
fn cuda(config: &Config) -> Result<CudaBackend, Error> {
    match ssm_cuda::probe() {
        ssm_cuda::Availability::Ready { .. } => Ok(CudaBackend::new(config.cuda_device)?),
        other => Err(Error::NoCudaDevice(other.to_string())),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda(_config: &Config) -> Result<CudaBackend, Error> {
    Err(Error::NotCompiledWithCuda)
}
