//! `cargo xtask gpu-bundle DIR`: everything the GPU machine (CUDA driver and NVRTC, no Rust
//! toolchain) needs to run the GPU suite, in one folder under 64 MiB:
//!
//! - `bin/`: the release test executables of the GPU packages (collected from cargo's JSON
//!   messages of `cargo test --no-run --release`) and the xtask binary with the `cuda`
//!   feature (for the bench), stripped;
//! - `vectors/`: the `selective_state_update` conformance vectors;
//! - `peers/ssu_peer.py`: the peer timing script (the peer's own code is carried separately);
//! - `kernels/`: the CUDA sources (also embedded in the binaries), for reading there;
//! - `run.sh`: tests, compute-sanitizer (memcheck, racecheck) over the SSU GPU tests, bench.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::test_gpu::cargo_test_selection;

/// The bundle may not exceed this (the GPU machine's transfer limit).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// Arguments of `gpu-bundle`.
#[derive(Debug, clap::Args)]
pub(crate) struct GpuBundleArgs {
    /// Output folder (created; its `bin/` is replaced).
    pub(crate) dir: PathBuf,
}

/// Runs cargo with JSON messages and returns `(name, executable)` of every artifact that
/// `keep` accepts.
fn cargo_executables(
    root: &Path,
    args: &[String],
    keep: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<Vec<(String, PathBuf)>> {
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
        let pkg = Path::new(msg["manifest_path"].as_str().unwrap_or("x/Cargo.toml"))
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("pkg")
            .to_string();
        let target = msg["target"]["name"].as_str().unwrap_or("bin").to_string();
        let lib = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|v| v == "lib"));
        let name = if lib { format!("test-{pkg}-unit") } else { format!("test-{pkg}-{target}") };
        found.push((name, PathBuf::from(exe)));
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

pub(crate) fn run(args: &GpuBundleArgs) -> anyhow::Result<()> {
    let root = crate::project_root();
    let dir = if args.dir.is_absolute() { args.dir.clone() } else { std::env::current_dir()?.join(&args.dir) };
    let bin = dir.join("bin");
    if bin.exists() {
        std::fs::remove_dir_all(&bin)?;
    }
    std::fs::create_dir_all(&bin)?;

    let mut test_args: Vec<String> = vec!["test".into(), "--no-run".into(), "--release".into()];
    test_args.extend(cargo_test_selection(&root));
    let mut exes = cargo_executables(&root, &test_args, |m| m["profile"]["test"] == true)?;
    let build_args: Vec<String> =
        ["build", "--release", "-p", "xtask", "--features", "cuda"].iter().map(|s| s.to_string()).collect();
    exes.extend(
        cargo_executables(&root, &build_args, |m| m["target"]["name"] == "xtask" && m["profile"]["test"] == false)?
            .into_iter()
            .map(|(_, p)| ("xtask".to_string(), p)),
    );
    if !exes.iter().any(|(n, _)| n == "xtask") {
        bail!("the xtask binary was not among cargo's artifacts");
    }
    for (name, exe) in &exes {
        let to = bin.join(name);
        std::fs::copy(exe, &to).with_context(|| format!("copying {}", exe.display()))?;
        // Debug info is most of a release test binary; the bundle must stay small.
        let _ = Command::new("strip").arg("--strip-debug").arg(&to).status();
        println!("bin/{name}");
    }

    let vectors = ssm_conformance::default_vectors_dir().join("selective_state_update");
    if vectors.exists() {
        copy_dir(&vectors, &dir.join("vectors/selective_state_update"))?;
    } else {
        eprintln!("note: {} not found; the bundle carries no conformance vectors", vectors.display());
    }
    std::fs::create_dir_all(dir.join("peers"))?;
    std::fs::copy(root.join("xtask/peers/ssu_peer.py"), dir.join("peers/ssu_peer.py"))?;
    copy_dir(&root.join("crates/ssm-cuda/kernels"), &dir.join("kernels"))?;
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

/// The bundle's entry point. Stages run in the order given: `tests`, `sanitize`, `bench`
/// (default: all three, in that order). Logs go to `$OUT` when set (the GPU machine's
/// result folder), else `DIR/out`; `summary.txt` collects one line per step.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# GPU suite of ssm-kernels, for a machine with a CUDA driver and NVRTC but no Rust.
#   bash run.sh [tests] [sanitize] [bench]      (default: tests sanitize bench)
#   PEER_VLLM=/path/to/extracted/vllm  bash run.sh bench   # adds vLLM's Triton peer
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
export SSM_REQUIRE_GPU=1
export SSM_CONFORMANCE_DIR="$here/vectors"
export SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-$here/.cubin-cache}"
# Snapshot tests (insta) find their snapshots under the workspace the bundle sits in.
export INSTA_WORKSPACE_ROOT="${INSTA_WORKSPACE_ROOT:-$(cd "$here/.." && pwd)}" INSTA_UPDATE=no CI=true
# NVRTC: the CUDA toolkit's, else the pip wheel's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cu13, os; print(os.path.join(os.path.dirname(nvidia.cu13.__file__), "lib"))' 2>/dev/null); do
    if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
status=0
note() { echo "$1" | tee -a "$out/summary.txt"; }

run_tests() {
    for t in "$here"/bin/test-*; do
        name="$(basename "$t")"
        if "$t" --test-threads=1 >"$out/$name.log" 2>&1; then r=ok; else r=FAILED; status=1; fi
        note "$name: $r ($(grep -E '^test result' "$out/$name.log" | tail -n1))"
    done
}

run_sanitize() {
    local gpu_test="$here/bin/test-ssm-cuda-gpu_ssu"
    if ! command -v compute-sanitizer >/dev/null || [ ! -x "$gpu_test" ]; then
        note "compute-sanitizer: not available"; status=1; return
    fi
    for tool in memcheck racecheck; do
        compute-sanitizer --tool "$tool" --error-exitcode 99 "$gpu_test" --test-threads=1 >"$out/sanitizer-$tool.log" 2>&1
        local rc=$?
        [ $rc -eq 0 ] || status=1
        note "compute-sanitizer $tool: rc=$rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$out/sanitizer-$tool.log" | tr '\n' ' ')"
    done
}

run_bench() {
    local peer=()
    [ -n "${PEER_VLLM:-}" ] && peer=(--peer-vllm "$PEER_VLLM" --peer-script "$here/peers/ssu_peer.py")
    if "$here/bin/xtask" bench-cuda-ssu "${peer[@]}" --json "$out/bench_ssu_cuda.json" 2>&1 | tee "$out/bench.log"; then
        note "bench: ok"
    else
        note "bench: FAILED"; status=1
    fi
}

for stage in ${*:-tests sanitize bench}; do
    case "$stage" in
        tests) run_tests ;;
        sanitize) run_sanitize ;;
        bench) run_bench ;;
        *) echo "unknown stage $stage" >&2; status=2 ;;
    esac
done
exit $status
"#;
