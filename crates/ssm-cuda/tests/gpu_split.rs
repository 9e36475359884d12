//! Tensor parallelism on CUDA (`ssm_conformance::split`, whose CPU form runs in CI): heads and
//! groups split in two, each half on its own CUDA runtime from its own thread on its own pool
//! shard — on devices 0 and 1 when the machine has two GPUs, else both on device 0 — gathered
//! and compared bit for bit with the whole layer on device 0. Every op of both layer kinds now
//! has a CUDA kernel; a call the backend refuses as unsupported is reported as not compared.

mod common;

use ssm_conformance::cuda::Staged;
use ssm_conformance::split;
use ssm_dispatch::{BackendKind, Config, Runtime};

fn staged(device: u32, label: &str) -> Staged {
    let rt = Runtime::new(&Config { backend: BackendKind::Cuda, cuda_device: device, ..Config::default() })
        .unwrap_or_else(|e| panic!("CUDA runtime on device {device}: {e}"));
    Staged::new(rt, label)
}

#[test]
fn a_head_split_over_two_cuda_runtimes_is_bit_identical_to_the_whole_layer() {
    let Some(_) = common::gpu("a_head_split_over_two_cuda_runtimes_is_bit_identical_to_the_whole_layer") else {
        return;
    };
    let devices = match ssm_cuda::probe() {
        ssm_cuda::Availability::Ready { devices } => devices,
        _ => unreachable!("common::gpu found a device"),
    };
    let second = if devices >= 2 { 1 } else { 0 };
    let whole = staged(0, "cuda:0 whole");
    let halves = [staged(0, "cuda:0 half"), staged(second, "second half")];
    let ran = split::all(&whole, [&halves[0], &halves[1]], 5).unwrap();
    eprintln!("halves on devices 0 and {second} ({devices} device(s)): {ran:?}");
    let compared: Vec<&str> = ran.iter().filter(|r| r.1).map(|r| r.0).collect();
    assert!(
        compared.contains(&"selective_state_update") && compared.contains(&"fused_sigmoid_gating_delta_rule_update")
    );
}
