//! The CUDA paths of `cargo xtask bench --backend cuda`: the card's copy bandwidth, then
//! - `--op ssu` (`bench-cuda-ssu`): our SSU kernel on the Mamba2-2.7B shapes and (with
//!   `--peer-vllm DIR`) vLLM's own Triton `selective_state_update` on the same shapes in the
//!   same run, through `xtask/peers/ssu_peer.py`;
//! - `--op gdn` (`bench-cuda-gdn`): our recurrent GDN decode kernels on the Qwen3-Next shapes
//!   and (with `--peer-vllm DIR`) vLLM's Triton `fused_sigmoid_gating_delta_rule_update`,
//!   `fused_recurrent_gated_delta_rule_packed_decode` and `fused_recurrent_gated_delta_rule`,
//!   through `xtask/peers/gdn_peer.py`.
//!
//! Each prints a table and writes JSON.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use ssm_cuda::CudaBackend;
use ssm_cuda::bench::{CopyBandwidth, SsuBenchShape, bench_ssu, measure_copy_bandwidth};
use ssm_cuda::bench_gdn::{GdnBenchOp, GdnBenchShape, bench_gdn};
use ssm_tensor::DType;

/// Options of the CUDA SSU bench.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CudaSsuBenchArgs {
    /// Batches to time.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256,1024")]
    pub(crate) batches: Vec<usize>,
    /// Folder with the extracted vLLM files (see xtask/peers/ssu_peer.py); runs the peer.
    #[arg(long)]
    pub(crate) peer_vllm: Option<PathBuf>,
    /// The peer script (default: xtask/peers/ssu_peer.py next to the workspace, or
    /// peers/ssu_peer.py next to the running binary in a GPU bundle).
    #[arg(long)]
    pub(crate) peer_script: Option<PathBuf>,
    /// Python interpreter for the peer.
    #[arg(long, default_value = "python3")]
    pub(crate) python: String,
    /// Where to write the JSON result.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Bytes of each buffer of the copy-bandwidth measurement.
    #[arg(long, default_value_t = 2 << 30)]
    pub(crate) copy_bytes: usize,
}

fn state_name(t: DType) -> &'static str {
    match t {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "?",
    }
}

/// `peers/NAME` next to the running binary in a GPU bundle, else `xtask/peers/NAME`.
fn default_peer_script(name: &str) -> PathBuf {
    let bundled = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("../peers").join(name)));
    match bundled {
        Some(p) if p.exists() => p,
        _ => crate::project_root().join("xtask/peers").join(name),
    }
}

/// Starts the backend on device 0 and measures the copy bandwidth (printed).
fn start(copy_bytes: usize) -> anyhow::Result<(CudaBackend, String, CopyBandwidth)> {
    let be = CudaBackend::new(0).context("CUDA backend")?;
    let device = be.device_name().unwrap_or_else(|_| "?".into());
    println!("device: {device} ({}), NVRTC {:?}", be.arch(), ssm_cuda::nvrtc_version().ok());
    let copy = measure_copy_bandwidth(&be, copy_bytes).context("copy bandwidth")?;
    println!(
        "copy bandwidth ({} MiB, read+write): cuMemcpyDtoDAsync {:.0} GB/s, 16-byte kernel {:.0} GB/s -> {:.0} GB/s",
        copy.bytes >> 20,
        copy.memcpy_gbps,
        copy.kernel_gbps,
        copy.best_gbps()
    );
    Ok((be, device, copy))
}

/// Runs a peer script (`python script --vllm DIR --shapes JSON`) and parses its stdout as JSON;
/// its stderr is passed through. Fails when the script fails or prints no JSON.
fn run_peer(python: &str, script: &std::path::Path, dir: &std::path::Path, shapes: &[Value]) -> anyhow::Result<Value> {
    if !script.exists() {
        bail!("peer script {} not found (pass --peer-script)", script.display());
    }
    let out = Command::new(python)
        .arg(script)
        .arg("--vllm")
        .arg(dir)
        .arg("--shapes")
        .arg(serde_json::to_string(shapes)?)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .with_context(|| format!("running {python} {}", script.display()))?;
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("peer script {} failed ({})", script.display(), out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("peer JSON from {}", script.display()))
}

