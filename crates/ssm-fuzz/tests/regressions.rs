//! Every defect class the fuzzing found (issue "Reliability", and the harness's own runs),
//! as a named regression test through the public API.

use ssm_dispatch::{Config, Runtime};
use ssm_tensor::{DType, HostTensor, Layout, TensorError, TensorMut, TensorRef};

fn rt() -> Runtime {
    Runtime::new(&Config::cpu(Some(2))).unwrap()
}

/// A view of shape `[1, 2^61, 8, 8]` over 8 floats has an element count that wraps to 0 in a
/// `usize` product; it used to pass construction, and `selective_state_update` then wrote
/// outside the buffers. Now the view itself is refused.
#[test]
fn element_counts_that_wrap_are_refused_at_view_construction() {
    let mut mem = vec![0f32; 8];
    let v = TensorMut::from_slice(&mut mem, &[8]).unwrap();
    let err = v.with_layout(&[1, 1 << 61, 8, 8], &[0, 64, 8, 1], 0).err().expect("refused");
    assert!(matches!(err, TensorError::TooLarge { .. }), "{err}");
    assert!(matches!(Layout::contiguous(&[1, 1 << 61, 8]), Err(TensorError::TooLarge { .. })));
    // Strides whose span passes the address space, at any offset.
    let r = TensorRef::from_slice(&mem, &[8]).unwrap();
    assert!(r.with_layout(&[2, 2], &[isize::MAX, 1], 0).is_err());
    assert!(r.with_layout(&[2], &[isize::MIN], usize::MAX).is_err());
}

/// Too high a rank is an error of the fallible constructor, not a panic.
#[test]
fn host_tensor_rank_is_a_typed_error() {
    let err = HostTensor::try_from_bytes(DType::F32, vec![1; 7], &[0; 4]).unwrap_err();
    assert_eq!(err, TensorError::RankTooLarge { rank: 7 });
    assert!(HostTensor::try_from_bytes(DType::F32, vec![2, 3], &[0; 20]).is_err(), "too few bytes");
    assert!(HostTensor::try_from_bytes(DType::F32, vec![1 << 62, 8], &[0; 4]).is_err(), "count overflows");
}

/// `philox_rounds = u32::MAX` used to run four billion rounds per element (a hang).
#[test]
fn philox_rounds_are_bounded() {
    use ssm_conformance::cases::ssu::{Case, Spec};
    let mut spec = Spec::mamba2(2, DType::F16);
    spec.sr = Some(ssm_ssu::StochasticRounding { seed: 1, philox_rounds: u32::MAX });
    let mut case = Case::build(spec, 3);
    let before = case.clone();
    let err = rt().selective_state_update(case.args()).unwrap_err().to_string();
    assert!(err.contains("philox_rounds"), "{err}");
    assert_eq!(case.slot_bytes(0), before.slot_bytes(0));
}

/// `num_accepted_tokens = i64::MIN` overflowed `accepted − 1` in the plan.
#[test]
fn extreme_accepted_counts_do_not_overflow() {
    assert_eq!(ssm_ssu::start_column(i64::MIN), 0);
    assert_eq!(ssm_ssu::start_column(i64::MAX), (i64::MAX - 1) as usize);
    assert_eq!(ssm_ssu::start_column(0), 0);
    assert_eq!(ssm_ssu::start_column(3), 2);
}

/// Tracker counters near `i64::MAX` overflowed `prev + 1`; they now wrap as the device's
/// `int64` does, identically in the reference and the CPU backend.
#[test]
fn tracker_counters_at_i64_max_wrap_identically() {
    use ssm_ring::{RingTrackers, UpdateRingTrackersArgs};
    let run = |reference: bool| {
        let mut rs = [i64::MAX, 0, 5];
        let mut pa = [i64::MAX, i64::MAX - 1, 1];
        let mut pq = [0i64, 0, 0];
        let idx = [0i64, 1, 2];
        let args = UpdateRingTrackersArgs {
            trackers: RingTrackers {
                ring_start: TensorMut::from_slice(&mut rs, &[3]).unwrap(),
                prev_num_accepted: TensorMut::from_slice(&mut pa, &[3]).unwrap(),
                prev_query_len: TensorMut::from_slice(&mut pq, &[3]).unwrap(),
            },
            state_batch_indices: TensorRef::from_slice(&idx, &[3]).unwrap(),
            logical_window: Some(4),
            ring_buffer_len: Some(8),
            pad_slot_id: None,
        };
        if reference {
            ssm_ring::reference::update_replayssm_ring_trackers(ssm_tensor::Planned::new(args).unwrap());
        } else {
            rt().update_replayssm_ring_trackers(args).unwrap();
        }
        (rs, pa)
    };
    assert_eq!(run(false), run(true));
    assert_eq!(run(true).1[2], 2);
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 17) as f32 / 17.0 - 0.5) * scale).collect()
}

