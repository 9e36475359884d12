//! The GDN attention core: one call per layer for a mixed batch, the counterpart of vLLM's
//! `cpu_gdn_attention_core` / `GatedDeltaNetAttention._forward_core` (semantics/gdn_conv.md §2.6,
//! §3.1–§3.2): causal conv1d (speculative rolling-buffer update, decode update or varlen
//! prefill), then the gated delta rule (speculative decode, decode, or gating + chunked
//! prefill), with the outputs scattered back in token order.
//!
//! Differences from vLLM, by design:
//! - `a`/`b` are sliced per path with the token index lists (vLLM passes them unsliced to the
//!   speculative kernel, which is right only when the speculative tokens form the batch prefix,
//!   semantics/gdn_conv.md §8 item 21);
//! - when prefills are present, the non-speculative decodes of the batch run through the chunked
//!   prefill with them (a one-token sequence is the same recurrence), as vLLM's CPU path does.
//!
//! The core gathers the rows of each path into per-call buffers (it allocates); the ops it calls
//! are the runtime's own entry points, so every check of theirs applies.

use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, FusedGdnGatingArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GdnError, StateLayout,
};
use ssm_tensor::ArgError;
use ssm_tensor::{DType, Device, HostTensor, TensorMut, TensorRef};

use crate::{Error, Runtime};

/// vLLM's `GDNAttentionMetadata` (the fields the core reads). Index tensors are host `i32`/`i64`;
/// `has_initial_state` is bool.
#[derive(Clone, Copy)]
pub struct GdnAttentionMetadata<'a> {
    /// Prefill sequences (non-speculative).
    pub num_prefills: usize,
    /// Tokens of the prefill sequences.
    pub num_prefill_tokens: usize,
    /// Decode sequences without drafts (non-speculative), one token each.
    pub num_decodes: usize,
    /// Tokens of the decode sequences.
    pub num_decode_tokens: usize,
    /// Speculative sequences (drafts verified in this step).
    pub num_spec_decodes: usize,
    /// Tokens of the speculative sequences.
    pub num_spec_decode_tokens: usize,
    /// All tokens of the batch.
    pub num_actual_tokens: usize,
    /// `[num_decodes + num_prefills]`: `num_computed_tokens > 0` per non-speculative sequence.
    pub has_initial_state: Option<TensorRef<'a>>,
    /// `[num_spec_decodes + 1]` token starts of the speculative sequences (in their own rows).
    pub spec_query_start_loc: Option<TensorRef<'a>>,
    /// `[num_decodes + num_prefills + 1]` token starts of the other sequences, decodes first.
    pub non_spec_query_start_loc: Option<TensorRef<'a>>,
    /// `[num_spec_decodes, num_spec + 1]` slot table of the speculative sequences (column 0 holds
    /// the conv rolling buffer; column t the SSM state after draft token t).
    pub spec_state_indices_tensor: Option<TensorRef<'a>>,
    /// `[num_decodes + num_prefills]` slots of the other sequences.
    pub non_spec_state_indices_tensor: Option<TensorRef<'a>>,
    /// `[num_spec_decode_tokens]` batch rows of the speculative tokens, in their order.
    pub spec_token_indx: Option<TensorRef<'a>>,
    /// Batch rows of the other tokens, in their order (`None`: all rows, when nothing is speculative).
    pub non_spec_token_indx: Option<TensorRef<'a>>,
    /// `[num_spec_decodes]` accepted tokens of the previous step.
    pub num_accepted_tokens: Option<TensorRef<'a>>,
}

/// One layer's GDN core call.
pub struct GdnAttentionCoreArgs<'a> {
    /// `[T, 2·H·K + HV·V]` projected `[q | k | v]` rows before the conv (vLLM's `mixed_qkv`).
    pub mixed_qkv: TensorRef<'a>,
    /// `[T, HV]` beta logits.
    pub b: TensorRef<'a>,
    /// `[T, HV]` decay logits.
    pub a: TensorRef<'a>,
    /// `[conv_dim, width]` conv weight.
    pub conv_weight: TensorRef<'a>,
    /// `[conv_dim]` conv bias.
    pub conv_bias: Option<TensorRef<'a>>,
    /// Conv activation (silu for Qwen3-Next).
    pub activation: Activation,
    /// Conv-state pool (`state_len = width − 1 + num_spec`).
    pub conv_state: TensorMut<'a>,
    /// Axis order of `conv_state`.
    pub conv_state_layout: ConvStateLayout,
    /// SSM-state pool `[slots, HV, V, K]` or `[slots, HV, K, V]`.
    pub ssm_state: TensorMut<'a>,
    /// Axis order of `ssm_state`.
    pub ssm_state_layout: StateLayout,
    /// `[HV]`.
    pub a_log: TensorRef<'a>,
    /// `[HV]`.
    pub dt_bias: TensorRef<'a>,
    /// q/k heads `H` (`head_k_dim` and the value sizes come from `ssm_state`).
    pub num_k_heads: usize,
    /// The pad (null block) value of the slot tables; the recurrent kernels also skip any index `<= 0`.
    pub pad_slot_id: Option<i64>,
    /// The batch description.
    pub metadata: GdnAttentionMetadata<'a>,
    /// Output `[T, HV, V]`; rows of skipped (padded) sequences are left as they were.
    pub core_attn_out: TensorMut<'a>,
}

