//! `impl SsuBackend for CudaBackend`: maps a checked [`SsuPlan`] onto one launch of
//! `kernels/ssu.cu`, specialised for the call's dtypes, dstate, tile and flags.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;
use ssm_ssu::{ParamForm, Route, SelectiveStateUpdateArgs, SsuAlgorithm, SsuPlan, TokenStrides};
use ssm_tensor::DType;
use ssm_tensor::{Planned, Run};

use crate::compile::{KernelSource, KernelSpec, c_type, flag_defines};
use crate::geometry::{
    BlockSplit, RowGeometry, TuneVar, WAVE_THREADS, block_threads, fit_rows, grid_x, raw16_rows, rows_and_threads,
};
use crate::{CudaBackend, CudaError, addr_of};

/// Strides of a per-token tensor as the kernel reads them (`struct TokStrides` in ssu.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct TokStridesC {
    seq: i64,
    tok: i64,
    head: i64,
    dim: i64,
}

impl From<&TokenStrides> for TokStridesC {
    fn from(t: &TokenStrides) -> Self {
        TokStridesC { seq: t.seq as i64, tok: t.tok as i64, head: t.head as i64, dim: t.dim as i64 }
    }
}

/// The kernel's parameter block (`struct SsuParams` in ssu.cu: same order, no padding).
/// Addresses already include each tensor's element offset.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct SsuParams {
    state: u64,
    x: u64,
    dt: u64,
    a: u64,
    b: u64,
    c: u64,
    d: u64,
    dt_bias: u64,
    z: u64,
    out: u64,
    sbi: u64,
    dst: u64,
    nacc: u64,
    cu: u64,
    err: u64,
    ist: u64,
    isi: u64,
    seed_ptr: u64,
    sc: u64,
    ist_sc: u64,
    st_slot: i64,
    st_head: i64,
    st_dim: i64,
    xs: TokStridesC,
    dts: TokStridesC,
    zs: TokStridesC,
    outs: TokStridesC,
    bs: TokStridesC,
    cs: TokStridesC,
    a_head: i64,
    a_dim: i64,
    a_n: i64,
    d_head: i64,
    d_dim: i64,
    dtb_head: i64,
    dtb_dim: i64,
    sbi_seq: i64,
    sbi_col: i64,
    dst_seq: i64,
    dst_col: i64,
    nacc_s: i64,
    cu_s: i64,
    slots: i64,
    rows: i64,
    pad: i64,
    sbi_width: i64,
    dst_width: i64,
    ist_entry: i64,
    ist_step: i64,
    ist_head: i64,
    ist_dim: i64,
    ist_entries: i64,
    ist_steps: i64,
    isi_s: i64,
    sc_slot: i64,
    sc_head: i64,
    sc_dim: i64,
    isc_entry: i64,
    isc_step: i64,
    isc_head: i64,
    isc_dim: i64,
    seed: u64,
    nseq: i32,
    heads: i32,
    dim: i32,
    heads_per_group: i32,
    steps: i32,
    philox_rounds: i32,
    split: BlockSplit,
}

// SAFETY: `SsuParams` is `#[repr(C)]`, plain old data (Pod: no padding, no pointers the
// driver would follow except as integers) and its layout equals `struct SsuParams` in ssu.cu.
unsafe impl DeviceRepr for SsuParams {}

/// How a call walks its tokens, as far as the kernel geometry is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// One token per sequence, the final state stored once.
    Decode,
    /// One token per sequence, speculative (the state stored through a 2-D table) or
    /// buffered (stored to the intermediate buffer).
    SpecDecode,
    /// Several tokens per sequence (varlen or dense).
    MultiToken,
}

impl Walk {
    fn of(multi_token: bool, spec: bool) -> Self {
        match (multi_token, spec) {
            (true, _) => Walk::MultiToken,
            (false, true) => Walk::SpecDecode,
            (false, false) => Walk::Decode,
        }
    }
}

/// Tile geometry of one specialisation (see the header of `kernels/ssu.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SsuGeometry {
    /// Vector width, lanes per row, rows per lane, threads and the register cap.
    pub row: RowGeometry,
    /// Streaming (evict-first) cache hints on the state's loads and stores.
    pub streaming: bool,
    /// One-token route: store each row's final state as soon as it is computed.
    pub row_store: bool,
}

impl SsuGeometry {
    /// The geometry for a state of `state` dtype with `dstate` columns, `dim` rows per head.
    /// `vectorized`: whether every state row start is 16-byte aligned.
    /// `rows_total`: sequences × heads × dim of the call; small calls get fewer rows per lane
    /// (more, shorter-lived threads: latency rather than bandwidth bounds them).
    /// `walk`: how the call walks its tokens.
    pub fn choose(
        state: DType,
        dstate: usize,
        dim: usize,
        vectorized: bool,
        tied: bool,
        walk: Walk,
        rows_total: usize,
    ) -> Self {
        let multi_token = walk == Walk::MultiToken;
        let per16 = 16 / state.size();
        let mut vec = if vectorized && dstate.is_multiple_of(per16) { per16 } else { 1 };
        // Tuning sweeps may ask for narrower state accesses (a power of two below 16 bytes).
        if let Some(v) = TUNE.get("vec")
            && v >= 1
            && (v as usize) < vec
            && (v as usize).is_power_of_two()
        {
            vec = v as usize;
        }
        let nvec = dstate.div_ceil(vec).max(1);
        // An integer state's row maximum and encode scale cost a cross-lane reduction and two
        // divisions per row: at most eight lanes per row spread them over more elements, four for
        // an i8 decode (measured on an H200, batch 1024 of Mamba2-2.7B: 594 µs against 674 with
        // eight; i16 and the multi-token routes measured better with eight).
        let quant = ssm_ssu::quant::limit(state).is_some();
        let max_tpr = match (quant, state.size(), walk) {
            (false, _, _) => 32,
            (true, 1, Walk::Decode) => 4,
            (true, _, _) => 8,
        };
        let mut tpr = nvec.next_power_of_two().min(max_tpr);
        if let Some(t) = TUNE.lanes("tpr") {
            tpr = t;
        }
        let vpt = nvec.div_ceil(tpr);
        // About four 16-byte loads in flight per lane; fewer rows per lane for the per-channel
        // form, whose per-element A tile costs registers.
        let mut rpt = (4 / vpt).max(1);
        if !tied {
            rpt = rpt.min(2);
        }
        // An integer state's f32 tile (multi-token routes) is wider per 16-byte vector: at most 32
        // elements per lane (an i8 row's one vector is 16), so that six blocks fit without spills.
        if quant && multi_token {
            rpt = rpt.min((32 / (vpt * vec)).max(1));
        }
        let (mut rpt, threads) = rows_and_threads(rpt, tpr, dim, rows_total);
        // Measured on an H200 (docs/PERF.md, SSM_CUDA_SSU_TUNE sweeps):
        // - decode with a 16-bit state held in storage form (`RAW`): `raw16_rows`, from two waves;
        // - multi-token routes of small calls: each lane's work is long already, so fewer than
        //   four rows per lane (two for the smallest calls) only cost more blocks.
        if walk == Walk::Decode && state.size() == 2 && vec * 2 == 16 && tied {
            // The same raw vectors per lane whatever the lanes per row.
            rpt = (raw16_rows(rows_total, tpr * vpt, threads, dim, 2) / vpt).max(1);
        } else if multi_token && tied && vpt == 1 && !quant {
            let want = if rows_total * tpr / 4 >= WAVE_THREADS / 2 { 4 } else { 2 };
            rpt = rpt.max(fit_rows(want, tpr, threads, dim));
        }
        // Multi-token routes (measured on an H200, docs/PERF.md): a 4-byte state wants eight rows
        // per lane with registers capped for six resident blocks; a 16-bit state four rows with
        // the cap for eight blocks, or for six (no spills) when its lanes fill less than one
        // wave (batch 8 of Mamba2-2.7B: 0.558 of copy against 0.530; batch 64: 0.681 against 0.699).
        let mut min_blocks = 0;
        if multi_token && threads == 128 {
            if state.size() == 4 && tied && vpt == 1 && rows_total * tpr / 8 >= 2 * WAVE_THREADS && dim >= 32 {
                rpt = 8;
            }
            // An integer state's quantized stores need more registers: six blocks (no spills).
            min_blocks = if state.size() == 4 || quant || rows_total * tpr / rpt < WAVE_THREADS { 6 } else { 8 };
        }
        let g = SsuGeometry {
            row: RowGeometry::new(vec, tpr, vpt, rpt, threads, min_blocks),
            // Evict-first hints on the state (read once, written once) measured better on an H200.
            streaming: true,
            row_store: false,
        };
        tuning_override(g)
    }
}

