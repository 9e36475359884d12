//! The Mamba2 mixer core on a mixed batch (decodes with a pad row, or speculative decodes with
//! a pad row; prefills resumed mid-chunk, fresh, and a pad prefill) equals running its parts
//! with the single ops on materialised inputs (full `A [H, P, N]`, `D`/`dt_bias` `[H, P]`, `dt`
//! expanded over P, copied x/B/C, initial states gathered and final states scattered by hand);
//! untouched slots stay bit-identical, pad rows keep the caller's values, and a refused call
//! writes nothing.
//!
//! Every run draws fresh inputs and prefill lengths (the seed is printed; `SSM_TEST_SEED`
//! replays one).

mod common;
use common::{ints, values};
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{Config, Mamba2AttentionMetadata, Mamba2MixerCoreArgs, Runtime};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, compute_chunk_metadata, compute_chunk_metadata_with_checkpoints};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, HostTensor, TensorRef};

const H: usize = 4;
const P: usize = 8;
const G: usize = 2;
const N: usize = 16;
const CONV_DIM: usize = H * P + 2 * G * N;
const WIDTH: usize = 4;
const STATE_LEN: usize = WIDTH - 1 + 2;
const SLOTS: usize = 16;
const CHUNK: usize = 16;
const SENTINEL: f32 = 7.0;

fn t(shape: &[usize], seed: u64, scale: f32, offset: f32) -> HostTensor {
    let v: Vec<f32> = values(shape.iter().product(), seed, scale).into_iter().map(|x| x + offset).collect();
    HostTensor::from_f32(DType::F32, shape.to_vec(), &v)
}

fn f32s(x: &HostTensor) -> Vec<f32> {
    x.to_f64_vec().into_iter().map(|v| v as f32).collect()
}

/// Columns `[c0, c0 + w)` of rows `[r0, r0 + n)` of a `[rows, cols]` f32 tensor, as `[n, w]`.
fn block(x: &HostTensor, r0: usize, n: usize, c0: usize, w: usize) -> Vec<f32> {
    let cols = x.shape[1];
    let v = f32s(x);
    (r0..r0 + n).flat_map(|r| v[r * cols + c0..r * cols + c0 + w].to_vec()).collect()
}

struct Batch {
    xbc: HostTensor,
    dt: HostTensor,
    weight: HostTensor,
    bias: HostTensor,
    a: HostTensor,
    d: HostTensor,
    dt_bias: HostTensor,
    conv: HostTensor,
    ssm: HostTensor,
}

fn base_seed() -> u64 {
    match std::env::var("SSM_TEST_SEED") {
        Ok(s) => s.parse().expect("SSM_TEST_SEED must be an integer"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
    }
}

fn batch(tokens: usize, seed: u64) -> Batch {
    let s = seed.wrapping_mul(16);
    Batch {
        xbc: t(&[tokens, CONV_DIM], s + 1, 1.0, 0.0),
        dt: t(&[tokens, H], s + 2, 1.0, -0.5),
        weight: t(&[CONV_DIM, WIDTH], s + 3, 0.5, 0.0),
        bias: t(&[CONV_DIM], s + 4, 0.1, 0.0),
        a: t(&[H], s + 5, 0.5, -1.0),
        d: t(&[H], s + 6, 1.0, 0.0),
        dt_bias: t(&[H], s + 7, 0.5, 0.0),
        conv: t(&[SLOTS, STATE_LEN, CONV_DIM], s + 8, 1.0, 0.0),
        ssm: t(&[SLOTS, H, P, N], s + 9, 0.5, 0.0),
    }
}

/// The decode side of a batch.
struct Decodes {
    /// `[n]` or `[n, 3]` slot table.
    table: HostTensor,
    /// Speculative: token starts and accepted counts.
    spec: Option<(Vec<i64>, Vec<i64>)>,
    tokens: usize,
}

/// The prefill side: lengths, slots, computed tokens before this step (0 = no initial state).
struct Prefills {
    lens: Vec<usize>,
    slots: Vec<i64>,
    computed: Vec<i64>,
}

impl Prefills {
    fn starts(&self) -> Vec<i64> {
        let mut s = vec![0i64];
        for l in &self.lens {
            s.push(s.last().unwrap() + *l as i64);
        }
        s
    }
}

fn decodes(speculative: bool) -> Decodes {
    if speculative {
        // Three sequences, the last a pad row (null block 0, one token, accepted 1).
        Decodes {
            table: HostTensor::from_i64(DType::I32, vec![3, 3], &[1, 2, 3, 4, 5, 6, 0, 0, 0]),
            spec: Some((vec![0, 3, 6, 7], vec![1, 2, 1])),
            tokens: 7,
        }
    } else {
        Decodes { table: ints(&[3, 0, 5]), spec: None, tokens: 3 }
    }
}

/// A short prefill resumed or fresh, a long one resumed mid-chunk (first chunk short, several
/// chunks), and a pad prefill of 3 tokens; lengths and resume points drawn from `seed`.
fn prefills(seed: u64) -> Prefills {
    let r = values(4, seed ^ 0x5eed, 1.0).into_iter().map(|x| ((x + 1.0) * 1000.0) as usize).collect::<Vec<_>>();
    Prefills {
        lens: vec![1 + r[0] % 9, 17 + r[1] % 50, 3],
        slots: vec![7, 8, 0],
        computed: vec![(r[2] % 3 * 13) as i64, (1 + r[3] % 40) as i64, 0],
    }
}

fn touched(dec: &Decodes, pre: &Prefills) -> Vec<usize> {
    let mut v: Vec<usize> =
        f32s(&dec.table).into_iter().map(|x| x as usize).chain(pre.slots.iter().map(|&s| s as usize)).collect();
    v.retain(|&s| s != 0);
    v
}

/// The metadata of `dec` and prefills of `tp` tokens starting at `starts` in slots `slots_p`,
/// without initial states, chunk tables or speculative tensors (callers add those).
fn plain_metadata<'a>(
    dec: &'a Decodes,
    tp: usize,
    starts: &'a HostTensor,
    slots_p: &'a HostTensor,
) -> Mamba2AttentionMetadata<'a> {
    Mamba2AttentionMetadata {
        num_prefills: slots_p.shape[0],
        num_prefill_tokens: tp,
        num_decodes: dec.table.shape[0],
        num_decode_tokens: dec.tokens,
        query_start_loc_p: Some(starts.view()),
        has_initial_states_p: None,
        prep_initial_states: false,
        chunk_size: CHUNK,
        seq_idx_p: None,
        cu_chunk_seqlen_p: None,
        last_chunk_indices_p: None,
        state_indices_tensor_p: Some(slots_p.view()),
        state_indices_tensor_d: Some(dec.table.view()),
        query_start_loc_d: None,
        num_accepted_tokens: None,
        checkpoint_offsets_p: None,
        checkpoint_state_indices_p: None,
        checkpoint_chunk_indices_p: None,
    }
}