/// One SSD prefill of 3 tokens (1 head, P = N = 8) with `chunk_size`; returns `out` and the
/// final states, or the error.
fn ssd(chunk_size: usize, varlen_states_strides: Option<[isize; 4]>) -> Result<(Vec<f32>, Vec<f32>), String> {
    use ssm_ssd::MambaChunkScanCombinedVarlenArgs as Args;
    let (t, p, n) = (3, 8, 8);
    let x = ramp(t * p, 1.0);
    let dt = ramp(t, 0.2).iter().map(|v| v + 0.3).collect::<Vec<_>>();
    let a = [-0.5f32];
    let b = ramp(t * n, 1.0);
    let c = ramp(t * n, 0.7);
    let tables = [[0i64, 3].as_slice(), &[0, 3], &[0], &[0]];
    let mut out = vec![f32::NAN; t * p];
    let mut states = vec![f32::NAN; 2 * p * n];
    let mut varlen_states = TensorMut::from_slice(&mut states, &[1, 1, p, n]).unwrap();
    if let Some(st) = varlen_states_strides {
        varlen_states = varlen_states.with_layout(&[1, 1, p, n], &st, 0).unwrap();
    }
    let args = Args {
        out: Some(TensorMut::from_slice(&mut out, &[t, 1, p]).unwrap()),
        varlen_states: Some(varlen_states),
        ..Args::new(
            TensorRef::from_slice(&x, &[t, 1, p]).unwrap(),
            TensorRef::from_slice(&dt, &[t, 1]).unwrap(),
            TensorRef::from_slice(&a, &[1]).unwrap(),
            TensorRef::from_slice(&b, &[t, 1, n]).unwrap(),
            TensorRef::from_slice(&c, &[t, 1, n]).unwrap(),
            chunk_size,
            tables.map(|v| TensorRef::from_slice(v, &[v.len()]).unwrap()),
        )
    };
    rt().mamba_chunk_scan_combined_varlen(args).map_err(|e| e.to_string())?;
    Ok((out, states[..p * n].to_vec()))
}

/// An SSD `chunk_size` of 2^16 over 3 tokens used to size a 17 GB scratch (and abort the
/// process); the scratch now follows the longest chunk, and the result is the same as with a
/// chunk size just above it.
#[test]
fn a_huge_chunk_size_over_short_chunks_costs_nothing() {
    let small = ssd(4, None).unwrap();
    let huge = ssd(1 << 16, None).unwrap();
    assert_eq!(small, huge);
    assert!(ssd(1 << 62, None).is_ok(), "a power of two past any memory, over 3 tokens");
}

/// A written `varlen_states` whose rows overlap (stride 1 over rows of 8) was accepted, and the
/// result depended on the order of the writes.
#[test]
fn overlapping_written_ssd_states_are_refused() {
    let err = ssd(4, Some([64, 64, 1, 1])).unwrap_err();
    assert!(err.contains("varlen_states") && err.contains("overlap"), "{err}");
}

/// A 2-D GDN slot table with 2^32 broadcast columns: the plan read every column of every row
/// (minutes); it now reads the columns the call uses.
#[test]
fn a_wide_gdn_table_costs_only_its_used_columns() {
    use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec};
    let mut case = RecurrentCase::random(RecurrentSpec::decode(2, DType::F32), 5);
    let mut args = case.recurrent_args();
    let ix = args.rule.ssm_state_indices.expect("decode uses a slot table");
    let wide = ix.with_layout(&[2, 1 << 32], &[ix.strides()[0], 0], ix.layout().offset()).unwrap();
    args.rule.ssm_state_indices = Some(wide);
    let start = std::time::Instant::now();
    rt().fused_recurrent_gated_delta_rule(args).unwrap();
    assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
}

/// A zero-size `dstate` with non-empty `x`/`out` reached the kernel, which read an 8-lane tile
/// of `B` past its (empty) memory. Every route must now run it (the state adds nothing: the
/// output is the skip term) or refuse it, never panic, with any strides on the empty `B`/`C`.
#[test]
fn a_zero_dstate_is_planned_not_crashed() {
    use ssm_conformance::cases::ssu::{Case, Spec};
    for (i, dense) in [false, true].into_iter().enumerate() {
        let mut spec = Spec::mamba2(3, DType::F32);
        spec.dstate = 0;
        if dense {
            spec.tokens = ssm_conformance::cases::ssu::Tokens::Dense { seqs: 2, steps: 2 };
        }
        let mut case = Case::build(spec, 11 + i as u64);
        let mut args = case.args();
        let b = args.b;
        args.b = b.with_layout(b.shape(), &vec![isize::MAX / 4; b.rank()], 0).unwrap_or(b);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt().selective_state_update(args).is_ok()));
        assert!(r.is_ok(), "dense={dense}: panicked");
    }
}

