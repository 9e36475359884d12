//! Each fuzzed op: its tensor fields by name, how an args struct is rebuilt over fresh views
//! (scalars copied from a template), its scalar fields, and how the runtime and the reference
//! run it.

use ssm_conformance::{Target, TargetError};
use ssm_tensor::{TensorMut, TensorRef};

use crate::scalar::Scalar;
use crate::spec::{TensorSpec, Views};

/// An op under fuzz. `At<'s>` is its args struct.
pub trait FuzzOp {
    /// The op's name (vLLM's).
    const NAME: &'static str;
    /// The op's args struct.
    type At<'s>;
    /// Every tensor field, in a fixed order.
    fn specs(a: &Self::At<'_>) -> Vec<TensorSpec>;
    /// A new args struct over `v`, with every non-tensor field copied from `template`.
    fn respin<'s, 'x: 's>(template: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s>;
    /// Every non-tensor field.
    fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)>;
    /// Runs the call on a target (a runtime, a staging runtime, a reference); a refusal or
    /// failure as its message.
    fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError>;
}

fn ro(name: &'static str, t: &TensorRef<'_>) -> TensorSpec {
    TensorSpec::of(name, false, false, Some(*t))
}
fn rw(name: &'static str, t: &TensorMut<'_>) -> TensorSpec {
    TensorSpec::of(name, true, false, Some(t.as_ref()))
}
fn opt(name: &'static str, t: &Option<TensorRef<'_>>) -> TensorSpec {
    TensorSpec::of(name, false, true, *t)
}
fn opt_rw(name: &'static str, t: &Option<TensorMut<'_>>) -> TensorSpec {
    TensorSpec::of(name, true, true, t.as_ref().map(TensorMut::as_ref))
}

/// The spec of one tensor field, by kind.
macro_rules! spec {
    (ref, $n:literal, $e:expr) => {
        ro($n, &$e)
    };
    (mut, $n:literal, $e:expr) => {
        rw($n, &$e)
    };
    (opt, $n:literal, $e:expr) => {
        opt($n, &$e)
    };
    (optmut, $n:literal, $e:expr) => {
        opt_rw($n, &$e)
    };
}

/// The view of one tensor field, by kind.
macro_rules! take {
    (ref, $v:ident, $n:literal) => {
        $v.r($n)
    };
    (mut, $v:ident, $n:literal) => {
        $v.m($n)
    };
    (opt, $v:ident, $n:literal) => {
        $v.opt_r($n)
    };
    (optmut, $v:ident, $n:literal) => {
        $v.opt_m($n)
    };
}

/// Declares a fuzzed op from one list of its fields: tensor fields as `kind field "name"`
/// (`ref`, `mut`, `opt`, `optmut`; the name is vLLM's), tensor fields of nested argument
/// structs as `field: crate::Type { … }`, and scalar fields as paths. `specs`, `respin` and
/// `scalars` are all generated from that list, so they cannot disagree.
macro_rules! fuzz_op {
    (
        $(#[$doc:meta])* $op:ident: $krate:ident::$args:ident => $method:ident;
        tensors { $($kind:ident $field:ident $name:literal),* $(,)? }
        nested { $($nf:ident: $nk:ident::$nt:ident { $($nkind:ident $nfield:ident $nname:literal),* $(,)? }),* $(,)? }
        scalars { $($($sf:ident).+),* $(,)? }
    ) => {
        $(#[$doc])*
        pub struct $op;
        impl FuzzOp for $op {
            const NAME: &'static str = stringify!($method);
            type At<'s> = $krate::$args<'s>;
            fn specs(a: &Self::At<'_>) -> Vec<TensorSpec> {
                vec![
                    $(spec!($kind, $name, a.$field),)*
                    $($(spec!($nkind, $nname, a.$nf.$nfield),)*)*
                ]
            }
            // A nested struct of tensors only (the ring trackers) has nothing left to copy.
            #[allow(clippy::needless_update)]
            fn respin<'s, 'x: 's>(t: &'s Self::At<'x>, v: &mut Views<'s>) -> Self::At<'s> {
                $krate::$args {
                    $($field: take!($kind, v, $name),)*
                    $($nf: $nk::$nt { $($nfield: take!($nkind, v, $nname),)* ..t.$nf },)*
                    ..*t
                }
            }
            fn scalars<'t>(a: &'t mut Self::At<'_>) -> Vec<(&'static str, &'t mut dyn Scalar)> {
                vec![$((stringify!($($sf).+), &mut a.$($sf).+ as &mut dyn Scalar)),*]
            }
            fn run(t: &dyn Target, a: Self::At<'_>) -> Result<(), TargetError> {
                t.$method(a)
            }
        }
    };
}

