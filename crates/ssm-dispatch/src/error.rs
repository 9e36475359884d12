use ssm_tensor::Device;

/// Errors of the facade: configuration, backend start-up, and each op's plan or backend error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The SSU arguments were refused by the plan.
    #[error(transparent)]
    Ssu(#[from] ssm_ssu::SsuError),
    /// The causal conv1d arguments were refused by the plan.
    #[error(transparent)]
    Conv(#[from] ssm_conv::ConvError),
    /// The SSD prefill arguments were refused by the plan.
    #[error(transparent)]
    Ssd(#[from] ssm_ssd::SsdError),
    /// The ReplaySSM arguments were refused by the plan.
    #[error(transparent)]
    Ring(#[from] ssm_ring::RingError),
    /// The gated delta rule arguments were refused by the plan.
    #[error(transparent)]
    Gdn(#[from] ssm_gdn::GdnError),
    /// The rows a layer core gathers or scatters were refused (`copy_rows`).
    #[error(transparent)]
    Rows(#[from] ssm_tensor::RowsError),
    /// A ReplaySSM op was called on a runtime configured without ReplaySSM.
    #[error("`{op}` needs a runtime configured with `replayssm: true`")]
    ReplaySsmDisabled {
        /// The op called.
        op: &'static str,
    },
    /// A per-layer core call (`gdn_attention_core`, `mamba2_mixer_core`) got metadata or arguments that do not fit
    /// together; nothing was written.
    #[error("`{arg}` {problem}")]
    Core {
        /// The argument or metadata field.
        arg: &'static str,
        /// What it must be, and what it was.
        problem: String,
    },
    /// The CPU backend failed.
    #[error(transparent)]
    Cpu(#[from] ssm_cpu::CpuError),
    /// The CUDA backend failed.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] ssm_cuda::CudaError),
    /// `cuda` was asked for in a build without the `cuda` feature.
    #[error(
        "backend `cuda` requested, but ssm-dispatch was not compiled with CUDA support (enable the `cuda` feature)"
    )]
    NotCompiledWithCuda,
    /// `cuda` was asked for and no device is ready.
    #[error("backend `cuda` requested, but no CUDA device is ready: {0}")]
    NoCudaDevice(String),
    /// A call's tensors live on a device this runtime has no backend for.
    #[error("the tensors of `{op}` live on {actual}, but this runtime runs calls on {runs_on}")]
    WrongDevice {
        /// The op called.
        op: &'static str,
        /// Where the call's tensors live.
        actual: Device,
        /// Where this runtime runs calls.
        runs_on: crate::Devices,
    },
    /// The backend does not implement this op or option.
    #[error("the {backend} backend does not support {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What is missing.
        what: &'static str,
    },
}

impl From<std::convert::Infallible> for Error {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}
