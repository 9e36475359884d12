//! NVRTC, the lowest layer: CUDA C++ source → cubin for one architecture.
//!
//! cudarc's safe NVRTC API returns PTX only; a cubin for the exact device (no driver JIT, no
//! PTX-version mismatch with an older driver) comes from the `sys` layer, wrapped here.

use std::ffi::{CString, c_char, c_int};
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::nvrtc::{result, sys};

use crate::CudaError;

/// Whether NVRTC can be loaded. Never panics.
pub fn nvrtc_available() -> bool {
    // SAFETY: `is_culib_present` only tries `dlopen` on candidate names; it resolves no symbol.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Nvrtc { call: "nvrtcVersion", code: e.0 })?;
    Ok((major, minor))
}

/// The architectures this NVRTC can target, as compute capabilities × 10 (`90` = sm_90).
pub fn supported_archs() -> Result<Vec<i32>, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let mut n: c_int = 0;
    // SAFETY: library present; `n` is valid for writes.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| CudaError::Nvrtc { call: "nvrtcGetNumSupportedArchs", code: e.0 })?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    // SAFETY: `archs` has room for the `n` entries NVRTC just reported.
    unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| CudaError::Nvrtc { call: "nvrtcGetSupportedArchs", code: e.0 })?;
    Ok(archs)
}

/// Result of one NVRTC compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The cubin (an ELF image for one SM architecture).
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings), possibly empty.
    pub log: String,
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `source` with `options` (which must name the architecture with
/// `--gpu-architecture=sm_XX`) to a cubin. `spec` names the specialisation in errors.
pub fn compile_cubin(source: &str, name: &str, options: &[String], spec: &str) -> Result<Compiled, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let src = CString::new(source).map_err(|_| CudaError::Unsupported("kernel source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| CudaError::Unsupported("kernel name contains a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&cname))
        .map_err(|e| CudaError::Nvrtc { call: "nvrtcCreateProgram", code: e.0 })?;
    // SAFETY: `prog` was created above and is destroyed exactly once, below, on every path;
    // `src` and `cname` outlive it.
    let compiled = unsafe { result::compile_program(prog, options) };
    // SAFETY: `prog` is live (see above).
    let log = unsafe { result::get_program_log(prog) }.map(|l| c_chars_to_string(&l)).unwrap_or_default();
    let out = match compiled {
        Err(_) => {
            let options = options.join(" ");
            let source_dump = dump_failed_source(source, name, &options);
            Err(CudaError::Compile {
                spec: spec.to_string(),
                options,
                log,
                translation_unit: source.into(),
                source_dump,
            })
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled successfully; `size` is valid for writes.
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| CudaError::Nvrtc { call: "nvrtcGetCUBINSize", code: e.0 })
                .and_then(|()| {
                    let mut cubin = vec![0u8; size];
                    // SAFETY: `cubin` has exactly the size NVRTC reported.
                    unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) }
                        .result()
                        .map_err(|e| CudaError::Nvrtc { call: "nvrtcGetCUBIN", code: e.0 })?;
                    Ok(Compiled { cubin, log })
                })
        }
    };
    // SAFETY: `prog` is live and not used after this call.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Writes a source NVRTC rejected to `$TMPDIR/ssm-cuda-nvrtc/`, with the options in a trailing
/// comment (after the code, so line numbers match the log), and says where; a failed write
/// is reported in the returned text, never as an error (the log is the main evidence).
fn dump_failed_source(source: &str, name: &str, options: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join("ssm-cuda-nvrtc");
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem);
    let path = dir.join(format!("{stem}-{}-{}.cu", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let text = format!("{source}\n// NVRTC options: {options}\n");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        Ok(()) => format!("{} (the translation unit as compiled; options at its end)", path.display()),
        Err(e) => format!("not written to {} ({e}); the error's `translation_unit` holds it", path.display()),
    }
}
