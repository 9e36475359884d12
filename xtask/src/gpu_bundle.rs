//! `cargo xtask gpu-bundle DIR`: everything the GPU machine (CUDA driver and NVRTC, no Rust
//! toolchain) needs to run the whole test suite, in one folder under 64 MiB that runs wherever
//! it is unpacked (nothing is read from the workspace that built it):
//!
//! - `bin.tar.xz`: the release test executables of every workspace package, unit and integration
//!   (collected from cargo's JSON messages of `cargo test --no-run --release --workspace
//!   --all-features`, CI's feature set), and the xtask binary with the `cuda` feature (for the
//!   bench), stripped (test binaries of their symbols too) and compressed by xz (about 120 MiB
//!   as files, 16 as the archive; gzip's 47 left no room beside it for the peers under the
//!   device's 64 MiB carry limit);
//!   its `gpu-tests.txt` names those of the GPU packages, which the sanitizer stage runs.
//!   `run.sh` unpacks it into `bin/` (or `$OUT/bin/` where the bundle is read-only);
//! - `workspace/`: every insta `snapshots/` folder at its workspace path, so
//!   `INSTA_WORKSPACE_ROOT=DIR/workspace` finds `crates/<crate>/tests/snapshots/…` (insta
//!   resolves a snapshot from the workspace root and the test's source path, both fixed at
//!   compile time unless that variable is set at run time);
//! - `vectors/`: every op's conformance vectors (`SSM_CONFORMANCE_DIR`);
//! - `peers/ssu_peer.py`, `peers/replayssm_peer.py`, `peers/gdn_peer.py`, `peers/gdn_chunk_peer.py`, `peers/ssd_peer.py`: the peer timing scripts, with the
//!   `peers/peer_common.py` they import (the peer's own code is carried separately);
//! - `kernels/`: the CUDA sources (also embedded in the binaries), for reading there;
//! - `COMMIT`: the commit it was built from (marked where tracked files had changes), which
//!   `run.sh` writes first into every summary;
//! - `run.sh`: tests, `xtask conformance --backend cuda`, compute-sanitizer (memcheck,
//!   racecheck) over the GPU tests, bench; and, asked for by name, vLLM's own mamba kernel tests
//!   against the Python package (`vllm-tests`, the folder `xtask/peers/vllm_tests/fetch.sh` fills).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::test_gpu::GPU_TEST_PACKAGES;

/// The bundle may not exceed this (the GPU machine's transfer limit).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// Arguments of `gpu-bundle`.
#[derive(Debug, clap::Args)]
pub(crate) struct GpuBundleArgs {
    /// Output folder (created; its `bin.tar.xz`, `workspace/` and `vectors/` are replaced).
    pub(crate) dir: PathBuf,
}

/// One executable cargo built: its bundle name, its package and where cargo put it.
struct Executable {
    name: String,
    package: String,
    path: PathBuf,
}

/// Runs cargo with JSON messages and returns every executable artifact that `keep` accepts.
fn cargo_executables(
    root: &Path,
    args: &[String],
    keep: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<Vec<Executable>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("{cmd:?}");
    let out = cmd.output().context("running cargo")?;
    if !out.status.success() {
        bail!("cargo failed ({})", out.status);
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if msg["reason"] != "compiler-artifact" || !keep(&msg) {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else { continue };
        let package = Path::new(msg["manifest_path"].as_str().unwrap_or("x/Cargo.toml"))
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("pkg")
            .to_string();
        let target = msg["target"]["name"].as_str().unwrap_or("bin").to_string();
        let lib = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|v| v == "lib"));
        let name = if lib { format!("test-{package}-unit") } else { format!("test-{package}-{target}") };
        found.push(Executable { name, package, path: PathBuf::from(exe) });
    }
    Ok(found)
}

fn copy_dir(src: &Path, dst: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &to)?;
        } else {
            std::fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |rd| {
        rd.filter_map(|e| e.ok())
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => dir_size(&e.path()),
                _ => e.metadata().map_or(0, |m| m.len()),
            })
            .sum()
    })
}

