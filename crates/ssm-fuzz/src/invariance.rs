//! Batch invariance: a sequence's outputs and states must be bit-identical whether it runs
//! alone or at any position of a large batch. [`alone_vs_batch`] runs a template batch once,
//! then each chosen sequence alone (the same memory, seen through views narrowed to that
//! sequence), and compares the bits.

use ssm_tensor::elem;

use crate::ops::FuzzOp;
use crate::spec::{Buffers, TensorSpec, Views};

/// Runs `template` over `specs` (its own tensor arguments, possibly re-viewed) on `target`, from
/// `init`; returns the memory afterwards, or the refusal.
pub fn run_specs<O: FuzzOp + 'static>(
    target: &dyn ssm_conformance::Target,
    template: &O::At<'_>,
    specs: &[TensorSpec],
    init: &Buffers,
) -> Result<Buffers, String> {
    run_fixed::<O>(target, template, specs, init, &|_| {})
}

/// [`run_specs`] with the rebuilt args' non-tensor fields set by `fix` before the call.
fn run_fixed<O: FuzzOp + 'static>(
    target: &dyn ssm_conformance::Target,
    template: &O::At<'_>,
    specs: &[TensorSpec],
    init: &Buffers,
    fix: &dyn for<'s> Fn(&mut O::At<'s>),
) -> Result<Buffers, String> {
    let mut bufs = init.clone();
    {
        let mut views = Views::new(specs, &mut bufs).map_err(|(n, e)| format!("{n}: {e}"))?;
        let mut args = O::respin(template, &mut views);
        fix(&mut args);
        views.finish();
        O::run(target, args).map_err(|e| e.to_string())?;
    }
    Ok(bufs)
}

/// Rewrites a lone sequence's arguments beyond the generic narrowing (e.g. SSD's chunk
/// metadata): `(arguments of sequence i alone, i)`.
pub type Fixup<'a> = &'a dyn Fn(&mut [TensorSpec], usize);

/// How a batch is split into sequences.
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    /// Sequences.
    pub seqs: usize,
    /// The packed-token offsets argument (`cu_seqlens`), if the batch is packed.
    pub cu_seqlens: Option<&'a str>,
    /// Arguments addressed by slot (state pools): never narrowed.
    pub pools: &'a [&'a str],
    /// Applied after the generic narrowing.
    pub fixup: Option<Fixup<'a>>,
}

fn read(spec: &TensorSpec, i: usize) -> i64 {
    let at = spec.offset as isize + i as isize * spec.strides[0];
    elem::read_i64(&spec.memory, spec.dtype, at as usize)
}

fn narrow(spec: &mut TensorSpec, axis: usize, start: usize, len: usize) {
    spec.offset = (spec.offset as isize + start as isize * spec.strides[axis]) as usize;
    spec.shape[axis] = len;
}

/// The arguments of sequence `i` alone: per-token arguments narrowed to its tokens (the axis
/// of extent "total tokens" when packed), per-sequence arguments to its row, the offsets
/// replaced by `[0, len]`; pools and per-head parameters as they are.
pub fn alone(specs: &[TensorSpec], batch: Batch<'_>, i: usize) -> Vec<TensorSpec> {
    let mut lone = narrowed(specs, batch, i);
    if let Some(f) = batch.fixup {
        f(&mut lone, i);
    }
    lone
}

fn narrowed(specs: &[TensorSpec], batch: Batch<'_>, i: usize) -> Vec<TensorSpec> {
    let cu = batch.cu_seqlens.map(|name| specs.iter().find(|s| s.name == name).expect("the offsets argument"));
    let (start, len, tokens) = match cu {
        Some(c) => {
            let (s, e) = (read(c, i) as usize, read(c, i + 1) as usize);
            (s, e - s, read(c, batch.seqs) as usize)
        }
        None => (i, 1, usize::MAX),
    };
    specs
        .iter()
        .map(|s| {
            let mut s = s.clone();
            if !s.present || batch.pools.contains(&s.name) || s.shape.is_empty() {
                return s;
            }
            if Some(s.name) == batch.cu_seqlens {
                let mut memory = vec![0; 2 * s.dtype.size()];
                elem::write_i64(&mut memory, s.dtype, 1, len as i64);
                return TensorSpec { shape: vec![2], strides: vec![1], offset: 0, memory, ..s };
            }
            if let Some(axis) = s.shape.iter().position(|&d| d == tokens) {
                narrow(&mut s, axis, start, len);
            } else if s.shape[0] == batch.seqs {
                narrow(&mut s, 0, i, 1);
            }
            s
        })
        .collect()
}

