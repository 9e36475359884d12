//! Conformance against the peers' golden vectors (`../shared/conformance`, FORMAT.md).
//!
//! [`load_dir`] reads every `*.safetensors` case under a directory; [`run_case`] maps the
//! case's peer argument names (and `expand` broadcasts) onto the op's arguments, runs it on
//! a [`Target`] (a [`ssm_dispatch::Runtime`], or anything that stages host tensors onto a
//! device), and compares every `out.*` tensor within the case's tolerance
//! (`|got − want| ≤ atol + rtol·|want|`; a NaN expected value means "unspecified" and is
//! skipped; integers must match exactly). Ops without a mapping are reported as skipped,
//! by name.

mod case;
mod compare;
mod conv;
mod gdn;
mod ring;
mod ssd;
mod ssu;

pub use case::{Case, CaseError, load_dir, load_file};
pub use compare::{OutputReport, Tolerance, compare};
pub use ssm_tensor::HostTensor;

use ssm_ssu::SelectiveStateUpdate;

/// Something that can run the ops on host tensors: a runtime, or a staging wrapper that
/// copies to a device and back. Each op family adds a method; the default says "not
/// supported", which the report shows as skipped.
pub trait Target {
    /// Shown in reports, e.g. `cpu`.
    fn label(&self) -> String;
    /// Runs `selective_state_update` on host tensors.
    fn selective_state_update(&self, _args: SelectiveStateUpdate<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `causal_conv1d_update` on host tensors.
    fn causal_conv1d_update(&self, _args: ssm_conv::CausalConv1dUpdateArgs<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `causal_conv1d_fn` on host tensors.
    fn causal_conv1d_fn(&self, _args: ssm_conv::CausalConv1dFnArgs<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `mamba_chunk_scan_combined_varlen` on host tensors.
    fn mamba_chunk_scan_combined_varlen(&self, _args: ssm_ssd::MambaChunkScanCombinedVarlen<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `update_replayssm_ring_trackers` on host tensors.
    fn update_replayssm_ring_trackers(&self, _args: ssm_ring::UpdateRingTrackers<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `commit_replayssm_ring_trackers` on host tensors.
    fn commit_replayssm_ring_trackers(&self, _args: ssm_ring::CommitRingTrackers<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `fused_gdn_gating` on host tensors.
    fn fused_gdn_gating(&self, _args: ssm_gdn::FusedGdnGatingArgs<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `fused_recurrent_gated_delta_rule` on host tensors.
    fn fused_recurrent_gated_delta_rule(
        &self,
        _args: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    ) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `fused_sigmoid_gating_delta_rule_update` on host tensors.
    fn fused_sigmoid_gating_delta_rule_update(
        &self,
        _args: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), String> {
        Err("not supported by this target".into())
    }
    /// Runs `chunk_gated_delta_rule` on host tensors.
    fn chunk_gated_delta_rule(&self, _args: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>) -> Result<(), String> {
        Err("not supported by this target".into())
    }
}

impl Target for ssm_dispatch::Runtime {
    fn label(&self) -> String {
        self.devices().to_string()
    }
    fn selective_state_update(&self, args: SelectiveStateUpdate<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::selective_state_update(self, args).map_err(|e| e.to_string())
    }
    fn causal_conv1d_update(&self, args: ssm_conv::CausalConv1dUpdateArgs<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::causal_conv1d_update(self, args).map_err(|e| e.to_string())
    }
    fn causal_conv1d_fn(&self, args: ssm_conv::CausalConv1dFnArgs<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::causal_conv1d_fn(self, args).map_err(|e| e.to_string())
    }
    fn mamba_chunk_scan_combined_varlen(&self, args: ssm_ssd::MambaChunkScanCombinedVarlen<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::mamba_chunk_scan_combined_varlen(self, args).map_err(|e| e.to_string())
    }
    fn update_replayssm_ring_trackers(&self, args: ssm_ring::UpdateRingTrackers<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::update_replayssm_ring_trackers(self, args).map_err(|e| e.to_string())
    }
    fn commit_replayssm_ring_trackers(&self, args: ssm_ring::CommitRingTrackers<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::commit_replayssm_ring_trackers(self, args).map_err(|e| e.to_string())
    }
    fn fused_gdn_gating(&self, args: ssm_gdn::FusedGdnGatingArgs<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::fused_gdn_gating(self, args).map_err(|e| e.to_string())
    }
    fn fused_recurrent_gated_delta_rule(
        &self,
        args: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    ) -> Result<(), String> {
        ssm_dispatch::Runtime::fused_recurrent_gated_delta_rule(self, args).map_err(|e| e.to_string())
    }
    fn fused_sigmoid_gating_delta_rule_update(
        &self,
        args: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    ) -> Result<(), String> {
        ssm_dispatch::Runtime::fused_sigmoid_gating_delta_rule_update(self, args).map_err(|e| e.to_string())
    }
    fn chunk_gated_delta_rule(&self, args: ssm_gdn::ChunkGatedDeltaRuleArgs<'_>) -> Result<(), String> {
        ssm_dispatch::Runtime::chunk_gated_delta_rule(self, args).map_err(|e| e.to_string())
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Every output within tolerance.
    Passed,
    /// At least one output out of tolerance, or the op failed.
    Failed(String),
    /// The op has no mapping (or the target does not support it).
    Skipped(String),
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// File stem.
    pub name: String,
    /// Peer op name.
    pub op: String,
    /// Outcome.
    pub status: Status,
    /// Per-output error figures.
    pub outputs: Vec<OutputReport>,
}

/// Ops this crate can map onto arguments.
pub const KNOWN_OPS: &[&str] = &[
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

/// Runs one case on `target` and compares its outputs.
pub fn run_case(target: &dyn Target, case: &Case) -> CaseResult {
    let produced = match case.op.as_str() {
        "selective_state_update" => ssu::run(target, case),
        "causal_conv1d_update" => conv::run_update(target, case),
        "causal_conv1d_fn" => conv::run_fn(target, case),
        "mamba_chunk_scan_combined_varlen" => ssd::run(target, case),
        "update_replayssm_ring_trackers" => ring::run_update(target, case),
        "commit_replayssm_ring_trackers" => ring::run_commit(target, case),
        "fused_gdn_gating" => gdn::run_gating(target, case),
        "fused_recurrent_gated_delta_rule" => gdn::run_recurrent(target, case),
        "fused_sigmoid_gating_delta_rule_update" => gdn::run_sigmoid(target, case),
        "chunk_gated_delta_rule" => gdn::run_chunk(target, case),
        other => {
            return CaseResult {
                name: case.name.clone(),
                op: other.to_string(),
                status: Status::Skipped(format!("op `{other}` has no mapping yet")),
                outputs: vec![],
            };
        }
    };
    finish(case, produced)
}

/// What an op runner returns: the produced outputs by name (`out`, `state`, …), or a reason it
/// could not run (`Err((skipped, message))`).
pub(crate) type Produced = Result<Vec<(String, HostTensor)>, (bool, String)>;

fn finish(case: &Case, produced: Produced) -> CaseResult {
    let mk = |status, outputs| CaseResult { name: case.name.clone(), op: case.op.clone(), status, outputs };
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
        let tol = case.tolerance(&name);
        match compare(&name, got, want, tol) {
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

/// The directory of the shared vectors: `$SSM_CONFORMANCE_DIR`, else `../shared/conformance/vectors`
/// beside the workspace root.
pub fn default_vectors_dir() -> std::path::PathBuf {
    if let Ok(d) = std::env::var("SSM_CONFORMANCE_DIR") {
        return d.into();
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join("../shared/conformance/vectors")
}
