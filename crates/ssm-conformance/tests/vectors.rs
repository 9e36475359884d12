//! Every shared vector of every op the CPU backend claims, through the dispatch facade;
//! and the kernel-faithful reference on the SSU vectors.

use ssm_conformance::{Status, Target, default_vectors_dir, load_dir, run_case};
use ssm_dispatch::{Config, Runtime};
use ssm_ssu::SelectiveStateUpdate;

struct Ref<B>(B, &'static str);
impl<B: ssm_ssu::SsuBackend<ssm_ssu::SsuError>> Target for Ref<B> {
    fn label(&self) -> String {
        self.1.into()
    }
    fn selective_state_update(&self, args: SelectiveStateUpdate<'_>) -> Result<(), String> {
        self.0.run(ssm_tensor::Planned::new(args).map_err(|e| e.to_string())?).map_err(|e| e.to_string())
    }
}

fn check_all(target: &dyn Target, ops: &[&str]) {
    let dir = default_vectors_dir();
    let cases = load_dir(&dir).unwrap_or_else(|e| panic!("cannot read vectors in {}: {e}", dir.display()));
    let mut failed = Vec::new();
    let mut passed = 0;
    for case in cases.iter().filter(|c| ops.contains(&c.op.as_str())) {
        let r = run_case(target, case);
        match &r.status {
            Status::Passed => passed += 1,
            other => failed.push(format!("{}/{}: {other:?}", r.op, r.name)),
        }
    }
    assert!(passed > 0, "no vectors found for {ops:?} in {}", dir.display());
    assert!(
        failed.is_empty(),
        "{} on {}: {} passed, failures:\n{}",
        ops.join(","),
        target.label(),
        passed,
        failed.join("\n")
    );
    eprintln!("{}: {passed} passed, 0 failed", target.label());
}

#[test]
fn ssu_vectors_pass_on_cpu_runtime() {
    for threads in [Some(1), None] {
        let rt = Runtime::new(&Config::cpu(threads)).unwrap();
        check_all(&rt, &["selective_state_update"]);
    }
}

#[test]
fn ssu_vectors_pass_on_the_reference() {
    check_all(&Ref(ssm_ssu::reference::Reference, "reference-f32"), &["selective_state_update"]);
    check_all(&Ref(ssm_ssu::reference::ReferenceF64, "reference-f64"), &["selective_state_update"]);
}