/// Replaces argument `name` of `specs` by a contiguous 1-D tensor of `values` (its dtype kept).
///
/// # Panics
/// If there is no such argument.
pub fn set_values(specs: &mut [TensorSpec], name: &str, values: &[i64]) {
    let s = specs.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no argument {name}"));
    let mut memory = vec![0; values.len() * s.dtype.size()];
    for (k, &v) in values.iter().enumerate() {
        elem::write_i64(&mut memory, s.dtype, k, v);
    }
    s.shape = vec![values.len()];
    s.strides = vec![1];
    s.offset = 0;
    s.memory = memory;
}

/// Element indices a view reaches.
fn reached(spec: &TensorSpec) -> Vec<usize> {
    let mut out = Vec::new();
    let n: usize = spec.shape.iter().product();
    for flat in 0..n {
        let (mut rem, mut off) = (flat, spec.offset as isize);
        for d in (0..spec.shape.len()).rev() {
            off += (rem % spec.shape[d]) as isize * spec.strides[d];
            rem /= spec.shape[d];
        }
        out.push(off as usize);
    }
    out
}

/// Runs the batch, then each sequence of `positions` alone; `Err` names the first bit that
/// differs: an element the lone call wrote that the batch call left different, or an element
/// of a lone sequence's written outputs that differs. `Ok` counts the elements the lone calls
/// wrote (all compared), so that a caller can tell the check was not vacuous.
pub fn alone_vs_batch<O: FuzzOp + 'static>(
    target: &dyn ssm_conformance::Target,
    template: &O::At<'_>,
    batch: Batch<'_>,
    positions: &[usize],
) -> Result<usize, String> {
    alone_vs_batch_with::<O>(target, template, batch, positions, &|_, _| {})
}

/// [`alone_vs_batch`] where a lone call's non-tensor fields differ from the batch's (the layer
/// cores' sequence and token counts): `lone_scalars(args, i)` sets them for sequence `i`.
pub fn alone_vs_batch_with<O: FuzzOp + 'static>(
    target: &dyn ssm_conformance::Target,
    template: &O::At<'_>,
    batch: Batch<'_>,
    positions: &[usize],
    lone_scalars: &dyn for<'s> Fn(&mut O::At<'s>, usize),
) -> Result<usize, String> {
    let specs = O::specs(template);
    let init = Buffers::new(&specs);
    let all = run_specs::<O>(target, template, &specs, &init).map_err(|e| format!("batch refused: {e}"))?;
    let mut written_total = 0usize;
    for &i in positions {
        let lone = alone(&specs, batch, i);
        let got = run_fixed::<O>(target, template, &lone, &Buffers::new(&lone), &|a| lone_scalars(a, i))
            .map_err(|e| format!("sequence {i} alone refused: {e}"))?;
        for (k, s) in lone.iter().enumerate() {
            // Arguments given new memory (offsets, metadata) are inputs; they are not compared.
            if s.memory.len() != specs[k].memory.len() || s.dtype != specs[k].dtype {
                continue;
            }
            let es = s.dtype.size();
            let (a, g, z) = (all.0[k].bytes(), got.0[k].bytes(), init.0[k].bytes());
            let differs = |e: usize| a[e * es..(e + 1) * es] != g[e * es..(e + 1) * es];
            let written = |e: usize| g[e * es..(e + 1) * es] != z[e * es..(e + 1) * es];
            // Unchanged blocks are skipped whole (pools are large and mostly untouched).
            const BLOCK: usize = 4096;
            let bad = (0..s.memory_len().div_ceil(BLOCK))
                .filter(|&blk| {
                    let r = blk * BLOCK * es..((blk + 1) * BLOCK).min(s.memory_len()) * es;
                    g[r.clone()] != z[r]
                })
                .flat_map(|blk| blk * BLOCK..((blk + 1) * BLOCK).min(s.memory_len()))
                .inspect(|&e| written_total += usize::from(written(e)))
                .find(|&e| written(e) && differs(e))
                .or_else(|| {
                    if s.present && s.writable && !batch.pools.contains(&s.name) {
                        reached(s).into_iter().find(|&e| differs(e))
                    } else {
                        None
                    }
                });
            if let Some(e) = bad {
                let v = |m: &[u8]| {
                    if s.dtype.is_float() {
                        elem::read_f64(m, s.dtype, e).to_string()
                    } else {
                        elem::read_i64(m, s.dtype, e).to_string()
                    }
                };
                return Err(format!("sequence {i}: {}[{e}] alone {} vs in the batch {}", s.name, v(g), v(a)));
            }
        }
    }
    Ok(written_total)
}

