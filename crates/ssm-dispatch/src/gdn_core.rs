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
//! Where it runs: host tensors on the CPU backend, device tensors on the CUDA backend. The
//! metadata's counts are host integers; its index tensors live with the data (on the device
//! for a device call, as vLLM keeps them), where the kernels check their values.
//!
//! A path whose tokens are consecutive rows of the batch (every batch without speculative
//! sequences, and any batch whose token lists are consecutive on the host) runs on views of the
//! caller's tensors and writes its outputs in place. Otherwise the core gathers the path's rows
//! of `mixed_qkv`, `a`, `b` and `core_attn_out` into per-call buffers (`copy_rows`, on the
//! device of the call), runs the ops there and scatters the output rows back, so rows of skipped
//! sequences keep the caller's values either way. The conv output and the prefill's `g`/`β` are
//! per-call buffers too (allocated after every count in the metadata was checked against the
//! tensors it describes, with checked sizes; on the device, stream-ordered). Every op's plan
//! runs before any op does ([`crate::layer_core::Schedule`]), so a refused call writes
//! nothing.

use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs,
    GdnDecodeStepArgs, StateLayout,
};
use ssm_tensor::{CopyRowsArgs, DType, RowDirection, TensorMut, TensorRef};

use crate::layer_core::{Buffer, Schedule, add, column0, core_err, fits, host_ints, need, product};
use crate::{Error, Runtime};

/// vLLM's `GDNAttentionMetadata` (the fields the core reads). Index tensors are `i32`/`i64`
/// (`has_initial_state` is bool) on the device of the call's data: host tensors for a host call,
/// device tensors for a device call.
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

/// Sizes of one call: q/k heads `H`, key dim `K`, value heads `HV`, value dim `V`, and
/// `conv_dim = 2·H·K + HV·V`.
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    kd: usize,
    hv: usize,
    vd: usize,
    conv_dim: usize,
}

impl Dims {
    fn of(mixed_qkv: &TensorRef<'_>, ssm_state: &TensorMut<'_>, layout: StateLayout, h: usize) -> Result<Dims, Error> {
        let st = ssm_state.shape();
        let [_, hv, a, b] = st[..] else {
            return Err(core_err("ssm_state", format!("must have shape [slots, HV, ·, ·], got {st:?}")));
        };
        let (kd, vd) = layout.head_dims(a, b);
        let conv_dim = add("mixed_qkv", product("mixed_qkv", &[2, h, kd])?, product("mixed_qkv", &[hv, vd])?)?;
        if h == 0 || mixed_qkv.rank() != 2 || mixed_qkv.shape()[1] != conv_dim {
            return Err(core_err(
                "mixed_qkv",
                format!("must have shape [T, 2·H·K + HV·V = {conv_dim}] with H ≥ 1, got {:?}", mixed_qkv.shape()),
            ));
        }
        Ok(Dims { h, kd, hv, vd, conv_dim })
    }
}

/// How one group of sequences runs.
#[derive(Clone, Copy, PartialEq)]
enum Route {
    /// Rolling-buffer conv update, then the 2-D-table recurrence.
    Speculative,
    /// Conv update, then the recurrence.
    Decode,
    /// Decodes of one token each (`num_decode_tokens == num_decodes`): one `gdn_decode_step`
    /// (the conv update and the recurrence as one call; on CUDA its route is the backend's), sequence `i`
    /// at row `i` of the path (the token starts are implied and not read).
    DecodeStep,
    /// Varlen conv, gating, then the chunked prefill (decodes of the batch included).
    Prefill,
}

/// The batch rows of one path's tokens.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Rows `[r0, r0 + n)`: the ops run on views of the caller's tensors.
    Range(usize),
    /// An `[n]` index list: host values checked `< T`, device values checked by `copy_rows`.
    List(TensorRef<'a>),
}

