//! Batch invariance of the two layer cores ([`crate::invariance`]'s check over
//! `gdn_attention_core` and `mamba2_mixer_core`): a sequence's outputs and states are
//! bit-identical whether the core runs it alone or in a mixed batch.
//!
//! A lone call sees the batch's memory through views narrowed to the sequence's token rows, and
//! gets its own metadata (the tables and counts vLLM would build for a batch of that one
//! sequence), from the same builders as the batch's ([`crate::cores`]).
//!
//! The GDN core routes by the batch's make-up as vLLM's does: when the batch has prefills, its
//! non-speculative decodes run through the chunked prefill with them, so a decode is compared
//! only in a batch without prefills, where it takes the decode route it takes alone.

use ssm_tensor::HostTensor;

use crate::cores::{
    CoreSeq, GdnCoreCase, GdnCounts, MAMBA2_CHUNK, Mamba2CoreCase, first_rows, gdn_tables, mamba2_counts, mamba2_tables,
};
use crate::invariance::{Batch, alone_vs_batch_with};
use crate::spec::TensorSpec;

fn spec_mut<'a>(specs: &'a mut [TensorSpec], name: &str) -> &'a mut TensorSpec {
    specs.iter_mut().find(|s| s.name == name).unwrap_or_else(|| panic!("no argument {name}"))
}

/// Narrows argument `name` to rows `[start, start + len)` of its first axis.
fn narrow_rows(specs: &mut [TensorSpec], name: &str, start: usize, len: usize) {
    let s = spec_mut(specs, name);
    s.offset = (s.offset as isize + start as isize * s.strides[0]) as usize;
    s.shape[0] = len;
}

/// Replaces argument `name` by `table` (contiguous, new memory), or makes it absent.
fn set_table(specs: &mut [TensorSpec], name: &str, table: Option<&HostTensor>) {
    let s = spec_mut(specs, name);
    match table {
        Some(t) => {
            let view = t.view();
            s.present = true;
            s.dtype = view.dtype();
            s.shape = view.shape().to_vec();
            s.strides = view.strides().to_vec();
            s.offset = 0;
            s.memory = t.bytes().to_vec();
        }
        None => {
            s.present = false;
            s.shape.clear();
            s.strides.clear();
            s.offset = 0;
            s.memory.clear();
        }
    }
}

