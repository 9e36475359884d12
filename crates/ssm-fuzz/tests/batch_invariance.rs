//! Batch invariance on the CPU backend (vLLM#48613): a sequence's output and states are
//! bit-identical alone and at any position of a batch of 256, for decode and speculative
//! decode (SSU, both GDN recurrences).

use ssm_conformance::cases::ssu::{Case, Spec, Tokens};
use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec};
use ssm_dispatch::{Config, Runtime};
use ssm_fuzz::invariance::{Batch, alone_vs_batch};
use ssm_fuzz::ops;
use ssm_tensor::DType;

const N: usize = 256;
const POSITIONS: [usize; 6] = [0, 1, 77, 128, 200, 255];

/// Runs the check and requires the lone calls to have written something.
fn check<O: ssm_fuzz::ops::FuzzOp>(
    rt: &dyn ssm_conformance::Target,
    what: &str,
    template: &O::At<'_>,
    batch: Batch<'_>,
) {
    match alone_vs_batch::<O>(rt, template, batch, &POSITIONS) {
        Ok(written) => {
            assert!(written > 1000, "{what}: the lone calls wrote only {written} elements");
            eprintln!("{what}: {written} elements written alone, bit-identical in the batch");
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

fn rt() -> Runtime {
    Runtime::new(&Config::cpu(Some(2))).unwrap()
}

#[test]
fn ssu_decode_and_speculative_are_batch_invariant() {
    let rt = rt();
    for state in [DType::F32, DType::BF16] {
        let mut case = Case::build(Spec::mamba2(N, state), 1);
        let batch = Batch { seqs: N, cu_seqlens: None, pools: &["state"] };
        check::<ops::Ssu>(&rt, &format!("ssu {state} decode"), &case.args(), batch);

        let spec = Spec {
            tokens: Tokens::Dense { seqs: N, steps: 3 },
            spec_width: Some(3),
            table_2d: true,
            ..Spec::mamba2(N, state)
        };
        let mut case = Case::build(spec, 2);
        check::<ops::Ssu>(&rt, &format!("ssu {state} speculative"), &case.args(), batch);
    }
}

#[test]
fn gdn_decode_and_speculative_are_batch_invariant() {
    let rt = rt();
    let batch = Batch { seqs: N, cu_seqlens: Some("rule.cu_seqlens"), pools: &["rule.initial_state"] };
    for state in [DType::F32, DType::BF16] {
        let mut case = RecurrentCase::random(RecurrentSpec::decode(N, state), 3);
        check::<ops::GdnSigmoid>(&rt, &format!("gdn {state} sigmoid decode"), &case.sigmoid_args(), batch);
        let spec = RecurrentSpec { max_len: 3, table: 2, columns: 4, ..RecurrentSpec::decode(N, state) };
        let mut case = RecurrentCase::random(spec, 4);
        check::<ops::GdnRecurrent>(&rt, &format!("gdn {state} speculative"), &case.recurrent_args(), batch);
    }
}
