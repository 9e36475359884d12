//! Every shared gated-delta-rule vector (`fused_gdn_gating`, `fused_recurrent_gated_delta_rule`,
//! `fused_sigmoid_gating_delta_rule_update`, `chunk_gated_delta_rule`) through the dispatch
//! facade on the CPU (one thread and all cores).

use ssm_conformance::{Status, Target, default_vectors_dir, load_dir, run_case};
use ssm_dispatch::{Config, Runtime};

const OPS: [&str; 4] = [
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "chunk_gated_delta_rule",
];

fn check_all(target: &dyn Target) {
    let dir = default_vectors_dir();
    let cases = load_dir(&dir).unwrap_or_else(|e| panic!("cannot read vectors in {}: {e}", dir.display()));
    let mut passed = [0usize; 4];
    let mut failed = Vec::new();
    for case in &cases {
        let Some(i) = OPS.iter().position(|o| *o == case.op) else { continue };
        let r = run_case(target, case);
        match &r.status {
            Status::Passed => passed[i] += 1,
            other => failed.push(format!("{}/{}: {other:?}", r.op, r.name)),
        }
    }
    assert!(failed.is_empty(), "{}: failures:\n{}", target.label(), failed.join("\n"));
    for (op, n) in OPS.iter().zip(passed) {
        assert!(n > 0, "no {op} vectors in {}", dir.display());
        eprintln!("{}: {n} {op} vectors passed", target.label());
    }
}

#[test]
fn gdn_vectors_pass_on_cpu_runtime() {
    for threads in [Some(1), None] {
        check_all(&Runtime::new(&Config::cpu(threads)).unwrap());
    }
}
