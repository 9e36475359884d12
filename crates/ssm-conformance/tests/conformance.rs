//! Every shared vector of every op through the dispatch facade on the CPU (one thread, two,
//! all cores) and through the op crates' references (f32 and f64), in every variant (state
//! layouts, caller scratch): the one conformance harness, instantiated per target.

use ssm_conformance::reference::{Arithmetic, Reference};
use ssm_conformance::{Labeled, conformance_tests, ops};
use ssm_dispatch::{Config, Runtime};

fn cpu(threads: Option<usize>, label: &str) -> Labeled<Runtime> {
    Labeled(Runtime::new(&Config::cpu(threads)).expect("CPU runtime"), label.into())
}

conformance_tests! {
    cpu_one_thread_passes_every_vector: cpu(Some(1), "cpu-1t") => ops::ALL;
    cpu_two_threads_passes_every_vector: cpu(Some(2), "cpu-2t") => ops::ALL;
    cpu_all_cores_passes_every_vector: cpu(None, "cpu-all") => ops::ALL;
    reference_f32_passes_every_vector: Reference(Arithmetic::F32) => ops::ALL;
    reference_f64_passes_every_vector: Reference(Arithmetic::F64) => ops::ALL;
}
