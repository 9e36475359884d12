//! Benchmark pieces for `cargo xtask bench --op gdn --backend cuda`: the recurrent
//! gated-delta-rule decode ops (`fused_sigmoid_gating_delta_rule_update`, gates fused, and
//! `fused_recurrent_gated_delta_rule`, gates precomputed) timed exactly as the SSU bench times
//! its op ([`crate::bench`]: CUDA-graph replay of many calls rotating over enough state pools
//! to exceed the 60 MB L2 several times, median replay over the calls in the graph).
//!
//! The calls are Qwen3-Next decode as vLLM makes them: bf16 q/k/v/o, q/k l2-normalised in the
//! kernel (eps 1e-6), the state pool `[slots, HV, V, K]` updated in place through a slot table
//! whose entries are a random permutation of the pool's slots (slot 0 is vLLM's null block and
//! is never referenced). Plain decode: dense `[B, 1, …]` tensors and a 1-D table. Speculative
//! decode (`tokens > 1`): packed `[1, B·T, …]` tensors with `cu_seqlens`, a `[B, T]` table and
//! `num_accepted_tokens` drawn in `1..=T`. Gates fused: `a`, `b` bf16 `[B·T, HV]`, `A_log`,
//! `dt_bias` f32 `[HV]`; gates given: `g` f32 and `beta` bf16, `[B, T, HV]` (what
//! `fused_gdn_gating` writes). The decode step and the conv update alone add the conv's
//! projected rows, output and state pool to each pool, and read one weight tensor shared by
//! every pool, as a layer's calls share its weights (and as the peer script passes them).
//!
//! Bytes per call ([`GdnBenchShape::bytes`]) are the fewest the op must move, with
//! `R = B·T` token rows and `s` the state element size:
//! - state: `B·HV·V·K·s·(1 + T)`: each touched slot read once, written once per token;
//! - q and k: `2·R·H·K·2`; v and o: `2·R·HV·V·2`;
//! - gates fused: `2·R·HV·2 + 2·HV·4`; gates given: `R·HV·(4 + 2)`;
//! - tables: `B·4` (1-D); speculative: `B·T·4 + B·4 + (B + 1)·4` (table, accepted counts,
//!   `cu_seqlens`).

use ssm_gdn::{DeltaRuleArgs, FusedRecurrentGatedDeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs};
use ssm_tensor::{DType, Run, TensorError};

use crate::bench::{BenchResult, SlotTableViews, SlotTables, bench_rotating, fill, state_and_table_bytes, tensor_err};
use crate::testing::DeviceBuffer;
use crate::{CudaBackend, CudaError};

/// Which recurrent GDN op a shape times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GdnBenchOp {
    /// `fused_sigmoid_gating_delta_rule_update`: `g` and `β` computed in the kernel from
    /// `A_log`, `a`, `b`, `dt_bias`.
    SigmoidGating,
    /// `fused_recurrent_gated_delta_rule`: `g` and `β` read (precomputed by `fused_gdn_gating`).
    Recurrent,
    /// `gdn_decode_step`: the conv update of the projected rows (`[B, 2·H·K + HV·V]` bf16, width
    /// 4, no bias, silu, conv state `[slots, 3, dim]` through the same slot table), then the
    /// sigmoid-gated recurrence on its output, one token per sequence, on its default route.
    Step,
    /// The same step as its two calls (`causal_conv1d_update`, then
    /// `fused_sigmoid_gating_delta_rule_update`), two plain launches.
    StepParts,
    /// The same step on the fused kernel (one launch), whichever route is the default.
    StepFused,
    /// `causal_conv1d_update` alone: the step's conv (its rows, weights, state pool and slot
    /// table) as the layer calls it before the recurrence; the shape's state dtype is the
    /// activations' (the conv state's).
    ConvUpdate,
}

/// Width of the bench step's conv.
const STEP_WIDTH: usize = 4;