/// The core call on `b` with pools and output `(conv, ssm, out)` (no `conv_out` buffer).
fn core_args<'a>(
    b: &'a Batch,
    (conv, ssm, out): (&'a mut HostTensor, &'a mut HostTensor, &'a mut HostTensor),
    num_groups: usize,
    metadata: Mamba2AttentionMetadata<'a>,
) -> Mamba2MixerCoreArgs<'a> {
    Mamba2MixerCoreArgs {
        xbc: b.xbc.view(),
        dt: b.dt.view(),
        conv_weight: b.weight.view(),
        conv_bias: Some(b.bias.view()),
        activation: Activation::Silu,
        conv_state: conv.view_mut(),
        conv_state_layout: ConvStateLayout::StateLenDim,
        ssm_state: ssm.view_mut(),
        a: b.a.view(),
        d: Some(b.d.view()),
        dt_bias: Some(b.dt_bias.view()),
        num_groups,
        pad_slot_id: Some(0),
        metadata,
        conv_out: None,
        out: out.view_mut(),
    }
}

/// The host index tensors of a batch's metadata, in the order [`metadata`] reads them:
/// `[query_start_loc_p, has_initial_states_p, seq_idx_p, cu_chunk_seqlen_p,
/// last_chunk_indices_p, state_indices_tensor_p, state_indices_tensor_d, query_start_loc_d,
/// num_accepted_tokens, checkpoint_offsets_p, checkpoint_state_indices_p,
/// checkpoint_chunk_indices_p]` (`query_start_loc_d` and `num_accepted_tokens` only for
/// speculative decodes, the checkpoint tables only in [`tables_with`]).
fn tables(dec: &Decodes, pre: &Prefills) -> [Option<HostTensor>; 12] {
    tables_with(dec, pre, None)
}

/// [`tables`] with a prefix-caching checkpoint of prefill `k` at `offset` into slot `slot`
/// (`Some((k, offset, slot))`; the other prefills none): the chunk metadata then ends a chunk
/// there, as vLLM's builder does.
fn tables_with(dec: &Decodes, pre: &Prefills, checkpoint: Option<(usize, i64, i64)>) -> [Option<HostTensor>; 12] {
    let starts = pre.starts();
    let np = pre.lens.len();
    let (mut offsets, mut ck_slots) = (vec![0i64; np], vec![0i64; np]);
    if let Some((k, offset, slot)) = checkpoint {
        (offsets[k], ck_slots[k]) = (offset, slot);
    }
    let meta = compute_chunk_metadata_with_checkpoints(&starts, &pre.computed, CHUNK, &offsets);
    let has_init = HostTensor::from_bytes(
        DType::Bool,
        vec![np],
        &pre.computed.iter().map(|&c| u8::from(c > 0)).collect::<Vec<_>>(),
    );
    let [seq_idx, cu_chunk, last, ck_chunks] =
        [&meta.seq_idx, &meta.cu_chunk_seqlens, &meta.last_chunk_indices, &meta.checkpoint_chunk_indices]
            .map(|v| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>()));
    let (qsl_d, accepted) = match &dec.spec {
        Some((q, a)) => (Some(ints(q)), Some(ints(a))),
        None => (None, None),
    };
    let ck = checkpoint.is_some();
    [
        Some(ints(&starts)),
        Some(has_init),
        Some(seq_idx),
        Some(cu_chunk),
        Some(last),
        Some(ints(&pre.slots)),
        Some(dec.table.clone()),
        qsl_d,
        accepted,
        ck.then(|| ints(&offsets)),
        ck.then(|| ints(&ck_slots)),
        ck.then_some(ck_chunks),
    ]
}

