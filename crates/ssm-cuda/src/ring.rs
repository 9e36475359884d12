//! ReplaySSM on CUDA: `impl Run` for the ring-tracker ops (`kernels/ring_trackers.cu`: advance,
//! reset and commit, rows in order) and for `checkpointing_ssu` (`kernels/checkpointing_ssu.cu`:
//! one block per (sequence, head), the closed form of the CPU backend). Each maps a checked plan
//! plus the call's device index values (checked by the kernel) onto one launch on the backend's
//! stream: no allocation, no host synchronisation.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;
use ssm_ring::{
    CheckpointingSsuArgs, CheckpointingSsuPlan, CommitRingTrackersArgs, TokenForm, TrackerMode, TrackerPlan,
    UpdateRingTrackersArgs,
};
use ssm_tensor::{DType, Planned, Run, Strided, TensorRef};

use crate::compile::{KernelSource, KernelSpec, c_type, flag_defines};
use crate::geometry::{TuneVar, grid_x};
use crate::{CudaBackend, CudaError, addr_of};

/// Threads of the tracker kernel's one block (`NTHREADS` in ring_trackers.cu).
const TRACKER_THREADS: u32 = 1024;
/// Threads per `checkpointing_ssu` block (four warps walking the head's state rows).
const CKPT_THREADS: u16 = 128;
/// Shared memory a `checkpointing_ssu` block may use without an opt-in launch attribute.
const CKPT_MAX_SHARED: usize = 48 * 1024;

/// The tracker kernel's parameter block (`struct TrackerParams` in ring_trackers.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct TrackerParams {
    rs: u64,
    pa: u64,
    pq: u64,
    idx: u64,
    acc: u64,
    qsl: u64,
    rs_s: i64,
    pa_s: i64,
    pq_s: i64,
    idx_s: i64,
    acc_s: i64,
    qsl_s: i64,
    num_states: i64,
    pad: i64,
    window: i64,
    ring_len: i64,
    rows: i64,
}

// SAFETY: `TrackerParams` is `#[repr(C)]` plain old data (Pod: no padding, addresses as
// integers) laid out as `struct TrackerParams` in ring_trackers.cu.
unsafe impl DeviceRepr for TrackerParams {}

/// The checkpointing SSU's parameter block (`struct CkptParams` in checkpointing_ssu.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct CkptParams {
    state: u64,
    xc: u64,
    bc: u64,
    dtc: u64,
    rs: u64,
    pn: u64,
    x: u64,
    dt: u64,
    a: u64,
    b: u64,
    c: u64,
    d: u64,
    dtb: u64,
    z: u64,
    out: u64,
    sbi: u64,
    cu: u64,
    err: u64,
    /// `[slot, head, dim]` of the state, `x_cache`, `B_cache` (group) and `dt_cache` (row
    /// for the ring pools), then `[seq, tok, head]` of x, dt, B (group), C (group), z, out.
    pools: [i64; 12],
    tokens3: [i64; 18],
    a_head: i64,
    d_head: i64,
    d_dim: i64,
    dtb_head: i64,
    sbi_s: i64,
    cu_s: i64,
    rs_s: i64,
    pn_s: i64,
    cache: i64,
    pad: i64,
    total: i64,
    heads: i32,
    tokens: i32,
    dim: i32,
    ring_len: i32,
    window: i32,
    heads_per_group: i32,
}

// SAFETY: `CkptParams` is `#[repr(C)]` plain old data (Pod: no padding, addresses as integers)
// laid out as `struct CkptParams` in checkpointing_ssu.cu (its stride arrays are the same
// consecutive i64 fields there).
unsafe impl DeviceRepr for CkptParams {}

/// One compiled ReplaySSM kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RingKey {
    /// The tracker kernel: dtypes of the trackers, slot table, accepted counts and query starts
    /// (I32 when absent), the mode (0 reset, 1 advance, 2 commit), and whether pads exist.
    Trackers { types: [DType; 4], mode: u8, pad: bool },
    /// The checkpointing SSU.
    Checkpointing(CkptKey),
}

const F_Z: u8 = 1;
const F_D: u8 = 2;
const F_DTB: u8 = 4;
const F_SOFTPLUS: u8 = 8;
const F_SBI: u8 = 16;
const F_PAD: u8 = 32;
const F_VARLEN: u8 = 64;

