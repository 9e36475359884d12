//! The conformance loop: cases × variants on a [`Target`], a [`Report`] with per-op counts, and
//! [`assert_conformance`], the one call a backend's test makes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{Case, CaseError, OutputReport, Produced, Target, compare, conv, gdn, load_dir, ring, ssd, ssu};

/// Op names, by family (the folder names under `vectors/`).
pub mod ops {
    /// `selective_state_update`.
    pub const SSU: &[&str] = &["selective_state_update"];
    /// The causal conv1d ops.
    pub const CONV: &[&str] = &["causal_conv1d_update", "causal_conv1d_fn"];
    /// Mamba2 SSD chunked prefill.
    pub const SSD: &[&str] = &["mamba_chunk_scan_combined_varlen"];
    /// The ReplaySSM ring trackers.
    pub const RING: &[&str] = &["update_replayssm_ring_trackers", "commit_replayssm_ring_trackers"];
    /// The gated delta rule ops.
    pub const GDN: &[&str] = &[
        "fused_gdn_gating",
        "fused_recurrent_gated_delta_rule",
        "fused_sigmoid_gating_delta_rule_update",
        "chunk_gated_delta_rule",
    ];
    /// Every op the harness maps.
    pub const ALL: &[&str] = &[
        "selective_state_update",
        "causal_conv1d_update",
        "causal_conv1d_fn",
        "mamba_chunk_scan_combined_varlen",
        "update_replayssm_ring_trackers",
        "commit_replayssm_ring_trackers",
        "fused_gdn_gating",
        "fused_recurrent_gated_delta_rule",
        "fused_sigmoid_gating_delta_rule_update",
        "chunk_gated_delta_rule",
    ];

    /// The fewest cases of `op` that [`crate::assert_conformance`] accepts: the counts
    /// PROVENANCE.md records for SSD (6) and the trackers (4 updates, 2 commits), else one.
    pub fn min_cases(op: &str) -> usize {
        match op {
            "mamba_chunk_scan_combined_varlen" => 6,
            "update_replayssm_ring_trackers" => 4,
            "commit_replayssm_ring_trackers" => 2,
            _ => 1,
        }
    }
}

/// One way of handing a case to the target. Every case runs in each variant of its op
/// ([`Variant::of`]); outputs are always compared in the vectors' layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// As the vectors store it (conv states `[slots, dim, state_len]`, GDN states
    /// `[slots, HV, V, K]`, SSD without a scratch).
    Stored,
    /// Conv states transposed to `[slots, state_len, dim]` ([`ssm_conv::ConvStateLayout::StateLenDim`]).
    ConvStateLenDim,
    /// GDN states transposed to `[slots, HV, K, V]` ([`ssm_gdn::StateLayout::KV`]); the
    /// stateless `fused_gdn_gating` runs only as stored.
    GdnKv,
    /// SSD with a caller-given, NaN-poisoned scratch at an odd element offset.
    SsdScratch,
}

impl Variant {
    /// The variants `op` runs in.
    pub fn of(op: &str) -> &'static [Variant] {
        if ops::CONV.contains(&op) {
            &[Variant::Stored, Variant::ConvStateLenDim]
        } else if ops::GDN.contains(&op) && op != "fused_gdn_gating" {
            &[Variant::Stored, Variant::GdnKv]
        } else if ops::SSD.contains(&op) {
            &[Variant::Stored, Variant::SsdScratch]
        } else {
            &[Variant::Stored]
        }
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Every output within tolerance.
    Passed,
    /// At least one output out of tolerance, or the op failed.
    Failed(String),
    /// The op has no mapping, the target does not support it, or the case needs something no
    /// vector can pin (the reason says which).
    Skipped(String),
}

/// The result of one case in one variant.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// File stem.
    pub name: String,
    /// Peer op name.
    pub op: String,
    /// How the case was handed over.
    pub variant: Variant,
    /// Outcome.
    pub status: Status,
    /// Per-output error figures.
    pub outputs: Vec<OutputReport>,
}

