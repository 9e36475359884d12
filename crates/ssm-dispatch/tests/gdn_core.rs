//! The GDN attention core on a mixed batch (speculative sequences, decodes with a padded row,
//! prefills with and without initial state, tokens interleaved) equals running its parts
//! separately with the single ops; untouched slots stay bit-identical and padded rows keep the
//! caller's values.

mod common;
use common::ints;
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{Config, GdnAttentionMetadata, Runtime};
use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs,
    StateLayout,
};
use ssm_tensor::{DType, HostTensor};

use common::gdn_batch::*;

#[test]
fn gdn_core_on_a_mixed_batch_equals_its_parts() {
    for layout in [StateLayout::VK, StateLayout::KV] {
        for threads in [Some(1), Some(2)] {
            let rt = Runtime::new(&Config::cpu(threads)).unwrap();
            let base = batch(layout);
            let tokens = base.mixed.shape[0];
            let sentinel = 7.0;

            // The core.
            let mut core =
                (base.conv.clone(), base.ssm.clone(), HostTensor::filled(DType::F32, vec![tokens, HV, V], sentinel));
            let tables = Tables::new(&base, ints(&NON_SPEC_SLOTS));
            rt.gdn_attention_core(core_args(&base, &base.dt_bias, layout, &mut core, tables.metadata(tokens))).unwrap();

            // The parts, one op at a time: speculative, decodes (fused decode), prefills (chunk).
            let (mut conv, mut ssm) = (base.conv.clone(), base.ssm.clone());
            let mut want = HostTensor::filled(DType::F32, vec![tokens, HV, V], sentinel);
            let run_part = |rows_: &[usize],
                            qsl: &HostTensor,
                            conv: &mut HostTensor,
                            ssm: &mut HostTensor,
                            kind: &str|
             -> HostTensor {
                let n = rows_.len();
                let x = rows(&base.mixed, rows_);
                let mut y = HostTensor::filled(DType::F32, vec![n, CONV_DIM], 0.0);
                let col0 = ints(&[1, 4]);
                let dec_slots = ints(&NON_SPEC_SLOTS[..2]);
                let pre_slots = ints(&NON_SPEC_SLOTS[2..]);
                let pre_has = bools(&HAS_INIT[2..]);
                match kind {
                    "prefill" => rt
                        .causal_conv1d_fn(CausalConv1dFnArgs {
                            x: x.view(),
                            weight: base.weight.view(),
                            bias: Some(base.bias.view()),
                            conv_states: conv.view_mut(),
                            conv_state_layout: ConvStateLayout::StateLenDim,
                            query_start_loc: qsl.view(),
                            cache_indices: Some(pre_slots.view()),
                            has_initial_state: Some(pre_has.view()),
                            activation: Activation::Silu,
                            pad_slot_id: Some(0),
                            checkpoint_offsets: None,
                            checkpoint_state_indices: None,
                            out: y.view_mut(),
                        })
                        .unwrap(),
                    _ => rt
                        .causal_conv1d_update(CausalConv1dUpdateArgs {
                            x: x.view(),
                            conv_state: conv.view_mut(),
                            conv_state_layout: ConvStateLayout::StateLenDim,
                            weight: base.weight.view(),
                            bias: Some(base.bias.view()),
                            activation: Activation::Silu,
                            conv_state_indices: Some(if kind == "spec" { col0.view() } else { dec_slots.view() }),
                            num_accepted_tokens: (kind == "spec").then(|| tables.accepted.view()),
                            query_start_loc: (kind == "spec").then(|| qsl.view()),
                            pad_slot_id: Some(0),
                            block_idx_last_scheduled_token: None,
                            initial_state_idx: None,
                            out: y.view_mut(),
                        })
                        .unwrap(),
                }
                let cd = CONV_DIM as isize;
                let q = y.view().with_layout(&[1, n, H, K], &[0, cd, K as isize, 1], 0).unwrap();
                let k = y.view().with_layout(&[1, n, H, K], &[0, cd, K as isize, 1], H * K).unwrap();
                let v = y.view().with_layout(&[1, n, HV, V], &[0, cd, V as isize, 1], 2 * H * K).unwrap();
                let a = rows(&base.a, rows_);
                let b = rows(&base.b, rows_);
                let mut o = HostTensor::filled(DType::F32, vec![1, n, HV, V], f32::NAN);
                if kind == "prefill" {
                    let mut g = HostTensor::filled(DType::F32, vec![1, n, HV], 0.0);
                    let mut beta = HostTensor::filled(DType::F32, vec![1, n, HV], 0.0);
                    rt.fused_gdn_gating(FusedGdnGatingArgs {
                        gates: GateInputs::new(base.a_log.view(), a.view(), b.view(), base.dt_bias.view()),
                        g: g.view_mut(),
                        beta_output: beta.view_mut(),
                    })
                    .unwrap();
                    rt.chunk_gated_delta_rule(ChunkGatedDeltaRuleArgs {
                        q,
                        k,
                        v,
                        g: g.view(),
                        beta: beta.view(),
                        scale: None,
                        initial_state: Some(ssm.view_mut()),
                        initial_state_indices: Some(pre_slots.view()),
                        has_initial_state: Some(pre_has.view()),
                        pad_slot_id: Some(0),
                        inplace_final_state: true,
                        final_state: None,
                        cu_seqlens: Some(qsl.view()),
                        use_qk_l2norm_in_kernel: true,
                        eps: 1e-6,
                        state_layout: layout,
                        o: o.view_mut(),
                        scratch: None,
                    })
                    .unwrap();
                } else {
                    let table = HostTensor::from_i64(DType::I32, vec![2, 3], &SPEC_TABLE);
                    rt.fused_sigmoid_gating_delta_rule_update(FusedSigmoidGatingDeltaRuleUpdateArgs {
                        gates: GateInputs::new(base.a_log.view(), a.view(), b.view(), base.dt_bias.view()),
                        rule: DeltaRuleArgs {
                            q,
                            k,
                            v,
                            scale: None,
                            initial_state: Some(ssm.view_mut()),
                            final_state: None,
                            cu_seqlens: Some(qsl.view()),
                            ssm_state_indices: Some(if kind == "spec" { table.view() } else { dec_slots.view() }),
                            num_accepted_tokens: (kind == "spec").then(|| tables.accepted.view()),
                            use_qk_l2norm_in_kernel: true,
                            eps: 1e-6,
                            state_layout: layout,
                            o: o.view_mut(),
                        },
                    })
                    .unwrap();
                }
                o
            };
            let parts = [
                (&base.spec_rows, ints(&[0, 3, 6]), "spec"),
                (&base.dec_rows, ints(&[0, 1, 2]), "decode"),
                (&base.pre_rows, ints(&[0, 70, 75]), "prefill"),
            ];
            let w = HV * V;
            for (rows_, qsl, kind) in parts {
                let o = run_part(rows_, &qsl, &mut conv, &mut ssm, kind);
                let ov = o.to_f64_vec();
                let mut all = want.to_f64_vec();
                for (i, &r) in rows_.iter().enumerate() {
                    if ov[i * w].is_nan() {
                        continue; // skipped (padded) sequence: the caller's values stay
                    }
                    all[r * w..(r + 1) * w].copy_from_slice(&ov[i * w..(i + 1) * w]);
                }
                want = HostTensor::from_f32(
                    DType::F32,
                    vec![tokens, HV, V],
                    &all.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                );
            }
            let what = format!("{layout:?} threads {threads:?}");
            close(&format!("{what} core_attn_out"), &core.2, &want, 1e-4);
            close(&format!("{what} conv_state"), &core.0, &conv, 1e-6);
            close(&format!("{what} ssm_state"), &core.1, &ssm, 1e-4);
            // The padded decode's rows keep the sentinel; untouched slots are bit-identical.
            let d1 = base.dec_rows[1];
            assert!(
                core.2.to_f64_vec()[d1 * w..(d1 + 1) * w].iter().all(|&x| x == sentinel as f64),
                "{what}: padded row"
            );
            let per_ssm = base.ssm.bytes().len() / SLOTS;
            let per_conv = base.conv.bytes().len() / SLOTS;
            for s in (0..SLOTS).filter(|s| !TOUCHED.contains(s)) {
                assert_eq!(
                    core.1.bytes()[s * per_ssm..(s + 1) * per_ssm],
                    base.ssm.bytes()[s * per_ssm..(s + 1) * per_ssm],
                    "{what}: ssm slot {s}"
                );
                assert_eq!(
                    core.0.bytes()[s * per_conv..(s + 1) * per_conv],
                    base.conv.bytes()[s * per_conv..(s + 1) * per_conv],
                    "{what}: conv slot {s}"
                );
            }
        }
    }
}

