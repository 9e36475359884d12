//! `fused_gdn_gating`, `fused_recurrent_gated_delta_rule` and
//! `fused_sigmoid_gating_delta_rule_update` on CUDA: each maps a checked plan onto one launch of
//! `kernels/gdn.cu`, specialised for the call's dtypes, `head_k_dim`, tile and flags.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;
use ssm_gdn::plan::{Gates, StateSlots, StateView};
use ssm_gdn::{
    DeltaRuleArgs, DeviceParts, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GatingPlan, GdnDecodeStepArgs, RecurrentPlan, StateLayout,
};
use ssm_tensor::Strided;
use ssm_tensor::{DType, Planned, Run};

use crate::compile::{KernelSource, KernelSpec, c_type};
use crate::conv::{ConvKey, ConvParams, update_call};
use crate::geometry::{BlockSplit, RowGeometry, TuneVar, fit_rows, grid_x, raw16_rows, rows_and_threads};
use crate::{CudaBackend, CudaError, addr_of};

// ---------------------------------------------------------------------------------------------
// fused_gdn_gating

/// The gating kernel's parameter block (`struct GatingParams` in gdn.cu: same order, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct GatingParams {
    a_log: u64,
    dt_bias: u64,
    a: u64,
    b: u64,
    g: u64,
    beta_out: u64,
    a_log_s: i64,
    dtb_s: i64,
    a_t: i64,
    a_h: i64,
    b_t: i64,
    b_h: i64,
    g_t: i64,
    g_h: i64,
    bo_t: i64,
    bo_h: i64,
    tokens: i64,
    heads: i32,
    softplus_beta: f32,
    threshold: f32,
    reserved: i32,
}

// SAFETY: `GatingParams` is `#[repr(C)]` plain old data whose layout equals `struct GatingParams`
// in gdn.cu; the driver copies it by value.
unsafe impl DeviceRepr for GatingParams {}

/// The gating specialisation for input dtypes `[A_log, dt_bias, a, b]` and `beta_output`'s dtype.
pub fn gating_spec(inputs: [DType; 4], beta_output: DType) -> KernelSpec {
    let names = ["ALOG_T", "DTB_T", "A_T", "B_T"];
    let mut defines: Vec<(&'static str, String)> =
        names.iter().zip(inputs).map(|(&n, t)| (n, c_type(t).to_string())).collect();
    defines.push(("BETAO_T", c_type(beta_output).to_string()));
    defines.push(("GATING_ONLY", "1".to_string()));
    KernelSpec { source: KernelSource::Gdn, entry: "gdn_gating_kernel", defines }
}

impl Run<FusedGdnGatingArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// Launches the elementwise gating kernel on the backend's stream (no allocation, no sync).
    fn run(&self, call: Planned<FusedGdnGatingArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let p: &GatingPlan = &plan;
        let n = p.tokens * p.v_heads;
        if n == 0 {
            return Ok(());
        }
        if p.v_heads > i32::MAX as usize {
            return Err(CudaError::Unsupported(format!("HV = {} exceeds the kernel's 32-bit counters", p.v_heads)));
        }
        let func = self.gdn_function(GdnKey::Gating([
            args.gates.a_log.dtype(),
            args.gates.dt_bias.dtype(),
            args.gates.a.dtype(),
            args.gates.b.dtype(),
            args.beta_output.dtype(),
        ]))?;
        let params = GatingParams {
            a_log: addr_of(args.gates.a_log.device_addr(), p.a_log.offset, args.gates.a_log.dtype()),
            dt_bias: addr_of(args.gates.dt_bias.device_addr(), p.dt_bias.offset, args.gates.dt_bias.dtype()),
            a: addr_of(args.gates.a.device_addr(), p.a.offset, args.gates.a.dtype()),
            b: addr_of(args.gates.b.device_addr(), p.b.offset, args.gates.b.dtype()),
            g: addr_of(args.g.device_addr(), p.g.offset, args.g.dtype()),
            beta_out: addr_of(args.beta_output.device_addr(), p.beta_output.offset, args.beta_output.dtype()),
            a_log_s: p.a_log.strides[0] as i64,
            dtb_s: p.dt_bias.strides[0] as i64,
            a_t: p.a.strides[0] as i64,
            a_h: p.a.strides[1] as i64,
            b_t: p.b.strides[0] as i64,
            b_h: p.b.strides[1] as i64,
            g_t: p.g.strides[0] as i64,
            g_h: p.g.strides[1] as i64,
            bo_t: p.beta_output.strides[0] as i64,
            bo_h: p.beta_output.strides[1] as i64,
            tokens: p.tokens as i64,
            heads: p.v_heads as i32,
            softplus_beta: p.softplus_beta,
            threshold: p.threshold,
            reserved: 0,
        };
        let blocks = n.div_ceil(256).min(132 * 16) as u32;
        // SAFETY: every address comes from a device view whose creator promised it valid for the
        // view's memory on this device; the plan checked that every (token, head) element the
        // kernel touches lies inside those views.
        unsafe { self.launch_kernel(&func, (blocks, 1, 1), 256, &params, "cuLaunchKernel(gdn_gating_kernel)") }
    }
}

// ---------------------------------------------------------------------------------------------
// the recurrence

/// Strides of a per-token tensor `[b, t, head, dim]` (`struct Tok4` in gdn.cu and gdn_chunk.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct Tok4 {
    b: i64,
    t: i64,
    h: i64,
    d: i64,
}

impl From<&Strided<4>> for Tok4 {
    fn from(s: &Strided<4>) -> Self {
        let [b, t, h, d] = s.strides;
        Tok4 { b: b as i64, t: t as i64, h: h as i64, d: d as i64 }
    }
}

impl From<&Strided<3>> for Tok4 {
    fn from(s: &Strided<3>) -> Self {
        let [b, t, h] = s.strides;
        Tok4 { b: b as i64, t: t as i64, h: h as i64, d: 0 }
    }
}