/// What `auto` runs, per shape, from measurements recorded in the repository: the bench's
/// `--algorithms simple,vertical,horizontal` (`ab_suite.sh ssu-alg`) on Mamba2-2.7B shapes
/// (docs/PERF.md, "The SSU's three tilings"; raw `docs/perf/session17_h100_ssu_algorithms.txt`),
/// measured on an H100 in the seventeenth session, and on the H200 in the twenty-first (raw
/// `docs/perf/session21_h200_owed.txt`), which confirmed the one entry. Each entry is
/// (state element bytes, walk, tied parameters, the least rows of a call — sequences × heads ×
/// dim —, the algorithm); the last entry that matches a call wins, `simple` where none does. An
/// entry is recorded only where that tiling beat `simple` in two runs by more than a run's spread
/// (0.03–0.3 % between two rounds of one tiling in one process):
/// - an f32 state over several tokens (the 4-token speculative step), tied, from batch 64:
///   `vertical` took 0.992–0.995 of `simple`'s time at batch 64 / 256 / 1024 in both runs (one
///   of them with the SSU's programmatic dependent launch, since reverted) on the H100, and
///   0.982–0.988 in both rounds on the H200.
///
/// Everywhere else `simple` was fastest or level: one token (`vertical` within 0.2 % at batch
/// ≥ 64 and slower for bf16 at batch 1 and 8, `horizontal` 12–14 % slower at batch ≥ 64), and a
/// bf16 state over 4 tokens (`vertical` 10–13 % and `horizontal` 24–40 % slower at batch ≥ 64).
const AUTO: &[(usize, Walk, bool, usize, SsuAlgorithm)] =
    &[(4, Walk::MultiToken, true, 64 * 80 * 64, SsuAlgorithm::Vertical)];

/// The algorithm `auto` picks for a call of `state` elements walking `walk` over `rows_total`
/// rows (sequences × heads × dim), `tied` parameters or per channel, from the table `AUTO` of
/// this module; never `horizontal` for an integer state.
pub fn auto_algorithm(state: DType, walk: Walk, tied: bool, rows_total: usize) -> SsuAlgorithm {
    let quant = ssm_ssu::quant::limit(state).is_some();
    AUTO.iter()
        .rev()
        .find(|&&(bytes, w, t, least, alg)| {
            bytes == state.size()
                && w == walk
                && t == tied
                && rows_total >= least
                && !(quant && alg == SsuAlgorithm::Horizontal)
        })
        .map_or(SsuAlgorithm::Simple, |e| e.4)
}

/// The algorithm a call runs: `auto` resolved per shape ([`auto_algorithm`]), the others as
/// named.
///
/// Errors: [`CudaError::Unsupported`] for `horizontal` with an integer (i16 / i8) state, which
/// FlashInfer's horizontal kernel refuses too (its block-scaled rows need the whole row per lane
/// group twice: once for the row maximum, once to encode).
pub(crate) fn resolve_algorithm(
    algorithm: SsuAlgorithm,
    state: DType,
    walk: Walk,
    tied: bool,
    rows_total: usize,
) -> Result<SsuAlgorithm, CudaError> {
    match algorithm {
        SsuAlgorithm::Auto => Ok(auto_algorithm(state, walk, tied, rows_total)),
        SsuAlgorithm::Horizontal if ssm_ssu::quant::limit(state).is_some() => Err(CudaError::Unsupported(format!(
            "the `horizontal` SSU algorithm with a {state} state (as in FlashInfer); use `simple`, `vertical` or `auto`"
        ))),
        a => Ok(a),
    }
}

impl SsuGeometry {
    /// This geometry ([`SsuGeometry::choose`]'s for a call of `state` elements, `dstate` columns,
    /// `dim` rows per head, `tied` parameters or per channel, walking `walk`) retiled for
    /// `algorithm` (resolved: not `auto`). Each tiling of the one kernel loads and stores each
    /// element once:
    /// - `simple`: this geometry, the tiling tuned per shape by the sweeps PERF records;
    /// - `vertical` (tiles along dim rows): a whole row per lane group (one 16-byte vector per lane
    ///   where dstate allows) and a deep tile of rows per lane — eight rows of a 16-bit state, four
    ///   of a 4-byte one (two in the per-channel form) — at every batch, all loaded before use;
    /// - `horizontal` (tiles along dstate columns): FlashInfer's two lanes per row, each lane
    ///   walking up to sixteen 16-byte vectors of its row's columns (eight in the per-channel form)
    ///   with one row per lane, the partial sums joined by one shuffle.
    pub fn with_algorithm(
        self,
        algorithm: SsuAlgorithm,
        (state, dstate, dim): (DType, usize, usize),
        tied: bool,
        walk: Walk,
    ) -> Self {
        let simple = self;
        let r = simple.row;
        let (vec, nvec) = (r.vec as usize, dstate.div_ceil(r.vec as usize).max(1));
        let (tpr, vpt, rpt) = match algorithm {
            SsuAlgorithm::Auto | SsuAlgorithm::Simple => return simple,
            SsuAlgorithm::Vertical => {
                let (tpr, vpt) = (r.tpr as usize, r.vpt as usize);
                let mut want = if state.size() == 4 { 4 } else { 8 };
                if !tied {
                    want = want.min(2);
                }
                // An integer state's f32 tile (multi-token routes): at most 32 elements per lane.
                if ssm_ssu::quant::limit(state).is_some() && walk == Walk::MultiToken {
                    want = want.min((32 / (vpt * vec)).max(1));
                }
                (tpr, vpt, fit_rows(want, tpr, 128, dim))
            }
            SsuAlgorithm::Horizontal => {
                let cap = if tied { 16 } else { 8 };
                let tpr = nvec.div_ceil(cap).next_power_of_two().clamp(2, 32).min(nvec.next_power_of_two());
                (tpr, nvec.div_ceil(tpr), 1)
            }
        };
        let threads = block_threads(tpr, rpt, dim);
        let g = SsuGeometry { row: RowGeometry::new(vec, tpr, vpt, rpt, threads, 0), ..simple };
        tuning_override(g)
    }
}

