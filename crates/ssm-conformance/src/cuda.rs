//! Running the suite on a CUDA runtime: the cases are host tensors, so [`Staged`] copies each
//! call's tensors to the runtime's device, runs the runtime's op there, and copies the outputs
//! back ([`ssm_cuda::testing::stage`], the one staging implementation, with a per-op mapping:
//! [`ssm_cuda::testing::StageArgs`]). The two layer cores are staged here (their arguments are
//! the facade's, not an op's): every tensor and every metadata index tensor goes to the device,
//! as vLLM keeps them, the counts stay host integers.

// The staging error is ssm-cuda's own (large) error enum; this is the test harness's copy path,
// never a decode path.
#![allow(clippy::result_large_err)]

use ssm_cuda::CudaBackend;
use ssm_cuda::testing::{
    DeviceCheckpointingSsuArgs, DeviceChunkArgs, DeviceCommitTrackersArgs, DeviceConvFnArgs, DeviceConvUpdateArgs,
    DeviceCopyRowsArgs, DeviceGdnGatingArgs, DeviceGdnRecurrentArgs, DeviceGdnSigmoidArgs, DeviceSsdArgs,
    DeviceSsuArgs, DeviceUpdateTrackersArgs, MirrorError, StagedTensor, stage,
};
use ssm_dispatch::{GdnAttentionCoreArgs, GdnAttentionMetadata, Mamba2AttentionMetadata, Mamba2MixerCoreArgs, Runtime};
use ssm_tensor::{TensorError, TensorRef};

use crate::{Target, TargetError};

/// A runtime whose calls get host tensors staged onto its device. On a CPU runtime the calls go
/// straight through.
#[derive(Debug)]
pub struct Staged {
    rt: Runtime,
    label: String,
}

impl Staged {
    /// Wraps `rt`, shown as `label` in reports.
    pub fn new(rt: Runtime, label: impl Into<String>) -> Self {
        Staged { rt, label: label.into() }
    }
}

/// Ops with a CUDA kernel: on a CUDA runtime each call is staged ([`stage`] with the op's
/// [`ssm_cuda::testing::StageArgs`] mapping) and the runtime's op runs on the device copies; on
/// a CPU runtime the call goes straight through.
macro_rules! staged {
    ($($op:ident: $args:ty => $staging:ty),* $(,)?) => {
        $(fn $op(&self, args: $args) -> Result<(), TargetError> {
            match self.rt.cuda() {
                Some(cuda) => stage::<$staging>(cuda, args, |dev_args| {
                    self.rt.$op(dev_args).map_err(|e| MirrorError::Run(e.to_string()))
                })
                .map_err(TargetError::failed),
                None => Ok(self.rt.$op(args)?),
            }
        })*
    };
}

impl Target for Staged {
    fn label(&self) -> String {
        self.label.clone()
    }

    staged! {
        selective_state_update: ssm_ssu::SelectiveStateUpdateArgs<'_> => DeviceSsuArgs,
        causal_conv1d_update: ssm_conv::CausalConv1dUpdateArgs<'_> => DeviceConvUpdateArgs,
        causal_conv1d_fn: ssm_conv::CausalConv1dFnArgs<'_> => DeviceConvFnArgs,
        fused_gdn_gating: ssm_gdn::FusedGdnGatingArgs<'_> => DeviceGdnGatingArgs,
        fused_recurrent_gated_delta_rule: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_> => DeviceGdnRecurrentArgs,
        fused_sigmoid_gating_delta_rule_update: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_> => DeviceGdnSigmoidArgs,
        update_replayssm_ring_trackers: ssm_ring::UpdateRingTrackersArgs<'_> => DeviceUpdateTrackersArgs,
        commit_replayssm_ring_trackers: ssm_ring::CommitRingTrackersArgs<'_> => DeviceCommitTrackersArgs,
        checkpointing_ssu: ssm_ring::CheckpointingSsuArgs<'_> => DeviceCheckpointingSsuArgs,
        mamba_chunk_scan_combined_varlen: ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_> => DeviceSsdArgs,
        chunk_gated_delta_rule: ssm_gdn::ChunkGatedDeltaRuleArgs<'_> => DeviceChunkArgs,
        copy_rows: ssm_tensor::CopyRowsArgs<'_> => DeviceCopyRowsArgs,
    }