impl CaseResult {
    /// `op/name` plus the variant when it is not [`Variant::Stored`].
    pub fn id(&self) -> String {
        match self.variant {
            Variant::Stored => format!("{}/{}", self.op, self.name),
            v => format!("{}/{} [{v:?}]", self.op, self.name),
        }
    }
}

/// Runs one case on `target` in every variant of its op.
pub fn run_case(target: &dyn Target, case: &Case) -> Vec<CaseResult> {
    Variant::of(&case.op).iter().map(|&v| run_case_variant(target, case, v)).collect()
}

/// Runs one case on `target` in one variant and compares its outputs.
pub fn run_case_variant(target: &dyn Target, case: &Case, variant: Variant) -> CaseResult {
    let produced = match case.op.as_str() {
        "selective_state_update" => ssu::run(target, case),
        "causal_conv1d_update" => conv::run_update(target, case, variant == Variant::ConvStateLenDim),
        "causal_conv1d_fn" => conv::run_fn(target, case, variant == Variant::ConvStateLenDim),
        "mamba_chunk_scan_combined_varlen" => ssd::run(target, case, variant == Variant::SsdScratch),
        "update_replayssm_ring_trackers" => ring::run_update(target, case),
        "commit_replayssm_ring_trackers" => ring::run_commit(target, case),
        "fused_gdn_gating" => gdn::run_gating(target, case),
        "fused_recurrent_gated_delta_rule" => gdn::run_recurrent(target, case, variant == Variant::GdnKv),
        "fused_sigmoid_gating_delta_rule_update" => gdn::run_sigmoid(target, case, variant == Variant::GdnKv),
        "chunk_gated_delta_rule" => gdn::run_chunk(target, case, variant == Variant::GdnKv),
        other => Err((true, format!("op `{other}` has no mapping yet"))),
    };
    finish(case, variant, produced)
}

fn finish(case: &Case, variant: Variant, produced: Produced) -> CaseResult {
    let mk = |status, outputs| CaseResult { name: case.name.clone(), op: case.op.clone(), variant, status, outputs };
    let produced = match produced {
        Ok(p) => p,
        Err((true, why)) => return mk(Status::Skipped(why), vec![]),
        Err((false, why)) => return mk(Status::Failed(why), vec![]),
    };
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for (name, want) in case.expected() {
        let Some((_, got)) = produced.iter().find(|(n, _)| *n == name) else {
            failures.push(format!("output `{name}` was not produced"));
            continue;
        };
        match compare(&name, got, want, case.tolerance(&name)) {
            Ok(r) => {
                if !r.passed() {
                    failures.push(format!(
                        "`{name}`: {} of {} elements out of tolerance (max abs {:.3e}, max rel {:.3e})",
                        r.failed, r.compared, r.max_abs, r.max_rel
                    ));
                }
                reports.push(r);
            }
            Err(e) => failures.push(e),
        }
    }
    let status = if failures.is_empty() { Status::Passed } else { Status::Failed(failures.join("; ")) };
    mk(status, reports)
}

/// Passed / failed / skipped runs (case × variant) of one op.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Runs with every output within tolerance.
    pub passed: usize,
    /// Runs out of tolerance or refused.
    pub failed: usize,
    /// Runs the target or the mapping did not support.
    pub skipped: usize,
}

/// Every result of one run of the suite on one target.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's label.
    pub label: String,
    /// One entry per case and variant, in case order.
    pub results: Vec<CaseResult>,
}

impl Report {
    /// Counts per op, by op name.
    pub fn per_op(&self) -> BTreeMap<String, OpCounts> {
        let mut m: BTreeMap<String, OpCounts> = BTreeMap::new();
        for r in &self.results {
            let c = m.entry(r.op.clone()).or_default();
            match r.status {
                Status::Passed => c.passed += 1,
                Status::Failed(_) => c.failed += 1,
                Status::Skipped(_) => c.skipped += 1,
            }
        }
        m
    }

    /// Counts over every op.
    pub fn totals(&self) -> OpCounts {
        self.per_op().values().fold(OpCounts::default(), |a, c| OpCounts {
            passed: a.passed + c.passed,
            failed: a.failed + c.failed,
            skipped: a.skipped + c.skipped,
        })
    }