/// `SSM_CUDA_SSU_TUNE="rpt=2,threads=256,minb=6,cs=1,rowstore=1,vec=4,tpr=8,scatter=0"` overrides
/// the chosen geometry's rows per lane, threads per block, minimum blocks per SM, streaming cache
/// hints, row-wise final stores, (narrower) state vector width and lanes per row, or the kernel's
/// one-pass output (for tuning sweeps on a GPU; unset in normal use).
/// Values that would break the tiling (threads not a multiple of 32 or below `tpr`) are ignored.
static TUNE: TuneVar = TuneVar::new("SSM_CUDA_SSU_TUNE");

fn tuning_override(mut g: SsuGeometry) -> SsuGeometry {
    for (k, v) in TUNE.pairs() {
        match (k.as_str(), *v) {
            ("rpt", v) if v >= 1 => g.row.rpt = v,
            ("threads", v) if v.is_multiple_of(32) && v >= g.row.tpr && v <= 1024 => g.row.threads = v,
            ("minb", v) => g.row.min_blocks = v,
            ("cs", v) => g.streaming = v != 0,
            ("rowstore", v) => g.row_store = v != 0,
            _ => {}
        }
    }
    g
}

/// Everything that selects one compiled SSU kernel (compact, hashed per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SsuKey {
    types: [DType; 15],
    dstate: usize,
    geometry: SsuGeometry,
    flags: u16,
}

const F_Z: u16 = 1;
const F_D: u16 = 2;
const F_DT_BIAS: u16 = 4;
const F_SOFTPLUS: u16 = 8;
const F_TIED: u16 = 16;
const F_SBI: u16 = 32;
const F_PAD: u16 = 64;
const F_VARLEN: u16 = 128;
const F_DENSE: u16 = 256;
const F_SPEC: u16 = 512;
const F_SR: u16 = 1024;
const F_BC_VEC: u16 = 2048;
const F_NO_UPDATE: u16 = 4096;
const F_ISTATES: u16 = 8192;
const F_ISI: u16 = 16384;
const F_NARROW: u16 = 32768;

impl SsuKey {
    /// The key of `plan` under `algorithm`. `addrs`: the device base addresses of `state`, `B`,
    /// `C` and the intermediate buffer (their alignment picks the vector widths); `None` assumes
    /// allocation-aligned bases.
    ///
    /// Errors: an algorithm the call's state refuses ([`resolve_algorithm`]).
    pub(crate) fn from_plan(
        plan: &SsuPlan,
        addrs: Option<(u64, u64, u64, u64)>,
        algorithm: SsuAlgorithm,
    ) -> Result<Self, CudaError> {
        let (sa, ba, ca, ia) = addrs.unwrap_or((0, 0, 0, 0));
        let vectorized = state_rows_aligned(plan, sa, ia);
        let t = plan.dtypes;
        let idx = |o: Option<DType>| o.unwrap_or(DType::I32);
        let flt = |o: Option<DType>| o.unwrap_or(DType::F32);
        let tied = plan.form == ParamForm::Tied;
        let mut flags = 0u16;
        let mut set = |on: bool, f: u16| {
            if on {
                flags |= f
            }
        };
        set(plan.z.is_some(), F_Z);
        set(plan.d.is_some(), F_D);
        set(plan.dt_bias.is_some(), F_DT_BIAS);
        set(plan.dt_softplus, F_SOFTPLUS);
        set(tied, F_TIED);
        set(plan.state_batch_indices.is_some(), F_SBI);
        set(plan.pad_slot_id.is_some(), F_PAD);
        set(plan.route == Route::Varlen, F_VARLEN);
        set(matches!(plan.route, Route::Dense { .. }), F_DENSE);
        set(plan.spec, F_SPEC);
        set(plan.stochastic_rounding.is_some(), F_SR);
        set(!plan.writes_state(), F_NO_UPDATE);
        set(plan.intermediate.is_some(), F_ISTATES);
        set(plan.intermediate.is_some_and(|ip| ip.indices.is_some()), F_ISI);
        set(SsuParams::of_plan(plan, 1).strides_fit_i32() && TUNE.get("narrow") != Some(0), F_NARROW);
        // A buffered one-token call stores its token's state like a speculative one.
        let walk = Walk::of(plan.route != Route::OneToken, plan.spec || plan.intermediate.is_some());
        let rows_total = plan.dims.seqs * plan.dims.heads * plan.dims.dim;
        let algorithm = resolve_algorithm(algorithm, t.state, walk, tied, rows_total)?;
        let (dstate, dim) = (plan.dims.dstate, plan.dims.dim);
        let geometry = SsuGeometry::choose(t.state, dstate, dim, vectorized, tied, walk, rows_total).with_algorithm(
            algorithm,
            (t.state, dstate, dim),
            tied,
            walk,
        );
        let vec = geometry.row.vec as usize;
        set(
            bc_aligned(&plan.b, t.b, ba, vec, plan.dims.dstate) && bc_aligned(&plan.c, t.c, ca, vec, plan.dims.dstate),
            F_BC_VEC,
        );
        Ok(SsuKey {
            types: [
                t.state,
                t.x,
                t.dt,
                t.a,
                t.b,
                t.c,
                flt(t.d),
                flt(t.dt_bias),
                flt(t.z),
                t.out,
                idx(plan.state_batch_indices.map(|s| s.dtype)),
                idx(plan.dst_state_batch_indices.map(|s| s.dtype)),
                idx(t.num_accepted_tokens),
                idx(t.cu_seqlens),
                idx(plan.intermediate.and_then(|ip| ip.indices).map(|(_, t)| t)),
            ],
            dstate: plan.dims.dstate,
            geometry,
            flags,
        })
    }