    fn gdn_attention_core(&self, args: GdnAttentionCoreArgs<'_>) -> Result<(), TargetError> {
        match self.rt.cuda() {
            Some(cuda) => self.gdn_core_staged(cuda, args),
            None => Ok(self.rt.gdn_attention_core(args)?),
        }
    }

    fn mamba2_mixer_core(&self, args: Mamba2MixerCoreArgs<'_>) -> Result<(), TargetError> {
        match self.rt.cuda() {
            Some(cuda) => self.mamba2_core_staged(cuda, args),
            None => Ok(self.rt.mamba2_mixer_core(args)?),
        }
    }
}

/// Device copies of a list of optional host tensors (metadata index tensors, optional inputs).
struct Uploaded<const N: usize>([Option<StagedTensor>; N]);

impl<const N: usize> Uploaded<N> {
    fn new(backend: &CudaBackend, ts: [Option<TensorRef<'_>>; N]) -> Result<Self, MirrorError> {
        let mut out = [const { None }; N];
        for (o, t) in out.iter_mut().zip(ts) {
            *o = StagedTensor::upload_opt(backend, t.as_ref())?;
        }
        Ok(Uploaded(out))
    }

    fn views(&self) -> Result<[Option<TensorRef<'_>>; N], TensorError> {
        let mut out = [None; N];
        for (o, t) in out.iter_mut().zip(&self.0) {
            *o = t.as_ref().map(StagedTensor::view).transpose()?;
        }
        Ok(out)
    }
}

/// The device view of a tensor that was given (an `Option` only because [`Uploaded`] holds
/// optional ones too).
fn given(t: Option<TensorRef<'_>>) -> TensorRef<'_> {
    t.expect("uploaded from a given tensor")
}

/// `f` on the staged runtime's backend, its staging errors as failures of the target.
fn staging<T>(f: impl FnOnce() -> Result<T, MirrorError>) -> Result<T, TargetError> {
    f().map_err(TargetError::failed)
}

impl Staged {
    /// `gdn_attention_core` on the device copies of `args` (module docs); the pools and
    /// `core_attn_out` come back.
    fn gdn_core_staged(&self, cuda: &CudaBackend, mut args: GdnAttentionCoreArgs<'_>) -> Result<(), TargetError> {
        let m = args.metadata;
        let inputs = staging(|| {
            Uploaded::new(
                cuda,
                [
                    Some(args.mixed_qkv),
                    Some(args.a),
                    Some(args.b),
                    Some(args.conv_weight),
                    args.conv_bias,
                    Some(args.a_log),
                    Some(args.dt_bias),
                ],
            )
        })?;
        let tables = staging(|| {
            Uploaded::new(
                cuda,
                [
                    m.has_initial_state,
                    m.spec_query_start_loc,
                    m.non_spec_query_start_loc,
                    m.spec_state_indices_tensor,
                    m.non_spec_state_indices_tensor,
                    m.spec_token_indx,
                    m.non_spec_token_indx,
                    m.num_accepted_tokens,
                ],
            )
        })?;
        let up = |t: TensorRef<'_>| staging(|| StagedTensor::upload(cuda, &t));
        let mut pools = [up(args.conv_state.as_ref())?, up(args.ssm_state.as_ref())?, up(args.core_attn_out.as_ref())?];
        {
            let [mixed_qkv, a, b, conv_weight, conv_bias, a_log, dt_bias] = staging(|| Ok(inputs.views()?))?;
            let [has, sq, nq, st, nst, si, ni, acc] = staging(|| Ok(tables.views()?))?;
            let [conv, ssm, out] = &mut pools;
            let dev = staging(|| {
                Ok(GdnAttentionCoreArgs {
                    mixed_qkv: given(mixed_qkv),
                    a: given(a),
                    b: given(b),
                    conv_weight: given(conv_weight),
                    conv_bias,
                    a_log: given(a_log),
                    dt_bias: given(dt_bias),
                    conv_state: conv.view_mut()?,
                    ssm_state: ssm.view_mut()?,
                    core_attn_out: out.view_mut()?,
                    metadata: GdnAttentionMetadata {
                        has_initial_state: has,
                        spec_query_start_loc: sq,
                        non_spec_query_start_loc: nq,
                        spec_state_indices_tensor: st,
                        non_spec_state_indices_tensor: nst,
                        spec_token_indx: si,
                        non_spec_token_indx: ni,
                        num_accepted_tokens: acc,
                        ..m
                    },
                    activation: args.activation,
                    conv_state_layout: args.conv_state_layout,
                    ssm_state_layout: args.ssm_state_layout,
                    num_k_heads: args.num_k_heads,
                    pad_slot_id: args.pad_slot_id,
                })
            })?;
            self.rt.gdn_attention_core(dev)?;
        }
        staging(|| {
            cuda.synchronize()?;
            pools[0].copy_back(&mut args.conv_state)?;
            pools[1].copy_back(&mut args.ssm_state)?;
            pools[2].copy_back(&mut args.core_attn_out)?;
            Ok(cuda.check()?)
        })
    }

    /// `mamba2_mixer_core` on the device copies of `args` (module docs); the pools, `out` and
    /// `conv_out` (when given) come back.
    fn mamba2_core_staged(&self, cuda: &CudaBackend, mut args: Mamba2MixerCoreArgs<'_>) -> Result<(), TargetError> {
        let m = args.metadata;
        let inputs = staging(|| {
            Uploaded::new(
                cuda,
                [
                    Some(args.xbc),
                    Some(args.dt),
                    Some(args.conv_weight),
                    args.conv_bias,
                    Some(args.a),
                    args.d,
                    args.dt_bias,
                ],
            )
        })?;
        let tables = staging(|| {
            Uploaded::new(
                cuda,
                [
                    m.query_start_loc_p,
                    m.has_initial_states_p,
                    m.seq_idx_p,
                    m.cu_chunk_seqlen_p,
                    m.last_chunk_indices_p,
                    m.state_indices_tensor_p,
                    m.state_indices_tensor_d,
                    m.query_start_loc_d,
                    m.num_accepted_tokens,
                    m.checkpoint_offsets_p,
                    m.checkpoint_state_indices_p,
                    m.checkpoint_chunk_indices_p,
                ],
            )
        })?;
        let up = |t: TensorRef<'_>| staging(|| StagedTensor::upload(cuda, &t));
        let mut pools = [up(args.conv_state.as_ref())?, up(args.ssm_state.as_ref())?, up(args.out.as_ref())?];
        let mut conv_out =
            staging(|| StagedTensor::upload_opt(cuda, args.conv_out.as_ref().map(|c| c.as_ref()).as_ref()))?;
        {
            let [xbc, dt, conv_weight, conv_bias, a, d, dt_bias] = staging(|| Ok(inputs.views()?))?;
            let [qsl_p, has_p, seq_idx, cu_chunk, last, slots_p, slots_d, qsl_d, acc, ck_off, ck_slots, ck_chunks] =
                staging(|| Ok(tables.views()?))?;
            let [conv, ssm, out] = &mut pools;
            let dev = staging(|| {
                Ok(Mamba2MixerCoreArgs {
                    xbc: given(xbc),
                    dt: given(dt),
                    conv_weight: given(conv_weight),
                    conv_bias,
                    activation: args.activation,
                    conv_state: conv.view_mut()?,
                    conv_state_layout: args.conv_state_layout,
                    ssm_state: ssm.view_mut()?,
                    a: given(a),
                    d,
                    dt_bias,
                    num_groups: args.num_groups,
                    pad_slot_id: args.pad_slot_id,
                    metadata: Mamba2AttentionMetadata {
                        query_start_loc_p: qsl_p,
                        has_initial_states_p: has_p,
                        seq_idx_p: seq_idx,
                        cu_chunk_seqlen_p: cu_chunk,
                        last_chunk_indices_p: last,
                        state_indices_tensor_p: slots_p,
                        state_indices_tensor_d: slots_d,
                        query_start_loc_d: qsl_d,
                        num_accepted_tokens: acc,
                        checkpoint_offsets_p: ck_off,
                        checkpoint_state_indices_p: ck_slots,
                        checkpoint_chunk_indices_p: ck_chunks,
                        ..m
                    },
                    conv_out: conv_out.as_mut().map(StagedTensor::view_mut).transpose()?,
                    out: out.view_mut()?,
                })
            })?;
            self.rt.mamba2_mixer_core(dev)?;
        }
        staging(|| {
            cuda.synchronize()?;
            pools[0].copy_back(&mut args.conv_state)?;
            pools[1].copy_back(&mut args.ssm_state)?;
            pools[2].copy_back(&mut args.out)?;
            if let (Some(d), Some(h)) = (&conv_out, args.conv_out.as_mut()) {
                d.copy_back(h)?;
            }
            Ok(cuda.check()?)
        })
    }
}