impl GdnBenchOp {
    /// vLLM's name of the op.
    pub fn name(self) -> &'static str {
        match self {
            GdnBenchOp::SigmoidGating => "fused_sigmoid_gating_delta_rule_update",
            GdnBenchOp::Recurrent => "fused_recurrent_gated_delta_rule",
            GdnBenchOp::Step => "gdn_decode_step",
            GdnBenchOp::StepParts => "causal_conv1d_update+fused_sigmoid_gating_delta_rule_update",
            GdnBenchOp::StepFused => "gdn_step_kernel",
            GdnBenchOp::ConvUpdate => "causal_conv1d_update",
        }
    }

    /// Whether the op is the decode step (fused or as its parts).
    pub fn is_step(self) -> bool {
        matches!(self, GdnBenchOp::Step | GdnBenchOp::StepParts | GdnBenchOp::StepFused)
    }

    /// Whether the op runs the step's conv update (the step, or the conv alone).
    pub fn has_conv(self) -> bool {
        self.is_step() || self == GdnBenchOp::ConvUpdate
    }

    /// A short name: `sigmoid`, `recurrent`, `step`, `step_parts`, `step_fused` or `conv`.
    pub fn short(self) -> &'static str {
        match self {
            GdnBenchOp::SigmoidGating => "sigmoid",
            GdnBenchOp::Recurrent => "recurrent",
            GdnBenchOp::Step => "step",
            GdnBenchOp::StepParts => "step_parts",
            GdnBenchOp::StepFused => "step_fused",
            GdnBenchOp::ConvUpdate => "conv",
        }
    }
}

/// One GDN decode benchmark shape (see the module docs for the call's form).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnBenchShape {
    /// The op.
    pub op: GdnBenchOp,
    /// Sequences.
    pub batch: usize,
    /// q/k heads `H`.
    pub heads: usize,
    /// Value heads `HV` (a multiple of `H`).
    pub v_heads: usize,
    /// `head_k_dim` `K`.
    pub k: usize,
    /// `head_v_dim` `V`.
    pub v: usize,
    /// State dtype.
    pub state: DType,
    /// Dtype of q, k, v, o (and of `a`, `b`, `beta`).
    pub io: DType,
    /// Tokens per sequence (1: plain decode; >1: speculative).
    pub tokens: usize,
}

impl GdnBenchShape {
    /// Qwen3-Next-80B's linear-attention layer: H 16, HV 32, K = V = 128, bf16 io.
    pub fn qwen3_next(op: GdnBenchOp, batch: usize, state: DType, tokens: usize) -> Self {
        GdnBenchShape { op, batch, heads: 16, v_heads: 32, k: 128, v: 128, state, io: DType::BF16, tokens }
    }

    /// The conv update alone over Qwen3-Next's projected rows (`conv_dim` 8192, width 4, bf16
    /// rows and conv state), `batch` sequences, one token each.
    pub fn qwen3_next_conv(batch: usize) -> Self {
        GdnBenchShape::qwen3_next(GdnBenchOp::ConvUpdate, batch, DType::BF16, 1)
    }

    /// A short label, e.g. `sigmoid h16/32 k128 v128 f32 b64 spec3`, or `conv d8192 w4 bf16 b64`.
    pub fn label(&self) -> String {
        if self.op == GdnBenchOp::ConvUpdate {
            return format!("conv d{} w{STEP_WIDTH} {} b{}", self.conv_dim(), self.io, self.batch);
        }
        let mode = if self.tokens > 1 { format!(" spec{}", self.tokens) } else { String::new() };
        format!(
            "{} h{}/{} k{} v{} {} b{}{mode}",
            self.op.short(),
            self.heads,
            self.v_heads,
            self.k,
            self.v,
            self.state,
            self.batch
        )
    }

    /// Slots the table refers to (one per sequence and token); the pool holds one more, the
    /// null slot 0.
    pub fn slots(&self) -> usize {
        self.batch * self.tokens
    }

    /// Token rows `B·T`.
    pub fn rows(&self) -> usize {
        self.batch * self.tokens
    }

    /// Channels of the step's conv: `2·H·K + HV·V`.
    pub fn conv_dim(&self) -> usize {
        2 * self.heads * self.k + self.v_heads * self.v
    }