/// [`alone_vs_batch`] as a test assertion: panics, naming `what`, unless every position is
/// bit-identical and the lone calls wrote more than 1000 elements (the check is not vacuous);
/// prints the count.
///
/// # Panics
/// As described.
pub fn assert_batch_invariant<O: FuzzOp + 'static>(
    target: &dyn ssm_conformance::Target,
    what: &str,
    template: &O::At<'_>,
    batch: Batch<'_>,
    positions: &[usize],
) {
    match alone_vs_batch::<O>(target, template, batch, positions) {
        Ok(written) => {
            assert!(written > 1000, "{what}: the lone calls wrote only {written} elements");
            eprintln!("{what}: {written} elements written alone, bit-identical in the batch");
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Positions of the lone sequences in the decode routes' batches of 256.
pub const POSITIONS: [usize; 6] = [0, 1, 77, 128, 200, 255];

/// The SSU decode and 3-token speculative routes (f32 and bf16 state) on `target`, each over a
/// random batch of 256 from `ssm_conformance::cases::ssu` ([`assert_batch_invariant`]): the
/// one check the CPU and the GPU tests run.
pub fn assert_ssu_routes_batch_invariant(target: &dyn ssm_conformance::Target) {
    use ssm_conformance::cases::ssu::{Case, Spec, Tokens};
    const N: usize = 256;
    let batch = Batch { seqs: N, cu_seqlens: None, pools: &["state"], fixup: None };
    for state in [ssm_tensor::DType::F32, ssm_tensor::DType::BF16] {
        let mut case = Case::build(Spec::mamba2(N, state), 1);
        assert_batch_invariant::<crate::ops::Ssu>(
            target,
            &format!("ssu {state} decode"),
            &case.args(),
            batch,
            &POSITIONS,
        );
        let tokens = Tokens::Dense { seqs: N, steps: 3 };
        let spec = Spec { tokens, spec_width: Some(3), table_2d: true, ..Spec::mamba2(N, state) };
        let mut case = Case::build(spec, 2);
        let what = format!("ssu {state} speculative");
        assert_batch_invariant::<crate::ops::Ssu>(target, &what, &case.args(), batch, &POSITIONS);
    }
}

/// The GDN sigmoid-gated decode and the 3-token speculative recurrence (f32 and bf16 state) on
/// `target`, each over a random packed batch of 256 from `ssm_conformance::gdn_random`.
pub fn assert_gdn_routes_batch_invariant(target: &dyn ssm_conformance::Target) {
    use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec};
    const N: usize = 256;
    let batch = Batch { seqs: N, cu_seqlens: Some("rule.cu_seqlens"), pools: &["rule.initial_state"], fixup: None };
    for state in [ssm_tensor::DType::F32, ssm_tensor::DType::BF16] {
        let mut case = RecurrentCase::random(RecurrentSpec::decode(N, state), 3);
        let what = format!("gdn {state} sigmoid decode");
        assert_batch_invariant::<crate::ops::GdnSigmoid>(target, &what, &case.sigmoid_args(), batch, &POSITIONS);
        let spec = RecurrentSpec { max_len: 3, table: 2, columns: 4, ..RecurrentSpec::decode(N, state) };
        let mut case = RecurrentCase::random(spec, 4);
        let what = format!("gdn {state} speculative");
        assert_batch_invariant::<crate::ops::GdnRecurrent>(target, &what, &case.recurrent_args(), batch, &POSITIONS);
    }
}

/// ReplaySSM's `checkpointing_ssu` on `target`: one token and a dense 4-token step, f32 and bf16
/// checkpoints, each over a random batch of 256 sequences of eight Mamba2-2.7B-like heads from
/// `ssm_conformance::cases::ring_random` (pads and a slot table; the checkpoints, ring caches
/// and cursors are pools). Eight heads put the batch at 2,048 (sequence, head) blocks and a lone
/// sequence at 8, either side of the CUDA backend's geometry line (`CKPT_SPREAD_BLOCKS`).
/// `target` must be configured with `replayssm: true`.
pub fn assert_replayssm_batch_invariant(target: &dyn ssm_conformance::Target) {
    use ssm_conformance::cases::ring_random::{CkptCase, CkptSpec};
    const N: usize = 256;
    const HEADS: usize = 8;
    let pools = &["state", "x_cache", "B_cache", "dt_cache", "ring_start", "prev_num_accepted_tokens"];
    let batch = Batch { seqs: N, cu_seqlens: None, pools, fixup: None };
    for (seed, state) in [ssm_tensor::DType::F32, ssm_tensor::DType::BF16].into_iter().enumerate() {
        for tokens in [1, 4] {
            let mut case =
                CkptCase::random(CkptSpec::mamba2(N, HEADS, tokens, state), 5 + 2 * seed as u64 + tokens as u64);
            let what = format!("replayssm {state} {tokens} token(s)");
            assert_batch_invariant::<crate::ops::Checkpoint>(target, &what, &case.args(), batch, &POSITIONS);
        }
    }
}

/// The chunked prefill routes on `target`: GDN (`chunk_gated_delta_rule`) and SSD, each a packed
/// batch of 256 sequences with pool states through slot tables ([`assert_batch_invariant`]):
/// the one check the CPU and the GPU tests run.
pub fn assert_prefill_routes_batch_invariant(target: &dyn ssm_conformance::Target) {
    assert_gdn_prefill_batch_invariant(target);
    assert_ssd_prefill_batch_invariant(target);
}

fn view<'a>(d: &'a [f32], s: &[usize]) -> ssm_tensor::TensorRef<'a> {
    ssm_tensor::TensorRef::from_slice(d, s).unwrap()
}