/// The core over the test batch with the given metadata changes and `dt_bias`; returns the
/// error text and leaves the pools and the output in `state`.
fn refused(
    rt: &Runtime,
    base: &Batch,
    dt_bias: &HostTensor,
    non_spec_slots: &HostTensor,
    state: &mut (HostTensor, HostTensor, HostTensor),
    edit: impl FnOnce(&mut GdnAttentionMetadata<'_>),
) -> String {
    let tables = Tables::new(base, non_spec_slots.clone());
    let mut metadata = tables.metadata(base.mixed.shape[0]);
    edit(&mut metadata);
    rt.gdn_attention_core(core_args(base, dt_bias, StateLayout::VK, state, metadata)).unwrap_err().to_string()
}

#[test]
fn a_call_refused_by_a_late_op_writes_nothing() {
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    let base = batch(StateLayout::VK);
    let tokens = base.mixed.shape[0];
    let fresh = || (base.conv.clone(), base.ssm.clone(), HostTensor::filled(DType::F32, vec![tokens, HV, V], 7.0));
    let untouched = |state: &(HostTensor, HostTensor, HostTensor), what: &str| {
        assert_eq!(state.0.bytes(), base.conv.bytes(), "{what}: conv_state");
        assert_eq!(state.1.bytes(), base.ssm.bytes(), "{what}: ssm_state");
        assert!(state.2.to_f64_vec().iter().all(|&v| v == 7.0), "{what}: core_attn_out");
    };
    // A prefill slot out of range: the varlen conv (the non-speculative path, after the whole
    // speculative path) refuses it.
    let bad_slots = ints(&[7, 0, 9, 99]);
    let mut state = fresh();
    let err = refused(&rt, &base, &base.dt_bias, &bad_slots, &mut state, |_| {});
    assert!(err.contains("99"), "{err}");
    untouched(&state, "bad prefill slot");
    // A recurrent argument of the wrong shape (`dt_bias` `[HV + 1]`): refused by the
    // speculative recurrence, after its conv update was planned.
    let long_bias = t(&[HV + 1], 7, 0.5);
    let mut state = fresh();
    let err = refused(&rt, &base, &long_bias, &ints(&NON_SPEC_SLOTS), &mut state, |_| {});
    assert!(err.contains("dt_bias"), "{err}");
    untouched(&state, "bad dt_bias");
}

#[test]
fn huge_counts_in_the_metadata_are_typed_errors() {
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    let base = batch(StateLayout::VK);
    let tokens = base.mixed.shape[0];
    let edits: [fn(&mut GdnAttentionMetadata<'_>); 4] = [
        |m| m.num_prefill_tokens = usize::MAX,
        |m| m.num_prefill_tokens = 1 << 60,
        |m| m.num_spec_decode_tokens = 1 << 60,
        |m| {
            m.non_spec_token_indx = None;
            m.num_spec_decodes = 0;
            m.num_decode_tokens = 1 << 61;
        },
    ];
    for (i, edit) in edits.into_iter().enumerate() {
        let mut state = (base.conv.clone(), base.ssm.clone(), HostTensor::filled(DType::F32, vec![tokens, HV, V], 7.0));
        let err = refused(&rt, &base, &base.dt_bias, &ints(&NON_SPEC_SLOTS), &mut state, edit);
        assert!(err.contains("tokens") || err.contains("overflow"), "edit {i}: {err}");
        assert_eq!(state.1.bytes(), base.ssm.bytes(), "edit {i}");
    }
}
