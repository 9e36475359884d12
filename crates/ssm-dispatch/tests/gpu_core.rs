//! The GDN attention core on the GPU (the `cuda` feature; skipped without a GPU unless
//! `SSM_REQUIRE_GPU=1`). The shared mixed test batch (`common::gdn_batch`: speculative
//! sequences, decodes with a padded row, prefills with and without initial state, tokens
//! interleaved), with every tensor and every metadata index tensor on the device:
//! - equals the core on the host (itself equal to its parts, `gdn_core.rs`), for both state
//!   layouts, with the token rows gathered and scattered on the device, and with the token lists
//!   left out (rows used in place);
//! - keeps the padded decode's output rows and every slot the metadata does not name
//!   bit-identical;
//! - with garbage device token indices: no fault, the error word says `ROW`, and the slots the
//!   metadata does not name stay bit-identical.
#![cfg(feature = "cuda")]
// The staging error is the test harness's (large) error enum, on a copy path.
#![allow(clippy::result_large_err)]

mod common;

use common::gdn_batch::*;
use common::gpu::{Dev, cuda};
use common::ints;
use ssm_conv::{Activation, ConvStateLayout};
use ssm_cuda::testing::StagedTensor;
use ssm_cuda::{CudaError, DeviceErrors};
use ssm_dispatch::{Config, Error, GdnAttentionCoreArgs, GdnAttentionMetadata, Runtime};
use ssm_gdn::StateLayout;
use ssm_tensor::{DType, HostTensor};

/// The metadata's index tensors on the device (the fields of [`Tables`]).
struct DeviceTables([StagedTensor; 8]);

impl DeviceTables {
    fn new(dev: &Dev<'_>, t: &Tables) -> Self {
        DeviceTables(
            [
                &t.spec_table,
                &t.spec_indx,
                &t.non_spec_indx,
                &t.spec_qsl,
                &t.non_spec_qsl,
                &t.non_spec_slots,
                &t.accepted,
                &t.has_init,
            ]
            .map(|h| dev.up(h)),
        )
    }

    /// [`Tables::metadata`]'s counts over the device tables.
    fn metadata<'a>(&'a self, host: &'a Tables, tokens: usize) -> GdnAttentionMetadata<'a> {
        let v = |i: usize| Some(self.0[i].view().expect("view"));
        GdnAttentionMetadata {
            spec_state_indices_tensor: v(0),
            spec_token_indx: v(1),
            non_spec_token_indx: v(2),
            spec_query_start_loc: v(3),
            non_spec_query_start_loc: v(4),
            non_spec_state_indices_tensor: v(5),
            num_accepted_tokens: v(6),
            has_initial_state: v(7),
            ..host.metadata(tokens)
        }
    }
}

/// Leaves out the speculative sequences and the token lists: the decodes and prefills then take
/// rows `[0, 77)` in place.
fn without_speculative(m: &mut GdnAttentionMetadata<'_>) {
    m.num_spec_decodes = 0;
    m.num_spec_decode_tokens = 0;
    m.spec_token_indx = None;
    m.non_spec_token_indx = None;
    m.spec_query_start_loc = None;
    m.spec_state_indices_tensor = None;
    m.num_accepted_tokens = None;
}

