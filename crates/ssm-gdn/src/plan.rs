//! Validation: every shape, dtype, stride, device and host index check, once, before anything
//! is written. The plans hold the resolved sizes and per-tensor `(offset, strides)`; backends
//! trust them and read sequence ranges and slots through the helpers here, so the reference and
//! every backend share one reading of vLLM's index rules.

use ssm_tensor::{
    ArgError, DType, Device, Layout, Slot, SlotTable, SlotUse, Strided, TensorMut, TensorRef, first_slot_conflict,
};

use crate::args::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout,
};
use crate::{GdnError, MAX_HEAD_K_DIM};

/// A state tensor `[rows, HV, d1, d2]` whose per-row block `[HV, d1, d2]` is contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateView {
    /// Element offset of row 0.
    pub offset: usize,
    /// Elements between consecutive rows (at least `HV·K·V` unless there is one row).
    pub row_stride: usize,
    /// Rows (slots) of the tensor.
    pub rows: usize,
    /// Storage dtype (F32, BF16 or F16).
    pub dtype: DType,
}

impl StateView {
    /// Element offset of the `V·K` block of value head `hv` in row `row`.
    #[inline(always)]
    pub fn head(&self, row: usize, hv: usize, head_elems: usize) -> usize {
        self.offset + row * self.row_stride + hv * head_elems
    }
}

/// Where one sequence's tokens are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    /// Batch row of `q`/`k`/`v` (0 with `cu_seqlens`).
    pub b: usize,
    /// First token within that batch row.
    pub t0: usize,
    /// Number of tokens.
    pub len: usize,
    /// Global token index of the first token (`b·T + t0`): vLLM's `bos`.
    pub bos: usize,
}

/// Which state a sequence starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartState {
    /// Zeros (no `initial_state`, or `has_initial_state` false).
    Zeros,
    /// Row `.0` of `initial_state`.
    Row(usize),
    /// Null read slot: the sequence is skipped (no output, no state).
    Skip,
    /// Invalid `num_accepted_tokens`: zero output, no state read or written.
    ZeroOutput,
}

/// Sizes shared by the GDN ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// Batch rows `B` of `q` (1 with `cu_seqlens`).
    pub batch: usize,
    /// Tokens per batch row `T`.
    pub seqlen: usize,
    /// Sequences `N`.
    pub seqs: usize,
    /// q/k heads `H`.
    pub heads: usize,
    /// Value heads `HV`.
    pub v_heads: usize,
    /// `head_k_dim` `K`.
    pub k: usize,
    /// `head_v_dim` `V`.
    pub v: usize,
}

impl GdnDims {
    /// `HV / H`: value heads served by one q/k head.
    pub fn group(&self) -> usize {
        self.v_heads / self.heads
    }
    /// Elements of one head's state matrix.
    pub fn head_elems(&self) -> usize {
        self.k * self.v
    }
}

// ---------------------------------------------------------------------------------------------
// fused_gdn_gating

/// The checked plan of [`FusedGdnGatingArgs`].
#[derive(Debug, Clone, PartialEq)]
pub struct GatingPlan {
    /// Where every tensor lives.
    pub device: Device,
    /// Tokens `T`.
    pub tokens: usize,
    /// Value heads `HV`.
    pub v_heads: usize,
    /// `A_log` `[HV]`.
    pub a_log: Strided<1>,
    /// `dt_bias` `[HV]`.
    pub dt_bias: Strided<1>,
    /// `a` `[T, HV]`.
    pub a: Strided<2>,
    /// `b` `[T, HV]`.
    pub b: Strided<2>,
    /// `g` `[T, HV]`.
    pub g: Strided<2>,
    /// `beta_output` `[T, HV]`.
    pub beta_output: Strided<2>,
    /// Softplus β.
    pub softplus_beta: f32,
    /// Softplus threshold.
    pub threshold: f32,
}

/// Checks a [`FusedGdnGatingArgs`] call.
pub(crate) fn plan_fused_gdn_gating(args: &FusedGdnGatingArgs<'_>) -> Result<GatingPlan, GdnError> {
    let dev = args.gates.a.device();
    float("A_log", args.gates.a_log.dtype())?;
    float("a", args.gates.a.dtype())?;
    float("b", args.gates.b.dtype())?;
    float("dt_bias", args.gates.dt_bias.dtype())?;
    if args.g.dtype() != DType::F32 {
        return Err(GdnError::from(ArgError::DType { arg: "g", expected: "f32".into(), actual: args.g.dtype() }));
    }
    float("beta_output", args.beta_output.dtype())?;
    for (name, d) in [
        ("A_log", args.gates.a_log.device()),
        ("b", args.gates.b.device()),
        ("dt_bias", args.gates.dt_bias.device()),
        ("g", args.g.device()),
        ("beta_output", args.beta_output.device()),
    ] {
        same_device(name, "a", dev, d)?;
    }
    let a = args.gates.a.shape();
    if a.len() != 2 {
        return Err(GdnError::from(ArgError::Shape { arg: "a", expected: "[T, HV]".into(), actual: a.to_vec() }));
    }
    let (tokens, hv) = (a[0], a[1]);
    expect_shape("b", args.gates.b.shape(), &[tokens, hv], "[T, HV], from `a`")?;
    expect_shape("A_log", args.gates.a_log.shape(), &[hv], "[HV], from `a`")?;
    expect_shape("dt_bias", args.gates.dt_bias.shape(), &[hv], "[HV], from `a`")?;
    let g = out_2d("g", &args.g, tokens, hv)?;
    let beta_output = out_2d("beta_output", &args.beta_output, tokens, hv)?;
    positive("beta", args.gates.beta)?;
    finite("threshold", args.gates.threshold)?;
    Ok(GatingPlan {
        device: dev,
        tokens,
        v_heads: hv,
        a_log: strided("A_log", args.gates.a_log.layout())?,
        dt_bias: strided("dt_bias", args.gates.dt_bias.layout())?,
        a: strided("a", args.gates.a.layout())?,
        b: strided("b", args.gates.b.layout())?,
        g,
        beta_output,
        softplus_beta: args.gates.beta,
        threshold: args.gates.threshold,
    })
}

