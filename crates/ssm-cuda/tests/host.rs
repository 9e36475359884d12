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
        Err(CudaError::Compile { spec, options, log, .. }) => {
            assert!(spec.contains("ssu.cu:ssu_kernel"), "{spec}");
            assert!(options.contains("--gpu-architecture=sm_90"), "{options}");
            assert!(log.contains("DSTATE"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// Whether NVRTC can be loaded; without it (and without `SSM_REQUIRE_NVRTC=1`) the calling
/// test prints why it skips.
fn nvrtc_or_skip(test: &str) -> bool {
    if ssm_cuda::nvrtc_available() {
        return true;
    }
    let require = std::env::var("SSM_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(!require, "SSM_REQUIRE_NVRTC=1 but libnvrtc could not be loaded");
    eprintln!("skipping {test}: NVRTC (libnvrtc.so.13) not found");
    false
}

#[test]
fn compile_errors_name_the_real_file_and_line() {
    use ssm_cuda::compile::{COMMON_SOURCE, COPY_SOURCE, translation_unit};
    if !nvrtc_or_skip("compile_errors_name_the_real_file_and_line") {
        return;
    }
    // Breaks line `line` (1-based) of `text` by appending an undefined identifier to it.
    fn broken(text: &str, line: usize, ident: &str) -> String {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines[line - 1].push_str(&format!(" static int {ident}_use = {ident};"));
        lines.join("\n") + "\n"
    }
    let options = ssm_cuda::compile::copy_kernel_spec().options(Arch::SM90);
    let common_line = COMMON_SOURCE.lines().position(|l| l.starts_with("typedef unsigned int u32")).unwrap() + 1;
    // A blank line between the preprocessor block and the kernel: plain code there compiles.
    let endif = COPY_SOURCE.lines().position(|l| l.starts_with("#endif")).unwrap();
    let body_line = endif + 1 + COPY_SOURCE.lines().skip(endif).position(str::is_empty).unwrap();
    for (common, body, file, line, ident) in [
        (
            broken(COMMON_SOURCE, common_line, "not_in_common"),
            COPY_SOURCE.to_string(),
            "common.cuh",
            common_line,
            "not_in_common",
        ),
        (COMMON_SOURCE.to_string(), broken(COPY_SOURCE, body_line, "not_in_copy"), "copy.cu", body_line, "not_in_copy"),
    ] {
        let unit = translation_unit(&common, "copy.cu", &body);
        let e = ssm_cuda::nvrtc::compile_cubin(&unit, "copy.cu", &options, "copy.cu:copy_u128 (broken)").unwrap_err();
        let CudaError::Compile { log, translation_unit, source_dump, .. } = &e else {
            panic!("expected a compile error, got {e:?}");
        };
        let at = format!("{file}({line})");
        assert!(log.lines().any(|l| l.contains(&at) && l.contains(ident)), "log does not point at {at}:\n{log}");
        assert_eq!(translation_unit, &unit);
        let shown = e.to_string();
        for part in [&at, "--gpu-architecture=sm_90", "-std=c++17", source_dump.as_str()] {
            assert!(shown.contains(part), "the message lacks {part:?}:\n{shown}");
        }
        let path = source_dump.split(" (").next().unwrap();
        let dumped = std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{source_dump}: {err}"));
        assert!(dumped.starts_with(&unit) && dumped.contains("// NVRTC options: --gpu-architecture=sm_90"), "{path}");
        std::fs::remove_file(path).unwrap();
    }
}
