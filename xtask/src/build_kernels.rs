//! `cargo xtask build-kernels`: NVRTC-compiles every CUDA kernel specialisation of the
//! catalogue for each architecture and prints registers, stack, spills and shared memory per
//! kernel. Needs NVRTC only (no GPU, no CUDA toolkit): on CI,
//! `eval "$(bash ci/install-nvrtc.sh)"` provides it from PyPI wheels.

use std::time::Instant;

use anyhow::{Context, bail};
use ssm_cuda::Arch;
use ssm_cuda::compile::{compile_with_report, copy_kernel_spec, parallel_map};
use ssm_cuda::conv::conv_catalogue;
use ssm_cuda::gdn::gdn_catalogue;
use ssm_cuda::gdn_chunk::gdn_chunk_catalogue;
use ssm_cuda::ring::ring_catalogue;
use ssm_cuda::rows::rows_catalogue;
use ssm_cuda::ssd::ssd_catalogue;
use ssm_cuda::ssu::ssu_catalogue;

/// Arguments of `build-kernels`.
#[derive(Debug, clap::Args)]
pub(crate) struct BuildKernelsArgs {
    /// Architectures as compute capabilities (`80`, `90`).
    #[arg(long, value_delimiter = ',', default_value = "80,90")]
    pub(crate) arch: Vec<u32>,
    /// Fail when a kernel spills registers to local memory.
    #[arg(long)]
    pub(crate) deny_spills: bool,
    /// Only the kernels whose label contains this text (e.g. `conv`, `one-token`).
    #[arg(long)]
    pub(crate) only: Option<String>,
    /// Also write each cubin to this folder (`<arch>-<label>.cubin`), e.g. for
    /// `cuobjdump -sass` (the `nvidia-cuda-cuobjdump` wheel provides one without a toolkit).
    #[arg(long)]
    pub(crate) cubin_dir: Option<std::path::PathBuf>,
    /// Print each specialisation's whole NVRTC/ptxas log (ptxas' advisories included).
    #[arg(long)]
    pub(crate) ptxas_log: bool,
}

pub(crate) fn run(args: &BuildKernelsArgs) -> anyhow::Result<()> {
    if !ssm_cuda::nvrtc_available() {
        bail!(
            "NVRTC (libnvrtc.so.13) could not be loaded; install it with \
             `eval \"$(bash ci/install-nvrtc.sh)\"` (PyPI wheels, no GPU needed)"
        );
    }
    let (major, minor) = ssm_cuda::nvrtc_version().context("NVRTC version")?;
    println!("NVRTC {major}.{minor}");
    let mut kernels = vec![("copy 16-byte".to_string(), copy_kernel_spec())];
    kernels.extend(ssu_catalogue());
    kernels.extend(gdn_catalogue());
    kernels.extend(gdn_chunk_catalogue());
    kernels.extend(conv_catalogue());
    kernels.extend(ring_catalogue());
    kernels.extend(ssd_catalogue());
    kernels.extend(rows_catalogue());
    if let Some(only) = &args.only {
        kernels.retain(|(label, _)| label.contains(only.as_str()));
    }
    println!(
        "{:<6} {:<58} {:>5} {:>6} {:>7} {:>7} {:>6} {:>7} {:>6}",
        "arch", "kernel", "regs", "stack", "spill-s", "spill-l", "smem", "cubin", "ms"
    );
    let (mut failures, mut spilling) = (Vec::new(), 0usize);
    for &cc in &args.arch {
        let arch = Arch { major: cc / 10, minor: cc % 10 };
        // Compiled concurrently (NVRTC takes independent programs in parallel), printed in order;
        // `ms` is each compile's own wall time.
        let reports = parallel_map(&kernels, |(_, spec)| {
            let t0 = Instant::now();
            (compile_with_report(spec, arch), t0.elapsed())
        });
        for ((label, _), (report, elapsed)) in kernels.iter().zip(reports) {
            match report {
                Ok(report) => {
                    let (cubin, u) = (&report.cubin, &report.usage);
                    if let Some(dir) = &args.cubin_dir {
                        let name: String = label
                            .chars()
                            .map(|c| if c.is_ascii_alphanumeric() || c == '=' { c } else { '_' })
                            .collect();
                        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                        let path = dir.join(format!("{}-{name}.cubin", arch.sm()));
                        std::fs::write(&path, cubin).with_context(|| format!("writing {}", path.display()))?;
                    }
                    if u.spill_stores + u.spill_loads > 0 {
                        spilling += 1;
                    }
                    println!(
                        "{:<6} {:<58} {:>5} {:>6} {:>7} {:>7} {:>6} {:>7} {:>6}{}",
                        arch.sm(),
                        label,
                        u.registers,
                        u.stack_bytes,
                        u.spill_stores,
                        u.spill_loads,
                        u.shared_bytes,
                        cubin.len(),
                        elapsed.as_millis(),
                        if u.wgmma_serialized { "  wgmma serialized (ptxas C7515)" } else { "" }
                    );
                    if args.ptxas_log {
                        println!("{}", report.log);
                    }
                }
                Err(e) => {
                    println!("{:<6} {:<58} FAILED", arch.sm(), label);
                    failures.push(format!("{} {label}: {e}", arch.sm()));
                }
            }
        }
    }
    let total = kernels.len() * args.arch.len();
    println!("{} of {total} specialisations compiled; {spilling} spill", total - failures.len());
    if !failures.is_empty() {
        bail!("{} kernel(s) failed to compile:\n{}", failures.len(), failures.join("\n\n"));
    }
    if args.deny_spills && spilling > 0 {
        bail!("{spilling} kernel(s) spill registers");
    }
    Ok(())
}