    /// Bytes one call must move at least (see the module docs).
    pub fn bytes(&self) -> u64 {
        let (h, hv, k, v) = (self.heads as u64, self.v_heads as u64, self.k as u64, self.v as u64);
        let io = self.io.size() as u64;
        let rows = self.rows() as u64;
        // The conv: x read, its output written (the op's contract), the conv window read and
        // written, the weights.
        let (dim, w) = (self.conv_dim() as u64, STEP_WIDTH as u64);
        let conv = 2 * rows * dim * io + 2 * rows * dim * (w - 1) * io + dim * w * io;
        if self.op == GdnBenchOp::ConvUpdate {
            return conv + self.batch as u64 * 4;
        }
        if self.op.is_step() {
            // The step: the conv, the gates, o, the state and the table.
            let rest = rows * hv * v * io + 2 * rows * hv * io + 2 * hv * 4;
            return state_and_table_bytes(self.batch, 1, hv * v * k * self.state.size() as u64) + conv + rest;
        }
        let tok = 2 * rows * h * k * io + 2 * rows * hv * v * io;
        let gates = match self.op {
            GdnBenchOp::Recurrent => rows * hv * (4 + io),
            _ => 2 * rows * hv * io + 2 * hv * 4,
        };
        state_and_table_bytes(self.batch, self.tokens, hv * v * k * self.state.size() as u64) + tok + gates
    }
}

/// Timing of one GDN shape.
pub type GdnBenchResult = BenchResult<GdnBenchShape>;

/// One state pool with its own inputs, output and tables.
struct Pool<'w> {
    state: DeviceBuffer,
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    o: DeviceBuffer,
    /// Gates fused: `a`; gates given: `g` (f32).
    ga: DeviceBuffer,
    /// Gates fused: `b`; gates given: `beta`.
    gb: DeviceBuffer,
    a_log: DeviceBuffer,
    dt_bias: DeviceBuffer,
    tables: SlotTables,
    /// The step's conv: projected rows, state pool, output (empty for the other ops).
    conv: Vec<DeviceBuffer>,
    /// The conv weights, one tensor shared by every pool as a layer's weights are by its calls
    /// (vLLM's peer script passes one tensor too).
    conv_w: Option<&'w DeviceBuffer>,
}

/// The tensor views of one call (shared by both ops).
struct Views<'a> {
    state: ssm_tensor::TensorMut<'a>,
    q: ssm_tensor::TensorRef<'a>,
    k: ssm_tensor::TensorRef<'a>,
    v: ssm_tensor::TensorRef<'a>,
    o: ssm_tensor::TensorMut<'a>,
    ga: ssm_tensor::TensorRef<'a>,
    gb: ssm_tensor::TensorRef<'a>,
    a_log: ssm_tensor::TensorRef<'a>,
    dt_bias: ssm_tensor::TensorRef<'a>,
    tables: SlotTableViews<'a>,
}