fn ri(d: &[i32]) -> ssm_tensor::TensorRef<'_> {
    ssm_tensor::TensorRef::from_slice(d, &[d.len()]).unwrap()
}

fn offsets(lens: &[usize]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lens.iter().scan(0, |acc, &l| {
            *acc += l as i32;
            Some(*acc)
        }))
        .collect()
}

/// A packed prefill of 256 sequences of 1–40 tokens through `chunk_gated_delta_rule`
/// (Qwen3-Next's prefill: pool states read and written in place through a slot table, l2norm).
fn assert_gdn_prefill_batch_invariant(target: &dyn ssm_conformance::Target) {
    use ssm_gdn::ChunkGatedDeltaRuleArgs;
    use ssm_tensor::{TensorMut, TensorRef};
    const N: usize = 256;
    let (hv, k, v) = (2, 16, 16);
    let lens: Vec<usize> = (0..N).map(|i| 1 + i * 37 % 40).collect();
    let t: usize = lens.iter().sum();
    let cu = offsets(&lens);
    let slots = N + 5;
    let idx: Vec<i32> = (0..N as i32).map(|i| (i * 7 + 3) % slots as i32).collect();
    let (q, kk, vv) = (
        crate::cores::values(t * k, 1, 1.0, 0.0),
        crate::cores::values(t * k, 2, 1.0, 0.0),
        crate::cores::values(t * hv * v, 3, 1.0, 0.0),
    );
    let g: Vec<f32> = crate::cores::values(t * hv, 4, 0.1, 0.0).iter().map(|x| x - 0.1).collect();
    let beta: Vec<f32> = crate::cores::values(t * hv, 5, 0.4, 0.0).iter().map(|x| x + 0.5).collect();
    let mut pool = crate::cores::values(slots * hv * v * k, 6, 0.5, 0.0);
    let mut o = vec![f32::NAN; t * hv * v];
    let args = ChunkGatedDeltaRuleArgs {
        initial_state: Some(TensorMut::from_slice(&mut pool, &[slots, hv, v, k]).unwrap()),
        initial_state_indices: Some(TensorRef::from_slice(&idx, &[N]).unwrap()),
        inplace_final_state: true,
        cu_seqlens: Some(TensorRef::from_slice(&cu, &[N + 1]).unwrap()),
        use_qk_l2norm_in_kernel: true,
        ..ChunkGatedDeltaRuleArgs::new(
            view(&q, &[1, t, 1, k]),
            view(&kk, &[1, t, 1, k]),
            view(&vv, &[1, t, hv, v]),
            view(&g, &[1, t, hv]),
            view(&beta, &[1, t, hv]),
            TensorMut::from_slice(&mut o, &[1, t, hv, v]).unwrap(),
        )
    };
    let batch = Batch { seqs: N, cu_seqlens: Some("cu_seqlens"), pools: &["initial_state"], fixup: None };
    assert_batch_invariant::<crate::ops::GdnChunk>(target, "gdn chunked prefill", &args, batch, &POSITIONS);
}

