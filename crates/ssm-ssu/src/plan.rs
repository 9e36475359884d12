use ssm_tensor::ArgError;
use std::cell::RefCell;

use ssm_tensor::{DType, Device, MAX_RANK, Slot, SlotUse, TensorMut, TensorRef, first_slot_conflict};

use crate::{SelectiveStateUpdateArgs, SsuError, StochasticRounding};

/// How tokens are laid out, resolved from the shapes of `x` and `cu_seqlens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// One token per sequence: `x` `[batch, heads, dim]`, sequence `b` is row `b`.
    OneToken,
    /// Packed varlen: sequence `b` is rows `cu_seqlens[b]..cu_seqlens[b+1]`.
    Varlen,
    /// Dense `x` `[batch, steps, heads, dim]`: every sequence has `steps` tokens.
    Dense {
        /// Tokens per sequence.
        steps: usize,
    },
}

/// Whether `A`/`dt`/`dt_bias` are one scalar per head (Mamba2) or per channel (Mamba1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamForm {
    /// vLLM's `TIE_HDIM`: stride-0 views; `A[h,0,0]`, `dt[k,h,0]`, `dt_bias[h,0]` are read.
    Tied,
    /// Per channel: `A[h,p,n]`, `dt[k,h,p]`, `dt_bias[h,p]`.
    PerChannel,
}

/// The SSU algorithm names vLLM and FlashInfer accept (`--mamba-ssu-algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SsuAlgorithm {
    /// Let the backend choose.
    #[default]
    Auto,
    /// FlashInfer's simple kernel.
    Simple,
    /// Tiles along dim rows.
    Vertical,
    /// Tiles along dstate columns.
    Horizontal,
}

impl std::str::FromStr for SsuAlgorithm {
    type Err = SsuError;
    fn from_str(s: &str) -> Result<Self, SsuError> {
        match s {
            "auto" => Ok(SsuAlgorithm::Auto),
            "simple" => Ok(SsuAlgorithm::Simple),
            "vertical" => Ok(SsuAlgorithm::Vertical),
            "horizontal" => Ok(SsuAlgorithm::Horizontal),
            other => Err(SsuError::UnknownAlgorithm { name: other.to_string() }),
        }
    }
}

impl SsuAlgorithm {
    /// The name as vLLM spells it.
    pub fn name(self) -> &'static str {
        match self {
            SsuAlgorithm::Auto => "auto",
            SsuAlgorithm::Simple => "simple",
            SsuAlgorithm::Vertical => "vertical",
            SsuAlgorithm::Horizontal => "horizontal",
        }
    }
}

pub use ssm_tensor::Strided;

/// Addressing of a per-token tensor (`x`, `dt`, `z`, `out`: inner axes heads, dim; `B`, `C`:
/// groups, dstate). Token `t` of sequence `b` starts at `offset + start(b) + t·tok`, where
/// `start(b)` is `cu_seqlens[b]·tok` on the varlen route and `b·seq` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenStrides {
    /// Element offset of the first token.
    pub offset: isize,
    /// Stride between sequences (one-token and dense routes).
    pub seq: isize,
    /// Stride between consecutive tokens of a sequence (and between packed rows).
    pub tok: isize,
    /// Stride of the heads (or groups) axis.
    pub head: isize,
    /// Stride of the dim (or dstate) axis.
    pub dim: isize,
}

impl TokenStrides {
    /// Element index of row `row` (a packed row, or `b·steps + t` resolved by the caller through
    /// [`SsuPlan::token_base`]) for head `h` and channel `p`.
    #[inline(always)]
    pub fn at(&self, base: isize, h: usize, p: usize) -> usize {
        (self.offset + base + h as isize * self.head + p as isize * self.dim) as usize
    }
}

/// A slot table (`state_batch_indices`, `dst_state_batch_indices`) as the kernels read it:
/// the shared [`SlotTable`](ssm_tensor::SlotTable).
pub use ssm_tensor::SlotTable as IndexTable;

/// Resolved sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsuDims {
    /// Sequences (grid rows).
    pub seqs: usize,
    /// Token rows in `x` (batch, packed tokens, or batch·steps).
    pub rows: usize,
    /// Heads (1 for the Mamba1 form).
    pub heads: usize,
    /// Channels per head (head dim).
    pub dim: usize,
    /// State size per channel.
    pub dstate: usize,
    /// Groups of `B`/`C`.
    pub groups: usize,
    /// Slots in the state pool.
    pub slots: usize,
}

/// Element types of every argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsuDtypes {
    /// State pool.
    pub state: DType,
    /// `x`.
    pub x: DType,
    /// `dt`.
    pub dt: DType,
    /// `A`.
    pub a: DType,
    /// `B`.
    pub b: DType,
    /// `C`.
    pub c: DType,
    /// `D`, when given.
    pub d: Option<DType>,
    /// `dt_bias`, when given.
    pub dt_bias: Option<DType>,
    /// `z`, when given.
    pub z: Option<DType>,
    /// `out`.
    pub out: DType,
    /// `cu_seqlens`, when given.
    pub cu_seqlens: Option<DType>,
    /// `num_accepted_tokens`, when given.
    pub num_accepted_tokens: Option<DType>,
}

/// The intermediate-state buffer of a verification call (FlashInfer's
/// `intermediate_states_buffer`), resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntermediatePlan {
    /// `[entries, steps, heads, dim, dstate]` (dstate stride 1; the state's dtype).
    pub buffer: Strided<5>,
    /// Entries of the buffer.
    pub entries: usize,
    /// Steps per entry: token `t` of a sequence goes to step `t`.
    pub steps: usize,
    /// `intermediate_state_indices` `[>= seqs]` and its dtype; `None`: the source slot.
    pub indices: Option<(Strided<1>, DType)>,
    /// `intermediate_state_scales` `[entries, steps, heads, dim]` (f32), with an i16 / i8 buffer.
    pub scales: Option<Strided<4>>,
}

impl IntermediatePlan {
    /// Element index of `[entry, step, h, p, n]`.
    #[inline(always)]
    pub fn at(&self, entry: usize, step: usize, h: usize, p: usize, n: usize) -> usize {
        self.buffer.at([entry, step, h, p, n])
    }
}