    /// Cases (not runs) of `op` in the report.
    pub fn cases_of(&self, op: &str) -> usize {
        self.results.iter().filter(|r| r.op == op && r.variant == Variant::Stored).count()
    }

    /// One line per op (`label op: P passed, F failed[, S skipped]`), then the totals line
    /// `label: N passed, M failed[, K skipped]`.
    pub fn summary(&self) -> String {
        let line = |c: &OpCounts| {
            let mut s = format!("{} passed, {} failed", c.passed, c.failed);
            if c.skipped > 0 {
                s += &format!(", {} skipped", c.skipped);
            }
            s
        };
        let mut out = String::new();
        for (op, c) in self.per_op() {
            out += &format!("{} {op}: {}\n", self.label, line(&c));
        }
        out += &format!("{}: {}", self.label, line(&self.totals()));
        out
    }

    /// `id: status` of every run that did not pass (skips included), one per line.
    pub fn problems(&self) -> Vec<String> {
        self.results
            .iter()
            .filter(|r| r.status != Status::Passed)
            .map(|r| format!("{}: {:?}", r.id(), r.status))
            .collect()
    }
}

/// Runs every case of the listed `ops` (all cases when `ops` is empty) on `target`, in every
/// variant.
pub fn run_cases(target: &dyn Target, cases: &[Case], ops: &[&str]) -> Report {
    let results = cases
        .iter()
        .filter(|c| ops.is_empty() || ops.contains(&c.op.as_str()))
        .flat_map(|c| run_case(target, c))
        .collect();
    Report { label: target.label(), results }
}

/// [`run_cases`] over the vectors under `dir`.
pub fn run_all(target: &dyn Target, dir: &Path, ops: &[&str]) -> Result<Report, CaseError> {
    Ok(run_cases(target, &load_dir(dir)?, ops))
}

/// The cases under [`default_vectors_dir`], read once per process. Panics when they cannot be
/// read (for tests).
pub fn shared_cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        let dir = default_vectors_dir();
        load_dir(&dir).unwrap_or_else(|e| panic!("cannot read vectors in {}: {e}", dir.display()))
    })
}

/// The test of a backend (or reference) that claims `ops`: runs every shared vector of those
/// ops in every variant, prints [`Report::summary`], and panics unless every run passed (a skip
/// of a claimed op is a failure) and each op has at least [`ops::min_cases`] cases.
pub fn assert_conformance(target: &dyn Target, ops: &[&str]) -> Report {
    let report = run_cases(target, shared_cases(), ops);
    eprintln!("{}", report.summary());
    let problems = report.problems();
    assert!(
        problems.is_empty(),
        "{}: {} passed, {} did not pass:\n{}",
        report.label,
        report.totals().passed,
        problems.len(),
        problems.join("\n")
    );
    for op in ops {
        let n = report.cases_of(op);
        assert!(
            n >= ops::min_cases(op),
            "{}: {n} `{op}` vectors in {}, expected at least {}",
            report.label,
            default_vectors_dir().display(),
            ops::min_cases(op)
        );
    }
    report
}

/// The directory of the shared vectors: `$SSM_CONFORMANCE_DIR`, else `../shared/conformance/vectors`
/// beside the scratch root.
pub fn default_vectors_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SSM_CONFORMANCE_DIR") {
        return d.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join("../shared/conformance/vectors")
}

/// One `#[test]` per target, each an [`assert_conformance`] call:
///
/// ```no_run
/// use ssm_conformance::reference::{Arithmetic, Reference};
/// use ssm_conformance::{Labeled, ops};
/// use ssm_dispatch::{Config, Runtime};
///
/// ssm_conformance::conformance_tests! {
///     cpu_one_thread: Labeled(Runtime::new(&Config::cpu(Some(1))).unwrap(), "cpu-1t".into()) => ops::ALL;
///     reference_f64: Reference(Arithmetic::F64) => ops::SSU;
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($($name:ident: $target:expr => $ops:expr;)*) => {
        $(
            #[test]
            fn $name() {
                $crate::assert_conformance(&$target, $ops);
            }
        )*
    };
}
