//! The CUDA paths of `cargo xtask bench --backend cuda`: the card's copy bandwidth, then
//! - `--op ssu` (`bench-cuda-ssu`): our SSU kernel on the Mamba2-2.7B shapes and (with
//!   `--peer-vllm DIR`) vLLM's own Triton `selective_state_update` on the same shapes in the
//!   same run, through `xtask/peers/ssu_peer.py`; then ReplaySSM's checkpointing SSU on the
//!   one-token and 4-token steps against our plain SSU and (one token) vLLM's Triton ReplaySSM
//!   decode, through `xtask/peers/replayssm_peer.py`;
//! - `--op gdn` (`bench-cuda-gdn`): our recurrent GDN decode kernels on the Qwen3-Next shapes
//!   and (with `--peer-vllm DIR`) vLLM's Triton `fused_sigmoid_gating_delta_rule_update`,
//!   `fused_recurrent_gated_delta_rule_packed_decode` and `fused_recurrent_gated_delta_rule`,
//!   through `xtask/peers/gdn_peer.py`; then the decode step (`gdn_decode_step`) and the conv
//!   update alone (`causal_conv1d_update`, also `--op conv`) against vLLM's;
//! - `--op gdn` also runs `bench-cuda-gdn-chunk`: GDN chunked prefill against vLLM's Triton
//!   `chunk_gated_delta_rule`, through `xtask/peers/gdn_chunk_peer.py`;
//! - `--op ssd` (`bench-cuda-ssd`): our SSD chunked prefill on Mamba2-2.7B and Nemotron-H-8B
//!   prefills and (with `--peer-vllm DIR`) vLLM's Triton `mamba_chunk_scan_combined_varlen`,
//!   through `xtask/peers/ssd_peer.py`.
//!
//! Each prints a table and writes JSON.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use ssm_cuda::CudaBackend;
use ssm_cuda::bench::{BenchResult, CopyBandwidth, SsuBenchShape, bench_ssu, measure_copy_bandwidth};
use ssm_cuda::bench_gdn::{GdnBenchOp, GdnBenchShape, bench_gdn};
use ssm_cuda::bench_gdn_chunk::{GdnChunkBenchShape, bench_gdn_chunk};
use ssm_cuda::bench_ring::{ReplaySsmBenchShape, bench_replayssm};
use ssm_cuda::bench_ssd::{SsdBenchShape, bench_ssd};
use ssm_tensor::DType;

/// Options every CUDA bench shares: the peer, the JSON output, the copy measurement.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CudaBenchCommon {
    /// Folder with the extracted vLLM files (see the op's peer script, xtask/peers/OP_peer.py);
    /// runs the peer.
    #[arg(long)]
    pub(crate) peer_vllm: Option<PathBuf>,
    /// The peer script (default: xtask/peers/OP_peer.py next to the workspace, or
    /// peers/OP_peer.py next to the running binary in a GPU bundle).
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
    /// State dtypes to time, in this order (e.g. `bf16` alone, to profile one configuration).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    pub(crate) states: Vec<StateDtype>,
}

/// A state dtype the CUDA benches time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StateDtype {
    /// f32 state.
    F32,
    /// bf16 state.
    Bf16,
}

impl StateDtype {
    fn dtype(self) -> DType {
        match self {
            StateDtype::F32 => DType::F32,
            StateDtype::Bf16 => DType::BF16,
        }
    }
}

impl CudaBenchCommon {
    /// The defaults of the command line, with the peer (when given) and the JSON path.
    pub(crate) fn new(peer_vllm: Option<PathBuf>, json: Option<PathBuf>) -> Self {
        CudaBenchCommon {
            peer_vllm,
            peer_script: None,
            python: "python3".into(),
            json,
            copy_bytes: 2 << 30,
            states: vec![StateDtype::F32, StateDtype::Bf16],
        }
    }
}

/// Options of the CUDA SSU bench.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CudaSsuBenchArgs {
    /// Batches to time.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256,1024")]
    pub(crate) batches: Vec<usize>,
    /// Also time FlashInfer's block-scaled i16 state (one and four tokens; `--int16 false`: not).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) int16: bool,
    /// Also time the block-scaled i8 state (one and four tokens; `--int8 false`: not).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) int8: bool,
    /// Tokens per sequence to time (1: decode; 4: the speculative, verification and ReplaySSM
    /// rows, which need 4). `--tokens 1` times the decode rows alone (tuning sweeps).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) tokens: Vec<usize>,
    /// SSU algorithms (`ssu_algorithm`) to time on the f32 / bf16 shapes, each beside the others
    /// shape by shape: `auto` (what a runtime runs), `simple`, `vertical`, `horizontal`. The
    /// measurements `auto`'s table records come from `--algorithms simple,vertical,horizontal`.
    #[arg(long, value_delimiter = ',', default_value = "auto", value_parser = parse_algorithm)]
    pub(crate) algorithms: Vec<ssm_ssu::SsuAlgorithm>,
    #[command(flatten)]
    pub(crate) common: CudaBenchCommon,
}

fn parse_algorithm(s: &str) -> Result<ssm_ssu::SsuAlgorithm, String> {
    s.parse().map_err(|e: ssm_ssu::SsuError| e.to_string())
}