/// One group of sequences, resolved from the metadata and checked.
struct Path<'a> {
    route: Route,
    /// Tokens.
    n: usize,
    /// Batch rows of its tokens, in order.
    rows: Rows<'a>,
    /// `[n + 1]` token starts within `rows`.
    starts: TensorRef<'a>,
    /// The recurrence's slot table (`[n, 1 + num_spec]` for speculative sequences, else `[n]`).
    slots: TensorRef<'a>,
    /// `[n]` the conv slots (column 0).
    conv_slots: TensorRef<'a>,
}

/// Entries `[0, n)` of a token index list. Host values must be rows of the batch (`< t`);
/// consecutive ones become a range. Device values are checked by the gather kernel.
fn token_rows<'a>(list: TensorRef<'a>, n: usize, arg: &'static str, t: usize) -> Result<Rows<'a>, Error> {
    if list.rank() != 1 || list.shape()[0] < n {
        return Err(core_err(arg, format!("must have shape [{n}], got {:?}", list.shape())));
    }
    let first_n = list
        .with_layout(&[n], &[list.strides()[0]], list.layout().offset())
        .map_err(|e| core_err(arg, format!("cannot be viewed: {e}")))?;
    if list.host_bytes().is_none() {
        return Ok(Rows::List(first_n));
    }
    let v = host_ints(&list, n, arg)?;
    for (i, &r) in v.iter().enumerate() {
        if usize::try_from(r).ok().is_none_or(|r| r >= t) {
            return Err(core_err(arg, format!("entry {i} = {r} must be a row of the batch in [0, {t})")));
        }
    }
    let consecutive = v.windows(2).all(|w| w[1] == w[0] + 1);
    Ok(if consecutive { Rows::Range(v.first().map_or(0, |&r| r as usize)) } else { Rows::List(first_n) })
}

/// The `[n + 1]` token starts and the slot table of a group of `n` sequences (both required
/// `when` the group has sequences), with the table's column 0.
fn starts_and_slots<'a>(
    (starts, starts_arg): (Option<TensorRef<'a>>, &'static str),
    (table, table_arg): (Option<TensorRef<'a>>, &'static str),
    (n, count_arg): (usize, &'static str),
    when: &str,
) -> Result<(TensorRef<'a>, TensorRef<'a>, TensorRef<'a>), Error> {
    let starts = column0(need(starts, starts_arg, when)?, add(count_arg, n, 1)?, starts_arg)?;
    let table = need(table, table_arg, when)?;
    Ok((starts, table, column0(table, n, table_arg)?))
}

fn spec_path<'a>(m: &GdnAttentionMetadata<'a>, t: usize) -> Result<Option<Path<'a>>, Error> {
    let ns = m.num_spec_decodes;
    if ns == 0 {
        return Ok(None);
    }
    let when = "with speculative sequences";
    fits("num_spec_decode_tokens", m.num_spec_decode_tokens, "mixed_qkv", t)?;
    let list = need(m.spec_token_indx, "spec_token_indx", when)?;
    let n = m.num_spec_decode_tokens;
    let rows = token_rows(list, n, "spec_token_indx", t)?;
    let (starts, slots, conv_slots) = starts_and_slots(
        (m.spec_query_start_loc, "spec_query_start_loc"),
        (m.spec_state_indices_tensor, "spec_state_indices_tensor"),
        (ns, "num_spec_decodes"),
        when,
    )?;
    Ok(Some(Path { route: Route::Speculative, n, rows, starts, slots, conv_slots }))
}