/// The recurrent kernel's parameter block (`struct RecurrentParams` in gdn.cu: same order, no
/// padding). Addresses already include each tensor's element offset.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct RecurrentParams {
    /// The tensors' addresses, each with its plan's element offset applied.
    addrs: RecurrentAddrs,
    err: u64,
    qs: Tok4,
    ks: Tok4,
    vs: Tok4,
    os: Tok4,
    gs: Tok4,
    betas: Tok4,
    as_: Tok4,
    bs: Tok4,
    a_log_s: i64,
    dtb_s: i64,
    state_row: i64,
    state_rows: i64,
    final_row: i64,
    ix_seq: i64,
    ix_col: i64,
    nacc_s: i64,
    cu_s: i64,
    ix_cols: i64,
    seqlen: i64,
    seqs: i32,
    heads: i32,
    v_heads: i32,
    vdim: i32,
    group: i32,
    reserved: i32,
    scale: f32,
    eps: f32,
    softplus_beta: f32,
    threshold: f32,
    split: BlockSplit,
}

// SAFETY: `RecurrentParams` is `#[repr(C)]` plain old data whose layout equals
// `struct RecurrentParams` in gdn.cu; the driver copies it by value.
unsafe impl DeviceRepr for RecurrentParams {}

/// Tile geometry of one recurrent specialisation (see the header of `kernels/gdn.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GdnGeometry {
    /// Vector width along K, lanes per row, rows of V per lane, threads and the register cap
    /// (`SSM_CUDA_GDN_TUNE="tpr=L,minb=N,rpt=M"` sets the lanes per row and the last two, for
    /// tuning sweeps; unset in normal use).
    pub row: RowGeometry,
    /// One token per sequence, state updated in place, `[V,K]` with 16-byte vectors: the tile is
    /// held in its storage form (`RAW`).
    pub raw: bool,
}

/// State rows (value heads × V) of one Qwen3-Next sequence (32 × 128): up to this many, an f32
/// one-token call takes two rows per lane instead of four ([`GdnGeometry::choose`]).
const SINGLE_SEQUENCE_ROWS: usize = 4096;

/// `SSM_CUDA_GDN_TUNE`.
static GDN_TUNE: TuneVar = TuneVar::new("SSM_CUDA_GDN_TUNE");

impl GdnGeometry {
    /// The geometry for a `state` dtype, `head_k_dim` `k`, `head_v_dim` `v` and `layout`.
    /// `vectorized`: whether every state row start is 16-byte aligned. `rows_total`: sequences ×
    /// value heads × V of the call (small calls get one row per lane: more, shorter threads).
    /// `one_token_in_place`: one token per sequence, the state read and written in place once.
    pub fn choose(
        state: DType,
        k: usize,
        v: usize,
        layout: StateLayout,
        vectorized: bool,
        one_token_in_place: bool,
        rows_total: usize,
    ) -> Self {
        let (vec, mut tpr) = match layout {
            StateLayout::VK => {
                let per16 = 16 / state.size();
                let vec = if vectorized && k.is_multiple_of(per16) { per16 } else { 1 };
                (vec, k.div_ceil(vec).max(1).next_power_of_two().min(32))
            }
            // [K,V]: scalar accesses; few lanes per row so that a warp's row groups take
            // consecutive (contiguous) v; more lanes for very long K (registers).
            StateLayout::KV => (1, k.max(1).next_power_of_two().min(if k > 256 { 32 } else { 8 })),
        };
        // An f32 `[V,K]` tile of 32 lanes per row that is not one token in place (speculative and
        // varlen steps, per-token states): 16 lanes per row with four rows of two vectors each per
        // lane (32 elements per thread), registers capped for six blocks per SM. Measured on an
        // H200 (docs/PERF.md, twenty-first session, two rounds): Qwen3-Next's 3-token step at
        // batch 64 took 143.4–143.5 µs against 152.4–171.7 (0.883 of copy against 0.738–0.834).
        // The lanes per row set the order of each row's sum, so they never depend on the batch:
        // a sequence's result is bit-identical alone and in any batch (`ssm-fuzz`'s
        // `cuda_decode_and_speculative_are_batch_invariant`). One token in place keeps 32 lanes:
        // 16 were level at batch 8 and 0.5–1.6 % faster from batch 64 on an H200 (twenty-first
        // session), level on an H100 (twenty-second), and the fused decode step's kernel covers
        // only 32 (with 16 its calls would fall back to two launches).
        let wide_default =
            layout == StateLayout::VK && vec > 1 && state.size() == 4 && k.div_ceil(vec) == 32 && !one_token_in_place;
        if wide_default {
            tpr = 16;
        }
        // Tuning sweeps (`SSM_CUDA_GDN_TUNE="tpr=N"`, a power of two up to 32) may set the lanes
        // per row of the `[V,K]` vector route: fewer lanes, more of a row's columns per lane and
        // fewer shuffles per row.
        if let Some(t) = GDN_TUNE.lanes("tpr")
            && layout == StateLayout::VK
            && vec > 1
        {
            tpr = t;
        }
        let vpt = k.div_ceil(vec).max(1).div_ceil(tpr);
        let (mut rpt, threads) = rows_and_threads((4 / vpt).max(1), tpr, v, rows_total);
        // That tile, unless a sweep set other lanes.
        let wide_f32 = wide_default && tpr == 16;
        if wide_f32 {
            rpt = fit_rows(4, tpr, threads, v);
        }
        let raw = one_token_in_place && layout == StateLayout::VK && vec * state.size() == 16 && vpt == 1 && k <= 128;
        // Measured on an H200 (docs/PERF.md, SSM_CUDA_GDN_TUNE sweeps), one token in place:
        // - a 16-bit tile in storage form: `raw16_rows`, from one wave (registers capped for six
        //   blocks per SM below);
        // - an f32 tile: four rows per lane (one or two rows at batch 8 left it at 0.37–0.44 of
        //   copy, four reached 0.68), but two for at most one sequence of Qwen3-Next's heads
        //   (`SINGLE_SEQUENCE_ROWS`): batch 1 took 3.77 µs against 3.96 (sigmoid gates) and 3.86
        //   against 4.07 (given gates) on an H200 (docs/PERF.md, twelfth session).
        if raw {
            rpt = if state.size() == 2 {
                raw16_rows(rows_total, tpr, threads, v, 1)
            } else {
                fit_rows(if rows_total <= SINGLE_SEQUENCE_ROWS { 2 } else { 4 }, tpr, threads, v)
            };
        }
        // Tuning sweeps (`SSM_CUDA_GDN_TUNE="rpt=N"`) may set the rows per lane.
        if let Some(r) = GDN_TUNE.get("rpt").filter(|&r| r >= 1) {
            rpt = r as usize;
        }
        // Registers, not bandwidth, capped the `[V,K]` vector route's occupancy (Nsight Compute on
        // an H200, docs/PERF.md): 72 registers (f32) and 96 (bf16) allowed 7 and 5 blocks per SM.
        // Asking for 8 and 6 (64 and 80 registers; the bf16 sigmoid specialisations then spill
        // 20–52 bytes on sm_90 and are still faster) raised batch-256 decode from 0.79–0.82 to
        // 0.88–0.90 of copy (f32) and from 0.59–0.63 to 0.71–0.76 (bf16).
        let default_min_blocks = if layout == StateLayout::VK && vec > 1 && k <= 128 && threads == 128 {
            if state.size() == 4 && !wide_f32 { 8 } else { 6 }
        } else {
            0
        };
        GdnGeometry {
            row: RowGeometry::new(vec, tpr, vpt, rpt, threads, GDN_TUNE.get("minb").unwrap_or(default_min_blocks)),
            raw,
        }
    }
}

