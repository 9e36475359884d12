//! Reliability checks over the public facade, on the stable toolchain: a seeded fuzz harness
//! ([`Fuzzer`]), and the template calls ([`templates`]) that the determinism and concurrency
//! tests replay.
//!
//! Every op's template calls (each golden vector's arguments in each variant, and random cases
//! from `ssm_conformance`'s generators) are mutated the way a caller's bug would change them
//! (shapes, ranks, strides (zero, negative, overlapping, extreme), offsets, dtypes, the memory
//! behind a view, optional arguments, index values (i64 extremes, negatives, past the pool,
//! duplicates), devices, scalars, NaN/inf values) and run on a CPU [`Runtime`](ssm_dispatch::Runtime).
//! Each call must end in a typed refusal that wrote nothing, or in the reference's result; a
//! panic, a write before a refusal, a disagreement or a hang is a failure ([`Fuzzer`]).
//!
//! ```no_run
//! let report = ssm_fuzz::Fuzzer::new(ssm_fuzz::FuzzConfig::from_env(20, 4)).run();
//! print!("{}", report.summary());
//! assert!(report.failures.is_empty(), "{:#?}", report.failures);
//! ```

pub mod core_invariance;
pub mod cores;
mod driver;
pub mod invariance;
mod mutate;
pub mod ops;
pub mod scalar;
pub mod spec;
pub mod templates;

pub use driver::{Failure, FuzzConfig, FuzzReport, Fuzzer, OpCounts};