/// The metadata of the whole batch over views `v` of [`tables`] (host tensors or device copies).
fn metadata<'a>(dec: &Decodes, pre: &Prefills, v: [Option<TensorRef<'a>>; 12]) -> Mamba2AttentionMetadata<'a> {
    let [qsl_p, has_init, seq_idx, cu_chunk, last, slots_p, table_d, qsl_d, accepted, ck_off, ck_slots, ck_chunks] = v;
    Mamba2AttentionMetadata {
        num_prefills: pre.lens.len(),
        num_prefill_tokens: pre.lens.iter().sum(),
        num_decodes: dec.table.shape[0],
        num_decode_tokens: dec.tokens,
        query_start_loc_p: qsl_p,
        has_initial_states_p: has_init,
        prep_initial_states: pre.computed.iter().any(|&c| c > 0),
        chunk_size: CHUNK,
        seq_idx_p: seq_idx,
        cu_chunk_seqlen_p: cu_chunk,
        last_chunk_indices_p: last,
        state_indices_tensor_p: slots_p,
        state_indices_tensor_d: table_d,
        query_start_loc_d: qsl_d,
        num_accepted_tokens: accepted,
        checkpoint_offsets_p: ck_off,
        checkpoint_state_indices_p: ck_slots,
        checkpoint_chunk_indices_p: ck_chunks,
    }
}

/// The core over the whole batch, on the host.
fn run_core(
    rt: &Runtime,
    b: &Batch,
    dec: &Decodes,
    pre: &Prefills,
    conv_out: bool,
) -> (HostTensor, HostTensor, HostTensor) {
    run_core_over(rt, b, (dec, pre), conv_out, tables(dec, pre))
}

/// [`run_core`] over the host index tensors `tables` ([`tables`] or [`tables_with`]).
fn run_core_over(
    rt: &Runtime,
    b: &Batch,
    (dec, pre): (&Decodes, &Prefills),
    conv_out: bool,
    tables: [Option<HostTensor>; 12],
) -> (HostTensor, HostTensor, HostTensor) {
    let tokens = dec.tokens + pre.lens.iter().sum::<usize>();
    let mut conv = b.conv.clone();
    let mut ssm = b.ssm.clone();
    let mut out = HostTensor::filled(DType::F32, vec![tokens, H, P], SENTINEL);
    let mut scratch = HostTensor::filled(DType::F32, vec![tokens, CONV_DIM], f32::NAN);
    let metadata = metadata(dec, pre, tables.each_ref().map(|t| t.as_ref().map(HostTensor::view)));
    let mut args = core_args(b, (&mut conv, &mut ssm, &mut out), G, metadata);
    args.conv_out = conv_out.then(|| scratch.view_mut());
    rt.mamba2_mixer_core(args).unwrap();
    (conv, ssm, out)
}

