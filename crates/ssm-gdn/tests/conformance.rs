//! Every conformance vector of the GDN ops, through the f32 and f64 references and the CPU
//! backend (one thread and two), in both state layouts (the files' `[slots, HV, V, K]` states
//! are transposed for `[slots, HV, K, V]`).

mod common;

use ssm_gdn::reference::Reference;

const OPS: [&str; 4] = [
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "chunk_gated_delta_rule",
];

#[test]
fn reference_f32_passes_every_vector() {
    for op in OPS {
        let n = common::check_op(&Reference::F32, "reference-f32", op);
        eprintln!("reference-f32 {op}: {n} vectors passed");
    }
}

#[test]
fn reference_f64_passes_every_vector() {
    for op in OPS {
        let n = common::check_op(&Reference::F64, "reference-f64", op);
        eprintln!("reference-f64 {op}: {n} vectors passed");
    }
}

#[test]
fn cpu_backend_passes_every_vector() {
    use ssm_cpu::{CpuBackend, Par};
    let two = Par::Rayon(std::num::NonZeroUsize::new(2).unwrap());
    for (label, par) in [("cpu-seq", Par::Seq), ("cpu-2t", two)] {
        let be = CpuBackend::new(par).unwrap();
        for op in OPS {
            let n = common::check_op(&be, label, op);
            eprintln!("{label} {op}: {n} vectors passed");
        }
    }
}
