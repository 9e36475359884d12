//! The Mamba2 mixer core: one call per layer for a mixed batch, the counterpart of the
//! state-space part of vLLM's `MambaMixer2.forward` (semantics/ssd_mamba2.md §7): decode
//! tokens first, then prefill tokens; causal conv1d (update for decode rows, with the
//! speculative rolling buffer when `num_accepted_tokens` is given; varlen prefill for the
//! rest), then `selective_state_update` for the decode rows and the SSD chunked scan for the
//! prefill sequences, which reads its initial states from the pool where
//! `has_initial_states_p` and writes its final states back into their slots, through the slot
//! table (no copy into a temporary and back).
//!
//! The in-projection, the gated RMSNorm and the out-projection stay with the model: the core
//! takes the `xBC` and `dt` columns of the in-projection and writes the SSM output `y`
//! (`[T, H, P]`, before the norm).
//!
//! Prefix caching in vLLM's `"all"` mode (per-token block tables, intermediate chunk states
//! written to several blocks) is not supported: the metadata has no `block_idx_*` fields, and
//! each sequence reads and writes one slot (`"none"` and `"align"` modes). vLLM 0.33's
//! mid-prefill checkpoints are: with `checkpoint_offsets_p` / `checkpoint_state_indices_p` /
//! `checkpoint_chunk_indices_p` a prefill also writes its conv state and its SSM state after its
//! first `offset` tokens into the checkpoint's slot of each pool (`store_prefill_checkpoint`),
//! inside the conv and SSD calls.
//!
//! Where it runs: host tensors on the CPU backend, device tensors on the CUDA backend. The
//! metadata's counts are host integers; its index tensors live with the data (on the device for
//! a device call, as vLLM keeps them), where the kernels check their values.
//!
//! Pad sequences (slot `pad_slot_id`) read and write no slot. With host index tensors the core
//! also keeps their `out` rows (it reads the slot tables to find them, saves the rows and
//! restores them after the ops). With device index tensors it cannot find them without a host
//! sync, so their `out` rows hold what the SSU and the SSD compute for a pad (vLLM's behaviour:
//! the output of a zero state over the pad's conv output rows, which the conv leaves
//! unwritten; 0 with the core's own conv buffer).
//!
//! Allocation: with `conv_out` given, a batch without prefills and without pad rows allocates
//! nothing (the conv writes `conv_out`, the SSU reads views of it and writes `out`); pad rows
//! cost a small host buffer of the `out` rows they keep; the prefill path allocates the SSD
//! scratch (on the device, stream-ordered).

use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_ssd::MambaChunkScanCombinedVarlenArgs;
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{TensorMut, TensorRef};

use crate::layer_core::{Schedule, add, core_err, host_ints, need, product};
use crate::{Error, Runtime};

