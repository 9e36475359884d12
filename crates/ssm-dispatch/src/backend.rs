use serde::{Deserialize, Serialize};
use ssm_cpu::{CpuBackend, Par};
use ssm_tensor::Device;

use crate::{Config, Error};

/// Which backend a [`Config`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA when a device is ready, else CPU.
    #[default]
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend.
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
/// constructed, and `Runtime::new` answers [`Error::NotCompiledWithCuda`] instead.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum CudaBackend {}

/// The backend a runtime drives.
// One per runtime, built once and never moved on a hot path: the variants' size difference
// costs nothing, and boxing would only add an indirection to every call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Backend {
    /// Host tensors, SIMD + threads.
    Cpu(CpuBackend),
    /// Device tensors on one CUDA device.
    Cuda(CudaBackend),
}

impl Backend {
    pub(crate) fn start(config: &Config) -> Result<Self, Error> {
        match config.backend {
            BackendKind::Cpu => Self::cpu(config),
            BackendKind::Cuda => Self::cuda(config),
            BackendKind::Auto => {
                #[cfg(feature = "cuda")]
                {
                    match ssm_cuda::probe() {
                        ssm_cuda::Availability::Ready { .. } => {
                            log::info!("ssm-dispatch: backend auto -> cuda:{}", config.cuda_device);
                            return Self::cuda(config);
                        }
                        other => log::info!("ssm-dispatch: backend auto -> cpu ({other})"),
                    }
                }
                #[cfg(not(feature = "cuda"))]
                log::info!("ssm-dispatch: backend auto -> cpu (built without the cuda feature)");
                Self::cpu(config)
            }
        }
    }

    fn cpu(config: &Config) -> Result<Self, Error> {
        let par = match config.cpu_threads {
            None => Par::all_cores(),
            Some(0) | Some(1) => Par::Seq,
            Some(n) => Par::Rayon(std::num::NonZeroUsize::new(n).expect("n > 1")),
        };
        Ok(Backend::Cpu(CpuBackend::new(par)?))
    }

    #[cfg(feature = "cuda")]
    fn cuda(config: &Config) -> Result<Self, Error> {
        match ssm_cuda::probe() {
            ssm_cuda::Availability::Ready { .. } => Ok(Backend::Cuda(CudaBackend::new(config.cuda_device)?)),
            other => Err(Error::NoCudaDevice(other.to_string())),
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_config: &Config) -> Result<Self, Error> {
        Err(Error::NotCompiledWithCuda)
    }

    /// Which kind of backend this is.
    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Cpu(_) => BackendKind::Cpu,
            Backend::Cuda(_) => BackendKind::Cuda,
        }
    }

    /// The device its tensors must live on.
    pub fn device(&self) -> Device {
        match self {
            Backend::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Device::Cuda(c.ordinal()),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        match self {
            Backend::Cpu(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Ok(c.check()?),
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda(c) => match *c {},
        }
    }
}