fn meta_err(arg: &'static str, needs: &'static str) -> Error {
    Error::Gdn(GdnError::from(ArgError::Requires { arg, needs }))
}

fn host_rows<'a>(t: &TensorRef<'a>) -> Result<&'a [u8], Error> {
    t.host_bytes().ok_or(Error::Gdn(GdnError::NotHost { arg: "gdn core input", device: t.device() }))
}

/// Index list as usize (host tensor).
fn index_list(t: Option<&TensorRef<'_>>, n: usize, arg: &'static str) -> Result<Vec<usize>, Error> {
    let t = t.ok_or_else(|| meta_err(arg, "a value for this batch"))?;
    host_rows(t)?;
    if t.rank() != 1 || t.shape()[0] < n {
        return Err(Error::Gdn(GdnError::from(ArgError::Shape {
            arg,
            expected: format!("[{n}]"),
            actual: t.shape().to_vec(),
        })));
    }
    (0..n)
        .map(|i| {
            t.get_i64(&[i])
                .map(|v| v as usize)
                .map_err(|source| Error::Gdn(GdnError::from(ArgError::Tensor { arg, source })))
        })
        .collect()
}

/// Gathers rows `rows` of a 2-D host tensor into a new contiguous `[rows.len(), cols]` tensor.
fn gather_rows(t: &TensorRef<'_>, rows: &[usize], arg: &'static str) -> Result<HostTensor, Error> {
    let bytes = host_rows(t)?;
    let [n, cols] = *t.shape() else {
        return Err(Error::Gdn(GdnError::from(ArgError::Shape {
            arg,
            expected: "[T, dim]".into(),
            actual: t.shape().to_vec(),
        })));
    };
    if t.strides()[1] != 1 && cols > 1 {
        return Err(Error::Gdn(GdnError::from(ArgError::Strides {
            arg,
            what: "contiguous along its last axis",
            shape: t.shape().to_vec(),
            strides: t.strides().to_vec(),
        })));
    }
    let es = t.dtype().size();
    let mut out = HostTensor::filled(t.dtype(), vec![rows.len(), cols], 0.0);
    for (i, &r) in rows.iter().enumerate() {
        if r >= n {
            return Err(Error::Gdn(GdnError::IndexOutOfRange {
                arg,
                seq: i,
                column: 0,
                value: r as i64,
                allowed: "row of the batch",
                slots: n,
            }));
        }
        let src = t.layout().index(&[r, 0]) * es;
        out.bytes_mut()[i * cols * es..(i + 1) * cols * es].copy_from_slice(&bytes[src..src + cols * es]);
    }
    Ok(out)
}