/// vLLM's `Mamba2AttentionMetadata` (the fields the core reads, `"none"`/`"align"` cache
/// modes). Index tensors are `i32`/`i64` (`has_initial_states_p` is bool) on the device of the
/// call's data: host tensors for a host call, device tensors for a device call. Tokens are
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
    /// `[num_prefills]` prefix-caching checkpoints (vLLM 0.33's `checkpoint_meta.checkpoint_offsets`):
    /// tokens into each prefill's new tokens, 0 for none. Given together with
    /// `checkpoint_state_indices_p` and `checkpoint_chunk_indices_p`; the conv writes the conv
    /// state there and the SSD the SSM state.
    pub checkpoint_offsets_p: Option<TensorRef<'a>>,
    /// `[num_prefills]` the slot of both pools each checkpoint goes to (vLLM's
    /// `checkpoint_meta.state_indices`), not the prefill's own slot.
    pub checkpoint_state_indices_p: Option<TensorRef<'a>>,
    /// `[num_prefills]` the SSD chunk ending at each checkpoint, −1 for none (vLLM's
    /// `checkpoint_chunk_idx`: [`ssm_ssd::compute_chunk_metadata_with_checkpoints`] over the
    /// same offsets gives it and the chunk metadata above).
    pub checkpoint_chunk_indices_p: Option<TensorRef<'a>>,
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
    /// and a prefill whose slot is the pad, is skipped: no slot is read or written. With host
    /// index tensors its `out` rows keep the caller's values (vLLM computes garbage there from a
    /// zero state and an unwritten conv output; the core keeps the rows instead, so they do not
    /// depend on scratch); with device index tensors they hold vLLM's values (module docs).
    pub pad_slot_id: Option<i64>,
    /// The batch description.
    pub metadata: Mamba2AttentionMetadata<'a>,
    /// Optional `[≥ T, conv_dim]` buffer (dtype of `xbc`) for the conv output; without it the
    /// core allocates one per call.
    pub conv_out: Option<TensorMut<'a>>,
    /// Output `y` `[≥ T, H, P]`, the dtype of `xbc`.
    pub out: TensorMut<'a>,
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
fn restore_rows(mut out: TensorMut<'_>, rows: &[usize], width: usize, kept: &[u8]) {
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

/// The rows of the pad prefills, read from host tables (none when `slots_p` or `qsl` lives on a
/// device, where the SSD checks the values in its kernel), after checking their ranges here,
/// before the conv's and the SSD's plans, so that the error names the metadata field (the mask
/// and the aliasing rule are checked by those plans, which read and write the pool through these
/// tables).
fn host_prefill_pads(
    slots_p: TensorRef<'_>,
    qsl: TensorRef<'_>,
    np: usize,
    tp: usize,
    td: usize,
    slots: usize,
    pad_slot_id: Option<i64>,
) -> Result<Vec<usize>, Error> {
    if slots_p.host_bytes().is_none() || qsl.host_bytes().is_none() {
        return Ok(Vec::new());
    }
    let slot_list = host_ints(&slots_p, np, "state_indices_tensor_p")?;
    for (i, &s) in slot_list.iter().enumerate() {
        if pad_slot_id != Some(s) && (s < 0 || s as usize >= slots) {
            return Err(core_err(
                "state_indices_tensor_p",
                format!("entry {i} = {s} must be a slot in [0, {slots}) or the pad"),
            ));
        }
    }
    let starts = host_ints(&qsl, np + 1, "query_start_loc_p")?;
    if starts[0] != 0 || starts[np] != tp as i64 || starts.windows(2).any(|w| w[1] < w[0]) {
        return Err(core_err(
            "query_start_loc_p",
            format!("must rise from 0 to num_prefill_tokens = {tp}, got {starts:?}"),
        ));
    }
    // Pad prefills are skipped: the SSD computes every sequence, so the caller's `out` rows of
    // pad prefills are kept across it.
    Ok(slot_list
        .iter()
        .enumerate()
        .filter(|&(_, &s)| pad_slot_id == Some(s))
        .flat_map(|(i, _)| td + starts[i] as usize..td + starts[i + 1] as usize)
        .collect())
}

/// Everything one core call plans from, checked.
struct Steps<'a> {
    m: Mamba2AttentionMetadata<'a>,
    xbc: TensorRef<'a>,
    dt: TensorRef<'a>,
    conv_weight: TensorRef<'a>,
    conv_bias: Option<TensorRef<'a>>,
    activation: Activation,
    conv_state_layout: ConvStateLayout,
    a: TensorRef<'a>,
    d: Option<TensorRef<'a>>,
    dt_bias: Option<TensorRef<'a>>,
    pad_slot_id: Option<i64>,
    /// `[H, P, G, N]`.
    dims: [usize; 4],
}

