use ssm_tensor::ArgError;
use ssm_tensor::{DType, Device, Slot, SlotTable, SlotUse, Strided, TensorRef, first_slot_conflict};

use crate::{MambaChunkScanCombinedVarlenArgs, SsdError};

/// The checked plan of one `mamba_chunk_scan_combined_varlen` call.
#[derive(Debug, Clone, PartialEq)]
pub struct SsdPlan {
    /// Where every tensor lives.
    pub device: Device,
    /// Packed tokens `T`.
    pub tokens: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Head dim `P`.
    pub dim: usize,
    /// State size `N`.
    pub dstate: usize,
    /// Groups `G`.
    pub groups: usize,
    /// `Q`.
    pub chunk_size: usize,
    /// Rows of a chunk the scratch holds: the longest chunk of host-resident
    /// `cu_chunk_seqlens`, else `chunk_size`. Rows past a chunk's end are inert padding, so a
    /// backend may size and index every per-chunk row by this instead of `chunk_size` (a
    /// huge `chunk_size` over short chunks then costs nothing).
    pub chunk_rows: usize,
    /// The scratch layout, computed (with checked arithmetic) once by the plan.
    pub scratch_layout: ScratchLayout,
    /// Chunks.
    pub nchunks: usize,
    /// Sequences.
    pub batch: usize,
    /// Dtype of `x`, `B`, `C`, `z`, `out` may differ; recorded per tensor here.
    pub io_dtypes: IoDtypes,
    /// Dtype of `varlen_states` (and `initial_states`).
    pub state_dtype: DType,
    /// `x` `[T, H, P]`.
    pub x: Strided<3>,
    /// `dt` `[T, H]`.
    pub dt: Strided<3>,
    /// `B` `[T, G, N]`.
    pub b: Strided<3>,
    /// `C` `[T, G, N]`.
    pub c: Strided<3>,
    /// `z`.
    pub z: Option<Strided<3>>,
    /// `out`.
    pub out: Option<Strided<3>>,
    /// `A` per head.
    pub a: Strided<1>,
    /// `D` `[H, P]` view (`s[1]` = 0 for a per-head `D`).
    pub d: Option<Strided<3>>,
    /// `dt_bias` per head.
    pub dt_bias: Option<Strided<1>>,
    /// `initial_states` `[batch, H, P, N]`.
    pub initial_states: Option<Strided<4>>,
    /// `varlen_states` `[batch or nchunks, H, P, N]`.
    pub varlen_states: Option<Strided<4>>,
    /// `ssm_state` `[slots, H, P, N]`.
    pub ssm_state: Option<Strided<4>>,
    /// Slots of `ssm_state` (0 without it).
    pub slots: usize,
    /// `initial_state_indices` `[batch]` into `ssm_state`.
    pub initial_state_indices: Option<SlotTable>,
    /// `has_initial_state` `[batch]` (bool or integer, nonzero = reads its initial state).
    pub has_initial_state: Option<SlotTable>,
    /// `final_state_indices` `[batch]` into `ssm_state`.
    pub final_state_indices: Option<SlotTable>,
    /// `checkpoint_chunk_indices` `[batch]` (-1: no checkpoint).
    pub checkpoint_chunk_indices: Option<SlotTable>,
    /// `checkpoint_state_indices` `[batch]` into `ssm_state`.
    pub checkpoint_state_indices: Option<SlotTable>,
    /// The pad value of the slot tables.
    pub pad_slot_id: Option<i64>,
    /// `cu_seqlens`.
    pub cu_seqlens: Strided<1>,
    /// `cu_chunk_seqlens`.
    pub cu_chunk_seqlens: Strided<1>,
    /// `last_chunk_indices`.
    pub last_chunk_indices: Strided<1>,
    /// `seq_idx`.
    pub seq_idx: Strided<1>,
    /// Softplus on dt.
    pub dt_softplus: bool,
    /// `(lo, hi)` clamp.
    pub dt_limit: (f32, f32),
    /// Whether `varlen_states` holds every chunk's state.
    pub return_intermediate_states: bool,
    /// Offset of the caller's scratch view, when given.
    pub scratch_offset: Option<usize>,
}

/// Where a sequence's initial state is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateSource {
    /// Row of `initial_states`.
    InitialStates(usize),
    /// Slot of `ssm_state`.
    Pool(usize),
}

/// The dtypes of the per-token tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDtypes {
    /// `x`.
    pub x: DType,
    /// `dt`.
    pub dt: DType,
    /// `B`.
    pub b: DType,
    /// `C`.
    pub c: DType,
    /// `z`.
    pub z: Option<DType>,
    /// `out`.
    pub out: Option<DType>,
}