fn copy_json(copy: &CopyBandwidth) -> Value {
    json!({"bytes": copy.bytes, "memcpy_gbps": copy.memcpy_gbps, "kernel_gbps": copy.kernel_gbps, "best_gbps": copy.best_gbps()})
}

/// Writes `doc` to `path` (default `target/bench/DEFAULT_NAME`), creating the folder.
fn write_json(path: Option<&PathBuf>, default_name: &str, doc: &Value) -> anyhow::Result<()> {
    let path = path.cloned().unwrap_or_else(|| crate::project_root().join("target/bench").join(default_name));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&path, serde_json::to_string_pretty(doc)?).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

pub(crate) fn run(args: &CudaSsuBenchArgs) -> anyhow::Result<Value> {
    let (be, device, copy) = start(args.copy_bytes)?;
    let copy_gbps = copy.best_gbps();
    let mut shapes = Vec::new();
    for tokens in [1usize, 4] {
        for state in [DType::F32, DType::BF16] {
            for &b in &args.batches {
                shapes.push(SsuBenchShape::mamba2_2p7b(b, state, tokens));
            }
        }
    }
    let mut ours = Vec::new();
    for s in &shapes {
        let r = bench_ssu(&be, s).with_context(|| format!("bench {}", s.label()))?;
        println!("ours {:<30} {:9.2} us {:8.1} GB/s {:5.3} of copy", s.label(), r.us, r.gbps, r.gbps / copy_gbps);
        ours.push(r);
    }
    drop(be);

    let peer: Option<Value> = match &args.peer_vllm {
        None => None,
        Some(dir) => {
            let script = args.peer_script.clone().unwrap_or_else(|| default_peer_script("ssu_peer.py"));
            let shape_json: Vec<Value> = shapes
                .iter()
                .map(|s| {
                    json!({"batch": s.batch, "state": state_name(s.state), "tokens": s.tokens, "heads": s.heads,
                           "dim": s.dim, "dstate": s.dstate, "groups": s.groups})
                })
                .collect();
            Some(run_peer(&args.python, &script, dir, &shape_json)?)
        }
    };
    let peer_rows: Vec<Value> = peer.as_ref().and_then(|p| p["results"].as_array().cloned()).unwrap_or_default();

    println!();
    if let Some(p) = &peer {
        println!("peer: {} (torch {}, triton {})", p["peer"], p["torch"], p["triton"]);
    }
    println!(
        "{:<6} {:>5} {:>6} | {:>9} {:>8} {:>6} | {:>9} {:>8} {:>6} | {:>7}",
        "state", "batch", "tokens", "ours us", "GB/s", "copy", "peer us", "GB/s", "copy", "speedup"
    );
    let mut rows = Vec::new();
    for r in &ours {
        let s = r.shape;
        let p = peer_rows.iter().find(|v| {
            v["batch"].as_u64() == Some(s.batch as u64)
                && v["tokens"].as_u64() == Some(s.tokens as u64)
                && v["state"].as_str() == Some(state_name(s.state))
        });
        let (pus, pgbps) = p.map_or((f64::NAN, f64::NAN), |v| {
            (v["us"].as_f64().unwrap_or(f64::NAN), v["gbps"].as_f64().unwrap_or(f64::NAN))
        });
        println!(
            "{:<6} {:>5} {:>6} | {:>9.2} {:>8.1} {:>6.3} | {:>9.2} {:>8.1} {:>6.3} | {:>7.2}",
            state_name(s.state),
            s.batch,
            s.tokens,
            r.us,
            r.gbps,
            r.gbps / copy_gbps,
            pus,
            pgbps,
            pgbps / copy_gbps,
            pus / r.us
        );
        rows.push(json!({
            "state": state_name(s.state), "batch": s.batch, "tokens": s.tokens, "heads": s.heads, "dim": s.dim,
            "dstate": s.dstate, "groups": s.groups, "bytes": s.bytes(), "us": r.us, "gbps": r.gbps,
            "fraction_of_copy": r.gbps / copy_gbps, "pools": r.pools, "calls_per_graph": r.calls_per_graph,
            "peer_us": pus, "peer_gbps": pgbps, "peer_fraction_of_copy": pgbps / copy_gbps, "speedup_vs_peer": pus / r.us,
        }));
    }
    let doc = json!({
        "device": device,
        "copy": copy_json(&copy),
        "peer": peer.as_ref().map(|p| json!({"name": p["peer"], "torch": p["torch"], "triton": p["triton"]})),
        "rows": rows,
    });
    write_json(args.json.as_ref(), "ssu_cuda.json", &doc)?;
    Ok(doc)
}

