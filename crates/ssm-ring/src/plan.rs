use ssm_tensor::ArgError;
use ssm_tensor::{DType, Device, Slot, SlotUse, Strided, TensorMut, TensorRef, first_slot_conflict};

use crate::{CheckpointingSsuArgs, CommitRingTrackersArgs, RingError, RingTrackers, UpdateRingTrackersArgs};

/// What a tracker call does to each valid slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackerMode {
    /// Zero all three cursors.
    Reset,
    /// Advance after one decoded token.
    Advance {
        /// `W`.
        logical_window: i64,
        /// `L`.
        ring_buffer_len: i64,
    },
    /// Commit the previous speculative window, record the current query length.
    Commit {
        /// `W`.
        logical_window: i64,
        /// `L`.
        ring_buffer_len: i64,
    },
}

/// The checked plan of a tracker call (update, reset or commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerPlan {
    /// Where every tensor lives.
    pub device: Device,
    /// What the call does.
    pub mode: TrackerMode,
    /// Request rows (`state_batch_indices.shape[0]`); 0 makes the call a no-op.
    pub rows: usize,
    /// Entries per tracker tensor; slots outside `[0, num_states)` are skipped.
    pub num_states: usize,
    /// Dtype of the three trackers (i32 or i64).
    pub tracker_dtype: DType,
    /// `ring_start`, `prev_num_accepted`, `prev_query_len` element access.
    pub trackers: [Strided<1>; 3],
    /// Column 0 of `state_batch_indices`.
    pub index: Strided<1>,
    /// `num_accepted_tokens` (commit only).
    pub num_accepted_tokens: Option<Strided<1>>,
    /// `query_start_loc` (commit only).
    pub query_start_loc: Option<Strided<1>>,
    /// The pad value.
    pub pad_slot_id: Option<i64>,
}

impl TrackerPlan {
    /// Whether a slot value names a tracker entry (not the pad, inside `[0, num_states)`).
    #[inline]
    pub fn is_valid_slot(&self, slot: i64) -> bool {
        matches!(Slot::resolve(slot, self.pad_slot_id, self.num_states), Slot::Row(_))
    }

    /// The tracker slot of request row `row` (`row < rows`), read from the host view
    /// `state_batch_indices` the plan saw; `None` for the pad or a slot outside
    /// `[0, num_states)`, which the call skips.
    #[inline]
    pub fn slot_of(&self, state_batch_indices: &TensorRef<'_>, row: usize) -> Option<usize> {
        match Slot::resolve(state_batch_indices.elem_i64(self.index.at([row])), self.pad_slot_id, self.num_states) {
            Slot::Row(s) => Some(s),
            Slot::Pad | Slot::OutOfRange => None,
        }
    }
}

fn check_index_dtype(arg: &'static str, t: &TensorRef<'_>) -> Result<(), RingError> {
    if t.dtype().is_index() {
        Ok(())
    } else {
        Err(RingError::from(ArgError::DType { arg, expected: "i32 or i64".into(), actual: t.dtype() }))
    }
}

fn check_float(arg: &'static str, dtype: DType) -> Result<(), RingError> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(RingError::from(ArgError::DType { arg, expected: "f32, f16 or bf16".into(), actual: dtype }))
    }
}

fn check_device(arg: &'static str, reference: &'static str, expected: Device, actual: Device) -> Result<(), RingError> {
    if actual == expected {
        Ok(())
    } else {
        Err(RingError::from(ArgError::Device { arg, reference, expected, actual }))
    }
}

fn vector(arg: &'static str, t: &TensorRef<'_>) -> Result<Strided<1>, RingError> {
    if t.rank() != 1 {
        return Err(RingError::from(ArgError::Shape { arg, expected: "[n] (1-D)".into(), actual: t.shape().to_vec() }));
    }
    Ok(Strided::for_arg(arg, t.layout(), [t.strides()[0]])?)
}

/// Column 0 of a `[n]` or `[n, width]` slot table, and `n`.
fn slot_column(arg: &'static str, t: &TensorRef<'_>) -> Result<(Strided<1>, usize), RingError> {
    check_index_dtype(arg, t)?;
    match t.rank() {
        1 => Ok((Strided::for_arg(arg, t.layout(), [t.strides()[0]])?, t.shape()[0])),
        2 if t.shape()[1] >= 1 || t.shape()[0] == 0 => {
            Ok((Strided::for_arg(arg, t.layout(), [t.strides()[0]])?, t.shape()[0]))
        }
        _ => Err(RingError::from(ArgError::Shape {
            arg,
            expected: "[n] or [n, width >= 1]".into(),
            actual: t.shape().to_vec(),
        })),
    }
}