const F_SIGMOID: u16 = 1;
const F_BETA: u16 = 2;
const F_STATE: u16 = 4;
const F_FINAL: u16 = 8;
const F_SLOTS_1D: u16 = 16;
const F_SLOTS_2D: u16 = 32;
const F_NACC: u16 = 64;
const F_VARLEN: u16 = 128;
const F_L2NORM: u16 = 256;
const F_KV: u16 = 512;
const F_QK_VEC: u16 = 1024;
const F_PDL: u16 = 2048;

/// Everything that selects one compiled recurrent kernel (compact, hashed per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RecurrentKey {
    /// Q K V O STATE FINAL G BETA ALOG DTB A B IX NACC CU.
    types: [DType; 15],
    k: usize,
    geometry: GdnGeometry,
    flags: u16,
}

/// The compiled-function cache key of a GDN launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum GdnKey {
    /// `[A_log, dt_bias, a, b, beta_output]` dtypes.
    Gating([DType; 5]),
    Recurrent(RecurrentKey),
    /// The fused decode step: its recurrence (the one-token in-place route) and its conv.
    Step(RecurrentKey, ConvKey),
}

impl GdnKey {
    fn spec(&self) -> KernelSpec {
        match self {
            GdnKey::Gating([al, db, a, b, bo]) => gating_spec([*al, *db, *a, *b], *bo),
            GdnKey::Recurrent(k) => k.spec(),
            GdnKey::Step(rule, conv) => step_spec(rule, conv),
        }
    }
}

/// The fused decode step's specialisation: the recurrence's macros with `CONV_STEP` and the conv's.
fn step_spec(rule: &RecurrentKey, conv: &ConvKey) -> KernelSpec {
    let mut spec = rule.spec();
    spec.entry = "gdn_step_kernel";
    spec.defines.push(("CONV_STEP", "1".to_string()));
    spec.defines.extend(conv.step_defines());
    spec
}

/// Device addresses of a recurrent call's tensors (0 for an absent one): base addresses in a
/// call, offset ones in [`RecurrentParams`] (the same order as `gdn.cu`'s parameter block).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
struct RecurrentAddrs {
    q: u64,
    k: u64,
    v: u64,
    o: u64,
    g: u64,
    beta: u64,
    a_log: u64,
    dt_bias: u64,
    a: u64,
    b: u64,
    state: u64,
    final_state: u64,
    ix: u64,
    nacc: u64,
    cu: u64,
}

impl RecurrentAddrs {
    /// The base addresses of the delta-rule tensors both recurrent ops share (gates: 0).
    fn of_rule(r: &DeltaRuleArgs<'_>) -> Self {
        let opt = |t: Option<&ssm_tensor::TensorRef<'_>>| a0(t.and_then(|t| t.device_addr()));
        let opt_mut = |t: &Option<ssm_tensor::TensorMut<'_>>| a0(t.as_ref().and_then(|t| t.device_addr()));
        RecurrentAddrs {
            q: a0(r.q.device_addr()),
            k: a0(r.k.device_addr()),
            v: a0(r.v.device_addr()),
            o: a0(r.o.device_addr()),
            state: opt_mut(&r.initial_state),
            final_state: opt_mut(&r.final_state),
            ix: opt(r.ssm_state_indices.as_ref()),
            nacc: opt(r.num_accepted_tokens.as_ref()),
            cu: opt(r.cu_seqlens.as_ref()),
            ..RecurrentAddrs::default()
        }
    }
}

fn rows_aligned(view: Option<&StateView>, addr: u64, k: usize) -> bool {
    view.is_none_or(|s| {
        let es = s.dtype.size() as u64;
        (addr + s.offset as u64 * es).is_multiple_of(16)
            && (s.rows <= 1 || (s.row_stride as u64 * es).is_multiple_of(16))
            && (k as u64 * es).is_multiple_of(16)
    })
}

fn qk_aligned(s: &Strided<4>, dtype: DType, addr: u64, vec: usize, k: usize) -> bool {
    let es = dtype.size() as u64;
    let align = (vec as u64 * es).min(16);
    let ok = |stride: isize| (stride.unsigned_abs() as u64 * es).is_multiple_of(align);
    (s.strides[3] == 1 || k <= 1)
        && (addr + s.offset as u64 * es).is_multiple_of(align)
        && ok(s.strides[0])
        && ok(s.strides[1])
        && ok(s.strides[2])
}

impl RecurrentKey {
    /// The key of `plan` with input dtypes `types` (see [`RecurrentKey::types`]). `addrs`: the
    /// device base addresses of state, final state, q and k (`None`: allocation-aligned bases).
    fn from_plan(plan: &RecurrentPlan, types: [DType; 15], addrs: Option<&RecurrentAddrs>) -> Self {
        let d = plan.dims;
        let a = addrs.copied().unwrap_or_default();
        let vectorized = plan.layout == StateLayout::VK
            && rows_aligned(plan.state.as_ref(), a.state, d.k)
            && rows_aligned(plan.final_state.as_ref(), a.final_state, d.k);
        let geometry = GdnGeometry::choose(
            plan.state.or(plan.final_state).map_or(DType::F32, |s| s.dtype),
            d.k,
            d.v,
            plan.layout,
            vectorized,
            plan.cu_seqlens.is_none()
                && d.seqlen == 1
                && plan.state.is_some()
                && plan.final_state.is_none()
                && !matches!(plan.slots, StateSlots::TwoD(..)),
            d.seqs * d.v_heads * d.v,
        );
        let mut flags = 0u16;
        let mut set = |on: bool, f: u16| {
            if on {
                flags |= f
            }
        };
        match plan.gates {
            Gates::Sigmoid { .. } => set(true, F_SIGMOID),
            Gates::Given { beta, .. } => set(beta.is_some(), F_BETA),
        }
        set(plan.state.is_some(), F_STATE);
        set(plan.final_state.is_some(), F_FINAL);
        set(matches!(plan.slots, StateSlots::OneD(_)), F_SLOTS_1D);
        set(matches!(plan.slots, StateSlots::TwoD(..)), F_SLOTS_2D);
        set(plan.num_accepted_tokens.is_some(), F_NACC);
        set(plan.cu_seqlens.is_some(), F_VARLEN);
        set(plan.l2norm, F_L2NORM);
        set(plan.layout == StateLayout::KV, F_KV);
        let vec = geometry.row.vec as usize;
        set(
            vec > 1 && qk_aligned(&plan.q.0, plan.q.1, a.q, vec, d.k) && qk_aligned(&plan.k.0, plan.k.1, a.k, vec, d.k),
            F_QK_VEC,
        );
        RecurrentKey { types, k: d.k, geometry, flags }
    }