/// Runs the check, panicking unless every position is bit-identical and the lone calls wrote
/// more than 1000 elements; prints the count.
fn assert_core<O: crate::ops::FuzzOp + 'static>(
    target: &dyn ssm_conformance::Target,
    what: &str,
    template: &O::At<'_>,
    batch: Batch<'_>,
    positions: &[usize],
    lone_scalars: &dyn for<'s> Fn(&mut O::At<'s>, usize),
) {
    match alone_vs_batch_with::<O>(target, template, batch, positions, lone_scalars) {
        Ok(written) => {
            assert!(written > 1000, "{what}: the lone calls wrote only {written} elements");
            eprintln!("{what}: {written} elements written alone, bit-identical in the batch");
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// `n` sequences of each kind, interleaved (the kinds in turn, in a rotating order), each on
/// its own slots from 1 (every seventh decode on the pad slot 0): decodes (`with_decodes`),
/// 3-token speculative steps (accepted 1–3; Mamba2's of 1–3 tokens) and prefills of 1–40
/// tokens, resumed or fresh (`with_prefills`). Mamba2's batches put every decode first.
fn mixed_batch(n: usize, with_decodes: bool, with_prefills: bool, mamba2: bool) -> Vec<CoreSeq> {
    let mut next = 1i64;
    let mut slot = || {
        next += 1;
        next - 1
    };
    let mut decodes = Vec::new();
    let mut spec = Vec::new();
    let mut prefills = Vec::new();
    for i in 0..n {
        if with_decodes {
            decodes.push(CoreSeq::Decode { slot: if i % 7 == 3 { 0 } else { slot() } });
        }
        let drafts = if mamba2 { i % 3 } else { 2 };
        spec.push(CoreSeq::Spec { slots: [slot(), slot(), slot()], drafts, accepted: 1 + (i % 3) as i64 });
        if with_prefills {
            let computed = if i % 3 == 0 { 0 } else { (i * 13 % 50 + 1) as i64 };
            prefills.push(CoreSeq::Prefill { len: 1 + i * 37 % 40, slot: slot(), computed });
        }
    }
    if mamba2 {
        return spec.into_iter().chain(prefills).collect();
    }
    let mut kinds = [decodes.into_iter(), spec.into_iter(), prefills.into_iter()];
    let mut seqs = Vec::new();
    for i in 0..n {
        for k in 0..3 {
            seqs.extend(kinds[(i + k) % 3].next());
        }
    }
    seqs
}

/// Sequences of `seqs` to compare: about eight of each kind that `wanted` keeps, spread over
/// the batch.
fn positions(seqs: &[CoreSeq], wanted: impl Fn(&CoreSeq) -> bool) -> Vec<usize> {
    let kind = |s: &CoreSeq| std::mem::discriminant(s);
    let mut at = Vec::new();
    for k in [
        CoreSeq::Decode { slot: 0 },
        CoreSeq::Spec { slots: [0; 3], drafts: 0, accepted: 1 },
        CoreSeq::Prefill { len: 1, slot: 0, computed: 0 },
    ] {
        let of: Vec<usize> = (0..seqs.len()).filter(|&i| kind(&seqs[i]) == kind(&k) && wanted(&seqs[i])).collect();
        at.extend(of.iter().copied().step_by(of.len().div_ceil(8).max(1)));
    }
    at.sort_unstable();
    at
}

/// The GDN core's arguments that a lone call does not narrow (pools and per-layer parameters,
/// and the token rows, which its fixup narrows itself).
const GDN_WHOLE: &[&str] =
    &["mixed_qkv", "b", "a", "conv_weight", "conv_bias", "conv_state", "ssm_state", "A_log", "dt_bias"];
const GDN_TABLES: [&str; 8] = [
    "metadata.has_initial_state",
    "metadata.spec_query_start_loc",
    "metadata.non_spec_query_start_loc",
    "metadata.spec_state_indices_tensor",
    "metadata.non_spec_state_indices_tensor",
    "metadata.spec_token_indx",
    "metadata.non_spec_token_indx",
    "metadata.num_accepted_tokens",
];

/// `gdn_attention_core` on `target` over two batches of 40 sequences of each kind in use:
/// decodes, 3-token speculative steps and prefills, where the speculative steps and the
/// prefills are compared; decodes and speculative steps, where both are compared.
pub fn assert_gdn_core_batch_invariant(target: &dyn ssm_conformance::Target) {
    for (with_prefills, seed) in [(true, 31), (false, 32)] {
        let seqs = mixed_batch(40, true, with_prefills, false);
        let rows = first_rows(&seqs);
        let at = positions(&seqs, |s| !with_prefills || !matches!(s, CoreSeq::Decode { .. }));
        let fixup = |lone: &mut [TensorSpec], i: usize| {
            let n = seqs[i].tokens();
            for name in ["mixed_qkv", "b", "a", "core_attn_out"] {
                narrow_rows(lone, name, rows[i], n);
            }
            let tables = gdn_tables(&seqs[i..=i], &[0]);
            for (name, table) in GDN_TABLES.iter().zip(&tables) {
                set_table(lone, name, table.as_ref());
            }
        };
        let lone_counts = |a: &mut ssm_dispatch::GdnAttentionCoreArgs<'_>, i: usize| {
            GdnCounts::of(&seqs[i..=i]).apply(&mut a.metadata);
        };
        let mut case = GdnCoreCase::batch(&seqs, seed);
        let args = case.args();
        assert_ne!(args.mixed_qkv.shape()[0], seqs.len(), "token rows must not look like sequence rows");
        let batch = Batch { seqs: seqs.len(), cu_seqlens: None, pools: GDN_WHOLE, fixup: Some(&fixup) };
        let what = if with_prefills { "gdn core, mixed with prefills" } else { "gdn core, decodes" };
        assert_core::<crate::ops::GdnCore>(target, what, &args, batch, &at, &lone_counts);
    }
}

const MAMBA2_WHOLE: &[&str] =
    &["xbc", "dt", "conv_weight", "conv_bias", "conv_state", "ssm_state", "A", "D", "dt_bias", "conv_out"];
const MAMBA2_TABLES: [&str; 9] = [
    "metadata.query_start_loc_p",
    "metadata.has_initial_states_p",
    "metadata.seq_idx_p",
    "metadata.cu_chunk_seqlen_p",
    "metadata.last_chunk_indices_p",
    "metadata.state_indices_tensor_p",
    "metadata.state_indices_tensor_d",
    "metadata.query_start_loc_d",
    "metadata.num_accepted_tokens",
];

/// `mamba2_mixer_core` on `target` over a batch of 40 speculative decodes of 1–3 tokens and 40
/// prefills (resumed mid-chunk or fresh, chunk 16), both kinds compared.
pub fn assert_mamba2_core_batch_invariant(target: &dyn ssm_conformance::Target) {
    let seqs = mixed_batch(40, false, true, true);
    let rows = first_rows(&seqs);
    let at = positions(&seqs, |_| true);
    let fixup = |lone: &mut [TensorSpec], i: usize| {
        let n = seqs[i].tokens();
        for name in ["xbc", "dt", "out"] {
            narrow_rows(lone, name, rows[i], n);
        }
        let tables = mamba2_tables(&seqs[i..=i], MAMBA2_CHUNK);
        for (name, table) in MAMBA2_TABLES.iter().zip(&tables) {
            set_table(lone, name, table.as_ref());
        }
    };
    let lone_counts = |a: &mut ssm_dispatch::Mamba2MixerCoreArgs<'_>, i: usize| {
        let m = &mut a.metadata;
        let ((p, pt), (d, dt), init) = mamba2_counts(&seqs[i..=i]);
        (m.num_prefills, m.num_prefill_tokens, m.num_decodes, m.num_decode_tokens) = (p, pt, d, dt);
        m.prep_initial_states = init;
    };
    let mut case = Mamba2CoreCase::batch(&seqs, 33);
    let args = case.args();
    assert_ne!(args.xbc.shape()[0], seqs.len(), "token rows must not look like sequence rows");
    let batch = Batch { seqs: seqs.len(), cu_seqlens: None, pools: MAMBA2_WHOLE, fixup: Some(&fixup) };
    assert_core::<crate::ops::Mamba2Core>(target, "mamba2 core", &args, batch, &at, &lone_counts);
}
