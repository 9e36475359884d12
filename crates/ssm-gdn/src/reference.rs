//! The scalar reference: the token-by-token recurrence exactly as vLLM's Triton kernels run it
//! (semantics/gdn_conv.md §1.1, §2.1, §2.2), in f32 (the peer's arithmetic) or f64 (for error
//! bounds). The chunked prefill's reference is the same recurrence: the chunked algorithm is an
//! exact reformulation of it.
//!
//! It reads and writes through the plans' layouts and index helpers, so it shares the index
//! rules with every backend. It is slow and allocates freely; it is the oracle of the tests.

use std::ops::{Add, Div, Mul, Neg, Sub};

use ssm_tensor::{DType, Strided, TensorMut, TensorRef};

use crate::args::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout,
};
use crate::plan::{ChunkPlan, ChunkStart, Gates, GatingPlan, GdnDims, RecurrentPlan, StartState, StateView};
use crate::{GdnError, Planned, Run};

pub use ssm_tensor::Arithmetic;

/// The reference backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference {
    /// Arithmetic precision.
    pub precision: Arithmetic,
}

impl Reference {
    /// The f32 reference (the peer's arithmetic).
    pub const F32: Reference = Reference { precision: Arithmetic::F32 };
    /// The f64 reference.
    pub const F64: Reference = Reference { precision: Arithmetic::F64 };
}

/// The float operations the reference needs, for f32 and f64.
pub trait Float:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// Converts from f64 (rounding to nearest for f32).
    fn of(x: f64) -> Self;
    /// Widens to f64.
    fn to_f64(self) -> f64;
    /// `e^x`.
    fn exp(self) -> Self;
    /// `ln x`.
    fn ln(self) -> Self;
    /// `√x`.
    fn sqrt(self) -> Self;
}

macro_rules! float_impl {
    ($t:ty) => {
        impl Float for $t {
            fn of(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
        }
    };
}
float_impl!(f32);
float_impl!(f64);

fn host<'b>(arg: &'static str, t: &'b TensorRef<'_>) -> Result<&'b [u8], GdnError> {
    t.host_bytes().ok_or(GdnError::NotHost { arg, device: t.device() })
}

fn host_mut<'b>(arg: &'static str, t: &'b mut TensorMut<'_>) -> Result<&'b mut [u8], GdnError> {
    let device = t.device();
    t.host_bytes_mut().ok_or(GdnError::NotHost { arg, device })
}

/// Reads element `i` of a float buffer.
pub fn read_float(bytes: &[u8], dtype: DType, i: usize) -> f64 {
    ssm_tensor::elem::read_f64(bytes, dtype, i)
}

/// Writes element `i` of a float buffer, rounding to nearest even.
pub fn write_float(bytes: &mut [u8], dtype: DType, i: usize, x: f64) {
    ssm_tensor::elem::write_f64(bytes, dtype, i, x)
}

/// vLLM's in-kernel softplus: `β·x <= threshold ? ln(1 + e^{β·x})/β : x`.
pub fn softplus<F: Float>(x: F, beta: F, threshold: F) -> F {
    let bx = beta * x;
    if bx <= threshold { (F::of(1.0) / beta) * (F::of(1.0) + bx.exp()).ln() } else { x }
}

/// `1 / (1 + e^{−x})`.
pub fn sigmoid<F: Float>(x: F) -> F {
    F::of(1.0) / (F::of(1.0) + (-x).exp())
}

/// `g = −exp(A_log)·softplus(a + dt_bias)`.
pub fn gate<F: Float>(a_log: F, a: F, dt_bias: F, beta: F, threshold: F) -> F {
    -(a_log.exp()) * softplus(a + dt_bias, beta, threshold)
}

fn gating<F: Float>(p: &GatingPlan, args: &mut FusedGdnGatingArgs<'_>) -> Result<(), GdnError> {
    let a_log = host("A_log", &args.gates.a_log)?;
    let a = host("a", &args.gates.a)?;
    let b = host("b", &args.gates.b)?;
    let dt = host("dt_bias", &args.gates.dt_bias)?;
    let (bs, ts) = (F::of(p.softplus_beta as f64), F::of(p.threshold as f64));
    for t in 0..p.tokens {
        for h in 0..p.v_heads {
            let g = gate(
                F::of(read_float(a_log, args.gates.a_log.dtype(), p.a_log.at([h]))),
                F::of(read_float(a, args.gates.a.dtype(), p.a.at([t, h]))),
                F::of(read_float(dt, args.gates.dt_bias.dtype(), p.dt_bias.at([h]))),
                bs,
                ts,
            );
            let beta = sigmoid(F::of(read_float(b, args.gates.b.dtype(), p.b.at([t, h]))));
            let gd = args.g.dtype();
            write_float(host_mut("g", &mut args.g)?, gd, p.g.at([t, h]), g.to_f64());
            let bd = args.beta_output.dtype();
            write_float(host_mut("beta_output", &mut args.beta_output)?, bd, p.beta_output.at([t, h]), beta.to_f64());
        }
    }
    Ok(())
}