/// The same batch, one op at a time on materialised inputs.
fn run_parts(rt: &Runtime, b: &Batch, dec: &Decodes, pre: &Prefills) -> (HostTensor, HostTensor, HostTensor) {
    let (td, tp) = (dec.tokens, pre.lens.iter().sum::<usize>());
    let mut conv = b.conv.clone();
    let mut ssm = b.ssm.clone();
    let mut want = f32s(&HostTensor::filled(DType::F32, vec![td + tp, H, P], SENTINEL));
    let dt_all = f32s(&b.dt);
    let expand_dt = |r0: usize, n: usize| -> HostTensor {
        let v: Vec<f32> = (r0..r0 + n)
            .flat_map(|r| (0..H).flat_map(move |h| (0..P).map(move |_| (r, h))))
            .map(|(r, h)| dt_all[r * H + h])
            .collect();
        HostTensor::from_f32(DType::F32, vec![n, H, P], &v)
    };
    let av = f32s(&b.a);
    let a_full =
        HostTensor::from_f32(DType::F32, vec![H, P, N], &(0..H * P * N).map(|i| av[i / (P * N)]).collect::<Vec<_>>());
    let per_hp = |x: &HostTensor| {
        let v = f32s(x);
        HostTensor::from_f32(DType::F32, vec![H, P], &(0..H * P).map(|i| v[i / P]).collect::<Vec<_>>())
    };
    let (d_full, dtb_full) = (per_hp(&b.d), per_hp(&b.dt_bias));

    // Decodes: conv update, then the SSU on copies of x, B, C.
    let x_d = HostTensor::from_f32(DType::F32, vec![td, CONV_DIM], &block(&b.xbc, 0, td, 0, CONV_DIM));
    let mut y_d = HostTensor::filled(DType::F32, vec![td, CONV_DIM], 0.0);
    let (qsl_d, accepted) = match &dec.spec {
        Some((q, a)) => (Some(ints(q)), Some(ints(a))),
        None => (None, None),
    };
    rt.causal_conv1d_update(CausalConv1dUpdateArgs {
        x: x_d.view(),
        conv_state: conv.view_mut(),
        conv_state_layout: ConvStateLayout::StateLenDim,
        weight: b.weight.view(),
        bias: Some(b.bias.view()),
        activation: Activation::Silu,
        conv_state_indices: Some(dec.table.view()),
        num_accepted_tokens: accepted.as_ref().map(HostTensor::view),
        query_start_loc: qsl_d.as_ref().map(HostTensor::view),
        pad_slot_id: Some(0),
        block_idx_last_scheduled_token: None,
        initial_state_idx: None,
        out: y_d.view_mut(),
    })
    .unwrap();
    let mut o_d = HostTensor::filled(DType::F32, vec![td, H, P], SENTINEL);
    let (xs, bs, cs) = (
        HostTensor::from_f32(DType::F32, vec![td, H, P], &block(&y_d, 0, td, 0, H * P)),
        HostTensor::from_f32(DType::F32, vec![td, G, N], &block(&y_d, 0, td, H * P, G * N)),
        HostTensor::from_f32(DType::F32, vec![td, G, N], &block(&y_d, 0, td, H * P + G * N, G * N)),
    );
    let dt_d = expand_dt(0, td);
    rt.selective_state_update(SelectiveStateUpdateArgs {
        d: Some(d_full.view()),
        dt_bias: Some(dtb_full.view()),
        dt_softplus: true,
        state_batch_indices: Some(dec.table.view()),
        pad_slot_id: Some(0),
        num_accepted_tokens: accepted.as_ref().map(HostTensor::view),
        cu_seqlens: qsl_d.as_ref().map(HostTensor::view),
        ..SelectiveStateUpdateArgs::new(
            ssm.view_mut(),
            xs.view(),
            dt_d.view(),
            a_full.view(),
            bs.view(),
            cs.view(),
            o_d.view_mut(),
        )
    })
    .unwrap();
    // The core keeps the caller's rows of pad decodes (column-0 slot = the pad).
    let (table, cols) = (f32s(&dec.table), if dec.spec.is_some() { 3 } else { 1 });
    let dstarts: Vec<usize> = match &dec.spec {
        Some((q, _)) => q.iter().map(|&x| x as usize).collect(),
        None => (0..=td).collect(),
    };
    let o_d = f32s(&o_d);
    for i in 0..dstarts.len() - 1 {
        if table[i * cols] != 0.0 {
            let (r0, r1) = (dstarts[i] * H * P, dstarts[i + 1] * H * P);
            want[r0..r1].copy_from_slice(&o_d[r0..r1]);
        }
    }

    // Prefills: conv fn, then the SSD with initial states gathered and final states scattered here.
    let np = pre.lens.len();
    let starts = pre.starts();
    let x_p = HostTensor::from_f32(DType::F32, vec![tp, CONV_DIM], &block(&b.xbc, td, tp, 0, CONV_DIM));
    let mut y_p = HostTensor::filled(DType::F32, vec![tp, CONV_DIM], 0.0);
    let has_init = HostTensor::from_bytes(
        DType::Bool,
        vec![np],
        &pre.computed.iter().map(|&c| u8::from(c > 0)).collect::<Vec<_>>(),
    );
    rt.causal_conv1d_fn(CausalConv1dFnArgs {
        x: x_p.view(),
        weight: b.weight.view(),
        bias: Some(b.bias.view()),
        conv_states: conv.view_mut(),
        conv_state_layout: ConvStateLayout::StateLenDim,
        query_start_loc: ints(&starts).view(),
        cache_indices: Some(ints(&pre.slots).view()),
        has_initial_state: Some(has_init.view()),
        activation: Activation::Silu,
        pad_slot_id: Some(0),
        checkpoint_offsets: None,
        checkpoint_state_indices: None,
        out: y_p.view_mut(),
    })
    .unwrap();
    let slot_elems = H * P * N;
    let pool = f32s(&ssm);
    let init: Vec<f32> = (0..np)
        .flat_map(|i| {
            let s = pre.slots[i] as usize;
            if pre.computed[i] > 0 && s != 0 {
                pool[s * slot_elems..(s + 1) * slot_elems].to_vec()
            } else {
                vec![0.0; slot_elems]
            }
        })
        .collect();
    let init = HostTensor::from_f32(DType::F32, vec![np, H, P, N], &init);
    let meta = compute_chunk_metadata(&starts, &pre.computed, CHUNK);
    let mut o_p = HostTensor::filled(DType::F32, vec![tp, H, P], 0.0);
    let mut finals = HostTensor::filled(DType::F32, vec![np, H, P, N], 0.0);
    let (xs, bs, cs) = (
        HostTensor::from_f32(DType::F32, vec![tp, H, P], &block(&y_p, 0, tp, 0, H * P)),
        HostTensor::from_f32(DType::F32, vec![tp, G, N], &block(&y_p, 0, tp, H * P, G * N)),
        HostTensor::from_f32(DType::F32, vec![tp, G, N], &block(&y_p, 0, tp, H * P + G * N, G * N)),
    );
    let dt_p = HostTensor::from_f32(DType::F32, vec![tp, H], &dt_all[td * H..(td + tp) * H]);
    let i32s = |v: &[i32]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
    let (seq_idx, cu_chunk, last) = (i32s(&meta.seq_idx), i32s(&meta.cu_chunk_seqlens), i32s(&meta.last_chunk_indices));
    let cu = ints(&starts);
    let tables = [cu.view(), cu_chunk.view(), last.view(), seq_idx.view()];
    rt.mamba_chunk_scan_combined_varlen(MambaChunkScanCombinedVarlenArgs {
        out: Some(o_p.view_mut()),
        d: Some(b.d.view()),
        dt_bias: Some(b.dt_bias.view()),
        initial_states: Some(init.view()),
        dt_softplus: true,
        state_dtype: Some(DType::F32),
        varlen_states: Some(finals.view_mut()),
        ..MambaChunkScanCombinedVarlenArgs::new(xs.view(), dt_p.view(), b.a.view(), bs.view(), cs.view(), CHUNK, tables)
    })
    .unwrap();
    let (o_p, finals) = (f32s(&o_p), f32s(&finals));
    let mut pool = pool;
    for i in 0..np {
        let s = pre.slots[i] as usize;
        if s == 0 {
            continue; // a pad prefill: its out rows keep the sentinel, its slot is not written
        }
        pool[s * slot_elems..(s + 1) * slot_elems].copy_from_slice(&finals[i * slot_elems..(i + 1) * slot_elems]);
        let (r0, r1) = (starts[i] as usize, starts[i + 1] as usize);
        want[(td + r0) * H * P..(td + r1) * H * P].copy_from_slice(&o_p[r0 * H * P..r1 * H * P]);
    }
    let ssm = HostTensor::from_f32(DType::F32, vec![SLOTS, H, P, N], &pool);
    (conv, ssm, HostTensor::from_f32(DType::F32, vec![td + tp, H, P], &want))
}

