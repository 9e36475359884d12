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
    let ops: Vec<&str> = [ops::SSU, ops::CONV, ops::RING].concat();
    assert_conformance(&Staged::new(rt, "cuda (staged)"), &ops);
}

/// The GDN ops with CUDA kernels (the chunked prefill has none yet).
const GDN_ON_CUDA: &[&str] =
    &["fused_gdn_gating", "fused_recurrent_gated_delta_rule", "fused_sigmoid_gating_delta_rule_update"];

#[test]
fn gdn_vectors_pass_on_cuda() {
    if common::gpu("gdn_vectors_pass_on_cuda").is_none() {
        return;
    }
    assert!(GDN_ON_CUDA.iter().all(|op| ops::GDN.contains(op)));
    let rt = Runtime::new(&Config { backend: BackendKind::Cuda, ..Config::default() }).expect("CUDA runtime");
    assert_conformance(&Staged::new(rt, "cuda (staged)"), GDN_ON_CUDA);
}