impl<'w> Pool<'w> {
    fn new(
        be: &CudaBackend,
        s: &GdnBenchShape,
        seed: u64,
        conv_w: Option<&'w DeviceBuffer>,
    ) -> Result<Self, CudaError> {
        let (h, hv, k, v) = (s.heads, s.v_heads, s.k, s.v);
        let rows = s.rows();
        let pool_slots = s.slots() + 1;
        let buf = |elems: usize, dtype: DType| DeviceBuffer::zeroed(be, elems * dtype.size());
        let given = s.op == GdnBenchOp::Recurrent;
        let ga_dtype = if given { DType::F32 } else { s.io };
        // The conv alone touches no recurrent state.
        let state_elems = if s.op == GdnBenchOp::ConvUpdate { 1 } else { pool_slots * hv * v * k };
        let pool = Pool {
            state: buf(state_elems, s.state)?,
            q: buf(rows * h * k, s.io)?,
            k: buf(rows * h * k, s.io)?,
            v: buf(rows * hv * v, s.io)?,
            o: buf(rows * hv * v, s.io)?,
            ga: buf(rows * hv, ga_dtype)?,
            gb: buf(rows * hv, s.io)?,
            a_log: buf(hv, DType::F32)?,
            dt_bias: buf(hv, DType::F32)?,
            // Slots 1..=slots (0 is the null block).
            tables: SlotTables::new(be, s.batch, s.tokens, 1, seed)?,
            conv: if s.op.has_conv() {
                let dim = s.conv_dim();
                vec![buf(rows * dim, s.io)?, buf(pool_slots * (STEP_WIDTH - 1) * dim, s.io)?, buf(rows * dim, s.io)?]
            } else {
                Vec::new()
            },
            conv_w,
        };
        if s.op.has_conv() {
            let dim = s.conv_dim();
            fill(be, pool.conv[0].addr(), rows * dim, s.io, seed + 8, -1.0, 1.0)?;
            fill(be, pool.conv[1].addr(), pool_slots * (STEP_WIDTH - 1) * dim, s.io, seed + 10, -1.0, 1.0)?;
        }
        fill(be, pool.state.addr(), state_elems, s.state, seed, -0.5, 0.5)?;
        fill(be, pool.q.addr(), rows * h * k, s.io, seed + 1, -1.0, 1.0)?;
        fill(be, pool.k.addr(), rows * h * k, s.io, seed + 2, -1.0, 1.0)?;
        fill(be, pool.v.addr(), rows * hv * v, s.io, seed + 3, -1.0, 1.0)?;
        if given {
            fill(be, pool.ga.addr(), rows * hv, DType::F32, seed + 4, -1.5, -0.001)?;
            fill(be, pool.gb.addr(), rows * hv, s.io, seed + 5, 0.05, 0.95)?;
        } else {
            fill(be, pool.ga.addr(), rows * hv, s.io, seed + 4, -3.0, 3.0)?;
            fill(be, pool.gb.addr(), rows * hv, s.io, seed + 5, -3.0, 3.0)?;
        }
        fill(be, pool.a_log.addr(), hv, DType::F32, seed + 6, -1.0, 1.0)?;
        fill(be, pool.dt_bias.addr(), hv, DType::F32, seed + 7, -1.0, 1.0)?;
        Ok(pool)
    }