fn close(what: &str, got: &HostTensor, want: &HostTensor, tol: f64) {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(g.len(), w.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}[{i}]: {a} vs {b}");
    }
}

#[test]
fn mamba2_core_on_a_mixed_batch_equals_its_parts() {
    let seed = base_seed();
    eprintln!("SSM_TEST_SEED={seed}");
    for (speculative, fresh) in [(false, false), (true, false), (false, true)] {
        for threads in [Some(1), Some(2)] {
            let rt = Runtime::new(&Config::cpu(threads)).unwrap();
            let (dec, mut pre) = (decodes(speculative), prefills(seed));
            if fresh {
                // No prefill has an initial state: the core passes `initial_states = None`.
                pre.computed = vec![0; 3];
            }
            let b = batch(dec.tokens + pre.lens.iter().sum::<usize>(), seed);
            let what = format!(
                "seed={seed} speculative={speculative} threads={threads:?} lens={:?} computed={:?}",
                pre.lens, pre.computed
            );
            let (conv, ssm, out) = run_core(&rt, &b, &dec, &pre, false);
            let (conv_w, ssm_w, out_w) = run_parts(&rt, &b, &dec, &pre);
            close(&format!("{what} out"), &out, &out_w, 1e-5);
            close(&format!("{what} ssm_state"), &ssm, &ssm_w, 1e-5);
            assert_eq!(conv.bytes(), conv_w.bytes(), "{what} conv_state");
            // Untouched slots bit-identical; pad rows keep the sentinel.
            let touched = touched(&dec, &pre);
            let (sb, cb) = (H * P * N * 4, STATE_LEN * CONV_DIM * 4);
            for s in (0..SLOTS).filter(|s| !touched.contains(s)) {
                assert_eq!(
                    ssm.bytes()[s * sb..(s + 1) * sb],
                    b.ssm.bytes()[s * sb..(s + 1) * sb],
                    "{what} ssm slot {s}"
                );
                assert_eq!(
                    conv.bytes()[s * cb..(s + 1) * cb],
                    b.conv.bytes()[s * cb..(s + 1) * cb],
                    "{what} conv slot {s}"
                );
            }
            let o = f32s(&out);
            // The pad decode (row 1, or the speculative pad's one token at row 6) and the pad
            // prefill (its 3 tokens last).
            let pad_decode = if speculative { 6 } else { 1 };
            let tp = pre.lens.iter().sum::<usize>();
            let pad_rows: Vec<usize> =
                std::iter::once(pad_decode).chain(dec.tokens + tp - 3..dec.tokens + tp).collect();
            for r in pad_rows {
                assert!(o[r * H * P..(r + 1) * H * P].iter().all(|&v| v == SENTINEL), "{what} pad row {r} was written");
            }
            // With a caller-owned conv buffer the result is the same.
            let (conv2, ssm2, out2) = run_core(&rt, &b, &dec, &pre, true);
            assert_eq!((conv2.bytes(), ssm2.bytes(), out2.bytes()), (conv.bytes(), ssm.bytes(), out.bytes()), "{what}");
        }
    }
}

/// The core with a prefix-caching checkpoint of `pre`'s prefill `k` at `offset` into slot
/// `ck_slot` (the other prefills none), or without one (`None`); returns the conv and SSM pools.
fn run_core_with_checkpoint(
    rt: &Runtime,
    b: &Batch,
    dec: &Decodes,
    pre: &Prefills,
    checkpoint: Option<(usize, i64, i64)>,
) -> (HostTensor, HostTensor) {
    let (conv, ssm, _) = run_core_over(rt, b, (dec, pre), false, tables_with(dec, pre, checkpoint));
    (conv, ssm)
}

