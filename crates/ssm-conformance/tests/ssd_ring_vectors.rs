//! Every shared `mamba_chunk_scan_combined_varlen`, `update_replayssm_ring_trackers` and
//! `commit_replayssm_ring_trackers` vector through the dispatch facade on the CPU (one
//! thread and all cores).

use ssm_conformance::{Status, Target, default_vectors_dir, load_dir, run_case};
use ssm_dispatch::{Config, Runtime};

const OPS: [&str; 3] =
    ["mamba_chunk_scan_combined_varlen", "update_replayssm_ring_trackers", "commit_replayssm_ring_trackers"];

fn check_all(target: &dyn Target) {
    let dir = default_vectors_dir();
    let cases = load_dir(&dir).unwrap_or_else(|e| panic!("cannot read vectors in {}: {e}", dir.display()));
    let mut passed = [0usize; 3];
    let mut failed = Vec::new();
    for case in &cases {
        let Some(k) = OPS.iter().position(|o| *o == case.op) else { continue };
        let r = run_case(target, case);
        match &r.status {
            Status::Passed => passed[k] += 1,
            other => failed.push(format!("{}/{}: {other:?}", r.op, r.name)),
        }
    }
    assert!(failed.is_empty(), "{}: failures:\n{}", target.label(), failed.join("\n"));
    // The recorded cases (PROVENANCE.md): 6 SSD, 4 update (2 of them resets), 2 commit.
    assert!(passed[0] >= 6 && passed[1] >= 4 && passed[2] >= 2, "{}: too few cases passed: {passed:?}", target.label());
    eprintln!("{}: {OPS:?} passed {passed:?}", target.label());
}

#[test]
fn ssd_and_ring_vectors_pass_on_cpu_runtime() {
    for threads in [Some(1), None] {
        check_all(&Runtime::new(&Config::cpu(threads)).unwrap());
    }
}