fn non_spec_path<'a>(m: &GdnAttentionMetadata<'a>, t: usize) -> Result<Option<Path<'a>>, Error> {
    let nn = add("num_prefills", m.num_decodes, m.num_prefills)?;
    if nn == 0 {
        return Ok(None);
    }
    let when = "with non-speculative sequences";
    let tokens = add("num_prefill_tokens", m.num_decode_tokens, m.num_prefill_tokens)?;
    fits("num_decode_tokens + num_prefill_tokens", tokens, "mixed_qkv", t)?;
    let rows = match (m.non_spec_token_indx, m.num_spec_decodes) {
        (Some(list), _) => token_rows(list, tokens, "non_spec_token_indx", t)?,
        (None, 0) => Rows::Range(0),
        (None, _) => return Err(core_err("non_spec_token_indx", "must be given with speculative sequences".into())),
    };
    let (starts, _, slots) = starts_and_slots(
        (m.non_spec_query_start_loc, "non_spec_query_start_loc"),
        (m.non_spec_state_indices_tensor, "non_spec_state_indices_tensor"),
        (nn, "num_prefills"),
        when,
    )?;
    let route = match (m.num_prefills, m.num_decodes == m.num_decode_tokens) {
        (0, true) => Route::DecodeStep,
        (0, false) => Route::Decode,
        _ => Route::Prefill,
    };
    Ok(Some(Path { route, n: tokens, rows, starts, slots, conv_slots: slots }))
}

/// Checks that `t` (`mixed_qkv`, `a`, `b`) is a `[≥ rows, ·]` tensor on `device`, contiguous
/// along its last axis (what `copy_rows` gathers and the row views address).
fn check_rows(t: &TensorRef<'_>, arg: &'static str, device: ssm_tensor::Device, rows: usize) -> Result<(), Error> {
    if t.device() != device || t.rank() != 2 || t.shape()[0] < rows || (t.strides()[1] != 1 && t.shape()[1] > 1) {
        return Err(core_err(
            arg,
            format!(
                "must be a [≥ {rows}, ·] tensor on {device} contiguous along its last axis, got {:?} / {:?} on {}",
                t.shape(),
                t.strides(),
                t.device()
            ),
        ));
    }
    Ok(())
}

/// Checks `core_attn_out`: a `[≥ T, HV, V]` tensor in the dtype and on the device of
/// `mixed_qkv`, each row contiguous (so it is also a `[≥ T, HV·V]` matrix of rows).
fn check_out(out: &TensorMut<'_>, d: Dims, x: &TensorRef<'_>, t: usize) -> Result<(), Error> {
    let io = x.dtype();
    let ok = out.device() == x.device()
        && out.dtype() == io
        && out.rank() == 3
        && out.shape()[0] >= t
        && out.shape()[1..] == [d.hv, d.vd]
        && (out.strides()[2] == 1 || d.vd <= 1)
        && (out.strides()[1] == d.vd as isize || d.hv <= 1);
    if !ok {
        return Err(core_err(
            "core_attn_out",
            format!(
                "must be a row-contiguous [≥ {t}, {}, {}] tensor of {io} on {}, got {:?} / {:?} of {} on {}",
                d.hv,
                d.vd,
                x.device(),
                out.shape(),
                out.strides(),
                out.dtype(),
                out.device()
            ),
        ));
    }
    Ok(())
}

/// Rows `[r0, r0 + n)` of a 2-D `[T, cols]` view.
fn row_range<'a>(t: TensorRef<'a>, r0: usize, n: usize, arg: &'static str) -> Result<TensorRef<'a>, Error> {
    let s = t.strides();
    let off = t.layout().offset() as isize + r0 as isize * s[0];
    t.with_layout(&[n, t.shape()[1]], s, off.max(0) as usize)
        .map_err(|e| core_err(arg, format!("cannot be viewed: {e}")))
}