/// Rows `rows` of `mixed_qkv`, `a` and `b`: one path's inputs, contiguous.
fn path_rows(ts: [&TensorRef<'_>; 3], rows: &[usize]) -> Result<[HostTensor; 3], Error> {
    Ok([gather_rows(ts[0], rows, "mixed_qkv")?, gather_rows(ts[1], rows, "a")?, gather_rows(ts[2], rows, "b")?])
}

/// An `[n]` view of column 0 of an `[n, ·]` slot table (or of an `[n]` table itself).
fn first_column<'a>(t: TensorRef<'a>, n: usize, arg: &'static str) -> Result<TensorRef<'a>, Error> {
    t.with_layout(&[n], &[t.strides()[0]], t.layout().offset())
        .map_err(|source| Error::Gdn(GdnError::from(ArgError::Tensor { arg, source })))
}

/// Writes row `i` of `src` (`[n, HV·V]` contiguous) to row `rows[i]` of `dst` (`[T, HV, V]`).
fn scatter_rows(src: &HostTensor, rows: &[usize], dst: &mut TensorMut<'_>) -> Result<(), Error> {
    let width = src.shape[1..].iter().product::<usize>();
    let es = src.dtype.size();
    let layout = *dst.layout();
    if dst.dtype() != src.dtype
        || dst.rank() != 3
        || dst.strides()[2] != 1
        || dst.strides()[1] != dst.shape()[2] as isize
    {
        return Err(Error::Gdn(GdnError::from(ArgError::Strides {
            arg: "core_attn_out",
            what: "row-contiguous [T, HV, V] in the dtype of mixed_qkv",
            shape: dst.shape().to_vec(),
            strides: dst.strides().to_vec(),
        })));
    }
    let device = dst.device();
    let out = dst.host_bytes_mut().ok_or(Error::Gdn(GdnError::NotHost { arg: "core_attn_out", device }))?;
    for (i, &r) in rows.iter().enumerate() {
        // A skipped sequence's rows stay NaN in `src`: keep the caller's values there.
        let row = &src.bytes()[i * width * es..(i + 1) * width * es];
        let nan = match src.dtype {
            DType::F32 => row.chunks(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()).is_nan()),
            _ => row.chunks(2).all(|c| {
                let b = u16::from_le_bytes(c.try_into().unwrap());
                match src.dtype {
                    DType::BF16 => (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0,
                    _ => (b & 0x7c00) == 0x7c00 && (b & 0x03ff) != 0,
                }
            }),
        };
        if nan {
            continue;
        }
        let dst0 = layout.index(&[r, 0, 0]) * es;
        out[dst0..dst0 + width * es].copy_from_slice(row);
    }
    Ok(())
}

/// Starts of a `[n + 1]` host tensor as a new i32 tensor (a copy, so it can be re-based);
/// a missing tensor is an error saying it `needs` a value.
fn starts(t: Option<&TensorRef<'_>>, n: usize, arg: &'static str, needs: &'static str) -> Result<HostTensor, Error> {
    let t = t.ok_or_else(|| meta_err(arg, needs))?;
    let v = index_list(Some(t), n + 1, arg)?;
    Ok(HostTensor::from_i64(DType::I32, vec![n + 1], &v.iter().map(|&x| x as i64).collect::<Vec<_>>()))
}

/// q `[1, n, H, K]`, k and v `[1, n, HV, V]` views of a conv output `[n, conv_dim]`.
fn qkv_views(
    x: &HostTensor,
    conv_dim: usize,
    h: usize,
    kd: usize,
    hv: usize,
    vd: usize,
) -> Result<[TensorRef<'_>; 3], Error> {
    let n = x.shape[0];
    let cd = conv_dim as isize;
    let view = |shape: &[usize], strides: &[isize], off: usize| {
        x.view()
            .with_layout(shape, strides, off)
            .map_err(|source| Error::Gdn(GdnError::from(ArgError::Tensor { arg: "mixed_qkv", source })))
    };
    Ok([
        view(&[1, n, h, kd], &[0, cd, kd as isize, 1], 0)?,
        view(&[1, n, h, kd], &[0, cd, kd as isize, 1], h * kd)?,
        view(&[1, n, hv, vd], &[0, cd, vd as isize, 1], 2 * h * kd)?,
    ])
}

/// The per-layer parameters of the fused gating + delta-rule decode, shared by both decode paths.
struct DecodeStep<'a> {
    a_log: TensorRef<'a>,
    dt_bias: TensorRef<'a>,
    state_layout: StateLayout,
}

