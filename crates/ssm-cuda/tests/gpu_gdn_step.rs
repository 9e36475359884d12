//! GPU tests of `gdn_decode_step` (the conv update, then the sigmoid-gated recurrence on its
//! output): every route (the fused kernel, the conv and the recurrence chained by programmatic
//! dependent launch, the two plain launches) must write exactly what the two plain launches
//! write, bit for bit, over conv widths, bias, state dtypes, pads, null slots, garbage device
//! indices and batch sizes; steps replayed from a CUDA graph equal eager steps on the fused and
//! the chained route; steps allocate no device memory. Skips
//! with a printed reason when no GPU (or no NVRTC) is found; `SSM_REQUIRE_GPU=1` turns the skip
//! into a failure.

#![allow(clippy::result_large_err)]

mod common;

use common::gpu;
use cudarc::driver::sys;
use ssm_conformance::gdn_step_random::{StepCase, StepSpec, StepTensors};
use ssm_conv::ConvStateLayout;
use ssm_cuda::CudaBackend;
use ssm_cuda::gdn::StepRoute;
use ssm_cuda::testing::StagedTensor;
use ssm_gdn::GdnDecodeStepArgs;
use ssm_tensor::{DType, HostTensor, Planned, Run};

/// The case's tensors on the device.
struct Staged {
    x: StagedTensor,
    w: StagedTensor,
    bias: Option<StagedTensor>,
    conv_state: StagedTensor,
    conv_idx: StagedTensor,
    out: StagedTensor,
    a_log: StagedTensor,
    dt_bias: StagedTensor,
    a: StagedTensor,
    b: StagedTensor,
    ssm_state: StagedTensor,
    ssm_idx: StagedTensor,
    o: StagedTensor,
}

impl Staged {
    fn upload(be: &CudaBackend, c: &StepCase) -> Self {
        let up = |t: &HostTensor| StagedTensor::upload(be, &t.view()).unwrap();
        Staged {
            x: up(&c.x),
            w: up(&c.w),
            bias: c.bias.as_ref().map(up),
            conv_state: up(&c.conv_state),
            conv_idx: up(&c.conv_idx),
            out: up(&c.out),
            a_log: up(&c.a_log),
            dt_bias: up(&c.dt_bias),
            a: up(&c.a),
            b: up(&c.b),
            ssm_state: up(&c.ssm_state),
            ssm_idx: up(&c.ssm_idx),
            o: up(&c.o),
        }
    }

    fn call(&mut self, c: &StepCase) -> Planned<GdnDecodeStepArgs<'_>> {
        let t = StepTensors {
            x: self.x.view().unwrap(),
            w: self.w.view().unwrap(),
            bias: self.bias.as_ref().map(|b| b.view().unwrap()),
            conv_state: self.conv_state.view_mut().unwrap(),
            conv_idx: self.conv_idx.view().unwrap(),
            out: self.out.view_mut().unwrap(),
            a_log: self.a_log.view().unwrap(),
            dt_bias: self.dt_bias.view().unwrap(),
            a: self.a.view().unwrap(),
            b: self.b.view().unwrap(),
            ssm_state: self.ssm_state.view_mut().unwrap(),
            ssm_idx: self.ssm_idx.view().unwrap(),
            o: self.o.view_mut().unwrap(),
        };
        ssm_gdn::plan(t.args(&c.spec).unwrap()).unwrap()
    }

    /// What a step writes: conv state, conv output, SSM state, o (bytes).
    fn written(&mut self) -> Vec<Vec<u8>> {
        [&mut self.conv_state, &mut self.out, &mut self.ssm_state, &mut self.o]
            .into_iter()
            .map(|t| t.buffer().download().unwrap())
            .collect()
    }
}

/// Runs the step on each route (fused, chained, separate; asserting the fused kernel covers the
/// case) on copies of the same inputs; returns each result and the device errors it reported.
/// One route's result: the route, what it wrote (conv state, conv out, SSM state, o), its device errors.
type RouteResult = (StepRoute, Vec<Vec<u8>>, Option<u32>);

fn every_route(be: &CudaBackend, c: &StepCase) -> Vec<RouteResult> {
    [StepRoute::Fused, StepRoute::Chained, StepRoute::Separate]
        .into_iter()
        .map(|route| {
            let mut dev = Staged::upload(be, c);
            let call = dev.call(c);
            assert!(be.gdn_decode_step_fusable(&call), "the case must be one the fused kernel covers");
            be.run_gdn_decode_step_on(call, route).unwrap();
            let err = be.check().err().map(|e| match e {
                ssm_cuda::CudaError::InvalidIndices(d) => d.0,
                other => panic!("{other}"),
            });
            (route, dev.written(), err)
        })
        .collect()
}

