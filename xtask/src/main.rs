//! `cargo xtask`: the project's tasks.
//!
//! - `bench`: every op on the best available backend over realistic shapes, with the
//!   machine's copy bandwidth measured in the same run; a table, JSON and SVG plots.
//! - `conformance`: the peers' golden vectors on a backend; ends with `N passed, M failed`.

use clap::{Parser, Subcommand};

mod bench;
#[cfg(feature = "cuda")]
mod bench_cuda;
#[cfg(feature = "cuda")]
mod build_kernels;
mod conformance;
mod gpu_bundle;
mod test_gpu;

/// ssm-kernels project tasks.
#[derive(Parser)]
#[command(name = "xtask", about = "ssm-kernels project tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmark every op on the best available backend; prints a table, writes JSON and SVG under target/bench/.
    Bench(bench::Args),
    /// Run the peers' golden vectors on a backend; exit 1 on any failure.
    Conformance(conformance::Args),
    /// CUDA SSU bench: copy bandwidth, our kernel and (with --peer-vllm) vLLM's Triton kernel, graph-replayed.
    #[cfg(feature = "cuda")]
    BenchCudaSsu(bench_cuda::CudaSsuBenchArgs),
    /// CUDA GDN decode bench: copy bandwidth, our kernels and (with --peer-vllm) vLLM's Triton kernels, graph-replayed.
    #[cfg(feature = "cuda")]
    BenchCudaGdn(bench_cuda::CudaGdnBenchArgs),
    /// CUDA GDN chunked-prefill bench: our kernel and (with --peer-vllm) vLLM's Triton prefill, graph-replayed.
    #[cfg(feature = "cuda")]
    BenchCudaGdnChunk(bench_cuda::CudaGdnChunkBenchArgs),
    /// CUDA SSD prefill bench: our kernels and (with --peer-vllm) vLLM's Triton prefill, graph-replayed.
    #[cfg(feature = "cuda")]
    BenchCudaSsd(bench_cuda::CudaSsdBenchArgs),
    /// NVRTC-compile every CUDA kernel specialisation (sm_80, sm_90); print registers, spills, smem. No GPU needed.
    #[cfg(feature = "cuda")]
    BuildKernels(build_kernels::BuildKernelsArgs),
    /// Run the GPU test suite (fails, not skips, without a GPU).
    TestGpu(test_gpu::TestGpuArgs),
    /// Write release GPU test binaries, the xtask binary, vectors and run.sh into DIR (< 64 MiB).
    GpuBundle(gpu_bundle::GpuBundleArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Bench(a) => a.run(),
        Cmd::Conformance(a) => a.run(),
        #[cfg(feature = "cuda")]
        Cmd::BenchCudaSsu(a) => bench_cuda::run(&a).map(|_| ()),
        #[cfg(feature = "cuda")]
        Cmd::BenchCudaGdn(a) => bench_cuda::run_gdn(&a).map(|_| ()),
        #[cfg(feature = "cuda")]
        Cmd::BenchCudaGdnChunk(a) => bench_cuda::run_gdn_chunk(&a).map(|_| ()),
        #[cfg(feature = "cuda")]
        Cmd::BenchCudaSsd(a) => bench_cuda::run_ssd(&a).map(|_| ()),
        #[cfg(feature = "cuda")]
        Cmd::BuildKernels(a) => build_kernels::run(&a),
        Cmd::TestGpu(a) => test_gpu::run(&a),
        Cmd::GpuBundle(a) => gpu_bundle::run(&a),
    }
}

/// The workspace root (xtask's parent).
pub(crate) fn project_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_help_snapshot() {
        let help = super::Cli::command().render_long_help().to_string();
        insta::assert_snapshot!(help);
    }
}