/// The pools and output after one core call on `rt` (host tensors in, host tensors out; on a
/// CUDA runtime every tensor and table is staged to the device first), with `edit` applied to
/// the metadata and `tables` naming the token lists.
fn run_core(
    rt: &Runtime,
    base: &Batch,
    layout: StateLayout,
    tables: &Tables,
    edit: fn(&mut GdnAttentionMetadata<'_>),
) -> Result<(HostTensor, HostTensor, HostTensor), Error> {
    let tokens = base.mixed.shape[0];
    let mut state = (base.conv.clone(), base.ssm.clone(), HostTensor::filled(DType::F32, vec![tokens, HV, V], 7.0));
    if rt.cuda().is_none() {
        let mut m = tables.metadata(tokens);
        edit(&mut m);
        rt.gdn_attention_core(core_args(base, &base.dt_bias, layout, &mut state, m))?;
        return Ok(state);
    }
    let dev = Dev(rt);
    let inputs = Inputs::new(&dev, base);
    let mut pools = [&state.0, &state.1, &state.2].map(|t| dev.up(t));
    let dt = DeviceTables::new(&dev, tables);
    let mut m = dt.metadata(tables, tokens);
    edit(&mut m);
    rt.gdn_attention_core(inputs.args(&mut pools, m, layout))?;
    Ok((dev.down(&pools[0], &state.0), dev.down(&pools[1], &state.1), dev.down(&pools[2], &state.2)))
}

/// The batch's inputs on the device: `mixed_qkv`, `a`, `b`, the conv weight and bias, `A_log`
/// and `dt_bias`.
struct Inputs([StagedTensor; 7]);

impl Inputs {
    fn new(dev: &Dev<'_>, base: &Batch) -> Self {
        Inputs([&base.mixed, &base.a, &base.b, &base.weight, &base.bias, &base.a_log, &base.dt_bias].map(|t| dev.up(t)))
    }

    /// The core call over these inputs and the device pools `(conv, ssm, out)`.
    fn args<'a>(
        &'a self,
        pools: &'a mut [StagedTensor; 3],
        metadata: GdnAttentionMetadata<'a>,
        layout: StateLayout,
    ) -> GdnAttentionCoreArgs<'a> {
        let v = |i: usize| self.0[i].view().expect("view");
        let [conv, ssm, out] = pools;
        GdnAttentionCoreArgs {
            mixed_qkv: v(0),
            a: v(1),
            b: v(2),
            conv_weight: v(3),
            conv_bias: Some(v(4)),
            a_log: v(5),
            dt_bias: v(6),
            conv_state: conv.view_mut().expect("view"),
            ssm_state: ssm.view_mut().expect("view"),
            core_attn_out: out.view_mut().expect("view"),
            metadata,
            activation: Activation::Silu,
            conv_state_layout: ConvStateLayout::StateLenDim,
            ssm_state_layout: layout,
            num_k_heads: H,
            pad_slot_id: Some(0),
        }
    }
}

/// Asserts that every slot outside `TOUCHED` of both pools is bit-identical to the batch's.
fn untouched_slots_kept(what: &str, base: &Batch, got: &(HostTensor, HostTensor, HostTensor)) {
    let per_ssm = base.ssm.bytes().len() / SLOTS;
    let per_conv = base.conv.bytes().len() / SLOTS;
    for s in (0..SLOTS).filter(|s| !TOUCHED.contains(s)) {
        let range = |per: usize| s * per..(s + 1) * per;
        assert_eq!(got.1.bytes()[range(per_ssm)], base.ssm.bytes()[range(per_ssm)], "{what}: ssm slot {s}");
        assert_eq!(got.0.bytes()[range(per_conv)], base.conv.bytes()[range(per_conv)], "{what}: conv slot {s}");
    }
}