    fn views(&mut self, s: &GdnBenchShape) -> Result<Views<'_>, TensorError> {
        let (h, hv, k, v) = (s.heads, s.v_heads, s.k, s.v);
        let rows = s.rows();
        let spec = s.tokens > 1;
        // Plain decode: dense [B, 1, …]; speculative: packed [1, B·T, …] with cu_seqlens.
        let (bsz, t) = if spec { (1, rows) } else { (s.batch, 1) };
        let tok4 = |heads: usize, dim: usize| {
            let (hi, di) = (heads as isize, dim as isize);
            ([bsz, t, heads, dim], [t as isize * hi * di, hi * di, di, 1])
        };
        let (qs, qst) = tok4(h, k);
        let (vs, vst) = tok4(hv, v);
        let gate_shape = [bsz, t, hv];
        let gate_strides = [t as isize * hv as isize, hv as isize, 1];
        let given = s.op == GdnBenchOp::Recurrent;
        let ga_dtype = if given { DType::F32 } else { s.io };
        let (hvi, vi, ki) = (hv as isize, v as isize, k as isize);
        Ok(Views {
            state: self.state.view_mut(s.state, &[s.slots() + 1, hv, v, k], &[hvi * vi * ki, vi * ki, ki, 1], 0)?,
            q: self.q.view(s.io, &qs, &qst, 0)?,
            k: self.k.view(s.io, &qs, &qst, 0)?,
            v: self.v.view(s.io, &vs, &vst, 0)?,
            o: self.o.view_mut(s.io, &vs, &vst, 0)?,
            ga: self.ga.view(ga_dtype, &gate_shape, &gate_strides, 0)?,
            gb: self.gb.view(s.io, &gate_shape, &gate_strides, 0)?,
            a_log: self.a_log.view(DType::F32, &[hv], &[1], 0)?,
            dt_bias: self.dt_bias.view(DType::F32, &[hv], &[1], 0)?,
            tables: self.tables.views()?,
        })
    }

    /// The step's conv update over this pool's conv buffers, through the slot table.
    fn conv_args<'a>(
        conv: &'a mut [DeviceBuffer],
        w: Option<&'a DeviceBuffer>,
        tables: &'a SlotTables,
        s: &GdnBenchShape,
    ) -> Result<ssm_conv::CausalConv1dUpdateArgs<'a>, CudaError> {
        let slots = s.slots() + 1;
        let ([x, cstate, out], Some(w)) = (conv, w) else {
            return Err(CudaError::Unsupported("bench: a conv over a pool without conv buffers".into()));
        };
        let (dim, rows) = (s.conv_dim(), s.rows());
        let (d, wd) = (dim as isize, STEP_WIDTH as isize);
        Ok(ssm_conv::CausalConv1dUpdateArgs {
            x: x.view(s.io, &[rows, dim], &[d, 1], 0).map_err(tensor_err)?,
            conv_state: cstate
                .view_mut(s.io, &[slots, STEP_WIDTH - 1, dim], &[(wd - 1) * d, d, 1], 0)
                .map_err(tensor_err)?,
            conv_state_layout: ssm_conv::ConvStateLayout::StateLenDim,
            weight: w.view(s.io, &[dim, STEP_WIDTH], &[wd, 1], 0).map_err(tensor_err)?,
            bias: None,
            activation: ssm_conv::Activation::Silu,
            conv_state_indices: Some(tables.views().map_err(tensor_err)?.ix),
            num_accepted_tokens: None,
            query_start_loc: None,
            pad_slot_id: Some(-1),
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out: out.view_mut(s.io, &[rows, dim], &[d, 1], 0).map_err(tensor_err)?,
        })
    }

    /// Plans one decode step over this pool (the conv and the SSM state share the slot table).
    fn step(&mut self, s: &GdnBenchShape) -> Result<ssm_tensor::Planned<ssm_gdn::GdnDecodeStepArgs<'_>>, CudaError> {
        let bad_plan = |e: ssm_gdn::GdnError| CudaError::Unsupported(format!("bench plan: {e}"));
        let (hv, v, k, slots) = (s.v_heads as isize, s.v as isize, s.k as isize, s.slots() + 1);
        let rows = s.rows();
        let conv = Self::conv_args(&mut self.conv, self.conv_w, &self.tables, s)?;
        let gate = [rows, s.v_heads];
        let gst = [hv, 1];
        let args = ssm_gdn::GdnDecodeStepArgs::new(
            conv,
            s.heads,
            GateInputs::new(
                self.a_log.view(DType::F32, &[s.v_heads], &[1], 0).map_err(tensor_err)?,
                self.ga.view(s.io, &gate, &gst, 0).map_err(tensor_err)?,
                self.gb.view(s.io, &gate, &gst, 0).map_err(tensor_err)?,
                self.dt_bias.view(DType::F32, &[s.v_heads], &[1], 0).map_err(tensor_err)?,
            ),
            self.state
                .view_mut(s.state, &[slots, s.v_heads, s.v, s.k], &[hv * v * k, v * k, k, 1], 0)
                .map_err(tensor_err)?,
            Some(self.tables.views().map_err(tensor_err)?.ix),
            ssm_gdn::StateLayout::VK,
            self.o.view_mut(s.io, &[rows, 1, s.v_heads, s.v], &[hv * v, hv * v, v, 1], 0).map_err(tensor_err)?,
        )
        .map_err(bad_plan)?;
        ssm_gdn::plan(args).map_err(bad_plan)
    }

    /// Plans and launches one call of `s` over this pool (no allocation, no sync).
    fn launch(&mut self, be: &CudaBackend, s: &GdnBenchShape) -> Result<(), CudaError> {
        let gates_given = match s.op {
            GdnBenchOp::Step => {
                let call = self.step(s)?;
                return be.run(call);
            }
            GdnBenchOp::StepParts => {
                let call = self.step(s)?;
                return be.run_gdn_decode_step_on(call, crate::gdn::StepRoute::Separate);
            }
            GdnBenchOp::StepFused => {
                let call = self.step(s)?;
                return be.run_gdn_decode_step_on(call, crate::gdn::StepRoute::Fused);
            }
            GdnBenchOp::ConvUpdate => {
                let conv = Self::conv_args(&mut self.conv, self.conv_w, &self.tables, s)?;
                let bad_plan = |e: ssm_conv::ConvError| CudaError::Unsupported(format!("bench plan: {e}"));
                return be.run(ssm_conv::plan(conv).map_err(bad_plan)?);
            }
            GdnBenchOp::SigmoidGating => false,
            GdnBenchOp::Recurrent => true,
        };
        let w = self.views(s).map_err(tensor_err)?;
        let bad_plan = |e: ssm_gdn::GdnError| CudaError::Unsupported(format!("bench plan: {e}"));
        // Both ops: in-place state, the slot tables, q/k l2norm with eps 1e-6, the VK layout.
        let rule = DeltaRuleArgs {
            initial_state: Some(w.state),
            cu_seqlens: w.tables.cu,
            ssm_state_indices: Some(w.tables.ix),
            num_accepted_tokens: w.tables.nacc,
            use_qk_l2norm_in_kernel: true,
            ..DeltaRuleArgs::new(w.q, w.k, w.v, w.o)
        };
        if gates_given {
            be.run(
                ssm_gdn::plan(FusedRecurrentGatedDeltaRuleArgs { g: w.ga, beta: Some(w.gb), rule })
                    .map_err(bad_plan)?,
            )
        } else {
            be.run(
                ssm_gdn::plan(FusedSigmoidGatingDeltaRuleUpdateArgs {
                    gates: GateInputs::new(w.a_log, w.ga, w.gb, w.dt_bias),
                    rule,
                })
                .map_err(bad_plan)?,
            )
        }
    }
}

