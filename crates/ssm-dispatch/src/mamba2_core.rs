//! The Mamba2 mixer core: one call per layer for a mixed batch, the counterpart of the
//! state-space part of vLLM's `MambaMixer2.forward` (semantics/ssd_mamba2.md §7): decode
//! tokens first, then prefill tokens; causal conv1d (update for decode rows, with the
//! speculative rolling buffer when `num_accepted_tokens` is given; varlen prefill for the
//! rest), then `selective_state_update` for the decode rows and the SSD chunked scan for the
//! prefill sequences, whose initial states come from the pool where `has_initial_states_p`
//! and whose final states go back into their slots.
//!
//! The in-projection, the gated RMSNorm and the out-projection stay with the model: the core
//! takes the `xBC` and `dt` columns of the in-projection and writes the SSM output `y`
//! (`[T, H, P]`, before the norm).
//!
//! Prefix caching in vLLM's `"all"` mode (per-token block tables, intermediate chunk states
//! written to several blocks) is not supported: the metadata has no `block_idx_*` fields, and
//! each sequence reads and writes one slot (`"none"` and `"align"` modes).
//!
//! Allocation: with `conv_out` given, a batch without prefills and without pad rows allocates
//! nothing (the conv writes `conv_out`, the SSU reads views of it and writes `out`); pad rows
//! cost a small buffer of the `out` rows they keep; the prefill path allocates the initial and
//! final states of its sequences and the SSD workspace.

use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_ssd::MambaChunkScanCombinedVarlen;
use ssm_ssu::SelectiveStateUpdate;
use ssm_tensor::{Device, HostTensor, TensorMut, TensorRef};

use crate::{Error, Runtime};
use ssm_tensor::Op;

/// vLLM's `Mamba2AttentionMetadata` (the fields the core reads, `"none"`/`"align"` cache
/// modes). Index tensors are host `i32`/`i64`; `has_initial_states_p` is bool. Tokens are
/// ordered decodes first, then prefills.
#[derive(Clone, Copy)]
pub struct Mamba2AttentionMetadata<'a> {
    /// Prefill sequences.
    pub num_prefills: usize,
    /// Tokens of the prefill sequences.
    pub num_prefill_tokens: usize,
    /// Decode sequences.
    pub num_decodes: usize,
    /// Tokens of the decode sequences (`num_decodes`, or more with speculative drafts).
    pub num_decode_tokens: usize,
    /// `[num_prefills + 1]` token starts of the prefills, relative to the first prefill token.
    pub query_start_loc_p: Option<TensorRef<'a>>,
    /// `[num_prefills]`: `num_computed_tokens > 0` per prefill.
    pub has_initial_states_p: Option<TensorRef<'a>>,
    /// Whether any prefill has an initial state (vLLM passes `initial_states=None` otherwise).
    pub prep_initial_states: bool,
    /// SSD chunk size (the model's `chunk_size`).
    pub chunk_size: usize,
    /// `[num_chunks]` prefill index of each chunk ([`ssm_ssd::compute_chunk_metadata`]).
    pub seq_idx_p: Option<TensorRef<'a>>,
    /// `[num_chunks + 1]` chunk starts in the prefill tokens.
    pub cu_chunk_seqlen_p: Option<TensorRef<'a>>,
    /// `[num_prefills]` last chunk of each prefill.
    pub last_chunk_indices_p: Option<TensorRef<'a>>,
    /// `[num_prefills]` slot of each prefill (read when it has an initial state, written after).
    pub state_indices_tensor_p: Option<TensorRef<'a>>,
    /// `[num_decodes]`, or `[num_decodes, 1 + num_spec]` with speculative decoding (column 0
    /// holds the conv rolling buffer and the state read; column t the state after token t).
    pub state_indices_tensor_d: Option<TensorRef<'a>>,
    /// `[num_decodes + 1]` token starts of the decodes (speculative decoding only).
    pub query_start_loc_d: Option<TensorRef<'a>>,
    /// `[num_decodes]` accepted tokens of the previous step, bonus included (speculative only).
    pub num_accepted_tokens: Option<TensorRef<'a>>,
}