/// Every folder named `snapshots` under `dir` (insta's), as paths relative to `root`; build
/// outputs and hidden folders are not searched.
fn snapshot_dirs(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !e.file_type()?.is_dir() || name.starts_with('.') || name == "target" {
            continue;
        }
        if name == "snapshots" {
            found.push(e.path().strip_prefix(root)?.to_path_buf());
        } else {
            snapshot_dirs(root, &e.path(), found)?;
        }
    }
    Ok(())
}

/// Builds and copies the executables into `bin/` with `gpu-tests.txt`; archives the folder as
/// `bin.tar.xz` beside it (uncompressed, the binaries alone pass the size limit) and removes it.
fn collect_binaries(root: &Path, bin: &Path) -> anyhow::Result<()> {
    let test_args: Vec<String> =
        ["test", "--no-run", "--release", "--workspace", "--all-features"].iter().map(|s| s.to_string()).collect();
    let tests = cargo_executables(root, &test_args, |m| m["profile"]["test"] == true)?;
    let build_args: Vec<String> =
        ["build", "--release", "-p", "xtask", "--features", "cuda"].iter().map(|s| s.to_string()).collect();
    let xtask: Vec<Executable> =
        cargo_executables(root, &build_args, |m| m["target"]["name"] == "xtask" && m["profile"]["test"] == false)?
            .into_iter()
            .map(|e| Executable { name: "xtask".into(), ..e })
            .collect();
    if xtask.is_empty() {
        bail!("the xtask binary was not among cargo's artifacts");
    }
    // The facade's examples (the CUDA one among them), run by `run.sh examples`.
    let example_args: Vec<String> = ["build", "--release", "-p", "ssm-dispatch", "--features", "cuda", "--examples"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let examples: Vec<Executable> = cargo_executables(root, &example_args, |m| {
        m["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|v| v == "example"))
    })?
    .into_iter()
    .map(|e| {
        let name = e.name.replacen("test-ssm-dispatch-", "example-", 1);
        Executable { name, ..e }
    })
    .collect();
    if examples.is_empty() {
        bail!("no example among cargo's artifacts");
    }
    for exe in tests.iter().chain(&xtask).chain(&examples) {
        let to = bin.join(&exe.name);
        std::fs::copy(&exe.path, &to).with_context(|| format!("copying {}", exe.path.display()))?;
        // Debug info is most of a release test binary; the bundle must stay small. Test and
        // example binaries lose their symbol table too (4 MB of the archive; a panic still names
        // its file and line, a backtrace only addresses); xtask keeps it for the bench's.
        let level = if exe.name == "xtask" { "--strip-debug" } else { "--strip-unneeded" };
        let _ = Command::new("strip").arg(level).arg(&to).status();
        println!("bin/{}", exe.name);
    }
    let gpu: Vec<&str> = tests
        .iter()
        // The GPU packages' tests, and any package's `tests/gpu_*.rs` (ssm-fuzz's reliability tests).
        .filter(|e| GPU_TEST_PACKAGES.iter().any(|(p, _)| *p == e.package) || e.name.contains("-gpu_"))
        .map(|e| e.name.as_str())
        .collect();
    std::fs::write(bin.join("gpu-tests.txt"), gpu.join("\n") + "\n")?;
    let dir = bin.parent().context("bin/ has a parent")?;
    let _ = std::fs::remove_file(dir.join("bin.tar.gz")); // an older bundle's archive
    // xz on every core (`tar -J` with XZ_OPT): a third of gzip's size for these binaries.
    let tar = Command::new("tar")
        .env("XZ_OPT", "-6 -T0")
        .arg("cJf")
        .arg(dir.join("bin.tar.xz"))
        .arg("-C")
        .arg(bin)
        .arg(".")
        .status();
    if !tar.context("running tar (with xz)")?.success() {
        bail!("tar could not archive {} (is xz installed?)", bin.display());
    }
    std::fs::remove_dir_all(bin)?;
    Ok(())
}

/// Copies what the tests read by path: insta's snapshots under `workspace/` and the
/// conformance vectors under `vectors/`.
fn collect_test_data(root: &Path, dir: &Path) -> anyhow::Result<()> {
    let workspace = dir.join("workspace");
    if workspace.exists() {
        std::fs::remove_dir_all(&workspace)?;
    }
    let mut snapshots = Vec::new();
    snapshot_dirs(root, root, &mut snapshots)?;
    for rel in &snapshots {
        copy_dir(&root.join(rel), &workspace.join(rel))?;
        println!("workspace/{}", rel.display());
    }
    let vectors = ssm_conformance::default_vectors_dir();
    if vectors.exists() {
        let to = dir.join("vectors");
        if to.exists() {
            std::fs::remove_dir_all(&to)?;
        }
        copy_dir(&vectors, &to)?;
        println!("vectors/ (from {})", vectors.display());
    } else {
        bail!("{} not found: the conformance tests need their vectors", vectors.display());
    }
    Ok(())
}

/// The Python package (`crates/ssm-py`, its own workspace) for `run.sh python`: built here as
/// maturin builds it (release, `pyo3/extension-module`, abi3: no libpython link, any CPython
/// ≥ 3.9), its extension copied beside the package's Python source under `py/`, with the CUDA
/// tests (`py/test_cuda.py`, run as a script: the GPU machine has torch, maybe not pytest).
fn collect_python(root: &Path, dir: &Path) -> anyhow::Result<()> {
    let target = root.join("target/py");
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--features", "pyo3/extension-module", "--manifest-path"])
        .arg(root.join("crates/ssm-py/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .context("building the Python extension")?;
    if !status.success() {
        bail!("building the Python extension (crates/ssm-py) failed");
    }
    let py = dir.join("py");
    if py.exists() {
        std::fs::remove_dir_all(&py)?;
    }
    copy_dir(&root.join("crates/ssm-py/python/ssm_kernels"), &py.join("ssm_kernels"))?;
    // A development build may have left its own extension in the source folder.
    for e in std::fs::read_dir(py.join("ssm_kernels"))? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "so") {
            std::fs::remove_file(path)?;
        }
    }
    std::fs::copy(target.join("release/lib_core.so"), py.join("ssm_kernels/_core.abi3.so"))
        .context("copying the Python extension")?;
    std::fs::copy(root.join("crates/ssm-py/tests/test_cuda.py"), py.join("test_cuda.py"))?;
    println!("py/ (ssm_kernels with its extension, test_cuda.py)");
    Ok(())
}

/// The commit the bundle is built from (`git rev-parse HEAD`), with ` (uncommitted changes)`
/// where tracked files differ from it, so that every `run.sh` summary names the code it ran.
fn head_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match (git(&["rev-parse", "HEAD"]), git(&["status", "--porcelain", "--untracked-files=no"])) {
        (Some(head), Some(changes)) if changes.is_empty() => head,
        (Some(head), Some(_)) => format!("{head} (uncommitted changes)"),
        _ => "unknown (not a git checkout)".into(),
    }
}

pub(crate) fn run(args: &GpuBundleArgs) -> anyhow::Result<()> {
    let root = crate::project_root();
    let dir = if args.dir.is_absolute() { args.dir.clone() } else { std::env::current_dir()?.join(&args.dir) };
    let bin = dir.join("bin");
    if bin.exists() {
        std::fs::remove_dir_all(&bin)?;
    }
    std::fs::create_dir_all(&bin)?;
    collect_binaries(&root, &bin)?;
    collect_test_data(&root, &dir)?;
    std::fs::create_dir_all(dir.join("peers"))?;
    for script in
        ["ssu_peer.py", "replayssm_peer.py", "gdn_peer.py", "gdn_chunk_peer.py", "ssd_peer.py", "peer_common.py"]
    {
        std::fs::copy(root.join("xtask/peers").join(script), dir.join("peers").join(script))?;
    }
    copy_dir(&root.join("crates/ssm-cuda/kernels"), &dir.join("kernels"))?;
    collect_python(&root, &dir)?;
    let commit = head_commit(&root);
    std::fs::write(dir.join("COMMIT"), format!("{commit}\n"))?;
    println!("COMMIT: {commit}");
    let run_sh = dir.join("run.sh");
    std::fs::write(&run_sh, RUN_SH)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run_sh, std::fs::Permissions::from_mode(0o755))?;
    }
    let size = dir_size(&dir);
    println!("{}: {:.1} MiB", dir.display(), size as f64 / (1 << 20) as f64);
    if size > MAX_BUNDLE_BYTES {
        bail!("the bundle is {size} bytes, over the 64 MiB limit");
    }
    Ok(())
}

