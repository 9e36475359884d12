use std::path::PathBuf;

use ssm_conformance::{KNOWN_OPS, Status, Target, default_vectors_dir, load_dir, run_cases};
use ssm_dispatch::{BackendKind, Config, Runtime};

/// `cargo xtask conformance`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Backend to check: auto, cpu or cuda.
    #[arg(long, default_value = "cpu")]
    backend: BackendKind,
    /// Directory of vectors (default: ../shared/conformance/vectors or $SSM_CONFORMANCE_DIR).
    #[arg(long)]
    vectors: Option<PathBuf>,
    /// Only cases of this op.
    #[arg(long)]
    op: Option<String>,
    /// CPU threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

impl Args {
    pub(crate) fn run(self) -> anyhow::Result<()> {
        let dir = self.vectors.unwrap_or_else(default_vectors_dir);
        let config = Config { backend: self.backend, cpu_threads: self.threads, ..Config::default() };
        let rt = Runtime::new(&config)?;
        let label = rt.devices().to_string();
        let target = target(rt, label);
        let cases = load_dir(&dir)?;
        let (mut passed, mut failed, mut skipped) = (0, 0, 0);
        let mut skipped_ops = std::collections::BTreeSet::new();
        println!("conformance on {} ({} cases in {})", target.label(), cases.len(), dir.display());
        let ops: Vec<&str> = self.op.as_deref().into_iter().collect();
        let report = run_cases(target.as_ref(), &cases, &ops);
        for r in &report.results {
            let figures: Vec<String> =
                r.outputs.iter().map(|o| format!("{} abs {:.2e} rel {:.2e}", o.name, o.max_abs, o.max_rel)).collect();
            match &r.status {
                Status::Passed => {
                    passed += 1;
                    println!("PASS {}  {}", r.id(), figures.join(", "));
                }
                Status::Failed(why) => {
                    failed += 1;
                    println!("FAIL {}  {why}", r.id());
                }
                Status::Skipped(why) => {
                    skipped += 1;
                    if !KNOWN_OPS.contains(&r.op.as_str()) {
                        skipped_ops.insert(r.op.clone());
                    }
                    println!("SKIP {}  {why}", r.id());
                }
            }
        }
        println!("{}", report.summary());
        if !skipped_ops.is_empty() {
            println!("ops without a mapping yet: {}", skipped_ops.into_iter().collect::<Vec<_>>().join(", "));
        }
        if skipped > 0 {
            println!("{passed} passed, {failed} failed, {skipped} skipped");
        } else {
            println!("{passed} passed, {failed} failed");
        }
        if failed > 0 {
            std::process::exit(1);
        }
        Ok(())
    }
}

/// The runtime as a conformance target: with CUDA compiled in, host tensors are staged onto the
/// runtime's device (a CPU runtime runs them as they are).
#[cfg(feature = "cuda")]
fn target(rt: Runtime, label: String) -> Box<dyn Target> {
    Box::new(ssm_conformance::cuda::Staged::new(rt, label))
}

/// The runtime as a conformance target (CPU only in this build).
#[cfg(not(feature = "cuda"))]
fn target(rt: Runtime, label: String) -> Box<dyn Target> {
    Box::new(ssm_conformance::Labeled(rt, label))
}