/// Where each stage's f32 buffer lives in the scratch (offsets in elements). Rows are
/// padded to multiples of 8 elements (`q_row`, `state_row`) so that a backend can run
/// eight-lane loops without tails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchLayout {
    /// Row length of `dt_out`, `dA_cumsum` and `CB` rows: `chunk_rows` rounded up to 8.
    pub q_row: usize,
    /// Row length of a state row: `dstate` rounded up to 8.
    pub state_row: usize,
    /// `dt_out` `[nchunks, H, q_row]`: processed dt, zero past each chunk's end.
    pub dt_out: usize,
    /// `dA_cumsum` `[nchunks, H, q_row]`.
    pub da_cumsum: usize,
    /// `states` `[nchunks, H, P, state_row]`: stage 2 chunk states, end states after stage 3.
    pub states: usize,
    /// `CB` `[nchunks, G, chunk_rows, q_row]`.
    pub cb: usize,
    /// Total elements.
    pub len: usize,
}

impl SsdPlan {
    /// Heads per group.
    pub fn heads_per_group(&self) -> usize {
        self.heads / self.groups
    }

    /// The f32 scratch a chunked backend needs (the size query).
    pub fn scratch(&self) -> ScratchLayout {
        self.scratch_layout
    }

    /// Elements of f32 scratch a chunked backend needs.
    pub fn scratch_len(&self) -> usize {
        self.scratch().len
    }

    /// Elements of f32 scratch a call of this plan's shapes needs when its chunk metadata lives
    /// on a device: the plan cannot read the chunks there, so every chunk is sized
    /// `chunk_size` (at least [`scratch_len`](Self::scratch_len), equal when this plan's
    /// metadata is already on a device). `None` when that size overflows.
    pub fn device_metadata_scratch_len(&self) -> Option<usize> {
        scratch_layout(&SsdPlan { chunk_rows: self.chunk_size, ..self.clone() }).map(|l| l.len)
    }

    /// Chunk `c`'s token range `[start, end)` (host metadata only).
    pub fn chunk(&self, args: &MambaChunkScanCombinedVarlenArgs<'_>, c: usize) -> (usize, usize) {
        let s = args.cu_chunk_seqlens.elem_i64(self.cu_chunk_seqlens.at([c])) as usize;
        let e = args.cu_chunk_seqlens.elem_i64(self.cu_chunk_seqlens.at([c + 1])) as usize;
        (s, e)
    }

    /// `seq_idx[c]` (host metadata only).
    pub fn seq_of(&self, args: &MambaChunkScanCombinedVarlenArgs<'_>, c: usize) -> usize {
        args.seq_idx.elem_i64(self.seq_idx.at([c])) as usize
    }

    /// Whether chunk `c` opens its sequence (`c == 0` or `seq_idx` changes).
    pub fn opens_sequence(&self, args: &MambaChunkScanCombinedVarlenArgs<'_>, c: usize) -> bool {
        c == 0 || self.seq_of(args, c) != self.seq_of(args, c - 1)
    }

    /// Where sequence `b`'s initial state comes from, given the host bytes of
    /// `initial_state_indices` and `has_initial_state` (the whole borrowed memory of each
    /// view): `None` (zeros) without a source, where `has_initial_state[b]` is false, or where
    /// the table holds the pad (or, in a device table a host plan could not check, a value
    /// out of range).
    pub fn initial_source(&self, indices: Option<&[u8]>, has: Option<&[u8]>, b: usize) -> Option<StateSource> {
        if self.initial_states.is_none() && self.initial_state_indices.is_none() {
            return None;
        }
        if let (Some(t), Some(bytes)) = (self.has_initial_state, has)
            && t.get(bytes, b, 0) == 0
        {
            return None;
        }
        match (self.initial_state_indices, indices) {
            (Some(t), Some(bytes)) => self.slot(t, bytes, b).map(StateSource::Pool),
            (Some(_), None) => None,
            (None, _) => Some(StateSource::InitialStates(b)),
        }
    }

    /// The `ssm_state` slot sequence `b`'s final state is written to, given the host bytes of
    /// `final_state_indices`: `None` without the table or where it holds the pad (or an
    /// unchecked out-of-range value).
    pub fn final_slot(&self, indices: Option<&[u8]>, b: usize) -> Option<usize> {
        self.slot(self.final_state_indices?, indices?, b)
    }

    /// Sequence `b`'s checkpoint, `(chunk, slot)`: the chunk whose end state is written and the
    /// `ssm_state` slot it goes to, given the host bytes of `checkpoint_chunk_indices` and
    /// `checkpoint_state_indices`. `None` without the tables, where the chunk is -1 (or, in a
    /// device table a host plan could not check, out of range) or the slot is the pad (or out
    /// of range).
    pub fn checkpoint(&self, chunks: Option<&[u8]>, slots: Option<&[u8]>, b: usize) -> Option<(usize, usize)> {
        let c = self.checkpoint_chunk_indices?.get(chunks?, b, 0);
        if c < 0 || c >= self.nchunks as i64 {
            return None;
        }
        Some((c as usize, self.slot(self.checkpoint_state_indices?, slots?, b)?))
    }

    fn slot(&self, t: SlotTable, bytes: &[u8], b: usize) -> Option<usize> {
        match Slot::resolve(t.get(bytes, b, 0), self.pad_slot_id, self.slots) {
            Slot::Row(r) => Some(r),
            Slot::Pad | Slot::OutOfRange => None,
        }
    }

    /// `last_chunk_indices[b]` (-1 for an empty sequence; host metadata only).
    pub fn last_chunk(&self, args: &MambaChunkScanCombinedVarlenArgs<'_>, b: usize) -> i64 {
        args.last_chunk_indices.elem_i64(self.last_chunk_indices.at([b]))
    }
}