/// vLLM 0.33's mid-prefill checkpoint through the core: the checkpoint slot of both pools holds
/// what the prefill's own slot holds after a call cut at the checkpoint, bit for bit (the conv
/// state's `width − 1` columns; the whole SSM state), and a checkpoint's tables come together.
#[test]
fn mamba2_core_checkpoint_equals_the_prefill_cut_at_it() {
    let seed = base_seed();
    let rt = Runtime::new(&Config::cpu(Some(2))).unwrap();
    let dec = decodes(false);
    let pre = prefills(seed);
    let b = batch(dec.tokens + pre.lens.iter().sum::<usize>(), seed);
    let ck_slot = 12usize;
    assert!(!touched(&dec, &pre).contains(&ck_slot));
    for offset in [1, pre.lens[1] / 2, pre.lens[1] - 1] {
        let what = format!("seed={seed} lens={:?} computed={:?} offset={offset}", pre.lens, pre.computed);
        let (conv, ssm) = run_core_with_checkpoint(&rt, &b, &dec, &pre, Some((1, offset as i64, ck_slot as i64)));
        // The same batch without the pad prefill and with prefill 1 cut at the checkpoint (its
        // tokens keep their rows; the rows after them are not read).
        let cut = Prefills {
            lens: vec![pre.lens[0], offset],
            slots: pre.slots[..2].to_vec(),
            computed: pre.computed[..2].to_vec(),
        };
        let (conv_cut, ssm_cut) = run_core_with_checkpoint(&rt, &b, &dec, &cut, None);
        let sb = H * P * N * 4;
        assert_eq!(ssm.bytes()[ck_slot * sb..(ck_slot + 1) * sb], ssm_cut.bytes()[8 * sb..9 * sb], "{what} ssm");
        let cols = (WIDTH - 1) * CONV_DIM * 4; // StateLenDim: a slot's first columns are contiguous
        let cb = STATE_LEN * CONV_DIM * 4;
        assert_eq!(
            conv.bytes()[ck_slot * cb..ck_slot * cb + cols],
            conv_cut.bytes()[8 * cb..8 * cb + cols],
            "{what} conv"
        );
        // Everything else as without the checkpoint, but for the SSD's extra chunk end (its
        // rounding): the conv pool bit for bit outside the checkpoint slot.
        let (conv0, _) = run_core_with_checkpoint(&rt, &b, &dec, &pre, None);
        for s in (0..SLOTS).filter(|&s| s != ck_slot) {
            assert_eq!(conv.bytes()[s * cb..(s + 1) * cb], conv0.bytes()[s * cb..(s + 1) * cb], "{what} conv slot {s}");
        }
    }
    // A checkpoint's tables come together.
    let (mut conv, mut ssm) = (b.conv.clone(), b.ssm.clone());
    let tp = pre.lens.iter().sum::<usize>();
    let mut out = HostTensor::filled(DType::F32, vec![dec.tokens + tp, H, P], SENTINEL);
    let (qsl, slots_p, offsets) = (ints(&pre.starts()), ints(&pre.slots), ints(&[0, 1, 0]));
    let meta = compute_chunk_metadata(&pre.starts(), &pre.computed, CHUNK);
    let i32s = |v: &[i32]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
    let (seq_idx, cu_chunk, last) = (i32s(&meta.seq_idx), i32s(&meta.cu_chunk_seqlens), i32s(&meta.last_chunk_indices));
    let metadata = Mamba2AttentionMetadata {
        seq_idx_p: Some(seq_idx.view()),
        cu_chunk_seqlen_p: Some(cu_chunk.view()),
        last_chunk_indices_p: Some(last.view()),
        checkpoint_offsets_p: Some(offsets.view()),
        ..plain_metadata(&dec, tp, &qsl, &slots_p)
    };
    let err = rt.mamba2_mixer_core(core_args(&b, (&mut conv, &mut ssm, &mut out), G, metadata)).unwrap_err();
    assert!(err.to_string().contains("checkpoint_offsets_p"), "{err}");
    assert_eq!((conv.bytes(), ssm.bytes()), (b.conv.bytes(), b.ssm.bytes()), "a refused call wrote");
}

#[test]
fn a_refused_call_writes_nothing() {
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    let (dec, mut pre) = (decodes(false), prefills(1));
    pre.lens = vec![5, 40, 3];
    pre.computed = vec![20, 7, 0];
    let b = batch(dec.tokens + 48, 1);
    let (mut conv, mut ssm) = (b.conv.clone(), b.ssm.clone());
    let mut out = HostTensor::filled(DType::F32, vec![dec.tokens + 48, H, P], SENTINEL);
    let starts = ints(&pre.starts());
    let slots_p = ints(&pre.slots);
    // seq_idx one entry short: the SSD plan refuses it, after the decode part would have run.
    let meta = compute_chunk_metadata(&pre.starts(), &pre.computed, CHUNK);
    let seq_idx = ints(&meta.seq_idx[1..].iter().map(|&x| x as i64).collect::<Vec<_>>());
    let cu_chunk = ints(&meta.cu_chunk_seqlens.iter().map(|&x| x as i64).collect::<Vec<_>>());
    let last = ints(&meta.last_chunk_indices.iter().map(|&x| x as i64).collect::<Vec<_>>());
    let mut call = |metadata: Mamba2AttentionMetadata<'_>, groups: usize| {
        rt.mamba2_mixer_core(core_args(&b, (&mut conv, &mut ssm, &mut out), groups, metadata)).unwrap_err().to_string()
    };
    let meta = Mamba2AttentionMetadata {
        seq_idx_p: Some(seq_idx.view()),
        cu_chunk_seqlen_p: Some(cu_chunk.view()),
        last_chunk_indices_p: Some(last.view()),
        ..plain_metadata(&dec, 48, &starts, &slots_p)
    };
    let bad_slots = ints(&[7, 99, 0]);
    let short_qsl = ints(&[0, 5, 45, 47]);
    let messages = [
        call(meta, G),
        call(meta, 3),
        call(Mamba2AttentionMetadata { prep_initial_states: true, ..meta }, G),
        call(Mamba2AttentionMetadata { state_indices_tensor_p: Some(bad_slots.view()), ..meta }, G),
        call(Mamba2AttentionMetadata { query_start_loc_p: Some(short_qsl.view()), ..meta }, G),
        call(Mamba2AttentionMetadata { num_decode_tokens: 5, ..meta }, G),
        call(Mamba2AttentionMetadata { state_indices_tensor_d: None, ..meta }, G),
    ];
    insta::assert_snapshot!("mamba2_core_errors", messages.join("\n"));
    assert_eq!(conv.bytes(), b.conv.bytes());
    assert_eq!(ssm.bytes(), b.ssm.bytes());
    assert!(f32s(&out).iter().all(|&v| v == SENTINEL));
}