/// `core_attn_out` `[T, HV, V]` seen as the `[T, HV·V]` matrix of its rows ([`check_out`]).
fn out_matrix(out: TensorMut<'_>, d: Dims) -> Result<TensorMut<'_>, Error> {
    let (t, s0, off) = (out.shape()[0], out.strides()[0], out.layout().offset());
    out.with_layout(&[t, d.hv * d.vd], &[s0, 1], off)
        .map_err(|e| core_err("core_attn_out", format!("cannot be viewed: {e}")))
}

/// Rows `[r0, r0 + n)` of an output matrix `[T, HV·V]` seen as the ops' `o` `[1, n, HV, V]`.
fn o_view(m: TensorMut<'_>, r0: usize, n: usize, d: Dims) -> Result<TensorMut<'_>, Error> {
    let s0 = m.strides()[0];
    let off = m.layout().offset() as isize + r0 as isize * s0;
    m.with_layout(&[1, n, d.hv, d.vd], &[0, s0, d.vd as isize, 1], off.max(0) as usize)
        .map_err(|e| core_err("core_attn_out", format!("cannot be viewed: {e}")))
}

/// q `[1, n, H, K]`, k `[1, n, H, K]` and v `[1, n, HV, V]` views of a conv output `[n, conv_dim]`.
fn qkv_views(x: TensorRef<'_>, d: Dims) -> Result<[TensorRef<'_>; 3], Error> {
    let n = x.shape()[0];
    let cd = d.conv_dim as isize;
    let view = |shape: &[usize], strides: &[isize], off: usize| {
        x.with_layout(shape, strides, off).map_err(|e| core_err("mixed_qkv", format!("cannot be viewed: {e}")))
    };
    Ok([
        view(&[1, n, d.h, d.kd], &[0, cd, d.kd as isize, 1], 0)?,
        view(&[1, n, d.h, d.kd], &[0, cd, d.kd as isize, 1], d.h * d.kd)?,
        view(&[1, n, d.hv, d.vd], &[0, cd, d.vd as isize, 1], 2 * d.h * d.kd)?,
    ])
}

/// Where one path's inputs and output rows are.
enum Source<'a> {
    /// Rows `[r0, r0 + n)` of the caller's tensors, used in place.
    Range(usize),
    /// Rows listed by an index: gathered into per-call `mixed_qkv`, `a`, `b` and
    /// `core_attn_out` buffers, the output rows scattered back after the ops.
    Gathered(TensorRef<'a>, Box<[Buffer; 4]>),
}

/// The per-call buffers of one path: its source rows, the conv output, and for prefills the
/// gating's `g` and `β`.
struct Buffers<'a> {
    source: Source<'a>,
    conv_out: Buffer,
    gating: Option<[Buffer; 2]>,
}

impl<'a> Buffers<'a> {
    fn new(rt: &Runtime, path: &Path<'a>, [mixed_qkv, a, b]: [&TensorRef<'_>; 3], d: Dims) -> Result<Self, Error> {
        let (n, io, dev) = (path.n, mixed_qkv.dtype(), mixed_qkv.device());
        let buf = |dtype, shape: &[usize]| rt.buffer("gdn_attention_core", dev, dtype, shape);
        Ok(Buffers {
            source: match path.rows {
                Rows::Range(r0) => Source::Range(r0),
                Rows::List(index) => Source::Gathered(
                    index,
                    Box::new([
                        buf(io, &[n, d.conv_dim])?,
                        buf(a.dtype(), &[n, d.hv])?,
                        buf(b.dtype(), &[n, d.hv])?,
                        buf(io, &[n, product("core_attn_out", &[d.hv, d.vd])?])?,
                    ]),
                ),
            },
            conv_out: buf(io, &[n, d.conv_dim])?,
            gating: match path.route {
                Route::Prefill => Some([buf(DType::F32, &[n, d.hv])?, buf(DType::F32, &[n, d.hv])?]),
                _ => None,
            },
        })
    }
}

/// The per-layer parameters every path uses.
struct Layer<'a> {
    /// `mixed_qkv`, `a`, `b`.
    inputs: [TensorRef<'a>; 3],
    conv_weight: TensorRef<'a>,
    conv_bias: Option<TensorRef<'a>>,
    activation: Activation,
    conv_state_layout: ConvStateLayout,
    a_log: TensorRef<'a>,
    dt_bias: TensorRef<'a>,
    ssm_state_layout: StateLayout,
    pad_slot_id: Option<i64>,
    num_accepted_tokens: Option<TensorRef<'a>>,
    has_initial_state: Option<TensorRef<'a>>,
    dims: Dims,
}

