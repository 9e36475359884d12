//! Shared pieces of the GPU tests: the skip rule and the tolerance comparison. (Random SSU
//! cases come from the one generator, `ssm_conformance::cases::ssu`.)
#![allow(dead_code, unreachable_pub)]

use ssm_cuda::{Availability, CudaBackend, probe};
use ssm_tensor::{DType, HostTensor};

/// The backend, or `None` after printing why the test is skipped. With `SSM_REQUIRE_GPU=1`
/// a missing GPU or NVRTC fails the test instead.
pub fn gpu(test: &str) -> Option<CudaBackend> {
    let require = std::env::var("SSM_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let reason = match probe() {
        Availability::Ready { .. } if !ssm_cuda::nvrtc_available() => {
            Some("NVRTC (libnvrtc.so.13) not found".to_string())
        }
        Availability::Ready { .. } => None,
        other => Some(other.to_string()),
    };
    if let Some(reason) = reason {
        assert!(!require, "{test}: SSM_REQUIRE_GPU=1 but {reason}");
        eprintln!("skipping {test}: {reason}");
        return None;
    }
    Some(CudaBackend::new(0).unwrap_or_else(|e| panic!("{test}: CUDA backend: {e}")))
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
    let (got, want_dtype, want) = (got.to_f64_vec(), want.dtype, want.to_f64_vec());
    assert_eq!(got.len(), want.len());
    let (atol, rtol) = tolerance(want_dtype);
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