/// Options of the CUDA GDN bench.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CudaGdnBenchArgs {
    /// Batches to time (plain decode, one token).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256,1024")]
    pub(crate) batches: Vec<usize>,
    /// Batch of the speculative step (0: none).
    #[arg(long, default_value_t = 64)]
    pub(crate) spec_batch: usize,
    /// Tokens per sequence of the speculative step.
    #[arg(long, default_value_t = 3)]
    pub(crate) spec_tokens: usize,
    /// Folder with the extracted vLLM files (see xtask/peers/gdn_peer.py); runs the peer.
    #[arg(long)]
    pub(crate) peer_vllm: Option<PathBuf>,
    /// The peer script (default: xtask/peers/gdn_peer.py next to the workspace, or
    /// peers/gdn_peer.py next to the running binary in a GPU bundle).
    #[arg(long)]
    pub(crate) peer_script: Option<PathBuf>,
    /// Python interpreter for the peer.
    #[arg(long, default_value = "python3")]
    pub(crate) python: String,
    /// Where to write the JSON result.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Bytes of each buffer of the copy-bandwidth measurement.
    #[arg(long, default_value_t = 2 << 30)]
    pub(crate) copy_bytes: usize,
}

/// The GDN bench shapes: both ops, f32 and bf16 state, plain decode at every batch, then the
/// speculative step.
pub(crate) fn gdn_shapes(args: &CudaGdnBenchArgs) -> Vec<GdnBenchShape> {
    let mut shapes = Vec::new();
    for op in [GdnBenchOp::SigmoidGating, GdnBenchOp::Recurrent] {
        for state in [DType::F32, DType::BF16] {
            for &b in &args.batches {
                shapes.push(GdnBenchShape::qwen3_next(op, b, state, 1));
            }
            if args.spec_batch > 0 && args.spec_tokens > 1 {
                shapes.push(GdnBenchShape::qwen3_next(op, args.spec_batch, state, args.spec_tokens));
            }
        }
    }
    shapes
}

/// The peer's timing of `kernel` on shape `s`: (µs, GB/s), NaN where the peer has none.
fn peer_timing(rows: &[Value], s: &GdnBenchShape, kernel: &str) -> (f64, f64) {
    let found = rows.iter().find(|v| {
        v["kernel"].as_str() == Some(kernel)
            && v["batch"].as_u64() == Some(s.batch as u64)
            && v["tokens"].as_u64() == Some(s.tokens as u64)
            && v["state"].as_str() == Some(state_name(s.state))
    });
    found.map_or((f64::NAN, f64::NAN), |v| {
        (v["us"].as_f64().unwrap_or(f64::NAN), v["gbps"].as_f64().unwrap_or(f64::NAN))
    })
}

/// vLLM's packed single-token decode kernel (gates fused, q/k/v in one `mixed_qkv` row).
const PACKED_DECODE: &str = "fused_recurrent_gated_delta_rule_packed_decode";