fuzz_op! {
    /// `selective_state_update`.
    Ssu: ssm_ssu::SelectiveStateUpdateArgs => selective_state_update;
    tensors {
        mut state "state", ref x "x", ref dt "dt", ref a "A", ref b "B", ref c "C", opt d "D",
        opt dt_bias "dt_bias", opt z "z", opt state_batch_indices "state_batch_indices",
        opt dst_state_batch_indices "dst_state_batch_indices", mut out "out",
        opt num_accepted_tokens "num_accepted_tokens", opt cu_seqlens "cu_seqlens",
        optmut intermediate_states_buffer "intermediate_states_buffer",
        opt intermediate_state_indices "intermediate_state_indices", opt rand_seed "rand_seed",
        optmut state_scale "state_scale", optmut intermediate_state_scales "intermediate_state_scales",
    }
    nested {}
    scalars { dt_softplus, pad_slot_id, stochastic_rounding, disable_state_update }
}

fuzz_op! {
    /// `causal_conv1d_update`.
    ConvUpdate: ssm_conv::CausalConv1dUpdateArgs => causal_conv1d_update;
    tensors {
        ref x "x", mut conv_state "conv_state", ref weight "weight", opt bias "bias",
        opt conv_state_indices "conv_state_indices", opt num_accepted_tokens "num_accepted_tokens",
        opt query_start_loc "query_start_loc",
        opt block_idx_last_scheduled_token "block_idx_last_scheduled_token",
        opt initial_state_idx "initial_state_idx", mut out "out",
    }
    nested {}
    scalars { conv_state_layout, activation, pad_slot_id }
}

fuzz_op! {
    /// `causal_conv1d_fn`.
    ConvFn: ssm_conv::CausalConv1dFnArgs => causal_conv1d_fn;
    tensors {
        ref x "x", ref weight "weight", opt bias "bias", mut conv_states "conv_states",
        ref query_start_loc "query_start_loc", opt cache_indices "cache_indices",
        opt has_initial_state "has_initial_state", opt checkpoint_offsets "checkpoint_offsets",
        opt checkpoint_state_indices "checkpoint_state_indices", mut out "out",
    }
    nested {}
    scalars { conv_state_layout, activation, pad_slot_id }
}

fuzz_op! {
    /// `mamba_chunk_scan_combined_varlen`.
    Ssd: ssm_ssd::MambaChunkScanCombinedVarlenArgs => mamba_chunk_scan_combined_varlen;
    tensors {
        ref x "x", ref dt "dt", ref a "A", ref b "B", ref c "C", ref cu_seqlens "cu_seqlens",
        ref cu_chunk_seqlens "cu_chunk_seqlens", ref last_chunk_indices "last_chunk_indices",
        ref seq_idx "seq_idx", optmut out "out", opt d "D", opt z "z", opt dt_bias "dt_bias",
        opt initial_states "initial_states", optmut ssm_state "ssm_state",
        opt initial_state_indices "initial_state_indices", opt has_initial_state "has_initial_state",
        opt final_state_indices "final_state_indices", opt checkpoint_chunk_indices "checkpoint_chunk_indices",
        opt checkpoint_state_indices "checkpoint_state_indices", optmut varlen_states "varlen_states",
        optmut scratch "scratch",
    }
    nested {}
    scalars { chunk_size, pad_slot_id, dt_softplus, dt_limit, return_intermediate_states, state_dtype }
}