/// The checkpointing SSU's specialisation: dtypes (state, x_cache, B_cache, x, dt, A, B, C, D,
/// dt_bias, z, out, state_batch_indices, cu_seqlens, ring_start, prev_num_accepted_tokens;
/// F32 / I32 for absent tensors), dstate, threads and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CkptKey {
    types: [DType; 16],
    dstate: u16,
    threads: u16,
    /// Lanes per state row, elements per lane vector (1: scalar accesses), rows per group,
    /// blocks per SM.
    geometry: CkptGeometry,
    flags: u8,
}

/// The checkpointing SSU's launch shape: lanes per state row, elements per lane vector, rows per
/// row group, and blocks per SM asked of the register allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CkptGeometry {
    tpr: u8,
    vec: u8,
    rb: u8,
    minb: u8,
    /// The per-token sums reduced and scattered over the row group, one writer lane per row in
    /// one pass (`CKPT_SCATTER`; where RB is a power of two up to TPR).
    scatter: bool,
    /// Each token's C values read from shared memory as 16-byte vectors (`CKPT_WIDE_C`).
    wide_c: bool,
}

/// `SSM_CUDA_CKPT_TUNE="tpr=8|16|32,minb=M,threads=128|256,rb=R,scatter=0|1,wide=0|1"` (tuning
/// sweeps; unset in normal use): lanes per state row, blocks per SM, threads per block, state
/// rows per row group, the one-pass output (`scatter`) and the 16-byte C reads (`wide`), in
/// place of [`CkptGeometry::of`]'s choice.
static CKPT_TUNE: TuneVar = TuneVar::new("SSM_CUDA_CKPT_TUNE");

/// Blocks (sequences × heads) from which a multi-token step takes 8 blocks per SM: about
/// four waves of 4 blocks per SM on a 132-SM card.
const CKPT_SPREAD_BLOCKS: usize = 2048;

impl CkptGeometry {
    /// The geometry for `dstate` columns of a `state` dtype whose rows are 16-byte aligned
    /// (`aligned`), for a call of `blocks` (sequence, head) blocks and `tokens` tokens a step.
    /// - Lanes per row: 16 up to dstate 128, 8 up to 256, 16 up to 512, 32 beyond. They set the
    ///   order of each output's sum over dstate, so they depend on dstate alone: a sequence's
    ///   outputs are bit-identical alone and in any batch (docs/RELIABILITY.md, promise 5).
    /// - Blocks per SM: 8 (64 registers) where dstate ≤ 128 and the step has one token or at
    ///   least [`CKPT_SPREAD_BLOCKS`] blocks, else 4. On an H100, 16 lanes with 8 blocks took
    ///   16–29 % less time than 8 lanes with 4 blocks at batch 64 and 256 (one and four tokens)
    ///   and 18–23 % less at batch 8 with one token, but 4–13 % more at batch 8 with four tokens
    ///   (docs/PERF.md, "ReplaySSM's launch geometry"); small multi-token steps took 8 lanes
    ///   until the twenty-second session, which found that this changed their outputs' bits
    ///   across the batch line. 16 lanes there against 8, 4-token steps on an H100 (two rounds,
    ///   docs/PERF.md, twenty-third session): f32 batch 8 28.67 µs against 25.40, batch 16 and
    ///   25 2 % faster; bf16 batch 8 21.74 against 23.18, batch 16 and 25 level.
    ///
    /// Either way: 16-byte vectors where the row splits into whole vectors per lane, and as many
    /// rows per group as keep about 64 state values per thread in registers (1 to 4).
    fn of(dstate: usize, state: DType, aligned: bool, blocks: usize, tokens: usize) -> CkptGeometry {
        let spread = dstate <= 128 && (tokens <= 1 || blocks >= CKPT_SPREAD_BLOCKS);
        let tpr: usize = match (CKPT_TUNE.get("tpr"), dstate) {
            (Some(t @ (8 | 16 | 32)), _) => t as usize,
            (_, 0..=128) => 16,
            (_, 129..=256) => 8,
            (_, 257..=512) => 16,
            _ => 32,
        };
        let minb = CKPT_TUNE.get("minb").map_or(if spread { 8 } else { 4 }, |v| v.clamp(1, 16));
        let v16 = 16 / state.size();
        let vec = if aligned && dstate.is_multiple_of(tpr * v16) { v16 } else { 1 };
        let epl = dstate.div_ceil(tpr * vec) * vec;
        let rb = CKPT_TUNE.get("rb").map_or((64 / epl.max(1)).clamp(1, 4), |r| (r as usize).clamp(1, 8));
        let on = |key| CKPT_TUNE.get(key).is_none_or(|v| v != 0);
        CkptGeometry {
            tpr: tpr as u8,
            vec: vec as u8,
            rb: rb as u8,
            minb: minb as u8,
            scatter: on("scatter"),
            wide_c: on("wide"),
        }
    }