/// One layer's Mamba2 mixer core call.
pub struct Mamba2MixerCoreArgs<'a> {
    /// `[≥ T, conv_dim]` the `xBC` columns of the in-projection (`conv_dim = H·P + 2·G·N`), before
    /// the conv; rows past `T = num_decode_tokens + num_prefill_tokens` are ignored (padding).
    pub xbc: TensorRef<'a>,
    /// `[≥ T, H]` the raw `dt` columns of the in-projection (before `dt_bias` and softplus).
    pub dt: TensorRef<'a>,
    /// `[conv_dim, width]` conv weight.
    pub conv_weight: TensorRef<'a>,
    /// `[conv_dim]` conv bias.
    pub conv_bias: Option<TensorRef<'a>>,
    /// Conv activation (silu for Mamba2).
    pub activation: Activation,
    /// Conv-state pool (`state_len = width − 1`, `+ num_spec` with speculative decoding).
    pub conv_state: TensorMut<'a>,
    /// Axis order of `conv_state`.
    pub conv_state_layout: ConvStateLayout,
    /// SSM-state pool `[slots, H, P, N]` (f32, bf16 or f16); the SSD returns its states in this dtype.
    pub ssm_state: TensorMut<'a>,
    /// `[H]` f32, vLLM's `A = −exp(A_log)`.
    pub a: TensorRef<'a>,
    /// `[H]` skip term, optional.
    pub d: Option<TensorRef<'a>>,
    /// `[H]` added to `dt` before softplus, optional.
    pub dt_bias: Option<TensorRef<'a>>,
    /// Groups `G` of `B`/`C` on this rank (`H` a multiple of `G`).
    pub num_groups: usize,
    /// The pad (null block) value of the slot tables. A decode whose (column-0) slot is the pad,
    /// and a prefill whose slot is the pad, is skipped: no slot is read or written and its `out`
    /// rows keep the caller's values (vLLM computes garbage there from a zero state and an
    /// unwritten conv output; the core keeps the rows instead, so they do not depend on scratch).
    pub pad_slot_id: Option<i64>,
    /// The batch description.
    pub metadata: Mamba2AttentionMetadata<'a>,
    /// Optional `[≥ T, conv_dim]` buffer (dtype of `xbc`) for the conv output; without it the
    /// core allocates one per call.
    pub conv_out: Option<TensorMut<'a>>,
    /// Output `y` `[≥ T, H, P]`, the dtype of `xbc`.
    pub out: TensorMut<'a>,
}

fn core_err(arg: &'static str, problem: String) -> Error {
    Error::Core { arg, problem }
}

fn need<'a>(t: Option<TensorRef<'a>>, arg: &'static str, when: &str) -> Result<TensorRef<'a>, Error> {
    t.ok_or_else(|| core_err(arg, format!("must be given {when}")))
}

/// Rows `[r0, r0 + n)` of a tensor whose first axis is the token axis, with the trailing axes
/// given by `tail_shape`/`tail_strides` (element units) from the row start plus `col0`.
fn rows_ref<'a>(
    t: TensorRef<'a>,
    arg: &'static str,
    r0: usize,
    n: usize,
    col0: usize,
    tail_shape: &[usize],
    tail_strides: &[isize],
) -> Result<TensorRef<'a>, Error> {
    let (s0, s1) = (t.strides()[0], t.strides().get(1).copied().unwrap_or(1));
    let off = t.layout().offset() as isize + r0 as isize * s0 + col0 as isize * s1;
    let mut shape = vec![n];
    shape.extend_from_slice(tail_shape);
    let mut strides = vec![s0];
    strides.extend(tail_strides.iter().map(|&s| s * s1));
    t.with_layout(&shape, &strides, off.max(0) as usize).map_err(|e| core_err(arg, format!("cannot be viewed: {e}")))
}