/// The inputs of the recurrence, shared by both recurrent ops and the chunked prefill.
struct Inputs<'r, 'a> {
    dims: GdnDims,
    q: (&'r TensorRef<'a>, Strided<4>),
    k: (&'r TensorRef<'a>, Strided<4>),
    v: (&'r TensorRef<'a>, Strided<4>),
    gates: GateSource<'r, 'a>,
    scale: f64,
    eps: f64,
    l2norm: bool,
}

enum GateSource<'r, 'a> {
    Given {
        g: (&'r TensorRef<'a>, Strided<3>),
        beta: Option<(&'r TensorRef<'a>, Strided<4>)>,
    },
    Sigmoid {
        plan: Gates,
        a_log: &'r TensorRef<'a>,
        dt_bias: &'r TensorRef<'a>,
        a: &'r TensorRef<'a>,
        b: &'r TensorRef<'a>,
    },
}

fn rd(t: &TensorRef<'_>, i: usize) -> f64 {
    read_float(t.host_bytes().expect("checked host"), t.dtype(), i)
}

impl Inputs<'_, '_> {
    fn check_host(&self) -> Result<(), GdnError> {
        host("q", self.q.0)?;
        host("k", self.k.0)?;
        host("v", self.v.0)?;
        match &self.gates {
            GateSource::Given { g, beta } => {
                host("g", g.0)?;
                if let Some(b) = beta {
                    host("beta", b.0)?;
                }
            }
            GateSource::Sigmoid { a_log, dt_bias, a, b, .. } => {
                host("A_log", a_log)?;
                host("dt_bias", dt_bias)?;
                host("a", a)?;
                host("b", b)?;
            }
        }
        Ok(())
    }

    /// `(g, β[0..V])` of token `(b, t)` and value head `hv`.
    fn gates<F: Float>(&self, b: usize, t: usize, hv: usize) -> (F, Vec<F>) {
        let vd = self.dims.v;
        match &self.gates {
            GateSource::Given { g, beta } => {
                let gv = F::of(rd(g.0, g.1.at([b, t, hv])));
                let be = match beta {
                    Some((bt, st)) => (0..vd).map(|i| F::of(rd(bt, st.at([b, t, hv, i])))).collect(),
                    None => vec![F::of(1.0); vd],
                };
                (gv, be)
            }
            GateSource::Sigmoid { plan, a_log, dt_bias, a, b: bb } => {
                let Gates::Sigmoid { a_log: al, dt_bias: db, a: aa, b: bs, softplus_beta, threshold } = plan else {
                    unreachable!()
                };
                let gv = gate(
                    F::of(rd(a_log, al.0.at([hv]))),
                    F::of(rd(a, aa.0.at([b, t, hv]))),
                    F::of(rd(dt_bias, db.0.at([hv]))),
                    F::of(*softplus_beta as f64),
                    F::of(*threshold as f64),
                );
                let beta = sigmoid(F::of(rd(bb, bs.0.at([b, t, hv]))));
                (gv, vec![beta; vd])
            }
        }
    }

    /// Normalised, scaled q and normalised k of token `(b, t)`, q/k head `h`.
    fn qk<F: Float>(&self, b: usize, t: usize, h: usize) -> (Vec<F>, Vec<F>) {
        let kd = self.dims.k;
        let mut q: Vec<F> = (0..kd).map(|i| F::of(rd(self.q.0, self.q.1.at([b, t, h, i])))).collect();
        let mut k: Vec<F> = (0..kd).map(|i| F::of(rd(self.k.0, self.k.1.at([b, t, h, i])))).collect();
        if self.l2norm {
            for x in [&mut q, &mut k] {
                let mut ss = F::of(0.0);
                for &e in x.iter() {
                    ss = ss + e * e;
                }
                let inv = F::of(1.0) / (ss + F::of(self.eps)).sqrt();
                for e in x.iter_mut() {
                    *e = *e * inv;
                }
            }
        }
        let scale = F::of(self.scale);
        for e in q.iter_mut() {
            *e = *e * scale;
        }
        (q, k)
    }