fn dims(names: &[&str], vals: &[usize]) -> String {
    let parts: Vec<String> = names.iter().zip(vals).map(|(n, v)| format!("{n}={v}")).collect();
    format!("[{}]", parts.join(", "))
}

fn float(arg: &'static str, d: DType) -> Result<(), SsdError> {
    if d.is_float() {
        Ok(())
    } else {
        Err(SsdError::from(ArgError::DType { arg, expected: "f32, f16 or bf16".into(), actual: d }))
    }
}

fn index(arg: &'static str, t: &TensorRef<'_>) -> Result<Strided<1>, SsdError> {
    if !t.dtype().is_index() {
        return Err(SsdError::from(ArgError::DType { arg, expected: "i32 or i64".into(), actual: t.dtype() }));
    }
    if t.rank() != 1 {
        return Err(SsdError::from(ArgError::Shape { arg, expected: "1-D".into(), actual: t.shape().to_vec() }));
    }
    Ok(Strided::for_arg(arg, t.layout(), [t.strides()[0]])?)
}

fn shaped(
    arg: &'static str,
    t: &TensorRef<'_>,
    names: &[&str],
    want: &[usize],
    unit_last: bool,
) -> Result<Strided<3>, SsdError> {
    float(arg, t.dtype())?;
    if t.shape() != want {
        return Err(SsdError::from(ArgError::Shape { arg, expected: dims(names, want), actual: t.shape().to_vec() }));
    }
    let st = t.strides();
    if unit_last && want.last().is_some_and(|&n| n > 1) && st.last() != Some(&1) {
        return Err(SsdError::from(ArgError::Strides {
            arg,
            what: "contiguous along the last axis (stride 1)",
            shape: t.shape().to_vec(),
            strides: st.to_vec(),
        }));
    }
    let mut s = [0isize; 3];
    s[..st.len()].copy_from_slice(st);
    Ok(Strided::for_arg(arg, t.layout(), s)?)
}

fn state4(arg: &'static str, t: &TensorRef<'_>, want: &[usize; 4], row_name: &str) -> Result<Strided<4>, SsdError> {
    if t.shape() != want {
        let expected = dims(&[row_name, "heads", "dim", "dstate"], want);
        return Err(if arg == "initial_states" {
            SsdError::InitialStatesBatch { expected, actual: t.shape().to_vec() }
        } else {
            SsdError::from(ArgError::Shape { arg, expected, actual: t.shape().to_vec() })
        });
    }
    let st = t.strides();
    if want[3] > 1 && st[3] != 1 {
        return Err(SsdError::from(ArgError::Strides {
            arg,
            what: "contiguous along dstate (last stride 1)",
            shape: t.shape().to_vec(),
            strides: st.to_vec(),
        }));
    }
    Ok(Strided::for_arg(arg, t.layout(), [st[0], st[1], st[2], st[3]])?)
}

/// Checks one call: shapes, dtypes, strides and devices of every tensor, and, for host
/// metadata, every value (`cu_seqlens`, `cu_chunk_seqlens`, `seq_idx`, `last_chunk_indices`).
/// Backends trust the returned plan; nothing is written when this fails.
pub(crate) fn plan_mamba_chunk_scan_combined_varlen(
    args: &MambaChunkScanCombinedVarlenArgs<'_>,
) -> Result<SsdPlan, SsdError> {
    let device = check_devices(args)?;
    let io = resolve_token_tensors(args)?;
    check_chunk_size_and_dt_limit(args)?;
    let meta = resolve_chunk_metadata(args)?;
    let states = resolve_states(args, &io, &meta)?;
    let mut plan = build_plan(args, device, io, meta, states);
    if let Some(longest) = check_metadata(&plan, args)? {
        plan.chunk_rows = longest.max(1);
        check_checkpoint_chunks(&plan, args)?;
    }
    resolve_scratch(&mut plan, args)?;
    check_slots(&plan, args)?;
    Ok(plan)
}

/// Checks that every tensor lives on `x`'s device; returns that device.
fn check_devices(args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<Device, SsdError> {
    let device = args.x.device();
    let dev = |arg: &'static str, d: Device| {
        if d == device {
            Ok(())
        } else {
            Err(SsdError::from(ArgError::Device { arg, expected: device, actual: d, reference: "x" }))
        }
    };
    for (arg, t) in [
        ("dt", &args.dt),
        ("A", &args.a),
        ("B", &args.b),
        ("C", &args.c),
        ("cu_seqlens", &args.cu_seqlens),
        ("cu_chunk_seqlens", &args.cu_chunk_seqlens),
        ("last_chunk_indices", &args.last_chunk_indices),
        ("seq_idx", &args.seq_idx),
    ] {
        dev(arg, t.device())?;
    }
    for (arg, t) in [
        ("D", &args.d),
        ("z", &args.z),
        ("dt_bias", &args.dt_bias),
        ("initial_states", &args.initial_states),
        ("initial_state_indices", &args.initial_state_indices),
        ("has_initial_state", &args.has_initial_state),
        ("final_state_indices", &args.final_state_indices),
        ("checkpoint_chunk_indices", &args.checkpoint_chunk_indices),
        ("checkpoint_state_indices", &args.checkpoint_state_indices),
    ] {
        if let Some(t) = t {
            dev(arg, t.device())?;
        }
    }
    if let Some(o) = &args.out {
        dev("out", o.device())?;
    }
    if let Some(v) = &args.varlen_states {
        dev("varlen_states", v.device())?;
    }
    if let Some(v) = &args.ssm_state {
        dev("ssm_state", v.device())?;
    }
    if let Some(w) = &args.scratch {
        dev("scratch", w.device())?;
    }
    Ok(device)
}