/// The bundle's entry point. Stages run in the order given: `tests`, `conformance`,
/// `examples`, `python`, `sanitize`, `bench` (default: all six, in that order). Logs go to `$OUT` when set (the GPU machine's
/// result folder), else `DIR/out`; `summary.txt` collects one line per binary and step, and
/// the exit status is nonzero when any of them failed.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# The test suite of ssm-kernels, for a machine with a CUDA driver and NVRTC but no Rust.
# Runs from wherever the bundle is unpacked: snapshots, vectors and kernels are carried.
#   bash run.sh [tests] [conformance] [examples] [python] [sanitize] [bench]   (default: all six)
#   PEER_VLLM=/path/to/extracted/vllm  bash run.sh bench   # adds vLLM's Triton peer
#   SSM_SANITIZE_BINS="test-ssm-cuda-gpu_ssu" bash run.sh sanitize   # a subset of gpu-tests.txt
#   SSM_BENCH_OPS="ssu" SSM_BENCH_ARGS="--batches 64" bash run.sh bench # a subset of the benches
#   SSM_TEST_BINS="test-ssm-cuda-gpu_ring" bash run.sh tests          # a subset of the tests
#   SSM_TEST_ARGS="--skip allocate_no_device_memory" bash run.sh tests  # libtest arguments for every binary
#   SSM_REQUIRE_GPU=0 bash run.sh tests         # without a GPU: the GPU tests skip, printing why
#   VLLM_TESTS=/path/to/peers/vllm_tests bash run.sh vllm-tests   # vLLM's mamba kernel tests on ours
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
: >"$out/summary.txt"
bin="$here/bin"
# The archive is xz-compressed: tar's own unpacker where `xz` is installed, else Python's.
unpack() {
    if command -v xz >/dev/null; then tar xJf "$1" -C "$2"
    else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; fi
}
if [ ! -f "$bin/.unpacked" ] || [ "$here/bin.tar.xz" -nt "$bin/.unpacked" ]; then
    [ -w "$here" ] || bin="$out/bin"
    rm -rf "$bin" && mkdir -p "$bin" && unpack "$here/bin.tar.xz" "$bin" && touch "$bin/.unpacked" \
        || { echo "run.sh: could not unpack $here/bin.tar.xz into $bin" >&2; exit 2; }
