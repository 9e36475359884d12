//! What the two layer cores ([`Runtime::gdn_attention_core`], [`Runtime::mamba2_mixer_core`])
//! share: reading host metadata, sizes with checked arithmetic, slot-table columns, per-call
//! buffers on the device of the call ([`Buffer`]), and the plan-all-then-run driver
//! ([`Schedule`]).
//!
//! A core builds every op's arguments and plans each one exactly once ([`Schedule::plan`]),
//! before any of them runs; only then does [`Schedule::run`] run them in order. So a call that
//! any op refuses returns that op's error with nothing written.
//!
//! Several ops of one core write the same pool (the conv update and the varlen conv both write
//! `conv_state`; the SSU and the SSD, or the two recurrences, write the SSM pool), and one op
//! reads what the previous one writes (the conv output feeds the SSU/SSD or the delta rule).
//! Their planned calls therefore hold views of the same memory at once, made by
//! [`ssm_tensor::TensorMut::aliased`]. Its contract (no two aliases in use at the same time)
//! holds because [`Schedule::run`] runs the steps one after another on this thread: each host
//! backend call returns only when its kernel is done, and the CUDA backend launches every
//! kernel on its one stream, so each starts after the one before has finished. Planning ahead is right because a
//! plan reads only shapes, strides and host index tables, and no op of a core writes an index
//! table or changes a shape: a plan made before an earlier op ran still describes the memory
//! when its op runs.

use ssm_cpu::CpuBackend;
use ssm_tensor::{DType, Device, HostTensor, Op, Planned, Run, TensorMut, TensorRef};

use crate::{CudaBackend, Error, Runtime};

/// A metadata or argument error of a layer core ([`Error::Core`]).
pub(crate) fn core_err(arg: &'static str, problem: String) -> Error {
    Error::Core { arg, problem }
}

/// `t`, or an error saying it must be given `when`.
pub(crate) fn need<'a>(t: Option<TensorRef<'a>>, arg: &'static str, when: &str) -> Result<TensorRef<'a>, Error> {
    t.ok_or_else(|| core_err(arg, format!("must be given {when}")))
}

/// A per-call buffer of a layer core, zero-filled, contiguous, on the device of the call: a host
/// tensor, or a stream-ordered allocation of the CUDA backend (freed, stream-ordered, when
/// dropped, so the kernels queued before still see it).
pub(crate) enum Buffer {
    Host(HostTensor),
    #[cfg(feature = "cuda")]
    Cuda {
        buf: ssm_cuda::DeviceBuffer,
        dtype: DType,
        shape: Vec<usize>,
    },
}

impl Buffer {
    /// A writable contiguous view of the whole buffer.
    pub(crate) fn view_mut(&mut self) -> TensorMut<'_> {
        match self {
            Buffer::Host(t) => t.view_mut(),
            #[cfg(feature = "cuda")]
            Buffer::Cuda { buf, dtype, shape } => {
                buf.view_mut(*dtype, shape, &contiguous_strides(shape), 0).expect("a buffer holds its own shape")
            }
        }
    }
}

#[cfg(feature = "cuda")]
fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![1isize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1] as isize;
    }
    strides
}