#[test]
fn huge_counts_in_the_metadata_are_typed_errors() {
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    let (dec, pre) = (decodes(false), prefills(1));
    let tp = pre.lens.iter().sum::<usize>();
    let b = batch(dec.tokens + tp, 1);
    let (mut conv, mut ssm) = (b.conv.clone(), b.ssm.clone());
    let mut out = HostTensor::filled(DType::F32, vec![dec.tokens + tp, H, P], SENTINEL);
    let starts = ints(&pre.starts());
    let slots_p = ints(&pre.slots);
    let meta = plain_metadata(&dec, tp, &starts, &slots_p);
    let huge = [
        Mamba2AttentionMetadata { num_prefill_tokens: usize::MAX, ..meta },
        Mamba2AttentionMetadata { num_decode_tokens: usize::MAX - 1, ..meta },
        Mamba2AttentionMetadata { num_prefills: 1 << 60, num_prefill_tokens: 1 << 61, ..meta },
    ];
    for (i, metadata) in huge.into_iter().enumerate() {
        let err = rt.mamba2_mixer_core(core_args(&b, (&mut conv, &mut ssm, &mut out), G, metadata)).unwrap_err();
        assert!(matches!(err, ssm_dispatch::Error::Core { .. }), "case {i}: {err}");
    }
    assert_eq!(conv.bytes(), b.conv.bytes());
    assert_eq!(ssm.bytes(), b.ssm.bytes());
    assert!(f32s(&out).iter().all(|&v| v == SENTINEL));
}