    /// The NVRTC specialisation.
    pub(crate) fn spec(&self) -> KernelSpec {
        const TYPE_NAMES: [&str; 15] = [
            "STATE_T", "X_T", "DT_T", "A_T", "B_T", "C_T", "D_T", "DTB_T", "Z_T", "OUT_T", "SBI_T", "DST_T", "NACC_T",
            "CU_T", "ISI_T",
        ];
        let mut defines: Vec<(&'static str, String)> =
            TYPE_NAMES.iter().zip(self.types).map(|(&n, t)| (n, c_type(t).to_string())).collect();
        let g = self.geometry;
        defines.push(("DSTATE", self.dstate.to_string()));
        defines.extend(g.row.defines());
        // A block-scaled integer state stores whole rows (no row-wise early final store).
        let limit = ssm_ssu::quant::limit(self.types[0]);
        defines.extend([
            ("STATE_CS", u8::from(g.streaming).to_string()),
            ("ROWSTORE", u8::from(g.row_store && limit.is_none()).to_string()),
            ("QUANT", u8::from(limit.is_some()).to_string()),
            ("QLIMIT", format!("{:.1}f", limit.unwrap_or(0.0))),
            // The rows' sums reduced and scattered, one writer lane per row (`scatter=0`: a
            // butterfly per row and lane 0's writes, for the A/B).
            ("SSU_SCATTER", u8::from(TUNE.get("scatter") != Some(0)).to_string()),
        ]);
        // One token, not speculative, no intermediate buffer, 16-byte state vectors: the tile is
        // held in storage form.
        let one_token = self.flags & (F_VARLEN | F_DENSE | F_SPEC | F_ISTATES) == 0;
        let raw = one_token && g.row.vec as usize * self.types[0].size() == 16;
        defines.push(("RAW", u8::from(raw).to_string()));
        defines.extend(flag_defines(
            self.flags,
            &[
                ("HAS_Z", F_Z),
                ("HAS_D", F_D),
                ("HAS_DT_BIAS", F_DT_BIAS),
                ("DT_SOFTPLUS", F_SOFTPLUS),
                ("TIED", F_TIED),
                ("HAS_SBI", F_SBI),
                ("HAS_PAD", F_PAD),
                ("VARLEN", F_VARLEN),
                ("DENSE", F_DENSE),
                ("SPEC", F_SPEC),
                ("STOCH_ROUND", F_SR),
                ("BC_VEC", F_BC_VEC),
                ("NO_UPDATE", F_NO_UPDATE),
                ("ISTATES", F_ISTATES),
                ("HAS_ISI", F_ISI),
                ("NARROW", F_NARROW),
            ],
        ));
        KernelSpec { source: KernelSource::Ssu, entry: "ssu_kernel", defines }
    }
}

/// The catalogue `cargo xtask build-kernels` compiles: every state dtype with every io dtype
/// on the one-token route, every route (varlen, dense, speculative) per state dtype, the
/// per-channel (Mamba1) form, other dstates, the scalar (unaligned) fallback, i64 index
/// tables (with 64-bit offset products; every other entry 32-bit, `NARROW`) and stochastic
/// rounding. Each entry is `(label, spec)`.
pub fn ssu_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, F16, F32, I8, I16, I32, I64};
    let floats = [F32, F16, BF16];
    let base = F_D | F_DT_BIAS | F_SOFTPLUS | F_SBI | F_PAD;
    let key_of =
        |algorithm: SsuAlgorithm,
         state: DType,
         io: DType,
         idx: DType,
         dstate: usize,
         dim: usize,
         vectorized: bool,
         flags: u16| {
            let tied = flags & F_TIED != 0;
            let walk = Walk::of(flags & (F_VARLEN | F_DENSE) != 0, flags & (F_SPEC | F_ISTATES) != 0);
            SsuKey {
                types: [state, io, io, F32, io, io, F32, F32, io, io, idx, idx, idx, I32, idx],
                dstate,
                geometry: SsuGeometry::choose(state, dstate, dim, vectorized, tied, walk, 64 * 80 * dim)
                    .with_algorithm(algorithm, (state, dstate, dim), tied, walk),
                // Calls with 64-bit index tables here also take the 64-bit products (not NARROW).
                flags: flags | if vectorized { F_BC_VEC } else { 0 } | if idx == I64 { 0 } else { F_NARROW },
            }
        };
    let key = |state: DType, io: DType, idx: DType, dstate: usize, dim: usize, vectorized: bool, flags: u16| {
        key_of(SsuAlgorithm::Simple, state, io, idx, dstate, dim, vectorized, flags)
    };
    let mut out = Vec::new();
    let mut push = |label: String, k: SsuKey| out.push((label, k.spec()));
    for state in floats {
        for io in floats {
            push(
                format!("one-token tied state={state} io={io} dstate=128"),
                key(state, io, I32, 128, 64, true, base | F_TIED),
            );
        }
        let s = state;
        push(format!("varlen tied state={s} io=bf16"), key(s, BF16, I32, 128, 64, true, base | F_TIED | F_VARLEN));
        push(format!("dense tied state={s} io=bf16"), key(s, BF16, I32, 128, 64, true, base | F_TIED | F_DENSE));
        push(format!("spec tied state={s} io=bf16"), key(s, BF16, I32, 128, 64, true, base | F_TIED | F_SPEC));
        push(
            format!("varlen spec tied state={s} io=bf16"),
            key(s, BF16, I32, 128, 64, true, base | F_TIED | F_SPEC | F_VARLEN),
        );
        push(
            format!("one-token per-channel z state={s} io=f32 dstate=16"),
            key(s, F32, I32, 16, 1536, true, base | F_Z),
        );
        push(format!("one-token tied state={s} io=bf16 dstate=64"), key(s, BF16, I32, 64, 64, true, base | F_TIED));
        push(format!("one-token tied state={s} io=bf16 dstate=256"), key(s, BF16, I32, 256, 64, true, base | F_TIED));
        push(
            format!("one-token per-channel scalar state={s} io=f16 dstate=7"),
            key(s, F16, I32, 7, 5, false, base | F_Z),
        );
    }
    push("one-token tied i64 tables state=f32 io=bf16".into(), key(F32, BF16, I64, 128, 64, true, base | F_TIED));
    push("one-token tied no tables state=f32 io=bf16".into(), key(F32, BF16, I32, 128, 64, true, F_TIED | F_D));
    push("one-token tied SR state=f16 io=f16".into(), key(F16, F16, I32, 128, 64, true, base | F_TIED | F_SR));
    push(
        "varlen tied SR state=f16 io=bf16".into(),
        key(F16, BF16, I32, 128, 64, true, base | F_TIED | F_VARLEN | F_SR),
    );
    push("one-token scalar SR state=f16 io=f16 dstate=7".into(), key(F16, F16, I32, 7, 5, false, base | F_SR));
    // Verification without commit (FlashInfer's disable_state_update and intermediate buffer).
    let verify = base | F_TIED | F_NO_UPDATE;
    push("one-token tied no-update state=bf16 io=bf16".into(), key(BF16, BF16, I32, 128, 64, true, verify));
    push("spec tied no-update state=f32 io=bf16".into(), key(F32, BF16, I32, 128, 64, true, verify | F_SPEC));
    push(
        "one-token tied buffer+indices state=bf16 io=bf16".into(),
        key(BF16, BF16, I32, 128, 64, true, verify | F_ISTATES | F_ISI),
    );
    push(
        "dense spec tied buffer state=f32 io=bf16".into(),
        key(F32, BF16, I64, 128, 64, true, verify | F_ISTATES | F_DENSE | F_SPEC),
    );
    push(
        "varlen per-channel buffer+indices state=f16 io=f32 dstate=7".into(),
        key(F16, F32, I32, 7, 5, false, base | F_NO_UPDATE | F_ISTATES | F_ISI | F_VARLEN),
    );
    // Block-scaled integer states (FlashInfer's i16, and i8).
    let tied = base | F_TIED;
    for q in [I16, I8] {
        push(format!("one-token tied state={q} io=bf16"), key(q, BF16, I32, 128, 64, true, tied));
        push(format!("varlen spec tied state={q} io=bf16"), key(q, BF16, I32, 128, 64, true, tied | F_SPEC | F_VARLEN));
        push(format!("dense tied state={q} io=bf16"), key(q, BF16, I32, 128, 64, true, tied | F_DENSE));
        push(
            format!("dense spec tied buffer state={q} io=bf16"),
            key(q, BF16, I32, 128, 64, true, tied | F_NO_UPDATE | F_ISTATES | F_DENSE | F_SPEC),
        );
        push(
            format!("one-token per-channel scalar state={q} io=f16 dstate=7"),
            key(q, F16, I32, 7, 5, false, base | F_Z),
        );
    }
    push("one-token tied state=i8 io=bf16 dstate=64".into(), key(I8, BF16, I32, 64, 64, true, tied));
    // The `vertical` and `horizontal` tilings (`ssu_algorithm`) on the decode, speculative and
    // varlen routes, the per-channel form and the scalar fallback; `vertical` also with the
    // integer states (`horizontal` refuses them).
    for (name, alg) in [("vertical", SsuAlgorithm::Vertical), ("horizontal", SsuAlgorithm::Horizontal)] {
        let states: &[DType] =
            if alg == SsuAlgorithm::Vertical { &[F32, BF16, F16, I16, I8] } else { &[F32, BF16, F16] };
        for &s in states {
            for (route, flags) in
                [("one-token", tied), ("spec", tied | F_SPEC), ("varlen spec", tied | F_SPEC | F_VARLEN)]
            {
                push(format!("{name} {route} tied state={s} io=bf16"), key_of(alg, s, BF16, I32, 128, 64, true, flags));
            }
        }
        push(
            format!("{name} one-token per-channel z state=f32 io=f32 dstate=16"),
            key_of(alg, F32, F32, I32, 16, 1536, true, base | F_Z),
        );
        push(
            format!("{name} dense per-channel scalar state=f16 io=f16 dstate=7"),
            key_of(alg, F16, F16, I32, 7, 5, false, base | F_Z | F_DENSE),
        );
    }
    out
}