fuzz_op! {
    /// `update_replayssm_ring_trackers` (with a reset plan: `reset_replayssm_ring_trackers`).
    RingUpdate: ssm_ring::UpdateRingTrackersArgs => update_replayssm_ring_trackers;
    tensors { ref state_batch_indices "state_batch_indices" }
    nested {
        trackers: ssm_ring::RingTrackers {
            mut ring_start "trackers.ring_start", mut prev_num_accepted "trackers.prev_num_accepted",
            mut prev_query_len "trackers.prev_query_len",
        },
    }
    scalars { logical_window, ring_buffer_len, pad_slot_id }
}

fuzz_op! {
    /// `commit_replayssm_ring_trackers`.
    RingCommit: ssm_ring::CommitRingTrackersArgs => commit_replayssm_ring_trackers;
    tensors {
        ref state_batch_indices "state_batch_indices", ref num_accepted_tokens "num_accepted_tokens",
        ref query_start_loc "query_start_loc",
    }
    nested {
        trackers: ssm_ring::RingTrackers {
            mut ring_start "trackers.ring_start", mut prev_num_accepted "trackers.prev_num_accepted",
            mut prev_query_len "trackers.prev_query_len",
        },
    }
    scalars { logical_window, ring_buffer_len, pad_slot_id }
}

fuzz_op! {
    /// `fused_gdn_gating`.
    GdnGating: ssm_gdn::FusedGdnGatingArgs => fused_gdn_gating;
    tensors { mut g "g", mut beta_output "beta_output" }
    nested {
        gates: ssm_gdn::GateInputs {
            ref a_log "gates.A_log", ref a "gates.a", ref b "gates.b", ref dt_bias "gates.dt_bias",
        },
    }
    scalars { gates.beta, gates.threshold }
}

fuzz_op! {
    /// `fused_recurrent_gated_delta_rule`.
    GdnRecurrent: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs => fused_recurrent_gated_delta_rule;
    tensors { ref g "g", opt beta "beta" }
    nested {
        rule: ssm_gdn::DeltaRuleArgs {
            ref q "rule.q", ref k "rule.k", ref v "rule.v", optmut initial_state "rule.initial_state",
            optmut final_state "rule.final_state", opt cu_seqlens "rule.cu_seqlens",
            opt ssm_state_indices "rule.ssm_state_indices", opt num_accepted_tokens "rule.num_accepted_tokens",
            mut o "rule.o",
        },
    }
    scalars { rule.scale, rule.use_qk_l2norm_in_kernel, rule.eps, rule.state_layout }
}

fuzz_op! {
    /// `fused_sigmoid_gating_delta_rule_update`.
    GdnSigmoid: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs => fused_sigmoid_gating_delta_rule_update;
    tensors {}
    nested {
        gates: ssm_gdn::GateInputs {
            ref a_log "gates.A_log", ref a "gates.a", ref b "gates.b", ref dt_bias "gates.dt_bias",
        },
        rule: ssm_gdn::DeltaRuleArgs {
            ref q "rule.q", ref k "rule.k", ref v "rule.v", optmut initial_state "rule.initial_state",
            optmut final_state "rule.final_state", opt cu_seqlens "rule.cu_seqlens",
            opt ssm_state_indices "rule.ssm_state_indices", opt num_accepted_tokens "rule.num_accepted_tokens",
            mut o "rule.o",
        },
    }
    scalars {
        gates.beta, gates.threshold, rule.scale, rule.use_qk_l2norm_in_kernel, rule.eps, rule.state_layout,
    }
}

fuzz_op! {
    /// `chunk_gated_delta_rule`.
    GdnChunk: ssm_gdn::ChunkGatedDeltaRuleArgs => chunk_gated_delta_rule;
    tensors {
        ref q "q", ref k "k", ref v "v", ref g "g", ref beta "beta", optmut initial_state "initial_state",
        opt initial_state_indices "initial_state_indices", opt has_initial_state "has_initial_state",
        optmut final_state "final_state", opt cu_seqlens "cu_seqlens", mut o "o", optmut scratch "scratch",
    }
    nested {}
    scalars { scale, pad_slot_id, inplace_final_state, use_qk_l2norm_in_kernel, eps, state_layout }
}

