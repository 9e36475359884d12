//! What a call of [`CpuBackend::for_each`] costs beyond its items, on two threads: items of
//! busy-waiting (so that the ideal is exact), calls back to back or after a gap of busy work on
//! the calling thread (what a model's other ops leave between two of ours), with the helpers
//! spinning [`ssm_cpu::DEFAULT_SPIN`] between calls and with `Duration::ZERO` (parked at once, as
//! a parked thread pool leaves them).
//!
//! `cargo run --release -p ssm-cpu --example parcost`

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use ssm_cpu::{CpuBackend, DEFAULT_SPIN, Par};

/// Busy-waits `ns` nanoseconds.
fn busy(ns: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_nanos(ns) {
        std::hint::spin_loop();
    }
}

fn main() {
    let two = Par::Threads(NonZeroUsize::new(2).expect("nonzero"));
    println!("items × work, gap between calls: median / p90 µs per call (ideal: the items' work over 2 threads)");
    for spin in [DEFAULT_SPIN, Duration::ZERO] {
        let cpu = CpuBackend::with_spin(two, spin).expect("two threads");
        for (items, ns) in [(80usize, 1500u64), (8, 15_000)] {
            for gap in [0u64, 20_000, 100_000] {
                let mut t: Vec<u128> = (0..2000)
                    .map(|_| {
                        busy(gap);
                        let start = Instant::now();
                        cpu.for_each(items, |_| busy(ns));
                        start.elapsed().as_nanos()
                    })
                    .collect();
                t.sort_unstable();
                println!(
                    "spin {:>4} µs  {items:3} × {:5.1} µs, gap {:5.1} µs: {:6.1} / {:6.1} (ideal {:.1})",
                    spin.as_micros(),
                    ns as f64 / 1e3,
                    gap as f64 / 1e3,
                    t[t.len() / 2] as f64 / 1e3,
                    t[t.len() * 9 / 10] as f64 / 1e3,
                    (items as u64 * ns) as f64 / 2e3,
                );
            }
        }
    }
}
