//! The CUDA path of `cargo xtask bench --op ssu --backend cuda`: the card's copy bandwidth,
//! our SSU kernel on the Mamba2-2.7B shapes, and (with `--peer-vllm DIR`) vLLM's own Triton
//! `selective_state_update` on the same shapes in the same run, through
//! `xtask/peers/ssu_peer.py`. Prints a table and writes JSON.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use ssm_cuda::CudaBackend;
use ssm_cuda::bench::{SsuBenchShape, bench_ssu, measure_copy_bandwidth};
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

fn default_peer_script() -> PathBuf {
    let bundled = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("../peers/ssu_peer.py")));
    match bundled {
        Some(p) if p.exists() => p,
        _ => crate::project_root().join("xtask/peers/ssu_peer.py"),
    }
}

pub(crate) fn run(args: &CudaSsuBenchArgs) -> anyhow::Result<Value> {
    let be = CudaBackend::new(0).context("CUDA backend")?;
    let device = be.device_name().unwrap_or_else(|_| "?".into());
    println!("device: {device} ({}), NVRTC {:?}", be.arch(), ssm_cuda::nvrtc_version().ok());
    let copy = measure_copy_bandwidth(&be, args.copy_bytes).context("copy bandwidth")?;
    let copy_gbps = copy.best_gbps();
    println!(
        "copy bandwidth ({} MiB, read+write): cuMemcpyDtoDAsync {:.0} GB/s, 16-byte kernel {:.0} GB/s -> {:.0} GB/s",
        copy.bytes >> 20,
        copy.memcpy_gbps,
        copy.kernel_gbps,
        copy_gbps
    );
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
            let script = args.peer_script.clone().unwrap_or_else(default_peer_script);
            let shape_json: Vec<Value> = shapes
                .iter()
                .map(|s| {
                    json!({"batch": s.batch, "state": state_name(s.state), "tokens": s.tokens, "heads": s.heads,
                           "dim": s.dim, "dstate": s.dstate, "groups": s.groups})
                })
                .collect();
            let out = Command::new(&args.python)
                .arg(&script)
                .arg("--vllm")
                .arg(dir)
                .arg("--shapes")
                .arg(serde_json::to_string(&shape_json)?)
                .env("PYTHONUNBUFFERED", "1")
                .output()
                .with_context(|| format!("running {} {}", args.python, script.display()))?;
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            if !out.status.success() {
                bail!("peer script failed ({})", out.status);
            }
            Some(serde_json::from_slice(&out.stdout).context("peer JSON")?)
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
        "copy": {"bytes": copy.bytes, "memcpy_gbps": copy.memcpy_gbps, "kernel_gbps": copy.kernel_gbps, "best_gbps": copy_gbps},
        "peer": peer.as_ref().map(|p| json!({"name": p["peer"], "torch": p["torch"], "triton": p["triton"]})),
        "rows": rows,
    });
    let path = args.json.clone().unwrap_or_else(|| crate::project_root().join("target/bench/ssu_cuda.json"));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(doc)
}