fn state_name(t: DType) -> &'static str {
    match t {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::I16 => "i16",
        DType::I8 => "i8",
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

/// A bench shape as the shared run loop sees it.
trait CudaBenchShape {
    /// Width of the label column of the "ours" lines.
    const LABEL_WIDTH: usize;
    fn label(&self) -> String;
    /// The shape as the peer script reads it.
    fn peer_json(&self) -> Value;
    /// (batch, tokens, state dtype): what a peer result row is matched on.
    fn key(&self) -> (usize, usize, DType);
    /// Whether the shape's sequences have varied lengths (prefill shapes; a peer row without the
    /// field has equal ones).
    fn varied(&self) -> bool {
        false
    }
    /// Whether a peer result row has this shape's `batch`, `tokens` and `state` (those of
    /// [`key`](Self::key)) and `varied`.
    fn key_matches(&self, row: &Value) -> bool {
        let (batch, tokens, state) = self.key();
        row["batch"].as_u64() == Some(batch as u64)
            && row["tokens"].as_u64() == Some(tokens as u64)
            && row["state"].as_str() == Some(state_name(state))
            && row["varied"].as_bool().unwrap_or(false) == self.varied()
    }
    /// Whether a peer result row times this shape (by default: [`key_matches`](Self::key_matches)).
    fn matches_peer(&self, row: &Value) -> bool {
        self.key_matches(row)
    }
    /// Whether the peer runs this shape at all.
    fn has_peer(&self) -> bool {
        true
    }
}

impl CudaBenchShape for SsuBenchShape {
    const LABEL_WIDTH: usize = 30;
    fn label(&self) -> String {
        SsuBenchShape::label(self)
    }
    fn peer_json(&self) -> Value {
        json!({"batch": self.batch, "state": state_name(self.state), "tokens": self.tokens, "heads": self.heads,
               "dim": self.dim, "dstate": self.dstate, "groups": self.groups})
    }
    fn has_peer(&self) -> bool {
        // vLLM has no block-scaled integer state.
        ssm_ssu::quant::limit(self.state).is_none()
    }
    fn key(&self) -> (usize, usize, DType) {
        (self.batch, self.tokens, self.state)
    }
}

impl CudaBenchShape for GdnBenchShape {
    const LABEL_WIDTH: usize = 42;
    fn label(&self) -> String {
        GdnBenchShape::label(self)
    }
    fn peer_json(&self) -> Value {
        json!({"op": self.op.short(), "batch": self.batch, "state": state_name(self.state), "tokens": self.tokens,
               "heads": self.heads, "v_heads": self.v_heads, "k": self.k, "v": self.v, "bytes": self.bytes()})
    }
    fn key(&self) -> (usize, usize, DType) {
        (self.batch, self.tokens, self.state)
    }
}

impl CudaBenchShape for GdnChunkBenchShape {
    const LABEL_WIDTH: usize = 34;
    fn label(&self) -> String {
        GdnChunkBenchShape::label(self)
    }
    fn peer_json(&self) -> Value {
        json!({"batch": self.batch, "seqlen": self.seqlen, "tokens": self.tokens(), "state": state_name(self.state),
               "heads": self.heads, "v_heads": self.v_heads, "k": self.k, "v": self.v, "bytes": self.bytes(),
               "flops": self.flops(), "varied": self.varied, "lens": self.lengths()})
    }
    fn key(&self) -> (usize, usize, DType) {
        (self.batch, self.tokens(), self.state)
    }
    fn varied(&self) -> bool {
        self.varied
    }
}

impl PrefillShape for GdnChunkBenchShape {
    fn tokens(&self) -> usize {
        GdnChunkBenchShape::tokens(self)
    }
    fn flops(&self) -> f64 {
        GdnChunkBenchShape::flops(self)
    }
    fn row_fields(&self) -> Value {
        json!({"state": state_name(self.state), "batch": self.batch, "seqlen": self.seqlen, "varied": self.varied, "heads": self.heads,
               "v_heads": self.v_heads, "k": self.k, "v": self.v, "bytes": self.bytes()})
    }
}

impl PrefillShape for SsdBenchShape {
    fn tokens(&self) -> usize {
        SsdBenchShape::tokens(self)
    }
    fn flops(&self) -> f64 {
        SsdBenchShape::flops(self)
    }
    fn row_fields(&self) -> Value {
        json!({"state": state_name(self.state), "batch": self.batch, "seqlen": self.seqlen, "varied": self.varied, "heads": self.heads,
               "dim": self.dim, "dstate": self.dstate, "groups": self.groups, "chunk": self.chunk,
               "bytes": self.bytes()})
    }
}

impl CudaBenchShape for SsdBenchShape {
    const LABEL_WIDTH: usize = 36;
    fn label(&self) -> String {
        SsdBenchShape::label(self)
    }
    fn peer_json(&self) -> Value {
        json!({"batch": self.batch, "seqlen": self.seqlen, "tokens": self.tokens(), "state": state_name(self.state),
               "heads": self.heads, "dim": self.dim, "dstate": self.dstate, "groups": self.groups,
               "chunk": self.chunk, "bytes": self.bytes(), "flops": self.flops(), "varied": self.varied,
               "lens": self.lengths()})
    }
    fn key(&self) -> (usize, usize, DType) {
        (self.batch, self.tokens(), self.state)
    }
    fn varied(&self) -> bool {
        self.varied
    }
    fn matches_peer(&self, row: &Value) -> bool {
        self.key_matches(row)
            && row["heads"].as_u64() == Some(self.heads as u64)
            && row["groups"].as_u64() == Some(self.groups as u64)
    }
}

/// What one bench run measured: the device, its copy bandwidth, our timings and the peer's
/// document (with `--peer-vllm`).
struct Measured<S> {
    device: String,
    copy: CopyBandwidth,
    ours: Vec<BenchResult<S>>,
    peer: Option<Value>,
}

/// Times every shape with `bench` on device 0 (printing a line each), then, with
/// `--peer-vllm`, runs the peer script (`script_name` by default) on the same shapes.
fn measure<S: CudaBenchShape>(
    common: &CudaBenchCommon,
    shapes: &[S],
    bench: impl Fn(&CudaBackend, &S) -> Result<BenchResult<S>, ssm_cuda::CudaError>,
    script_name: &str,
) -> anyhow::Result<Measured<S>> {
    let (be, device, copy) = start(common.copy_bytes)?;
    let copy_gbps = copy.best_gbps();
    let mut ours = Vec::new();
    for s in shapes {
        let r = bench(&be, s).with_context(|| format!("bench {}", s.label()))?;
        println!(
            "ours {:<width$} {:9.2} us {:8.1} GB/s {:5.3} of copy",
            s.label(),
            r.us,
            r.gbps,
            r.gbps / copy_gbps,
            width = S::LABEL_WIDTH
        );
        ours.push(r);
    }
    drop(be);

    let peer: Option<Value> = match &common.peer_vllm {
        None => None,
        Some(dir) => {
            let script = common.peer_script.clone().unwrap_or_else(|| default_peer_script(script_name));
            // Shapes that differ only in what the peer does not see (e.g. our algorithm) once.
            let mut shape_json: Vec<Value> = Vec::new();
            for v in shapes.iter().filter(|s| s.has_peer()).map(S::peer_json) {
                if !shape_json.contains(&v) {
                    shape_json.push(v);
                }
            }
            Some(run_peer(&common.python, &script, dir, &shape_json)?)
        }
    };
    println!();
    if let Some(p) = &peer {
        println!("peer: {} (torch {}, triton {})", p["peer"], p["torch"], p["triton"]);
    }
    Ok(Measured { device, copy, ours, peer })
}

/// Our timing of one shape against the peer's (NaN where the peer has none), both judged
/// against the copy bandwidth.
struct VsPeer<'a, S> {
    ours: &'a BenchResult<S>,
    peer_us: f64,
    peer_gbps: f64,
    copy_gbps: f64,
}

