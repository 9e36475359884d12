//! Batch invariance on the CPU backend (vLLM#48613): a sequence's output and states are
//! bit-identical alone and at any position of a batch of 256, for decode and speculative
//! decode (SSU, both GDN recurrences) and chunked prefill (SSD, GDN).

use ssm_dispatch::{Config, Runtime};
use ssm_fuzz::cores::values;
use ssm_fuzz::invariance::{
    Batch, POSITIONS, assert_batch_invariant, assert_gdn_routes_batch_invariant, assert_ssu_routes_batch_invariant,
    set_values,
};
use ssm_fuzz::ops;

const N: usize = 256;

fn rt() -> Runtime {
    Runtime::new(&Config::cpu(Some(2))).unwrap()
}

#[test]
fn ssu_decode_and_speculative_are_batch_invariant() {
    assert_ssu_routes_batch_invariant(&rt());
}

#[test]
fn gdn_decode_and_speculative_are_batch_invariant() {
    assert_gdn_routes_batch_invariant(&rt());
}

fn r<'a>(d: &'a [f32], s: &[usize]) -> ssm_tensor::TensorRef<'a> {
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
#[test]
fn gdn_chunked_prefill_is_batch_invariant() {
    use ssm_gdn::ChunkGatedDeltaRuleArgs;
    use ssm_tensor::{TensorMut, TensorRef};
    let rt = rt();
    let (hv, k, v) = (2, 16, 16);
    let lens: Vec<usize> = (0..N).map(|i| 1 + i * 37 % 40).collect();
    let t: usize = lens.iter().sum();
    let cu = offsets(&lens);
    let slots = N + 5;
    let idx: Vec<i32> = (0..N as i32).map(|i| (i * 7 + 3) % slots as i32).collect();
    let (q, kk, vv) = (values(t * k, 1, 1.0, 0.0), values(t * k, 2, 1.0, 0.0), values(t * hv * v, 3, 1.0, 0.0));
    let g: Vec<f32> = values(t * hv, 4, 0.1, 0.0).iter().map(|x| x - 0.1).collect();
    let beta: Vec<f32> = values(t * hv, 5, 0.4, 0.0).iter().map(|x| x + 0.5).collect();
    let mut pool = values(slots * hv * v * k, 6, 0.5, 0.0);
    let mut o = vec![f32::NAN; t * hv * v];
    let args = ChunkGatedDeltaRuleArgs {
        initial_state: Some(TensorMut::from_slice(&mut pool, &[slots, hv, v, k]).unwrap()),
        initial_state_indices: Some(TensorRef::from_slice(&idx, &[N]).unwrap()),
        inplace_final_state: true,
        cu_seqlens: Some(TensorRef::from_slice(&cu, &[N + 1]).unwrap()),
        use_qk_l2norm_in_kernel: true,
        ..ChunkGatedDeltaRuleArgs::new(
            r(&q, &[1, t, 1, k]),
            r(&kk, &[1, t, 1, k]),
            r(&vv, &[1, t, hv, v]),
            r(&g, &[1, t, hv]),
            r(&beta, &[1, t, hv]),
            TensorMut::from_slice(&mut o, &[1, t, hv, v]).unwrap(),
        )
    };
    let batch = Batch { seqs: N, cu_seqlens: Some("cu_seqlens"), pools: &["initial_state"], fixup: None };
    assert_batch_invariant::<ops::GdnChunk>(&rt, "gdn chunked prefill", &args, batch, &POSITIONS);
}

/// A packed SSD prefill of 256 sequences of 1–70 tokens, some resumed mid-chunk (vLLM's chunk
/// metadata, chunk 16), states read from and written to a pool through slot tables.
#[test]
fn ssd_chunked_prefill_is_batch_invariant() {
    use ssm_ssd::{MambaChunkScanCombinedVarlenArgs as Args, compute_chunk_metadata};
    use ssm_tensor::{TensorMut, TensorRef};
    let rt = rt();
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
    let (x, b, c) = (values(t * h * p, 11, 1.0, 0.0), values(t * n, 12, 1.0, 0.0), values(t * n, 13, 1.0, 0.0));
    let dt = values(t * h, 14, 1.0, 0.0);
    let a = [-0.7f32, -1.3];
    let mut pool = values(slots * h * p * n, 15, 0.5, 0.0);
    let mut out = vec![f32::NAN; t * h * p];
    let args = Args {
        out: Some(TensorMut::from_slice(&mut out, &[t, h, p]).unwrap()),
        ssm_state: Some(TensorMut::from_slice(&mut pool, &[slots, h, p, n]).unwrap()),
        initial_state_indices: Some(ri(&idx)),
        has_initial_state: Some(TensorRef::from_slice(&has, &[N]).unwrap()),
        final_state_indices: Some(ri(&idx)),
        dt_softplus: true,
        ..Args::new(
            r(&x, &[t, h, p]),
            r(&dt, &[t, h]),
            r(&a, &[h]),
            r(&b, &[t, 1, n]),
            r(&c, &[t, 1, n]),
            chunk,
            [ri(&cu), ri(&meta.cu_chunk_seqlens), ri(&meta.last_chunk_indices), ri(&meta.seq_idx)],
        )
    };
    // Alone, a sequence gets its own chunk metadata (the same chunks, re-based).
    let fixup = |lone: &mut [ssm_fuzz::spec::TensorSpec], i: usize| {
        let m = compute_chunk_metadata(&[0, lens[i] as i64], &[computed[i]], chunk);
        let wide = |v: &[i32]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        set_values(lone, "cu_chunk_seqlens", &wide(&m.cu_chunk_seqlens));
        set_values(lone, "seq_idx", &wide(&m.seq_idx));
        set_values(lone, "last_chunk_indices", &wide(&m.last_chunk_indices));
    };
    let batch = Batch { seqs: N, cu_seqlens: Some("cu_seqlens"), pools: &["ssm_state"], fixup: Some(&fixup) };
    assert_batch_invariant::<ops::Ssd>(&rt, "ssd chunked prefill", &args, batch, &POSITIONS);
}