/// The kernel specialisation a plan runs with when its state rows are 16-byte aligned (the
/// usual case: device allocations are 256-byte aligned), e.g. for [`CudaBackend::prewarm`]
/// before graph capture.
pub fn ssu_kernel_spec(plan: &SsuPlan) -> KernelSpec {
    SsuKey::from_plan(plan, None, SsuAlgorithm::Auto).expect("`auto` is never refused").spec()
}

/// Whether `B` or `C` can be read `vec` elements at a time: contiguous along dstate and every
/// chunk start aligned to `vec` elements (at most 16 bytes).
fn bc_aligned(ts: &TokenStrides, dtype: DType, addr: u64, vec: usize, dstate: usize) -> bool {
    let es = dtype.size() as i64;
    let align = (vec as i64 * es).min(16);
    let base = addr as i64 + ts.offset as i64 * es;
    let ok = |stride: isize| (stride as i64 * es) % align == 0;
    (ts.dim == 1 || dstate <= 1) && base % align == 0 && ok(ts.seq) && ok(ts.tok) && ok(ts.head)
}

/// Whether every state row `[slot, h, p, 0]` (and every intermediate-buffer row
/// `[entry, step, h, p, 0]`) starts on a 16-byte boundary, for base addresses `addr` (and
/// `ist_addr`).
fn state_rows_aligned(plan: &SsuPlan, addr: u64, ist_addr: u64) -> bool {
    let es = plan.dtypes.state.size() as i64;
    let base = addr as i64 + plan.state.offset as i64 * es;
    let [s0, s1, s2, _] = plan.state.strides;
    let dims = plan.dims;
    let ok = |stride: isize, extent: usize| extent <= 1 || (stride as i64 * es) % 16 == 0;
    let buffer_ok = plan.intermediate.is_none_or(|ip| {
        let [e, t, h, p, _] = ip.buffer.strides;
        (ist_addr as i64 + ip.buffer.offset as i64 * es) % 16 == 0
            && ok(e, ip.entries)
            && ok(t, ip.steps)
            && ok(h, dims.heads)
            && ok(p, dims.dim)
    });
    base % 16 == 0 && ok(s0, dims.slots) && ok(s1, dims.heads) && ok(s2, dims.dim) && buffer_ok
}