impl<S> VsPeer<'_, S> {
    /// The table's "ours us, GB/s, copy | peer us, GB/s, copy" columns.
    fn columns(&self) -> String {
        let (r, copy) = (self.ours, self.copy_gbps);
        format!(
            "{:>9.2} {:>8.1} {:>6.3} | {:>9.2} {:>8.1} {:>6.3}",
            r.us,
            r.gbps,
            r.gbps / copy,
            self.peer_us,
            self.peer_gbps,
            self.peer_gbps / copy
        )
    }

    /// `row` (the shape's fields) with the timing fields added.
    fn json_row(&self, mut row: Value) -> Value {
        let (r, copy, pus, pgbps) = (self.ours, self.copy_gbps, self.peer_us, self.peer_gbps);
        let timing = json!({
            "us": r.us, "gbps": r.gbps, "fraction_of_copy": r.gbps / copy,
            "pools": r.pools, "calls_per_graph": r.calls_per_graph,
            "peer_us": pus, "peer_gbps": pgbps, "peer_fraction_of_copy": pgbps / copy, "speedup_vs_peer": pus / r.us,
        });
        if let (Some(row), Value::Object(timing)) = (row.as_object_mut(), timing) {
            row.extend(timing);
        }
        row
    }
}

impl<S: CudaBenchShape> Measured<S> {
    /// Our result `r` against the peer's timing of its shape (of `kernel`, where the peer runs
    /// several).
    fn vs_peer<'a>(&self, r: &'a BenchResult<S>, kernel: Option<&str>) -> VsPeer<'a, S> {
        let (peer_us, peer_gbps) = self.peer_timing(&r.shape, kernel);
        VsPeer { ours: r, peer_us, peer_gbps, copy_gbps: self.copy.best_gbps() }
    }

    /// The peer's timing of shape `s` (of `kernel`, where the peer runs several): (µs, GB/s),
    /// NaN where the peer has none.
    fn peer_timing(&self, s: &S, kernel: Option<&str>) -> (f64, f64) {
        let rows = self.peer.as_ref().and_then(|p| p["results"].as_array());
        let found = rows
            .into_iter()
            .flatten()
            .find(|v| kernel.is_none_or(|k| v["kernel"].as_str() == Some(k)) && s.matches_peer(v));
        found.map_or((f64::NAN, f64::NAN), |v| {
            (v["us"].as_f64().unwrap_or(f64::NAN), v["gbps"].as_f64().unwrap_or(f64::NAN))
        })
    }

    /// The result document (device, copy, peer, `rows`), written to `--json` (default
    /// `target/bench/DEFAULT_NAME`, creating the folder).
    fn write(&self, common: &CudaBenchCommon, default_name: &str, rows: Vec<Value>) -> anyhow::Result<Value> {
        let copy = &self.copy;
        let doc = json!({
            "device": self.device,
            "copy": {"bytes": copy.bytes, "memcpy_gbps": copy.memcpy_gbps, "kernel_gbps": copy.kernel_gbps,
                     "best_gbps": copy.best_gbps()},
            "peer": self.peer.as_ref().map(|p| json!({"name": p["peer"], "torch": p["torch"], "triton": p["triton"]})),
            "rows": rows,
        });
        let path = common.json.clone().unwrap_or_else(|| crate::project_root().join("target/bench").join(default_name));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).ok();
        }
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
        for svg in plot_doc(&doc, &path)? {
            println!("wrote {}", svg.display());
        }
        Ok(doc)
    }
}