/// A packed SSD prefill of 256 sequences of 1–70 tokens, some resumed mid-chunk (vLLM's chunk
/// metadata, chunk 16), states read from and written to a pool through slot tables.
fn assert_ssd_prefill_batch_invariant(target: &dyn ssm_conformance::Target) {
    use ssm_ssd::{MambaChunkScanCombinedVarlenArgs as Args, compute_chunk_metadata};
    use ssm_tensor::{TensorMut, TensorRef};
    const N: usize = 256;
    let (h, p, n, chunk) = (2, 8, 8, 16);
    let lens: Vec<usize> = (0..N).map(|i| 1 + i * 29 % 70).collect();
    let computed: Vec<i64> = (0..N).map(|i| (i * 13 % 50) as i64).collect();
    let t: usize = lens.iter().sum();
    let cu = offsets(&lens);
    let cu64: Vec<i64> = cu.iter().map(|&v| v as i64).collect();
    let meta = compute_chunk_metadata(&cu64, &computed, chunk);
    let slots = N + 3;
    let idx: Vec<i32> = (0..N as i32).map(|i| (i * 5 + 1) % slots as i32).collect();
    let has: Vec<u8> = computed.iter().map(|&c| u8::from(c > 0)).collect();
    let (x, b, c) = (
        crate::cores::values(t * h * p, 11, 1.0, 0.0),
        crate::cores::values(t * n, 12, 1.0, 0.0),
        crate::cores::values(t * n, 13, 1.0, 0.0),
    );
    let dt = crate::cores::values(t * h, 14, 1.0, 0.0);
    let a = [-0.7f32, -1.3];
    let mut pool = crate::cores::values(slots * h * p * n, 15, 0.5, 0.0);
    let mut out = vec![f32::NAN; t * h * p];
    let args = Args {
        out: Some(TensorMut::from_slice(&mut out, &[t, h, p]).unwrap()),
        ssm_state: Some(TensorMut::from_slice(&mut pool, &[slots, h, p, n]).unwrap()),
        initial_state_indices: Some(ri(&idx)),
        has_initial_state: Some(TensorRef::from_slice(&has, &[N]).unwrap()),
        final_state_indices: Some(ri(&idx)),
        dt_softplus: true,
        ..Args::new(
            view(&x, &[t, h, p]),
            view(&dt, &[t, h]),
            view(&a, &[h]),
            view(&b, &[t, 1, n]),
            view(&c, &[t, 1, n]),
            chunk,
            [ri(&cu), ri(&meta.cu_chunk_seqlens), ri(&meta.last_chunk_indices), ri(&meta.seq_idx)],
        )
    };
    // Alone, a sequence gets its own chunk metadata (the same chunks, re-based).
    let fixup = |lone: &mut [TensorSpec], i: usize| {
        let m = compute_chunk_metadata(&[0, lens[i] as i64], &[computed[i]], chunk);
        let wide = |v: &[i32]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        set_values(lone, "cu_chunk_seqlens", &wide(&m.cu_chunk_seqlens));
        set_values(lone, "seq_idx", &wide(&m.seq_idx));
        set_values(lone, "last_chunk_indices", &wide(&m.last_chunk_indices));
    };
    let batch = Batch { seqs: N, cu_seqlens: Some("cu_seqlens"), pools: &["ssm_state"], fixup: Some(&fixup) };
    assert_batch_invariant::<crate::ops::Ssd>(target, "ssd chunked prefill", &args, batch, &POSITIONS);
}
