//! Every shared vector of the ops the CUDA backend claims, through a CUDA runtime: the harness's
//! staging target copies each case's host tensors onto the device, runs the runtime's op there,
//! and copies the outputs back for comparison.

mod common;

use ssm_conformance::cuda::Staged;
use ssm_conformance::{assert_conformance, ops};
use ssm_dispatch::{BackendKind, Config, Runtime};

#[test]
fn vectors_pass_on_cuda() {
    // The skip rule (and SSM_REQUIRE_GPU) of every GPU test.
    if common::gpu("vectors_pass_on_cuda").is_none() {
        return;
    }
    let rt = Runtime::new(&Config { backend: BackendKind::Cuda, ..Config::default() }).expect("CUDA runtime");
    let ops: Vec<&str> = [ops::SSU, ops::CONV].concat();
    assert_conformance(&Staged::new(rt, "cuda (staged)"), &ops);
}