    /// The recurrence of a Qwen3-Next decode step (K = V = 128, bf16 q/k/v, sigmoid gates, 1-D
    /// i32 table, in place, `[V,K]`) at batch 64, for the kernel catalogue.
    fn catalogue_step(state: DType) -> Self {
        use DType::{BF16, F32, I32};
        let geometry = GdnGeometry::choose(state, 128, 128, StateLayout::VK, true, true, 64 * 32 * 128);
        RecurrentKey {
            types: [BF16, BF16, BF16, BF16, state, state, F32, F32, F32, F32, BF16, BF16, I32, I32, I32],
            k: 128,
            geometry,
            flags: F_SIGMOID | F_STATE | F_SLOTS_1D | F_L2NORM | F_QK_VEC,
        }
    }

    /// Whether the fused decode step (`gdn_step_kernel`) runs this recurrence: sigmoid gates,
    /// one token per sequence, the state in place through a 1-D table (or row `n`), `[V,K]`
    /// 16-byte vectors held in storage form (the `RAW` route).
    fn one_token_in_place(&self) -> bool {
        self.geometry.raw
            && self.flags & F_SIGMOID != 0
            && self.flags & F_STATE != 0
            && self.flags & (F_FINAL | F_SLOTS_2D | F_NACC | F_VARLEN | F_KV) == 0
    }

    /// The NVRTC specialisation.
    fn spec(&self) -> KernelSpec {
        const NAMES: [&str; 15] = [
            "Q_T", "K_T", "V_T", "O_T", "STATE_T", "FINAL_T", "G_T", "BETA_T", "ALOG_T", "DTB_T", "A_T", "B_T", "IX_T",
            "NACC_T", "CU_T",
        ];
        let mut defines: Vec<(&'static str, String)> =
            NAMES.iter().zip(self.types).map(|(&n, t)| (n, c_type(t).to_string())).collect();
        let g = self.geometry;
        let f = |bit: u16| u8::from(self.flags & bit != 0).to_string();
        let slots = if self.flags & F_SLOTS_2D != 0 {
            2
        } else if self.flags & F_SLOTS_1D != 0 {
            1
        } else {
            0
        };
        defines.extend([("GATING_ONLY", "0".to_string()), ("KDIM", self.k.to_string())]);
        defines.extend(g.row.defines());
        defines.extend([
            ("SIGMOID", f(F_SIGMOID)),
            ("HAS_BETA", f(F_BETA)),
            ("HAS_STATE", f(F_STATE)),
            ("HAS_FINAL", f(F_FINAL)),
            ("SLOTS", slots.to_string()),
            ("HAS_NACC", f(F_NACC)),
            ("VARLEN", f(F_VARLEN)),
            ("L2NORM", f(F_L2NORM)),
            ("LAYOUT_KV", f(F_KV)),
            ("QK_VEC", f(F_QK_VEC)),
            ("RAW", u8::from(g.raw).to_string()),
            ("PDL_WAIT", f(F_PDL)),
            // The outputs' sums reduced and scattered over the row's lanes (`SSM_CUDA_GDN_TUNE`
            // `scatter=0` keeps a butterfly per row and lane 0's stores, for the A/B).
            ("GDN_SCATTER", u8::from(GDN_TUNE.get("scatter") != Some(0)).to_string()),
            // The state's 16-byte stores through the intrinsic (`wide=0`: plain stores, which
            // NVRTC 13.5 split into 4-byte ones, for the A/B).
            ("GDN_WIDE_STORE", u8::from(GDN_TUNE.get("wide") != Some(0)).to_string()),
        ]);
        KernelSpec { source: KernelSource::Gdn, entry: "gdn_recurrent_kernel", defines }
    }
}

/// The dtypes slot list of a recurrent key (absent tensors read as f32 / i32).
fn recurrent_types(plan: &RecurrentPlan) -> [DType; 15] {
    let f = DType::F32;
    let i = DType::I32;
    let (g, beta, a_log, dtb, a, b) = match plan.gates {
        Gates::Given { g_dtype, beta, .. } => (g_dtype, beta.map_or(f, |b| b.1), f, f, f, f),
        Gates::Sigmoid { a_log, dt_bias, a, b, .. } => (f, f, a_log.1, dt_bias.1, a.1, b.1),
    };
    let ix = match plan.slots {
        StateSlots::None => i,
        StateSlots::OneD(t) | StateSlots::TwoD(t) => t.dtype,
    };
    [
        plan.q.1,
        plan.k.1,
        plan.v.1,
        plan.o.1,
        plan.state.map_or(f, |s| s.dtype),
        plan.final_state.map_or(f, |s| s.dtype),
        g,
        beta,
        a_log,
        dtb,
        a,
        b,
        ix,
        plan.num_accepted_tokens.map_or(i, |t| t.dtype),
        plan.cu_seqlens.map_or(i, |t| t.dtype),
    ]
}

/// The kernel specialisation a recurrent plan runs with when its tensors are allocation-aligned
/// (e.g. for [`CudaBackend::prewarm`] before CUDA-graph capture).
pub fn recurrent_kernel_spec(plan: &RecurrentPlan) -> KernelSpec {
    RecurrentKey::from_plan(plan, recurrent_types(plan), None).spec()
}

/// The catalogue `cargo xtask build-kernels` compiles: Qwen3-Next decode (K = V = 128) for both
/// gate forms, f32 and bf16 state, both layouts, the speculative and varlen routes, per-token
/// final states, and odd, unaligned head sizes. Each entry is `(label, spec)`.
pub fn gdn_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, F32, I32};
    let mut out = vec![
        ("gdn gating io=bf16 beta=bf16".to_string(), gating_spec([F32, F32, BF16, BF16], BF16)),
        ("gdn gating io=f32 beta=f32".to_string(), gating_spec([F32, F32, F32, F32], F32)),
    ];
    let key = |state: DType, k: usize, v: usize, layout: StateLayout, vectorized: bool, flags: u16| {
        let sig = flags & F_SIGMOID != 0;
        let (g, beta, al, dtb, a, b) =
            if sig { (F32, F32, F32, F32, BF16, BF16) } else { (F32, F32, F32, F32, F32, F32) };
        let mut flags = flags | if layout == StateLayout::KV { F_KV } else { 0 };
        // Decode entries are one token per sequence; in place unless varlen, per-token or 2-D.
        let in_place = flags & F_STATE != 0 && flags & (F_VARLEN | F_FINAL | F_SLOTS_2D) == 0;
        let geometry = GdnGeometry::choose(state, k, v, layout, vectorized, in_place, 64 * 32 * v);
        if geometry.row.vec > 1 {
            flags |= F_QK_VEC;
        }
        RecurrentKey {
            types: [BF16, BF16, BF16, BF16, state, state, g, beta, al, dtb, a, b, I32, I32, I32],
            k,
            geometry,
            flags,
        }
        .spec()
    };
    let decode = F_STATE | F_SLOTS_1D | F_L2NORM;
    let spec = F_STATE | F_SLOTS_2D | F_NACC | F_VARLEN | F_L2NORM;
    for state in [F32, BF16] {
        for (layout, lname) in [(StateLayout::VK, "[V,K]"), (StateLayout::KV, "[K,V]")] {
            for (gates, gname) in [(F_SIGMOID, "sigmoid"), (F_BETA, "given")] {
                out.push((
                    format!("gdn decode {gname} {lname} state={state} K=V=128"),
                    key(state, 128, 128, layout, true, decode | gates),
                ));
            }
            out.push((
                format!("gdn spec sigmoid {lname} state={state} K=V=128"),
                key(state, 128, 128, layout, true, spec | F_SIGMOID),
            ));
        }
        out.push((
            format!("gdn varlen given final-state [V,K] state={state} K=V=128"),
            key(state, 128, 128, StateLayout::VK, true, F_STATE | F_FINAL | F_VARLEN | F_BETA | F_L2NORM),
        ));
        out.push((
            format!("gdn decode sigmoid [V,K] chained after the conv (PDL) state={state} K=V=128"),
            key(state, 128, 128, StateLayout::VK, true, decode | F_SIGMOID | F_PDL),
        ));
        out.push((
            format!("gdn decode sigmoid [V,K] state={state} K=256 V=128"),
            key(state, 256, 128, StateLayout::VK, true, decode | F_SIGMOID),
        ));
        out.push((
            format!("gdn decode given scalar [V,K] state={state} K=7 V=5"),
            key(state, 7, 5, StateLayout::VK, false, decode | F_BETA),
        ));
    }
    for state in [F32, BF16] {
        let rule = RecurrentKey::catalogue_step(state);
        out.push((
            format!("gdn decode step (conv + sigmoid) [V,K] state={state} K=V=128 conv=bf16 width=4"),
            step_spec(&rule, &ConvKey::qwen_decode(BF16)),
        ));
    }
    out.push((
        "gdn dense no-state [K,V] state=f32 K=60 V=100".into(),
        key(F32, 60, 100, StateLayout::KV, false, F_L2NORM),
    ));
    out
}

