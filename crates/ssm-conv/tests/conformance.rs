//! Every conformance vector of `causal_conv1d_update` and `causal_conv1d_fn` through the
//! reference (f32 and f64) and the CPU backend, in both conv-state layouts.

mod common;

use common::{Vector, run_fn, run_update, vector_files};
use ssm_conv::ConvStateLayout;
use ssm_conv::reference::{Precision, Reference};

const LAYOUTS: [ConvStateLayout; 2] = [ConvStateLayout::DimStateLen, ConvStateLayout::StateLenDim];

fn check_all<B: ssm_conv::ConvBackend<E>, E: std::fmt::Debug>(label: &str, backend: &B) {
    let mut failures = Vec::new();
    let (mut cases, mut elements) = (0, 0);
    for (op, files) in [
        ("causal_conv1d_update", vector_files("causal_conv1d_update")),
        ("causal_conv1d_fn", vector_files("causal_conv1d_fn")),
    ] {
        assert!(!files.is_empty(), "no vectors for {op}");
        for path in files {
            let v = Vector::load(&path);
            for layout in LAYOUTS {
                let r = if op == "causal_conv1d_update" {
                    run_update(backend, &v, layout)
                } else {
                    run_fn(backend, &v, layout)
                };
                match r {
                    Ok(n) => {
                        cases += 1;
                        elements += n;
                    }
                    Err(e) => failures.push(format!("{op}/{layout:?}: {e}")),
                }
            }
        }
    }
    eprintln!("{label}: {cases} case-layout runs passed, {elements} elements checked");
    assert!(failures.is_empty(), "{label}: {} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn reference_f32_passes_every_vector() {
    check_all("reference f32", &Reference { precision: Precision::F32 });
}

#[test]
fn reference_f64_passes_every_vector() {
    check_all("reference f64", &Reference { precision: Precision::F64 });
}

#[test]
fn cpu_backend_passes_every_vector() {
    use ssm_cpu::{CpuBackend, Par};
    check_all("cpu sequential", &CpuBackend::new(Par::Seq).unwrap());
    check_all("cpu 2 threads", &CpuBackend::new(Par::Rayon(std::num::NonZeroUsize::new(2).unwrap())).unwrap());
}