fn trackers_plan(tr: &RingTrackers<'_>) -> Result<(DType, usize, [Strided<1>; 3], Device), RingError> {
    let ts: [(&'static str, &TensorMut<'_>); 3] = [
        ("ring_start", &tr.ring_start),
        ("prev_num_accepted", &tr.prev_num_accepted),
        ("prev_query_len", &tr.prev_query_len),
    ];
    let device = tr.ring_start.device();
    let mut strided = [Strided { offset: 0, strides: [0] }; 3];
    for (k, (arg, t)) in ts.iter().enumerate() {
        check_device(arg, "ring_start", device, t.device())?;
        if !t.dtype().is_index() {
            return Err(RingError::from(ArgError::DType { arg, expected: "i32 or i64".into(), actual: t.dtype() }));
        }
        if t.rank() != 1 {
            return Err(RingError::from(ArgError::Shape {
                arg,
                expected: "[num_states] (1-D)".into(),
                actual: t.shape().to_vec(),
            }));
        }
        if t.shape()[0] > 1 && t.strides()[0] == 0 {
            return Err(RingError::from(ArgError::Strides {
                arg,
                what: "written, so its entries must not overlap (stride != 0)",
                shape: t.shape().to_vec(),
                strides: t.strides().to_vec(),
            }));
        }
        strided[k] = Strided::for_arg(arg, t.layout(), [t.strides()[0]])?;
    }
    let lens = [tr.ring_start.numel(), tr.prev_num_accepted.numel(), tr.prev_query_len.numel()];
    let dtypes = [tr.ring_start.dtype(), tr.prev_num_accepted.dtype(), tr.prev_query_len.dtype()];
    if lens[0] != lens[1] || lens[0] != lens[2] || dtypes[0] != dtypes[1] || dtypes[0] != dtypes[2] {
        return Err(RingError::TrackerMismatch {
            ring_start: lens[0],
            prev_num_accepted: lens[1],
            prev_query_len: lens[2],
            dtypes,
        });
    }
    Ok((dtypes[0], lens[0], strided, device))
}

fn window_values(logical_window: i64, ring_buffer_len: i64) -> Result<(), RingError> {
    if logical_window < 0 {
        return Err(RingError::Value { arg: "logical_window", expected: ">= 0", actual: logical_window });
    }
    if ring_buffer_len <= 0 {
        return Err(RingError::Value { arg: "ring_buffer_len", expected: ">= 1", actual: ring_buffer_len });
    }
    Ok(())
}

/// Checks `update_replayssm_ring_trackers` (and reset) arguments. Slot values are not errors:
/// pads and out-of-range entries are skipped by every backend.
pub(crate) fn plan_update_replayssm_ring_trackers(args: &UpdateRingTrackersArgs<'_>) -> Result<TrackerPlan, RingError> {
    let (tracker_dtype, num_states, trackers, device) = trackers_plan(&args.trackers)?;
    let (index, rows) = slot_column("state_batch_indices", &args.state_batch_indices)?;
    check_device("state_batch_indices", "ring_start", device, args.state_batch_indices.device())?;
    let mode = match args.logical_window {
        None => TrackerMode::Reset,
        Some(w) => {
            let l = args
                .ring_buffer_len
                .ok_or(RingError::from(ArgError::Requires { arg: "logical_window", needs: "`ring_buffer_len`" }))?;
            window_values(w, l)?;
            TrackerMode::Advance { logical_window: w, ring_buffer_len: l }
        }
    };
    Ok(TrackerPlan {
        device,
        mode,
        rows,
        num_states,
        tracker_dtype,
        trackers,
        index,
        num_accepted_tokens: None,
        query_start_loc: None,
        pad_slot_id: args.pad_slot_id,
    })
}

/// Checks `commit_replayssm_ring_trackers` arguments.
pub(crate) fn plan_commit_replayssm_ring_trackers(args: &CommitRingTrackersArgs<'_>) -> Result<TrackerPlan, RingError> {
    let (tracker_dtype, num_states, trackers, device) = trackers_plan(&args.trackers)?;
    let (index, rows) = slot_column("state_batch_indices", &args.state_batch_indices)?;
    check_device("state_batch_indices", "ring_start", device, args.state_batch_indices.device())?;
    window_values(args.logical_window, args.ring_buffer_len)?;
    check_index_dtype("num_accepted_tokens", &args.num_accepted_tokens)?;
    check_index_dtype("query_start_loc", &args.query_start_loc)?;
    check_device("num_accepted_tokens", "ring_start", device, args.num_accepted_tokens.device())?;
    check_device("query_start_loc", "ring_start", device, args.query_start_loc.device())?;
    let acc = vector("num_accepted_tokens", &args.num_accepted_tokens)?;
    let qsl = vector("query_start_loc", &args.query_start_loc)?;
    if args.num_accepted_tokens.shape()[0] < rows {
        return Err(RingError::from(ArgError::Shape {
            arg: "num_accepted_tokens",
            expected: format!("[>= n={rows}]"),
            actual: args.num_accepted_tokens.shape().to_vec(),
        }));
    }
    if args.query_start_loc.shape()[0] < rows + 1 {
        return Err(RingError::from(ArgError::Shape {
            arg: "query_start_loc",
            expected: format!("[>= n+1={}]", rows + 1),
            actual: args.query_start_loc.shape().to_vec(),
        }));
    }
    Ok(TrackerPlan {
        device,
        mode: TrackerMode::Commit { logical_window: args.logical_window, ring_buffer_len: args.ring_buffer_len },
        rows,
        num_states,
        tracker_dtype,
        trackers,
        index,
        num_accepted_tokens: Some(acc),
        query_start_loc: Some(qsl),
        pad_slot_id: args.pad_slot_id,
    })
}

