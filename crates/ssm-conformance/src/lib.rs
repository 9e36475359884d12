//! Conformance against the peers' golden vectors (`../shared/conformance`, FORMAT.md): the one
//! harness every backend (and every op crate's reference) is checked with.
//!
//! [`load_dir`] reads every `*.safetensors` case under a directory; [`run_case`] maps the
//! case's peer argument names (and `expand` broadcasts) onto the op's arguments, runs it on
//! a [`Target`] once per [`Variant`] (state layouts, caller scratch), and compares every
//! `out.*` tensor within the case's tolerance (`|got − want| ≤ atol + rtol·|want|`; a NaN
//! expected value means "unspecified" and is skipped; integers must match exactly).
//!
//! A backend instantiates the whole suite with one call:
//!
//! ```no_run
//! use ssm_dispatch::{Config, Runtime};
//! let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
//! // Runs every vector of every listed op, prints per-op counts and `N passed, M failed`,
//! // and panics unless every case passed (and each op has its recorded number of cases).
//! ssm_conformance::assert_conformance(&ssm_conformance::Labeled(rt, "cpu-1t".into()), ssm_conformance::ops::ALL);
//! ```
//!
//! or, for reports that should not panic (the `cargo xtask conformance` runner),
//! [`run_all`] / [`run_cases`] → [`Report`]. The [`reference`](mod@reference) targets run the op crates'
//! references; the `cuda` feature adds [`cuda::Staged`], which copies host tensors onto a
//! CUDA runtime's device and back. [`cases`] holds the random case generators of the
//! backends' property tests.

mod case;
pub mod cases;
mod compare;
mod conv;
#[cfg(feature = "cuda")]
pub mod cuda;
mod gdn;
pub mod gdn_random;
pub mod gdn_step_random;
mod harness;
pub mod reference;
mod ring;
pub mod split;
mod ssd;
mod ssu;
mod target;

pub use case::{Case, CaseError, load_dir, load_file};
pub use compare::{OutputReport, Tolerance, compare};
pub use harness::{
    CaseResult, OpCounts, Report, Status, Variant, assert_conformance, default_vectors_dir, ops, run_all, run_case,
    run_case_variant, run_cases, shared_cases,
};
pub use ssm_tensor::HostTensor;
pub use target::{Labeled, Target, TargetError};

/// Ops this crate can map onto arguments.
pub const KNOWN_OPS: &[&str] = ops::ALL;

/// What an op runner returns: the produced outputs by name (`out`, `state`, …), or a reason it
/// could not run (`Err((skipped, message))`).
pub(crate) type Produced = Result<Vec<(String, HostTensor)>, (bool, String)>;