/// The per-token and per-head tensors of one call, shapes, dtypes and strides checked.
struct TokenTensors {
    tokens: usize,
    heads: usize,
    dim: usize,
    groups: usize,
    dstate: usize,
    x: Strided<3>,
    dt: Strided<3>,
    a: Strided<3>,
    b: Strided<3>,
    c: Strided<3>,
    z: Option<Strided<3>>,
    out: Option<Strided<3>>,
    d: Option<Strided<3>>,
    dt_bias: Option<Strided<1>>,
}

/// Resolves tokens, heads, dim, groups and dstate from `x` and `B`; checks every per-token and per-head tensor.
fn resolve_token_tensors(args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<TokenTensors, SsdError> {
    float("x", args.x.dtype())?;
    let xs = args.x.shape();
    if xs.len() != 3 {
        return Err(SsdError::from(ArgError::Shape {
            arg: "x",
            expected: "[tokens, heads, dim]".into(),
            actual: xs.to_vec(),
        }));
    }
    let (tokens, heads, dim) = (xs[0], xs[1], xs[2]);
    let bs = args.b.shape();
    if bs.len() != 3 {
        return Err(SsdError::from(ArgError::Shape {
            arg: "B",
            expected: format!("[tokens={tokens}, groups, dstate]"),
            actual: bs.to_vec(),
        }));
    }
    let (groups, dstate) = (bs[1], bs[2]);
    if groups == 0 || heads % groups != 0 {
        return Err(SsdError::from(ArgError::HeadsNotDivisible { heads, groups, heads_from: "x" }));
    }
    let thp = ["tokens", "heads", "dim"];
    let tgn = ["tokens", "groups", "dstate"];
    let x = shaped("x", &args.x, &thp, &[tokens, heads, dim], true)?;
    let dt = shaped("dt", &args.dt, &["tokens", "heads"], &[tokens, heads], false)?;
    let a = shaped("A", &args.a, &["heads"], &[heads], false)?;
    let b = shaped("B", &args.b, &tgn, &[tokens, groups, dstate], true)?;
    let c = shaped("C", &args.c, &tgn, &[tokens, groups, dstate], true)?;
    let z = args.z.as_ref().map(|t| shaped("z", t, &thp, &[tokens, heads, dim], true)).transpose()?;
    let out = match &args.out {
        Some(o) => {
            let r = o.as_ref();
            let s = shaped("out", &r, &thp, &[tokens, heads, dim], true)?;
            ArgError::check_written("out", r.layout())?;
            Some(s)
        }
        None => None,
    };
    let d = match &args.d {
        None => None,
        Some(t) if t.shape() == [heads] => {
            float("D", t.dtype())?;
            Some(Strided::for_arg("D", t.layout(), [t.strides()[0], 0, 0])?)
        }
        Some(t) => Some(shaped("D", t, &["heads", "dim"], &[heads, dim], false).map_err(|e| match e {
            SsdError::Arg(ArgError::Shape { arg, actual, .. }) => SsdError::from(ArgError::Shape {
                arg,
                expected: format!("[heads={heads}] or [heads={heads}, dim={dim}]"),
                actual,
            }),
            e => e,
        })?),
    };
    let dt_bias = args
        .dt_bias
        .as_ref()
        .map(|t| {
            shaped("dt_bias", t, &["heads"], &[heads], false)
                .map(|s| Strided { offset: s.offset, strides: [s.strides[0]] })
        })
        .transpose()?;
    Ok(TokenTensors { tokens, heads, dim, groups, dstate, x, dt, a, b, c, z, out, d, dt_bias })
}

/// Checks that `chunk_size` is a power of two and `dt_limit` an ordered, non-NaN range.
fn check_chunk_size_and_dt_limit(args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), SsdError> {
    if args.chunk_size == 0 || !args.chunk_size.is_power_of_two() {
        return Err(SsdError::ChunkSize(args.chunk_size));
    }
    let (lo, hi) = args.dt_limit;
    if lo.is_nan() || hi.is_nan() || lo > hi {
        return Err(SsdError::DtLimit { lo, hi });
    }
    Ok(())
}

/// The chunk metadata of one call, dtypes and lengths checked (values: [`check_metadata`]).
struct ChunkMetadata {
    nchunks: usize,
    batch: usize,
    cu_seqlens: Strided<1>,
    cu_chunk_seqlens: Strided<1>,
    last_chunk_indices: Strided<1>,
    seq_idx: Strided<1>,
}

/// Resolves nchunks (from `cu_chunk_seqlens`) and batch (from `cu_seqlens`); checks the metadata's lengths.
fn resolve_chunk_metadata(args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<ChunkMetadata, SsdError> {
    let cu_seqlens = index("cu_seqlens", &args.cu_seqlens)?;
    let cu_chunk_seqlens = index("cu_chunk_seqlens", &args.cu_chunk_seqlens)?;
    let last_chunk_indices = index("last_chunk_indices", &args.last_chunk_indices)?;
    let seq_idx = index("seq_idx", &args.seq_idx)?;
    let cu_len = args.cu_chunk_seqlens.shape()[0];
    if cu_len == 0 {
        return Err(SsdError::from(ArgError::Shape {
            arg: "cu_chunk_seqlens",
            expected: "[nchunks + 1]".into(),
            actual: vec![0],
        }));
    }
    let nchunks = cu_len - 1;
    if args.seq_idx.shape() != [nchunks] {
        return Err(SsdError::SeqIdxLength { nchunks, cu_len, actual: args.seq_idx.shape().to_vec() });
    }
    if args.cu_seqlens.shape()[0] == 0 {
        return Err(SsdError::from(ArgError::Shape {
            arg: "cu_seqlens",
            expected: "[batch + 1]".into(),
            actual: vec![0],
        }));
    }
    let batch = args.cu_seqlens.shape()[0] - 1;
    if args.last_chunk_indices.shape() != [batch] {
        return Err(SsdError::from(ArgError::Shape {
            arg: "last_chunk_indices",
            expected: format!("[batch={batch}] (batch from `cu_seqlens`)"),
            actual: args.last_chunk_indices.shape().to_vec(),
        }));
    }
    Ok(ChunkMetadata { nchunks, batch, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx })
}

/// The state tensors of one call and the slot tables addressing `ssm_state`, checked.
struct States {
    state_dtype: DType,
    tables: Tables,
    initial_states: Option<Strided<4>>,
    varlen_states: Option<Strided<4>>,
    ssm_state: Option<Strided<4>>,
    slots: usize,
}

/// Resolves `state_dtype`; checks the slot tables, `initial_states`, `varlen_states` and the `ssm_state` pool.
fn resolve_states(
    args: &MambaChunkScanCombinedVarlenArgs<'_>,
    io: &TokenTensors,
    meta: &ChunkMetadata,
) -> Result<States, SsdError> {
    let (heads, dim, dstate) = (io.heads, io.dim, io.dstate);
    let (nchunks, batch) = (meta.nchunks, meta.batch);
    let state_dtype = args.state_dtype.unwrap_or(args.c.dtype());
    float("state_dtype", state_dtype)?;
    let tables = resolve_tables(args, batch)?;
    let initial_states = match &args.initial_states {
        Some(t) => {
            float("initial_states", t.dtype())?;
            Some(state4("initial_states", t, &[batch, heads, dim, dstate], "batch")?)
        }
        None => None,
    };
    let varlen_states = match &args.varlen_states {
        Some(vs) => {
            let vs = vs.as_ref();
            if vs.dtype() != state_dtype {
                return Err(SsdError::StateDtype { expected: state_dtype, actual: vs.dtype() });
            }
            let (rows, row_name) =
                if args.return_intermediate_states { (nchunks, "nchunks") } else { (batch, "batch") };
            let s = state4("varlen_states", &vs, &[rows, heads, dim, dstate], row_name)?;
            ArgError::check_written("varlen_states", vs.layout())?;
            Some(s)
        }
        None => None,
    };
    let (ssm_state, slots) = match &args.ssm_state {
        Some(pool) => {
            let pool = pool.as_ref();
            if pool.dtype() != state_dtype {
                return Err(SsdError::from(ArgError::DType {
                    arg: "ssm_state",
                    expected: format!("{state_dtype} (`state_dtype`, default `C`'s dtype)"),
                    actual: pool.dtype(),
                }));
            }
            let slots = if pool.rank() == 4 { pool.shape()[0] } else { 0 };
            let s = state4("ssm_state", &pool, &[slots, heads, dim, dstate], "slots")?;
            ArgError::check_written("ssm_state", pool.layout())?;
            (Some(s), slots)
        }
        None => (None, 0),
    };
    Ok(States { state_dtype, tables, initial_states, varlen_states, ssm_state, slots })
}

/// Builds the plan; `chunk_rows` and `scratch_layout` are placeholders until the metadata values are checked.
fn build_plan(
    args: &MambaChunkScanCombinedVarlenArgs<'_>,
    device: Device,
    io: TokenTensors,
    meta: ChunkMetadata,
    states: States,
) -> SsdPlan {
    let TokenTensors { tokens, heads, dim, groups, dstate, x, dt, a, b, c, z, out, d, dt_bias } = io;
    let ChunkMetadata { nchunks, batch, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx } = meta;
    let States { state_dtype, tables, initial_states, varlen_states, ssm_state, slots } = states;
    let io_dtypes = IoDtypes {
        x: args.x.dtype(),
        dt: args.dt.dtype(),
        b: args.b.dtype(),
        c: args.c.dtype(),
        z: args.z.as_ref().map(|t| t.dtype()),
        out: args.out.as_ref().map(|t| t.dtype()),
    };
    SsdPlan {
        device,
        tokens,
        heads,
        dim,
        dstate,
        groups,
        chunk_size: args.chunk_size,
        nchunks,
        batch,
        io_dtypes,
        state_dtype,
        x,
        dt,
        b,
        c,
        z,
        out,
        a: Strided { offset: a.offset, strides: [a.strides[0]] },
        d,
        dt_bias,
        initial_states,
        varlen_states,
        ssm_state,
        slots,
        initial_state_indices: tables.initial,
        has_initial_state: tables.has,
        final_state_indices: tables.fin,
        checkpoint_chunk_indices: tables.ck_chunk,
        checkpoint_state_indices: tables.ck_slot,
        pad_slot_id: args.pad_slot_id,
        cu_seqlens,
        cu_chunk_seqlens,
        last_chunk_indices,
        seq_idx,
        dt_softplus: args.dt_softplus,
        dt_limit: args.dt_limit,
        return_intermediate_states: args.return_intermediate_states,
        scratch_offset: None,
        chunk_rows: args.chunk_size,
        scratch_layout: ScratchLayout { q_row: 0, state_row: 0, dt_out: 0, da_cumsum: 0, states: 0, cb: 0, len: 0 },
    }
}

/// Computes the scratch layout (overflow-checked) and checks the caller's `scratch` view against it.
fn resolve_scratch(plan: &mut SsdPlan, args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), SsdError> {
    plan.scratch_layout = scratch_layout(plan).ok_or_else(|| {
        SsdError::from(ArgError::Overflow {
            arg: "chunk_size",
            what: "the scratch (chunks × heads × chunk rows × …)",
            shape: args.x.shape().to_vec(),
            strides: args.x.strides().to_vec(),
        })
    })?;
    if let Some(w) = &args.scratch {
        let needed = plan.scratch_len();
        let ok = w.dtype() == DType::F32
            && w.rank() == 1
            && w.shape()[0] >= needed
            && (w.strides()[0] == 1 || w.shape()[0] <= 1);
        if !ok {
            return Err(SsdError::Scratch { needed, dtype: w.dtype(), actual: w.shape().to_vec() });
        }
        plan.scratch_offset = Some(w.layout().offset());
    }
    Ok(())
}

/// The pool-addressing tables of one call, shapes and dtypes checked.
struct Tables {
    initial: Option<SlotTable>,
    has: Option<SlotTable>,
    fin: Option<SlotTable>,
    ck_chunk: Option<SlotTable>,
    ck_slot: Option<SlotTable>,
}

/// Checks the tables' shapes, dtypes and the arguments each needs.
fn resolve_tables(args: &MambaChunkScanCombinedVarlenArgs<'_>, batch: usize) -> Result<Tables, SsdError> {
    let table = |arg: &'static str, t: &TensorRef<'_>, bool_ok: bool| -> Result<SlotTable, SsdError> {
        if !(t.dtype().is_index() || (bool_ok && t.dtype() == DType::Bool)) {
            let expected = if bool_ok { "bool, i32 or i64" } else { "i32 or i64" };
            return Err(SsdError::from(ArgError::DType { arg, expected: expected.into(), actual: t.dtype() }));
        }
        if t.shape() != [batch] {
            return Err(SsdError::from(ArgError::Shape {
                arg,
                expected: format!("[batch={batch}] (batch from `cu_seqlens`)"),
                actual: t.shape().to_vec(),
            }));
        }
        Strided::for_arg(arg, t.layout(), [t.strides()[0]])?;
        Ok(SlotTable::of(t).expect("rank 1"))
    };
    let requires = |arg: &'static str, needs: &'static str| Err(SsdError::from(ArgError::Requires { arg, needs }));
    let pool = args.ssm_state.is_some();
    if pool
        && args.initial_state_indices.is_none()
        && args.final_state_indices.is_none()
        && args.checkpoint_state_indices.is_none()
    {
        return requires(
            "ssm_state",
            "`initial_state_indices`, `final_state_indices` or `checkpoint_state_indices` (the slots it is addressed by)",
        );
    }
    if args.varlen_states.is_none() && args.return_intermediate_states {
        return requires("return_intermediate_states", "`varlen_states` (where the chunk states go)");
    }
    let initial = match &args.initial_state_indices {
        Some(_) if !pool => return requires("initial_state_indices", "`ssm_state` (the pool it indexes)"),
        Some(_) if args.initial_states.is_some() => {
            return requires(
                "initial_state_indices",
                "`initial_states` = None (the initial states come from `ssm_state`)",
            );
        }
        Some(t) => Some(table("initial_state_indices", t, false)?),
        None => None,
    };
    let has = match &args.has_initial_state {
        Some(_) if args.initial_states.is_none() && initial.is_none() => {
            return requires(
                "has_initial_state",
                "`initial_states` or `initial_state_indices` (the states it selects)",
            );
        }
        Some(t) => Some(table("has_initial_state", t, true)?),
        None => None,
    };
    let fin = match &args.final_state_indices {
        Some(_) if !pool => return requires("final_state_indices", "`ssm_state` (the pool it indexes)"),
        Some(t) => Some(table("final_state_indices", t, false)?),
        None => None,
    };
    let ck_chunk = match &args.checkpoint_chunk_indices {
        Some(_) if args.checkpoint_state_indices.is_none() => {
            return requires("checkpoint_chunk_indices", "`checkpoint_state_indices` (where the checkpoints go)");
        }
        Some(t) => Some(table("checkpoint_chunk_indices", t, false)?),
        None => None,
    };
    let ck_slot = match &args.checkpoint_state_indices {
        Some(_) if !pool => return requires("checkpoint_state_indices", "`ssm_state` (the pool it indexes)"),
        Some(_) if ck_chunk.is_none() => {
            return requires("checkpoint_state_indices", "`checkpoint_chunk_indices` (the chunk each checkpoint ends)");
        }
        Some(t) => Some(table("checkpoint_state_indices", t, false)?),
        None => None,
    };
    Ok(Tables { initial, has, fin, ck_chunk, ck_slot })
}

/// Value checks of host-resident slot tables (skipped for device tables): every entry is the
/// pad or a slot of its pool, and no slot written by one sequence is read or written by
/// another (the aliasing rule, [`first_slot_conflict`]).
fn check_slots(p: &SsdPlan, args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), SsdError> {
    fn host<'t>(t: &Option<TensorRef<'t>>) -> Option<Option<&'t [u8]>> {
        t.as_ref().map(|t| t.host_bytes())
    }
    let (init, has, fin) =
        (host(&args.initial_state_indices), host(&args.has_initial_state), host(&args.final_state_indices));
    let (ck_chunk, ck_slot) = (host(&args.checkpoint_chunk_indices), host(&args.checkpoint_state_indices));
    if [init, has, fin, ck_chunk, ck_slot].iter().any(|b| matches!(b, Some(None)))
        || (init.is_none() && fin.is_none() && ck_slot.is_none())
    {
        return Ok(());
    }
    let pad = || p.pad_slot_id.map_or_else(|| "none".to_string(), |v| v.to_string());
    let resolve = |arg: &'static str, t: SlotTable, bytes: &[u8], b: usize| {
        let value = t.get(bytes, b, 0);
        match Slot::resolve(value, p.pad_slot_id, p.slots) {
            Slot::Pad => Ok(None),
            Slot::Row(r) => Ok(Some(r)),
            Slot::OutOfRange => Err(SsdError::SlotOutOfRange { arg, seq: b, value, slots: p.slots, pad: pad() }),
        }
    };
    // Grown as sequences are read, not reserved from `batch` (a broadcast `cu_seqlens` can
    // describe more sequences than memory holds).
    let mut uses = Vec::new();
    for b in 0..p.batch {
        if let (Some(t), Some(Some(bytes))) = (p.initial_state_indices, init) {
            let reads = match (p.has_initial_state, has) {
                (Some(m), Some(Some(mb))) => m.get(mb, b, 0) != 0,
                _ => true,
            };
            let slot = resolve("initial_state_indices", t, bytes, b)?;
            if let (true, Some(slot)) = (reads, slot) {
                uses.push(SlotUse { slot, written: false, seq: b });
            }
        }
        if let (Some(t), Some(Some(bytes))) = (p.final_state_indices, fin)
            && let Some(slot) = resolve("final_state_indices", t, bytes, b)?
        {
            uses.push(SlotUse { slot, written: true, seq: b });
        }
    }
    let used = |c: ssm_tensor::SlotConflict| if c.other().written { "written" } else { "read" };
    if let Some(c) = first_slot_conflict(&mut uses) {
        return Err(SsdError::SlotConflict {
            slot: c.slot,
            writer: c.writer().seq,
            other: c.other().seq,
            other_use: used(c),
        });
    }
    // The checkpoints are writes too: checked after the final states, so that a conflict of
    // those alone keeps its own error.
    // The plan holds both checkpoint tables or neither (`resolve_tables`).
    let (Some(t), Some(ct), Some(Some(bytes)), Some(Some(cb))) =
        (p.checkpoint_state_indices, p.checkpoint_chunk_indices, ck_slot, ck_chunk)
    else {
        return Ok(());
    };
    for b in 0..p.batch {
        // A sequence without a checkpoint writes nothing, whatever its slot entry holds (vLLM
        // leaves its null block there).
        if ct.get(cb, b, 0) < 0 {
            continue;
        }
        let Some(slot) = resolve("checkpoint_state_indices", t, bytes, b)? else { continue };
        if p.final_slot(fin.flatten(), b) == Some(slot) {
            return Err(SsdError::CheckpointIsFinalSlot { seq: b, slot });
        }
        uses.push(SlotUse { slot, written: true, seq: b });
    }
    match first_slot_conflict(&mut uses) {
        Some(c) => Err(SsdError::CheckpointSlotConflict {
            slot: c.slot,
            writer: c.writer().seq,
            other: c.other().seq,
            other_use: used(c),
        }),
        None => Ok(()),
    }
}

