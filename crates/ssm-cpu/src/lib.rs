//! CPU backend of ssm-kernels.
//!
//! Every op family has one file here implementing the backend trait its op crate
//! defines (`ssu.rs` implements [`ssm_ssu::SsuBackend`], …). Work is split over
//! (sequence, head) items on a spinning thread team under an explicit [`Par`] setting; inner loops
//! run on eight f32 lanes chosen at run time ([`simd`]). Kernels trust the plan the
//! op crate built and never re-validate; they allocate nothing per call when the
//! caller provides outputs and scratch.

mod conv;
mod gdn;
mod gemm;
mod host;
mod lanes;
mod ring;
mod rows;
mod shared;
pub mod simd;
mod ssd;
mod ssu;
mod team;

use std::num::NonZeroUsize;

pub use team::DEFAULT_SPIN;

/// How many threads a [`CpuBackend`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Par {
    /// The calling thread only.
    Seq,
    /// A private team of this many threads: the calling thread and `n − 1` helpers
    /// (see [`CpuBackend::with_spin`]).
    Threads(NonZeroUsize),
}

impl Par {
    /// One thread per available core.
    pub fn all_cores() -> Self {
        match std::thread::available_parallelism() {
            Ok(n) if n.get() > 1 => Par::Threads(n),
            _ => Par::Seq,
        }
    }

    /// Number of threads.
    pub fn threads(self) -> usize {
        match self {
            Par::Seq => 1,
            Par::Threads(n) => n.get(),
        }
    }
}

/// Errors of the CPU backend. Plans are trusted, so these only report what a plan
/// cannot rule out: a device tensor handed to the CPU, or a thread pool that would not start.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A tensor is not in host memory.
    #[error("argument `{arg}` lives on {device}; the CPU backend needs host tensors")]
    NotHost {
        /// The argument's name.
        arg: &'static str,
        /// Where it lives.
        device: ssm_tensor::Device,
    },
    /// The thread team could not be started.
    #[error("could not start a pool of {threads} threads: {reason}")]
    Pool {
        /// Threads asked for.
        threads: usize,
        /// The operating system's message.
        reason: String,
    },
}

/// The CPU backend: a thread-team setting shared by every op.
pub struct CpuBackend {
    par: Par,
    team: Option<team::Team>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend").field("par", &self.par).field("simd", &simd::simd_level()).finish()
    }
}

impl CpuBackend {
    /// A backend with the given parallelism (a private team for `Par::Threads`, whose helpers
    /// spin [`DEFAULT_SPIN`] for the next call before they park).
    pub fn new(par: Par) -> Result<Self, CpuError> {
        Self::with_spin(par, DEFAULT_SPIN)
    }

    /// As [`CpuBackend::new`], with the helpers spinning `spin` after each call before they
    /// park. Spinning keeps back-to-back calls (a decode step's layers) free of the wake-up of a
    /// parked thread (60–110 µs on a virtual machine's idle vCPU), at the cost of that much CPU
    /// time per helper after each call; `Duration::ZERO` parks at once.
    pub fn with_spin(par: Par, spin: std::time::Duration) -> Result<Self, CpuError> {
        let team = match par {
            Par::Seq => None,
            Par::Threads(n) => Some(
                team::Team::new(n.get(), spin)
                    .map_err(|e| CpuError::Pool { threads: n.get(), reason: e.to_string() })?,
            ),
        };
        Ok(CpuBackend { par, team })
    }

    /// The parallelism setting.
    pub fn par(&self) -> Par {
        self.par
    }

    /// Runs `f(i)` for every `i in 0..n`, on the team or the calling thread.
    /// Items are independent; each writes only memory it owns. Nothing is allocated.
    pub fn for_each(&self, n: usize, f: impl Fn(usize) + Send + Sync) {
        match &self.team {
            None => (0..n).for_each(f),
            Some(team) => team.run(n, &f),
        }
    }
}

/// Checks that a tensor is in host memory.
pub(crate) fn require_host(arg: &'static str, device: ssm_tensor::Device) -> Result<(), CpuError> {
    match device {
        ssm_tensor::Device::Cpu => Ok(()),
        d => Err(CpuError::NotHost { arg, device: d }),
    }
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