impl Runtime {
    /// `fused_sigmoid_gating_delta_rule_update` as the core calls it (vLLM's gating constants,
    /// q/k l2norm, in-place states): for the speculative path (2-D table, accepted counts) and
    /// for plain decodes (1-D slots).
    #[allow(clippy::too_many_arguments)]
    fn gdn_decode_step(
        &self,
        p: &DecodeStep<'_>,
        [a, b]: [TensorRef<'_>; 2],
        [q, k, v]: [TensorRef<'_>; 3],
        state: TensorMut<'_>,
        cu_seqlens: &HostTensor,
        slots: TensorRef<'_>,
        num_accepted_tokens: Option<TensorRef<'_>>,
        o: TensorMut<'_>,
    ) -> Result<(), Error> {
        self.fused_sigmoid_gating_delta_rule_update(FusedSigmoidGatingDeltaRuleUpdateArgs {
            a_log: p.a_log,
            a,
            b,
            dt_bias: p.dt_bias,
            q,
            k,
            v,
            beta: 1.0,
            threshold: 20.0,
            scale: None,
            initial_state: Some(state),
            final_state: None,
            cu_seqlens: Some(cu_seqlens.view()),
            ssm_state_indices: Some(slots),
            num_accepted_tokens,
            use_qk_l2norm_in_kernel: true,
            eps: 1e-6,
            state_layout: p.state_layout,
            o,
        })
    }

    /// The GDN attention core of one layer over a mixed batch (speculative sequences, decodes,
    /// prefills): conv1d, then the gated delta rule, outputs scattered back in token order
    /// ([`GdnAttentionCoreArgs`], module docs for the deviations from vLLM). Writes
    /// `core_attn_out` rows of sequences that are not skipped, and the conv and SSM slots the
    /// metadata names. Host tensors only (the metadata is read on the host).
    pub fn gdn_attention_core(&self, args: GdnAttentionCoreArgs<'_>) -> Result<(), Error> {
        if args.mixed_qkv.device() != Device::Cpu {
            return Err(Error::Unsupported { backend: "cuda", what: "gdn_attention_core" });
        }
        let GdnAttentionCoreArgs {
            mixed_qkv,
            b,
            a,
            conv_weight,
            conv_bias,
            activation,
            mut conv_state,
            conv_state_layout,
            mut ssm_state,
            ssm_state_layout,
            a_log,
            dt_bias,
            num_k_heads,
            pad_slot_id,
            metadata: m,
            mut core_attn_out,
        } = args;
        let st = ssm_state.shape().to_vec();
        if st.len() != 4 {
            return Err(Error::Gdn(GdnError::from(ArgError::Shape {
                arg: "ssm_state",
                expected: "[slots, HV, ·, ·]".into(),
                actual: st,
            })));
        }
        let (hv, kd, vd) = match ssm_state_layout {
            StateLayout::VK => (st[1], st[3], st[2]),
            StateLayout::KV => (st[1], st[2], st[3]),
        };
        let conv_dim = mixed_qkv.shape().get(1).copied().unwrap_or(0);
        if num_k_heads == 0 || conv_dim != 2 * num_k_heads * kd + hv * vd {
            return Err(Error::Gdn(GdnError::from(ArgError::Shape {
                arg: "mixed_qkv",
                expected: format!("[T, 2·H·K + HV·V = {}]", 2 * num_k_heads * kd + hv * vd),
                actual: mixed_qkv.shape().to_vec(),
            })));
        }
        let h = num_k_heads;
        let io = mixed_qkv.dtype();
        // Speculative sequences: rolling-buffer conv update, then the 2-D-table recurrence.
        if m.num_spec_decodes > 0 {
            let ns = m.num_spec_decodes;
            let rows = index_list(m.spec_token_indx.as_ref(), m.num_spec_decode_tokens, "spec_token_indx")?;
            let [x, a_s, b_s] = path_rows([&mixed_qkv, &a, &b], &rows)?;
            let needs = "a value with speculative sequences";
            let qsl = starts(m.spec_query_start_loc.as_ref(), ns, "spec_query_start_loc", needs)?;
            let table = m.spec_state_indices_tensor.ok_or_else(|| meta_err("spec_state_indices_tensor", needs))?;
            let column0 = first_column(table, ns, "spec_state_indices_tensor")?;
            let mut conv_out = HostTensor::filled(io, vec![rows.len(), conv_dim], 0.0);
            self.causal_conv1d_update(CausalConv1dUpdateArgs {
                x: x.view(),
                conv_state: conv_state.reborrow(),
                conv_state_layout,
                weight: conv_weight,
                bias: conv_bias,
                activation,
                conv_state_indices: Some(column0),
                num_accepted_tokens: m.num_accepted_tokens,
                query_start_loc: Some(qsl.view()),
                pad_slot_id,
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out: conv_out.view_mut(),
            })?;
            let [q, k, v] = qkv_views(&conv_out, conv_dim, h, kd, hv, vd)?;
            let mut o = HostTensor::filled(io, vec![1, rows.len(), hv, vd], f32::NAN);
            let decode = DecodeStep { a_log, dt_bias, state_layout: ssm_state_layout };
            self.gdn_decode_step(
                &decode,
                [a_s.view(), b_s.view()],
                [q, k, v],
                ssm_state.reborrow(),
                &qsl,
                table,
                m.num_accepted_tokens,
                o.view_mut(),
            )?;
            let o = HostTensor::from_bytes(io, vec![rows.len(), hv * vd], o.bytes());
            scatter_rows(&o, &rows, &mut core_attn_out)?;
        }

        // Non-speculative sequences: decodes first, then prefills.
        let nn = m.num_decodes + m.num_prefills;
        if nn > 0 {
            let tokens = m.num_decode_tokens + m.num_prefill_tokens;
            let rows = match (m.non_spec_token_indx.as_ref(), m.num_spec_decodes) {
                (Some(t), _) => index_list(Some(t), tokens, "non_spec_token_indx")?,
                (None, 0) => (0..tokens).collect(),
                (None, _) => {
                    return Err(meta_err(
                        "non_spec_token_indx",
                        "a value when the batch also has speculative sequences",
                    ));
                }
            };
            let [x, a_n, b_n] = path_rows([&mixed_qkv, &a, &b], &rows)?;
            let needs = "a value with non-speculative sequences";
            let qsl = starts(m.non_spec_query_start_loc.as_ref(), nn, "non_spec_query_start_loc", needs)?;
            let slots =
                m.non_spec_state_indices_tensor.ok_or_else(|| meta_err("non_spec_state_indices_tensor", needs))?;
            let slots = first_column(slots, nn, "non_spec_state_indices_tensor")?;
            let mut conv_out = HostTensor::filled(io, vec![rows.len(), conv_dim], 0.0);
            if m.num_prefills > 0 {
                self.causal_conv1d_fn(CausalConv1dFnArgs {
                    x: x.view(),
                    weight: conv_weight,
                    bias: conv_bias,
                    conv_states: conv_state.reborrow(),
                    conv_state_layout,
                    query_start_loc: qsl.view(),
                    cache_indices: Some(slots),
                    has_initial_state: m.has_initial_state,
                    activation,
                    pad_slot_id,
                    out: conv_out.view_mut(),
                })?;
            } else {
                self.causal_conv1d_update(CausalConv1dUpdateArgs {
                    x: x.view(),
                    conv_state: conv_state.reborrow(),
                    conv_state_layout,
                    weight: conv_weight,
                    bias: conv_bias,
                    activation,
                    conv_state_indices: Some(slots),
                    num_accepted_tokens: None,
                    query_start_loc: None,
                    pad_slot_id,
                    block_idx_last_scheduled_token: None,
                    initial_state_idx: None,
                    out: conv_out.view_mut(),
                })?;
            }
            let [q, k, v] = qkv_views(&conv_out, conv_dim, h, kd, hv, vd)?;
            let mut o = HostTensor::filled(io, vec![1, rows.len(), hv, vd], f32::NAN);
            if m.num_prefills > 0 {
                let mut g = HostTensor::filled(DType::F32, vec![rows.len(), hv], 0.0);
                let mut beta = HostTensor::filled(DType::F32, vec![rows.len(), hv], 0.0);
                self.fused_gdn_gating(FusedGdnGatingArgs {
                    a_log,
                    a: a_n.view(),
                    b: b_n.view(),
                    dt_bias,
                    beta: 1.0,
                    threshold: 20.0,
                    g: g.view_mut(),
                    beta_output: beta.view_mut(),
                })?;
                let g3 = HostTensor::from_bytes(DType::F32, vec![1, rows.len(), hv], g.bytes());
                let beta3 = HostTensor::from_bytes(DType::F32, vec![1, rows.len(), hv], beta.bytes());
                self.chunk_gated_delta_rule(ChunkGatedDeltaRuleArgs {
                    q,
                    k,
                    v,
                    g: g3.view(),
                    beta: beta3.view(),
                    scale: None,
                    initial_state: Some(ssm_state.reborrow()),
                    initial_state_indices: Some(slots),
                    has_initial_state: m.has_initial_state,
                    pad_slot_id,
                    inplace_final_state: true,
                    final_state: None,
                    cu_seqlens: Some(qsl.view()),
                    use_qk_l2norm_in_kernel: true,
                    eps: 1e-6,
                    state_layout: ssm_state_layout,
                    o: o.view_mut(),
                    scratch: None,
                })?;
            } else {
                let decode = DecodeStep { a_log, dt_bias, state_layout: ssm_state_layout };
                self.gdn_decode_step(
                    &decode,
                    [a_n.view(), b_n.view()],
                    [q, k, v],
                    ssm_state.reborrow(),
                    &qsl,
                    slots,
                    None,
                    o.view_mut(),
                )?;
            }
            let o = HostTensor::from_bytes(io, vec![rows.len(), hv * vd], o.bytes());
            scatter_rows(&o, &rows, &mut core_attn_out)?;
        }
        Ok(())
    }
}
