//! Determinism and concurrency of the CPU backend, over every template call (each golden
//! vector in each variant, and random cases of every generator):
//! - each op's outputs and states are bit-identical with 1, 2 and 8 CPU threads;
//! - one `Runtime` shared by 8 threads, each issuing a different share of the calls (mixed
//!   ops on disjoint memory, at the same time), gives bit-identical results to the calls made
//!   one after another.

use ssm_dispatch::{Config, Runtime};
use ssm_fuzz::templates::{Results, differing, record};

const SEED: u64 = 0xd37e;
const RANDOM: usize = 12;

fn cpu(threads: usize) -> Runtime {
    Runtime::new(&Config { replayssm: true, ..Config::cpu(Some(threads)) }).unwrap()
}

fn assert_same(what: &str, want: &Results, got: &Results) {
    let d = differing(want, got);
    assert!(d.is_empty(), "{what}: {} of {} calls differ: {d:#?}", d.len(), want.len());
}

#[test]
fn every_op_is_bit_identical_across_cpu_thread_counts() {
    let one = record(&cpu(1), SEED, RANDOM, (0, 1));
    let ran = one.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(ran > 100, "only {ran} calls ran");
    for threads in [2, 8] {
        assert_same(&format!("{threads} threads vs 1"), &one, &record(&cpu(threads), SEED, RANDOM, (0, 1)));
    }
    eprintln!("{} calls ({ran} ran), bit-identical with 1, 2 and 8 threads", one.len());
}

#[test]
fn one_runtime_shared_by_eight_threads_matches_serial_calls() {
    let rt = cpu(2);
    let serial = record(&rt, SEED, RANDOM, (0, 1));
    let mut parallel: Results = std::thread::scope(|s| {
        let rt = &rt;
        let handles: Vec<_> = (0..8).map(|i| s.spawn(move || record(rt, SEED, RANDOM, (i, 8)))).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    parallel.sort_by(|a, b| a.0.cmp(&b.0));
    assert_same("8 threads sharing one runtime vs serial", &serial, &parallel);
    eprintln!("{} calls from 8 threads on one runtime, bit-identical to serial", serial.len());
}