fn out_2d(arg: &'static str, t: &TensorMut<'_>, tokens: usize, hv: usize) -> Result<Strided<2>, GdnError> {
    let s = t.shape();
    let st = t.strides();
    let r = match s.len() {
        2 if s == [tokens, hv] => Strided::for_arg(arg, t.layout(), [st[0], st[1]])?,
        3 if s == [1, tokens, hv] => Strided::for_arg(arg, t.layout(), [st[1], st[2]])?,
        _ => {
            return Err(GdnError::from(ArgError::Shape {
                arg,
                expected: format!("[1, T={tokens}, HV={hv}] or [T={tokens}, HV={hv}]"),
                actual: s.to_vec(),
            }));
        }
    };
    ArgError::check_written(arg, t.layout())?;
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// recurrent ops

/// How the recurrent kernels get `g` and `β` per token and value head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gates {
    /// `fused_recurrent_gated_delta_rule`: precomputed `g` `[B, T, HV]` and `beta`
    /// `[B, T, HV, V]` (stride 0 along V unless head-wise; `None` = ones).
    Given {
        /// `g` as `[b, t, hv]`.
        g: Strided<3>,
        /// dtype of `g`.
        g_dtype: DType,
        /// `beta` as `[b, t, hv, v]`, or `None` for ones.
        beta: Option<(Strided<4>, DType)>,
    },
    /// `fused_sigmoid_gating_delta_rule_update`: `g` and `β` from `A_log`, `a`, `b`, `dt_bias`.
    Sigmoid {
        /// `A_log` `[HV]`.
        a_log: (Strided<1>, DType),
        /// `dt_bias` `[HV]`.
        dt_bias: (Strided<1>, DType),
        /// `a` as `[b, t, hv]`.
        a: (Strided<3>, DType),
        /// `b` as `[b, t, hv]`.
        b: (Strided<3>, DType),
        /// Softplus β.
        softplus_beta: f32,
        /// Softplus threshold.
        threshold: f32,
    },
}

/// How the recurrent ops address state slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateSlots {
    /// No `ssm_state_indices`: row `bos` of `initial_state`.
    None,
    /// `[N]` (width 1).
    OneD(SlotTable),
    /// `[N, columns]` (`width` = columns).
    TwoD(SlotTable),
}

/// The checked plan of the two recurrent ops.
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentPlan {
    /// Sizes.
    pub dims: GdnDims,
    /// `q` as `[b, t, h, k]` and its dtype.
    pub q: (Strided<4>, DType),
    /// `k` as `[b, t, h, k]`.
    pub k: (Strided<4>, DType),
    /// `v` as `[b, t, hv, v]`.
    pub v: (Strided<4>, DType),
    /// `o` as `[b, t, hv, v]`.
    pub o: (Strided<4>, DType),
    /// Where `g` and `β` come from.
    pub gates: Gates,
    /// The state pool (`initial_state`), if any.
    pub state: Option<StateView>,
    /// Per-token states (not in place), if any.
    pub final_state: Option<StateView>,
    /// The slot table.
    pub slots: StateSlots,
    /// `cu_seqlens`, if any.
    pub cu_seqlens: Option<SlotTable>,
    /// `num_accepted_tokens`, if any.
    pub num_accepted_tokens: Option<SlotTable>,
    /// Resolved scale.
    pub scale: f32,
    /// l2norm eps.
    pub eps: f32,
    /// Whether q and k are l2-normalised.
    pub l2norm: bool,
    /// State layout.
    pub layout: StateLayout,
    /// The device of every tensor.
    pub device: Device,
}

impl RecurrentPlan {
    /// The tokens of sequence `n`.
    #[inline]
    pub fn span(&self, cu_seqlens: Option<&TensorRef<'_>>, n: usize) -> SeqSpan {
        span(&self.dims, self.cu_seqlens.as_ref(), cu_seqlens, n)
    }

    /// The state sequence `n` starts from.
    pub fn start(
        &self,
        ssm_state_indices: Option<&TensorRef<'_>>,
        num_accepted_tokens: Option<&TensorRef<'_>>,
        n: usize,
        span: &SeqSpan,
    ) -> StartState {
        if self.state.is_none() {
            return StartState::Zeros;
        }
        let rows = self.state.map_or(0, |s| s.rows);
        match self.slots {
            StateSlots::None => StartState::Row(span.bos),
            StateSlots::OneD(t) => null_or_row(t.read(ssm_state_indices.unwrap(), n, 0), rows),
            StateSlots::TwoD(t) => {
                let col = match (&self.num_accepted_tokens, num_accepted_tokens) {
                    (Some(na), Some(nat)) => {
                        let acc = na.read(nat, n, 0);
                        if acc < 1 || acc > t.width as i64 {
                            return StartState::ZeroOutput;
                        }
                        (acc - 1) as usize
                    }
                    _ => 0,
                };
                null_or_row(t.read(ssm_state_indices.unwrap(), n, col), rows)
            }
        }
    }