    /// Threads per block: [`CKPT_THREADS`], or `SSM_CUDA_CKPT_TUNE`'s `threads` (128 or 256).
    fn threads() -> u16 {
        match CKPT_TUNE.get("threads") {
            Some(256) => 256,
            _ => CKPT_THREADS,
        }
    }
}

/// Threads per block of a checkpointing-SSU key.
fn key_threads(key: &RingKey) -> u32 {
    match key {
        RingKey::Checkpointing(k) => k.threads as u32,
        RingKey::Trackers { .. } => CKPT_THREADS as u32,
    }
}

impl RingKey {
    pub(crate) fn spec(&self) -> KernelSpec {
        match self {
            RingKey::Trackers { types, mode, pad } => {
                let mut defines: Vec<(&'static str, String)> = ["TRK_T", "IDX_T", "ACC_T", "QSL_T"]
                    .into_iter()
                    .zip(types)
                    .map(|(n, t)| (n, c_type(*t).to_string()))
                    .collect();
                defines.push(("MODE", mode.to_string()));
                defines.push(("HAS_PAD", u8::from(*pad).to_string()));
                KernelSpec { source: KernelSource::RingTrackers, entry: "ring_trackers_kernel", defines }
            }
            RingKey::Checkpointing(k) => {
                const NAMES: [&str; 16] = [
                    "STATE_T", "XC_T", "BC_T", "X_T", "DT_T", "A_T", "B_T", "C_T", "D_T", "DTB_T", "Z_T", "OUT_T",
                    "SBI_T", "CU_T", "RS_T", "PN_T",
                ];
                let mut defines: Vec<(&'static str, String)> =
                    NAMES.into_iter().zip(k.types).map(|(n, t)| (n, c_type(t).to_string())).collect();
                defines.push(("DSTATE", k.dstate.to_string()));
                defines.push(("NTHREADS", k.threads.to_string()));
                let g = k.geometry;
                defines.push(("TPR", g.tpr.to_string()));
                defines.push(("VEC", g.vec.to_string()));
                defines.push(("RB", g.rb.to_string()));
                defines.push(("CKPT_MINB", g.minb.to_string()));
                defines.push(("CKPT_SCATTER", u8::from(g.scatter).to_string()));
                defines.push(("CKPT_WIDE_C", u8::from(g.wide_c).to_string()));
                defines.extend(flag_defines(
                    k.flags,
                    &[
                        ("HAS_Z", F_Z),
                        ("HAS_D", F_D),
                        ("HAS_DTB", F_DTB),
                        ("DT_SOFTPLUS", F_SOFTPLUS),
                        ("HAS_SBI", F_SBI),
                        ("HAS_PAD", F_PAD),
                        ("VARLEN", F_VARLEN),
                    ],
                ));
                KernelSpec { source: KernelSource::CheckpointingSsu, entry: "checkpointing_ssu_kernel", defines }
            }
        }
    }
}

/// The tensors a tracker call reads besides the trackers: the slot table and, for a commit,
/// the accepted counts and query starts.
struct TrackerTables<'c, 'a> {
    index: &'c TensorRef<'a>,
    commit: Option<(&'c TensorRef<'a>, &'c TensorRef<'a>)>,
}

fn tracker_key(plan: &TrackerPlan, t: &TrackerTables<'_, '_>) -> RingKey {
    let (acc, qsl) = t.commit.map_or((DType::I32, DType::I32), |(a, q)| (a.dtype(), q.dtype()));
    let mode = match plan.mode {
        TrackerMode::Reset => 0,
        TrackerMode::Advance { .. } => 1,
        TrackerMode::Commit { .. } => 2,
    };
    RingKey::Trackers { types: [plan.tracker_dtype, t.index.dtype(), acc, qsl], mode, pad: plan.pad_slot_id.is_some() }
}

/// `(address, stride)` of a strided vector of `t`.
fn vector(t: &TensorRef<'_>, s: Strided<1>) -> (u64, i64) {
    (addr_of(t.device_addr(), s.offset, t.dtype()), s.strides[0] as i64)
}

/// `(address, stride)` of an optional strided vector.
fn opt_vector(t: Option<&TensorRef<'_>>, s: Option<Strided<1>>) -> (u64, i64) {
    match (t, s) {
        (Some(t), Some(s)) => vector(t, s),
        _ => (0, 0),
    }
}

/// The f32 values of one `checkpointing_ssu` block's shared memory: B rows (`L × dstate`), C
/// rows (`T × dstate`), x rows (`L × dim`), history terms (`T × dim`), CB weights (`T × L`), dt,
/// cum and flush weights (`L` each) and token scales (`T`); the carving in the kernel.
fn ckpt_shared_floats(p: &CheckpointingSsuPlan) -> usize {
    let (l, t) = (p.ring_len, p.tokens);
    l * p.dstate + t * p.dstate + l * p.dim + t * p.dim + t * l + 3 * l + t
}

/// Whether every state row of the call starts on 16 bytes (the base, and every stride of the
/// slot, head and row axes).
fn state_rows_aligned(p: &CheckpointingSsuPlan, a: &CheckpointingSsuArgs<'_>) -> bool {
    let es = p.state_dtype.size() as i64;
    let base = addr_of(a.state.device_addr(), p.state.offset, p.state_dtype);
    base.is_multiple_of(16) && p.state.strides[..3].iter().all(|&s| (s as i64 * es) % 16 == 0)
}

fn ckpt_key(p: &CheckpointingSsuPlan, a: &CheckpointingSsuArgs<'_>) -> RingKey {
    let geometry = CkptGeometry::of(p.dstate, p.state_dtype, state_rows_aligned(p, a), p.batch * p.heads, p.tokens);
    let float = |t: Option<&TensorRef<'_>>| t.map_or(DType::F32, |t| t.dtype());
    let index = |t: Option<&TensorRef<'_>>| t.map_or(DType::I32, |t| t.dtype());
    let mut flags = 0u8;
    for (on, f) in [
        (a.z.is_some(), F_Z),
        (a.d.is_some(), F_D),
        (a.dt_bias.is_some(), F_DTB),
        (p.dt_softplus, F_SOFTPLUS),
        (a.state_batch_indices.is_some(), F_SBI),
        (a.state_batch_indices.is_some() && p.pad_slot_id.is_some(), F_PAD),
        (p.form == TokenForm::Varlen, F_VARLEN),
    ] {
        if on {
            flags |= f;
        }
    }
    RingKey::Checkpointing(CkptKey {
        types: [
            a.state.dtype(),
            a.x_cache.dtype(),
            a.b_cache.dtype(),
            a.x.dtype(),
            a.dt.dtype(),
            a.a.dtype(),
            a.b.dtype(),
            a.c.dtype(),
            float(a.d.as_ref()),
            float(a.dt_bias.as_ref()),
            float(a.z.as_ref()),
            a.out.dtype(),
            index(a.state_batch_indices.as_ref()),
            index(a.cu_seqlens.as_ref()),
            a.ring_start.dtype(),
            a.prev_num_accepted_tokens.dtype(),
        ],
        dstate: p.dstate as u16,
        threads: CkptGeometry::threads(),
        geometry,
        flags,
    })
}

/// Refuses sizes the checkpointing kernel does not implement: 32-bit counters, a 16-bit
/// dstate, and its per-block shared memory.
fn ckpt_limits(p: &CheckpointingSsuPlan) -> Result<usize, CudaError> {
    for (what, v) in [("heads", p.heads), ("dim", p.dim), ("ring_len", p.ring_len), ("dstate", p.dstate)] {
        if v > i32::MAX as usize {
            return Err(CudaError::Unsupported(format!(
                "checkpointing_ssu: {what} = {v} exceeds the kernel's 32-bit counters"
            )));
        }
    }
    if p.dstate > u16::MAX as usize {
        return Err(CudaError::Unsupported(format!("checkpointing_ssu: dstate = {} exceeds 65535", p.dstate)));
    }
    let bytes = ckpt_shared_floats(p) * 4;
    if bytes > CKPT_MAX_SHARED {
        return Err(CudaError::Unsupported(format!(
            "checkpointing_ssu: ring_len {}, tokens {}, dim {} and dstate {} need {bytes} bytes of shared memory per block; the CUDA kernel takes at most {CKPT_MAX_SHARED}",
            p.ring_len, p.tokens, p.dim, p.dstate
        )));
    }
    Ok(bytes)
}

fn ckpt_params(p: &CheckpointingSsuPlan, a: &CheckpointingSsuArgs<'_>, err: u64) -> CkptParams {
    let at = |t: Option<u64>, s: &Strided<4>, dtype: DType| addr_of(t, s.offset, dtype);
    let opt4 = |t: Option<&TensorRef<'_>>, s: Option<Strided<4>>| match (t, s) {
        (Some(t), Some(s)) => (addr_of(t.device_addr(), s.offset, t.dtype()), s.strides),
        _ => (0, [0; 4]),
    };
    let opt2 = |t: Option<&TensorRef<'_>>, s: Option<Strided<2>>| match (t, s) {
        (Some(t), Some(s)) => (addr_of(t.device_addr(), s.offset, t.dtype()), s.strides),
        _ => (0, [0; 2]),
    };
    let three = |s: [isize; 4]| [s[0] as i64, s[1] as i64, s[2] as i64];
    let (z, zs) = opt4(a.z.as_ref(), p.z);
    let (d, ds) = opt2(a.d.as_ref(), p.d);
    let (dtb, dtbs) = opt2(a.dt_bias.as_ref(), p.dt_bias);
    let (sbi, sbi_s) = opt_vector(a.state_batch_indices.as_ref(), p.index);
    let (cu, cu_s) = opt_vector(a.cu_seqlens.as_ref(), p.cu_seqlens);
    let (rs, rs_s) = vector(&a.ring_start, p.ring_start);
    let (pn, pn_s) = vector(&a.prev_num_accepted_tokens, p.prev_num_accepted_tokens);
    let mut pools = [0i64; 12];
    for (i, s) in [p.state, p.x_cache, p.b_cache, p.dt_cache].iter().enumerate() {
        pools[3 * i..3 * i + 3].copy_from_slice(&three(s.strides));
    }
    let mut tokens3 = [0i64; 18];
    for (i, s) in [p.x.strides, p.dt.strides, p.b.strides, p.c.strides, zs, p.out.strides].iter().enumerate() {
        tokens3[3 * i..3 * i + 3].copy_from_slice(&three(*s));
    }
    let total = match (p.form, a.x.rank()) {
        (TokenForm::Varlen, 3) => a.x.shape()[0],
        (TokenForm::Varlen, _) => a.x.shape()[1],
        _ => 0,
    };
    CkptParams {
        state: at(a.state.device_addr(), &p.state, a.state.dtype()),
        xc: at(a.x_cache.device_addr(), &p.x_cache, a.x_cache.dtype()),
        bc: at(a.b_cache.device_addr(), &p.b_cache, a.b_cache.dtype()),
        dtc: at(a.dt_cache.device_addr(), &p.dt_cache, a.dt_cache.dtype()),
        rs,
        pn,
        x: at(a.x.device_addr(), &p.x, a.x.dtype()),
        dt: at(a.dt.device_addr(), &p.dt, a.dt.dtype()),
        a: addr_of(a.a.device_addr(), p.a.offset, a.a.dtype()),
        b: at(a.b.device_addr(), &p.b, a.b.dtype()),
        c: at(a.c.device_addr(), &p.c, a.c.dtype()),
        d,
        dtb,
        z,
        out: at(a.out.device_addr(), &p.out, a.out.dtype()),
        sbi,
        cu,
        err,
        pools,
        tokens3,
        a_head: p.a.strides[0] as i64,
        d_head: ds[0] as i64,
        d_dim: ds[1] as i64,
        dtb_head: dtbs[0] as i64,
        sbi_s,
        cu_s,
        rs_s,
        pn_s,
        cache: p.cache as i64,
        pad: p.pad_slot_id.unwrap_or(0),
        total: total as i64,
        heads: p.heads as i32,
        tokens: p.tokens as i32,
        dim: p.dim as i32,
        ring_len: p.ring_len as i32,
        window: p.window as i32,
        heads_per_group: p.heads_per_group() as i32,
    }
}