fn rows_mut<'a>(t: TensorMut<'a>, arg: &'static str, r0: usize, n: usize) -> Result<TensorMut<'a>, Error> {
    let shape = t.shape().to_vec();
    let strides = t.strides().to_vec();
    let off = t.layout().offset() as isize + r0 as isize * strides[0];
    let mut s = shape;
    s[0] = n;
    t.with_layout(&s, &strides, off.max(0) as usize).map_err(|e| core_err(arg, format!("cannot be viewed: {e}")))
}

/// Host `[n]` integer list.
fn ints(t: &TensorRef<'_>, n: usize, arg: &'static str) -> Result<Vec<i64>, Error> {
    if t.host_bytes().is_none() {
        return Err(core_err(arg, format!("must be a host tensor, got one on {}", t.device())));
    }
    if t.rank() != 1 || t.shape()[0] < n {
        return Err(core_err(arg, format!("must have shape [{n}], got {:?}", t.shape())));
    }
    (0..n).map(|i| t.get_i64(&[i]).map_err(|e| core_err(arg, format!("cannot be read: {e}")))).collect()
}

/// `x` `[rows, H, P]`, `B` and `C` `[rows, G, N]` of rows `[r0, r0 + rows)` of the conv output.
fn ssm_inputs(
    co: TensorRef<'_>,
    r0: usize,
    rows: usize,
    [h, p, g, n]: [usize; 4],
) -> Result<[TensorRef<'_>; 3], Error> {
    let (pp, nn) = (p as isize, n as isize);
    Ok([
        rows_ref(co, "conv_out", r0, rows, 0, &[h, p], &[pp, 1])?,
        rows_ref(co, "conv_out", r0, rows, h * p, &[g, n], &[nn, 1])?,
        rows_ref(co, "conv_out", r0, rows, h * p + g * n, &[g, n], &[nn, 1])?,
    ])
}

/// A per-head `[H]` parameter broadcast to the SSU's tied `[H, P]` form (stride 0 on P).
fn per_head<'a>(
    t: Option<TensorRef<'a>>,
    arg: &'static str,
    h: usize,
    p: usize,
) -> Result<Option<TensorRef<'a>>, Error> {
    t.map(|t| {
        if t.shape() != [h] {
            return Err(core_err(arg, format!("must have shape [{h}], got {:?}", t.shape())));
        }
        let s = t.strides()[0];
        t.with_layout(&[h, p], &[s, 0], t.layout().offset())
            .map_err(|e| core_err(arg, format!("cannot be viewed: {e}")))
    })
    .transpose()
}

/// Bytes of rows `rows` of a host `[T, H, P]` tensor, `width = H·P` elements each, in order
/// (each row read element by element through its layout).
fn save_rows(out: &TensorMut<'_>, rows: &[usize], width: usize) -> Vec<u8> {
    let es = out.dtype().size();
    let (layout, p) = (*out.layout(), out.shape()[2]);
    let Some(bytes) = out.as_ref().host_bytes() else { return Vec::new() };
    let mut kept = Vec::with_capacity(rows.len() * width * es);
    for &r in rows {
        for e in 0..width {
            let at = layout.index(&[r, e / p, e % p]) * es;
            kept.extend_from_slice(&bytes[at..at + es]);
        }
    }
    kept
}

/// Writes back what [`save_rows`] kept.
fn restore_rows(out: &mut TensorMut<'_>, rows: &[usize], width: usize, kept: &[u8]) {
    let es = out.dtype().size();
    let (layout, p) = (*out.layout(), out.shape()[2]);
    let Some(bytes) = out.host_bytes_mut() else { return };
    for (i, &r) in rows.iter().enumerate() {
        for e in 0..width {
            let at = layout.index(&[r, e / p, e % p]) * es;
            let from = (i * width + e) * es;
            bytes[at..at + es].copy_from_slice(&kept[from..from + es]);
        }
    }
}