impl Runtime {
    /// A zero-filled `shape` buffer of `dtype` on `device` for one call of `op` (sizes checked by
    /// [`product`] first).
    pub(crate) fn buffer(
        &self,
        op: &'static str,
        device: Device,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Buffer, Error> {
        let bytes = product(op, &[product(op, shape)?, dtype.size()])?;
        match (device, self.cuda()) {
            (Device::Cpu, _) if self.cpu().is_some() => {
                Ok(Buffer::Host(HostTensor::filled(dtype, shape.to_vec(), 0.0)))
            }
            #[cfg(feature = "cuda")]
            (Device::Cuda(n), Some(cuda)) if cuda.ordinal() == n => {
                Ok(Buffer::Cuda { buf: ssm_cuda::DeviceBuffer::zeroed(cuda, bytes)?, dtype, shape: shape.to_vec() })
            }
            (actual, _) => {
                let _ = bytes;
                Err(Error::WrongDevice { op, actual, runs_on: self.devices() })
            }
        }
    }
}

/// Entries `[0, n)` of a host 1-D integer (or bool) tensor of at least `n` entries.
pub(crate) fn host_ints(t: &TensorRef<'_>, n: usize, arg: &'static str) -> Result<Vec<i64>, Error> {
    if t.host_bytes().is_none() {
        return Err(core_err(arg, format!("must be a host tensor, got one on {}", t.device())));
    }
    if t.rank() != 1 || t.shape()[0] < n {
        return Err(core_err(arg, format!("must have shape [{n}], got {:?}", t.shape())));
    }
    (0..n).map(|i| t.get_i64(&[i]).map_err(|e| core_err(arg, format!("cannot be read: {e}")))).collect()
}

/// An `[n]` view of column 0 of a `[≥ n]` or `[≥ n, ·]` slot table (on any device): the slot
/// each sequence reads (and, without speculative columns, writes).
pub(crate) fn column0<'a>(t: TensorRef<'a>, n: usize, arg: &'static str) -> Result<TensorRef<'a>, Error> {
    if t.rank() == 0 || t.rank() > 2 || t.shape()[0] < n {
        return Err(core_err(arg, format!("must be a [{n}] or [{n}, ·] table, got {:?}", t.shape())));
    }
    t.with_layout(&[n], &[t.strides()[0]], t.layout().offset())
        .map_err(|e| core_err(arg, format!("cannot be viewed: {e}")))
}

/// `a + b`, or an error naming `arg` (counts from metadata can be anything).
pub(crate) fn add(arg: &'static str, a: usize, b: usize) -> Result<usize, Error> {
    a.checked_add(b).ok_or_else(|| core_err(arg, format!("overflows: {a} + {b}")))
}

/// The product of `dims`, or an error naming `arg`: every size a core allocates goes through
/// it, after the counts were checked against the tensors they describe.
pub(crate) fn product(arg: &'static str, dims: &[usize]) -> Result<usize, Error> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| core_err(arg, format!("has a size that overflows: {dims:?}")))
}

/// Checks that metadata count `n` (`count`) fits in the `rows` rows of `arg`.
pub(crate) fn fits(count: &'static str, n: usize, arg: &'static str, rows: usize) -> Result<(), Error> {
    if n > rows {
        return Err(core_err(count, format!("= {n} exceeds the {rows} rows of `{arg}`")));
    }
    Ok(())
}

type Step<'a> = Box<dyn FnOnce(&Runtime) -> Result<(), Error> + 'a>;

/// The steps of one core call, each op planned once when added; nothing runs before
/// [`Schedule::run`].
pub(crate) struct Schedule<'a> {
    steps: Vec<Step<'a>>,
}

impl<'a> Schedule<'a> {
    pub(crate) fn new() -> Self {
        Schedule { steps: Vec::new() }
    }

    /// Plans `args` (the op's checks, once) and queues the planned call.
    pub(crate) fn plan<A>(&mut self, args: A) -> Result<(), Error>
    where
        A: Op + 'a,
        A::Plan: 'a,
        CpuBackend: Run<A>,
        CudaBackend: Run<A>,
        Error: From<A::Error> + From<<CpuBackend as Run<A>>::Error> + From<<CudaBackend as Run<A>>::Error>,
    {
        let call = Planned::new(args)?;
        self.steps.push(Box::new(move |rt: &Runtime| rt.run(call)));
        Ok(())
    }

    /// Queues a host step that cannot fail (its inputs were checked while planning), run after
    /// the steps queued before it: scattering an op's output rows back, restoring kept rows.
    pub(crate) fn then(&mut self, step: impl FnOnce() + 'a) {
        self.steps.push(Box::new(move |_: &Runtime| {
            step();
            Ok(())
        }));
    }

    /// Runs the queued steps in order, each finished before the next starts.
    pub(crate) fn run(self, rt: &Runtime) -> Result<(), Error> {
        self.steps.into_iter().try_for_each(|step| step(rt))
    }
}