impl CudaBackend {
    fn ssu_params(&self, plan: &SsuPlan, args: &SelectiveStateUpdateArgs<'_>, dim_tiles: usize) -> SsuParams {
        let t = plan.dtypes;
        let sbi = plan.state_batch_indices;
        let dst = plan.dst_state_batch_indices;
        let ptr_or_dst = args.dst_state_batch_indices.as_ref().or(args.state_batch_indices.as_ref());
        SsuParams {
            state: addr_of(args.state.device_addr(), plan.state.offset, t.state),
            x: addr_of(args.x.device_addr(), plan.x.offset, t.x),
            dt: addr_of(args.dt.device_addr(), plan.dt.offset, t.dt),
            a: addr_of(args.a.device_addr(), plan.a.offset, t.a),
            b: addr_of(args.b.device_addr(), plan.b.offset, t.b),
            c: addr_of(args.c.device_addr(), plan.c.offset, t.c),
            d: match (&args.d, plan.d, t.d) {
                (Some(d), Some(s), Some(ty)) => addr_of(d.device_addr(), s.offset, ty),
                _ => 0,
            },
            dt_bias: match (&args.dt_bias, plan.dt_bias, t.dt_bias) {
                (Some(d), Some(s), Some(ty)) => addr_of(d.device_addr(), s.offset, ty),
                _ => 0,
            },
            z: match (&args.z, plan.z, t.z) {
                (Some(z), Some(s), Some(ty)) => addr_of(z.device_addr(), s.offset, ty),
                _ => 0,
            },
            out: addr_of(args.out.device_addr(), plan.out.offset, t.out),
            sbi: match (&args.state_batch_indices, sbi) {
                (Some(s), Some(tab)) => addr_of(s.device_addr(), tab.strides.offset, tab.dtype),
                _ => 0,
            },
            dst: match (ptr_or_dst, dst) {
                (Some(s), Some(tab)) => addr_of(s.device_addr(), tab.strides.offset, tab.dtype),
                _ => 0,
            },
            nacc: match (&args.num_accepted_tokens, plan.num_accepted_tokens, t.num_accepted_tokens) {
                (Some(n), Some(s), Some(ty)) => addr_of(n.device_addr(), s.offset, ty),
                _ => 0,
            },
            cu: match (&args.cu_seqlens, plan.cu_seqlens, t.cu_seqlens) {
                (Some(c), Some(s), Some(ty)) => addr_of(c.device_addr(), s.offset, ty),
                _ => 0,
            },
            err: self.error_word_addr(),
            ist: match (&args.intermediate_states_buffer, plan.intermediate) {
                (Some(b), Some(ip)) => addr_of(b.device_addr(), ip.buffer.offset, t.state),
                _ => 0,
            },
            isi: match (&args.intermediate_state_indices, plan.intermediate.and_then(|ip| ip.indices)) {
                (Some(i), Some((s, ty))) => addr_of(i.device_addr(), s.offset, ty),
                _ => 0,
            },
            seed_ptr: match (&args.rand_seed, plan.rand_seed) {
                (Some(r), Some(at)) => addr_of(r.device_addr(), at as isize, DType::I64),
                _ => 0,
            },
            sc: match (&args.state_scale, plan.state_scale) {
                (Some(t), Some(st)) => addr_of(t.device_addr(), st.offset, DType::F32),
                _ => 0,
            },
            ist_sc: match (&args.intermediate_state_scales, plan.intermediate.and_then(|i| i.scales)) {
                (Some(t), Some(st)) => addr_of(t.device_addr(), st.offset, DType::F32),
                _ => 0,
            },
            ..SsuParams::of_plan(plan, dim_tiles)
        }
    }
}

impl SsuParams {
    /// The plan's part of the parameters: strides, extents and scalars (every address 0).
    fn of_plan(plan: &SsuPlan, dim_tiles: usize) -> Self {
        let zero = TokStridesC::default();
        let sbi = plan.state_batch_indices;
        let dst = plan.dst_state_batch_indices;
        let ist = plan.intermediate;
        SsuParams {
            st_slot: plan.state.strides[0] as i64,
            st_head: plan.state.strides[1] as i64,
            st_dim: plan.state.strides[2] as i64,
            xs: (&plan.x).into(),
            dts: (&plan.dt).into(),
            zs: plan.z.as_ref().map_or(zero, |z| z.into()),
            outs: (&plan.out).into(),
            bs: (&plan.b).into(),
            cs: (&plan.c).into(),
            a_head: plan.a.strides[0] as i64,
            a_dim: plan.a.strides[1] as i64,
            a_n: plan.a.strides[2] as i64,
            d_head: plan.d.map_or(0, |s| s.strides[0] as i64),
            d_dim: plan.d.map_or(0, |s| s.strides[1] as i64),
            dtb_head: plan.dt_bias.map_or(0, |s| s.strides[0] as i64),
            dtb_dim: plan.dt_bias.map_or(0, |s| s.strides[1] as i64),
            sbi_seq: sbi.map_or(0, |s| s.strides.strides[0] as i64),
            sbi_col: sbi.map_or(0, |s| s.strides.strides[1] as i64),
            dst_seq: dst.map_or(0, |s| s.strides.strides[0] as i64),
            dst_col: dst.map_or(0, |s| s.strides.strides[1] as i64),
            nacc_s: plan.num_accepted_tokens.map_or(0, |s| s.strides[0] as i64),
            cu_s: plan.cu_seqlens.map_or(0, |s| s.strides[0] as i64),
            slots: plan.dims.slots as i64,
            rows: plan.dims.rows as i64,
            pad: plan.pad_slot_id.unwrap_or(0),
            sbi_width: sbi.map_or(1, |s| s.width as i64),
            dst_width: dst.map_or(1, |s| s.width as i64),
            ist_entry: ist.map_or(0, |i| i.buffer.strides[0] as i64),
            ist_step: ist.map_or(0, |i| i.buffer.strides[1] as i64),
            ist_head: ist.map_or(0, |i| i.buffer.strides[2] as i64),
            ist_dim: ist.map_or(0, |i| i.buffer.strides[3] as i64),
            ist_entries: ist.map_or(0, |i| i.entries as i64),
            ist_steps: ist.map_or(0, |i| i.steps as i64),
            isi_s: ist.and_then(|i| i.indices).map_or(0, |(s, _)| s.strides[0] as i64),
            sc_slot: plan.state_scale.map_or(0, |s| s.strides[0] as i64),
            sc_head: plan.state_scale.map_or(0, |s| s.strides[1] as i64),
            sc_dim: plan.state_scale.map_or(0, |s| s.strides[2] as i64),
            isc_entry: ist.and_then(|i| i.scales).map_or(0, |s| s.strides[0] as i64),
            isc_step: ist.and_then(|i| i.scales).map_or(0, |s| s.strides[1] as i64),
            isc_head: ist.and_then(|i| i.scales).map_or(0, |s| s.strides[2] as i64),
            isc_dim: ist.and_then(|i| i.scales).map_or(0, |s| s.strides[3] as i64),
            seed: plan.stochastic_rounding.map_or(0, |s| s.seed),
            nseq: plan.dims.seqs as i32,
            heads: plan.dims.heads as i32,
            dim: plan.dims.dim as i32,
            heads_per_group: plan.heads_per_group() as i32,
            steps: match plan.route {
                Route::Dense { steps } => steps as i32,
                _ => 1,
            },
            philox_rounds: plan.stochastic_rounding.map_or(0, |s| s.rounds() as i32),
            split: BlockSplit::new(dim_tiles, plan.dims.heads),
            ..Default::default()
        }
    }

    /// Whether every stride and extent that the kernel multiplies by an index fits in 32 bits:
    /// then each index (checked against its extent before use) times its stride is one
    /// 32 × 32 → 64-bit multiply in the kernel (`NARROW`).
    fn strides_fit_i32(&self) -> bool {
        let tok = |t: &TokStridesC| [t.seq, t.tok, t.head, t.dim];
        let scalars = [
            self.st_slot,
            self.st_head,
            self.st_dim,
            self.a_head,
            self.a_dim,
            self.a_n,
            self.d_head,
            self.d_dim,
            self.dtb_head,
            self.dtb_dim,
            self.sbi_seq,
            self.sbi_col,
            self.dst_seq,
            self.dst_col,
            self.nacc_s,
            self.cu_s,
            self.slots,
            self.rows,
            self.sbi_width,
            self.dst_width,
            self.ist_entry,
            self.ist_step,
            self.ist_head,
            self.ist_dim,
            self.ist_entries,
            self.ist_steps,
            self.isi_s,
            self.sc_slot,
            self.sc_head,
            self.sc_dim,
            self.isc_entry,
            self.isc_step,
            self.isc_head,
            self.isc_dim,
        ];
        [&self.xs, &self.dts, &self.zs, &self.outs, &self.bs, &self.cs]
            .into_iter()
            .flat_map(tok)
            .chain(scalars)
            .all(|v| i32::try_from(v).is_ok())
    }
}