impl CudaBackend {
    fn recurrent_params(&self, plan: &RecurrentPlan, a: &RecurrentAddrs, dim_tiles: usize) -> RecurrentParams {
        let zero = Tok4::default();
        let dt = |s: Option<StateView>| s.map_or(DType::F32, |s| s.dtype);
        let mut p = RecurrentParams {
            addrs: RecurrentAddrs {
                q: addr_of(Some(a.q), plan.q.0.offset, plan.q.1),
                k: addr_of(Some(a.k), plan.k.0.offset, plan.k.1),
                v: addr_of(Some(a.v), plan.v.0.offset, plan.v.1),
                o: addr_of(Some(a.o), plan.o.0.offset, plan.o.1),
                state: plan.state.map_or(0, |s| addr_of(Some(a.state), s.offset as isize, dt(plan.state))),
                final_state: plan
                    .final_state
                    .map_or(0, |s| addr_of(Some(a.final_state), s.offset as isize, dt(plan.final_state))),
                ..RecurrentAddrs::default()
            },
            err: self.error_word_addr(),
            qs: (&plan.q.0).into(),
            ks: (&plan.k.0).into(),
            vs: (&plan.v.0).into(),
            os: (&plan.o.0).into(),
            state_row: plan.state.map_or(0, |s| s.row_stride as i64),
            state_rows: plan.state.map_or(0, |s| s.rows as i64),
            final_row: plan.final_state.map_or(0, |s| s.row_stride as i64),
            seqlen: plan.dims.seqlen as i64,
            seqs: plan.dims.seqs as i32,
            heads: plan.dims.heads as i32,
            v_heads: plan.dims.v_heads as i32,
            vdim: plan.dims.v as i32,
            group: plan.dims.group() as i32,
            split: BlockSplit::new(dim_tiles, plan.dims.v_heads),
            scale: plan.scale,
            eps: plan.eps,
            ..RecurrentParams::default()
        };
        match plan.gates {
            Gates::Given { g, g_dtype, beta } => {
                p.addrs.g = addr_of(Some(a.g), g.offset, g_dtype);
                p.gs = (&g).into();
                if let Some((b, bt)) = beta {
                    p.addrs.beta = addr_of(Some(a.beta), b.offset, bt);
                    p.betas = (&b).into();
                } else {
                    p.betas = zero;
                }
            }
            Gates::Sigmoid { a_log, dt_bias, a: aa, b, softplus_beta, threshold } => {
                p.addrs.a_log = addr_of(Some(a.a_log), a_log.0.offset, a_log.1);
                p.addrs.dt_bias = addr_of(Some(a.dt_bias), dt_bias.0.offset, dt_bias.1);
                p.addrs.a = addr_of(Some(a.a), aa.0.offset, aa.1);
                p.addrs.b = addr_of(Some(a.b), b.0.offset, b.1);
                p.a_log_s = a_log.0.strides[0] as i64;
                p.dtb_s = dt_bias.0.strides[0] as i64;
                p.as_ = (&aa.0).into();
                p.bs = (&b.0).into();
                p.softplus_beta = softplus_beta;
                p.threshold = threshold;
            }
        }
        match plan.slots {
            StateSlots::None => {}
            StateSlots::OneD(t) => {
                p.addrs.ix = addr_of(Some(a.ix), t.strides.offset, t.dtype);
                p.ix_seq = t.strides.strides[0] as i64;
                p.ix_cols = 1;
            }
            StateSlots::TwoD(t) => {
                p.addrs.ix = addr_of(Some(a.ix), t.strides.offset, t.dtype);
                p.ix_seq = t.strides.strides[0] as i64;
                p.ix_col = t.strides.strides[1] as i64;
                p.ix_cols = t.width as i64;
            }
        }
        if let Some(t) = plan.num_accepted_tokens {
            p.addrs.nacc = addr_of(Some(a.nacc), t.strides.offset, t.dtype);
            p.nacc_s = t.strides.strides[0] as i64;
        }
        if let Some(t) = plan.cu_seqlens {
            p.addrs.cu = addr_of(Some(a.cu), t.strides.offset, t.dtype);
            p.cu_s = t.strides.strides[0] as i64;
        }
        p
    }