fi
# A missing GPU, driver or NVRTC fails the GPU tests instead of skipping them (unless set to 0).
export SSM_REQUIRE_GPU="${SSM_REQUIRE_GPU:-1}"
export SSM_CONFORMANCE_DIR="$here/vectors"
export SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-$here/.cubin-cache}"
# insta reads its snapshots from $INSTA_WORKSPACE_ROOT/<the test's source dir>/snapshots; the
# bundle carries them under workspace/. Never write pending snapshots; a mismatch fails.
export INSTA_WORKSPACE_ROOT="$here/workspace" INSTA_UPDATE=no CI=true
# NVRTC: the CUDA toolkit's, else the pip wheel's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cu13, os; print(os.path.join(os.path.dirname(nvidia.cu13.__file__), "lib"))' 2>/dev/null); do
    if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
done
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
else
    echo "nvidia-smi: not found (no NVIDIA driver on this machine)"
fi
gpu_tests=()
[ -f "$bin/gpu-tests.txt" ] && mapfile -t gpu_tests < <(grep -v '^$' "$bin/gpu-tests.txt")
is_gpu_test() { local g; for g in "${gpu_tests[@]}"; do [ "$g" = "$1" ] && return 0; done; return 1; }
status=0
failed=()
note() { echo "$1" | tee -a "$out/summary.txt"; }
[ -f "$here/COMMIT" ] && note "bundle: $(cat "$here/COMMIT")"