/// SVG plots of a result document's decode rows beside its JSON at `json`: one per op (rows
/// without an `op` field are the document's own op), the fraction of the copy limit against
/// batch for ours and for each vLLM kernel the row names (`peer_…`, `packed_…`), one line per
/// (state, tokens). Prefill rows (with a `seqlen`) are left out: a fraction of copy against
/// batch does not describe them. Returns the paths written.
fn plot_doc(doc: &Value, json: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    use crate::bench::{PlotSeries, plot_fractions};
    let stem = json.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    let device = doc["device"].as_str().unwrap_or("GPU");
    let rows: Vec<&Value> = doc["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r.get("seqlen").is_none() && r["batch"].is_u64() && r["fraction_of_copy"].is_f64())
        .collect();
    let mut ops: Vec<&str> = rows.iter().map(|r| r["op"].as_str().unwrap_or("")).collect();
    ops.sort_unstable();
    ops.dedup();
    let mut paths = Vec::new();
    for op in ops {
        let mut series = PlotSeries::default();
        for r in rows.iter().filter(|r| r["op"].as_str().unwrap_or("") == op) {
            let batch = r["batch"].as_u64().unwrap_or(1) as f64;
            let tokens = r["tokens"].as_u64().unwrap_or(1);
            let verify = if r["verify"].as_bool() == Some(true) { " verify" } else { "" };
            let key = format!(
                "{} state, {tokens} token{}{verify}",
                r["state"].as_str().unwrap_or("?"),
                if tokens == 1 { "" } else { "s" }
            );
            // An SSU row of a named algorithm (not `auto`) is its own series; the peer's is drawn
            // once, from the `auto` rows or the first algorithm's.
            let algorithm = r["algorithm"].as_str().filter(|&a| a != "auto");
            let ours = algorithm.map_or_else(|| format!("ours: {key}"), |a| format!("ours {a}: {key}"));
            series.add(ours, (batch, r["fraction_of_copy"].as_f64().unwrap_or(f64::NAN)), false);
            for (field, who) in [("peer_fraction_of_copy", "vLLM"), ("packed_fraction_of_copy", "vLLM packed")] {
                if let Some(f) = r[field].as_f64().filter(|f| f.is_finite()) {
                    series.add(format!("{who}: {key}"), (batch, f), true);
                }
            }
        }
        let (name, what) = if op.is_empty() { (stem.to_string(), stem) } else { (format!("{stem}_{op}"), op) };
        let path = json.with_file_name(format!("{name}.svg"));
        plot_fractions(&path, &format!("{what}: fraction of the copy limit ({device})"), &series)?;
        paths.push(path);
    }
    Ok(paths)
}

pub(crate) fn run(args: &CudaSsuBenchArgs) -> anyhow::Result<Value> {
    let mut shapes = Vec::new();
    let four = args.tokens.contains(&4);
    for &tokens in &args.tokens {
        for state in args.common.states.iter().map(|s| s.dtype()) {
            for &b in &args.batches {
                for &algorithm in &args.algorithms {
                    shapes.push(SsuBenchShape { algorithm, ..SsuBenchShape::mamba2_2p7b(b, state, tokens) });
                }
            }
        }
    }
    // FlashInfer's verification (every token's state to an intermediate buffer, the pool not
    // written) on the 4-token shapes; the peer column is vLLM's committing call (it has no such
    // mode), which moves the same bytes.
    for state in args.common.states.iter().map(|s| s.dtype()).filter(|_| four) {
        for &b in &args.batches {
            shapes.push(SsuBenchShape { verify: true, ..SsuBenchShape::mamba2_2p7b(b, state, 4) });
        }
    }
    // Block-scaled integer states (no peer: vLLM has none); their column `vs f32` is the
    // f32-state call's time over their own.
    for (on, state) in [(args.int16, DType::I16), (args.int8, DType::I8)] {
        if !on {
            continue;
        }
        for &tokens in &args.tokens {
            for &b in &args.batches {
                shapes.push(SsuBenchShape::mamba2_2p7b(b, state, tokens));
            }
        }
    }
    let m = measure(&args.common, &shapes, bench_ssu, "ssu_peer.py")?;
    println!(
        "{:<6} {:>5} {:>6} | {:>9} {:>8} {:>6} | {:>9} {:>8} {:>6} | {:>7}",
        "state", "batch", "tokens", "ours us", "GB/s", "copy", "peer us", "GB/s", "copy", "speedup"
    );
    let mut rows = Vec::new();
    for r in &m.ours {
        let s = r.shape;
        let vs = m.vs_peer(r, None);
        let speedup = vs.peer_us / r.us;
        let tokens = if s.verify { format!("{}v", s.tokens) } else { s.tokens.to_string() };
        let tokens = format!("{tokens}{}", s.algorithm_tag());
        // An integer-state row against the f32-state call of the same shape, same run.
        let f32_us = m
            .ours
            .iter()
            .find(|o| o.shape == SsuBenchShape { state: DType::F32, ..s })
            .filter(|_| ssm_ssu::quant::limit(s.state).is_some())
            .map_or(f64::NAN, |o| o.us);
        let vs_f32 = if f32_us.is_nan() { String::new() } else { format!(" | vs f32 {:.2}", f32_us / r.us) };
        println!("{:<6} {:>5} {:>6} | {} | {speedup:>7.2}{vs_f32}", state_name(s.state), s.batch, tokens, vs.columns());
        let mut row = vs.json_row(json!({
            "state": state_name(s.state), "batch": s.batch, "tokens": s.tokens, "verify": s.verify, "heads": s.heads,
            "dim": s.dim, "dstate": s.dstate, "groups": s.groups, "bytes": s.bytes(),
            "algorithm": s.algorithm.name(),
        }));
        if !f32_us.is_nan() {
            row["f32_us"] = json!(f32_us);
            row["speedup_vs_f32"] = json!(f32_us / r.us);
        }
        rows.push(row);
    }
    if args.tokens.iter().any(|t| [1, 4].contains(t)) {
        rows.extend(replayssm_rows(args, &m)?);
    }
    m.write(&args.common, "ssu_cuda.json", rows)
}

/// ReplaySSM's checkpointing SSU (batches up to 256) on the one-token decode (window 15: a
/// ring of 16 rows) and the 4-token speculative step (window 16) among `--tokens`, in the same
/// process as the plain SSU just timed: time per step against our plain SSU's of the same
/// tokens, and bytes per accepted token (all `T` tokens accepted, the decode the bench's cursors
/// model). With `--peer-vllm`, the one-token rows run vLLM's Triton ReplaySSM decode
/// (`xtask/peers/replayssm_peer.py`) on the same shapes; vLLM's speculative ReplaySSM is
/// FlashInfer's, not a Triton kernel of the wheel, so the 4-token rows have no peer.
fn replayssm_rows(args: &CudaSsuBenchArgs, m: &Measured<SsuBenchShape>) -> anyhow::Result<Vec<Value>> {
    let (be, _, copy) = start(args.common.copy_bytes)?;
    let copy_gbps = copy.best_gbps();
    let mut shapes = Vec::new();
    for tokens in [1, 4].into_iter().filter(|t| args.tokens.contains(t)) {
        for state in args.common.states.iter().map(|s| s.dtype()) {
            for &b in args.batches.iter().filter(|&&b| b <= 256) {
                shapes.push(ReplaySsmBenchShape::mamba2_2p7b(b, state, tokens));
            }
        }
    }
    let mut ours = Vec::new();
    for s in &shapes {
        let r = bench_replayssm(&be, s).with_context(|| format!("bench {}", s.label()))?;
        println!("ours {:<44} {:9.2} us {:8.1} GB/s {:5.3} of copy", s.label(), r.us, r.gbps, r.gbps / copy_gbps);
        ours.push(r);
    }
    drop(be);
    let peer = match &args.common.peer_vllm {
        None => None,
        Some(dir) => {
            // Beside the SSU's peer script when one was named (a bundle's `peers/`).
            let script = match args.common.peer_script.as_ref().and_then(|p| p.parent()) {
                Some(dir) => dir.join("replayssm_peer.py"),
                None => default_peer_script("replayssm_peer.py"),
            };
            let peer_shapes: Vec<Value> = shapes
                .iter()
                .filter(|s| s.tokens == 1)
                .map(|s| {
                    json!({"batch": s.batch, "state": state_name(s.state), "tokens": s.tokens, "heads": s.heads,
                           "dim": s.dim, "dstate": s.dstate, "groups": s.groups, "window": s.window})
                })
                .collect();
            let p = run_peer(&args.common.python, &script, dir, &peer_shapes)?;
            println!("peer: {} (torch {}, triton {})", p["peer"], p["torch"], p["triton"]);
            Some(p)
        }
    };
    println!(
        "{:<6} {:>5} {:>6} {:>3} | {:>9} {:>8} {:>6} | {:>9} | {:>7} | {:>9} {:>6} | {:>7} | {:>10} {:>10}",
        "state",
        "batch",
        "tokens",
        "W",
        "replay us",
        "GB/s",
        "copy",
        "plain us",
        "speedup",
        "vllm us",
        "copy",
        "vs vllm",
        "B/tok rep",
        "B/tok plain"
    );
    let mut rows = Vec::new();
    for r in &ours {
        let s = r.shape;
        let plain = m.ours.iter().find(|o| {
            o.shape.batch == s.batch && o.shape.tokens == s.tokens && o.shape.state == s.state && !o.shape.verify
        });
        let (plain_us, plain_bytes) = plain.map_or((f64::NAN, f64::NAN), |p| (p.us, p.shape.bytes() as f64));
        let found = peer.as_ref().and_then(|p| p["results"].as_array()).into_iter().flatten().find(|v| {
            v["batch"].as_u64() == Some(s.batch as u64)
                && v["tokens"].as_u64() == Some(s.tokens as u64)
                && v["state"].as_str() == Some(state_name(s.state))
        });
        let (peer_us, peer_gbps) = found.map_or((f64::NAN, f64::NAN), |v| {
            (v["us"].as_f64().unwrap_or(f64::NAN), v["gbps"].as_f64().unwrap_or(f64::NAN))
        });
        let accepted = (s.batch * s.tokens) as f64;
        println!(
            "{:<6} {:>5} {:>6} {:>3} | {:>9.2} {:>8.1} {:>6.3} | {:>9.2} | {:>7.2} | {:>9.2} {:>6.3} | {:>7.2} | {:>10.0} {:>10.0}",
            state_name(s.state),
            s.batch,
            s.tokens,
            s.window,
            r.us,
            r.gbps,
            r.gbps / copy_gbps,
            plain_us,
            plain_us / r.us,
            peer_us,
            peer_gbps / copy_gbps,
            peer_us / r.us,
            s.bytes() as f64 / accepted,
            plain_bytes / accepted
        );
        rows.push(json!({
            "op": "checkpointing_ssu", "state": state_name(s.state), "batch": s.batch, "tokens": s.tokens,
            "window": s.window, "ring": s.ring_len(), "flushing": s.flushing(), "heads": s.heads, "dim": s.dim,
            "dstate": s.dstate, "bytes": s.bytes(), "us": r.us, "gbps": r.gbps, "fraction_of_copy": r.gbps / copy_gbps,
            "copy_gbps": copy_gbps, "plain_us": plain_us, "speedup_vs_plain": plain_us / r.us,
            "peer_us": peer_us, "peer_gbps": peer_gbps, "peer_fraction_of_copy": peer_gbps / copy_gbps,
            "speedup_vs_peer": peer_us / r.us,
            "peer": found.map(|_| peer.as_ref().map(|p| p["peer"].clone())),
            "bytes_per_accepted_token": s.bytes() as f64 / accepted,
            "plain_bytes_per_accepted_token": plain_bytes / accepted,
        }));
    }
    Ok(rows)
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
    /// Batches of the decode step (`gdn_decode_step`, fused and as its two launches; the flag
    /// with no value: none).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,8,64,256")]
    pub(crate) step_batches: Vec<usize>,
    /// Batches of the conv update alone (`causal_conv1d_update` over the step's projected rows,
    /// conv dim 8192, width 4, bf16; the flag with no value: none).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,8,64,256,1024")]
    pub(crate) conv_batches: Vec<usize>,
    #[command(flatten)]
    pub(crate) common: CudaBenchCommon,
}

/// The GDN bench shapes: both ops, f32 and bf16 state, plain decode at every batch, then the
/// speculative step, the decode step (fused and its parts), then the conv update alone.
pub(crate) fn gdn_shapes(args: &CudaGdnBenchArgs) -> Vec<GdnBenchShape> {
    let mut shapes = Vec::new();
    for op in [GdnBenchOp::SigmoidGating, GdnBenchOp::Recurrent] {
        for state in args.common.states.iter().map(|s| s.dtype()) {
            for &b in &args.batches {
                shapes.push(GdnBenchShape::qwen3_next(op, b, state, 1));
            }
            if args.spec_batch > 0 && args.spec_tokens > 1 {
                shapes.push(GdnBenchShape::qwen3_next(op, args.spec_batch, state, args.spec_tokens));
            }
        }
    }
    for state in args.common.states.iter().map(|s| s.dtype()) {
        for &b in &args.step_batches {
            for op in [GdnBenchOp::Step, GdnBenchOp::StepParts, GdnBenchOp::StepFused] {
                shapes.push(GdnBenchShape::qwen3_next(op, b, state, 1));
            }
        }
    }
    shapes.extend(args.conv_batches.iter().map(|&b| GdnBenchShape::qwen3_next_conv(b)));
    shapes
}

/// vLLM's decode step as its layer runs it: `causal_conv1d_update`, then the packed decode on
/// the conv output (the peer script times the pair in one graph).
const STEP_PEER: &str = "causal_conv1d_update+fused_recurrent_gated_delta_rule_packed_decode";

/// vLLM's packed single-token decode kernel (gates fused, q/k/v in one `mixed_qkv` row).
const PACKED_DECODE: &str = "fused_recurrent_gated_delta_rule_packed_decode";

pub(crate) fn run_gdn(args: &CudaGdnBenchArgs) -> anyhow::Result<Value> {
    let shapes = gdn_shapes(args);
    let m = measure(&args.common, &shapes, bench_gdn, "gdn_peer.py")?;
    let copy_gbps = m.copy.best_gbps();
    if m.peer.is_some() {
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
    for r in m.ours.iter().filter(|r| !r.shape.op.is_step()) {
        let s = r.shape;
        let vs = m.vs_peer(r, Some(s.op.name()));
        let (kus, kgbps) = if s.op == GdnBenchOp::SigmoidGating && s.tokens == 1 {
            m.peer_timing(&s, Some(PACKED_DECODE))
        } else {
            (f64::NAN, f64::NAN)
        };
        println!(
            "{:<9} {:<5} {:>5} {:>6} | {} {:>7.2} | {:>9.2} {:>6.3} {:>7.2}",
            s.op.short(),
            state_name(s.state),
            s.batch,
            s.tokens,
            vs.columns(),
            vs.peer_us / r.us,
            kus,
            kgbps / copy_gbps,
            kus / r.us
        );
        rows.push(vs.json_row(json!({
            "op": s.op.name(), "state": state_name(s.state), "batch": s.batch, "tokens": s.tokens,
            "heads": s.heads, "v_heads": s.v_heads, "k": s.k, "v": s.v, "bytes": s.bytes(),
            "packed_us": kus, "packed_gbps": kgbps, "packed_fraction_of_copy": kgbps / copy_gbps,
            "speedup_vs_packed": kus / r.us,
        })));
    }
    step_table(&m, &mut rows);
    m.write(&args.common, "gdn_cuda.json", rows)
}

/// The decode step: fused against its own two launches and against vLLM's conv + packed decode.
fn step_table(m: &Measured<GdnBenchShape>, rows: &mut Vec<Value>) {
    let fused: Vec<_> = m.ours.iter().filter(|r| r.shape.op == GdnBenchOp::Step).collect();
    if fused.is_empty() {
        return;
    }
    let copy_gbps = m.copy.best_gbps();
    println!(
        "decode step (gdn_decode_step): step = its default route; parts = causal_conv1d_update + \
         fused_sigmoid_gating_delta_rule_update (two plain launches); fused = gdn_step_kernel (one launch); \
         vLLM = {STEP_PEER}"
    );
    println!(
        "{:<5} {:>5} | {:>9} {:>6} | {:>9} {:>6} {:>7} | {:>9} {:>6} {:>7} | {:>9} {:>6} {:>7}",
        "state",
        "batch",
        "step us",
        "copy",
        "parts us",
        "copy",
        "speedup",
        "fused us",
        "copy",
        "speedup",
        "vLLM us",
        "copy",
        "speedup"
    );
    for r in fused {
        let s = r.shape;
        let parts = m
            .ours
            .iter()
            .find(|p| p.shape.op == GdnBenchOp::StepParts && p.shape.batch == s.batch && p.shape.state == s.state);
        let (pus, pgbps) = parts.map_or((f64::NAN, f64::NAN), |p| (p.us, p.gbps));
        let fused = m
            .ours
            .iter()
            .find(|p| p.shape.op == GdnBenchOp::StepFused && p.shape.batch == s.batch && p.shape.state == s.state);
        let (fus, fgbps) = fused.map_or((f64::NAN, f64::NAN), |p| (p.us, p.gbps));
        let vs = m.vs_peer(r, Some(STEP_PEER));
        println!(
            "{:<5} {:>5} | {:>9.2} {:>6.3} | {:>9.2} {:>6.3} {:>7.2} | {:>9.2} {:>6.3} {:>7.2} | {:>9.2} {:>6.3} {:>7.2}",
            state_name(s.state),
            s.batch,
            r.us,
            r.gbps / copy_gbps,
            pus,
            pgbps / copy_gbps,
            pus / r.us,
            fus,
            fgbps / copy_gbps,
            fus / r.us,
            vs.peer_us,
            vs.peer_gbps / copy_gbps,
            vs.peer_us / r.us
        );
        rows.push(vs.json_row(json!({
            "op": s.op.name(), "state": state_name(s.state), "batch": s.batch, "tokens": s.tokens,
            "heads": s.heads, "v_heads": s.v_heads, "k": s.k, "v": s.v, "bytes": s.bytes(),
            "peer_kernel": STEP_PEER, "parts_us": pus, "parts_fraction_of_copy": pgbps / copy_gbps,
            "speedup_vs_parts": pus / r.us, "fused_us": fus, "fused_fraction_of_copy": fgbps / copy_gbps,
            "speedup_vs_fused": fus / r.us,
        })));
    }
}

/// A prefill bench shape: what the prefill table adds to [`CudaBenchShape`].
trait PrefillShape: CudaBenchShape + Copy {
    fn tokens(&self) -> usize;
    fn flops(&self) -> f64;
    /// The shape's own JSON fields (merged into its table row).
    fn row_fields(&self) -> Value;
}

/// The peer timings a prefill table shows: the peer's call alone (`kernel`), and with the
/// layer's pool traffic around it (`pooled`, shown as `+{label}` and saved as
/// `peer_{label}_us` / `speedup_vs_peer_{label}`).
struct PrefillPeer {
    kernel: &'static str,
    pooled: &'static str,
    label: &'static str,
}

/// Prints the prefill table (ours, the peer's call, the peer with its pool traffic, TFLOP/s,
/// Mtok/s) and returns its JSON rows.
fn prefill_table<S: PrefillShape>(m: &Measured<S>, peer: &PrefillPeer) -> Vec<Value> {
    let w = S::LABEL_WIDTH;
    println!(
        "{:<w$} | {:>9} {:>7} {:>8} | {:>9} {:>7} {:>7} | {:>9} {:>7} | {:>7}",
        "shape",
        "ours us",
        "TFLOP/s",
        "GB/s",
        "peer us",
        "TFLOP/s",
        "speedup",
        format!("+{}", peer.label),
        "speedup",
        "Mtok/s"
    );
    let mut rows = Vec::new();
    for r in &m.ours {
        let s = r.shape;
        let vs = m.vs_peer(r, Some(peer.kernel));
        let (pus, _) = m.peer_timing(&s, Some(peer.pooled));
        let tf = |us: f64| s.flops() / (us * 1e-6) / 1e12;
        let mtok = s.tokens() as f64 / r.us;
        println!(
            "{:<w$} | {:>9.2} {:>7.1} {:>8.1} | {:>9.2} {:>7.1} {:>7.2} | {:>9.2} {:>7.2} | {:>7.2}",
            s.label(),
            r.us,
            tf(r.us),
            r.gbps,
            vs.peer_us,
            tf(vs.peer_us),
            vs.peer_us / r.us,
            pus,
            pus / r.us,
            mtok
        );
        let mut row = s.row_fields();
        let extra = json!({
            "tokens": s.tokens(), "flops": s.flops(), "tflops": tf(r.us), "peer_tflops": tf(vs.peer_us),
            format!("peer_{}_us", peer.label): pus, format!("speedup_vs_peer_{}", peer.label): pus / r.us,
            "mtokens_per_s": mtok,
        });
        if let (Some(row), Some(extra)) = (row.as_object_mut(), extra.as_object()) {
            row.extend(extra.clone());
        }
        rows.push(vs.json_row(row));
    }
    rows
}

/// The prefill benches' shapes: 2k, 8k and 32k tokens, each as one sequence and as 8 sequences of
/// varied length.
pub(crate) const PREFILL_SHAPES: &str = "1x2048,8v2048,1x8192,8v8192,1x32768,8v32768";

/// The same at 2k tokens only (`cargo xtask bench --quick`).
pub(crate) const PREFILL_SHAPES_QUICK: &str = "1x2048,8v2048";

/// Options of the CUDA SSD prefill bench.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CudaSsdBenchArgs {
    /// Mamba2-2.7B prefills (chunk 256) as `SEQUENCESxTOKENS` or `SEQUENCESvTOTAL` (sequences of
    /// varied length).
    #[arg(long, value_delimiter = ',', default_value = PREFILL_SHAPES)]
    pub(crate) mamba2: Vec<String>,
    /// Nemotron-H-8B prefills as `SEQUENCESxTOKENS` (chunk 128, 8 groups); `""` for none.
    #[arg(long, value_delimiter = ',', default_value = "4x2048")]
    pub(crate) nemotron: Vec<String>,
    #[command(flatten)]
    pub(crate) common: CudaBenchCommon,
}

/// A prefill shape's sequences: `SxL` (S sequences of L tokens) or `SvT` (S sequences of varied
/// lengths, T tokens in all; `ssm_cuda::bench::prefill_lengths`), as (sequences, tokens per
/// sequence, varied).
fn batch_by_len(v: &str) -> anyhow::Result<(usize, usize, bool)> {
    let form = || format!("`{v}`: expected SEQUENCESxTOKENS or SEQUENCESvTOTAL");
    let (varied, (b, t)) = match v.split_once('x') {
        Some(p) => (false, p),
        None => (true, v.split_once('v').with_context(form)?),
    };
    let (b, t): (usize, usize) = (b.trim().parse().context("sequences")?, t.trim().parse().context("tokens")?);
    anyhow::ensure!(b > 0 && t > 0, "{}: no sequences or no tokens", form());
    if !varied {
        return Ok((b, t, false));
    }
    anyhow::ensure!(t % b == 0, "`{v}`: {t} tokens do not split into {b} sequences of varied length evenly");
    let seqlen = t / b;
    anyhow::ensure!(2 * seqlen > b, "`{v}`: too few tokens for {b} sequences of varied length");
    Ok((b, seqlen, true))
}

/// The SSD bench shapes: every state dtype, Mamba2-2.7B then Nemotron-H-8B prefills.
pub(crate) fn ssd_shapes(args: &CudaSsdBenchArgs) -> anyhow::Result<Vec<SsdBenchShape>> {
    let mut shapes = Vec::new();
    for state in args.common.states.iter().map(|s| s.dtype()) {
        for v in args.mamba2.iter().filter(|v| !v.is_empty()) {
            let (b, t, varied) = batch_by_len(v)?;
            shapes.push(SsdBenchShape { varied, ..SsdBenchShape::mamba2_2p7b(b, t, state) });
        }
        for v in args.nemotron.iter().filter(|v| !v.is_empty()) {
            let (b, t, varied) = batch_by_len(v)?;
            shapes.push(SsdBenchShape { varied, ..SsdBenchShape::nemotron_h_8b(b, t, state) });
        }
    }
    Ok(shapes)
}

pub(crate) fn run_ssd(args: &CudaSsdBenchArgs) -> anyhow::Result<Value> {
    let shapes = ssd_shapes(args)?;
    let m = measure(&args.common, &shapes, bench_ssd, "ssd_peer.py")?;
    if m.peer.is_some() {
        println!(
            "peer = vLLM's call with the initial states gathered; +gather = the mixer's torch.where gather and the call"
        );
    }
    let rows = prefill_table(&m, &PrefillPeer { kernel: "ssd", pooled: "ssd+gather", label: "gather" });
    m.write(&args.common, "ssd_cuda.json", rows)
}

/// Options of the CUDA GDN chunked-prefill bench.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CudaGdnChunkBenchArgs {
    /// Qwen3-Next prefills as `SEQUENCESxTOKENS` or `SEQUENCESvTOTAL` (sequences of varied
    /// length).
    #[arg(long, value_delimiter = ',', default_value = PREFILL_SHAPES)]
    pub(crate) qwen3_next: Vec<String>,
    #[command(flatten)]
    pub(crate) common: CudaBenchCommon,
}