    /// Where the state after token `t` (0-based within the sequence) of sequence `n` is stored
    /// in place, if anywhere (`None` when `final_state` is given: see [`Self::final_row`]).
    #[inline]
    pub fn store_row(
        &self,
        ssm_state_indices: Option<&TensorRef<'_>>,
        n: usize,
        span: &SeqSpan,
        t: usize,
    ) -> Option<usize> {
        let state = self.state.filter(|_| self.final_state.is_none())?;
        let (tab, col) = match self.slots {
            StateSlots::None => return (t + 1 == span.len).then_some(span.bos),
            StateSlots::OneD(_) if t + 1 != span.len => return None,
            StateSlots::OneD(tab) => (tab, 0),
            StateSlots::TwoD(tab) => (tab, t),
        };
        match recurrent_slot(tab.read(ssm_state_indices.unwrap(), n, col), state.rows) {
            Slot::Row(r) => Some(r),
            Slot::Pad | Slot::OutOfRange => None,
        }
    }

    /// Row of `final_state` receiving the state after token `t` of the sequence (not in place).
    #[inline]
    pub fn final_row(&self, span: &SeqSpan, t: usize) -> Option<usize> {
        self.final_state.map(|_| span.bos + t)
    }
}

/// vLLM's null-block rule of the recurrent ops (crate docs, "Null slots"): an entry `<= 0` is
/// the null block (read as [`Slot::Pad`]: nothing read or stored through it); any other entry
/// resolves against the pool of `slots` rows as in every family ([`Slot::resolve`], no pad).
#[inline]
pub fn recurrent_slot(value: i64, slots: usize) -> Slot {
    if value <= 0 { Slot::Pad } else { Slot::resolve(value, None, slots) }
}

/// The start of a sequence whose read entry is `s` (host tables: the plan refused entries past
/// the pool, so every non-null entry is a row).
fn null_or_row(s: i64, rows: usize) -> StartState {
    match recurrent_slot(s, rows) {
        Slot::Row(r) => StartState::Row(r),
        Slot::Pad | Slot::OutOfRange => StartState::Skip,
    }
}

fn span(dims: &GdnDims, table: Option<&SlotTable>, t: Option<&TensorRef<'_>>, n: usize) -> SeqSpan {
    match (table, t) {
        (Some(tab), Some(t)) => {
            let lo = tab.read(t, n, 0) as usize;
            let hi = tab.read(t, n + 1, 0) as usize;
            SeqSpan { b: 0, t0: lo, len: hi - lo, bos: lo }
        }
        _ => SeqSpan { b: n, t0: 0, len: dims.seqlen, bos: n * dims.seqlen },
    }
}

/// Checks a [`FusedRecurrentGatedDeltaRuleArgs`] call.
pub(crate) fn plan_fused_recurrent_gated_delta_rule(
    args: &FusedRecurrentGatedDeltaRuleArgs<'_>,
) -> Result<RecurrentPlan, GdnError> {
    recurrent(&args.rule, |dims, dev| {
        let (b, t, hv, v) = (dims.batch, dims.seqlen, dims.v_heads, dims.v);
        float("g", args.g.dtype())?;
        same_device("g", "q", dev, args.g.device())?;
        expect_shape("g", args.g.shape(), &[b, t, hv], "[B, T, HV], from `v`")?;
        let beta = match &args.beta {
            None => None,
            Some(beta) => {
                float("beta", beta.dtype())?;
                same_device("beta", "q", dev, beta.device())?;
                let s = beta.strides();
                let st = match beta.shape() {
                    sh if sh == [b, t, hv] => [s[0], s[1], s[2], 0],
                    sh if sh == [b, t, hv, v] => [s[0], s[1], s[2], s[3]],
                    sh => {
                        return Err(GdnError::from(ArgError::Shape {
                            arg: "beta",
                            expected: format!("[B={b}, T={t}, HV={hv}] or head-wise [B={b}, T={t}, HV={hv}, V={v}]"),
                            actual: sh.to_vec(),
                        }));
                    }
                };
                Some((Strided::for_arg("beta", beta.layout(), st)?, beta.dtype()))
            }
        };
        Ok(Gates::Given { g: strided("g", args.g.layout())?, g_dtype: args.g.dtype(), beta })
    })
}

/// Checks a [`FusedSigmoidGatingDeltaRuleUpdateArgs`] call.
pub(crate) fn plan_fused_sigmoid_gating_delta_rule_update(
    args: &FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
) -> Result<RecurrentPlan, GdnError> {
    recurrent(&args.rule, |dims, dev| {
        let (b, t, hv) = (dims.batch, dims.seqlen, dims.v_heads);
        for (name, x) in
            [("A_log", &args.gates.a_log), ("a", &args.gates.a), ("b", &args.gates.b), ("dt_bias", &args.gates.dt_bias)]
        {
            float(name, x.dtype())?;
            same_device(name, "q", dev, x.device())?;
        }
        expect_shape("A_log", args.gates.a_log.shape(), &[hv], "[HV], from `v`")?;
        expect_shape("dt_bias", args.gates.dt_bias.shape(), &[hv], "[HV], from `v`")?;
        let a = token_head("a", &args.gates.a, b, t, hv)?;
        let bb = token_head("b", &args.gates.b, b, t, hv)?;
        positive("beta", args.gates.beta)?;
        finite("threshold", args.gates.threshold)?;
        Ok(Gates::Sigmoid {
            a_log: (strided("A_log", args.gates.a_log.layout())?, args.gates.a_log.dtype()),
            dt_bias: (strided("dt_bias", args.gates.dt_bias.layout())?, args.gates.dt_bias.dtype()),
            a: (a, args.gates.a.dtype()),
            b: (bb, args.gates.b.dtype()),
            softplus_beta: args.gates.beta,
            threshold: args.gates.threshold,
        })
    })
}