/// How the new tokens of a `checkpointing_ssu` call are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenForm {
    /// `x` `[batch, H, P]`: one token per sequence.
    OneToken,
    /// `x` `[batch, T, H, P]`.
    Dense,
    /// `x` `[total, H, P]` or `[1, total, H, P]` with `cu_seqlens`.
    Varlen,
}

/// Element `[seq, token, i, j]` of a per-token tensor, `i` the head (or group) and `j` the
/// last axis (stride 0 for a per-head `dt`). In the varlen form the sequence stride is 0 and
/// `token` is the packed token index.
pub type TokenStrides = Strided<4>;

/// Element `[a, b, c, d]` of a 4-D pool (`state`, `x_cache`, `B_cache`) or of the 3-D
/// `dt_cache` (last stride 0).
pub type PoolStrides = Strided<4>;

/// Element `[h, p]` of a per-head parameter (the `p` stride is 0 for tied parameters).
pub type HeadParam = Strided<2>;

/// The checked plan of a `checkpointing_ssu` call.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointingSsuPlan {
    /// Where every tensor lives.
    pub device: Device,
    /// Token layout.
    pub form: TokenForm,
    /// Sequences.
    pub batch: usize,
    /// `T`: tokens per window (1, `x.shape[1]` or `max_seqlen`).
    pub tokens: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Head dim `P`.
    pub dim: usize,
    /// State size `N`.
    pub dstate: usize,
    /// Groups `G`.
    pub groups: usize,
    /// State slots.
    pub cache: usize,
    /// Ring length `L`.
    pub ring_len: usize,
    /// `W = L − T`.
    pub window: usize,
    /// Dtypes: state, x_cache, B_cache, x/B/C/z/out (may differ per tensor; listed in this order).
    pub state_dtype: DType,
    /// Accesses.
    pub state: PoolStrides,
    /// `x_cache` `[cache, H, L, P]`.
    pub x_cache: PoolStrides,
    /// `B_cache` `[cache, G, L, N]`.
    pub b_cache: PoolStrides,
    /// `dt_cache` `[cache, H, L]` (last entry of `s` is 0).
    pub dt_cache: PoolStrides,
    /// `x`.
    pub x: TokenStrides,
    /// `dt` (`j` = 0).
    pub dt: TokenStrides,
    /// `B`.
    pub b: TokenStrides,
    /// `C`.
    pub c: TokenStrides,
    /// `z`.
    pub z: Option<TokenStrides>,
    /// `out`.
    pub out: TokenStrides,
    /// `A` per head.
    pub a: HeadParam,
    /// `D`.
    pub d: Option<HeadParam>,
    /// `dt_bias` per head.
    pub dt_bias: Option<HeadParam>,
    /// Column 0 of `state_batch_indices`.
    pub index: Option<Strided<1>>,
    /// `ring_start`.
    pub ring_start: Strided<1>,
    /// `prev_num_accepted_tokens`.
    pub prev_num_accepted_tokens: Strided<1>,
    /// `cu_seqlens`.
    pub cu_seqlens: Option<Strided<1>>,
    /// Softplus on dt.
    pub dt_softplus: bool,
    /// The pad value.
    pub pad_slot_id: Option<i64>,
}

impl CheckpointingSsuPlan {
    /// Heads per group.
    pub fn heads_per_group(&self) -> usize {
        self.heads / self.groups
    }
}

fn dims(names: &[&str], vals: &[usize]) -> String {
    let parts: Vec<String> = names.iter().zip(vals).map(|(n, v)| format!("{n}={v}")).collect();
    format!("[{}]", parts.join(", "))
}

fn unit_last(arg: &'static str, shape: &[usize], strides: &[isize]) -> Result<(), RingError> {
    match (shape.last(), strides.last()) {
        (Some(&n), Some(&s)) if n > 1 && s != 1 => Err(RingError::from(ArgError::Strides {
            arg,
            what: "contiguous along the last axis (stride 1)",
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        })),
        _ => Ok(()),
    }
}