/// An edit of the batch's metadata.
type Edit = fn(&mut GdnAttentionMetadata<'_>);

#[test]
fn gdn_core_on_the_gpu_equals_the_core_on_the_host() {
    let Some(gpu) = cuda("gdn_core_on_the_gpu_equals_the_core_on_the_host") else { return };
    let host = Runtime::new(&Config::cpu(Some(2))).unwrap();
    let keep: Edit = |_| {};
    for layout in [StateLayout::VK, StateLayout::KV] {
        let base = batch(layout);
        let tables = Tables::new(&base, ints(&NON_SPEC_SLOTS));
        let cases: [(&str, Edit); 3] =
            [("gathered", keep), ("in place", without_speculative), ("decode step", decode_only)];
        for (case, edit) in cases {
            let what = format!("{layout:?} {case}");
            let want = run_core(&host, &base, layout, &tables, edit).unwrap();
            let got = run_core(&gpu, &base, layout, &tables, edit).unwrap();
            gpu.check().unwrap_or_else(|e| panic!("{what}: device error word: {e}"));
            // The chunked prefill runs on tensor cores (tf32-free f32 here, but a different
            // summation order than the host's), so the comparison is to a tolerance.
            close(&format!("{what} core_attn_out"), &got.2, &want.2, 2e-3);
            close(&format!("{what} conv_state"), &got.0, &want.0, 1e-5);
            close(&format!("{what} ssm_state"), &got.1, &want.1, 2e-3);
            let w = HV * V;
            let d1 = base.dec_rows[1];
            if case == "gathered" {
                let row = &got.2.to_f64_vec()[d1 * w..(d1 + 1) * w];
                assert!(row.iter().all(|&x| x == 7.0), "{what}: the padded decode's rows keep the caller's values");
            }
            untouched_slots_kept(&what, &base, &got);
        }
    }
}

#[test]
fn garbage_device_token_indices_set_the_error_word_and_touch_no_other_slot() {
    let Some(gpu) = cuda("garbage_device_token_indices_set_the_error_word_and_touch_no_other_slot") else { return };
    let base = batch(StateLayout::VK);
    let mut tables = Tables::new(&base, ints(&NON_SPEC_SLOTS));
    let mut spec = base.spec_rows.iter().map(|&r| r as i64).collect::<Vec<_>>();
    spec[1] = 1 << 40;
    tables.spec_indx = HostTensor::from_i64(DType::I64, vec![spec.len()], &spec);
    let mut non_spec: Vec<i64> = base.dec_rows.iter().chain(&base.pre_rows).map(|&r| r as i64).collect();
    non_spec[3] = -5;
    non_spec[40] = base.mixed.shape[0] as i64;
    tables.non_spec_indx = ints(&non_spec);
    let got = run_core(&gpu, &base, StateLayout::VK, &tables, |_| {}).unwrap();
    match gpu.check() {
        Err(Error::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
            assert_ne!(w & DeviceErrors::ROW, 0, "ROW bit in {w:#x}")
        }
        other => panic!("expected the error word's ROW bit, got {other:?}"),
    }
    untouched_slots_kept("garbage token rows", &base, &got);
    let w = HV * V;
    let d1 = base.dec_rows[1];
    assert!(got.2.to_f64_vec()[d1 * w..(d1 + 1) * w].iter().all(|&x| x == 7.0), "the padded decode's rows");
    gpu.check().expect("the error word was cleared by the check before");
}

/// Leaves only the two decodes (rows 0 and 1 of the batch after [`without_speculative`], the
/// second a pad): a decode step, which runs in place.
fn decode_only(m: &mut GdnAttentionMetadata<'_>) {
    without_speculative(m);
    m.num_prefills = 0;
    m.num_prefill_tokens = 0;
    m.num_actual_tokens = 2;
}

/// A decode step of the core (device metadata, rows in place), captured in a CUDA graph on the
/// runtime's stream and replayed three times, leaves the bytes of three eager calls; the
/// per-call conv buffer becomes the graph's own stream-ordered allocation.
#[test]
fn a_decode_step_of_the_core_replayed_from_a_cuda_graph_equals_eager_calls() {
    use ssm_cuda::cudarc::driver::sys;
    let Some(gpu) = cuda("a_decode_step_of_the_core_replayed_from_a_cuda_graph_equals_eager_calls") else { return };
    let layout = StateLayout::VK;
    let base = batch(layout);
    let tables = Tables::new(&base, ints(&NON_SPEC_SLOTS));
    let dev = Dev(&gpu);
    let inputs = Inputs::new(&dev, &base);
    let dt = DeviceTables::new(&dev, &tables);
    let out0 = HostTensor::filled(DType::F32, vec![base.mixed.shape[0], HV, V], 7.0);
    let pools = || [&base.conv, &base.ssm, &out0].map(|t| dev.up(t));
    let (mut warm, mut eager, mut graphed) = (pools(), pools(), pools());
    let step = |pools: &mut [StagedTensor; 3]| {
        let mut m = dt.metadata(&tables, base.mixed.shape[0]);
        decode_only(&mut m);
        gpu.gdn_attention_core(inputs.args(pools, m, layout)).expect("decode step");
    };
    // Loads every kernel of the step before the capture.
    step(&mut warm);
    for _ in 0..3 {
        step(&mut eager);
    }
    let be = gpu.cuda().expect("cuda backend");
    be.synchronize().unwrap();
    let stream = be.stream().clone();
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    step(&mut graphed);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    for _ in 0..3 {
        graph.launch().unwrap();
    }
    be.synchronize().unwrap();
    gpu.check().expect("device error word");
    let down =
        |p: &[StagedTensor; 3]| [dev.down(&p[0], &base.conv), dev.down(&p[1], &base.ssm), dev.down(&p[2], &out0)];
    let (e, g) = (down(&eager), down(&graphed));
    for (what, (e, g)) in ["conv_state", "ssm_state", "core_attn_out"].iter().zip(e.iter().zip(&g)) {
        assert_eq!(e.bytes(), g.bytes(), "{what}: graph replay differs from eager calls");
    }
    // The steps did run, as the host core does them (within the tolerance of the first test).
    let host = Runtime::new(&Config::cpu(Some(2))).unwrap();
    let mut want = (base.conv.clone(), base.ssm.clone(), out0.clone());
    for _ in 0..3 {
        let mut m = tables.metadata(base.mixed.shape[0]);
        decode_only(&mut m);
        host.gdn_attention_core(core_args(&base, &base.dt_bias, layout, &mut want, m)).expect("host step");
    }
    assert_ne!(e[1].bytes(), base.ssm.bytes(), "the decode steps wrote their slot");
    close("graph core_attn_out", &e[2], &want.2, 2e-3);
    close("graph conv_state", &e[0], &want.0, 1e-5);
    close("graph ssm_state", &e[1], &want.1, 2e-3);
}