/// `a`/`b` of the fused op: `[B·T, HV]` (vLLM flattens) or `[B, T, HV]`, as `[b, t, hv]`.
fn token_head(arg: &'static str, x: &TensorRef<'_>, b: usize, t: usize, hv: usize) -> Result<Strided<3>, GdnError> {
    let s = x.strides();
    let overflow = |what| ArgError::Overflow { arg, what, shape: x.shape().to_vec(), strides: s.to_vec() };
    // Empty views admit any sizes and strides, so B·T and the flattened sequence stride are
    // checked rather than left to wrap.
    let bt = b.checked_mul(t).ok_or_else(|| overflow("B·T"))?;
    match x.shape() {
        sh if sh == [bt, hv] => {
            let seq = isize::try_from(t).ok().and_then(|t| s[0].checked_mul(t)).ok_or_else(|| overflow("T·stride"))?;
            Ok(Strided::for_arg(arg, x.layout(), [seq, s[0], s[1]])?)
        }
        sh if sh == [b, t, hv] => Ok(Strided::for_arg(arg, x.layout(), [s[0], s[1], s[2]])?),
        sh => Err(GdnError::from(ArgError::Shape {
            arg,
            expected: format!("[B·T={bt}, HV={hv}] or [B={b}, T={t}, HV={hv}]"),
            actual: sh.to_vec(),
        })),
    }
}

/// Shapes, dtypes and devices of q/k/v/o; returns dims and the device.
fn qkvo(
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    o: &TensorMut<'_>,
    seqs_from_cu: Option<&TensorRef<'_>>,
) -> Result<(GdnDims, Device), GdnError> {
    let dev = q.device();
    for (name, x) in [("q", q), ("k", k), ("v", v)] {
        float(name, x.dtype())?;
        same_device(name, "q", dev, x.device())?;
    }
    float("o", o.dtype())?;
    same_device("o", "q", dev, o.device())?;
    let qs = q.shape();
    if qs.len() != 4 {
        return Err(GdnError::from(ArgError::Shape { arg: "q", expected: "[B, T, H, K]".into(), actual: qs.to_vec() }));
    }
    let (b, t, h, kd) = (qs[0], qs[1], qs[2], qs[3]);
    expect_shape("k", k.shape(), &[b, t, h, kd], "[B, T, H, K], from `q`")?;
    let vs = v.shape();
    if vs.len() != 4 || vs[0] != b || vs[1] != t {
        return Err(GdnError::from(ArgError::Shape {
            arg: "v",
            expected: format!("[B={b}, T={t}, HV, V]"),
            actual: vs.to_vec(),
        }));
    }
    let (hv, vd) = (vs[2], vs[3]);
    if h == 0 || hv % h != 0 {
        return Err(GdnError::HeadsNotMultiple { hv, h });
    }
    if kd == 0 || kd > MAX_HEAD_K_DIM {
        return Err(GdnError::HeadDim { arg: "k", max: MAX_HEAD_K_DIM, actual: kd });
    }
    if vd == 0 {
        return Err(GdnError::HeadDim { arg: "v", max: usize::MAX, actual: vd });
    }
    expect_shape("o", o.shape(), &[b, t, hv, vd], "[B, T, HV, V], from `v`")?;
    ArgError::check_written("o", o.layout())?;
    let seqs = match seqs_from_cu {
        Some(cu) => {
            if b != 1 {
                return Err(GdnError::from(ArgError::Shape {
                    arg: "q",
                    expected: "[1, T, H, K] (a packed batch) with `cu_seqlens`".into(),
                    actual: qs.to_vec(),
                }));
            }
            if cu.rank() != 1 || cu.shape()[0] == 0 {
                return Err(GdnError::from(ArgError::Shape {
                    arg: "cu_seqlens",
                    expected: "[N + 1]".into(),
                    actual: cu.shape().to_vec(),
                }));
            }
            cu.shape()[0] - 1
        }
        None => b,
    };
    Ok((GdnDims { batch: b, seqlen: t, seqs, heads: h, v_heads: hv, k: kd, v: vd }, dev))
}