/// A checked selective state update: everything a backend needs to run it, resolved once.
#[derive(Debug, Clone, PartialEq)]
pub struct SsuPlan {
    /// Token layout.
    pub route: Route,
    /// Speculative decoding (`num_accepted_tokens` given): start from column
    /// `max(num_accepted − 1, 0)`, store token t's state to `dst[b, t]`, no final store.
    pub spec: bool,
    /// Tied or per-channel parameters.
    pub form: ParamForm,
    /// Sizes.
    pub dims: SsuDims,
    /// Element types.
    pub dtypes: SsuDtypes,
    /// Device of every tensor.
    pub device: Device,
    /// `state` `[slots, heads, dim, dstate]` (dstate stride is 1).
    pub state: Strided<4>,
    /// `x`.
    pub x: TokenStrides,
    /// `dt` (its dim stride is 0 in the tied form).
    pub dt: TokenStrides,
    /// `z`.
    pub z: Option<TokenStrides>,
    /// `out`.
    pub out: TokenStrides,
    /// `B` (head = group axis, dim = dstate axis).
    pub b: TokenStrides,
    /// `C`.
    pub c: TokenStrides,
    /// `A` `[heads, dim, dstate]`.
    pub a: Strided<3>,
    /// `D` `[heads, dim]`.
    pub d: Option<Strided<2>>,
    /// `dt_bias` `[heads, dim]`.
    pub dt_bias: Option<Strided<2>>,
    /// Source slot table.
    pub state_batch_indices: Option<IndexTable>,
    /// Destination slot table (already defaulted to the source table when absent).
    pub dst_state_batch_indices: Option<IndexTable>,
    /// `num_accepted_tokens` `[seqs]`.
    pub num_accepted_tokens: Option<Strided<1>>,
    /// `cu_seqlens` `[seqs + 1]`.
    pub cu_seqlens: Option<Strided<1>>,
    /// The pad value.
    pub pad_slot_id: Option<i64>,
    /// Apply softplus to `dt + dt_bias`.
    pub dt_softplus: bool,
    /// Stochastic rounding of the final fp16 store.
    pub stochastic_rounding: Option<StochasticRounding>,
    /// `rand_seed` given: the element offset of its one i64 element (the key is read from there
    /// when the call runs, in place of `stochastic_rounding.seed`).
    pub rand_seed: Option<usize>,
    /// `disable_state_update`: the pool is never written.
    pub disable_state_update: bool,
    /// The intermediate-state buffer: every token's state goes there, the pool is not written.
    pub intermediate: Option<IntermediatePlan>,
    /// `state_scale` `[slots, heads, dim]` (f32): the decode scale of each row of an i16 / i8
    /// state (block-scaled, [`crate::quant`]); given exactly when the state is i16 or i8.
    pub state_scale: Option<Strided<3>>,
    /// Index values were on the host and were all checked.
    pub host_indices_checked: bool,
    /// No slot written by one sequence is read or written by another. Host plans always
    /// have it (the plan refuses aliasing tables, docs/CONVENTIONS.md "Pads and indices");
    /// `false` only for device tables, whose values the plan cannot see.
    pub alias_free: bool,
}

impl SsuPlan {
    /// Whether `slot` is the pad value.
    #[inline(always)]
    pub fn is_pad(&self, slot: i64) -> bool {
        self.pad_slot_id == Some(slot)
    }

    /// The Philox key of a host call's stochastic rounding: read from `rand_seed` (the
    /// tensor the plan was made from) when given, else `stochastic_rounding.seed`; `None`
    /// without stochastic rounding or when `rand_seed` is not a host tensor.
    pub fn host_seed(&self, rand_seed: Option<&TensorRef<'_>>) -> Option<u64> {
        let sr = self.stochastic_rounding?;
        match (self.rand_seed, rand_seed) {
            (Some(at), Some(t)) => Some(ssm_tensor::elem::read_i64(t.host_bytes()?, DType::I64, at) as u64),
            _ => Some(sr.seed),
        }
    }

    /// The intermediate-buffer entry of sequence `b` whose source slot is `src`, read from the
    /// host bytes of `intermediate_state_indices` when given, else the source slot; `None`
    /// without a buffer or for a pad entry (which writes no buffer row).
    pub fn host_entry(&self, indices: Option<&[u8]>, b: usize, src: i64) -> Option<i64> {
        let ip = self.intermediate?;
        match (ip.indices, indices) {
            (Some((st, dtype)), Some(bytes)) => {
                Some(ssm_tensor::elem::read_i64(bytes, dtype, st.at([b]))).filter(|&e| !self.is_pad(e))
            }
            _ => Some(src),
        }
    }

    /// Whether the call writes the state pool: updates are not disabled and not redirected to
    /// an intermediate buffer.
    #[inline(always)]
    pub fn writes_state(&self) -> bool {
        !self.disable_state_update && self.intermediate.is_none()
    }

    /// Heads per group.
    #[inline(always)]
    pub fn heads_per_group(&self) -> usize {
        self.dims.heads / self.dims.groups
    }

    /// Tokens of sequence `b` and the element offset contribution of its first token, for a
    /// tensor with `seq`/`tok` strides `ts`. On the varlen route `cu` are `cu_seqlens[b]` and
    /// `cu_seqlens[b + 1]`.
    #[inline(always)]
    pub fn token_base(&self, ts: &TokenStrides, b: usize, start_row: usize) -> isize {
        match self.route {
            Route::Varlen => start_row as isize * ts.tok,
            Route::OneToken | Route::Dense { .. } => b as isize * ts.seq,
        }
    }
}

fn dtype_in(arg: &'static str, t: DType, allowed: &[DType], expected: &'static str) -> Result<(), SsuError> {
    if allowed.contains(&t) {
        Ok(())
    } else {
        Err(SsuError::from(ArgError::DType { arg, expected: expected.into(), actual: t }))
    }
}

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
const STATES: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::I16, DType::I8];
const INDICES: &[DType] = &[DType::I32, DType::I64];

/// A short inline list (a shape or strides), so that planning never allocates.
#[derive(Clone, Copy)]
struct Dims<T: Copy> {
    len: usize,
    a: [T; MAX_RANK],
}

impl<T: Copy + Default> Dims<T> {
    fn from_slice(s: &[T]) -> Self {
        let mut a = [T::default(); MAX_RANK];
        a[..s.len()].copy_from_slice(s);
        Dims { len: s.len(), a }
    }
    fn insert(&mut self, at: usize, v: T) {
        self.a.copy_within(at..self.len, at + 1);
        self.a[at] = v;
        self.len += 1;
    }
}

impl<T: Copy> std::ops::Deref for Dims<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.a[..self.len]
    }
}

/// Shape and strides after inserting a size-1 / stride-0 axis at `at` (callers check the
/// rank first, so there is room).
fn unsqueeze(shape: &Dims<usize>, strides: &Dims<isize>, at: usize) -> (Dims<usize>, Dims<isize>) {
    let (mut sh, mut st) = (*shape, *strides);
    sh.insert(at, 1);
    st.insert(at, 0);
    (sh, st)
}