/// Every route leaves the bytes of the separate launches.
fn assert_same(what: &str, results: &[RouteResult]) {
    let (_, want, want_err) = results.last().expect("the separate route");
    for (route, got, err) in results {
        for (name, (a, b)) in ["conv_state", "conv out", "ssm_state", "o"].iter().zip(got.iter().zip(want)) {
            if a != b {
                let first = a.iter().zip(b.iter()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
                panic!("{what}: {route:?}: {name} differs from the separate launches at byte {first}");
            }
        }
        assert_eq!(err, want_err, "{what}: {route:?}: device errors");
    }
}

#[test]
fn every_route_writes_exactly_what_the_separate_launches_write() {
    let Some(be) = gpu("every_route_writes_exactly_what_the_separate_launches_write") else { return };
    let base = StepSpec::decode(7, DType::F32);
    let mut specs = Vec::new();
    for state in [DType::F32, DType::BF16] {
        for batch in [1, 7, 64] {
            specs.push(StepSpec { batch, state, ..base });
        }
        specs.push(StepSpec { width: 3, bias: true, state, ..base });
        specs.push(StepSpec { width: 2, layout: ConvStateLayout::DimStateLen, state, ..base });
        specs.push(StepSpec { h: 16, hv: 32, batch: 9, state, ..base });
        specs.push(StepSpec { h: 4, hv: 4, batch: 5, state, ..base });
    }
    for (i, s) in specs.into_iter().enumerate() {
        let case = StepCase::random(s, 9000 + i as u64);
        assert_same(&format!("{s:?}"), &every_route(&be, &case));
    }
}

#[test]
fn garbage_device_slots_are_skipped_and_reported_as_by_the_separate_launches() {
    let Some(be) = gpu("garbage_device_slots_are_skipped_and_reported_as_by_the_separate_launches") else { return };
    for state in [DType::F32, DType::BF16] {
        let s = StepSpec { bias: true, garbage: true, ..StepSpec::decode(12, state) };
        let case = StepCase::random(s, 77);
        let got = every_route(&be, &case);
        assert!(got[0].2.is_some(), "the bad slots must be reported");
        assert_same(&format!("garbage {s:?}"), &got);
    }
}

/// Fifty steps replayed from one captured graph leave the bytes of fifty eager steps (the
/// arrival counters are left at zero by every launch, so replays do not drift).
#[test]
fn a_step_replayed_from_a_cuda_graph_equals_eager_steps() {
    let Some(be) = gpu("a_step_replayed_from_a_cuda_graph_equals_eager_steps") else { return };
    let s = StepSpec::decode(16, DType::BF16);
    let mut case = StepCase::random(s, 5);
    // No pad row here: every row of `out` is written by the conv, so repeated steps are well defined.
    case.conv_idx = case.ssm_idx.clone();
    for route in [StepRoute::Fused, StepRoute::Chained] {
        let mut eager = Staged::upload(&be, &case);
        let mut graphed = Staged::upload(&be, &case);
        for _ in 0..50 {
            be.run_gdn_decode_step_on(eager.call(&case), route).unwrap();
        }
        be.synchronize().unwrap();
        let stream = be.stream().clone();
        let call = graphed.call(&case);
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        be.run_gdn_decode_step_on(call, route).unwrap();
        let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
        for _ in 0..50 {
            graph.launch().unwrap();
        }
        be.synchronize().unwrap();
        be.check().unwrap();
        assert!(eager.written() == graphed.written(), "{route:?}: eager and graph-replayed steps differ");
    }
}

#[test]
fn steps_allocate_no_device_memory() {
    let Some(be) = gpu("steps_allocate_no_device_memory") else { return };
    let s = StepSpec::decode(64, DType::F32);
    let case = StepCase::random(s, 6);
    let mut dev = Staged::upload(&be, &case);
    be.prewarm_gdn_decode_step(&dev.call(&case)).unwrap();
    be.run(dev.call(&case)).unwrap();
    common::assert_free_memory_unchanged(&be, "steps", || be.run(dev.call(&case)).unwrap());
    be.check().unwrap();
}