impl CudaBackend {
    fn ring_function(&self, key: RingKey) -> Result<cudarc::driver::CudaFunction, CudaError> {
        self.ring_functions.get_or_load(self, key, RingKey::spec)
    }

    fn run_trackers(
        &self,
        plan: &TrackerPlan,
        tr: &ssm_ring::RingTrackers<'_>,
        t: TrackerTables<'_, '_>,
    ) -> Result<(), CudaError> {
        if plan.rows == 0 {
            return Ok(());
        }
        let func = self.ring_function(tracker_key(plan, &t))?;
        let tracker = |m: &ssm_tensor::TensorMut<'_>, s: Strided<1>| vector(&m.as_ref(), s);
        let [rs_p, pa_p, pq_p] = plan.trackers;
        let (rs, rs_s) = tracker(&tr.ring_start, rs_p);
        let (pa, pa_s) = tracker(&tr.prev_num_accepted, pa_p);
        let (pq, pq_s) = tracker(&tr.prev_query_len, pq_p);
        let (idx, idx_s) = vector(t.index, plan.index);
        let (acc, acc_s) = opt_vector(t.commit.map(|c| c.0), plan.num_accepted_tokens);
        let (qsl, qsl_s) = opt_vector(t.commit.map(|c| c.1), plan.query_start_loc);
        let (window, ring_len) = match plan.mode {
            TrackerMode::Reset => (0, 1),
            TrackerMode::Advance { logical_window, ring_buffer_len }
            | TrackerMode::Commit { logical_window, ring_buffer_len } => (logical_window, ring_buffer_len),
        };
        let params = TrackerParams {
            rs,
            pa,
            pq,
            idx,
            acc,
            qsl,
            rs_s,
            pa_s,
            pq_s,
            idx_s,
            acc_s,
            qsl_s,
            num_states: plan.num_states as i64,
            pad: plan.pad_slot_id.unwrap_or(0),
            window,
            ring_len,
            rows: plan.rows as i64,
        };
        // SAFETY: every address comes from a device view whose creator promised
        // (TensorRef/TensorMut::from_device_ptr) that it is valid on this device for the call;
        // the plan checked the trackers' shapes and the tables' lengths (`rows` entries of the
        // slot table and accepted counts, `rows + 1` query starts), and the kernel touches a
        // tracker only for a slot it checked to lie in `[0, num_states)`.
        unsafe {
            self.launch_kernel(&func, (1, 1, 1), TRACKER_THREADS, &params, "cuLaunchKernel(ring_trackers_kernel)")
        }
    }