fn shape_str(names: &[(&str, usize)]) -> String {
    let parts: Vec<String> = names.iter().map(|(n, v)| format!("{n}={v}")).collect();
    format!("[{}]", parts.join(", "))
}

struct Norm {
    shape: Dims<usize>,
    strides: Dims<isize>,
    offset: isize,
}

fn norm_ref(t: &TensorRef<'_>) -> Norm {
    Norm {
        shape: Dims::from_slice(t.shape()),
        strides: Dims::from_slice(t.strides()),
        offset: t.layout().offset() as isize,
    }
}

fn norm_mut(t: &TensorMut<'_>) -> Norm {
    Norm {
        shape: Dims::from_slice(t.shape()),
        strides: Dims::from_slice(t.strides()),
        offset: t.layout().offset() as isize,
    }
}

/// Refuses a written tensor `arg` (as given: `shape`, `strides`; planned as `norm`) whose
/// logical elements may share memory. Sufficient condition: sorted by stride, each stride is
/// at least the span of the axes inside it. The spans are checked: an empty view admits any
/// stride, so a span could otherwise wrap and pass.
fn written_disjoint(
    arg: &'static str,
    norm: (&[usize], &[isize]),
    shape: &[usize],
    strides: &[isize],
) -> Result<(), SsuError> {
    let overlapping =
        || SsuError::from(ArgError::Overlapping { arg, shape: shape.to_vec(), strides: strides.to_vec() });
    let mut buf = [(0usize, 0isize); MAX_RANK];
    let mut len = 0;
    for (&n, &s) in norm.0.iter().zip(norm.1) {
        if n > 1 {
            if s <= 0 {
                return Err(overlapping());
            }
            buf[len] = (n, s);
            len += 1;
        }
    }
    let dims = &mut buf[..len];
    dims.sort_unstable_by_key(|&(_, s)| s);
    let mut span = 1isize;
    for &mut (n, s) in dims {
        if s < span {
            return Err(overlapping());
        }
        span = isize::try_from(n).ok().and_then(|n| s.checked_mul(n)).ok_or_else(|| {
            SsuError::from(ArgError::Overflow {
                arg,
                what: "stride span",
                shape: shape.to_vec(),
                strides: strides.to_vec(),
            })
        })?;
    }
    Ok(())
}

/// The table column a speculative sequence starts from: `max(num_accepted − 1, 0)` (vLLM's
/// rule), without overflow for any `num_accepted`.
#[inline]
pub fn start_column(num_accepted: i64) -> usize {
    usize::try_from(num_accepted.saturating_sub(1)).unwrap_or(0)
}

/// Reads an integer from a host index tensor through its layout.
struct HostInts<'a> {
    bytes: &'a [u8],
    dtype: DType,
}

impl HostInts<'_> {
    #[inline]
    fn get(&self, elem: usize) -> i64 {
        ssm_tensor::elem::read_i64(self.bytes, self.dtype, elem)
    }
}