impl Run<SelectiveStateUpdateArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// Launches one SSU kernel on the backend's stream. Every tensor must be a device view on
    /// this backend's device. Nothing is allocated, nothing is copied back to the host, and
    /// the call does not wait for the kernel: invalid device index values are reported later
    /// by [`CudaBackend::check`].
    fn run(&self, call: Planned<SelectiveStateUpdateArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let plan = &plan;
        let dims = plan.dims;
        for (what, v) in [("sequences", dims.seqs), ("heads", dims.heads), ("dim", dims.dim), ("steps", dims.rows)] {
            if v > i32::MAX as usize {
                return Err(CudaError::Unsupported(format!("{what} = {v} exceeds the kernel's 32-bit counters")));
            }
        }
        let addr = |a: Option<u64>| a.unwrap_or(0);
        let key = SsuKey::from_plan(
            plan,
            Some((
                addr(args.state.device_addr()),
                addr(args.b.device_addr()),
                addr(args.c.device_addr()),
                addr(args.intermediate_states_buffer.as_ref().and_then(|b| b.device_addr())),
            )),
            self.ssu_algorithm(),
        )?;
        let dim_tiles = dims.dim.div_ceil(key.geometry.row.dim_tile() as usize);
        let blocks = dims.seqs * dims.heads * dim_tiles;
        let Some(grid) = grid_x(blocks)? else { return Ok(()) };
        let func = self.ssu_function(&key)?;
        let params = self.ssu_params(plan, &args, dim_tiles);
        // SAFETY: every address in `params` comes from a device view whose creator promised
        // (TensorRef/TensorMut::from_device_ptr) that it is valid for the view's memory on this
        // device for the call; the plan checked that every element the kernel can reach for
        // valid index values lies inside those views, and the kernel checks index values read
        // on the device before using them. The error word is owned by `self`.
        unsafe {
            self.launch_kernel(&func, (grid, 1, 1), key.geometry.row.threads, &params, "cuLaunchKernel(ssu_kernel)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 20 addresses, 3 state strides, 6 × 4 token strides, 3 + 4 + 6 + 5 + 7 + 7 scalars,
        // seed, 6 ints, the block split (6 × u32).
        let expected = 20 * 8 + 3 * 8 + 6 * 32 + (3 + 4 + 6 + 5 + 7 + 7) * 8 + 8 + 6 * 4 + 6 * 4;
        assert_eq!(std::mem::size_of::<SsuParams>(), expected);
        assert_eq!(std::mem::align_of::<SsuParams>(), 8);
    }

    #[test]
    fn narrow_products_need_every_stride_and_extent_in_32_bits() {
        assert!(SsuParams::default().strides_fit_i32());
        let edge = TokStridesC { seq: i32::MIN as i64, tok: i32::MAX as i64, head: 1, dim: -1 };
        // The pad value and the seed are compared or hashed, never multiplied.
        assert!(SsuParams { xs: edge, pad: i64::MIN, seed: u64::MAX, ..Default::default() }.strides_fit_i32());
        assert!(!SsuParams { st_slot: 1 << 31, ..Default::default() }.strides_fit_i32());
        assert!(!SsuParams { rows: 1 << 31, ..Default::default() }.strides_fit_i32());
        let wide = TokStridesC { tok: -(1 << 31) - 1, ..edge };
        assert!(!SsuParams { cs: wide, ..Default::default() }.strides_fit_i32());
    }

    #[test]
    fn algorithms_are_distinct_tilings_covering_every_column() {
        use SsuAlgorithm::{Horizontal, Simple, Vertical};
        let of = |a, state, ds, dim, vectorized, tied, walk, rows| {
            SsuGeometry::choose(state, ds, dim, vectorized, tied, walk, rows)
                .with_algorithm(a, (state, ds, dim), tied, walk)
                .row
        };
        // Batch 1 of Mamba2-2.7B, f32: `simple` one row per lane; `vertical` four rows of whole
        // rows; `horizontal` two lanes per row, sixteen 16-byte vectors each.
        let g = of(Simple, DType::F32, 128, 64, true, true, Walk::Decode, 80 * 64);
        assert_eq!((g.tpr, g.vpt, g.rpt), (32, 1, 1));
        let g = of(Vertical, DType::F32, 128, 64, true, true, Walk::Decode, 80 * 64);
        assert_eq!((g.tpr, g.vpt, g.rpt, g.threads), (32, 1, 4, 128));
        let g = of(Horizontal, DType::F32, 128, 64, true, true, Walk::Decode, 80 * 64);
        assert_eq!((g.tpr, g.vpt, g.rpt, g.threads), (2, 16, 1, 128));
        let g = of(Horizontal, DType::BF16, 128, 64, true, true, Walk::MultiToken, 80 * 64);
        assert_eq!((g.vec, g.tpr, g.vpt, g.rpt), (8, 2, 8, 1));
        let g = of(Vertical, DType::BF16, 128, 64, true, true, Walk::SpecDecode, 80 * 64);
        assert_eq!((g.tpr, g.vpt, g.rpt), (16, 1, 8));
        // The per-channel form and an integer state's f32 tile keep fewer elements per lane.
        assert_eq!(of(Horizontal, DType::F32, 128, 64, true, false, Walk::Decode, 1 << 20).vpt, 8);
        assert_eq!(of(Vertical, DType::F32, 128, 64, true, false, Walk::Decode, 1 << 20).rpt, 2);
        assert_eq!(of(Vertical, DType::I16, 128, 64, true, true, Walk::MultiToken, 1 << 20).rpt, 2);
        // Odd and unaligned dstates: every column covered, valid blocks.
        for a in [Vertical, Horizontal] {
            for (ds, dim, vectorized) in [(7, 5, false), (1, 1, false), (16, 3, true), (300, 2, false), (64, 64, true)]
            {
                let g = of(a, DType::F16, ds, dim, vectorized, true, Walk::MultiToken, 1 << 20);
                assert!((g.tpr * g.vpt * g.vec) as usize >= ds, "{a:?} {ds}");
                assert!(g.tpr.is_power_of_two() && g.tpr <= 32 && g.threads.is_multiple_of(32) && g.threads >= g.tpr);
                assert!(g.rpt >= 1 && g.vpt >= 1);
            }
        }
    }

    #[test]
    fn auto_follows_the_recorded_measurements() {
        // The 4-token f32 step of Mamba2-2.7B from batch 64: `vertical`; below, and everything
        // else measured: `simple`.
        let auto = |st, walk, tied, batch: usize| auto_algorithm(st, walk, tied, batch * 80 * 64);
        assert_eq!(auto(DType::F32, Walk::MultiToken, true, 64), SsuAlgorithm::Vertical);
        assert_eq!(auto(DType::F32, Walk::MultiToken, true, 1024), SsuAlgorithm::Vertical);
        assert_eq!(auto(DType::F32, Walk::MultiToken, true, 8), SsuAlgorithm::Simple);
        assert_eq!(auto(DType::F32, Walk::MultiToken, false, 1024), SsuAlgorithm::Simple);
        assert_eq!(auto(DType::F32, Walk::Decode, true, 1024), SsuAlgorithm::Simple);
        assert_eq!(auto(DType::BF16, Walk::MultiToken, true, 1024), SsuAlgorithm::Simple);
        assert_eq!(auto(DType::I16, Walk::MultiToken, true, 1024), SsuAlgorithm::Simple);
    }

    #[test]
    fn horizontal_refuses_integer_states_and_auto_resolves() {
        for q in [DType::I16, DType::I8] {
            let e = resolve_algorithm(SsuAlgorithm::Horizontal, q, Walk::Decode, true, 1).unwrap_err();
            assert!(e.to_string().contains("`horizontal`"), "{e}");
            assert_ne!(auto_algorithm(q, Walk::Decode, true, 1 << 30), SsuAlgorithm::Horizontal);
        }
        for st in [DType::F32, DType::BF16, DType::F16, DType::I16, DType::I8] {
            for walk in [Walk::Decode, Walk::SpecDecode, Walk::MultiToken] {
                for (rows, tied) in [(1, true), (80 * 64, true), (1 << 30, true), (1 << 30, false)] {
                    let a = resolve_algorithm(SsuAlgorithm::Auto, st, walk, tied, rows).unwrap();
                    assert_ne!(a, SsuAlgorithm::Auto);
                    assert_eq!(resolve_algorithm(a, st, walk, tied, rows).unwrap(), a);
                }
            }
        }
    }

    /// A sequence's result must be bit-identical alone and in any batch: the vector width, the
    /// lanes per row and the vectors per lane (which set the order of each row's sum over
    /// dstate) may not depend on the call's size, whichever algorithm runs — `auto`'s choice by
    /// batch included (an `auto` entry for `horizontal` from some batch on would break this).
    #[test]
    fn the_sum_order_does_not_depend_on_the_batch() {
        use SsuAlgorithm::{Auto, Horizontal, Simple, Vertical};
        for state in [DType::F32, DType::BF16, DType::F16, DType::I16, DType::I8] {
            for (dstate, dim) in [(128, 64), (64, 64), (256, 64), (16, 5), (7, 3)] {
                for vectorized in [false, true] {
                    for tied in [false, true] {
                        for walk in [Walk::Decode, Walk::SpecDecode, Walk::MultiToken] {
                            for algorithm in [Auto, Simple, Vertical, Horizontal] {
                                let order = |rows: usize| {
                                    let alg = resolve_algorithm(algorithm, state, walk, tied, rows).ok()?;
                                    let g = SsuGeometry::choose(state, dstate, dim, vectorized, tied, walk, rows)
                                        .with_algorithm(alg, (state, dstate, dim), tied, walk);
                                    Some((g.row.vec, g.row.tpr, g.row.vpt))
                                };
                                let alone = order(80 * dim);
                                for seqs in [2, 8, 64, 256, 1024] {
                                    assert_eq!(
                                        order(seqs * 80 * dim),
                                        alone,
                                        "{state:?} dstate {dstate} dim {dim} {vectorized} {tied} {walk:?} {algorithm:?} {seqs}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn geometry_covers_dstate_with_16_byte_vectors() {
        let g = SsuGeometry::choose(DType::F32, 128, 64, true, true, Walk::Decode, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt, g.row.threads), (4, 32, 1, 4, 128));
        assert_eq!(g.row.dim_tile(), 16);
        // A 16-bit state's decode holds eight rows per lane in storage form: one block per head.
        let g = SsuGeometry::choose(DType::BF16, 128, 64, true, true, Walk::Decode, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt), (8, 16, 1, 8));
        assert_eq!(g.row.dim_tile(), 64);
        for walk in [Walk::SpecDecode, Walk::MultiToken] {
            let g = SsuGeometry::choose(DType::BF16, 128, 64, true, true, walk, 1 << 24);
            assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt), (8, 16, 1, 4), "{walk:?}");
        }
        let g = SsuGeometry::choose(DType::F32, 256, 64, true, true, Walk::Decode, 1 << 24);
        assert_eq!((g.row.vec, g.row.tpr, g.row.vpt, g.row.rpt), (4, 32, 2, 2));
        // Unaligned or odd dstate: scalar accesses, every column still covered.
        for (ds, dim) in [(7, 5), (1, 1), (0, 3), (16, 3), (300, 2)] {
            let g = SsuGeometry::choose(DType::F16, ds, dim, false, false, Walk::MultiToken, 1 << 24);
            assert_eq!(g.row.vec, 1);
            assert!((g.row.tpr * g.row.vpt) as usize >= ds, "{ds}");
            assert!(
                g.row.tpr.is_power_of_two()
                    && g.row.tpr <= 32
                    && g.row.threads.is_multiple_of(32)
                    && g.row.threads >= g.row.tpr
            );
        }
        // Small calls (batch 1 of Mamba2-2.7B: 80 heads × 64 rows) get one row per lane.
        let g = SsuGeometry::choose(DType::F32, 128, 64, true, true, Walk::Decode, 80 * 64);
        assert_eq!((g.row.rpt, g.row.dim_tile()), (1, 4));
        // Batch 8 (80 heads × 64 rows each): a 16-bit decode takes two rows per lane, a
        // multi-token route keeps four.
        let g = SsuGeometry::choose(DType::BF16, 128, 64, true, true, Walk::Decode, 8 * 80 * 64);
        assert_eq!(g.row.rpt, 2);
        let g = SsuGeometry::choose(DType::F32, 128, 64, true, true, Walk::MultiToken, 8 * 80 * 64);
        assert_eq!(g.row.rpt, 4);
        // A 16-bit multi-token call caps registers for eight blocks per SM, or six below a wave.
        let g = SsuGeometry::choose(DType::BF16, 128, 64, true, true, Walk::MultiToken, 8 * 80 * 64);
        assert_eq!((g.row.rpt, g.row.min_blocks), (4, 6));
        let g = SsuGeometry::choose(DType::BF16, 128, 64, true, true, Walk::MultiToken, 64 * 80 * 64);
        assert_eq!((g.row.rpt, g.row.min_blocks), (4, 8));
        // Small heads do not waste most of the block.
        let g = SsuGeometry::choose(DType::BF16, 16, 4, true, true, Walk::Decode, 1 << 24);
        assert!(g.row.dim_tile() < 64, "{g:?}");
    }
}