struct Lead {
    form: TokenForm,
    names: [&'static str; 2],
    vals: [usize; 2],
    rank: usize,
}

impl Lead {
    fn strides(&self, t: &[isize]) -> (isize, isize) {
        match (self.form, self.rank) {
            (TokenForm::OneToken, _) => (t[0], 0),
            (TokenForm::Dense, _) => (t[0], t[1]),
            (TokenForm::Varlen, 1) => (0, t[0]),
            (TokenForm::Varlen, _) => (0, t[1]),
        }
    }
}

/// A per-token tensor with trailing `[i, j]` (or `[i]` when `j` may be absent).
fn token_tensor(
    arg: &'static str,
    t: &TensorRef<'_>,
    lead: &Lead,
    tail_names: [&'static str; 2],
    tail: [usize; 2],
    per_head: bool,
) -> Result<TokenStrides, RingError> {
    let r = lead.rank;
    let shape = t.shape();
    let mut names: Vec<&str> = lead.names[..r].to_vec();
    let mut vals: Vec<usize> = lead.vals[..r].to_vec();
    names.extend(tail_names);
    vals.extend(tail);
    let full_ok = shape == vals.as_slice();
    let short_ok = per_head && shape.len() == r + 1 && shape[..r + 1] == vals[..r + 1];
    if !full_ok && !short_ok {
        let expected = if per_head {
            format!("{} or {}", dims(&names[..r + 1], &vals[..r + 1]), dims(&names, &vals))
        } else {
            dims(&names, &vals)
        };
        return Err(RingError::from(ArgError::Shape { arg, expected, actual: shape.to_vec() }));
    }
    let st = t.strides();
    let (seq, token) = lead.strides(st);
    if short_ok {
        return Ok(Strided::for_arg(arg, t.layout(), [seq, token, st[r], 0])?);
    }
    if per_head {
        if tail[1] > 1 && st[r + 1] != 0 {
            return Err(RingError::from(ArgError::Strides {
                arg,
                what: "one value per head (stride 0 along dim)",
                shape: shape.to_vec(),
                strides: st.to_vec(),
            }));
        }
    } else {
        unit_last(arg, shape, st)?;
    }
    Ok(Strided::for_arg(arg, t.layout(), [seq, token, st[r], st[r + 1]])?)
}

/// A `[H]` or `[H, P]` (or `[H, P, N]` for `A`) parameter.
fn head_param(
    arg: &'static str,
    t: &TensorRef<'_>,
    heads: usize,
    dim: usize,
    dstate: Option<usize>,
    tied: bool,
) -> Result<HeadParam, RingError> {
    check_float(arg, t.dtype())?;
    let shape = t.shape();
    let st = t.strides();
    let full: Vec<usize> = match dstate {
        Some(n) => vec![heads, dim, n],
        None => vec![heads, dim],
    };
    let names: &[&str] = if dstate.is_some() { &["heads", "dim", "dstate"] } else { &["heads", "dim"] };
    if shape == [heads] {
        return Ok(Strided::for_arg(arg, t.layout(), [st[0], 0])?);
    }
    if shape != full.as_slice() {
        return Err(RingError::from(ArgError::Shape {
            arg,
            expected: format!("[heads={heads}] or {}", dims(names, &full)),
            actual: shape.to_vec(),
        }));
    }
    if tied && st[1..].iter().zip(&shape[1..]).any(|(&s, &n)| n > 1 && s != 0) {
        return Err(RingError::from(ArgError::Strides {
            arg,
            what: "one value per head (stride 0 along dim and dstate)",
            shape: shape.to_vec(),
            strides: st.to_vec(),
        }));
    }
    Ok(Strided::for_arg(arg, t.layout(), [st[0], if tied { 0 } else { st[1] }])?)
}

fn pool(arg: &'static str, t: &TensorMut<'_>, names: &[&str], want: &[usize]) -> Result<PoolStrides, RingError> {
    if t.shape() != want {
        return Err(RingError::from(ArgError::Shape { arg, expected: dims(names, want), actual: t.shape().to_vec() }));
    }
    let mut s = [0isize; 4];
    s[..want.len()].copy_from_slice(t.strides());
    Ok(Strided::for_arg(arg, t.layout(), s)?)
}

/// Checks a `checkpointing_ssu` call: shapes, dtypes, strides, devices, and, for host
/// tensors, every index the call reads (`state_batch_indices`, the cursors of the slots it
/// uses, `cu_seqlens`). Nothing is written by the op when this fails.
pub(crate) fn plan_checkpointing_ssu(args: &CheckpointingSsuArgs<'_>) -> Result<CheckpointingSsuPlan, RingError> {
    let device = check_devices(args)?;
    check_dtypes(args)?;
    let pools = resolve_pools(args)?;
    let (form, lead) = token_form(args, pools.heads, pools.dim)?;
    let tokens_in = token_tensors(args, &lead, &pools)?;
    let (a, d, dt_bias) = head_params(args, &pools)?;
    let (batch, tokens, cu_seqlens) = sequences(args, form)?;
    let window = ring_window(pools.ring_len, tokens)?;
    let index = slot_index(args, batch, pools.cache)?;

    // Host-resident index values.
    check_host_cu_seqlens(args, cu_seqlens, &lead, batch, tokens)?;
    check_host_slots(args, &pools, index, batch, window)?;

    Ok(CheckpointingSsuPlan {
        device,
        form,
        batch,
        tokens,
        heads: pools.heads,
        dim: pools.dim,
        dstate: pools.dstate,
        groups: pools.groups,
        cache: pools.cache,
        ring_len: pools.ring_len,
        window: window as usize,
        state_dtype: args.state.dtype(),
        state: pools.state,
        x_cache: pools.x_cache,
        b_cache: pools.b_cache,
        dt_cache: pools.dt_cache,
        x: tokens_in.x,
        dt: tokens_in.dt,
        b: tokens_in.b,
        c: tokens_in.c,
        z: tokens_in.z,
        out: tokens_in.out,
        a,
        d,
        dt_bias,
        index,
        ring_start: pools.ring_start,
        prev_num_accepted_tokens: pools.prev_num,
        cu_seqlens,
        dt_softplus: args.dt_softplus,
        pad_slot_id: args.pad_slot_id,
    })
}

/// Checks that every tensor lives on `state`'s device, and that the optional index tensors
/// (`state_batch_indices`, `cu_seqlens`) are integer; returns that device.
fn check_devices(args: &CheckpointingSsuArgs<'_>) -> Result<Device, RingError> {
    let device = args.state.device();
    let dev = |arg: &'static str, d: Device| check_device(arg, "state", device, d);
    dev("x_cache", args.x_cache.device())?;
    dev("B_cache", args.b_cache.device())?;
    dev("dt_cache", args.dt_cache.device())?;
    dev("ring_start", args.ring_start.device())?;
    dev("prev_num_accepted_tokens", args.prev_num_accepted_tokens.device())?;
    dev("x", args.x.device())?;
    dev("dt", args.dt.device())?;
    dev("A", args.a.device())?;
    dev("B", args.b.device())?;
    dev("C", args.c.device())?;
    dev("out", args.out.device())?;
    for (arg, t) in [("D", &args.d), ("z", &args.z), ("dt_bias", &args.dt_bias)] {
        if let Some(t) = t {
            dev(arg, t.device())?;
        }
    }
    for (arg, t) in [("state_batch_indices", &args.state_batch_indices), ("cu_seqlens", &args.cu_seqlens)] {
        if let Some(t) = t {
            dev(arg, t.device())?;
            check_index_dtype(arg, t)?;
        }
    }
    Ok(device)
}

/// Checks the dtypes (float pools and tokens, f32 `dt_cache`, integer cursors) and that the
/// written pools and `out` do not overlap themselves.
fn check_dtypes(args: &CheckpointingSsuArgs<'_>) -> Result<(), RingError> {
    check_float("state", args.state.dtype())?;
    check_float("x_cache", args.x_cache.dtype())?;
    check_float("B_cache", args.b_cache.dtype())?;
    if args.dt_cache.dtype() != DType::F32 {
        return Err(RingError::from(ArgError::DType {
            arg: "dt_cache",
            expected: "f32".into(),
            actual: args.dt_cache.dtype(),
        }));
    }
    for (arg, d) in [("x", args.x.dtype()), ("dt", args.dt.dtype()), ("B", args.b.dtype()), ("C", args.c.dtype())] {
        check_float(arg, d)?;
    }
    check_float("out", args.out.dtype())?;
    // Every written pool and the output must be disjoint (backends fill them from many threads).
    for (arg, layout) in [
        ("state", args.state.layout()),
        ("x_cache", args.x_cache.layout()),
        ("B_cache", args.b_cache.layout()),
        ("dt_cache", args.dt_cache.layout()),
        ("out", args.out.layout()),
    ] {
        ArgError::check_written(arg, layout)?;
    }
    if let Some(z) = &args.z {
        check_float("z", z.dtype())?;
    }
    check_index_dtype("ring_start", &args.ring_start)?;
    check_index_dtype("prev_num_accepted_tokens", &args.prev_num_accepted_tokens)?;
    Ok(())
}

/// The state pool, the ring caches and the per-slot cursors, with the dims they fix.
struct Pools {
    cache: usize,
    heads: usize,
    dim: usize,
    dstate: usize,
    groups: usize,
    ring_len: usize,
    state: PoolStrides,
    x_cache: PoolStrides,
    b_cache: PoolStrides,
    dt_cache: PoolStrides,
    ring_start: Strided<1>,
    prev_num: Strided<1>,
}

/// Resolves `cache, heads, dim, dstate` from `state`, `L` from `x_cache`, `groups` from
/// `B_cache`, and checks the ring caches and the cursors `[cache]` against them.
fn resolve_pools(args: &CheckpointingSsuArgs<'_>) -> Result<Pools, RingError> {
    // The state pool fixes cache, heads, dim, dstate.
    let ss = args.state.shape();
    if ss.len() != 4 {
        return Err(RingError::from(ArgError::Shape {
            arg: "state",
            expected: "[cache, heads, dim, dstate]".into(),
            actual: ss.to_vec(),
        }));
    }
    let (cache, heads, dim, dstate) = (ss[0], ss[1], ss[2], ss[3]);
    unit_last("state", ss, args.state.strides())?;
    let state = pool("state", &args.state, &["cache", "heads", "dim", "dstate"], ss)?;
    let xs = args.x_cache.shape();
    if xs.len() != 4 {
        return Err(RingError::from(ArgError::Shape {
            arg: "x_cache",
            expected: format!("[cache={cache}, heads={heads}, L, dim={dim}]"),
            actual: xs.to_vec(),
        }));
    }
    let ring_len = xs[2];
    let x_cache = pool("x_cache", &args.x_cache, &["cache", "heads", "L", "dim"], &[cache, heads, ring_len, dim])?;
    unit_last("x_cache", xs, args.x_cache.strides())?;
    let bs = args.b_cache.shape();
    let groups = if bs.len() == 4 { bs[1] } else { 0 };
    let b_cache =
        pool("B_cache", &args.b_cache, &["cache", "groups", "L", "dstate"], &[cache, groups.max(1), ring_len, dstate])?;
    unit_last("B_cache", bs, args.b_cache.strides())?;
    if groups == 0 || heads % groups != 0 {
        return Err(RingError::from(ArgError::HeadsNotDivisible { heads, groups, heads_from: "x" }));
    }
    let dt_cache = pool("dt_cache", &args.dt_cache, &["cache", "heads", "L"], &[cache, heads, ring_len])?;
    for (arg, t) in [("ring_start", &args.ring_start), ("prev_num_accepted_tokens", &args.prev_num_accepted_tokens)] {
        if t.shape() != [cache] {
            return Err(RingError::from(ArgError::Shape {
                arg,
                expected: format!("[cache={cache}]"),
                actual: t.shape().to_vec(),
            }));
        }
    }
    let ring_start = vector("ring_start", &args.ring_start)?;
    let prev_num = vector("prev_num_accepted_tokens", &args.prev_num_accepted_tokens)?;
    Ok(Pools { cache, heads, dim, dstate, groups, ring_len, state, x_cache, b_cache, dt_cache, ring_start, prev_num })
}

/// Resolves the token layout from `x`'s rank and whether `cu_seqlens` is given.
fn token_form(args: &CheckpointingSsuArgs<'_>, heads: usize, dim: usize) -> Result<(TokenForm, Lead), RingError> {
    // Token form from x.
    let xsh = args.x.shape();
    let (form, lead) = match (&args.cu_seqlens, xsh.len()) {
        (None, 3) => {
            (TokenForm::OneToken, Lead { form: TokenForm::OneToken, names: ["batch", ""], vals: [xsh[0], 0], rank: 1 })
        }
        (None, 4) => {
            (TokenForm::Dense, Lead { form: TokenForm::Dense, names: ["batch", "T"], vals: [xsh[0], xsh[1]], rank: 2 })
        }
        (Some(_), 3) => {
            (TokenForm::Varlen, Lead { form: TokenForm::Varlen, names: ["total", ""], vals: [xsh[0], 0], rank: 1 })
        }
        (Some(_), 4) if xsh[0] == 1 => {
            (TokenForm::Varlen, Lead { form: TokenForm::Varlen, names: ["1", "total"], vals: [1, xsh[1]], rank: 2 })
        }
        (None, _) => {
            return Err(RingError::from(ArgError::Shape {
                arg: "x",
                expected: format!("[batch, heads={heads}, dim={dim}] or [batch, T, heads={heads}, dim={dim}]"),
                actual: xsh.to_vec(),
            }));
        }
        (Some(_), _) => {
            return Err(RingError::from(ArgError::Shape {
                arg: "x",
                expected: format!(
                    "[total, heads={heads}, dim={dim}] or [1, total, heads={heads}, dim={dim}] with `cu_seqlens`"
                ),
                actual: xsh.to_vec(),
            }));
        }
    };
    Ok((form, lead))
}

/// The per-token tensors' accesses.
struct Tokens {
    x: TokenStrides,
    out: TokenStrides,
    z: Option<TokenStrides>,
    dt: TokenStrides,
    b: TokenStrides,
    c: TokenStrides,
}

/// Checks `x`, `out`, `z`, `dt` (`[.., heads, dim]`) and `B`, `C` (`[.., groups, dstate]`)
/// against the token layout.
fn token_tensors(args: &CheckpointingSsuArgs<'_>, lead: &Lead, pools: &Pools) -> Result<Tokens, RingError> {
    let (heads, dim, groups, dstate) = (pools.heads, pools.dim, pools.groups, pools.dstate);
    let hp = ["heads", "dim"];
    let x = token_tensor("x", &args.x, lead, hp, [heads, dim], false)?;
    let out_ref = args.out.as_ref();
    let out = token_tensor("out", &out_ref, lead, hp, [heads, dim], false)?;
    let z = args.z.as_ref().map(|z| token_tensor("z", z, lead, hp, [heads, dim], false)).transpose()?;
    let dt = token_tensor("dt", &args.dt, lead, hp, [heads, dim], true)?;
    let b = token_tensor("B", &args.b, lead, ["groups", "dstate"], [groups, dstate], false)?;
    let c = token_tensor("C", &args.c, lead, ["groups", "dstate"], [groups, dstate], false)?;
    Ok(Tokens { x, out, z, dt, b, c })
}

/// Checks the per-head parameters `A` (tied), `D` and `dt_bias` (tied).
fn head_params(
    args: &CheckpointingSsuArgs<'_>,
    pools: &Pools,
) -> Result<(HeadParam, Option<HeadParam>, Option<HeadParam>), RingError> {
    let (heads, dim, dstate) = (pools.heads, pools.dim, pools.dstate);
    let a = head_param("A", &args.a, heads, dim, Some(dstate), true)?;
    let d = args.d.as_ref().map(|t| head_param("D", t, heads, dim, None, false)).transpose()?;
    let dt_bias = args.dt_bias.as_ref().map(|t| head_param("dt_bias", t, heads, dim, None, true)).transpose()?;
    Ok((a, d, dt_bias))
}

/// Resolves `(batch, T, cu_seqlens)`; `cu_seqlens` and `max_seqlen` come together or not at all.
fn sequences(
    args: &CheckpointingSsuArgs<'_>,
    form: TokenForm,
) -> Result<(usize, usize, Option<Strided<1>>), RingError> {
    let xsh = args.x.shape();
    let (batch, tokens, cu_seqlens) = match form {
        TokenForm::OneToken => (xsh[0], 1, None),
        TokenForm::Dense => (xsh[0], xsh[1], None),
        TokenForm::Varlen => {
            let cu = args.cu_seqlens.as_ref().expect("varlen form has cu_seqlens");
            if cu.rank() != 1 || cu.shape()[0] == 0 {
                return Err(RingError::from(ArgError::Shape {
                    arg: "cu_seqlens",
                    expected: "[batch + 1]".into(),
                    actual: cu.shape().to_vec(),
                }));
            }
            let t = args
                .max_seqlen
                .ok_or(RingError::from(ArgError::Requires { arg: "cu_seqlens", needs: "`max_seqlen`" }))?;
            (cu.shape()[0] - 1, t, Some(vector("cu_seqlens", cu)?))
        }
    };
    if args.max_seqlen.is_some() && form != TokenForm::Varlen {
        return Err(RingError::from(ArgError::Requires { arg: "max_seqlen", needs: "`cu_seqlens`" }));
    }
    Ok((batch, tokens, cu_seqlens))
}

/// Resolves the window `W = L − T` and checks that the ring holds it: `T <= W`.
fn ring_window(ring_len: usize, tokens: usize) -> Result<i64, RingError> {
    // T <= W = L - T, i.e. 2T <= L: compared without arithmetic that a huge `max_seqlen`
    // could wrap.
    let window = (ring_len as i64).saturating_sub(i64::try_from(tokens).unwrap_or(i64::MAX));
    if tokens > ring_len / 2 {
        return Err(RingError::RingTooShort { ring_len, tokens, window });
    }
    Ok(window)
}

/// Resolves column 0 of `state_batch_indices` (at least `batch` rows); without it the
/// identity mapping needs `batch <= cache`.
fn slot_index(args: &CheckpointingSsuArgs<'_>, batch: usize, cache: usize) -> Result<Option<Strided<1>>, RingError> {
    let index = match &args.state_batch_indices {
        Some(t) => {
            let (col, n) = slot_column("state_batch_indices", t)?;
            if n < batch {
                return Err(RingError::from(ArgError::Shape {
                    arg: "state_batch_indices",
                    expected: format!("[>= batch={batch}] or [>= batch={batch}, width]"),
                    actual: t.shape().to_vec(),
                }));
            }
            Some(col)
        }
        None => {
            if batch > cache {
                return Err(RingError::from(ArgError::Requires {
                    arg: "a batch larger than the state pool",
                    needs: "`state_batch_indices`",
                }));
            }
            None
        }
    };
    Ok(index)
}

/// Checks host `cu_seqlens` values: starts at 0, non-decreasing, ends at the packed token
/// count, and no sequence longer than `max_seqlen`.
fn check_host_cu_seqlens(
    args: &CheckpointingSsuArgs<'_>,
    cu_seqlens: Option<Strided<1>>,
    lead: &Lead,
    batch: usize,
    tokens: usize,
) -> Result<(), RingError> {
    if let (Some(cu), Some(cs)) = (&args.cu_seqlens, cu_seqlens)
        && cu.host_bytes().is_some()
    {
        let xsh = args.x.shape();
        let total = match lead.rank {
            1 => xsh[0],
            _ => xsh[1],
        };
        let mut prev = 0i64;
        for i in 0..=batch {
            let v = cu.elem_i64(cs.at([i]));
            let bad = (i == 0 && v != 0) || v < prev || v > total as i64 || (i == batch && v != total as i64);
            if bad {
                return Err(RingError::CuSeqlens { at: i, value: v, prev, tokens: total });
            }
            if i > 0 && (v - prev) as usize > tokens {
                return Err(RingError::SeqTooLong { seq: i - 1, len: (v - prev) as usize, max_seqlen: tokens });
            }
            prev = v;
        }
    }
    Ok(())
}

/// Checks, row by row, host `state_batch_indices` against the pool and the host cursors of
/// each used slot (`ring_start < L`, `prev_num_accepted_tokens <= W`), then that no two
/// rows share a slot.
fn check_host_slots(
    args: &CheckpointingSsuArgs<'_>,
    pools: &Pools,
    index: Option<Strided<1>>,
    batch: usize,
    window: i64,
) -> Result<(), RingError> {
    let (cache, ring_len) = (pools.cache, pools.ring_len);
    let host_cursors = args.ring_start.host_bytes().is_some() && args.prev_num_accepted_tokens.host_bytes().is_some();
    // Each row reads and writes the state of its slot: the aliasing rule of every family.
    let mut uses = Vec::new();
    for row in 0..batch {
        let slot = match (&args.state_batch_indices, index) {
            (Some(t), Some(col)) => {
                if t.host_bytes().is_none() {
                    continue;
                }
                let v = t.elem_i64(col.at([row]));
                let slot = match Slot::resolve(v, args.pad_slot_id, cache) {
                    Slot::Pad => continue,
                    Slot::Row(slot) => slot,
                    Slot::OutOfRange => {
                        return Err(RingError::IndexOutOfRange {
                            arg: "state_batch_indices",
                            row,
                            value: v,
                            slots: cache,
                            pad: args.pad_slot_id.map_or("none".into(), |p| p.to_string()),
                        });
                    }
                };
                uses.push(SlotUse { slot, written: true, seq: row });
                slot
            }
            _ => row,
        };
        if host_cursors {
            let start = args.ring_start.elem_i64(pools.ring_start.at([slot]));
            if start < 0 || start >= ring_len as i64 {
                return Err(RingError::CursorOutOfRange {
                    arg: "ring_start",
                    slot,
                    row,
                    value: start,
                    limit: ring_len as i64 - 1,
                });
            }
            let k = args.prev_num_accepted_tokens.elem_i64(pools.prev_num.at([slot]));
            if k < 0 || k > window {
                return Err(RingError::CursorOutOfRange {
                    arg: "prev_num_accepted_tokens",
                    slot,
                    row,
                    value: k,
                    limit: window,
                });
            }
        }
    }
    if let Some(c) = first_slot_conflict(&mut uses) {
        return Err(RingError::SlotConflict {
            arg: "state_batch_indices",
            slot: c.slot,
            first: c.first.seq,
            second: c.second.seq,
        });
    }
    Ok(())
}

impl CheckpointingSsuPlan {
    /// The state slot of sequence `row`, or `None` for a pad row. Host index tensors only.
    pub fn slot(&self, args: &CheckpointingSsuArgs<'_>, row: usize) -> Option<usize> {
        match (&args.state_batch_indices, self.index) {
            (Some(t), Some(col)) => match Slot::resolve(t.elem_i64(col.at([row])), self.pad_slot_id, self.cache) {
                Slot::Row(slot) => Some(slot),
                Slot::Pad | Slot::OutOfRange => None,
            },
            _ => Some(row),
        }
    }

    /// `(seq, first_token, len)` of sequence `row` in [`TokenStrides::at`] terms. Host `cu_seqlens` only.
    pub fn span(&self, args: &CheckpointingSsuArgs<'_>, row: usize) -> (usize, usize, usize) {
        match (&args.cu_seqlens, self.cu_seqlens) {
            (Some(t), Some(cu)) => {
                let s = t.elem_i64(cu.at([row])) as usize;
                let e = t.elem_i64(cu.at([row + 1])) as usize;
                (0, s, e - s)
            }
            _ => (row, 0, self.tokens),
        }
    }

    /// The cursors `(ring_start, k)` of `slot`. Host cursor tensors only.
    pub fn cursors(&self, args: &CheckpointingSsuArgs<'_>, slot: usize) -> (usize, usize) {
        let start = args.ring_start.elem_i64(self.ring_start.at([slot])) as usize;
        let k = args.prev_num_accepted_tokens.elem_i64(self.prev_num_accepted_tokens.at([slot])) as usize;
        (start, k)
    }
}