run_examples() {
    # The facade's examples (bin/example-*): each must exit 0; its last line goes to the summary.
    local e name r
    for e in "$bin"/example-*; do
        name="$(basename "$e")"
        if (cd "$out" && "$e") >"$out/$name.log" 2>&1; then r=ok; else r=FAILED; status=1; failed+=("$name"); fi
        note "$name: $r ($(grep -v '^$' "$out/$name.log" | tail -n1))"
    done
}

run_python() {
    # The Python package on torch CUDA tensors (py/test_cuda.py, against numpy on the CPU).
    if (cd "$out" && PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}" python3 "$here/py/test_cuda.py") >"$out/python.log" 2>&1; then
        note "python: ok ($(grep -c ': ok$' "$out/python.log") CUDA tests; $(head -n1 "$out/python.log"))"
    else
        note "python: FAILED ($(tail -n1 "$out/python.log"))"; status=1; failed+=(python)
    fi
}

run_vllm_tests() {
    # vLLM 0.33.0's own mamba, SSD and FLA (GDN) kernel tests with vLLM's ops replaced by the
    # Python package's (VLLM_TESTS: the folder xtask/peers/vllm_tests/fetch.sh filled, its
    # conftest.py the shim).
    if [ -z "${VLLM_TESTS:-}" ]; then
        note "vllm-tests: FAILED (VLLM_TESTS is not set)"; status=1; failed+=(vllm-tests); return
    fi
    if (cd "$VLLM_TESTS" && PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q -p no:cacheprovider -rs \
        tests/kernels/mamba/test_mamba_ssm.py tests/kernels/mamba/test_causal_conv1d.py \
        tests/kernels/mamba/test_mamba_ssm_ssd.py tests/kernels/fla/test_fused_sigmoid_gating_delta_rule.py \
        tests/kernels/fla/test_fused_recurrent_packed_decode.py) >"$out/vllm-tests.log" 2>&1; then
        note "vllm-tests: ok ($(tail -n1 "$out/vllm-tests.log"))"
    else
        note "vllm-tests: FAILED ($(tail -n1 "$out/vllm-tests.log"))"; status=1; failed+=(vllm-tests)
    fi
}

run_tests() {
    local t name r skips
    local threads sel=()
    # SSM_TEST_BINS="test-ssm-cuda-gpu_ring ...": a subset of the test binaries.
    if [ -n "${SSM_TEST_BINS:-}" ]; then for name in $SSM_TEST_BINS; do sel+=("$bin/$name"); done; else sel=("$bin"/test-*); fi
    for t in "${sel[@]}"; do
        name="$(basename "$t")"
        # GPU tests one at a time (one context, readable logs) and uncaptured, so that a
        # skip's printed reason reaches the log; the CPU tests on every core.
        threads=(); is_gpu_test "$name" && threads=(--test-threads=1 --nocapture)
        # SSM_TEST_ARGS: a filter or `--skip NAME` for every binary (word-split).
        # shellcheck disable=SC2086
        if (cd "$out" && "$t" "${threads[@]}" ${SSM_TEST_ARGS:-}) >"$out/$name.log" 2>&1; then r=ok; else r=FAILED; status=1; failed+=("$name"); fi
        # Tests that skip print "skipping <test>: <reason>" (no GPU, no NVRTC).
        skips="$(grep -o 'skipping [^ :]*: .*' "$out/$name.log")"
        [ -n "$skips" ] && skips="; $(grep -c . <<<"$skips") skipped: $(head -n1 <<<"$skips" | sed 's/^skipping [^:]*: //')"
        note "$name: $r ($(grep -E '^test result' "$out/$name.log" | tail -n1 | sed 's/; finished.*//')$skips)"
    done
}