/// Everything one core call works on, checked; [`Runtime::mixer_steps`] runs over it twice.
struct Steps<'a, 'b> {
    m: Mamba2AttentionMetadata<'a>,
    xbc: TensorRef<'a>,
    dt: TensorRef<'a>,
    conv_weight: TensorRef<'a>,
    conv_bias: Option<TensorRef<'a>>,
    activation: Activation,
    conv_state: TensorMut<'a>,
    conv_state_layout: ConvStateLayout,
    ssm_state: TensorMut<'a>,
    a: TensorRef<'a>,
    d: Option<TensorRef<'a>>,
    dt_bias: Option<TensorRef<'a>>,
    pad_slot_id: Option<i64>,
    conv_out: TensorMut<'b>,
    out: TensorMut<'a>,
    /// `[H, P, G, N]`.
    dims: [usize; 4],
    /// Prefill slots and whether each reads its slot.
    prefill: Option<(Vec<i64>, Vec<bool>)>,
    /// `out` rows of pad decodes and pad prefills, kept across the call.
    pad_rows: Vec<usize>,
    /// `[num_prefills, H, P, N]` initial states (with `prep_initial_states`) and final states.
    initial: Option<HostTensor>,
    finals: HostTensor,
}

impl Runtime {
    /// The Mamba2 mixer core of one layer over a mixed batch (decodes, then prefills): conv1d,
    /// then the SSU for decode rows and the SSD for prefill sequences ([`Mamba2MixerCoreArgs`],
    /// module docs). Writes `out` rows of every sequence that is not a pad, the conv and SSM
    /// slots the metadata names, and `conv_out` when given. Host tensors only (the metadata is
    /// read on the host).
    ///
    /// Errors ([`Error::Core`] for the metadata, else the error of the op that refuses its part):
    /// every op's plan runs before any op does, so on an error nothing is written.
    pub fn mamba2_mixer_core(&self, args: Mamba2MixerCoreArgs<'_>) -> Result<(), Error> {
        if args.xbc.device() != Device::Cpu {
            return Err(Error::Unsupported { backend: "cuda", what: "mamba2_mixer_core" });
        }
        let Mamba2MixerCoreArgs {
            xbc,
            dt,
            conv_weight,
            conv_bias,
            activation,
            conv_state,
            conv_state_layout,
            ssm_state,
            a,
            d,
            dt_bias,
            num_groups,
            pad_slot_id,
            metadata: m,
            conv_out,
            out,
        } = args;
        let st = ssm_state.shape().to_vec();
        let [slots, h, p, n] = st[..] else {
            return Err(core_err("ssm_state", format!("must have shape [slots, H, P, N], got {st:?}")));
        };
        if num_groups == 0 || h % num_groups != 0 {
            return Err(core_err("num_groups", format!("must divide the heads H = {h}, got {num_groups}")));
        }
        let g = num_groups;
        let conv_dim = h * p + 2 * g * n;
        let (td, tp) = (m.num_decode_tokens, m.num_prefill_tokens);
        let total = td + tp;
        if xbc.rank() != 2 || xbc.shape()[1] != conv_dim || xbc.shape()[0] < total {
            return Err(core_err(
                "xbc",
                format!("must have shape [≥ {total}, H·P + 2·G·N = {conv_dim}], got {:?}", xbc.shape()),
            ));
        }
        if dt.rank() != 2 || dt.shape()[1] != h || dt.shape()[0] < total {
            return Err(core_err("dt", format!("must have shape [≥ {total}, H = {h}], got {:?}", dt.shape())));
        }
        if out.rank() != 3 || out.shape()[1..] != [h, p] || out.shape()[0] < total {
            return Err(core_err("out", format!("must have shape [≥ {total}, {h}, {p}], got {:?}", out.shape())));
        }
        if a.shape() != [h] {
            return Err(core_err("a", format!("must have shape [{h}], got {:?}", a.shape())));
        }
        if m.num_decodes > td || (m.num_decodes == 0) != (td == 0) {
            return Err(core_err(
                "num_decode_tokens",
                format!("must be ≥ num_decodes = {} and 0 only without decodes, got {td}", m.num_decodes),
            ));
        }
        if m.num_prefills > tp || (m.num_prefills == 0) != (tp == 0) {
            return Err(core_err(
                "num_prefill_tokens",
                format!("must be ≥ num_prefills = {} and 0 only without prefills, got {tp}", m.num_prefills),
            ));
        }
        if m.num_decodes > 0 && m.query_start_loc_d.is_none() && td != m.num_decodes {
            return Err(core_err(
                "query_start_loc_d",
                format!("must be given when decodes have more than one token ({td} tokens, {} decodes)", m.num_decodes),
            ));
        }
        if m.num_decodes > 0 && m.state_indices_tensor_d.is_none() {
            return Err(core_err("state_indices_tensor_d", "must be given with decodes".into()));
        }
        let sdt = ssm_state.dtype();
        let np = m.num_prefills;
        let mut pad_rows = Vec::new();
        if let (Some(table), Some(pad)) = (m.state_indices_tensor_d, pad_slot_id) {
            let nd = m.num_decodes;
            if let Some(q) = m.query_start_loc_d
                && (q.host_bytes().is_none() || q.rank() != 1 || q.shape()[0] < nd + 1)
            {
                return Err(core_err("query_start_loc_d", format!("must be a host [{}], got {:?}", nd + 1, q.shape())));
            }
            // Decode i's first row (read in place: the decode path allocates nothing for this).
            let start = |i: usize| -> Result<usize, Error> {
                match m.query_start_loc_d {
                    Some(q) => q
                        .get_i64(&[i])
                        .map(|v| v.max(0) as usize)
                        .map_err(|e| core_err("query_start_loc_d", format!("cannot be read: {e}"))),
                    None => Ok(i),
                }
            };
            if table.host_bytes().is_none() || table.rank() == 0 || table.shape()[0] < nd {
                return Err(core_err(
                    "state_indices_tensor_d",
                    format!("must be a host [{nd}] or [{nd}, 1 + num_spec] table, got {:?}", table.shape()),
                ));
            }
            for i in 0..nd {
                let at: &[usize] = if table.rank() == 2 { &[i, 0] } else { &[i] };
                let slot = table
                    .get_i64(at)
                    .map_err(|e| core_err("state_indices_tensor_d", format!("cannot be read: {e}")))?;
                if slot == pad {
                    pad_rows.extend(start(i)?..start(i + 1)?.min(td));
                }
            }
        }
        let prefill = if np > 0 {
            let slots_p = need(m.state_indices_tensor_p, "state_indices_tensor_p", "with prefills")?;
            let slot_list = ints(&slots_p, np, "state_indices_tensor_p")?;
            let has_init = match (m.prep_initial_states, m.has_initial_states_p) {
                (false, _) => vec![false; np],
                (true, None) => {
                    return Err(core_err("has_initial_states_p", "must be given with prep_initial_states".into()));
                }
                (true, Some(t)) => ints(&t, np, "has_initial_states_p")?.into_iter().map(|v| v != 0).collect(),
            };
            for (i, &s) in slot_list.iter().enumerate() {
                if pad_slot_id != Some(s) && (s < 0 || s as usize >= slots) {
                    return Err(core_err(
                        "state_indices_tensor_p",
                        format!("entry {i} = {s} must be a slot in [0, {slots}) or the pad"),
                    ));
                }
            }
            let qsl = need(m.query_start_loc_p, "query_start_loc_p", "with prefills")?;
            let starts = ints(&qsl, np + 1, "query_start_loc_p")?;
            if starts[0] != 0 || starts[np] != tp as i64 || starts.windows(2).any(|w| w[1] < w[0]) {
                return Err(core_err(
                    "query_start_loc_p",
                    format!("must rise from 0 to num_prefill_tokens = {tp}, got {starts:?}"),
                ));
            }
            // Pad prefills are skipped: the SSD computes every sequence, so the caller's `out`
            // rows of pad prefills are kept across it.
            pad_rows.extend(
                slot_list
                    .iter()
                    .enumerate()
                    .filter(|&(_, &s)| pad_slot_id == Some(s))
                    .flat_map(|(i, _)| td + starts[i] as usize..td + starts[i + 1] as usize),
            );
            let layout = ssm_state.layout();
            let dense = layout.strides()[3] == 1
                && layout.strides()[2] == n as isize
                && layout.strides()[1] == (p * n) as isize;
            if !dense {
                return Err(core_err(
                    "ssm_state",
                    format!("must be dense within a slot ([H, P, N] row-major), got strides {:?}", layout.strides()),
                ));
            }
            Some((slot_list, has_init))
        } else {
            None
        };
        let mut owned_conv_out;
        let conv_out = match conv_out {
            Some(c) => c,
            None => {
                owned_conv_out = HostTensor::filled(xbc.dtype(), vec![total, conv_dim], 0.0);
                owned_conv_out.view_mut()
            }
        };
        if conv_out.rank() != 2 || conv_out.shape()[1] != conv_dim || conv_out.shape()[0] < total {
            return Err(core_err(
                "conv_out",
                format!("must have shape [≥ {total}, {conv_dim}], got {:?}", conv_out.shape()),
            ));
        }
        let mut steps = Steps {
            m,
            xbc,
            dt,
            conv_weight,
            conv_bias,
            activation,
            conv_state,
            conv_state_layout,
            ssm_state,
            a,
            d,
            dt_bias,
            pad_slot_id,
            conv_out,
            out,
            dims: [h, p, g, n],
            initial: (np > 0 && m.prep_initial_states).then(|| HostTensor::filled(sdt, vec![np, h, p, n], 0.0)),
            finals: HostTensor::filled(sdt, vec![np, h, p, n], 0.0),
            prefill,
            pad_rows,
        };
        self.mixer_steps(&mut steps, true)?;
        let kept = save_rows(&steps.out, &steps.pad_rows, h * p);
        let result = self.mixer_steps(&mut steps, false);
        restore_rows(&mut steps.out, &steps.pad_rows, h * p, &kept);
        result
    }