/// The pools and the output one path writes (aliases of the caller's views, see
/// [`crate::layer_core`]); `core_attn_out` as the `[T, HV·V]` matrix of its rows.
struct Writes<'a> {
    conv_state: TensorMut<'a>,
    ssm_state: TensorMut<'a>,
    core_attn_out: TensorMut<'a>,
}

impl Layer<'_> {
    /// The conv update of a path: its conv slots, with the accepted counts and token starts of
    /// a speculative path.
    fn conv_update<'s>(
        &'s self,
        x: TensorRef<'s>,
        conv_state: TensorMut<'s>,
        path: &'s Path<'s>,
        out: TensorMut<'s>,
    ) -> CausalConv1dUpdateArgs<'s> {
        let speculative = path.route == Route::Speculative;
        CausalConv1dUpdateArgs {
            x,
            conv_state,
            conv_state_layout: self.conv_state_layout,
            weight: self.conv_weight,
            bias: self.conv_bias,
            activation: self.activation,
            conv_state_indices: Some(path.conv_slots),
            num_accepted_tokens: if speculative { self.num_accepted_tokens } else { None },
            query_start_loc: speculative.then_some(path.starts),
            pad_slot_id: self.pad_slot_id,
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out,
        }
    }

    /// Plans one path's ops into `schedule`: the gathers of a listed path, the conv, (the
    /// gating,) the recurrence, then the scatter of its output rows.
    fn plan_path<'s>(
        &'s self,
        schedule: &mut Schedule<'s>,
        path: &'s Path<'s>,
        bufs: &'s mut Buffers<'s>,
        w: Writes<'s>,
    ) -> Result<(), Error> {
        let (d, n) = (self.dims, path.n);
        let speculative = path.route == Route::Speculative;
        let [mixed, a_in, b_in] = self.inputs;
        let mut scatter = None;
        let (x, a, b, o) = match &mut bufs.source {
            Source::Range(r0) => (
                row_range(mixed, *r0, n, "mixed_qkv")?,
                row_range(a_in, *r0, n, "a")?,
                row_range(b_in, *r0, n, "b")?,
                o_view(w.core_attn_out, *r0, n, d)?,
            ),
            Source::Gathered(index, bufs4) => {
                let [gx, ga, gb, go] = &mut **bufs4;
                let index = *index;
                let mut gather = |src: TensorRef<'s>, buf: &'s mut Buffer| -> Result<TensorRef<'s>, Error> {
                    // SAFETY: the gather writes the buffer, the ops after it read it, in schedule
                    // order (crate::layer_core).
                    let [dst, read] = unsafe { buf.view_mut().aliased() };
                    schedule.plan(CopyRowsArgs { src, dst, index, direction: RowDirection::Gather })?;
                    Ok(read.into_ref())
                };
                let (x, a, b) = (gather(mixed, gx)?, gather(a_in, ga)?, gather(b_in, gb)?);
                // The caller's output rows first, so that rows the ops skip go back unchanged.
                // SAFETY: that gather reads `core_attn_out`, the scatter writes it last.
                let [out_r, out_w] = unsafe { w.core_attn_out.aliased() };
                // SAFETY: the gather writes `go`, the recurrence writes it after, the scatter
                // reads it last, in schedule order.
                let [go_gather, go_op, go_scatter] = unsafe { go.view_mut().aliased() };
                let src = out_r.into_ref();
                schedule.plan(CopyRowsArgs { src, dst: go_gather, index, direction: RowDirection::Gather })?;
                scatter = Some(CopyRowsArgs {
                    src: go_scatter.into_ref(),
                    dst: out_w,
                    index,
                    direction: RowDirection::Scatter,
                });
                (x, a, b, o_view(go_op, 0, n, d)?)
            }
        };
        if path.route == Route::DecodeStep {
            let conv = self.conv_update(x, w.conv_state, path, bufs.conv_out.view_mut());
            let gates = GateInputs::new(self.a_log, a, b, self.dt_bias);
            // The path's `o` `[1, n, HV, V]` as the step's `[n, 1, HV, V]`.
            let (row, off) = (o.strides()[1], o.layout().offset());
            let o = o
                .with_layout(&[n, 1, d.hv, d.vd], &[row, row, d.vd as isize, 1], off)
                .map_err(|e| core_err("core_attn_out", format!("cannot be viewed: {e}")))?;
            schedule.plan(GdnDecodeStepArgs::new(
                conv,
                d.h,
                gates,
                w.ssm_state,
                Some(path.slots),
                self.ssm_state_layout,
                o,
            )?)?;
            if let Some(args) = scatter {
                schedule.plan(args)?;
            }
            return Ok(());
        }
        // SAFETY: the conv writes `conv_out` and the recurrence reads it after, in schedule
        // order (layer_core: steps run one at a time).
        let [conv_out_w, conv_out_r] = unsafe { bufs.conv_out.view_mut().aliased() };
        if path.route == Route::Prefill {
            schedule.plan(CausalConv1dFnArgs {
                x,
                weight: self.conv_weight,
                bias: self.conv_bias,
                conv_states: w.conv_state,
                conv_state_layout: self.conv_state_layout,
                query_start_loc: path.starts,
                cache_indices: Some(path.conv_slots),
                has_initial_state: self.has_initial_state,
                activation: self.activation,
                pad_slot_id: self.pad_slot_id,
                checkpoint_offsets: None,
                checkpoint_state_indices: None,
                out: conv_out_w,
            })?;
        } else {
            schedule.plan(self.conv_update(x, w.conv_state, path, conv_out_w))?;
        }
        let [q, k, v] = qkv_views(conv_out_r.into_ref(), d)?;
        if let Some([g, beta]) = bufs.gating.as_mut() {
            // SAFETY: the gating writes `g`/`β`, the chunked prefill reads them after, in
            // schedule order.
            let [g_w, g_r] = unsafe { g.view_mut().aliased() };
            // SAFETY: as for `g`.
            let [beta_w, beta_r] = unsafe { beta.view_mut().aliased() };
            let as3 = |t: TensorMut<'s>| {
                let t = t.into_ref();
                t.with_layout(&[1, n, d.hv], &[0, d.hv as isize, 1], 0)
                    .map_err(|e| core_err("a", format!("cannot be viewed: {e}")))
            };
            let (g3, beta3) = (as3(g_r)?, as3(beta_r)?);
            schedule.plan(FusedGdnGatingArgs {
                gates: GateInputs::new(self.a_log, a, b, self.dt_bias),
                g: g_w,
                beta_output: beta_w,
            })?;
            schedule.plan(ChunkGatedDeltaRuleArgs {
                q,
                k,
                v,
                g: g3,
                beta: beta3,
                scale: None,
                initial_state: Some(w.ssm_state),
                initial_state_indices: Some(path.slots),
                has_initial_state: self.has_initial_state,
                pad_slot_id: self.pad_slot_id,
                inplace_final_state: true,
                final_state: None,
                cu_seqlens: Some(path.starts),
                use_qk_l2norm_in_kernel: true,
                eps: 1e-6,
                state_layout: self.ssm_state_layout,
                o,
                scratch: None,
            })?;
        } else {
            schedule.plan(FusedSigmoidGatingDeltaRuleUpdateArgs {
                gates: GateInputs::new(self.a_log, a, b, self.dt_bias),
                rule: DeltaRuleArgs {
                    q,
                    k,
                    v,
                    scale: None,
                    initial_state: Some(w.ssm_state),
                    final_state: None,
                    cu_seqlens: Some(path.starts),
                    ssm_state_indices: Some(path.slots),
                    num_accepted_tokens: if speculative { self.num_accepted_tokens } else { None },
                    use_qk_l2norm_in_kernel: true,
                    eps: 1e-6,
                    state_layout: self.ssm_state_layout,
                    o,
                },
            })?;
        }
        if let Some(args) = scatter {
            schedule.plan(args)?;
        }
        Ok(())
    }
}