/// The core on the GPU (feature `cuda`; skipped without a GPU unless `SSM_REQUIRE_GPU=1`), with
/// every tensor and every metadata index tensor on the device, as vLLM keeps them.
#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use common::gpu::{Dev, cuda};
    use ssm_cuda::{CudaError, DeviceErrors};
    use ssm_dispatch::Error;

    /// The core on `rt`'s device over the batch, with `edit` applied to the host [`tables`]
    /// before they are staged; the pools and `out` (sentinel-filled) come back to the host.
    fn run_core_on_device(
        rt: &Runtime,
        b: &Batch,
        (dec, pre): (&Decodes, &Prefills),
        conv_out: bool,
        edit: impl FnOnce(&mut [Option<HostTensor>; 12]),
    ) -> (HostTensor, HostTensor, HostTensor) {
        let dev = Dev(rt);
        let tokens = dec.tokens + pre.lens.iter().sum::<usize>();
        let out0 = HostTensor::filled(DType::F32, vec![tokens, H, P], SENTINEL);
        let scratch0 = HostTensor::filled(DType::F32, vec![tokens, CONV_DIM], f32::NAN);
        let inputs = [&b.xbc, &b.dt, &b.weight, &b.bias, &b.a, &b.d, &b.dt_bias].map(|t| dev.up(t));
        let mut pools = [&b.conv, &b.ssm, &out0, &scratch0].map(|t| dev.up(t));
        let mut host_tables = tables(dec, pre);
        edit(&mut host_tables);
        let staged = host_tables.each_ref().map(|t| t.as_ref().map(|t| dev.up(t)));
        let m = metadata(dec, pre, staged.each_ref().map(|t| t.as_ref().map(|t| t.view().expect("view"))));
        let v = |i: usize| inputs[i].view().expect("view");
        let [conv, ssm, out, scratch] = &mut pools;
        rt.mamba2_mixer_core(Mamba2MixerCoreArgs {
            xbc: v(0),
            dt: v(1),
            conv_weight: v(2),
            conv_bias: Some(v(3)),
            activation: Activation::Silu,
            conv_state: conv.view_mut().expect("view"),
            conv_state_layout: ConvStateLayout::StateLenDim,
            ssm_state: ssm.view_mut().expect("view"),
            a: v(4),
            d: Some(v(5)),
            dt_bias: Some(v(6)),
            num_groups: G,
            pad_slot_id: Some(0),
            metadata: m,
            conv_out: conv_out.then(|| scratch.view_mut().expect("view")),
            out: out.view_mut().expect("view"),
        })
        .unwrap();
        (dev.down(&pools[0], &b.conv), dev.down(&pools[1], &b.ssm), dev.down(&pools[2], &out0))
    }

    /// `max |got − want| ≤ tol · max(1, max |want|)` over the rows of `[rows, H, P]` tensors not in
    /// `skip`, or over the whole tensors.
    fn close_rows(what: &str, got: &HostTensor, want: &HostTensor, skip: &[usize], tol: f64) {
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        assert_eq!(g.len(), w.len(), "{what}");
        let row = g.len() / got.shape[0];
        let scale = w.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            if !skip.contains(&(i / row)) {
                assert!((a - b).abs() <= tol * scale, "{what}[{i}]: {a} vs {b} (scale {scale})");
            }
        }
    }

    /// Asserts that every slot of both pools outside `touched` is bit-identical to the batch's.
    fn untouched_slots_kept(what: &str, b: &Batch, touched: &[usize], conv: &HostTensor, ssm: &HostTensor) {
        let (sb, cb) = (H * P * N * 4, STATE_LEN * CONV_DIM * 4);
        for s in (0..SLOTS).filter(|s| !touched.contains(s)) {
            assert_eq!(ssm.bytes()[s * sb..(s + 1) * sb], b.ssm.bytes()[s * sb..(s + 1) * sb], "{what}: ssm slot {s}");
            assert_eq!(
                conv.bytes()[s * cb..(s + 1) * cb],
                b.conv.bytes()[s * cb..(s + 1) * cb],
                "{what}: conv slot {s}"
            );
        }
    }

    #[test]
    fn mamba2_core_on_the_gpu_equals_the_core_on_the_host() {
        let Some(gpu) = cuda("mamba2_core_on_the_gpu_equals_the_core_on_the_host") else { return };
        let host = Runtime::new(&Config::cpu(Some(2))).unwrap();
        let seed = base_seed();
        eprintln!("SSM_TEST_SEED={seed}");
        for (speculative, fresh) in [(false, false), (true, false), (false, true)] {
            let (dec, mut pre) = (decodes(speculative), prefills(seed));
            if fresh {
                pre.computed = vec![0; 3];
            }
            let tp = pre.lens.iter().sum::<usize>();
            let b = batch(dec.tokens + tp, seed);
            let (conv_w, ssm_w, out_w) = run_core(&host, &b, &dec, &pre, false);
            // The pad decode and the pad prefill: with device tables their rows hold vLLM's
            // values (the module docs of the core), so they are left out of the comparison.
            let pad_decode = if speculative { 6 } else { 1 };
            let pads: Vec<usize> = std::iter::once(pad_decode).chain(dec.tokens + tp - 3..dec.tokens + tp).collect();
            for conv_out in [false, true] {
                let what = format!(
                    "seed={seed} speculative={speculative} conv_out={conv_out} lens={:?} computed={:?}",
                    pre.lens, pre.computed
                );
                let (conv, ssm, out) = run_core_on_device(&gpu, &b, (&dec, &pre), conv_out, |_| {});
                gpu.check().unwrap_or_else(|e| panic!("{what}: device error word: {e}"));
                // The SSD runs on tensor cores (tf32 for f32 operands): the tolerance of gpu_ssd.
                close_rows(&format!("{what} out"), &out, &out_w, &pads, 4e-3);
                close_rows(&format!("{what} ssm_state"), &ssm, &ssm_w, &[], 4e-3);
                close_rows(&format!("{what} conv_state"), &conv, &conv_w, &[], 1e-5);
                untouched_slots_kept(&what, &b, &touched(&dec, &pre), &conv, &ssm);
            }
        }
    }

    /// A mid-prefill checkpoint through the core with every table on the device: the
    /// checkpoint's slots of both pools, and the rest, as the host core writes them.
    #[test]
    fn mamba2_core_checkpoint_on_the_gpu_equals_the_core_on_the_host() {
        let Some(gpu) = cuda("mamba2_core_checkpoint_on_the_gpu_equals_the_core_on_the_host") else { return };
        let host = Runtime::new(&Config::cpu(Some(2))).unwrap();
        let seed = base_seed();
        let (dec, pre) = (decodes(false), prefills(seed));
        let b = batch(dec.tokens + pre.lens.iter().sum::<usize>(), seed);
        let ck_slot = 12;
        for offset in [1, pre.lens[1] / 2, pre.lens[1] - 1] {
            let ck = Some((1, offset as i64, ck_slot as i64));
            let what = format!("seed={seed} lens={:?} computed={:?} offset={offset}", pre.lens, pre.computed);
            let (conv_w, ssm_w, _) = run_core_over(&host, &b, (&dec, &pre), false, tables_with(&dec, &pre, ck));
            let (conv, ssm, _) =
                run_core_on_device(&gpu, &b, (&dec, &pre), false, |t| *t = tables_with(&dec, &pre, ck));
            gpu.check().unwrap_or_else(|e| panic!("{what}: device error word: {e}"));
            close_rows(&format!("{what} ssm_state"), &ssm, &ssm_w, &[], 4e-3);
            close_rows(&format!("{what} conv_state"), &conv, &conv_w, &[], 1e-5);
            let sb = H * P * N * 4;
            assert_ne!(ssm.bytes()[ck_slot * sb..(ck_slot + 1) * sb], b.ssm.bytes()[ck_slot * sb..(ck_slot + 1) * sb]);
            let mut touched = touched(&dec, &pre);
            touched.push(ck_slot);
            untouched_slots_kept(&what, &b, &touched, &conv, &ssm);
        }
    }

    #[test]
    fn garbage_device_slots_set_the_error_word_and_touch_no_other_slot() {
        let Some(gpu) = cuda("garbage_device_slots_set_the_error_word_and_touch_no_other_slot") else { return };
        let (dec, pre) = (decodes(false), prefills(3));
        let b = batch(dec.tokens + pre.lens.iter().sum::<usize>(), 3);
        // The third decode's slot (5) and the second prefill's (8) become garbage: the kernels
        // skip those sequences, so only slots 3 and 7 are written.
        let (conv, ssm, _) = run_core_on_device(&gpu, &b, (&dec, &pre), false, |t| {
            t[6] = Some(ints(&[3, 0, 1 << 20]));
            t[5] = Some(ints(&[7, -9, 0]));
        });
        match gpu.check() {
            Err(Error::Cuda(CudaError::InvalidIndices(DeviceErrors(w)))) => {
                assert_ne!(w & DeviceErrors::SLOT, 0, "SLOT bit in {w:#x}")
            }
            other => panic!("expected the error word's SLOT bit, got {other:?}"),
        }
        untouched_slots_kept("garbage slots", &b, &[3, 7], &conv, &ssm);
        gpu.check().expect("the error word was cleared by the check before");
    }
}