/// A speculative `dst_state_batch_indices` only as wide as the tokens, with an accepted count
/// past that width: the plan accepted it (the column is read only from the source table) and
/// the CPU backend and the reference read `dst[b, accepted - 1]` past the table.
#[test]
fn a_speculative_dst_table_as_wide_as_the_tokens_suffices() {
    use ssm_conformance::cases::ssu::{Case, Spec, Tokens};
    let spec = Spec {
        tokens: Tokens::Dense { seqs: 2, steps: 1 },
        spec_width: Some(3),
        table_2d: true,
        separate_dst: true,
        pad_rows: false,
        ..Spec::mamba2(2, DType::F32)
    };
    let mut case = Case::build(spec, 5);
    case.num_accepted_tokens = Some(HostTensor::from_i64(DType::I32, vec![2], &[3, 3]));
    let mut reference = case.clone();
    fn narrow(t: TensorRef<'_>) -> TensorRef<'_> {
        let (s, o) = (t.strides().to_vec(), t.layout().offset());
        t.with_layout(&[2, 1], &s, o).unwrap()
    }
    let mut args = case.args();
    args.dst_state_batch_indices = args.dst_state_batch_indices.map(narrow);
    rt().selective_state_update(args).unwrap();
    let mut args = reference.args();
    args.dst_state_batch_indices = args.dst_state_batch_indices.map(narrow);
    ssm_tensor::Run::run(&ssm_ssu::reference::Reference, ssm_tensor::Planned::new(args).unwrap()).unwrap();
    let close = case
        .out
        .to_f64_vec()
        .iter()
        .zip(reference.out.to_f64_vec())
        .all(|(a, b)| (a - b).abs() <= 1e-2 * (1.0 + b.abs()));
    assert!(close, "CPU and reference agree");
}

/// The GDN core gathered the rows of an `a` with no columns through `Layout::index([r, 0])`
/// before any plan saw its shape (a debug-assertion panic; an address past the view in
/// release). It now leaves the shape to the gating op's plan, which refuses it.
#[test]
fn gdn_core_with_an_empty_gate_is_refused() {
    let mut case = ssm_fuzz::cores::GdnCoreCase::new(3);
    let mut args = case.args();
    let t = args.a.shape()[0];
    let mem = [0f32; 0];
    args.a = TensorRef::from_slice(&mem, &[t, 0]).unwrap();
    let err = rt().gdn_attention_core(args).unwrap_err().to_string();
    assert!(err.contains('a'), "{err}");
}

/// The Mamba2 core read `state_indices_tensor_d` at `[i, 0]` or `[i]` whatever its rank, and at
/// column 0 of a table without columns.
#[test]
fn mamba2_core_decode_tables_of_other_ranks_are_refused() {
    let shapes: [&[usize]; 3] = [&[3, 0], &[3, 1, 1], &[1, 3, 3]];
    for shape in shapes {
        let mut case = ssm_fuzz::cores::Mamba2CoreCase::new(4);
        let mut args = case.args();
        let mem = [0i32; 9];
        let n: usize = shape.iter().product();
        args.metadata.state_indices_tensor_d = Some(TensorRef::from_slice(&mem[..n], shape).unwrap());
        let err = rt().mamba2_mixer_core(args).unwrap_err().to_string();
        assert!(err.contains("state_indices_tensor_d"), "{shape:?}: {err}");
    }
}

/// `checkpointing_ssu` with `max_seqlen = usize::MAX`: the window check `T <= L - T` ran on
/// `T as i64 = -1` and passed; the CPU backend then overflowed sizing its scratch.
#[test]
fn a_huge_max_seqlen_is_refused_by_the_window_check() {
    let rt = Runtime::new(&Config { replayssm: true, ..Config::cpu(Some(1)) }).unwrap();
    let mut case = ssm_fuzz::cores::CheckpointCase::new(2);
    let mut args = case.args();
    rt.checkpointing_ssu(case_clone_args(&mut args)).unwrap();
    args.max_seqlen = Some(usize::MAX);
    let err = rt.checkpointing_ssu(args).unwrap_err().to_string();
    assert!(err.contains("T must be <= W"), "{err}");
}

/// The template call itself runs (so the refusal above is the window check's).
fn case_clone_args<'a>(args: &'a mut ssm_ring::CheckpointingSsuArgs<'_>) -> ssm_ring::CheckpointingSsuArgs<'a> {
    ssm_ring::CheckpointingSsuArgs {
        state: args.state.reborrow(),
        x_cache: args.x_cache.reborrow(),
        b_cache: args.b_cache.reborrow(),
        dt_cache: args.dt_cache.reborrow(),
        out: args.out.reborrow(),
        ..*args
    }
}

/// `checkpointing_ssu` accepted written caches whose elements overlap (a stride-0 ring axis of
/// `B_cache`, heads and ring rows of `dt_cache` sharing memory); the result then depended on
/// the order of the writes.
#[test]
fn overlapping_replayssm_caches_are_refused() {
    let rt = Runtime::new(&Config { replayssm: true, ..Config::cpu(Some(1)) }).unwrap();
    let mut case = ssm_fuzz::cores::CheckpointCase::new(2);
    let mut args = case.args();
    let (shape, mut strides, off) =
        (args.b_cache.shape().to_vec(), args.b_cache.strides().to_vec(), args.b_cache.layout().offset());
    strides[2] = 0;
    args.b_cache = args.b_cache.with_layout(&shape, &strides, off).unwrap();
    let err = rt.checkpointing_ssu(args).unwrap_err().to_string();
    assert!(err.contains("B_cache") && err.contains("overlap"), "{err}");
}
