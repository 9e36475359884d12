//! `gdn_decode_step` on the CPU backend: the conv update, then the sigmoid-gated recurrence on
//! its output, against the scalar references of both parts (`ssm_gdn::reference`, which runs
//! `ssm_conv`'s reference for the conv), on random steps from the shared generator
//! ([`ssm_conformance::gdn_step_random`]): odd head sizes, K ≠ V, every conv width, bias, both
//! conv-state layouts, f32 and bf16 SSM state, a conv pad with a real SSM slot and a real conv
//! slot with a null SSM slot. Outputs start as NaN: what must be written is checked, what must
//! not keeps its poison, untouched slots keep their bits. Host tables with out-of-range slots are
//! refused before anything is written.

use ssm_conformance::gdn_step_random::{StepCase, StepSpec};
use ssm_conv::ConvStateLayout;
use ssm_cpu::{CpuBackend, Par};
use ssm_gdn::GdnError;
use ssm_gdn::reference::Reference;
use ssm_tensor::{DType, HostTensor, Run};

fn close(what: &str, got: &HostTensor, want: &HostTensor) {
    let (atol, rtol) = if want.dtype == DType::F32 { (2e-4, 2e-3) } else { (3e-2, 3e-2) };
    for (i, (g, w)) in got.to_f64_vec().into_iter().zip(want.to_f64_vec()).enumerate() {
        if g.is_nan() || w.is_nan() {
            assert!(g.is_nan() && w.is_nan(), "{what}[{i}]: got {g}, want {w} (one is unwritten)");
            continue;
        }
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}[{i}]: got {g}, want {w}");
    }
}

fn untouched(what: &str, before: &HostTensor, after: &HostTensor, writable: &[usize]) {
    let per_slot = before.bytes().len() / before.shape[0];
    for slot in (0..before.shape[0]).filter(|s| !writable.contains(s)) {
        let r = slot * per_slot..(slot + 1) * per_slot;
        assert!(before.bytes()[r.clone()] == after.bytes()[r], "{what}: slot {slot} changed");
    }
}

#[test]
fn steps_match_the_references_of_their_parts() {
    let backends = [CpuBackend::new(Par::Seq).unwrap(), CpuBackend::new(Par::all_cores()).unwrap()];
    let odd = StepSpec { h: 1, hv: 3, k: 7, v: 5, ..StepSpec::decode(5, DType::F32) };
    let mut specs = vec![odd, StepSpec { width: 2, bias: true, ..odd }, StepSpec { k: 24, v: 40, width: 3, ..odd }];
    for state in [DType::F32, DType::BF16] {
        specs.push(StepSpec::decode(9, state));
        specs.push(StepSpec { layout: ConvStateLayout::DimStateLen, bias: true, ..StepSpec::decode(4, state) });
        specs.push(StepSpec { h: 2, hv: 2, k: 16, v: 48, ..StepSpec::decode(3, state) });
    }
    for (i, spec) in specs.into_iter().enumerate() {
        let base = StepCase::random(spec, 300 + i as u64);
        let mut want = base.clone();
        Reference::F32.run(ssm_gdn::plan(want.args().unwrap()).unwrap()).unwrap();
        for be in &backends {
            let mut got = base.clone();
            be.run(ssm_gdn::plan(got.args().unwrap()).unwrap()).unwrap();
            let what = format!("{spec:?}");
            close(&format!("{what} conv out"), &got.out, &want.out);
            close(&format!("{what} o"), &got.o, &want.o);
            close(&format!("{what} conv_state"), &got.conv_state, &want.conv_state);
            close(&format!("{what} ssm_state"), &got.ssm_state, &want.ssm_state);
            untouched(&format!("{what} conv_state"), &base.conv_state, &got.conv_state, &base.conv_writable());
            untouched(&format!("{what} ssm_state"), &base.ssm_state, &got.ssm_state, &base.ssm_writable());
        }
    }
}

#[test]
fn out_of_range_host_slots_are_refused_before_anything_is_written() {
    let spec = StepSpec { garbage: true, ..StepSpec::decode(6, DType::F32) };
    let mut case = StepCase::random(spec, 1);
    let err = case.args().err().expect("a slot past the pool must be refused");
    assert!(matches!(err, GdnError::Conv(_)), "{err}");
    let mut case = StepCase::random(spec, 1);
    let x = case.x.clone();
    let mut wrong = StepCase::random(StepSpec { h: 3, ..spec }, 2);
    wrong.x = x;
    let err = wrong.args().err().expect("x of another layer's width must be refused");
    assert!(matches!(err, GdnError::DecodeStep { .. }), "{err}");
    case.args().err().expect("refused again");
}