    /// One recurrent launch on the backend's stream (both recurrent ops end here). `after_conv`:
    /// the launch is the programmatic dependent of the conv launched just before it, which
    /// writes its q, k and v (the decode step's two-launch route).
    fn launch_recurrent(&self, plan: &RecurrentPlan, a: &RecurrentAddrs, after_conv: bool) -> Result<(), CudaError> {
        let d = plan.dims;
        for (what, v) in [("sequences", d.seqs), ("value heads", d.v_heads), ("V", d.v), ("T", d.seqlen)] {
            if v > i32::MAX as usize {
                return Err(CudaError::Unsupported(format!("{what} = {v} exceeds the kernel's 32-bit counters")));
            }
        }
        let mut key = RecurrentKey::from_plan(plan, recurrent_types(plan), Some(a));
        if after_conv {
            key.flags |= F_PDL;
        }
        let dim_tiles = d.v.div_ceil(key.geometry.row.dim_tile() as usize);
        let blocks = d.seqs * d.v_heads * dim_tiles;
        let Some(grid) = grid_x(blocks)? else { return Ok(()) };
        if d.seqlen == 0 {
            return Ok(());
        }
        let func = self.gdn_function(GdnKey::Recurrent(key))?;
        let params = self.recurrent_params(plan, a, dim_tiles);
        let threads = key.geometry.row.threads;
        // SAFETY: every address in `params` comes from a device view whose creator promised
        // (TensorRef/TensorMut::from_device_ptr) that it is valid for the view's memory on this
        // device for the call; the plan checked that every element the kernel can reach for valid
        // index values lies inside those views, and the kernel checks every index value it reads
        // (cu_seqlens, slots, accepted counts) before using it. The error word is owned by `self`.
        // As a programmatic dependent, the kernel reads q/k/v only after `griddepcontrol.wait`
        // and writes nothing the conv before it touches (o and the SSM state).
        unsafe {
            if after_conv {
                self.launch_kernel_pdl(&func, (grid, 1, 1), threads, &params, "cuLaunchKernelEx(gdn_recurrent_kernel)")
            } else {
                self.launch_kernel(&func, (grid, 1, 1), threads, &params, "cuLaunchKernel(gdn_recurrent_kernel)")
            }
        }
    }

    fn gdn_function(&self, key: GdnKey) -> Result<cudarc::driver::CudaFunction, CudaError> {
        self.gdn_functions.get_or_load(self, key, GdnKey::spec)
    }
}

fn a0(t: Option<u64>) -> u64 {
    t.unwrap_or(0)
}

impl Run<FusedRecurrentGatedDeltaRuleArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// Launches one recurrent kernel on the backend's stream. Every tensor must be a device view
    /// on this backend's device. Nothing is allocated or copied back, the call does not wait:
    /// invalid device index values are reported later by [`CudaBackend::check`].
    fn run(&self, call: Planned<FusedRecurrentGatedDeltaRuleArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let a = RecurrentAddrs {
            g: a0(args.g.device_addr()),
            beta: a0(args.beta.as_ref().and_then(|t| t.device_addr())),
            ..RecurrentAddrs::of_rule(&args.rule)
        };
        self.launch_recurrent(&plan, &a, false)
    }
}

impl Run<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// As `fused_recurrent_gated_delta_rule`, with `g` and `β` computed per token in the kernel.
    fn run(&self, call: Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let a = RecurrentAddrs {
            a_log: a0(args.gates.a_log.device_addr()),
            dt_bias: a0(args.gates.dt_bias.device_addr()),
            a: a0(args.gates.a.device_addr()),
            b: a0(args.gates.b.device_addr()),
            ..RecurrentAddrs::of_rule(&args.rule)
        };
        self.launch_recurrent(&plan, &a, false)
    }
}

// ---------------------------------------------------------------------------------------------
// the decode step (conv update + sigmoid-gated recurrence)

/// Arrival counters of the fused decode step (one per sequence × q/k head of a call), allocated
/// once per backend; a larger call runs as the two launches.
pub(crate) const STEP_COUNTERS: usize = 1 << 16;

/// The fused step kernel's parameter block (`struct StepParams` in gdn.cu: same order, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub(crate) struct StepParams {
    rule: RecurrentParams,
    conv: ConvParams,
    counters: u64,
    hk: i64,
}

// SAFETY: `StepParams` is `#[repr(C)]` plain old data whose layout equals `struct StepParams` in
// gdn.cu; the driver copies it by value.
unsafe impl DeviceRepr for StepParams {}

/// The planned parts of a decode step on a device (host tensors are refused: the CUDA backend
/// runs device views only).
fn parts<'c, 'a>(args: &'c GdnDecodeStepArgs<'a>) -> Result<DeviceParts<'c, 'a>, CudaError> {
    args.device_parts().ok_or_else(|| CudaError::Unsupported("gdn_decode_step on host tensors".into()))
}

