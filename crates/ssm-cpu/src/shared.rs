//! The two things work items share: output memory that several items write at disjoint
//! elements ([`SharedBuf`]), and per-item f32 scratch sized from the plan's dimensions and the
//! [`crate::Par`] setting alone ([`Scratch`], [`CpuBackend::for_each_scratch`]).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::CpuBackend;
use crate::simd::{PowTwo, Simd, SimdKernel, dispatch};

/// A raw view of a buffer that several work items write, each at elements no other item
/// touches at the same time (the plan's disjointness: one item per (sequence, head) output row,
/// state slots refused when shared by two sequences and written by one, per-worker scratch).
///
/// Every access is bounds-checked with `debug_assert!` (release builds trust the plan); each
/// method that hands out memory is `unsafe` because only the caller knows the elements are its
/// own now.
pub(crate) struct SharedBuf<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for SharedBuf<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedBuf<T> {}

// SAFETY: items only access, through this pointer, elements that the plan assigns to them alone
// while they run (see the type's doc), so sharing it across threads creates no data race.
unsafe impl<T: Send> Send for SharedBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedBuf<T> {}

impl<T> SharedBuf<T> {
    /// A view of all of `s`.
    pub(crate) fn new(s: &mut [T]) -> Self {
        SharedBuf { ptr: s.as_mut_ptr(), len: s.len() }
    }

    /// The same memory as elements of `U` (a byte buffer of a known dtype, seen typed).
    pub(crate) fn cast<U>(self) -> SharedBuf<U> {
        debug_assert!(self.ptr.cast::<U>().is_aligned(), "buffer not aligned for its element type");
        SharedBuf { ptr: self.ptr.cast(), len: self.len * std::mem::size_of::<T>() / std::mem::size_of::<U>() }
    }

    /// Elements in the buffer.
    #[inline(always)]
    pub(crate) fn len(self) -> usize {
        self.len
    }

    /// The same memory seen as elements of `U` (for byte buffers of a run-time dtype), element
    /// offset `off` of `U` onwards, `n` elements: the pointer to element `off`, bounds-checked in
    /// debug builds. Creating the pointer is safe; reading or writing through it is the caller's
    /// `unsafe` (in bounds by the plan, exclusive by the plan's disjointness, aligned for `U`).
    #[inline(always)]
    pub(crate) fn elems<U>(self, off: usize, n: usize) -> *mut U {
        debug_assert!(
            (off + n) * std::mem::size_of::<U>() <= self.len * std::mem::size_of::<T>(),
            "elements {off}..{} of {} bytes",
            off + n,
            self.len * std::mem::size_of::<T>()
        );
        self.ptr.cast::<U>().wrapping_add(off)
    }

    /// Elements `off..off + n`, borrowed mutably.
    ///
    /// # Safety
    /// No other thread and no other live reference accesses those elements until the slice is dropped.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<'s>(self, off: usize, n: usize) -> &'s mut [T] {
        debug_assert!(off + n <= self.len, "elements {off}..{} of {}", off + n, self.len);
        // SAFETY: in bounds (plan; checked in debug builds) and exclusive (caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), n) }
    }

    /// Element `i`.
    ///
    /// # Safety
    /// `i` is in bounds and no other thread writes element `i` now.
    #[inline(always)]
    pub(crate) unsafe fn read(self, i: usize) -> T
    where
        T: Copy,
    {
        debug_assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: in bounds and not written concurrently (caller's contract).
        unsafe { self.ptr.add(i).read() }
    }

    /// Writes element `i`.
    ///
    /// # Safety
    /// `i` is in bounds and no other thread reads or writes element `i` now.
    #[inline(always)]
    pub(crate) unsafe fn write(self, i: usize, v: T) {
        debug_assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: in bounds and exclusive (caller's contract).
        unsafe { self.ptr.add(i).write(v) }
    }
}

/// f32 elements a work item may keep on its own stack (96 KiB: the GDN decode tile with its
/// vectors, an SSU head's per-token vectors, a ReplaySSM window): no allocation on the decode path.
pub(crate) const STACK_SCRATCH: usize = 24 * 1024;

/// One work item's f32 scratch: a stack buffer, or a worker's region of a per-call or caller-owned
/// buffer. Contents are unspecified; [`Scratch::take`] zeroes what was never written before.
pub(crate) struct Scratch<'s> {
    buf: &'s mut [MaybeUninit<f32>],
    /// Length of the prefix known to hold initialised f32 values.
    init: usize,
}

impl<'s> Scratch<'s> {
    fn uninit(buf: &'s mut [MaybeUninit<f32>]) -> Self {
        Scratch { buf, init: 0 }
    }