    /// The core's steps in order. `plan_only`: build every op's arguments and run its plan (the
    /// checks), writing nothing; else run the ops.
    fn mixer_steps(&self, s: &mut Steps<'_, '_>, plan_only: bool) -> Result<(), Error> {
        let m = s.m;
        let [h, p, _, n] = s.dims;
        let conv_dim = s.xbc.shape()[1];
        let (td, tp) = (m.num_decode_tokens, m.num_prefill_tokens);
        if m.num_decodes > 0 {
            let table = m.state_indices_tensor_d;
            let conv = CausalConv1dUpdateArgs {
                x: rows_ref(s.xbc, "xbc", 0, td, 0, &[conv_dim], &[1])?,
                conv_state: s.conv_state.reborrow(),
                conv_state_layout: s.conv_state_layout,
                weight: s.conv_weight,
                bias: s.conv_bias,
                activation: s.activation,
                conv_state_indices: table,
                num_accepted_tokens: m.num_accepted_tokens,
                query_start_loc: m.query_start_loc_d,
                pad_slot_id: s.pad_slot_id,
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out: rows_mut(s.conv_out.reborrow(), "conv_out", 0, td)?,
            };
            if plan_only {
                Op::plan(&conv)?;
            } else {
                self.causal_conv1d_update(conv)?;
            }
            let [x, b, c] = ssm_inputs(s.conv_out.as_ref(), 0, td, s.dims)?;
            // The tied Mamba2 forms: dt, A, D and dt_bias broadcast over P (and N) with stride 0.
            let a3 =
                s.a.with_layout(&[h, p, n], &[s.a.strides()[0], 0, 0], s.a.layout().offset())
                    .map_err(|e| core_err("a", format!("cannot be viewed: {e}")))?;
            let ssu = SelectiveStateUpdate {
                state: s.ssm_state.reborrow(),
                x,
                dt: rows_ref(s.dt, "dt", 0, td, 0, &[h, p], &[1, 0])?,
                a: a3,
                b,
                c,
                d: per_head(s.d, "d", h, p)?,
                dt_bias: per_head(s.dt_bias, "dt_bias", h, p)?,
                z: None,
                dt_softplus: true,
                state_batch_indices: table,
                dst_state_batch_indices: None,
                pad_slot_id: s.pad_slot_id,
                out: rows_mut(s.out.reborrow(), "out", 0, td)?,
                num_accepted_tokens: m.num_accepted_tokens,
                cu_seqlens: m.query_start_loc_d,
                stochastic_rounding: None,
            };
            if plan_only {
                Op::plan(&ssu)?;
            } else {
                self.selective_state_update(ssu)?;
            }
        }
        let Some((slot_list, has_init)) = &s.prefill else { return Ok(()) };
        let qsl = need(m.query_start_loc_p, "query_start_loc_p", "with prefills")?;
        let conv = CausalConv1dFnArgs {
            x: rows_ref(s.xbc, "xbc", td, tp, 0, &[conv_dim], &[1])?,
            weight: s.conv_weight,
            bias: s.conv_bias,
            conv_states: s.conv_state.reborrow(),
            conv_state_layout: s.conv_state_layout,
            query_start_loc: qsl,
            cache_indices: m.state_indices_tensor_p,
            has_initial_state: if m.prep_initial_states { m.has_initial_states_p } else { None },
            activation: s.activation,
            pad_slot_id: s.pad_slot_id,
            out: rows_mut(s.conv_out.reborrow(), "conv_out", td, tp)?,
        };
        if plan_only {
            Op::plan(&conv)?;
        } else {
            self.causal_conv1d_fn(conv)?;
        }
        let es = s.ssm_state.dtype().size();
        let block = h * p * n * es;
        let layout = *s.ssm_state.layout();
        if let (Some(init), false) = (s.initial.as_mut(), plan_only) {
            let pool = s
                .ssm_state
                .as_ref()
                .host_bytes()
                .ok_or_else(|| core_err("ssm_state", "must be a host tensor".into()))?;
            for (i, (&slot, &has)) in slot_list.iter().zip(has_init).enumerate() {
                let dst = &mut init.bytes_mut()[i * block..(i + 1) * block];
                if has && s.pad_slot_id != Some(slot) {
                    let at = layout.index(&[slot as usize, 0, 0, 0]) * es;
                    dst.copy_from_slice(&pool[at..at + block]);
                } else {
                    dst.fill(0);
                }
            }
        }
        let [x, b, c] = ssm_inputs(s.conv_out.as_ref(), td, tp, s.dims)?;
        let ssd = MambaChunkScanCombinedVarlen {
            x,
            dt: rows_ref(s.dt, "dt", td, tp, 0, &[h], &[1])?,
            a: s.a,
            b,
            c,
            chunk_size: m.chunk_size,
            cu_seqlens: qsl,
            cu_chunk_seqlens: need(m.cu_chunk_seqlen_p, "cu_chunk_seqlen_p", "with prefills")?,
            last_chunk_indices: need(m.last_chunk_indices_p, "last_chunk_indices_p", "with prefills")?,
            seq_idx: need(m.seq_idx_p, "seq_idx_p", "with prefills")?,
            out: Some(rows_mut(s.out.reborrow(), "out", td, tp)?),
            d: s.d,
            z: None,
            dt_bias: s.dt_bias,
            initial_states: s.initial.as_ref().map(HostTensor::view),
            dt_softplus: true,
            dt_limit: (0.0, f32::INFINITY),
            return_intermediate_states: false,
            state_dtype: Some(s.ssm_state.dtype()),
            varlen_states: s.finals.view_mut(),
            workspace: None,
        };
        if plan_only {
            Op::plan(&ssd)?;
            return Ok(());
        }
        self.mamba_chunk_scan_combined_varlen(ssd)?;
        let pool = s.ssm_state.host_bytes_mut().ok_or_else(|| core_err("ssm_state", "must be a host tensor".into()))?;
        for (i, &slot) in slot_list.iter().enumerate() {
            if s.pad_slot_id != Some(slot) {
                let at = layout.index(&[slot as usize, 0, 0, 0]) * es;
                pool[at..at + block].copy_from_slice(&s.finals.bytes()[i * block..(i + 1) * block]);
            }
        }
        Ok(())
    }
}