fn recurrent(
    c: &DeltaRuleArgs<'_>,
    gates: impl FnOnce(&GdnDims, Device) -> Result<Gates, GdnError>,
) -> Result<RecurrentPlan, GdnError> {
    let (dims, dev) = qkvo(&c.q, &c.k, &c.v, &c.o, c.cu_seqlens.as_ref())?;
    let gates = gates(&dims, dev)?;
    let cu_seqlens = match &c.cu_seqlens {
        Some(cu) => Some(cu_table(cu, dev, dims.seqlen)?),
        None => None,
    };
    let state = match &c.initial_state {
        Some(s) => Some(state_view("initial_state", s, dev, &dims, c.state_layout, None)?),
        None => None,
    };
    let final_state = match &c.final_state {
        Some(s) => Some(state_view("final_state", s, dev, &dims, c.state_layout, Some(dims.batch * dims.seqlen))?),
        None => None,
    };
    let slots = match &c.ssm_state_indices {
        None => StateSlots::None,
        Some(ix) => {
            if state.is_none() {
                return Err(GdnError::from(ArgError::Requires {
                    arg: "ssm_state_indices",
                    needs: "`initial_state` (the pool it indexes)",
                }));
            }
            index_dtype("ssm_state_indices", ix.dtype())?;
            same_device("ssm_state_indices", "q", dev, ix.device())?;
            let s = ix.shape();
            match s.len() {
                1 if s[0] >= dims.seqs => StateSlots::OneD(int_table("ssm_state_indices", ix)?),
                2 if s[0] >= dims.seqs && s[1] >= 1 => StateSlots::TwoD(int_table("ssm_state_indices", ix)?),
                _ => {
                    return Err(GdnError::from(ArgError::Shape {
                        arg: "ssm_state_indices",
                        expected: format!("[N={}] or [N={}, columns]", dims.seqs, dims.seqs),
                        actual: s.to_vec(),
                    }));
                }
            }
        }
    };
    let num_accepted_tokens = match &c.num_accepted_tokens {
        None => None,
        Some(na) => {
            if !matches!(slots, StateSlots::TwoD(..)) {
                return Err(GdnError::from(ArgError::Requires {
                    arg: "num_accepted_tokens",
                    needs: "a 2-D `ssm_state_indices` [N, columns] (speculative decoding)",
                }));
            }
            index_dtype("num_accepted_tokens", na.dtype())?;
            same_device("num_accepted_tokens", "q", dev, na.device())?;
            if na.rank() != 1 || na.shape()[0] < dims.seqs {
                return Err(GdnError::from(ArgError::Shape {
                    arg: "num_accepted_tokens",
                    expected: format!("[N={}]", dims.seqs),
                    actual: na.shape().to_vec(),
                }));
            }
            Some(int_table("num_accepted_tokens", na)?)
        }
    };
    let scale = resolve_scale(c.scale, dims.k)?;
    nonneg("eps", c.eps)?;
    let plan = RecurrentPlan {
        dims,
        q: (strided("q", c.q.layout())?, c.q.dtype()),
        k: (strided("k", c.k.layout())?, c.k.dtype()),
        v: (strided("v", c.v.layout())?, c.v.dtype()),
        o: (strided("o", c.o.layout())?, c.o.dtype()),
        gates,
        state,
        final_state,
        slots,
        cu_seqlens,
        num_accepted_tokens,
        scale,
        eps: c.eps,
        l2norm: c.use_qk_l2norm_in_kernel,
        layout: c.state_layout,
        device: dev,
    };
    if dev == Device::Cpu {
        check_recurrent_values(&plan, c)?;
    }
    Ok(plan)
}

/// Host index values: `cu_seqlens` monotone, slots in range, tokens fit the table, and no two
/// sequences touching the same slot when one of them writes it.
fn check_recurrent_values(p: &RecurrentPlan, c: &DeltaRuleArgs<'_>) -> Result<(), GdnError> {
    let tokens = p.dims.seqlen;
    if let (Some(tab), Some(cu)) = (&p.cu_seqlens, c.cu_seqlens.as_ref()) {
        check_cu(tab, cu, p.dims.seqs, tokens)?;
    }
    let Some(state) = p.state else { return Ok(()) };
    let ix = c.ssm_state_indices.as_ref();
    match p.slots {
        StateSlots::None => {
            for n in 0..p.dims.seqs {
                let sp = p.span(c.cu_seqlens.as_ref(), n);
                if sp.len > 0 && sp.bos >= state.rows {
                    return Err(GdnError::IndexOutOfRange {
                        arg: "initial_state (row bos, no ssm_state_indices)",
                        seq: n,
                        column: 0,
                        value: sp.bos as i64,
                        allowed: "rows of the pool",
                        slots: state.rows,
                    });
                }
            }
        }
        StateSlots::OneD(tab) => {
            for n in 0..p.dims.seqs {
                let s = tab.read(ix.unwrap(), n, 0);
                if recurrent_slot(s, state.rows) == Slot::OutOfRange {
                    return Err(range_err(n, 0, s, state.rows));
                }
            }
        }
        StateSlots::TwoD(tab) => {
            // Only the columns the call reads or writes are checked (and read): the start
            // column (`num_accepted_tokens - 1`, or 0) and, in place, one per token. A wide
            // table costs nothing past them, and vLLM never reads its other entries.
            let cols = tab.width;
            for n in 0..p.dims.seqs {
                let sp = p.span(c.cu_seqlens.as_ref(), n);
                let start = match (&p.num_accepted_tokens, c.num_accepted_tokens.as_ref()) {
                    (Some(na), Some(nat)) => {
                        let acc = na.read(nat, n, 0);
                        (1..=cols as i64).contains(&acc).then(|| (acc - 1) as usize)
                    }
                    _ => (cols > 0).then_some(0),
                };
                let stores = if p.final_state.is_none() { sp.len.min(cols) } else { 0 };
                for col in (0..stores).chain(start) {
                    let s = tab.read(ix.unwrap(), n, col);
                    if recurrent_slot(s, state.rows) == Slot::OutOfRange {
                        return Err(range_err(n, col, s, state.rows));
                    }
                }
                if p.final_state.is_none() && sp.len > cols {
                    return Err(GdnError::TooManyTokens { seq: n, tokens: sp.len, columns: cols });
                }
            }
        }
    }
    // Slot conflicts between sequences (only where something is written in place).
    if p.final_state.is_some() {
        return Ok(());
    }
    let mut touched: Vec<SlotUse> = Vec::new();
    for n in 0..p.dims.seqs {
        let sp = p.span(c.cu_seqlens.as_ref(), n);
        if sp.len == 0 {
            continue;
        }
        match p.start(ix, c.num_accepted_tokens.as_ref(), n, &sp) {
            StartState::Row(r) => touched.push(SlotUse { slot: r, written: false, seq: n }),
            StartState::Zeros => {}
            StartState::Skip | StartState::ZeroOutput => continue,
        }
        for t in 0..sp.len {
            if let Some(r) = p.store_row(ix, n, &sp, t) {
                touched.push(SlotUse { slot: r, written: true, seq: n });
            }
        }
    }
    check_conflicts(&mut touched)
}

