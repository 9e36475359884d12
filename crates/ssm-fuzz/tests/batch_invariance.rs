//! Batch invariance on the CPU backend (vLLM#48613): a sequence's output and states are
//! bit-identical alone and at any position of a batch of 256, for decode and speculative
//! decode (SSU, both GDN recurrences, ReplaySSM) and chunked prefill (SSD, GDN); alone and in a
//! mixed batch for both layer cores.

use ssm_dispatch::{Config, Runtime};
use ssm_fuzz::core_invariance::{assert_gdn_core_batch_invariant, assert_mamba2_core_batch_invariant};
use ssm_fuzz::invariance::{
    assert_gdn_routes_batch_invariant, assert_prefill_routes_batch_invariant, assert_replayssm_batch_invariant,
    assert_ssu_routes_batch_invariant,
};

fn rt() -> Runtime {
    Runtime::new(&Config::cpu(Some(2))).unwrap()
}

#[test]
fn ssu_decode_and_speculative_are_batch_invariant() {
    assert_ssu_routes_batch_invariant(&rt());
}

#[test]
fn gdn_decode_and_speculative_are_batch_invariant() {
    assert_gdn_routes_batch_invariant(&rt());
}

#[test]
fn gdn_and_ssd_chunked_prefill_are_batch_invariant() {
    assert_prefill_routes_batch_invariant(&rt());
}

#[test]
fn gdn_core_is_batch_invariant() {
    assert_gdn_core_batch_invariant(&rt());
}

#[test]
fn mamba2_core_is_batch_invariant() {
    assert_mamba2_core_batch_invariant(&rt());
}

#[test]
fn replayssm_is_batch_invariant() {
    let rt = Runtime::new(&Config { replayssm: true, ..Config::cpu(Some(2)) }).unwrap();
    assert_replayssm_batch_invariant(&rt);
}
