//! A decode step with `out` given allocates nothing: planning and the kernel, on one thread
//! and on the pool, once warm (thread-local scratch sized by the first call).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ssm_cpu::{CpuBackend, Par};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, HostTensor, Run};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Count the allocations of every thread (the pooled case: the work runs on pool threads).
static ALL_THREADS: AtomicBool = AtomicBool::new(false);
thread_local! {
    /// Count this thread's allocations (the one-thread case: other threads of the test process,
    /// such as the harness's, may allocate at any time and are not the step's).
    static THIS_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if ALL_THREADS.load(Ordering::Relaxed) || THIS_THREAD.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: delegates every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    let (slots, batch, heads, dim, dstate) = (9, 4, 4, 16, 32);
    let f = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        HostTensor::from_f32(
            DType::BF16,
            shape.to_vec(),
            &(0..n).map(|i| (i % 11) as f32 * 0.05 - 0.2).collect::<Vec<_>>(),
        )
    };
    let mut state =
        HostTensor::from_f32(DType::F32, vec![slots, heads, dim, dstate], &vec![0.25; slots * heads * dim * dstate]);
    let (x, dt, b, c) =
        (f(&[batch, heads, dim]), f(&[batch, heads, 1]), f(&[batch, 2, dstate]), f(&[batch, 2, dstate]));
    let a = HostTensor::from_f32(DType::F32, vec![heads, 1, 1], &[-1.0, -0.5, -2.0, -1.5]);
    let d = HostTensor::from_f32(DType::F32, vec![heads, 1], &[1.0; 4]);
    let sbi = HostTensor::from_i64(DType::I32, vec![batch], &[3, 0, 5, 8]);
    let mut out = HostTensor::filled(DType::BF16, vec![batch, heads, dim], 0.0);
    for par in [Par::Seq, Par::Threads(2.try_into().unwrap())] {
        let cpu = CpuBackend::new(par).unwrap();
        THIS_THREAD.with(|c| c.set(par == Par::Seq));
        ALL_THREADS.store(par != Par::Seq, Ordering::SeqCst);
        let mut step = |_count: bool| -> usize {
            let args = SelectiveStateUpdateArgs {
                d: Some(d.view().expand(&[heads, dim]).unwrap()),
                dt_bias: Some(d.view().expand(&[heads, dim]).unwrap()),
                dt_softplus: true,
                state_batch_indices: Some(sbi.view()),
                pad_slot_id: Some(0),
                ..SelectiveStateUpdateArgs::new(
                    state.view_mut(),
                    x.view(),
                    dt.view().expand(&[batch, heads, dim]).unwrap(),
                    a.view().expand(&[heads, dim, dstate]).unwrap(),
                    b.view(),
                    c.view(),
                    out.view_mut(),
                )
            };
            let before = ALLOCS.load(Ordering::SeqCst);
            cpu.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            ALLOCS.load(Ordering::SeqCst) - before
        };
        // Warm-up: every pool thread sizes its scratch.
        for _ in 0..20 {
            step(false);
        }
        let calls = 310;
        let n: usize = (0..calls).map(|_| step(true)).sum();
        assert_eq!(n, 0, "a warm decode step allocated ({n} in {calls} calls, {par:?})");
        eprintln!("{par:?}: {n} allocations in {calls} calls");
    }
}