run_sanitize() {
    local bins name tool rc log
    read -r -a bins <<<"${SSM_SANITIZE_BINS:-${gpu_tests[*]}}"
    if ! command -v compute-sanitizer >/dev/null; then
        note "compute-sanitizer: not available"; status=1; failed+=(compute-sanitizer); return
    fi
    for name in "${bins[@]}"; do
        for tool in memcheck racecheck; do
            (cd "$out" && compute-sanitizer --tool "$tool" --error-exitcode 99 "$bin/$name" --test-threads=1) \
                >"$out/sanitizer-$tool-$name.log" 2>&1
            rc=$?
            log="$out/sanitizer-$tool-$name.log"
            # A binary whose tests passed without one CUDA call has nothing to check (the
            # sanitizer exits 255 with this line): say so rather than fail.
            if [ $rc -eq 255 ] && grep -q 'terminated before first instrumented API call' "$log" \
                && grep -qE '^test result: ok' "$log"; then
                note "compute-sanitizer $tool $name: no CUDA call; $(grep -E '^test result' "$log" | sed 's/; finished.*//')"
                continue
            fi
            [ $rc -eq 0 ] || { status=1; failed+=("$tool:$name"); }
            note "compute-sanitizer $tool $name: rc=$rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$log" | sed 's/; finished.*//' | tr '\n' ' ')"
        done
    done
}

run_conformance() {
    # Every golden vector on the CUDA backend (host cases staged onto the device and back);
    # ends with "N passed, M failed" (ops without CUDA kernels are listed as skipped).
    if "$bin/xtask" conformance --backend cuda >"$out/conformance-cuda.log" 2>&1; then
        note "conformance cuda: ok ($(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/conformance-cuda.log" | tail -n1))"
    else
        note "conformance cuda: FAILED ($(tail -n1 "$out/conformance-cuda.log"))"; status=1; failed+=(conformance)
    fi
}

run_bench() {
    # The SSU (with ReplaySSM), GDN decode, GDN prefill and SSD prefill benches, each with vLLM's Triton peer when
    # PEER_VLLM is set; SSM_BENCH_OPS="ssu" runs a subset.
    local op peer
    for op in ${SSM_BENCH_OPS:-ssu gdn gdn-chunk ssd}; do
        peer=()
        [ -n "${PEER_VLLM:-}" ] && peer=(--peer-vllm "$PEER_VLLM" --peer-script "$here/peers/${op//-/_}_peer.py")
        # shellcheck disable=SC2086 # SSM_BENCH_ARGS is a list of options, split on purpose
        if "$bin/xtask" "bench-cuda-$op" "${peer[@]}" ${SSM_BENCH_ARGS:-} --json "$out/bench_${op}_cuda.json" 2>&1 | tee "$out/bench_$op.log"; then
            note "bench $op: ok"
        else
            note "bench $op: FAILED"; status=1; failed+=("bench-$op")
        fi
    done
}

for stage in ${*:-tests conformance examples python sanitize bench}; do
    case "$stage" in
        tests) run_tests ;;
        python) run_python ;;
        vllm-tests) run_vllm_tests ;;
        conformance) run_conformance ;;
        sanitize) run_sanitize ;;
        bench) run_bench ;;
        examples) run_examples ;;
        *) echo "unknown stage $stage" >&2; status=2; failed+=("stage:$stage") ;;
    esac
done
echo "== summary ($out/summary.txt)"
if [ $status -eq 0 ]; then
    echo "all passed"
else
    echo "FAILED: ${failed[*]}"
fi
exit $status
"#;