pub(crate) fn run_gdn(args: &CudaGdnBenchArgs) -> anyhow::Result<Value> {
    let (be, device, copy) = start(args.copy_bytes)?;
    let copy_gbps = copy.best_gbps();
    let shapes = gdn_shapes(args);
    let mut ours = Vec::new();
    for s in &shapes {
        let r = bench_gdn(&be, s).with_context(|| format!("bench {}", s.label()))?;
        println!("ours {:<42} {:9.2} us {:8.1} GB/s {:5.3} of copy", s.label(), r.us, r.gbps, r.gbps / copy_gbps);
        ours.push(r);
    }
    drop(be);

    let peer: Option<Value> = match &args.peer_vllm {
        None => None,
        Some(dir) => {
            let script = args.peer_script.clone().unwrap_or_else(|| default_peer_script("gdn_peer.py"));
            let shape_json: Vec<Value> = shapes
                .iter()
                .map(|s| {
                    json!({"op": s.op.short(), "batch": s.batch, "state": state_name(s.state), "tokens": s.tokens,
                           "heads": s.heads, "v_heads": s.v_heads, "k": s.k, "v": s.v, "bytes": s.bytes()})
                })
                .collect();
            Some(run_peer(&args.python, &script, dir, &shape_json)?)
        }
    };
    let peer_rows: Vec<Value> = peer.as_ref().and_then(|p| p["results"].as_array().cloned()).unwrap_or_default();

    println!();
    if let Some(p) = &peer {
        println!("peer: {} (torch {}, triton {})", p["peer"], p["torch"], p["triton"]);
        println!("peer = vLLM's kernel of the same name; packed = {PACKED_DECODE} (gates fused, one token)");
    }
    println!(
        "{:<9} {:<5} {:>5} {:>6} | {:>9} {:>8} {:>6} | {:>9} {:>8} {:>6} {:>7} | {:>9} {:>6} {:>7}",
        "op",
        "state",
        "batch",
        "tokens",
        "ours us",
        "GB/s",
        "copy",
        "peer us",
        "GB/s",
        "copy",
        "speedup",
        "packed us",
        "copy",
        "speedup"
    );
    let mut rows = Vec::new();
    for r in &ours {
        let s = r.shape;
        let (pus, pgbps) = peer_timing(&peer_rows, &s, s.op.name());
        let (kus, kgbps) = if s.op == GdnBenchOp::SigmoidGating && s.tokens == 1 {
            peer_timing(&peer_rows, &s, PACKED_DECODE)
        } else {
            (f64::NAN, f64::NAN)
        };
        println!(
            "{:<9} {:<5} {:>5} {:>6} | {:>9.2} {:>8.1} {:>6.3} | {:>9.2} {:>8.1} {:>6.3} {:>7.2} | {:>9.2} {:>6.3} {:>7.2}",
            s.op.short(),
            state_name(s.state),
            s.batch,
            s.tokens,
            r.us,
            r.gbps,
            r.gbps / copy_gbps,
            pus,
            pgbps,
            pgbps / copy_gbps,
            pus / r.us,
            kus,
            kgbps / copy_gbps,
            kus / r.us
        );
        rows.push(json!({
            "op": s.op.name(), "state": state_name(s.state), "batch": s.batch, "tokens": s.tokens,
            "heads": s.heads, "v_heads": s.v_heads, "k": s.k, "v": s.v, "bytes": s.bytes(),
            "us": r.us, "gbps": r.gbps, "fraction_of_copy": r.gbps / copy_gbps,
            "pools": r.pools, "calls_per_graph": r.calls_per_graph,
            "peer_us": pus, "peer_gbps": pgbps, "peer_fraction_of_copy": pgbps / copy_gbps, "speedup_vs_peer": pus / r.us,
            "packed_us": kus, "packed_gbps": kgbps, "packed_fraction_of_copy": kgbps / copy_gbps,
            "speedup_vs_packed": kus / r.us,
        }));
    }
    let doc = json!({
        "device": device,
        "copy": copy_json(&copy),
        "peer": peer.as_ref().map(|p| json!({"name": p["peer"], "torch": p["torch"], "triton": p["triton"]})),
        "rows": rows,
    });
    write_json(args.json.as_ref(), "gdn_cuda.json", &doc)?;
    Ok(doc)
}