/// Value checks of a host-resident `checkpoint_chunk_indices` against host chunk metadata
/// (already checked): every entry is -1 or one of its sequence's chunks.
fn check_checkpoint_chunks(p: &SsdPlan, args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), SsdError> {
    let (Some(t), Some(bytes)) =
        (p.checkpoint_chunk_indices, args.checkpoint_chunk_indices.as_ref().and_then(|t| t.host_bytes()))
    else {
        return Ok(());
    };
    let mut first = 0i64;
    for b in 0..p.batch {
        let last = p.last_chunk(args, b);
        let value = t.get(bytes, b, 0);
        let (lo, hi) = if last < 0 { (first, first - 1) } else { (first, last) };
        if value != -1 && !(lo..=hi).contains(&value) {
            let chunks = if last < 0 { "it has none".to_string() } else { format!("chunks {lo}..={hi}") };
            return Err(SsdError::CheckpointChunk { seq: b, value, chunks });
        }
        if last >= 0 {
            first = last + 1;
        }
    }
    Ok(())
}

/// The scratch layout of a call, or `None` when its size overflows.
fn scratch_layout(p: &SsdPlan) -> Option<ScratchLayout> {
    let (c, h, q) = (p.nchunks, p.heads, p.chunk_rows);
    let q_row = q.checked_next_multiple_of(8)?;
    let state_row = p.dstate.checked_next_multiple_of(8)?;
    let dt_out = 0;
    let da_cumsum = c.checked_mul(h)?.checked_mul(q_row)?;
    let states = da_cumsum.checked_mul(2)?;
    let cb = states.checked_add(c.checked_mul(h)?.checked_mul(p.dim)?.checked_mul(state_row)?)?;
    let len = cb.checked_add(c.checked_mul(p.groups)?.checked_mul(q)?.checked_mul(q_row)?)?;
    Some(ScratchLayout { q_row, state_row, dt_out, da_cumsum, states, cb, len })
}