fn range_err(seq: usize, column: usize, value: i64, slots: usize) -> GdnError {
    GdnError::IndexOutOfRange {
        arg: "ssm_state_indices",
        seq,
        column,
        value,
        allowed: "null block (<= 0) or a slot in [1, slots)",
        slots,
    }
}

/// The aliasing rule of every family ([`ssm_tensor::first_slot_conflict`]): a slot written by
/// one sequence is read or written by no other.
fn check_conflicts(touched: &mut [SlotUse]) -> Result<(), GdnError> {
    let Some(c) = first_slot_conflict(touched) else { return Ok(()) };
    let kind = |u: SlotUse| if u.written { "written" } else { "read" };
    Err(GdnError::SlotConflict {
        slot: c.slot as i64,
        first: kind(c.first),
        first_seq: c.first.seq,
        second: kind(c.second),
        second_seq: c.second.seq,
    })
}

// ---------------------------------------------------------------------------------------------
// chunked prefill

/// The checked plan of [`ChunkGatedDeltaRuleArgs`].
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkPlan {
    /// Sizes.
    pub dims: GdnDims,
    /// `q` as `[b, t, h, k]`.
    pub q: (Strided<4>, DType),
    /// `k` as `[b, t, h, k]`.
    pub k: (Strided<4>, DType),
    /// `v` as `[b, t, hv, v]`.
    pub v: (Strided<4>, DType),
    /// `o` as `[b, t, hv, v]`.
    pub o: (Strided<4>, DType),
    /// `g` as `[b, t, hv]`.
    pub g: (Strided<3>, DType),
    /// `beta` as `[b, t, hv]`.
    pub beta: (Strided<3>, DType),
    /// The initial states (dense or pool), if any.
    pub state: Option<StateView>,
    /// `initial_state_indices`, if any.
    pub indices: Option<SlotTable>,
    /// `has_initial_state`, if any.
    pub has_initial_state: Option<SlotTable>,
    /// The pad value.
    pub pad_slot_id: Option<i64>,
    /// Write final states back into `initial_state`.
    pub inplace: bool,
    /// Dense final states `[N, HV, …]`, if any.
    pub final_state: Option<StateView>,
    /// `cu_seqlens`, if any.
    pub cu_seqlens: Option<SlotTable>,
    /// Resolved scale.
    pub scale: f32,
    /// l2norm eps.
    pub eps: f32,
    /// Whether q and k are l2-normalised.
    pub l2norm: bool,
    /// State layout.
    pub layout: StateLayout,
    /// The device of every tensor.
    pub device: Device,
    /// Elements of the given scratch (0 if none).
    pub scratch_len: usize,
}

/// What the chunked prefill does with one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkStart {
    /// Pad index: skipped entirely.
    Skip,
    /// Start from zeros; the final state goes to `row` in place (if any).
    Zeros {
        /// Row of `initial_state` that receives the final state (in place), if any.
        row: Option<usize>,
    },
    /// Start from row `.0` of `initial_state` (and write back there when in place).
    Row(usize),
}

impl ChunkPlan {
    /// The tokens of sequence `n`.
    #[inline]
    pub fn span(&self, cu_seqlens: Option<&TensorRef<'_>>, n: usize) -> SeqSpan {
        span(&self.dims, self.cu_seqlens.as_ref(), cu_seqlens, n)
    }

    /// Where sequence `n` starts and where its final state goes in the pool.
    pub fn start(
        &self,
        indices: Option<&TensorRef<'_>>,
        has_initial_state: Option<&TensorRef<'_>>,
        n: usize,
    ) -> ChunkStart {
        let Some(state) = self.state else { return ChunkStart::Zeros { row: None } };
        let row = match (&self.indices, indices) {
            // Host tables hold no entry out of range (the plan refused it).
            (Some(tab), Some(t)) => match Slot::resolve(tab.read(t, n, 0), self.pad_slot_id, state.rows) {
                Slot::Row(r) => r,
                Slot::Pad | Slot::OutOfRange => return ChunkStart::Skip,
            },
            _ => n,
        };
        let has = match (&self.has_initial_state, has_initial_state) {
            (Some(tab), Some(t)) => tab.read(t, n, 0) != 0,
            _ => true,
        };
        match (has, self.inplace) {
            (true, _) => ChunkStart::Row(row),
            (false, true) => ChunkStart::Zeros { row: Some(row) },
            (false, false) => ChunkStart::Zeros { row: None },
        }
    }
}

