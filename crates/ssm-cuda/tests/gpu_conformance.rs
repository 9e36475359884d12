//! Every `selective_state_update` conformance vector on the CUDA backend: the host tensors
//! of each case are staged onto the device, run there, and copied back for comparison.

mod common;

use ssm_conformance::{Status, Target, default_vectors_dir, load_dir, run_case};
use ssm_cuda::CudaBackend;
use ssm_cuda::testing::run_ssu_mirrored;
use ssm_ssu::SelectiveStateUpdate;

struct Staged(CudaBackend);

impl Target for Staged {
    fn label(&self) -> String {
        "cuda (staged)".into()
    }
    fn selective_state_update(&self, args: SelectiveStateUpdate<'_>) -> Result<(), String> {
        run_ssu_mirrored(&self.0, args).map_err(|e| e.to_string())
    }
}

#[test]
fn ssu_vectors_pass_on_cuda() {
    let Some(be) = common::gpu("ssu_vectors_pass_on_cuda") else { return };
    let target = Staged(be);
    let dir = default_vectors_dir();
    let cases = load_dir(&dir).unwrap_or_else(|e| panic!("cannot read vectors in {}: {e}", dir.display()));
    let (mut passed, mut failed) = (0, Vec::new());
    for case in cases.iter().filter(|c| c.op == "selective_state_update") {
        let r = run_case(&target, case);
        match &r.status {
            Status::Passed => passed += 1,
            other => failed.push(format!("{}: {other:?}", r.name)),
        }
    }
    assert!(passed > 0, "no selective_state_update vectors in {}", dir.display());
    assert!(failed.is_empty(), "{passed} passed; failures:\n{}", failed.join("\n"));
    eprintln!("cuda: {passed} selective_state_update vectors passed");
}