pub(crate) fn run_gdn_chunk(args: &CudaGdnChunkBenchArgs) -> anyhow::Result<Value> {
    let mut shapes = Vec::new();
    for state in args.common.states.iter().map(|s| s.dtype()) {
        for v in args.qwen3_next.iter().filter(|v| !v.is_empty()) {
            let (b, t, varied) = batch_by_len(v)?;
            shapes.push(GdnChunkBenchShape { varied, ..GdnChunkBenchShape::qwen3_next(b, t, state) });
        }
    }
    let m = measure(&args.common, &shapes, bench_gdn_chunk, "gdn_chunk_peer.py")?;
    if m.peer.is_some() {
        println!(
            "peer = vLLM's chunk_gated_delta_rule with the initial states gathered; +pool = the layer's gather, \
             the call and the scatter of the final states into the pool"
        );
    }
    let rows = prefill_table(&m, &PrefillPeer { kernel: "chunk", pooled: "chunk+pool", label: "pool" });
    m.write(&args.common, "gdn_chunk_cuda.json", rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200 documents in docs/perf give one plot per decode op, none for the prefills, with
    /// integer batch ticks and the series in the legend.
    #[test]
    fn prefill_shapes_parse_equal_and_varied_sequences() {
        assert_eq!(batch_by_len("4x2048").unwrap(), (4, 2048, false));
        assert_eq!(batch_by_len("8v2048").unwrap(), (8, 256, true));
        assert!(batch_by_len("8v2047").is_err(), "tokens that do not split evenly");
        assert!(batch_by_len("8v8").is_err(), "too few tokens to vary");
        assert!(batch_by_len("0x8").is_err() && batch_by_len("2048").is_err());
        let args = CudaSsdBenchArgs {
            mamba2: PREFILL_SHAPES.split(',').map(String::from).collect(),
            nemotron: vec![],
            common: CudaBenchCommon { states: vec![StateDtype::F32], ..CudaBenchCommon::new(None, None) },
        };
        let labels: Vec<String> = ssd_shapes(&args).unwrap().iter().map(|s| s.label()).collect();
        assert_eq!(labels[1], "h80 d64 n128 g1 c256 f32 8v2048");
        assert_eq!(labels[4], "h80 d64 n128 g1 c256 f32 1x32768");
    }

    #[test]
    fn plots_of_recorded_documents() {
        let dir = std::env::temp_dir().join(format!("ssm-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let perf = crate::project_root().join("docs/perf");
        let mut names = Vec::new();
        for doc in ["ssu", "gdn", "ssd", "gdn_chunk"] {
            let src = perf.join(format!("{doc}_cuda_h200_340cef1.json"));
            let value: Value = serde_json::from_slice(&std::fs::read(&src).unwrap()).unwrap();
            for svg in plot_doc(&value, &dir.join(format!("{doc}.json"))).unwrap() {
                // The SVG backend writes each text's content on a line of its own.
                let text = std::fs::read_to_string(&svg).unwrap();
                let texts: Vec<&str> = text.lines().filter(|l| !l.starts_with('<')).collect();
                // ReplaySSM runs 4-token steps only.
                let ours = if svg.ends_with("ssu_checkpointing_ssu.svg") {
                    "ours: f32 state, 4 tokens"
                } else {
                    "ours: f32 state, 1 token"
                };
                for want in ["copy limit", "1", "8", "64", "256", ours] {
                    assert!(texts.contains(&want), "{} lacks {want:?}", svg.display());
                }
                assert!(
                    !texts.contains(&"10.0") && !texts.contains(&"100.0"),
                    "{}: fractional batch ticks",
                    svg.display()
                );
                names.push(svg.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        names.sort();
        assert_eq!(
            names,
            [
                "gdn_fused_recurrent_gated_delta_rule.svg",
                "gdn_fused_sigmoid_gating_delta_rule_update.svg",
                "gdn_gdn_decode_step.svg",
                "ssu.svg",
                "ssu_checkpointing_ssu.svg"
            ]
        );
        let ssu = std::fs::read_to_string(dir.join("ssu.svg")).unwrap();
        assert!(ssu.contains("vLLM: bf16 state, 4 tokens"), "the peer's lines are in the legend");
        std::fs::remove_dir_all(&dir).ok();
    }
}
