//! Determinism and concurrency of the CPU backend, over every template call (each golden
//! vector in each variant, and random cases of every generator):
//! - each op's outputs and states are bit-identical with 1, 2 and 8 CPU threads;
//! - one `Runtime` shared by 8 threads, each issuing a different share of the calls (mixed
//!   ops on disjoint memory, at the same time), gives bit-identical results to the calls made
//!   one after another.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ssm_dispatch::{Config, Runtime};
use ssm_fuzz::ops::FuzzOp;
use ssm_fuzz::spec::Buffers;
use ssm_fuzz::templates::{Sink, for_each_template, run_copy};

type Results = Vec<(String, Result<Buffers, String>)>;

/// Runs every template (or every `share.1`-th from `share.0`) on `rt` and keeps the results.
struct Recorder<'r> {
    rt: &'r Runtime,
    share: (usize, usize),
    seen: AtomicUsize,
    results: Mutex<Results>,
}

impl Sink for Recorder<'_> {
    fn take<O: FuzzOp>(&self, label: &str, template: &O::At<'_>) {
        let i = self.seen.fetch_add(1, Ordering::Relaxed);
        if i % self.share.1 != self.share.0 {
            return;
        }
        let r = run_copy::<O>(self.rt, template);
        self.results.lock().unwrap().push((format!("{} {label}", O::NAME), r));
    }
}

const RANDOM: usize = 12;

fn record(rt: &Runtime, share: (usize, usize)) -> Results {
    let rec = Recorder { rt, share, seen: AtomicUsize::new(0), results: Mutex::new(Vec::new()) };
    for_each_template(&rec, 0xd37e, RANDOM);
    let mut r = rec.results.into_inner().unwrap();
    r.sort_by(|a, b| a.0.cmp(&b.0));
    r
}

fn assert_same(what: &str, want: &Results, got: &Results) {
    assert_eq!(want.len(), got.len(), "{what}: number of calls");
    let mut differ = Vec::new();
    for ((name, w), (name2, g)) in want.iter().zip(got) {
        assert_eq!(name, name2);
        if w != g {
            differ.push(name.clone());
        }
    }
    assert!(differ.is_empty(), "{what}: {} of {} calls differ: {differ:#?}", differ.len(), want.len());
}

fn cpu(threads: usize) -> Runtime {
    Runtime::new(&Config::cpu(Some(threads))).unwrap()
}

#[test]
fn every_op_is_bit_identical_across_cpu_thread_counts() {
    let one = record(&cpu(1), (0, 1));
    let ran = one.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(ran > 100, "only {ran} calls ran");
    for threads in [2, 8] {
        assert_same(&format!("{threads} threads vs 1"), &one, &record(&cpu(threads), (0, 1)));
    }
    eprintln!("{} calls ({ran} ran), bit-identical with 1, 2 and 8 threads", one.len());
}

#[test]
fn one_runtime_shared_by_eight_threads_matches_serial_calls() {
    let rt = cpu(2);
    let serial = record(&rt, (0, 1));
    let mut parallel: Results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                s.spawn({
                    let rt = &rt;
                    move || record(rt, (i, 8))
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    parallel.sort_by(|a, b| a.0.cmp(&b.0));
    assert_same("8 threads sharing one runtime vs serial", &serial, &parallel);
    eprintln!("{} calls from 8 threads on one runtime, bit-identical to serial", serial.len());
}