/// Value checks of host-resident chunk metadata (skipped for device tensors); returns the
/// longest chunk, or `None` when the metadata lives on a device.
fn check_metadata(p: &SsdPlan, args: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<Option<usize>, SsdError> {
    let host = [&args.cu_seqlens, &args.cu_chunk_seqlens, &args.seq_idx, &args.last_chunk_indices]
        .iter()
        .all(|t| t.host_bytes().is_some());
    if !host {
        return Ok(None);
    }
    let mut longest = 0usize;
    let total = p.tokens as i64;
    let cs = |i: usize| args.cu_seqlens.elem_i64(p.cu_seqlens.at([i]));
    let cc = |i: usize| args.cu_chunk_seqlens.elem_i64(p.cu_chunk_seqlens.at([i]));
    let mut prev = 0;
    for i in 0..=p.batch {
        let v = cs(i);
        if (i == 0 && v != 0) || v < prev || v > total || (i == p.batch && v != total) {
            return Err(SsdError::Offsets {
                arg: "cu_seqlens",
                rule: "be non-decreasing",
                at: i,
                value: v,
                prev,
                tokens: p.tokens,
            });
        }
        prev = v;
    }
    let mut prev = 0;
    for i in 0..=p.nchunks {
        let v = cc(i);
        if (i == 0 && v != 0) || (i > 0 && v <= prev) || v > total || (i == p.nchunks && v != total) {
            return Err(SsdError::Offsets {
                arg: "cu_chunk_seqlens",
                rule: "be strictly increasing (no empty chunk)",
                at: i,
                value: v,
                prev,
                tokens: p.tokens,
            });
        }
        if i > 0 {
            longest = longest.max((v - prev) as usize);
        }
        if i > 0 && v - prev > p.chunk_size as i64 {
            return Err(SsdError::ChunkTooLong {
                chunk: i - 1,
                start: prev,
                end: v,
                len: v - prev,
                chunk_size: p.chunk_size,
            });
        }
        prev = v;
    }
    let mut prev_seq = -1i64;
    for c in 0..p.nchunks {
        let s = args.seq_idx.elem_i64(p.seq_idx.at([c]));
        if s < 0 || s >= p.batch as i64 || s < prev_seq {
            return Err(SsdError::SeqIdx { chunk: c, value: s, prev: prev_seq, batch: p.batch });
        }
        let (start, end) = (cc(c), cc(c + 1));
        let (ss, se) = (cs(s as usize), cs(s as usize + 1));
        if start < ss || end > se {
            return Err(SsdError::ChunkSpansSequences { chunk: c, start, end, seq: s, seq_start: ss, seq_end: se });
        }
        prev_seq = s;
    }
    // Chunks tile [0, T) in order and each lies inside its sequence, so the chunks of
    // sequence b are exactly those with seq_idx == b; its last one must be named.
    let mut c = 0usize;
    for b in 0..p.batch {
        let mut last = -1i64;
        while c < p.nchunks && args.seq_idx.elem_i64(p.seq_idx.at([c])) == b as i64 {
            last = c as i64;
            c += 1;
        }
        let got = args.last_chunk_indices.elem_i64(p.last_chunk_indices.at([b]));
        if got != last {
            return Err(SsdError::LastChunkIndex { seq: b, expected: last, actual: got });
        }
    }
    Ok(Some(longest))
}