    /// Elements available.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// The first `n` elements (contents left by earlier items of this worker, or zeros).
    ///
    /// # Panics
    /// If `n` exceeds the size the caller of [`CpuBackend::for_each_scratch`] asked for.
    #[inline(always)]
    pub(crate) fn take(&mut self, n: usize) -> &mut [f32] {
        assert!(n <= self.buf.len(), "scratch of {} elements, {n} asked", self.buf.len());
        if self.init < n {
            self.buf[self.init..n].iter_mut().for_each(|x| {
                x.write(0.0);
            });
            self.init = n;
        }
        // SAFETY: elements 0..n are initialised (written above or before, tracked by `init`), and
        // f32 has no invalid bit patterns; the borrow of `self` keeps the slice exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<f32>(), n) }
    }
}

impl CpuBackend {
    /// Runs `f(i, scratch)` for every `i in 0..n` (on the pool, or in order on the calling thread
    /// when `in_order`), each call with at least `per_item` f32 of scratch.
    ///
    /// Where the scratch comes from depends on `per_item` and `given` alone: `given` (the caller's
    /// buffer, split into one region per worker) when it holds `workers · per_item` elements;
    /// else a stack buffer per item when `per_item ≤ STACK_SCRATCH` (nothing allocated); else
    /// one allocation of `workers · per_item` per call. `workers` is the pool size capped by `n`
    /// ([`Self::scratch_len`]). `f` must not contain lane code (a closure loses the caller's
    /// target features): it calls `dispatch`.
    pub(crate) fn for_each_scratch<F>(&self, n: usize, per_item: usize, in_order: bool, given: Option<&mut [f32]>, f: F)
    where
        F: Fn(usize, &mut Scratch<'_>) + Send + Sync,
    {
        if n == 0 {
            return;
        }
        let workers = if in_order { 1 } else { self.scratch_workers(n) };
        let need = workers * per_item;
        let mut owned = Vec::new();
        let region = match given {
            Some(g) if g.len() >= need => {
                let all = &mut g[..need];
                // SAFETY: `MaybeUninit<f32>` has the layout of f32; the slice is only written with
                // f32 values, so it stays initialised for the caller.
                let all = unsafe { std::slice::from_raw_parts_mut(all.as_mut_ptr().cast::<MaybeUninit<f32>>(), need) };
                Some((all, per_item))
            }
            _ if per_item <= STACK_SCRATCH => None,
            _ => {
                owned.resize(need, MaybeUninit::<f32>::uninit());
                Some((&mut owned[..], 0))
            }
        };
        match region {
            None => {
                let item = |i: usize| {
                    let mut stack = [MaybeUninit::<f32>::uninit(); STACK_SCRATCH];
                    f(i, &mut Scratch::uninit(&mut stack[..per_item]));
                };
                if in_order { (0..n).for_each(item) } else { self.for_each(n, item) }
            }
            Some((all, init)) => {
                let all = SharedBuf::new(all);
                let next = AtomicUsize::new(0);
                let worker = |w: usize| {
                    // SAFETY: worker `w` runs once and owns region [w·per_item, (w+1)·per_item).
                    let mine = unsafe { all.slice_mut(w * per_item, per_item) };
                    let mut scratch = Scratch { buf: mine, init: init.min(per_item) };
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        f(i, &mut scratch);
                    }
                };
                if in_order { worker(0) } else { self.for_each(workers, worker) }
            }
        }
    }

    /// Workers that [`Self::for_each_scratch`] gives a scratch region for `n` items.
    pub(crate) fn scratch_workers(&self, n: usize) -> usize {
        self.par().threads().min(n).max(1)
    }
}

/// The body of an op for one work item (a (sequence, head) pair, a chunk, …). Implementations
/// mark `run_item` `#[inline(always)]` so that it compiles inside the dispatched,
/// feature-enabled caller.
pub(crate) trait ItemOp: Sync {
    fn run_item<S: Simd + PowTwo>(&self, item: usize, scratch: &mut Scratch<'_>);
}

/// One work item of an [`ItemOp`], run with the lanes [`dispatch`] picks.
struct OpItem<'c, 's, 't, C> {
    op: &'c C,
    item: usize,
    scratch: &'s mut Scratch<'t>,
}

impl<C: ItemOp> SimdKernel for OpItem<'_, '_, '_, C> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        self.op.run_item::<S>(self.item, self.scratch)
    }
}

impl CpuBackend {
    /// Runs items `0..n` of `op` in parallel, each with `per_item` f32 of scratch (from `given`
    /// when it is large enough; see [`CpuBackend::for_each_scratch`]).
    pub(crate) fn for_each_item<C: ItemOp>(&self, n: usize, per_item: usize, given: Option<&mut [f32]>, op: &C) {
        self.for_each_scratch(n, per_item, false, given, |item, scratch| dispatch(OpItem { op, item, scratch }));
    }
}