thread_local! {
    /// Reused lists of slot uses for the aliasing checks (the pool's slots, the intermediate
    /// buffer's entries), so that planning a host call allocates only when a batch is larger
    /// than any before it on this thread.
    static SLOT_USES: RefCell<(Vec<SlotUse>, Vec<SlotUse>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Checks every argument of a selective state update and resolves how to run it.
///
/// Applies vLLM's unsqueeze rules, detects the route (one-token, varlen, dense), the
/// parameter form (tied by strides, as vLLM does), and, for host-resident index tensors,
/// checks every index value the call will read. Errors name the argument and what was
/// expected; nothing is written by a failed call. The stages run in this order, and each
/// reports its first error: devices, dtypes, the state pool, the token tensors, the per-head
/// parameters, the sequences and their tables, the intermediate buffer, then (host indices)
/// the index values.
pub(crate) fn plan_selective_state_update(args: &SelectiveStateUpdateArgs<'_>) -> Result<SsuPlan, SsuError> {
    let device = check_devices(args)?;
    let rand_seed = check_dtypes(args)?;
    let pool = state_pool(args)?;
    let [slots, heads, dim, dstate] = pool.dims;
    let tokens = token_tensors(args, heads, dim, dstate)?;
    let params = head_params(args, heads, dim, dstate, &tokens.dt)?;
    let seqs = sequence_tables(args, tokens.route, tokens.rows)?;
    let intermediate = plan_intermediate(args, tokens.route, seqs.seqs, [heads, dim, dstate])?;

    let mut plan = SsuPlan {
        route: tokens.route,
        spec: seqs.num_accepted_tokens.is_some(),
        form: params.form,
        dims: SsuDims { seqs: seqs.seqs, rows: tokens.rows, heads, dim, dstate, groups: tokens.groups, slots },
        dtypes: SsuDtypes {
            state: args.state.dtype(),
            x: args.x.dtype(),
            dt: args.dt.dtype(),
            a: args.a.dtype(),
            b: args.b.dtype(),
            c: args.c.dtype(),
            d: args.d.as_ref().map(|t| t.dtype()),
            dt_bias: args.dt_bias.as_ref().map(|t| t.dtype()),
            z: args.z.as_ref().map(|t| t.dtype()),
            out: args.out.dtype(),
            cu_seqlens: args.cu_seqlens.as_ref().map(|t| t.dtype()),
            num_accepted_tokens: args.num_accepted_tokens.as_ref().map(|t| t.dtype()),
        },
        device,
        state: pool.state,
        x: tokens.x,
        dt: tokens.dt,
        z: tokens.z,
        out: tokens.out,
        b: tokens.b,
        c: tokens.c,
        a: params.a,
        d: params.d,
        dt_bias: params.dt_bias,
        state_batch_indices: seqs.state_batch_indices,
        dst_state_batch_indices: seqs.dst_state_batch_indices,
        num_accepted_tokens: seqs.num_accepted_tokens,
        cu_seqlens: seqs.cu_seqlens,
        pad_slot_id: args.pad_slot_id,
        dt_softplus: args.dt_softplus,
        stochastic_rounding: args.stochastic_rounding,
        rand_seed,
        disable_state_update: args.disable_state_update,
        intermediate,
        state_scale: pool.state_scale,
        host_indices_checked: false,
        alias_free: false,
    };
    if device == Device::Cpu {
        check_host_indices(&mut plan, args)?;
    }
    Ok(plan)
}

/// Every tensor on the state's device; returns that device.
fn check_devices(args: &SelectiveStateUpdateArgs<'_>) -> Result<Device, SsuError> {
    let device = args.state.device();
    let check_dev = |arg: &'static str, d: Device| {
        if d != device {
            Err(SsuError::from(ArgError::Device { arg, expected: device, actual: d, reference: "state" }))
        } else {
            Ok(())
        }
    };
    check_dev("x", args.x.device())?;
    check_dev("dt", args.dt.device())?;
    check_dev("A", args.a.device())?;
    check_dev("B", args.b.device())?;
    check_dev("C", args.c.device())?;
    check_dev("out", args.out.device())?;
    for (arg, t) in [
        ("D", &args.d),
        ("dt_bias", &args.dt_bias),
        ("z", &args.z),
        ("state_batch_indices", &args.state_batch_indices),
        ("dst_state_batch_indices", &args.dst_state_batch_indices),
        ("num_accepted_tokens", &args.num_accepted_tokens),
        ("cu_seqlens", &args.cu_seqlens),
        ("intermediate_state_indices", &args.intermediate_state_indices),
        ("rand_seed", &args.rand_seed),
    ] {
        if let Some(t) = t {
            check_dev(arg, t.device())?;
        }
    }
    for (arg, t) in [
        ("intermediate_states_buffer", &args.intermediate_states_buffer),
        ("state_scale", &args.state_scale),
        ("intermediate_state_scales", &args.intermediate_state_scales),
    ] {
        if let Some(t) = t {
            check_dev(arg, t.device())?;
        }
    }
    Ok(device)
}

/// Every dtype, the state's scale and rounding options with it; returns `rand_seed`'s element
/// offset.
fn check_dtypes(args: &SelectiveStateUpdateArgs<'_>) -> Result<Option<usize>, SsuError> {
    dtype_in("state", args.state.dtype(), STATES, "f32, f16, bf16, or i16 / i8 with `state_scale`")?;
    let quantized = crate::quant::limit(args.state.dtype()).is_some();
    match (quantized, &args.state_scale) {
        (true, None) => {
            return Err(SsuError::from(ArgError::Requires {
                arg: "state",
                needs: "`state_scale` when it is i16 or i8 (one f32 decode scale per row)",
            }));
        }
        (false, Some(_)) => {
            return Err(SsuError::Combination {
                arg: "state_scale",
                why: "needs an i16 or i8 `state` (it holds the decode scale of each integer row)",
            });
        }
        (true, Some(_)) if args.stochastic_rounding.is_some() || args.rand_seed.is_some() => {
            return Err(SsuError::Combination {
                arg: "state_scale",
                why: "excludes `stochastic_rounding` and `rand_seed`: an integer row is rounded to nearest (FlashInfer \
                      refuses `rand_seed` with `state_scale`)",
            });
        }
        _ => {}
    }
    for (arg, t) in [("x", &args.x), ("dt", &args.dt), ("A", &args.a), ("B", &args.b), ("C", &args.c)] {
        dtype_in(arg, t.dtype(), FLOATS, "f32, f16 or bf16")?;
    }
    for (arg, t) in [("D", &args.d), ("dt_bias", &args.dt_bias), ("z", &args.z)] {
        if let Some(t) = t {
            dtype_in(arg, t.dtype(), FLOATS, "f32, f16 or bf16")?;
        }
    }
    dtype_in("out", args.out.dtype(), FLOATS, "f32, f16 or bf16")?;
    for (arg, t) in [
        ("state_batch_indices", &args.state_batch_indices),
        ("dst_state_batch_indices", &args.dst_state_batch_indices),
        ("num_accepted_tokens", &args.num_accepted_tokens),
        ("cu_seqlens", &args.cu_seqlens),
        ("intermediate_state_indices", &args.intermediate_state_indices),
    ] {
        if let Some(t) = t {
            dtype_in(arg, t.dtype(), INDICES, "i32 or i64")?;
        }
    }
    let rand_seed = match &args.rand_seed {
        None => None,
        Some(t) => {
            if args.stochastic_rounding.is_none() {
                return Err(SsuError::from(ArgError::Requires { arg: "rand_seed", needs: "`stochastic_rounding`" }));
            }
            dtype_in("rand_seed", t.dtype(), &[DType::I64], "i64")?;
            if t.numel() != 1 || t.rank() > 1 {
                return Err(SsuError::from(ArgError::Shape {
                    arg: "rand_seed",
                    expected: "[1] or [] (one element)".into(),
                    actual: t.shape().to_vec(),
                }));
            }
            Some(t.layout().offset())
        }
    };
    if let Some(sr) = args.stochastic_rounding {
        if args.state.dtype() != DType::F16 {
            return Err(SsuError::StochasticRoundingDtype { actual: args.state.dtype() });
        }
        if sr.rounds() > StochasticRounding::MAX_ROUNDS {
            return Err(SsuError::PhiloxRounds { rounds: sr.philox_rounds });
        }
    }
    Ok(rand_seed)
}

/// The state pool `[slots, heads, dim, dstate]` (heads inserted for a 3-D state) and its
/// per-row scales.
struct StatePool {
    dims: [usize; 4],
    state: Strided<4>,
    state_scale: Option<Strided<3>>,
}

/// The state pool: rank, contiguous dstate, no written element shared, and `state_scale`'s
/// extents.
fn state_pool(args: &SelectiveStateUpdateArgs<'_>) -> Result<StatePool, SsuError> {
    let mut state = norm_mut(&args.state);
    match state.shape.len() {
        3 => (state.shape, state.strides) = unsqueeze(&state.shape, &state.strides, 1),
        4 => {}
        _ => {
            return Err(SsuError::from(ArgError::Rank {
                arg: "state",
                expected: "3 or 4",
                actual: state.shape.to_vec(),
            }));
        }
    }
    let (slots, heads, dim, dstate) = (state.shape[0], state.shape[1], state.shape[2], state.shape[3]);
    if dstate > 1 && state.strides[3] != 1 {
        return Err(SsuError::from(ArgError::Strides {
            arg: "state",
            what: "contiguous along dstate (last stride 1)",
            shape: args.state.shape().to_vec(),
            strides: args.state.strides().to_vec(),
        }));
    }
    written_disjoint("state", (&state.shape, &state.strides), args.state.shape(), args.state.strides())?;
    let state_scale = match &args.state_scale {
        None => None,
        Some(t) => {
            let n = row_scales("state_scale", t, args.state.shape().len() == 4, 3)?;
            if n.shape[..3] != [slots, heads, dim] {
                return Err(SsuError::from(ArgError::Shape {
                    arg: "state_scale",
                    expected: shape_str(&[("slots", slots), ("heads", heads), ("dim", dim)]),
                    actual: t.shape().to_vec(),
                }));
            }
            Some(Strided { offset: n.offset, strides: [n.strides[0], n.strides[1], n.strides[2]] })
        }
    };
    Ok(StatePool {
        dims: [slots, heads, dim, dstate],
        state: Strided {
            offset: state.offset,
            strides: [state.strides[0], state.strides[1], state.strides[2], state.strides[3]],
        },
        state_scale,
    })
}

/// The route, the token rows and the token tensors' addressing.
struct TokenTensors {
    route: Route,
    rows: usize,
    groups: usize,
    x: TokenStrides,
    dt: TokenStrides,
    z: Option<TokenStrides>,
    out: TokenStrides,
    b: TokenStrides,
    c: TokenStrides,
}

/// x's rank picks the route (2-D/3-D: one token a row, or varlen with `cu_seqlens`; 4-D:
/// dense `[batch, steps, ..]`); x, dt, z, out `[.., heads, dim]` and B, C `[.., groups,
/// dstate]` then share its token axes (a missing heads or groups axis is inserted), and
/// `groups` divides `heads`.
fn token_tensors(
    args: &SelectiveStateUpdateArgs<'_>,
    heads: usize,
    dim: usize,
    dstate: usize,
) -> Result<TokenTensors, SsuError> {
    let x0 = norm_ref(&args.x);
    let (route, rows, seq_dims) = match x0.shape.len() {
        2 | 3 => {
            let rows = x0.shape[0];
            if args.cu_seqlens.is_some() { (Route::Varlen, rows, 1) } else { (Route::OneToken, rows, 1) }
        }
        4 => {
            if args.cu_seqlens.is_some() {
                return Err(SsuError::DenseWithCuSeqlens { actual: x0.shape.to_vec() });
            }
            (Route::Dense { steps: x0.shape[1] }, x0.shape[0] * x0.shape[1], 2)
        }
        _ => return Err(SsuError::from(ArgError::Rank { arg: "x", expected: "2, 3 or 4", actual: x0.shape.to_vec() })),
    };
    let token_prefix: &[(&str, usize)] = match route {
        Route::Dense { steps } => &[("batch", x0.shape[0]), ("steps", steps)],
        _ => &[("rows", rows)],
    };
    let token = |arg, n, inner, last| token_tensor(arg, n, seq_dims, token_prefix, inner, last);
    let (x, _) = token("x", x0, ("heads", heads), ("dim", dim))?;
    let (dt, _) = token("dt", norm_ref(&args.dt), ("heads", heads), ("dim", dim))?;
    let z = match &args.z {
        Some(z) => Some(token("z", norm_ref(z), ("heads", heads), ("dim", dim))?.0),
        None => None,
    };
    let out_norm = norm_mut(&args.out);
    written_disjoint("out", (&out_norm.shape, &out_norm.strides), args.out.shape(), args.out.strides())?;
    let (out, _) = token("out", out_norm, ("heads", heads), ("dim", dim))?;
    let (b, groups) = token("B", norm_ref(&args.b), ("groups", usize::MAX), ("dstate", dstate))?;
    let (c, _) = token("C", norm_ref(&args.c), ("groups", groups), ("dstate", dstate))?;
    if groups == 0 || !heads.is_multiple_of(groups) {
        return Err(SsuError::from(ArgError::HeadsNotDivisible { heads, groups, heads_from: "state" }));
    }
    Ok(TokenTensors { route, rows, groups, x, dt, z, out, b, c })
}

/// A token tensor `[prefix.., inner, last]` (`seq_dims` token axes named by `token_prefix`),
/// the inner (heads or groups) axis inserted where missing. An `inner` extent of
/// `usize::MAX` is free (B's defines `groups`). Returns its addressing and its inner extent.
fn token_tensor(
    arg: &'static str,
    n: Norm,
    seq_dims: usize,
    token_prefix: &[(&str, usize)],
    inner: (&'static str, usize),
    last: (&'static str, usize),
) -> Result<(TokenStrides, usize), SsuError> {
    let mut n = n;
    if n.shape.len() == seq_dims + 1 {
        (n.shape, n.strides) = unsqueeze(&n.shape, &n.strides, seq_dims);
    }
    // The inner (heads/groups) extent of B/C is free: it defines `groups`.
    let ok = n.shape.len() == seq_dims + 2
        && n.shape[..seq_dims].iter().zip(token_prefix).all(|(&have, &(_, want))| have == want)
        && (inner.1 == usize::MAX || n.shape[seq_dims] == inner.1)
        && n.shape[seq_dims + 1] == last.1;
    if !ok {
        let shown: Vec<(&str, usize)> = token_prefix
            .iter()
            .chain([&inner, &last])
            .map(|&(k, v)| if v == usize::MAX { (k, 0) } else { (k, v) })
            .collect();
        let mut s = shape_str(&shown);
        if inner.1 == usize::MAX {
            s = s.replace(&format!("{}=0", inner.0), inner.0);
        }
        return Err(SsuError::from(ArgError::Shape { arg, expected: s, actual: n.shape.to_vec() }));
    }
    let (seq, tok) = if seq_dims == 2 { (n.strides[0], n.strides[1]) } else { (n.strides[0], n.strides[0]) };
    Ok((
        TokenStrides { offset: n.offset, seq, tok, head: n.strides[seq_dims], dim: n.strides[seq_dims + 1] },
        n.shape[seq_dims],
    ))
}

/// A `[heads, dim, dstate]`, D and dt_bias `[heads, dim]` (leading heads axis inserted where
/// missing), and the parameter form they imply.
struct HeadParams {
    a: Strided<3>,
    d: Option<Strided<2>>,
    dt_bias: Option<Strided<2>>,
    form: ParamForm,
}

/// The per-head parameters' shapes, and vLLM's TIE_HDIM test on their strides.
fn head_params(
    args: &SelectiveStateUpdateArgs<'_>,
    heads: usize,
    dim: usize,
    dstate: usize,
    dt: &TokenStrides,
) -> Result<HeadParams, SsuError> {
    let mut an = norm_ref(&args.a);
    match an.shape.len() {
        2 => (an.shape, an.strides) = unsqueeze(&an.shape, &an.strides, 0),
        3 => {}
        _ => return Err(SsuError::from(ArgError::Rank { arg: "A", expected: "2 or 3", actual: an.shape.to_vec() })),
    }
    if *an.shape != [heads, dim, dstate] {
        return Err(SsuError::from(ArgError::Shape {
            arg: "A",
            expected: shape_str(&[("heads", heads), ("dim", dim), ("dstate", dstate)]),
            actual: args.a.shape().to_vec(),
        }));
    }
    let a = Strided { offset: an.offset, strides: [an.strides[0], an.strides[1], an.strides[2]] };

    let per_head = |arg: &'static str, t: &Option<TensorRef<'_>>| -> Result<Option<Strided<2>>, SsuError> {
        let Some(t) = t else { return Ok(None) };
        let mut n = norm_ref(t);
        match n.shape.len() {
            1 => (n.shape, n.strides) = unsqueeze(&n.shape, &n.strides, 0),
            2 => {}
            _ => return Err(SsuError::from(ArgError::Rank { arg, expected: "1 or 2", actual: n.shape.to_vec() })),
        }
        if *n.shape != [heads, dim] {
            return Err(SsuError::from(ArgError::Shape {
                arg,
                expected: shape_str(&[("heads", heads), ("dim", dim)]),
                actual: t.shape().to_vec(),
            }));
        }
        Ok(Some(Strided { offset: n.offset, strides: [n.strides[0], n.strides[1]] }))
    };
    let d = per_head("D", &args.d)?;
    let dt_bias = per_head("dt_bias", &args.dt_bias)?;

    // vLLM's TIE_HDIM test (D is not part of it).
    let tied = a.strides[1] == 0 && a.strides[2] == 0 && dt.dim == 0 && dt_bias.is_none_or(|s| s.strides[1] == 0);
    let form = if tied { ParamForm::Tied } else { ParamForm::PerChannel };
    Ok(HeadParams { a, d, dt_bias, form })
}

/// The sequences and the tables indexed by them.
struct SequenceTables {
    seqs: usize,
    cu_seqlens: Option<Strided<1>>,
    state_batch_indices: Option<IndexTable>,
    /// The destination table: `dst_state_batch_indices`, else `state_batch_indices`.
    dst_state_batch_indices: Option<IndexTable>,
    num_accepted_tokens: Option<Strided<1>>,
}

/// The number of sequences (`cu_seqlens`, the dense batch, or one per row), the slot tables'
/// extents and the speculative combination rules (`num_accepted_tokens` needs 2-D tables).
fn sequence_tables(args: &SelectiveStateUpdateArgs<'_>, route: Route, rows: usize) -> Result<SequenceTables, SsuError> {
    let seqs = match (route, &args.cu_seqlens) {
        (Route::Varlen, Some(cu)) => {
            if cu.rank() != 1 || cu.shape()[0] == 0 {
                return Err(SsuError::from(ArgError::Shape {
                    arg: "cu_seqlens",
                    expected: "[seqs + 1] (1-D, at least one entry)".into(),
                    actual: cu.shape().to_vec(),
                }));
            }
            cu.shape()[0] - 1
        }
        (Route::Dense { .. }, _) => args.x.shape()[0],
        _ => rows,
    };
    let cu_seqlens = args.cu_seqlens.as_ref().map(|cu| Strided::new(cu.layout().offset(), [cu.strides()[0]]));

    let table = |arg: &'static str, t: &Option<TensorRef<'_>>| -> Result<Option<IndexTable>, SsuError> {
        let Some(t) = t else { return Ok(None) };
        let Some(tab) = IndexTable::of(t) else {
            return Err(SsuError::from(ArgError::Rank { arg, expected: "1 or 2", actual: t.shape().to_vec() }));
        };
        let (rows_t, width) = (tab.rows, tab.width);
        if rows_t < seqs {
            return Err(SsuError::TableTooShort { arg, needed: seqs, actual: t.shape().to_vec() });
        }
        if width == 0 {
            return Err(SsuError::TableTooNarrow { arg, width: 0, seq: 0, column: 0 });
        }
        Ok(Some(tab))
    };
    let sbi = table("state_batch_indices", &args.state_batch_indices)?;
    let dst_given = table("dst_state_batch_indices", &args.dst_state_batch_indices)?;
    if dst_given.is_some() && sbi.is_none() {
        return Err(SsuError::from(ArgError::Requires {
            arg: "dst_state_batch_indices",
            needs: "`state_batch_indices`",
        }));
    }
    let num_accepted_tokens = match &args.num_accepted_tokens {
        Some(n) => {
            if sbi.is_none() {
                return Err(SsuError::from(ArgError::Requires {
                    arg: "num_accepted_tokens",
                    needs: "`state_batch_indices`",
                }));
            }
            if let Some(t) = args.state_batch_indices.as_ref().filter(|t| t.rank() != 2) {
                return Err(SsuError::TableNeeds2D {
                    arg: "state_batch_indices",
                    why: "with num_accepted_tokens (the accepted count picks the column)",
                    actual: t.shape().to_vec(),
                });
            }
            if let Some(t) = args.dst_state_batch_indices.as_ref().filter(|t| t.rank() != 2) {
                return Err(SsuError::TableNeeds2D {
                    arg: "dst_state_batch_indices",
                    why: "with num_accepted_tokens (token t is stored to column t)",
                    actual: t.shape().to_vec(),
                });
            }
            if n.rank() != 1 || n.shape()[0] != seqs {
                return Err(SsuError::from(ArgError::Shape {
                    arg: "num_accepted_tokens",
                    expected: shape_str(&[("seqs", seqs)]),
                    actual: n.shape().to_vec(),
                }));
            }
            Some(Strided::new(n.layout().offset(), [n.strides()[0]]))
        }
        None => None,
    };
    Ok(SequenceTables {
        seqs,
        cu_seqlens,
        state_batch_indices: sbi,
        dst_state_batch_indices: dst_given.or(sbi),
        num_accepted_tokens,
    })
}

/// A scale tensor with one f32 per state row (`state_scale`, `intermediate_state_scales`):
/// the rank of its rows' tensor less the dstate axis (`rows_rank`), or that rank plus a
/// trailing axis of 1; without heads (a 3-D state) the heads axis is inserted before the last
/// axis. Returns it normalized to `rows_rank` axes (heads included), refused if written
/// elements overlap. The caller checks the extents.
fn row_scales(arg: &'static str, t: &TensorMut<'_>, has_heads: bool, rows_rank: usize) -> Result<Norm, SsuError> {
    dtype_in(arg, t.dtype(), &[DType::F32], "f32")?;
    let given = rows_rank - usize::from(!has_heads);
    let mut n = norm_mut(t);
    if n.shape.len() == given + 1 && n.shape[given] == 1 {
        n.shape.len -= 1;
        n.strides.len -= 1;
    }
    if n.shape.len() != given {
        return Err(SsuError::from(ArgError::Rank {
            arg,
            expected: if has_heads {
                "one less than its state's (or with a trailing 1)"
            } else {
                "one less than its state's (no heads axis; or with a trailing 1)"
            },
            actual: t.shape().to_vec(),
        }));
    }
    if !has_heads {
        (n.shape, n.strides) = unsqueeze(&n.shape, &n.strides, given - 1);
    }
    written_disjoint(arg, (&n.shape, &n.strides), t.shape(), t.strides())?;
    Ok(n)
}

/// The verification arguments (FlashInfer's `disable_state_update`, `intermediate_states_buffer`
/// and `intermediate_state_indices`): their combinations, and the buffer's shape against the
/// state's `[heads, dim, dstate]`.
fn plan_intermediate(
    args: &SelectiveStateUpdateArgs<'_>,
    route: Route,
    seqs: usize,
    [heads, dim, dstate]: [usize; 3],
) -> Result<Option<IntermediatePlan>, SsuError> {
    if args.disable_state_update && args.dst_state_batch_indices.is_some() {
        return Err(SsuError::Combination {
            arg: "disable_state_update",
            why: "excludes `dst_state_batch_indices`: FlashInfer's one-token kernel drops those writes and its \
                  multi-token kernel keeps them, so the combination has no one meaning",
        });
    }
    let Some(buf) = &args.intermediate_states_buffer else {
        for (arg, given) in [
            ("intermediate_state_indices", args.intermediate_state_indices.is_some()),
            ("intermediate_state_scales", args.intermediate_state_scales.is_some()),
        ] {
            if given {
                return Err(SsuError::from(ArgError::Requires { arg, needs: "`intermediate_states_buffer`" }));
            }
        }
        return Ok(None);
    };
    if args.dst_state_batch_indices.is_some() {
        return Err(SsuError::Combination {
            arg: "intermediate_states_buffer",
            why: "excludes `dst_state_batch_indices`: the buffer receives every token's state and the pool is not written",
        });
    }
    if args.stochastic_rounding.is_some() {
        return Err(SsuError::Combination {
            arg: "intermediate_states_buffer",
            why: "excludes `stochastic_rounding`, which rounds the pool's final store (a buffered call makes none)",
        });
    }
    if buf.dtype() != args.state.dtype() {
        return Err(SsuError::from(ArgError::DType {
            arg: "intermediate_states_buffer",
            expected: format!("{} (the state's dtype)", args.state.dtype()),
            actual: buf.dtype(),
        }));
    }
    let mut n = norm_mut(buf);
    let four_d = args.state.shape().len() == 4;
    match (n.shape.len(), four_d) {
        (5, true) => {}
        (4, false) => (n.shape, n.strides) = unsqueeze(&n.shape, &n.strides, 2),
        _ => {
            return Err(SsuError::from(ArgError::Rank {
                arg: "intermediate_states_buffer",
                expected: "5 ([entries, steps, heads, dim, dstate]; 4, without heads, with a 3-D state)",
                actual: buf.shape().to_vec(),
            }));
        }
    }
    let min_steps = match route {
        Route::Dense { steps } => steps.max(1),
        _ => 1,
    };
    if n.shape[2..] != [heads, dim, dstate] || n.shape[1] < min_steps {
        return Err(SsuError::from(ArgError::Shape {
            arg: "intermediate_states_buffer",
            expected: format!("[entries, steps >= {min_steps}, heads={heads}, dim={dim}, dstate={dstate}]"),
            actual: buf.shape().to_vec(),
        }));
    }
    if dstate > 1 && n.strides[4] != 1 {
        return Err(SsuError::from(ArgError::Strides {
            arg: "intermediate_states_buffer",
            what: "contiguous along dstate (last stride 1)",
            shape: buf.shape().to_vec(),
            strides: buf.strides().to_vec(),
        }));
    }
    written_disjoint("intermediate_states_buffer", (&n.shape, &n.strides), buf.shape(), buf.strides())?;
    let indices = match &args.intermediate_state_indices {
        None => None,
        Some(t) => {
            if t.rank() != 1 {
                return Err(SsuError::from(ArgError::Rank {
                    arg: "intermediate_state_indices",
                    expected: "1",
                    actual: t.shape().to_vec(),
                }));
            }
            if t.shape()[0] < seqs {
                return Err(SsuError::TableTooShort {
                    arg: "intermediate_state_indices",
                    needed: seqs,
                    actual: t.shape().to_vec(),
                });
            }
            Some((Strided::new(t.layout().offset(), [t.strides()[0]]), t.dtype()))
        }
    };
    let scales = match (&args.intermediate_state_scales, crate::quant::limit(buf.dtype()).is_some()) {
        (None, false) => None,
        (None, true) => {
            return Err(SsuError::from(ArgError::Requires {
                arg: "intermediate_states_buffer",
                needs: "`intermediate_state_scales` when it is i16 or i8 (one f32 decode scale per row)",
            }));
        }
        (Some(_), false) => {
            return Err(SsuError::Combination {
                arg: "intermediate_state_scales",
                why: "needs an i16 or i8 `intermediate_states_buffer` (it holds the decode scale of each integer row)",
            });
        }
        (Some(t), true) => {
            let sn = row_scales("intermediate_state_scales", t, four_d, 4)?;
            if sn.shape[..4] != n.shape[..4] {
                return Err(SsuError::from(ArgError::Shape {
                    arg: "intermediate_state_scales",
                    expected: format!(
                        "[entries={}, steps={}, heads={heads}, dim={dim}] (the buffer's, less dstate)",
                        n.shape[0], n.shape[1]
                    ),
                    actual: t.shape().to_vec(),
                }));
            }
            Some(Strided { offset: sn.offset, strides: [sn.strides[0], sn.strides[1], sn.strides[2], sn.strides[3]] })
        }
    };
    Ok(Some(IntermediatePlan {
        scales,
        buffer: Strided {
            offset: n.offset,
            strides: [n.strides[0], n.strides[1], n.strides[2], n.strides[3], n.strides[4]],
        },
        entries: n.shape[0],
        steps: n.shape[1],
        indices,
    }))
}

/// Tokens of each sequence, read from host `cu_seqlens` (validated) or fixed by the route.
pub(crate) fn host_seq_bounds(plan: &SsuPlan, cu: Option<&TensorRef<'_>>, b: usize) -> (usize, usize) {
    match plan.route {
        Route::OneToken => (b, 1),
        Route::Dense { steps } => (b * steps, steps),
        Route::Varlen => {
            let cu = cu.expect("varlen route has cu_seqlens");
            let s = plan.cu_seqlens.unwrap();
            let ints = HostInts { bytes: cu.host_bytes().unwrap(), dtype: cu.dtype() };
            let lo = ints.get(s.at([b])) as usize;
            let hi = ints.get(s.at([b + 1])) as usize;
            (lo, hi - lo)
        }
    }
}

fn check_host_indices(plan: &mut SsuPlan, args: &SelectiveStateUpdateArgs<'_>) -> Result<(), SsuError> {
    let rows = plan.dims.rows;
    if let (Some(cu), Some(s)) = (&args.cu_seqlens, plan.cu_seqlens) {
        let ints = HostInts { bytes: cu.host_bytes().unwrap(), dtype: cu.dtype() };
        let mut prev = 0i64;
        for i in 0..=plan.dims.seqs {
            let v = ints.get(s.at([i]));
            if v < 0 || v < prev && i > 0 || v as u64 > rows as u64 {
                return Err(SsuError::CuSeqlens { at: i, value: v, prev, rows });
            }
            prev = v;
        }
    }
    let slots = plan.dims.slots;
    let pad = plan.pad_slot_id;
    let pad_str = || pad.map_or("none".to_string(), |p| p.to_string());

    if plan.state_batch_indices.is_none() && plan.dims.seqs > slots {
        // Without tables sequence b reads and writes slot b.
        return Err(SsuError::from(ArgError::Shape {
            arg: "state",
            expected: format!("[slots >= seqs={}, heads, dim, dstate] (no state_batch_indices)", plan.dims.seqs),
            actual: args.state.shape().to_vec(),
        }));
    }
    fn host<'t>(t: &TensorRef<'t>) -> HostInts<'t> {
        HostInts { bytes: t.host_bytes().unwrap(), dtype: t.dtype() }
    }
    let src_ints = args.state_batch_indices.as_ref().map(host);
    let dst_t = args.dst_state_batch_indices.as_ref().or(args.state_batch_indices.as_ref());
    let dst_ints = dst_t.map(host);
    let dst_name =
        if args.dst_state_batch_indices.is_some() { "dst_state_batch_indices" } else { "state_batch_indices" };
    let nacc = args.num_accepted_tokens.as_ref().map(host);
    let entry_ints = args.intermediate_state_indices.as_ref().map(host);
    let writes_state = plan.writes_state();

    SLOT_USES.with(|uses| {
        let (uses, entries) = &mut *uses.borrow_mut();
        uses.clear();
        // Buffer entries written, per sequence (a second namespace of slots).
        entries.clear();
        for b in 0..plan.dims.seqs {
            let (_, len) = host_seq_bounds(plan, args.cu_seqlens.as_ref(), b);
            if len == 0 {
                continue;
            }
            let src_slot = match (plan.state_batch_indices, &src_ints) {
                (Some(sbi), Some(src_ints)) => {
                    let col = match (&nacc, plan.num_accepted_tokens) {
                        (Some(n), Some(s)) => start_column(n.get(s.at([b]))),
                        _ => 0,
                    };
                    if col >= sbi.width {
                        return Err(SsuError::TableTooNarrow {
                            arg: "state_batch_indices",
                            width: sbi.width,
                            seq: b,
                            column: col,
                        });
                    }
                    let src = src_ints.get(sbi.strides.at([b, col]));
                    let src_slot = match Slot::resolve(src, pad, slots) {
                        Slot::Pad => continue,
                        Slot::Row(s) => s,
                        Slot::OutOfRange => {
                            return Err(SsuError::IndexOutOfRange {
                                arg: "state_batch_indices",
                                seq: b,
                                column: col,
                                value: src,
                                slots,
                                pad: pad_str(),
                            });
                        }
                    };
                    uses.push(SlotUse { slot: src_slot, written: false, seq: b });
                    if writes_state {
                        let dst = plan.dst_state_batch_indices.unwrap();
                        let dst_ints = dst_ints.as_ref().unwrap();
                        let dst_cols = if plan.spec { 0..len } else { col..col + 1 };
                        for t in dst_cols {
                            if t >= dst.width {
                                return Err(SsuError::TableTooNarrow {
                                    arg: dst_name,
                                    width: dst.width,
                                    seq: b,
                                    column: t,
                                });
                            }
                            let d = dst_ints.get(dst.strides.at([b, t]));
                            match Slot::resolve(d, pad, slots) {
                                Slot::Pad => {}
                                Slot::Row(s) => uses.push(SlotUse { slot: s, written: true, seq: b }),
                                Slot::OutOfRange => {
                                    return Err(SsuError::IndexOutOfRange {
                                        arg: dst_name,
                                        seq: b,
                                        column: t,
                                        value: d,
                                        slots,
                                        pad: pad_str(),
                                    });
                                }
                            }
                        }
                    }
                    src_slot
                }
                _ => b,
            };
            if let Some(ip) = plan.intermediate {
                // Only an entry read from `intermediate_state_indices` can be the pad.
                let (entry, from, entry_pad) = match (ip.indices, &entry_ints) {
                    (Some((st, _)), Some(ints)) => (ints.get(st.at([b])), "intermediate_state_indices", pad),
                    _ => (src_slot as i64, "the source slot; no intermediate_state_indices", None),
                };
                match Slot::resolve(entry, entry_pad, ip.entries) {
                    Slot::Pad => {}
                    Slot::Row(e) => {
                        if len > ip.steps {
                            return Err(SsuError::IntermediateSteps { seq: b, len, steps: ip.steps });
                        }
                        entries.push(SlotUse { slot: e, written: true, seq: b });
                    }
                    Slot::OutOfRange => {
                        return Err(SsuError::IntermediateEntry {
                            seq: b,
                            entry,
                            from,
                            entries: ip.entries,
                            pad: pad_str(),
                        });
                    }
                }
            }
        }
        if let Some(c) = first_slot_conflict(uses) {
            let other = c.other();
            return Err(SsuError::SlotConflict {
                arg: dst_name,
                slot: c.slot,
                writer: c.writer().seq,
                other: other.seq,
                other_use: if other.written { "written" } else { "read" },
            });
        }
        if let Some(c) = first_slot_conflict(entries) {
            return Err(SsuError::SlotConflict {
                arg: "intermediate_states_buffer",
                slot: c.slot,
                writer: c.writer().seq,
                other: c.other().seq,
                other_use: "written",
            });
        }
        plan.alias_free = true;
        plan.host_indices_checked = true;
        Ok(())
    })
}