    /// One token of the recurrence on the `[V][K]` matrix `s`; returns `o[0..V]`.
    fn step<F: Float>(&self, s: &mut [F], b: usize, t: usize, hv: usize) -> Vec<F> {
        let (kd, vd) = (self.dims.k, self.dims.v);
        let h = hv / self.dims.group();
        let (q, k) = self.qk::<F>(b, t, h);
        let (g, beta) = self.gates::<F>(b, t, hv);
        let decay = g.exp();
        let mut o = vec![F::of(0.0); vd];
        for vi in 0..vd {
            let row = &mut s[vi * kd..(vi + 1) * kd];
            let mut pred = F::of(0.0);
            for ki in 0..kd {
                row[ki] = row[ki] * decay;
                pred = pred + row[ki] * k[ki];
            }
            let vv = F::of(rd(self.v.0, self.v.1.at([b, t, hv, vi])));
            let u = (vv - pred) * beta[vi];
            let mut acc = F::of(0.0);
            for ki in 0..kd {
                row[ki] = row[ki] + u * k[ki];
                acc = acc + row[ki] * q[ki];
            }
            o[vi] = acc;
        }
        o
    }
}

/// Element offset of `S[vi][ki]` within a head block.
fn elem(layout: StateLayout, kd: usize, vd: usize, vi: usize, ki: usize) -> usize {
    match layout {
        StateLayout::VK => vi * kd + ki,
        StateLayout::KV => ki * vd + vi,
    }
}

fn load_state<F: Float>(
    t: &TensorMut<'_>,
    sv: &StateView,
    layout: StateLayout,
    dims: &GdnDims,
    row: usize,
    hv: usize,
) -> Vec<F> {
    let (kd, vd) = (dims.k, dims.v);
    let bytes = t.as_ref().host_bytes().expect("checked host");
    let base = sv.head(row, hv, dims.head_elems());
    let mut s = vec![F::of(0.0); kd * vd];
    for vi in 0..vd {
        for ki in 0..kd {
            s[vi * kd + ki] = F::of(read_float(bytes, sv.dtype, base + elem(layout, kd, vd, vi, ki)));
        }
    }
    s
}

fn store_state<F: Float>(
    t: &mut TensorMut<'_>,
    sv: &StateView,
    layout: StateLayout,
    dims: &GdnDims,
    row: usize,
    hv: usize,
    s: &[F],
) {
    let (kd, vd) = (dims.k, dims.v);
    let bytes = t.host_bytes_mut().expect("checked host");
    let base = sv.head(row, hv, dims.head_elems());
    for vi in 0..vd {
        for ki in 0..kd {
            write_float(bytes, sv.dtype, base + elem(layout, kd, vd, vi, ki), s[vi * kd + ki].to_f64());
        }
    }
}

fn write_o<F: Float>(o: &mut TensorMut<'_>, st: &Strided<4>, b: usize, t: usize, hv: usize, vals: &[F]) {
    let dt = o.dtype();
    let bytes = o.host_bytes_mut().expect("checked host");
    for (vi, x) in vals.iter().enumerate() {
        write_float(bytes, dt, st.at([b, t, hv, vi]), x.to_f64());
    }
}

struct RecurrentOut<'r, 'a> {
    initial_state: Option<&'r mut TensorMut<'a>>,
    final_state: Option<&'r mut TensorMut<'a>>,
    o: &'r mut TensorMut<'a>,
}