/// Checks a [`ChunkGatedDeltaRuleArgs`] call.
pub(crate) fn plan_chunk_gated_delta_rule(args: &ChunkGatedDeltaRuleArgs<'_>) -> Result<ChunkPlan, GdnError> {
    let (dims, dev) = qkvo(&args.q, &args.k, &args.v, &args.o, args.cu_seqlens.as_ref())?;
    let (b, t, hv) = (dims.batch, dims.seqlen, dims.v_heads);
    for (name, x) in [("g", &args.g), ("beta", &args.beta)] {
        float(name, x.dtype())?;
        same_device(name, "q", dev, x.device())?;
        expect_shape(name, x.shape(), &[b, t, hv], "[B, T, HV], from `v`")?;
    }
    let cu_seqlens = match &args.cu_seqlens {
        Some(cu) => Some(cu_table(cu, dev, t)?),
        None => None,
    };
    let state = match &args.initial_state {
        Some(s) => Some(state_view("initial_state", s, dev, &dims, args.state_layout, None)?),
        None => None,
    };
    let final_state = match &args.final_state {
        Some(s) => Some(state_view("final_state", s, dev, &dims, args.state_layout, Some(dims.seqs))?),
        None => None,
    };
    if args.inplace_final_state && state.is_none() {
        return Err(GdnError::from(ArgError::Requires {
            arg: "inplace_final_state",
            needs: "`initial_state` (the pool written back)",
        }));
    }
    let table = |arg: &'static str, x: &TensorRef<'_>, bool_ok: bool| -> Result<SlotTable, GdnError> {
        if state.is_none() {
            return Err(GdnError::from(ArgError::Requires { arg, needs: "`initial_state`" }));
        }
        if bool_ok {
            if !matches!(x.dtype(), DType::Bool | DType::I32 | DType::I64) {
                return Err(GdnError::from(ArgError::DType {
                    arg,
                    expected: "bool, i32 or i64".into(),
                    actual: x.dtype(),
                }));
            }
        } else {
            index_dtype(arg, x.dtype())?;
        }
        same_device(arg, "q", dev, x.device())?;
        if x.rank() != 1 || x.shape()[0] < dims.seqs {
            return Err(GdnError::from(ArgError::Shape {
                arg,
                expected: format!("[N={}]", dims.seqs),
                actual: x.shape().to_vec(),
            }));
        }
        int_table(arg, x)
    };
    let indices = match &args.initial_state_indices {
        Some(x) => Some(table("initial_state_indices", x, false)?),
        None => None,
    };
    let has_initial_state = match &args.has_initial_state {
        Some(x) => Some(table("has_initial_state", x, true)?),
        None => None,
    };
    let scratch_len = match &args.scratch {
        Some(s) => {
            if s.dtype() != DType::F32 {
                return Err(GdnError::from(ArgError::DType {
                    arg: "scratch",
                    expected: "f32".into(),
                    actual: s.dtype(),
                }));
            }
            same_device("scratch", "q", dev, s.device())?;
            if s.rank() != 1 || !s.is_contiguous() {
                return Err(GdnError::from(ArgError::Strides {
                    arg: "scratch",
                    what: "a contiguous 1-D tensor",
                    shape: s.shape().to_vec(),
                    strides: s.strides().to_vec(),
                }));
            }
            s.numel()
        }
        None => 0,
    };
    let scale = resolve_scale(args.scale, dims.k)?;
    nonneg("eps", args.eps)?;
    let plan = ChunkPlan {
        dims,
        q: (strided("q", args.q.layout())?, args.q.dtype()),
        k: (strided("k", args.k.layout())?, args.k.dtype()),
        v: (strided("v", args.v.layout())?, args.v.dtype()),
        o: (strided("o", args.o.layout())?, args.o.dtype()),
        g: (strided("g", args.g.layout())?, args.g.dtype()),
        beta: (strided("beta", args.beta.layout())?, args.beta.dtype()),
        state,
        indices,
        has_initial_state,
        pad_slot_id: args.pad_slot_id,
        inplace: args.inplace_final_state,
        final_state,
        cu_seqlens,
        scale,
        eps: args.eps,
        l2norm: args.use_qk_l2norm_in_kernel,
        layout: args.state_layout,
        device: dev,
        scratch_len,
    };
    if dev == Device::Cpu {
        if let (Some(tab), Some(cu)) = (&plan.cu_seqlens, &args.cu_seqlens) {
            check_cu(tab, cu, dims.seqs, t)?;
        }
        if let Some(st) = plan.state {
            let mut touched = Vec::new();
            for n in 0..dims.seqs {
                let row = match (&plan.indices, &args.initial_state_indices) {
                    (Some(tab), Some(x)) => {
                        let s = tab.read(x, n, 0);
                        match Slot::resolve(s, plan.pad_slot_id, st.rows) {
                            Slot::Pad => continue,
                            Slot::Row(r) => r,
                            Slot::OutOfRange => {
                                return Err(GdnError::IndexOutOfRange {
                                    arg: "initial_state_indices",
                                    seq: n,
                                    column: 0,
                                    value: s,
                                    allowed: "pad value or a slot in [0, slots)",
                                    slots: st.rows,
                                });
                            }
                        }
                    }
                    _ => {
                        if n >= st.rows {
                            return Err(GdnError::from(ArgError::Shape {
                                arg: "initial_state",
                                expected: format!("at least N={} rows without `initial_state_indices`", dims.seqs),
                                actual: args.initial_state.as_ref().unwrap().shape().to_vec(),
                            }));
                        }
                        n
                    }
                };
                touched.push(SlotUse { slot: row, written: plan.inplace, seq: n });
            }
            check_conflicts(&mut touched)?;
        }
    }
    Ok(plan)
}

// ---------------------------------------------------------------------------------------------
// helpers

fn float(arg: &'static str, d: DType) -> Result<(), GdnError> {
    if d.is_float() {
        Ok(())
    } else {
        Err(GdnError::from(ArgError::DType { arg, expected: "f32, bf16 or f16".into(), actual: d }))
    }
}

fn index_dtype(arg: &'static str, d: DType) -> Result<(), GdnError> {
    if d.is_index() {
        Ok(())
    } else {
        Err(GdnError::from(ArgError::DType { arg, expected: "i32 or i64".into(), actual: d }))
    }
}

