//! What the two layer cores ([`Runtime::gdn_attention_core`], [`Runtime::mamba2_mixer_core`])
//! share: reading host metadata, sizes with checked arithmetic, slot-table columns, and the
//! plan-all-then-run driver ([`Schedule`]).
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
//! holds because [`Schedule::run`] runs the steps one after another on this thread and each
//! host backend call returns only when its kernel is done. Planning ahead is right because a
//! plan reads only shapes, strides and host index tables, and no op of a core writes an index
//! table or changes a shape: a plan made before an earlier op ran still describes the memory
//! when its op runs.

use ssm_cpu::CpuBackend;
use ssm_tensor::{Op, Planned, Run, TensorRef};

use crate::{CudaBackend, Error, Runtime};

/// A metadata or argument error of a layer core ([`Error::Core`]).
pub(crate) fn core_err(arg: &'static str, problem: String) -> Error {
    Error::Core { arg, problem }
}

/// `t`, or an error saying it must be given `when`.
pub(crate) fn need<'a>(t: Option<TensorRef<'a>>, arg: &'static str, when: &str) -> Result<TensorRef<'a>, Error> {
    t.ok_or_else(|| core_err(arg, format!("must be given {when}")))
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

/// An `[n]` view of column 0 of a host `[≥ n]` or `[≥ n, ·]` slot table: the slot each
/// sequence reads (and, without speculative columns, writes).
pub(crate) fn column0<'a>(t: TensorRef<'a>, n: usize, arg: &'static str) -> Result<TensorRef<'a>, Error> {
    if t.host_bytes().is_none() || t.rank() == 0 || t.rank() > 2 || t.shape()[0] < n {
        return Err(core_err(arg, format!("must be a host [{n}] or [{n}, ·] table, got {:?}", t.shape())));
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