fn recurrent<F: Float>(
    p: &RecurrentPlan,
    inp: &Inputs<'_, '_>,
    cu: Option<&TensorRef<'_>>,
    ix: Option<&TensorRef<'_>>,
    na: Option<&TensorRef<'_>>,
    out: RecurrentOut<'_, '_>,
) -> Result<(), GdnError> {
    inp.check_host()?;
    for (name, t) in [("cu_seqlens", cu), ("ssm_state_indices", ix), ("num_accepted_tokens", na)] {
        if let Some(t) = t {
            host(name, t)?;
        }
    }
    let RecurrentOut { mut initial_state, mut final_state, o } = out;
    if let Some(s) = initial_state.as_deref_mut() {
        host_mut("initial_state", s)?;
    }
    if let Some(s) = final_state.as_deref_mut() {
        host_mut("final_state", s)?;
    }
    host_mut("o", o)?;
    let dims = p.dims;
    for n in 0..dims.seqs {
        let sp = p.span(cu, n);
        if sp.len == 0 {
            continue;
        }
        let start = p.start(ix, na, n, &sp);
        for hv in 0..dims.v_heads {
            let mut s = match start {
                StartState::Skip => break,
                StartState::ZeroOutput => {
                    let z = vec![F::of(0.0); dims.v];
                    for t in 0..sp.len {
                        write_o(o, &p.o.0, sp.b, sp.t0 + t, hv, &z);
                    }
                    continue;
                }
                StartState::Zeros => vec![F::of(0.0); dims.k * dims.v],
                StartState::Row(r) => {
                    load_state(initial_state.as_deref().unwrap(), p.state.as_ref().unwrap(), p.layout, &dims, r, hv)
                }
            };
            for t in 0..sp.len {
                let ov = inp.step(&mut s, sp.b, sp.t0 + t, hv);
                write_o(o, &p.o.0, sp.b, sp.t0 + t, hv, &ov);
                if let Some(r) = p.store_row(ix, n, &sp, t) {
                    store_state(
                        initial_state.as_deref_mut().unwrap(),
                        p.state.as_ref().unwrap(),
                        p.layout,
                        &dims,
                        r,
                        hv,
                        &s,
                    );
                }
                if let Some(r) = p.final_row(&sp, t) {
                    store_state(
                        final_state.as_deref_mut().unwrap(),
                        p.final_state.as_ref().unwrap(),
                        p.layout,
                        &dims,
                        r,
                        hv,
                        &s,
                    );
                }
            }
        }
    }
    Ok(())
}

fn chunk<F: Float>(p: &ChunkPlan, args: &mut ChunkGatedDeltaRuleArgs<'_>) -> Result<(), GdnError> {
    let inp = Inputs {
        dims: p.dims,
        q: (&args.q, p.q.0),
        k: (&args.k, p.k.0),
        v: (&args.v, p.v.0),
        gates: GateSource::Given {
            g: (&args.g, p.g.0),
            beta: Some((
                &args.beta,
                Strided {
                    offset: p.beta.0.offset,
                    strides: [p.beta.0.strides[0], p.beta.0.strides[1], p.beta.0.strides[2], 0],
                },
            )),
        },
        scale: p.scale as f64,
        eps: p.eps as f64,
        l2norm: p.l2norm,
    };
    inp.check_host()?;
    for (name, t) in [
        ("cu_seqlens", args.cu_seqlens.as_ref()),
        ("initial_state_indices", args.initial_state_indices.as_ref()),
        ("has_initial_state", args.has_initial_state.as_ref()),
    ] {
        if let Some(t) = t {
            host(name, t)?;
        }
    }
    if let Some(s) = args.initial_state.as_mut() {
        host_mut("initial_state", s)?;
    }
    if let Some(s) = args.final_state.as_mut() {
        host_mut("final_state", s)?;
    }
    host_mut("o", &mut args.o)?;
    let dims = p.dims;
    for n in 0..dims.seqs {
        let sp = p.span(args.cu_seqlens.as_ref(), n);
        let start = p.start(args.initial_state_indices.as_ref(), args.has_initial_state.as_ref(), n);
        let (read, write) = match start {
            ChunkStart::Skip => continue,
            ChunkStart::Zeros { row } => (None, row),
            ChunkStart::Row(r) => (Some(r), p.inplace.then_some(r)),
        };
        for hv in 0..dims.v_heads {
            let mut s = match read {
                Some(r) => {
                    load_state(args.initial_state.as_ref().unwrap(), p.state.as_ref().unwrap(), p.layout, &dims, r, hv)
                }
                None => vec![F::of(0.0); dims.k * dims.v],
            };
            for t in 0..sp.len {
                let ov = inp.step(&mut s, sp.b, sp.t0 + t, hv);
                write_o(&mut args.o, &p.o.0, sp.b, sp.t0 + t, hv, &ov);
            }
            if let (Some(fs), Some(sv)) = (args.final_state.as_mut(), p.final_state.as_ref()) {
                store_state(fs, sv, p.layout, &dims, n, hv, &s);
            }
            if let (Some(r), Some(sv)) = (write, p.state.as_ref()) {
                store_state(args.initial_state.as_mut().unwrap(), sv, p.layout, &dims, r, hv, &s);
            }
        }
    }
    Ok(())
}

struct QkvRefs<'r, 'a> {
    q: &'r TensorRef<'a>,
    k: &'r TensorRef<'a>,
    v: &'r TensorRef<'a>,
}