/// What the ops write: aliases of the caller's views, one per op that writes them (see
/// [`crate::layer_core`]).
struct Writes<'a> {
    conv_state: [TensorMut<'a>; 2],
    ssm_state: [TensorMut<'a>; 2],
    conv_out: [TensorMut<'a>; 2],
    out: [TensorMut<'a>; 3],
}

impl Runtime {
    /// The Mamba2 mixer core of one layer over a mixed batch (decodes, then prefills): conv1d,
    /// then the SSU for decode rows and the SSD for prefill sequences ([`Mamba2MixerCoreArgs`],
    /// module docs). Writes `out` rows of every sequence that is not a pad (and of pads too with
    /// device index tensors, module docs), the conv and SSM slots the metadata names, and
    /// `conv_out` when given. Runs where its tensors live (host: CPU backend; `cuda:N`: CUDA).
    ///
    /// Errors ([`Error::Core`] for the metadata, else the error of the op that refuses its part):
    /// every op's plan runs before any op does, so on an error nothing is written.
    pub fn mamba2_mixer_core(&self, args: Mamba2MixerCoreArgs<'_>) -> Result<(), Error> {
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
        let conv_dim = add("xbc", product("xbc", &[h, p])?, product("xbc", &[2, g, n])?)?;
        let (td, tp) = (m.num_decode_tokens, m.num_prefill_tokens);
        let total = add("num_prefill_tokens", td, tp)?;
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
        let np = m.num_prefills;
        // Rows of pad sequences, found where the tables are on the host (module docs).
        let mut pad_rows = Vec::new();
        let host_d = m.state_indices_tensor_d.is_some_and(|t| t.host_bytes().is_some())
            && m.query_start_loc_d.is_none_or(|q| q.host_bytes().is_some());
        if let (Some(table), Some(pad), true) = (m.state_indices_tensor_d, pad_slot_id, host_d) {
            let nd = m.num_decodes;
            if let Some(q) = m.query_start_loc_d
                && (q.rank() != 1 || q.shape()[0] < nd + 1)
            {
                return Err(core_err(
                    "query_start_loc_d",
                    format!("must have shape [{}], got {:?}", nd + 1, q.shape()),
                ));
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
            let table_form = table.rank() == 1 || (table.rank() == 2 && table.shape()[1] >= 1);
            if !table_form || table.shape()[0] < nd {
                return Err(core_err(
                    "state_indices_tensor_d",
                    format!("must be a [{nd}] or [{nd}, 1 + num_spec] table, got {:?}", table.shape()),
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
        if np > 0 {
            let slots_p = need(m.state_indices_tensor_p, "state_indices_tensor_p", "with prefills")?;
            let qsl = need(m.query_start_loc_p, "query_start_loc_p", "with prefills")?;
            if m.prep_initial_states && m.has_initial_states_p.is_none() {
                return Err(core_err("has_initial_states_p", "must be given with prep_initial_states".into()));
            }
            let checkpoint = [m.checkpoint_offsets_p, m.checkpoint_state_indices_p, m.checkpoint_chunk_indices_p];
            if checkpoint.iter().any(Option::is_some) && !checkpoint.iter().all(Option::is_some) {
                return Err(core_err(
                    "checkpoint_offsets_p",
                    "`checkpoint_offsets_p`, `checkpoint_state_indices_p` and `checkpoint_chunk_indices_p` come together (the conv's and the SSD's halves of each checkpoint)".into(),
                ));
            }
            pad_rows.extend(host_prefill_pads(slots_p, qsl, np, tp, td, slots, pad_slot_id)?);
        }
        let mut owned_conv_out;
        let conv_out = match conv_out {
            Some(c) => c,
            None => {
                owned_conv_out = self.buffer("mamba2_mixer_core", xbc.device(), xbc.dtype(), &[total, conv_dim])?;
                owned_conv_out.view_mut()
            }
        };
        if conv_out.rank() != 2 || conv_out.shape()[1] != conv_dim || conv_out.shape()[0] < total {
            return Err(core_err(
                "conv_out",
                format!("must have shape [≥ {total}, {conv_dim}], got {:?}", conv_out.shape()),
            ));
        }
        // Pad rows keep the caller's values: saved now, restored by the last step.
        let kept = save_rows(&out, &pad_rows, h * p);
        let steps = Steps {
            m,
            xbc,
            dt,
            conv_weight,
            conv_bias,
            activation,
            conv_state_layout,
            a,
            d,
            dt_bias,
            pad_slot_id,
            dims: [h, p, g, n],
        };
        // The ops and steps that use each alias below run one after another in schedule order
        // (crate::layer_core), which is `aliased`'s contract: the decode conv and the prefill
        // conv write the slots of their own tables, as do the SSU and the SSD (one alias,
        // read and written within its call); `conv_out` rows are written by a conv and read after it by the SSU/SSD;
        // `out` rows are written by the SSU (decode rows), the SSD (prefill rows) and the pad
        // rows restored last.
        // SAFETY: `conv_state` aliases are used one at a time (above).
        let conv_state = unsafe { conv_state.aliased() };
        // SAFETY: `ssm_state` aliases are used one at a time (above).
        let ssm_state = unsafe { ssm_state.aliased() };
        // SAFETY: `conv_out` aliases are used one at a time (above).
        let conv_out = unsafe { conv_out.aliased() };
        // SAFETY: `out` aliases are used one at a time (above).
        let out = unsafe { out.aliased() };
        let writes = Writes { conv_state, ssm_state, conv_out, out };
        let mut schedule = Schedule::new();
        let [.., out_pads] = steps.plan(self, &mut schedule, writes)?;
        let pads = &pad_rows;
        schedule.then(move || restore_rows(out_pads, pads, h * p, &kept));
        schedule.run(self)
    }
}

impl<'a> Steps<'a> {
    /// Plans the core's ops, in order, into `schedule` (each op planned once): the decode conv
    /// and SSU, then the prefill conv and the SSD, which reads and writes its states in the pool
    /// through `state_indices_tensor_p`. Returns the alias of `out` left for
    /// the caller's last step.
    fn plan<'s>(
        &'s self,
        rt: &Runtime,
        schedule: &mut Schedule<'s>,
        w: Writes<'s>,
    ) -> Result<[TensorMut<'s>; 1], Error> {
        let m = self.m;
        let [h, p, _, n] = self.dims;
        let conv_dim = self.xbc.shape()[1];
        let (td, tp) = (m.num_decode_tokens, m.num_prefill_tokens);
        let Writes { conv_state: [conv_d, conv_p], ssm_state: [ssm_d, ssm_p], conv_out, out } = w;
        let [conv_out_d, conv_out_p] = conv_out;
        let [out_d, out_p, out_pads] = out;
        if m.num_decodes > 0 {
            let table = m.state_indices_tensor_d;
            // SAFETY: `conv_out` rows [0, td) are written by this conv and read by the SSU after it.
            let [conv_out_w, conv_out_r] = unsafe { conv_out_d.aliased() };
            schedule.plan(CausalConv1dUpdateArgs {
                x: rows_ref(self.xbc, "xbc", 0, td, 0, &[conv_dim], &[1])?,
                conv_state: conv_d,
                conv_state_layout: self.conv_state_layout,
                weight: self.conv_weight,
                bias: self.conv_bias,
                activation: self.activation,
                conv_state_indices: table,
                num_accepted_tokens: m.num_accepted_tokens,
                query_start_loc: m.query_start_loc_d,
                pad_slot_id: self.pad_slot_id,
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out: rows_mut(conv_out_w, "conv_out", 0, td)?,
            })?;
            let [x, b, c] = ssm_inputs(conv_out_r.into_ref(), 0, td, self.dims)?;
            // The tied Mamba2 forms: dt, A, D and dt_bias broadcast over P (and N) with stride 0.
            let a3 = self
                .a
                .with_layout(&[h, p, n], &[self.a.strides()[0], 0, 0], self.a.layout().offset())
                .map_err(|e| core_err("a", format!("cannot be viewed: {e}")))?;
            schedule.plan(rt.with_config_rounding(SelectiveStateUpdateArgs {
                state: ssm_d,
                x,
                dt: rows_ref(self.dt, "dt", 0, td, 0, &[h, p], &[1, 0])?,
                a: a3,
                b,
                c,
                d: per_head(self.d, "d", h, p)?,
                dt_bias: per_head(self.dt_bias, "dt_bias", h, p)?,
                z: None,
                dt_softplus: true,
                state_batch_indices: table,
                dst_state_batch_indices: None,
                pad_slot_id: self.pad_slot_id,
                out: rows_mut(out_d, "out", 0, td)?,
                num_accepted_tokens: m.num_accepted_tokens,
                cu_seqlens: m.query_start_loc_d,
                stochastic_rounding: None,
                disable_state_update: false,
                intermediate_states_buffer: None,
                intermediate_state_indices: None,
                rand_seed: None,
                state_scale: None,
                intermediate_state_scales: None,
            }))?;
        }
        if m.num_prefills == 0 {
            return Ok([out_pads]);
        }
        let qsl = need(m.query_start_loc_p, "query_start_loc_p", "with prefills")?;
        // SAFETY: `conv_out` rows [td, td + tp) are written by this conv and read by the SSD after it.
        let [conv_out_w, conv_out_r] = unsafe { conv_out_p.aliased() };
        schedule.plan(CausalConv1dFnArgs {
            x: rows_ref(self.xbc, "xbc", td, tp, 0, &[conv_dim], &[1])?,
            weight: self.conv_weight,
            bias: self.conv_bias,
            conv_states: conv_p,
            conv_state_layout: self.conv_state_layout,
            query_start_loc: qsl,
            cache_indices: m.state_indices_tensor_p,
            has_initial_state: if m.prep_initial_states { m.has_initial_states_p } else { None },
            activation: self.activation,
            pad_slot_id: self.pad_slot_id,
            checkpoint_offsets: m.checkpoint_offsets_p,
            checkpoint_state_indices: m.checkpoint_state_indices_p,
            out: rows_mut(conv_out_w, "conv_out", td, tp)?,
        })?;
        let [x, b, c] = ssm_inputs(conv_out_r.into_ref(), td, tp, self.dims)?;
        let state_dtype = ssm_p.dtype();
        schedule.plan(MambaChunkScanCombinedVarlenArgs {
            x,
            dt: rows_ref(self.dt, "dt", td, tp, 0, &[h], &[1])?,
            a: self.a,
            b,
            c,
            chunk_size: m.chunk_size,
            cu_seqlens: qsl,
            cu_chunk_seqlens: need(m.cu_chunk_seqlen_p, "cu_chunk_seqlen_p", "with prefills")?,
            last_chunk_indices: need(m.last_chunk_indices_p, "last_chunk_indices_p", "with prefills")?,
            seq_idx: need(m.seq_idx_p, "seq_idx_p", "with prefills")?,
            out: Some(rows_mut(out_p, "out", td, tp)?),
            d: self.d,
            z: None,
            dt_bias: self.dt_bias,
            initial_states: None,
            // vLLM's `where(has_initial_states_p, ssm_state[state_indices_p], 0)` and
            // `ssm_state[state_indices_p] = varlen_states`, through the table: no copy.
            ssm_state: Some(ssm_p),
            initial_state_indices: if m.prep_initial_states { m.state_indices_tensor_p } else { None },
            has_initial_state: if m.prep_initial_states { m.has_initial_states_p } else { None },
            final_state_indices: m.state_indices_tensor_p,
            checkpoint_chunk_indices: m.checkpoint_chunk_indices_p,
            checkpoint_state_indices: m.checkpoint_state_indices_p,
            pad_slot_id: self.pad_slot_id,
            dt_softplus: true,
            dt_limit: (0.0, f32::INFINITY),
            return_intermediate_states: false,
            state_dtype: Some(state_dtype),
            varlen_states: None,
            scratch: None,
        })?;
        Ok([out_pads])
    }
}