    /// [`prewarm`](Self::prewarm) for the kernel an `update_replayssm_ring_trackers` (or reset)
    /// call launches, e.g. before CUDA-graph capture.
    pub fn prewarm_update_ring_trackers(&self, call: &Planned<UpdateRingTrackersArgs<'_>>) -> Result<(), CudaError> {
        let t = TrackerTables { index: &call.args().state_batch_indices, commit: None };
        self.ring_function(tracker_key(call.plan(), &t)).map(|_| ())
    }

    /// [`prewarm`](Self::prewarm) for the kernel a `commit_replayssm_ring_trackers` call launches.
    pub fn prewarm_commit_ring_trackers(&self, call: &Planned<CommitRingTrackersArgs<'_>>) -> Result<(), CudaError> {
        let a = call.args();
        let t =
            TrackerTables { index: &a.state_batch_indices, commit: Some((&a.num_accepted_tokens, &a.query_start_loc)) };
        self.ring_function(tracker_key(call.plan(), &t)).map(|_| ())
    }

    /// [`prewarm`](Self::prewarm) for the kernel a `checkpointing_ssu` call launches.
    pub fn prewarm_checkpointing_ssu(&self, call: &Planned<CheckpointingSsuArgs<'_>>) -> Result<(), CudaError> {
        ckpt_limits(call.plan())?;
        self.ring_function(ckpt_key(call.plan(), call.args())).map(|_| ())
    }
}