fuzz_op! {
    /// `checkpointing_ssu` (ReplaySSM's replaying SSU).
    Checkpoint: ssm_ring::CheckpointingSsuArgs => checkpointing_ssu;
    tensors {
        mut state "state", mut x_cache "x_cache", mut b_cache "B_cache", mut dt_cache "dt_cache",
        ref ring_start "ring_start", ref prev_num_accepted_tokens "prev_num_accepted_tokens", ref x "x",
        ref dt "dt", ref a "A", ref b "B", ref c "C", mut out "out", opt d "D", opt z "z", opt dt_bias "dt_bias",
        opt state_batch_indices "state_batch_indices", opt cu_seqlens "cu_seqlens",
    }
    nested {}
    scalars { dt_softplus, pad_slot_id, max_seqlen }
}

fuzz_op! {
    /// The GDN layer core (`gdn_attention_core`).
    GdnCore: ssm_dispatch::GdnAttentionCoreArgs => gdn_attention_core;
    tensors {
        ref mixed_qkv "mixed_qkv", ref b "b", ref a "a", ref conv_weight "conv_weight", opt conv_bias "conv_bias",
        mut conv_state "conv_state", mut ssm_state "ssm_state", ref a_log "A_log", ref dt_bias "dt_bias",
        mut core_attn_out "core_attn_out",
    }
    nested {
        metadata: ssm_dispatch::GdnAttentionMetadata {
            opt has_initial_state "metadata.has_initial_state",
            opt spec_query_start_loc "metadata.spec_query_start_loc",
            opt non_spec_query_start_loc "metadata.non_spec_query_start_loc",
            opt spec_state_indices_tensor "metadata.spec_state_indices_tensor",
            opt non_spec_state_indices_tensor "metadata.non_spec_state_indices_tensor",
            opt spec_token_indx "metadata.spec_token_indx",
            opt non_spec_token_indx "metadata.non_spec_token_indx",
            opt num_accepted_tokens "metadata.num_accepted_tokens",
        },
    }
    scalars {
        activation, conv_state_layout, ssm_state_layout, num_k_heads, pad_slot_id, metadata.num_prefills,
        metadata.num_prefill_tokens, metadata.num_decodes, metadata.num_decode_tokens, metadata.num_spec_decodes,
        metadata.num_spec_decode_tokens, metadata.num_actual_tokens,
    }
}

fuzz_op! {
    /// The Mamba2 layer core (`mamba2_mixer_core`).
    Mamba2Core: ssm_dispatch::Mamba2MixerCoreArgs => mamba2_mixer_core;
    tensors {
        ref xbc "xbc", ref dt "dt", ref conv_weight "conv_weight", opt conv_bias "conv_bias",
        mut conv_state "conv_state", mut ssm_state "ssm_state", ref a "A", opt d "D", opt dt_bias "dt_bias",
        optmut conv_out "conv_out", mut out "out",
    }
    nested {
        metadata: ssm_dispatch::Mamba2AttentionMetadata {
            opt query_start_loc_p "metadata.query_start_loc_p",
            opt has_initial_states_p "metadata.has_initial_states_p", opt seq_idx_p "metadata.seq_idx_p",
            opt cu_chunk_seqlen_p "metadata.cu_chunk_seqlen_p",
            opt last_chunk_indices_p "metadata.last_chunk_indices_p",
            opt state_indices_tensor_p "metadata.state_indices_tensor_p",
            opt state_indices_tensor_d "metadata.state_indices_tensor_d",
            opt query_start_loc_d "metadata.query_start_loc_d",
            opt num_accepted_tokens "metadata.num_accepted_tokens",
            opt checkpoint_offsets_p "metadata.checkpoint_offsets_p",
            opt checkpoint_state_indices_p "metadata.checkpoint_state_indices_p",
            opt checkpoint_chunk_indices_p "metadata.checkpoint_chunk_indices_p",
        },
    }
    scalars {
        activation, conv_state_layout, num_groups, pad_slot_id, metadata.num_prefills, metadata.num_prefill_tokens,
        metadata.num_decodes, metadata.num_decode_tokens, metadata.prep_initial_states, metadata.chunk_size,
    }
}

fuzz_op! {
    /// `copy_rows` (the layer cores' row gather and scatter).
    CopyRows: ssm_tensor::CopyRowsArgs => copy_rows;
    tensors { ref src "src", mut dst "dst", ref index "index" }
    nested {}
    scalars { direction }
}
