use cudarc::driver::sys::CUresult;
use cudarc::nvrtc::sys::nvrtcResult;

/// Errors of the CUDA backend.
///
/// Driver and NVRTC failures keep the raw result code and render it from the code's name
/// alone: formatting one never calls into a driver that may be missing (cudarc's own
/// `DriverError` calls `cuGetErrorString` when formatted).
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No CUDA driver library (`libcuda.so`) could be loaded.
    #[error("no CUDA driver: libcuda could not be loaded")]
    NoDriver,
    /// The driver loaded but reports no device (or not this ordinal).
    #[error("no CUDA device with ordinal {ordinal} (devices found: {found})")]
    NoDevice {
        /// Ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports.
        found: usize,
    },
    /// NVRTC (`libnvrtc.so.13` or `.12`) could not be loaded.
    #[error(
        "NVRTC could not be loaded (libnvrtc.so.13 / .12); install the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel and put its lib dir on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {code:?} ({})", *code as u32)]
    Driver {
        /// The driver function (or cudarc operation) that failed.
        call: &'static str,
        /// The raw result code.
        code: CUresult,
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("NVRTC call {call} failed: {code:?}")]
    Nvrtc {
        /// The NVRTC function that failed.
        call: &'static str,
        /// The raw result code.
        code: nvrtcResult,
    },
    /// NVRTC rejected a kernel specialisation. The message carries the log (whose
    /// `file(line)` positions name `common.cuh` or the kernel file, thanks to the `#line`
    /// markers of [`crate::compile::translation_unit`]), the options, and where the full
    /// translation unit was written.
    #[error("NVRTC could not compile {spec}\noptions: {options}\nsource: {source_dump}\n--- log ---\n{log}")]
    Compile {
        /// The specialisation (kernel and its macros).
        spec: String,
        /// The full option list passed to NVRTC.
        options: String,
        /// NVRTC's program log.
        log: String,
        /// The translation unit NVRTC was given (common helpers, kernel and `#line` markers).
        translation_unit: String,
        /// Where a copy of the translation unit was written, with the options in a trailing
        /// comment (or why it could not be).
        source_dump: String,
    },
    /// A planned call's tensors are not on this backend's device.
    #[error("the tensors of `{op}` live on {actual}; this CUDA backend runs on {expected}")]
    WrongDevice {
        /// The op.
        op: &'static str,
        /// The backend's device.
        expected: ssm_tensor::Device,
        /// Where the tensor lives.
        actual: ssm_tensor::Device,
    },
    /// A kernel flagged invalid index values (see [`DeviceErrors`]).
    #[error("a kernel skipped rows with invalid index values: {0}")]
    InvalidIndices(DeviceErrors),
    /// An op this backend has no kernel for yet.
    #[error(transparent)]
    Op(#[from] ssm_tensor::Unsupported),
    /// A size or option this backend's kernels do not implement.
    #[error("not supported by the CUDA backend: {0}")]
    Unsupported(String),
}

impl CudaError {
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
        move |e| CudaError::Driver { call, code: e.0 }
    }
}

/// Bits of the device error word, set by kernels that met invalid index values on the device
/// (the row was skipped; nothing was written for it). Read and cleared by
/// [`crate::CudaBackend::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceErrors(pub u32);

impl DeviceErrors {
    /// A slot index (`state_batch_indices` / `dst_state_batch_indices`) outside `[0, slots)` and
    /// not the pad (or, for a conv checkpoint, the sequence's own slot); or an SSU
    /// intermediate-buffer entry outside the buffer.
    pub const SLOT: u32 = 1;
    /// `cu_seqlens` not non-decreasing within `[0, rows]` (or, for `checkpointing_ssu`, a
    /// sequence longer than its window's `max_seqlen`; for the SSD prefill, a chunk of
    /// `cu_chunk_seqlens` empty, outside `[0, tokens]` or longer than the chunk, a
    /// `seq_idx` / `last_chunk_indices` entry out of range, or a `checkpoint_chunk_indices`
    /// entry neither -1 nor a chunk of its sequence; for `causal_conv1d_fn`, a
    /// `checkpoint_offsets` entry neither 0 nor inside its sequence).
    pub const CU_SEQLENS: u32 = 2;
    /// `num_accepted_tokens` (or the sequence length in speculative mode) beyond the slot table's
    /// width; or an SSU sequence longer than the intermediate buffer's steps.
    pub const ACCEPTED: u32 = 4;
    /// A prefix-caching column (`initial_state_idx` / `block_idx_last_scheduled_token`) outside the slot table's width.
    pub const COLUMN: u32 = 8;
    /// A ReplaySSM cursor outside the ring: `ring_start` outside `[0, L)` or
    /// `prev_num_accepted_tokens` outside `[0, W]`.
    pub const CURSOR: u32 = 16;
    /// A row index of `copy_rows` (a layer core's token index list) outside the rows of the
    /// tensor it addresses.
    pub const ROW: u32 = 32;
}

impl std::fmt::Display for DeviceErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.0 & Self::SLOT != 0 {
            parts.push(
                "slot index outside [0, slots) and not the pad (or an intermediate-buffer entry outside the buffer)",
            );
        }
        if self.0 & Self::CU_SEQLENS != 0 {
            parts.push(
                "cu_seqlens decreasing, outside [0, rows] or a sequence longer than its window, or SSD chunk metadata out of range",
            );
        }
        if self.0 & Self::ACCEPTED != 0 {
            parts.push(
                "num_accepted_tokens or sequence length beyond the slot table's width (or the intermediate buffer's steps)",
            );
        }
        if self.0 & Self::COLUMN != 0 {
            parts.push("prefix-caching column outside the slot table's width");
        }
        if self.0 & Self::CURSOR != 0 {
            parts.push("ReplaySSM cursor outside the ring (ring_start) or the window (prev_num_accepted_tokens)");
        }
        if self.0 & Self::ROW != 0 {
            parts.push("token row index outside the rows of the tensor it addresses");
        }
        write!(f, "{} (word {:#x})", parts.join("; "), self.0)
    }
}