fn inputs<'r, 'a>(p: &RecurrentPlan, qkv: QkvRefs<'r, 'a>, gates: GateSource<'r, 'a>) -> Inputs<'r, 'a> {
    Inputs {
        dims: p.dims,
        q: (qkv.q, p.q.0),
        k: (qkv.k, p.k.0),
        v: (qkv.v, p.v.0),
        gates,
        scale: p.scale as f64,
        eps: p.eps as f64,
        l2norm: p.l2norm,
    }
}

impl Run<FusedGdnGatingArgs<'_>> for Reference {
    type Error = GdnError;
    fn run(&self, call: Planned<FusedGdnGatingArgs<'_>>) -> Result<(), GdnError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        match self.precision {
            Arithmetic::F32 => gating::<f32>(plan, &mut args),
            Arithmetic::F64 => gating::<f64>(plan, &mut args),
        }
    }
}

impl Run<FusedRecurrentGatedDeltaRuleArgs<'_>> for Reference {
    type Error = GdnError;
    fn run(&self, call: Planned<FusedRecurrentGatedDeltaRuleArgs<'_>>) -> Result<(), GdnError> {
        let (mut a, plan) = call.into_parts();
        let Gates::Given { g: g_at, beta: beta_at, .. } = plan.gates else {
            unreachable!("plan of fused_recurrent_gated_delta_rule")
        };
        let gates = GateSource::Given { g: (&a.g, g_at), beta: beta_at.map(|(st, _)| (a.beta.as_ref().unwrap(), st)) };
        run_recurrent(self.precision, &plan, gates, &mut a.rule)
    }
}

impl Run<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>> for Reference {
    type Error = GdnError;
    fn run(&self, call: Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>>) -> Result<(), GdnError> {
        let (mut a, plan) = call.into_parts();
        let gates = GateSource::Sigmoid {
            plan: plan.gates,
            a_log: &a.gates.a_log,
            dt_bias: &a.gates.dt_bias,
            a: &a.gates.a,
            b: &a.gates.b,
        };
        run_recurrent(self.precision, &plan, gates, &mut a.rule)
    }
}

/// Both recurrent ops at `precision`: the delta rule of `rule` with `gates`.
fn run_recurrent(
    precision: Arithmetic,
    plan: &RecurrentPlan,
    gates: GateSource<'_, '_>,
    rule: &mut DeltaRuleArgs<'_>,
) -> Result<(), GdnError> {
    let inp = inputs(plan, QkvRefs { q: &rule.q, k: &rule.k, v: &rule.v }, gates);
    let (cu, ix, na) = (rule.cu_seqlens.as_ref(), rule.ssm_state_indices.as_ref(), rule.num_accepted_tokens.as_ref());
    let out = RecurrentOut {
        initial_state: rule.initial_state.as_mut(),
        final_state: rule.final_state.as_mut(),
        o: &mut rule.o,
    };
    match precision {
        Arithmetic::F32 => recurrent::<f32>(plan, &inp, cu, ix, na, out),
        Arithmetic::F64 => recurrent::<f64>(plan, &inp, cu, ix, na, out),
    }
}

impl Run<ChunkGatedDeltaRuleArgs<'_>> for Reference {
    type Error = GdnError;
    fn run(&self, call: Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), GdnError> {
        let (mut args, plan) = call.into_parts();
        let plan = &plan;
        match self.precision {
            Arithmetic::F32 => chunk::<f32>(plan, &mut args),
            Arithmetic::F64 => chunk::<f64>(plan, &mut args),
        }
    }
}

impl crate::ChunkScratch for Reference {
    fn chunk_gated_delta_rule_scratch_size(&self, _plan: &ChunkPlan) -> usize {
        0
    }
}

impl Run<crate::GdnDecodeStepArgs<'_>> for Reference {
    type Error = GdnError;
    /// The conv update (`ssm_conv`'s reference at the same precision), then the recurrence.
    fn run(&self, call: Planned<crate::GdnDecodeStepArgs<'_>>) -> Result<(), GdnError> {
        let (args, plan) = call.into_parts();
        // SAFETY: the conv call runs to completion before the recurrence starts; no host slice
        // of q/k/v is held meanwhile.
        let (conv, step) = unsafe { args.into_parts() };
        ssm_conv::reference::Reference { precision: self.precision }
            .run(conv)
            .map_err(|_| GdnError::NotHost { arg: "conv", device: plan.device })?;
        self.run(step)
    }
}
