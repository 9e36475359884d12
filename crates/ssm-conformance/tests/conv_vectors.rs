//! Every shared `causal_conv1d_update` / `causal_conv1d_fn` vector through the dispatch
//! facade on the CPU (one thread and all cores) and through the scalar reference.

use ssm_conformance::{Status, Target, default_vectors_dir, load_dir, run_case};
use ssm_conv::reference::{Precision, Reference};
use ssm_conv::{CausalConv1dFnArgs, CausalConv1dUpdateArgs, Run};
use ssm_dispatch::{Config, Runtime};

const OPS: [&str; 2] = ["causal_conv1d_update", "causal_conv1d_fn"];

struct Ref(Precision);

impl Target for Ref {
    fn label(&self) -> String {
        format!("reference-{:?}", self.0)
    }
    fn causal_conv1d_update(&self, args: CausalConv1dUpdateArgs<'_>) -> Result<(), String> {
        let call = ssm_conv::plan(args).map_err(|e| e.to_string())?;
        Reference { precision: self.0 }.run(call).map_err(|e| e.to_string())
    }
    fn causal_conv1d_fn(&self, args: CausalConv1dFnArgs<'_>) -> Result<(), String> {
        let call = ssm_conv::plan(args).map_err(|e| e.to_string())?;
        Reference { precision: self.0 }.run(call).map_err(|e| e.to_string())
    }
}

fn check_all(target: &dyn Target) {
    let dir = default_vectors_dir();
    let cases = load_dir(&dir).unwrap_or_else(|e| panic!("cannot read vectors in {}: {e}", dir.display()));
    let (mut passed, mut failed) = (0, Vec::new());
    for case in cases.iter().filter(|c| OPS.contains(&c.op.as_str())) {
        let r = run_case(target, case);
        match &r.status {
            Status::Passed => passed += 1,
            other => failed.push(format!("{}/{}: {other:?}", r.op, r.name)),
        }
    }
    assert!(passed > 0, "no conv vectors in {}", dir.display());
    assert!(failed.is_empty(), "{}: {passed} passed, failures:\n{}", target.label(), failed.join("\n"));
    eprintln!("{}: {passed} conv vectors passed", target.label());
}

#[test]
fn conv_vectors_pass_on_cpu_runtime() {
    for threads in [Some(1), None] {
        check_all(&Runtime::new(&Config::cpu(threads)).unwrap());
    }
}

#[test]
fn conv_vectors_pass_on_the_reference() {
    check_all(&Ref(Precision::F32));
    check_all(&Ref(Precision::F64));
}
