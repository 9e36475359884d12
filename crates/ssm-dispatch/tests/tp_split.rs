//! Tensor parallelism on the CPU (the CPU form of the two-GPU test): a Mamba2 layer's SSU decode
//! and SSD prefill and a GDN layer's decode and chunked prefill, with heads and groups split in
//! two, each half on its own runtime from its own thread on its own pool shard, gathered: bit
//! for bit the whole layer on one runtime (`ssm_conformance::split`, which a GPU machine runs with
//! CUDA runtimes).

use ssm_conformance::split;
use ssm_dispatch::{Config, Runtime};

#[test]
fn a_head_split_over_two_runtimes_is_bit_identical_to_the_whole_layer() {
    let whole = Runtime::new(&Config::cpu(Some(2))).unwrap();
    let halves = [Runtime::new(&Config::cpu(Some(1))).unwrap(), Runtime::new(&Config::cpu(Some(1))).unwrap()];
    for seed in [5, 6] {
        let ran = split::all(&whole, [&halves[0], &halves[1]], seed).unwrap();
        assert!(ran.iter().all(|&(_, compared)| compared), "every op has a CPU kernel: {ran:?}");
    }
}

#[test]
fn a_split_on_one_runtime_shared_by_both_halves_is_bit_identical_too() {
    let rt = Runtime::new(&Config::cpu(Some(2))).unwrap();
    let ran = split::all(&rt, [&rt, &rt], 9).unwrap();
    assert_eq!(ran.len(), 4);
}
