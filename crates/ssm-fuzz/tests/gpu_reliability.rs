//! Reliability on the GPU (the `cuda` feature; skipped without a GPU unless
//! `SSM_REQUIRE_GPU=1`), staged through CUDA runtimes (`ssm_conformance::cuda::Staged`):
//! - batch invariance: a sequence alone and at any position of a batch of 256 gives the same
//!   bits, for SSU decode/speculative, both GDN recurrences, ReplaySSM and both chunked
//!   prefills, and alone and in a mixed batch for both layer cores;
//! - determinism: every template call gives the same bits from run to run (the layer cores
//!   included, with their metadata index tensors on the device);
//! - concurrency: two runtimes on device 0, driven from two threads at once, give the bits of
//!   one runtime driven serially;
//! - a backend on a borrowed stream gives the bits of one on its own stream.
#![cfg(feature = "cuda")]

use ssm_conformance::cases::ssu::{Case, Spec};
use ssm_conformance::cuda::Staged;
use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec};
use ssm_dispatch::{BackendKind, Config, Runtime};
use ssm_fuzz::core_invariance::{assert_gdn_core_batch_invariant, assert_mamba2_core_batch_invariant};
use ssm_fuzz::invariance::{
    assert_gdn_routes_batch_invariant, assert_prefill_routes_batch_invariant, assert_replayssm_batch_invariant,
    assert_ssu_routes_batch_invariant,
};
use ssm_fuzz::templates::{Results, differing, record};
use ssm_tensor::DType;

/// A staged CUDA runtime, or `None` (printing why) where there is no GPU.
fn cuda(test: &str) -> Option<Staged> {
    if !ssm_cuda::testing::gpu_ready(test) {
        return None;
    }
    // ReplaySSM on, so that the `checkpointing_ssu` template runs on the GPU too.
    let rt = Runtime::new(&Config { backend: BackendKind::Cuda, replayssm: true, ..Config::default() })
        .expect("CUDA runtime");
    Some(Staged::new(rt, "cuda"))
}

#[test]
fn cuda_decode_and_speculative_are_batch_invariant() {
    let Some(t) = cuda("cuda_decode_and_speculative_are_batch_invariant") else { return };
    assert_ssu_routes_batch_invariant(&t);
    assert_gdn_routes_batch_invariant(&t);
}

#[test]
fn cuda_replayssm_is_batch_invariant() {
    let Some(t) = cuda("cuda_replayssm_is_batch_invariant") else { return };
    assert_replayssm_batch_invariant(&t);
}

#[test]
fn cuda_chunked_prefill_is_batch_invariant() {
    let Some(t) = cuda("cuda_chunked_prefill_is_batch_invariant") else { return };
    assert_prefill_routes_batch_invariant(&t);
}

#[test]
fn cuda_layer_cores_are_batch_invariant() {
    let Some(t) = cuda("cuda_layer_cores_are_batch_invariant") else { return };
    assert_gdn_core_batch_invariant(&t);
    assert_mamba2_core_batch_invariant(&t);
}

const SEED: u64 = 0xd37e;
const RANDOM: usize = 12;

fn ran(r: &Results) -> usize {
    r.iter().filter(|(_, r)| r.is_ok()).count()
}

#[test]
fn cuda_results_are_bit_identical_run_to_run() {
    let Some(t) = cuda("cuda_results_are_bit_identical_run_to_run") else { return };
    let first = record(&t, SEED, RANDOM, (0, 1));
    assert!(ran(&first) > 50, "only {} calls ran", ran(&first));
    let second = record(&t, SEED, RANDOM, (0, 1));
    let d = differing(&first, &second);
    assert!(d.is_empty(), "{} of {} calls differ between runs: {d:#?}", d.len(), first.len());
    // The layer cores run on the device too (staged with their metadata index tensors there).
    for core in ["gdn_attention_core", "mamba2_mixer_core"] {
        let n = first.iter().filter(|(label, r)| label.starts_with(core) && r.is_ok()).count();
        assert!(n > 0, "no {core} call ran on the GPU");
    }
    eprintln!(
        "{} calls ({} ran; the others were refused with a typed error), bit-identical run to run",
        first.len(),
        ran(&first)
    );
}

#[test]
fn two_runtimes_on_one_device_from_two_threads_match_one_serial_runtime() {
    let Some(serial_rt) = cuda("two_runtimes_on_one_device_from_two_threads") else { return };
    let serial = record(&serial_rt, SEED, RANDOM, (0, 1));
    let (a, b) = (cuda("runtime a").unwrap(), cuda("runtime b").unwrap());
    let mut both: Results = std::thread::scope(|s| {
        let ha = s.spawn(|| record(&a, SEED, RANDOM, (0, 2)));
        let hb = s.spawn(|| record(&b, SEED, RANDOM, (1, 2)));
        [ha.join().unwrap(), hb.join().unwrap()].concat()
    });
    both.sort_by(|x, y| x.0.cmp(&y.0));
    let d = differing(&serial, &both);
    assert!(d.is_empty(), "{} of {} calls differ: {d:#?}", d.len(), serial.len());
    eprintln!("{} calls on two runtimes from two threads, bit-identical to one serial runtime", serial.len());
}

/// A backend on a stream someone else owns (an engine's, e.g. PyTorch's current stream) gives
/// the bits of a backend on its own stream, for the SSU and the GDN recurrence.
#[test]
fn a_backend_on_a_borrowed_stream_matches_one_on_its_own() {
    use ssm_cuda::CudaBackend;
    use ssm_cuda::testing::{DeviceGdnRecurrentArgs, DeviceSsuArgs, run_staged};
    if cuda("a_backend_on_a_borrowed_stream").is_none() {
        return;
    }
    let own = CudaBackend::new(0).expect("backend");
    let owner = CudaBackend::new(0).expect("the stream's owner");
    // SAFETY: the stream belongs to `owner`'s context (device 0's primary context), which
    // outlives `borrowed` (dropped first, at the end of this scope, in reverse order).
    let borrowed = unsafe { CudaBackend::with_borrowed_stream(0, owner.stream().cu_stream()) }.expect("borrowed");
    for state in [DType::F32, DType::BF16] {
        let base = Case::build(Spec::mamba2(64, state), 21);
        let (mut a, mut b) = (base.clone(), base.clone());
        run_staged::<DeviceSsuArgs>(&own, a.args()).expect("own stream");
        run_staged::<DeviceSsuArgs>(&borrowed, b.args()).expect("borrowed stream");
        assert!(a.out == b.out && a.state == b.state, "ssu {state}: borrowed stream differs");

        let base = RecurrentCase::random(RecurrentSpec::decode(64, state), 22);
        let (mut a, mut b) = (base.clone(), base.clone());
        run_staged::<DeviceGdnRecurrentArgs>(&own, a.recurrent_args()).expect("own stream");
        run_staged::<DeviceGdnRecurrentArgs>(&borrowed, b.recurrent_args()).expect("borrowed stream");
        assert!(a.o == b.o && a.state == b.state, "gdn {state}: borrowed stream differs");
    }
    eprintln!("SSU and GDN on a borrowed stream: bit-identical to a backend's own stream");
}
