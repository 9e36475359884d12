//! Tests that run on any machine: probing, error rendering and (where NVRTC can be loaded)
//! compiling kernel specialisations without a GPU.

use ssm_cuda::cudarc::driver::sys::CUresult;
use ssm_cuda::ssu::ssu_catalogue;
use ssm_cuda::{Arch, Availability, Compiler, CudaError, DeviceErrors, probe};

#[test]
fn probe_never_panics_and_errors_render_without_a_driver() {
    let a = probe();
    assert!(!a.to_string().is_empty());
    if a == Availability::NoDriver {
        // Constructing a backend reports the missing driver instead of panicking.
        assert!(matches!(ssm_cuda::CudaBackend::new(0), Err(CudaError::NoDriver)));
    }
    // Rendering a driver error uses the code's name only (no call into libcuda).
    let e = CudaError::Driver { call: "cuLaunchKernel", code: CUresult::CUDA_ERROR_ILLEGAL_ADDRESS };
    let s = e.to_string();
    assert!(s.contains("CUDA_ERROR_ILLEGAL_ADDRESS") && s.contains("700") && s.contains("cuLaunchKernel"), "{s}");
    let w = CudaError::InvalidIndices(DeviceErrors(DeviceErrors::SLOT | DeviceErrors::CU_SEQLENS)).to_string();
    assert!(w.contains("slot index") && w.contains("cu_seqlens") && w.contains("0x3"), "{w}");
}

#[test]
fn kernel_specialisations_compile_with_nvrtc() {
    if !ssm_cuda::nvrtc_available() {
        let require = std::env::var("SSM_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(!require, "SSM_REQUIRE_NVRTC=1 but libnvrtc could not be loaded");
        eprintln!("skipping kernel_specialisations_compile_with_nvrtc: NVRTC (libnvrtc.so.13) not found");
        return;
    }
    let compiler = Compiler::new(Arch::SM90, None);
    let catalogue = ssu_catalogue();
    // A sample here (the whole catalogue for sm_80 and sm_90 is `cargo xtask build-kernels`).
    for (label, spec) in catalogue.iter().step_by(7) {
        let k = compiler.cubin(spec).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(k.cubin.starts_with(b"\x7fELF"), "{label}: not an ELF cubin");
    }
    // A broken specialisation reports the log, the options and the specialisation.
    let mut bad = catalogue[0].1.clone();
    bad.defines.retain(|(k, _)| *k != "DSTATE");
    match compiler.cubin(&bad) {
        Err(CudaError::Compile { spec, options, log }) => {
            assert!(spec.contains("ssu.cu:ssu_kernel"), "{spec}");
            assert!(options.contains("--gpu-architecture=sm_90"), "{options}");
            assert!(log.contains("DSTATE"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