/// The recurrence's addresses of a decode step.
fn step_addrs(step: &Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>>) -> RecurrentAddrs {
    let a = step.args();
    RecurrentAddrs {
        a_log: a0(a.gates.a_log.device_addr()),
        dt_bias: a0(a.gates.dt_bias.device_addr()),
        a: a0(a.gates.a.device_addr()),
        b: a0(a.gates.b.device_addr()),
        ..RecurrentAddrs::of_rule(&a.rule)
    }
}

/// How a `gdn_decode_step` call runs on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRoute {
    /// One launch of `gdn_step_kernel` (conv and recurrence fused; the q/k conv is recomputed by
    /// every block of a (sequence, q/k head)).
    Fused,
    /// The conv launch, then the recurrence as its programmatic dependent (sm_90+): the
    /// recurrence's blocks load their slots and state tiles while the conv runs.
    Chained,
    /// The conv launch, then the recurrence launch.
    Separate,
}

impl CudaBackend {
    /// The fused kernel's key for a decode step, or `None` where the fused kernel does not cover
    /// it (a conv or recurrence route it lacks, or more sequence × head pairs than
    /// [`STEP_COUNTERS`]).
    fn step_key(&self, (conv, step): DeviceParts<'_, '_>, addrs: Option<&RecurrentAddrs>) -> Option<GdnKey> {
        let (rp, cp) = (step.plan(), conv.plan());
        let rule = RecurrentKey::from_plan(rp, recurrent_types(rp), addrs);
        let conv = update_call(cp, conv.args()).key(addrs.is_some());
        let d = rp.dims;
        let fits = d.seqs.checked_mul(d.heads).is_some_and(|n| n <= STEP_COUNTERS)
            && d.k <= 256
            && [d.seqs, d.v_heads, d.v].iter().all(|&n| n <= i32::MAX as usize)
            && cp.dim <= i32::MAX as usize;
        (fits && rule.one_token_in_place() && conv.one_token_update()).then_some(GdnKey::Step(rule, conv))
    }

    /// The route a `gdn_decode_step` call takes here.
    ///
    /// Measured on an H200 (docs/PERF.md, "GDN decode step on CUDA"), every route in the same run:
    /// with one sequence the chained launches (conv, then the recurrence as its programmatic
    /// dependent) take 0.90× the time of the separate ones; from 8 sequences on they are no
    /// faster (0.94–1.06×, within run-to-run spread), and the fused kernel is slower still
    /// (its per-block q/k conv costs more issue slots than the second launch costs time). So:
    /// chained for one sequence on sm_90+, separate launches otherwise.
    /// `SSM_CUDA_GDN_TUNE="step=N"` forces a route for sweeps: 0 separate, 1 fused (separate where
    /// the fused kernel does not cover the call), 2 chained.
    pub fn gdn_decode_step_route(&self, call: &Planned<GdnDecodeStepArgs<'_>>) -> StepRoute {
        let Ok(p) = parts(call.args()) else { return StepRoute::Separate };
        let pdl = self.compiler.arch().major >= 9;
        let chained_or_separate = if pdl { StepRoute::Chained } else { StepRoute::Separate };
        match GDN_TUNE.get("step") {
            Some(0) => StepRoute::Separate,
            Some(1) if self.step_key(p, Some(&step_addrs(p.1))).is_some() => StepRoute::Fused,
            Some(2) => chained_or_separate,
            Some(_) => StepRoute::Separate,
            None if p.1.plan().dims.seqs <= CHAINED_STEP_MAX_SEQS => chained_or_separate,
            None => StepRoute::Separate,
        }
    }

    /// Whether the fused kernel covers a `gdn_decode_step` call ([`StepRoute::Fused`] is
    /// possible), whichever route the call takes.
    pub fn gdn_decode_step_fusable(&self, call: &Planned<GdnDecodeStepArgs<'_>>) -> bool {
        parts(call.args()).is_ok_and(|p| self.step_key(p, Some(&step_addrs(p.1))).is_some())
    }

    /// [`prewarm`](Self::prewarm) for the kernels a `gdn_decode_step` call launches on its route.
    pub fn prewarm_gdn_decode_step(&self, call: &Planned<GdnDecodeStepArgs<'_>>) -> Result<(), CudaError> {
        let p = parts(call.args())?;
        let addrs = step_addrs(p.1);
        let route = self.gdn_decode_step_route(call);
        if let (StepRoute::Fused, Some(key)) = (route, self.step_key(p, Some(&addrs))) {
            return self.gdn_function(key).map(|_| ());
        }
        self.prewarm_conv_update(p.0)?;
        let rp = p.1.plan();
        let mut key = RecurrentKey::from_plan(rp, recurrent_types(rp), Some(&addrs));
        if route == StepRoute::Chained {
            key.flags |= F_PDL;
        }
        self.gdn_function(GdnKey::Recurrent(key)).map(|_| ())
    }

    /// Runs a decode step on `route` (where the fused kernel does not cover the call, `Fused`
    /// runs separate): for tests and sweeps that compare the routes; [`Run::run`] picks the
    /// route with [`gdn_decode_step_route`](Self::gdn_decode_step_route).
    pub fn run_gdn_decode_step_on(
        &self,
        call: Planned<GdnDecodeStepArgs<'_>>,
        route: StepRoute,
    ) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, _) = call.into_parts();
        let p = parts(&args)?;
        let addrs = step_addrs(p.1);
        // The fused kernel's key only for that route (the others launch the parts' own kernels).
        let fused = if route == StepRoute::Fused { self.step_key(p, Some(&addrs)) } else { None };
        match (route, fused) {
            (StepRoute::Fused, Some(GdnKey::Step(rule, conv_key))) => self.launch_step(p, &addrs, rule, conv_key),
            (StepRoute::Chained, _) if self.compiler.arch().major >= 9 => {
                // SAFETY: the conv launch goes first on this backend's one stream; the recurrence,
                // its programmatic dependent, reads q/k/v only after `griddepcontrol.wait`.
                let (conv, step) = unsafe { args.into_parts() };
                self.run(conv)?;
                self.launch_recurrent(step.plan(), &addrs, true)
            }
            _ => {
                // SAFETY: both launches go to this backend's one stream, the conv first, so the
                // recurrence reads q/k/v after the conv has written them; no host slice is involved.
                let (conv, step) = unsafe { args.into_parts() };
                self.run(conv)?;
                self.run(step)
            }
        }
    }

    fn launch_step(
        &self,
        (conv, step): DeviceParts<'_, '_>,
        addrs: &RecurrentAddrs,
        rule: RecurrentKey,
        conv_key: ConvKey,
    ) -> Result<(), CudaError> {
        let rp = step.plan();
        let d = rp.dims;
        let dim_tiles = d.v.div_ceil(rule.geometry.row.dim_tile() as usize);
        let Some(grid) = grid_x(d.seqs * d.v_heads * dim_tiles)? else { return Ok(()) };
        let func = self.gdn_function(GdnKey::Step(rule, conv_key))?;
        let (conv, _) = update_call(conv.plan(), conv.args()).params(self.error_word_addr(), &conv_key);
        let params = StepParams {
            rule: self.recurrent_params(rp, addrs, dim_tiles),
            conv,
            counters: self.step_counters_addr,
            hk: (d.heads * d.k) as i64,
        };
        // SAFETY: every address comes from a device view whose creator promised it valid for the
        // view's memory on this device for the call; both parts' plans checked that every element
        // the kernel reaches for valid index values lies inside those views, and the kernel checks
        // every slot it reads before using it. The counters (seqs × heads ≤ STEP_COUNTERS of them,
        // zero between launches) and the error word are owned by `self`.
        unsafe {
            self.launch_kernel(
                &func,
                (grid, 1, 1),
                rule.geometry.row.threads,
                &params,
                "cuLaunchKernel(gdn_step_kernel)",
            )
        }
    }
}