impl Runtime {
    /// The GDN attention core of one layer over a mixed batch (speculative sequences, decodes,
    /// prefills): conv1d, then the gated delta rule, outputs scattered back in token order
    /// ([`GdnAttentionCoreArgs`], module docs for the deviations from vLLM). Writes
    /// `core_attn_out` rows of sequences that are not skipped, and the conv and SSM slots the
    /// metadata names. Runs on the backend of the device of `mixed_qkv` (host or CUDA); on
    /// CUDA it queues its kernels on the backend's stream and does not wait for them.
    ///
    /// Errors ([`Error::Core`] for the metadata and `core_attn_out`, else the error of the op
    /// that refuses its part): every op is planned, once, before any runs, so on an error
    /// nothing is written.
    pub fn gdn_attention_core(&self, args: GdnAttentionCoreArgs<'_>) -> Result<(), Error> {
        let GdnAttentionCoreArgs {
            mixed_qkv,
            b,
            a,
            conv_weight,
            conv_bias,
            activation,
            conv_state,
            conv_state_layout,
            ssm_state,
            ssm_state_layout,
            a_log,
            dt_bias,
            num_k_heads,
            pad_slot_id,
            metadata: m,
            core_attn_out,
        } = args;
        let dims = Dims::of(&mixed_qkv, &ssm_state, ssm_state_layout, num_k_heads)?;
        let t = mixed_qkv.shape()[0];
        for (arg, x) in [("mixed_qkv", &mixed_qkv), ("a", &a), ("b", &b)] {
            check_rows(x, arg, mixed_qkv.device(), t)?;
        }
        let paths = [spec_path(&m, t)?, non_spec_path(&m, t)?];
        // The output rows the paths can write: a range's end, or any row of the batch.
        let touched = paths
            .iter()
            .flatten()
            .map(|p| match p.rows {
                Rows::Range(r0) => r0 + p.n,
                Rows::List(_) => t,
            })
            .max()
            .unwrap_or(0);
        check_out(&core_attn_out, dims, &mixed_qkv, touched)?;
        let mut bufs = paths
            .iter()
            .map(|p| p.as_ref().map(|p| Buffers::new(self, p, [&mixed_qkv, &a, &b], dims)).transpose())
            .collect::<Result<Vec<_>, Error>>()?;
        let core_attn_out = out_matrix(core_attn_out, dims)?;
        let layer = Layer {
            inputs: [mixed_qkv, a, b],
            conv_weight,
            conv_bias,
            activation,
            conv_state_layout,
            a_log,
            dt_bias,
            ssm_state_layout,
            pad_slot_id,
            num_accepted_tokens: m.num_accepted_tokens,
            has_initial_state: m.has_initial_state,
            dims,
        };
        // SAFETY: the two paths' conv ops write `conv_state` one after the other (schedule
        // order); their planned slot sets are the speculative and the non-speculative tables.
        let conv_state: [TensorMut<'_>; 2] = unsafe { conv_state.aliased() };
        // SAFETY: as for `conv_state`: the two recurrences write `ssm_state` in turn.
        let ssm_state: [TensorMut<'_>; 2] = unsafe { ssm_state.aliased() };
        // SAFETY: each path's scatter step writes its own token rows of `core_attn_out`, in turn.
        let core_attn_out: [TensorMut<'_>; 2] = unsafe { core_attn_out.aliased() };
        let mut schedule = Schedule::new();
        let writes = conv_state.into_iter().zip(ssm_state).zip(core_attn_out);
        for ((path, bufs), ((conv_state, ssm_state), core_attn_out)) in paths.iter().zip(bufs.iter_mut()).zip(writes) {
            if let (Some(path), Some(bufs)) = (path, bufs) {
                layer.plan_path(&mut schedule, path, bufs, Writes { conv_state, ssm_state, core_attn_out })?;
            }
        }
        schedule.run(self)
    }
}