impl Run<UpdateRingTrackersArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// One launch of the tracker kernel on the backend's stream (none for an empty table); no
    /// allocation, no host synchronisation. Slot values outside the pool are skipped, as the
    /// contract says, so this op never sets the error word.
    fn run(&self, call: Planned<UpdateRingTrackersArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        self.run_trackers(&plan, &args.trackers, TrackerTables { index: &args.state_batch_indices, commit: None })
    }
}

impl Run<CommitRingTrackersArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// As the update: one launch, no allocation, no host synchronisation.
    fn run(&self, call: Planned<CommitRingTrackersArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let t = TrackerTables {
            index: &args.state_batch_indices,
            commit: Some((&args.num_accepted_tokens, &args.query_start_loc)),
        };
        self.run_trackers(&plan, &args.trackers, t)
    }
}

impl Run<CheckpointingSsuArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// One launch of the checkpointing kernel (one block per sequence and head) on the
    /// backend's stream; no allocation, no host synchronisation. Invalid device index values
    /// (slots, `cu_seqlens`, cursors) skip their sequence and are reported later by
    /// [`CudaBackend::check`].
    fn run(&self, call: Planned<CheckpointingSsuArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let shared = ckpt_limits(&plan)?;
        let Some(grid) = grid_x(plan.batch * plan.heads)? else { return Ok(()) };
        let key = ckpt_key(&plan, &args);
        let func = self.ring_function(key)?;
        let params = ckpt_params(&plan, &args, self.error_word_addr());
        // SAFETY: every address comes from a device view whose creator promised
        // (TensorRef/TensorMut::from_device_ptr) that it is valid on this device for the call;
        // the plan checked every shape and stride, so every element the kernel reaches for a
        // slot in `[0, cache)`, a token span inside `[0, total)` no longer than `T`, `ring_start`
        // in `[0, L)` and `k` in `[0, W]` lies inside the views, and the kernel checks exactly
        // those index values before using them. `shared` is what the kernel carves.
        unsafe {
            self.launch_kernel_shared(
                &func,
                (grid, 1, 1),
                key_threads(&key),
                shared as u32,
                &params,
                "cuLaunchKernel(checkpointing_ssu_kernel)",
            )
        }
    }
}

