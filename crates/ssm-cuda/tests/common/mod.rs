//! Shared pieces of the GPU tests: the skip rule, the tolerance comparison, and the graph-replay
//! and no-allocation checks every op's staging ([`StageArgs`]) runs through. (Random SSU
//! cases come from the one generator, `ssm_conformance::cases::ssu`.)
#![allow(dead_code, unreachable_pub)]

use ssm_cuda::CudaBackend;
use ssm_cuda::cudarc::driver::sys;
use ssm_cuda::testing::{StageArgs, gpu_ready};
use ssm_tensor::{DType, HostTensor};

/// The backend, or `None` after printing why the test is skipped. With `SSM_REQUIRE_GPU=1`
/// a missing GPU or NVRTC fails the test instead.
pub fn gpu(test: &str) -> Option<CudaBackend> {
    gpu_ready(test).then(|| CudaBackend::new(0).unwrap_or_else(|e| panic!("{test}: CUDA backend: {e}")))
}

/// Absolute and relative tolerance for values stored as `dtype`.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-4, 2e-4),
        DType::F16 => (4e-3, 4e-3),
        _ => (3.2e-2, 1.6e-2),
    }
}

/// Compares two tensors element by element (memory order): NaN must match NaN (unwritten
/// poison), other values within the tolerance of `dtype`. Returns the first mismatch.
pub fn compare(what: &str, got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    let (atol, rtol) = tolerance(want.dtype);
    compare_within(what, got, want, atol, rtol)
}

/// [`compare`] with an explicit absolute and relative tolerance.
pub fn compare_within(what: &str, got: &HostTensor, want: &HostTensor, atol: f64, rtol: f64) -> Result<(), String> {
    let (got, want) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if w.is_nan() || g.is_nan() {
            if !(w.is_nan() && g.is_nan()) {
                return Err(format!("{what}[{i}]: got {g}, want {w} (one is unwritten)"));
            }
            continue;
        }
        let err = (g - w).abs();
        if err > atol + rtol * w.abs() {
            return Err(format!("{what}[{i}]: got {g}, want {w} (|err| {err:.3e}, tol {:.3e})", atol + rtol * w.abs()));
        }
    }
    Ok(())
}

/// A call captured in a CUDA graph and replayed `reps` times leaves the same bytes as `reps`
/// eager calls. `host` is staged twice (eager and graphed copies); `prewarm` loads the kernel
/// before the capture; `written` downloads what the op writes (state, out) for the comparison.
pub fn assert_graph_replay_equals_eager<S: StageArgs>(
    be: &CudaBackend,
    host: &S::Args<'_>,
    reps: usize,
    prewarm: impl FnOnce(S::Args<'_>),
    written: impl Fn(&mut S) -> Vec<Vec<u8>>,
) {
    let mut eager = S::upload(be, host).unwrap();
    let mut graphed = S::upload(be, host).unwrap();
    prewarm(graphed.args().unwrap());
    for _ in 0..reps {
        S::launch(be, eager.args().unwrap()).unwrap();
    }
    be.synchronize().unwrap();
    let stream = be.stream().clone();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    S::launch(be, graphed.args().unwrap()).unwrap();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    for _ in 0..reps {
        graph.launch().unwrap();
    }
    be.synchronize().unwrap();
    be.check().unwrap();
    assert_eq!(written(&mut eager), written(&mut graphed), "eager and graph-replayed results differ");
}

/// With every tensor on the device, calls allocate no device memory: free memory is unchanged
/// over 200 calls, after a first call loaded the kernel.
pub fn assert_calls_allocate_no_device_memory<S: StageArgs>(be: &CudaBackend, host: &S::Args<'_>) {
    let mut dev = S::upload(be, host).unwrap();
    S::launch(be, dev.args().unwrap()).unwrap();
    be.synchronize().unwrap();
    assert_free_memory_unchanged(be, "calls", || S::launch(be, dev.args().unwrap()).unwrap());
    be.check().unwrap();
}

/// The device's free memory is the same before and after 200 `call`s (then synchronized), in
/// at least one of three tries. Free memory is the whole device's: another process on the
/// GPU (or a test of this binary on another thread) moves it too, while an allocation of ours
/// in each call would lower it in every try.
pub fn assert_free_memory_unchanged(be: &CudaBackend, what: &str, mut call: impl FnMut()) {
    let mut seen = Vec::new();
    for _ in 0..3 {
        be.synchronize().unwrap();
        let (before, _) = be.mem_info().unwrap();
        for _ in 0..200 {
            call();
        }
        be.synchronize().unwrap();
        let (after, _) = be.mem_info().unwrap();
        if before == after {
            return;
        }
        seen.push((before, after));
    }
    panic!("device memory changed over 200 {what} in each of 3 tries (free before, after): {seen:?}");
}