/// Sequences up to which a decode step takes the chained route by default ([`StepRoute`]).
const CHAINED_STEP_MAX_SEQS: usize = 1;

impl Run<GdnDecodeStepArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// One decode step on the route [`CudaBackend::gdn_decode_step_route`] picks: the fused
    /// kernel, or the conv launch and the recurrence launch (chained by programmatic dependent
    /// launch on sm_90+). No allocation, no host synchronisation.
    fn run(&self, call: Planned<GdnDecodeStepArgs<'_>>) -> Result<(), CudaError> {
        let route = self.gdn_decode_step_route(&call);
        self.run_gdn_decode_step_on(call, route)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 16 addresses, 8 × 4 token strides, 11 scalars, 6 ints, 4 floats, the block split (6 × u32).
        assert_eq!(std::mem::size_of::<RecurrentParams>(), 16 * 8 + 8 * 32 + 11 * 8 + 6 * 4 + 4 * 4 + 6 * 4);
        assert_eq!(std::mem::align_of::<RecurrentParams>(), 8);
        // 6 addresses, 11 i64, 4 × 4 bytes.
        assert_eq!(std::mem::size_of::<GatingParams>(), 6 * 8 + 11 * 8 + 16);
    }

    #[test]
    fn geometry_covers_k_and_tiles_v() {
        let g = GdnGeometry::choose(DType::F32, 128, 128, StateLayout::VK, true, true, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt, g.row.threads), (4, 32, 1, 4, 128));
        let g = GdnGeometry::choose(DType::BF16, 128, 128, StateLayout::VK, true, false, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt, g.raw), (8, 16, 1, 4, false));
        // One token in place: a 16-bit tile in storage form, eight rows per lane (two for small calls).
        let g = GdnGeometry::choose(DType::BF16, 128, 128, StateLayout::VK, true, true, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt, g.raw, g.row.dim_tile()), (8, 16, 1, 8, true, 64));
        let g = GdnGeometry::choose(DType::BF16, 128, 128, StateLayout::VK, true, true, 8 * 32 * 128);
        assert_eq!((g.row.rpt, g.raw), (2, true));
        let g = GdnGeometry::choose(DType::F32, 128, 128, StateLayout::VK, true, true, 8 * 32 * 128);
        assert_eq!((g.row.rpt, g.raw), (4, true));
        let g = GdnGeometry::choose(DType::F32, 128, 128, StateLayout::KV, true, true, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt), (1, 8, 16));
        // An f32 `[V,K]` step that is not one token in place (the speculative step): 16 lanes,
        // 32 elements per thread, six blocks per SM, at every batch (the lanes set each row's
        // sum order, so one sequence alone takes the same as in a batch).
        let g = GdnGeometry::choose(DType::F32, 128, 128, StateLayout::VK, true, false, 64 * 32 * 128);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt, g.row.threads, g.raw), (4, 16, 2, 4, 128, false));
        assert_eq!(g.row.min_blocks, 6);
        for rows in [128, 32 * 128, 8 * 32 * 128] {
            let g = GdnGeometry::choose(DType::F32, 128, 128, StateLayout::VK, true, false, rows);
            assert_eq!((g.row.tpr, g.row.vpt), (16, 2), "{rows} rows");
        }
        for (k, v) in [(1, 1), (7, 5), (60, 100), (100, 3), (1024, 7), (300, 2)] {
            for layout in [StateLayout::VK, StateLayout::KV] {
                for vectorized in [false, true] {
                    let g = GdnGeometry::choose(DType::F32, k, v, layout, vectorized, true, 1 << 20);
                    assert!((g.row.vec * g.row.tpr * g.row.vpt) as usize >= k, "{k} {v} {g:?}");
                    assert!(g.row.tpr.is_power_of_two() && g.row.tpr <= 32 && g.row.threads.is_multiple_of(32));
                    assert!(g.row.threads >= g.row.tpr);
                }
            }
        }
    }

    /// A sequence's result must be bit-identical alone and in any batch: the vector width, the
    /// lanes per row and the vectors per lane (which set the order of each row's sum over K) may
    /// not depend on the call's size.
    #[test]
    fn the_sum_order_does_not_depend_on_the_batch() {
        for state in [DType::F32, DType::BF16, DType::F16] {
            for (k, v) in [(128, 128), (64, 128), (256, 64), (100, 3), (7, 5)] {
                for layout in [StateLayout::VK, StateLayout::KV] {
                    for vectorized in [false, true] {
                        for in_place in [false, true] {
                            let order = |rows: usize| {
                                let g = GdnGeometry::choose(state, k, v, layout, vectorized, in_place, rows);
                                (g.row.vec, g.row.tpr, g.row.vpt)
                            };
                            let alone = order(v);
                            for seqs in [2, 8, 32, 64, 256, 1024] {
                                let rows = seqs * 32 * v;
                                assert_eq!(
                                    order(rows),
                                    alone,
                                    "{state:?} k {k} v {v} {layout:?} {vectorized} {in_place} {rows}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn catalogue_names_the_gdn_source() {
        let cat = gdn_catalogue();
        assert!(cat.len() > 10);
        assert!(cat.iter().all(|(_, s)| s.source == KernelSource::Gdn));
    }
}