/// The catalogue `cargo xtask build-kernels` compiles: the tracker kernel in every mode (i32
/// and i64 trackers), and the checkpointing SSU for Mamba2-2.7B-like shapes with f32, bf16 and
/// f16 state, one-token and varlen, with and without tables and options.
pub fn ring_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, F16, F32, I32, I64};
    let mut out = Vec::new();
    for (mode, name) in [(0u8, "reset"), (1, "advance"), (2, "commit")] {
        for t in [I32, I64] {
            let key = RingKey::Trackers { types: [t, t, t, t], mode, pad: true };
            out.push((format!("ring trackers {name} t={t}"), key.spec()));
        }
    }
    // `blocks` and `tokens` pick the geometry (`CkptGeometry::of`).
    let ckpt_in = |state: DType, act: DType, dstate: u16, flags: u8, blocks: usize, tokens: usize| {
        let mut types = [act; 16];
        types[0] = state;
        types[4] = F32; // dt
        types[5] = F32; // A
        types[8] = F32; // D
        types[9] = F32; // dt_bias
        types[12..].copy_from_slice(&[I32; 4]);
        let geometry = CkptGeometry::of(dstate as usize, state, true, blocks, tokens);
        RingKey::Checkpointing(CkptKey { types, dstate, threads: CkptGeometry::threads(), geometry, flags }).spec()
    };
    // A decode step of Mamba2-2.7B's 80 heads at batch 64 (the spread geometry).
    let ckpt = |state, act, dstate, flags| ckpt_in(state, act, dstate, flags, 64 * 80, 1);
    let all = F_Z | F_D | F_DTB | F_SOFTPLUS | F_SBI | F_PAD;
    for (state, act) in [(F32, BF16), (BF16, BF16), (F16, F16), (F32, F32)] {
        out.push((format!("checkpointing ssu state={state} act={act} dstate=128"), ckpt(state, act, 128, all)));
    }
    out.push(("checkpointing ssu varlen state=f32 dstate=128".into(), ckpt(F32, BF16, 128, all | F_VARLEN)));
    out.push(("checkpointing ssu bare state=f32 dstate=16".into(), ckpt(F32, F32, 16, 0)));
    out.push(("checkpointing ssu odd dstate=40".into(), ckpt(F32, BF16, 40, F_SBI | F_VARLEN)));
    out.push(("checkpointing ssu dstate=256 state=bf16".into(), ckpt(BF16, BF16, 256, all)));
    // A 4-token step at batch 8 (the compact geometry).
    for state in [F32, BF16] {
        out.push((
            format!("checkpointing ssu compact state={state} dstate=128"),
            ckpt_in(state, BF16, 128, all, 8 * 80, 4),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 6 addresses and 11 strides / scalars.
        assert_eq!(std::mem::size_of::<TrackerParams>(), 17 * 8);
        // 18 addresses, 12 pool and 18 token strides, 11 more 8-byte fields, 6 ints.
        assert_eq!(std::mem::size_of::<CkptParams>(), (18 + 12 + 18 + 11) * 8 + 6 * 4);
        assert_eq!(std::mem::align_of::<CkptParams>(), 8);
    }

    #[test]
    fn state_geometry_keeps_about_64_values_per_thread() {
        use DType::{BF16, F32};
        let g = |dstate, state, aligned, blocks, tokens| {
            let g = CkptGeometry::of(dstate, state, aligned, blocks, tokens);
            (g.tpr, g.vec, g.rb, g.minb)
        };
        // Four blocks per SM: a multi-token step over few blocks, or dstate past 128.
        assert_eq!(g(128, F32, true, 640, 4), (16, 4, 4, 4));
        assert_eq!(g(128, BF16, true, 640, 4), (16, 8, 4, 4));
        assert_eq!(g(256, F32, true, 1 << 20, 1), (8, 4, 2, 4));
        assert_eq!(g(128, F32, false, 640, 4), (16, 1, 4, 4), "unaligned rows: scalar");
        assert_eq!(g(1024, F32, true, 1 << 20, 1), (32, 4, 2, 4));
        // Eight: one token a step, or many blocks.
        assert_eq!(g(128, F32, true, 80, 1), (16, 4, 4, 8));
        assert_eq!(g(128, BF16, true, 64 * 80, 4), (16, 8, 4, 8));
        assert_eq!(g(128, F32, true, CKPT_SPREAD_BLOCKS - 1, 2), (16, 4, 4, 4));
        assert_eq!(g(40, F32, true, 80, 1), (16, 1, 4, 8), "40 is not a multiple of 16 vectors of 4");
        assert_eq!(g(16, F32, true, 640, 4), (16, 1, 4, 4), "16 is not a multiple of 16 vectors of 4");
    }

    /// A sequence's outputs must be bit-identical alone and in any batch: the lanes per row and
    /// the vector width (which set the order of each output's sum over dstate) and the rows per
    /// group may not depend on the call's size.
    #[test]
    fn the_sum_order_does_not_depend_on_the_batch() {
        for state in [DType::F32, DType::BF16, DType::F16] {
            for dstate in [16, 40, 64, 128, 256, 512, 1024] {
                for aligned in [false, true] {
                    for tokens in [1, 2, 4] {
                        let order = |blocks| {
                            let g = CkptGeometry::of(dstate, state, aligned, blocks, tokens);
                            (g.tpr, g.vec, g.rb)
                        };
                        for batch in [2, 8, 25, 26, 64, 256, 1024] {
                            assert_eq!(order(batch * 80), order(80), "{state:?} {dstate} {aligned} {tokens} {batch}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn catalogue_defines_every_macro() {
        for (label, spec) in ring_catalogue() {
            let n = if spec.source == KernelSource::RingTrackers { 6 } else { 16 + 8 + 7 };
            assert_eq!(spec.defines.len(), n, "{label}");
        }
    }
}