/// Times `shape`: CUDA-graph replay of many calls rotating over enough pools to defeat the L2.
pub fn bench_gdn(be: &CudaBackend, shape: &GdnBenchShape) -> Result<GdnBenchResult, CudaError> {
    let conv_w = match shape.op.has_conv() {
        true => {
            let n = shape.conv_dim() * STEP_WIDTH;
            let w = DeviceBuffer::zeroed(be, n * shape.io.size())?;
            fill(be, w.addr(), n, shape.io, 9, -0.5, 0.5)?;
            Some(w)
        }
        false => None,
    };
    bench_rotating(
        be,
        shape,
        shape.bytes(),
        2000,
        |seed| Pool::new(be, shape, seed, conv_w.as_ref()),
        |p| p.launch(be, shape),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_count_of_qwen3_next_decode() {
        let s = GdnBenchShape::qwen3_next(GdnBenchOp::SigmoidGating, 64, DType::F32, 1);
        let state = 64 * 32 * 128 * 128 * 4 * 2;
        let tok = 64 * 16 * 128 * 2 * 2 + 64 * 32 * 128 * 2 * 2;
        let gates = 64 * 32 * 2 * 2 + 2 * 32 * 4;
        assert_eq!(s.bytes(), (state + tok + gates + 64 * 4) as u64);
        let r = GdnBenchShape { op: GdnBenchOp::Recurrent, ..s };
        assert_eq!(r.bytes(), (state + tok + 64 * 32 * 6 + 64 * 4) as u64);
        // Speculative: one read and one write per token, 2-D table, counts and cu_seqlens.
        let s3 = GdnBenchShape::qwen3_next(GdnBenchOp::Recurrent, 64, DType::BF16, 3);
        let state3 = 64 * 32 * 128 * 128 * 2 * 4;
        let tok3 = 192 * 16 * 128 * 2 * 2 + 192 * 32 * 128 * 2 * 2;
        assert_eq!(s3.bytes(), (state3 + tok3 + 192 * 32 * 6 + 192 * 4 + 64 * 4 + 65 * 4) as u64);
        assert_eq!(s3.slots(), 192);
        assert_eq!(s.label(), "sigmoid h16/32 k128 v128 f32 b64");
        assert_eq!(s3.label(), "recurrent h16/32 k128 v128 bf16 b64 spec3");
        // The conv alone: rows in and out, the window read and written, weights, table.
        let c = GdnBenchShape::qwen3_next_conv(64);
        assert_eq!(c.bytes(), (2 * 64 * 8192 * 2 + 2 * 64 * 8192 * 3 * 2 + 8192 * 4 * 2 + 64 * 4) as u64);
        assert_eq!(c.label(), "conv d8192 w4 bf16 b64");
    }
}