fn same_device(arg: &'static str, reference: &'static str, expected: Device, actual: Device) -> Result<(), GdnError> {
    if expected == actual { Ok(()) } else { Err(GdnError::from(ArgError::Device { arg, reference, expected, actual })) }
}

fn expect_shape(arg: &'static str, got: &[usize], want: &[usize], names: &str) -> Result<(), GdnError> {
    if got == want {
        Ok(())
    } else {
        Err(GdnError::from(ArgError::Shape { arg, expected: format!("{want:?} ({names})"), actual: got.to_vec() }))
    }
}

fn positive(arg: &'static str, x: f32) -> Result<(), GdnError> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(GdnError::Scalar { arg, expected: "finite and > 0", actual: x as f64 })
    }
}

fn nonneg(arg: &'static str, x: f32) -> Result<(), GdnError> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(GdnError::Scalar { arg, expected: "finite and >= 0", actual: x as f64 })
    }
}

fn finite(arg: &'static str, x: f32) -> Result<(), GdnError> {
    if x.is_finite() { Ok(()) } else { Err(GdnError::Scalar { arg, expected: "finite", actual: x as f64 }) }
}

fn resolve_scale(scale: Option<f32>, k: usize) -> Result<f32, GdnError> {
    match scale {
        None => Ok((k as f32).powf(-0.5)),
        Some(s) => {
            positive("scale", s)?;
            Ok(s)
        }
    }
}

/// The addressing of a view with its own strides as an `N`-D array (rank checked by the
/// caller), offset checked ([`Strided::for_arg`]).
fn strided<const N: usize>(arg: &'static str, layout: &Layout) -> Result<Strided<N>, GdnError> {
    let mut strides = [0isize; N];
    strides.copy_from_slice(layout.strides());
    Ok(Strided::for_arg(arg, layout, strides)?)
}

/// An integer table of rank 1 (`[rows]`, width 1) or 2 (`[rows, width]`) read through
/// [`SlotTable`] (rank and shape checked by the caller), offset checked.
fn int_table(arg: &'static str, x: &TensorRef<'_>) -> Result<SlotTable, GdnError> {
    let (sh, st) = (x.shape(), x.strides());
    let (width, strides) = if sh.len() == 2 { (sh[1], [st[0], st[1]]) } else { (1, [st[0], 0]) };
    Ok(SlotTable { strides: Strided::for_arg(arg, x.layout(), strides)?, rows: sh[0], width, dtype: x.dtype() })
}

fn cu_table(cu: &TensorRef<'_>, dev: Device, _tokens: usize) -> Result<SlotTable, GdnError> {
    index_dtype("cu_seqlens", cu.dtype())?;
    same_device("cu_seqlens", "q", dev, cu.device())?;
    int_table("cu_seqlens", cu)
}

fn check_cu(tab: &SlotTable, cu: &TensorRef<'_>, seqs: usize, tokens: usize) -> Result<(), GdnError> {
    let mut prev = 0i64;
    for i in 0..=seqs {
        let x = tab.read(cu, i, 0);
        if x < prev || x > tokens as i64 {
            return Err(GdnError::CuSeqlens { at: i, value: x, prev, tokens });
        }
        prev = x;
    }
    Ok(())
}

/// A state tensor `[rows, HV, d1, d2]` for `layout`: rank, per-head dims, contiguous rows.
fn state_view(
    arg: &'static str,
    s: &TensorMut<'_>,
    dev: Device,
    dims: &GdnDims,
    layout: StateLayout,
    rows: Option<usize>,
) -> Result<StateView, GdnError> {
    if !matches!(s.dtype(), DType::F32 | DType::BF16 | DType::F16) {
        return Err(GdnError::from(ArgError::DType { arg, expected: "f32, bf16 or f16".into(), actual: s.dtype() }));
    }
    same_device(arg, "q", dev, s.device())?;
    let (d1, d2) = layout.dims(dims.k, dims.v);
    let sh = s.shape();
    let rows_ok = match rows {
        Some(r) => sh.first() == Some(&r),
        None => true,
    };
    if sh.len() != 4 || !rows_ok || sh[1] != dims.v_heads || sh[2] != d1 || sh[3] != d2 {
        let rows_name = match rows {
            Some(r) => format!("{r}"),
            None => "slots".into(),
        };
        let expected = match layout {
            StateLayout::VK => format!("[{rows_name}, HV={}, V={}, K={}]", dims.v_heads, dims.v, dims.k),
            StateLayout::KV => format!("[{rows_name}, HV={}, K={}, V={}]", dims.v_heads, dims.k, dims.v),
        };
        return Err(GdnError::StateShape {
            arg,
            layout,
            expected,
            hv: dims.v_heads,
            k: dims.k,
            v: dims.v,
            actual: sh.to_vec(),
        });
    }
    let st = s.strides();
    let block = dims.v_heads * d1 * d2;
    let inner_ok = (d2 == 1 || st[3] == 1)
        && (d1 == 1 || st[2] == d2 as isize)
        && (dims.v_heads == 1 || st[1] == (d1 * d2) as isize);
    let rows_ok = sh[0] <= 1 || st[0] >= block as isize;
    if !inner_ok || !rows_ok {
        return Err(GdnError::from(ArgError::Strides {
            arg,
            what: "contiguous within each slot ([HV, ·, ·] row-major) with slot stride >= HV·K·V",
            shape: sh.to_vec(),
            strides: st.to_vec(),
        }));
    }
    Ok(StateView {
        offset: s.layout().offset(),
        row_stride: if sh[0] <= 1 { block } else { st[0] as usize },
        rows: sh[0],
        dtype: s.dtype(),
    })
}
