//! `impl Run<MambaChunkScanCombinedVarlenArgs>` for [`CudaBackend`]: the Mamba2 SSD chunked
//! prefill as five launches of `kernels/ssd.cu` on the backend's stream (stages 1+2, stage 4,
//! stage 3, stage 5, the final states and checkpoints), over the f32 scratch laid out by [`SsdPlan::scratch`]
//! (the CPU backend's passes in the same order, so every read of an initial state precedes
//! every write of a final state). Matrix products run on tensor cores (`mma.sync`, f32
//! accumulation): bf16 operands when any of x, B, C is bf16, else f16 when any is f16, else
//! tf32, the operand types of vLLM's Triton `tl.dot`.
//!
//! Chunk metadata and slot tables may live on the device; the kernels check their values
//! (error word) and never leave the views the plan checked. Without a caller's `scratch`, the
//! call allocates one stream-ordered (`cuMemAllocAsync`) and frees it after the launches.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::{DevicePtr, DeviceRepr};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, SsdPlan};
use ssm_tensor::{DType, Planned, Run, Strided, TensorRef};

use crate::compile::{KernelSource, KernelSpec, WGMMA_ASKED, c_type, flag_defines};
use crate::geometry::{TuneVar, grid_x};
use crate::{CudaBackend, CudaError, addr_of};

/// Longest chunk the kernels hold (`QCAP` in ssd.cu).
pub const MAX_CHUNK_ROWS: usize = 256;
/// Output tile edge of the matrix-product kernels (`TILE` in ssd.cu).
const TILE: usize = 64;
/// Threads of the matrix-product kernels (`THREADS`).
const MMA_THREADS: u32 = 128;
/// Threads of the per-element state kernels (pass and final; `STATE_THREADS`).
const STATE_THREADS: usize = 256;
/// State elements per thread of those kernels (`ELEMS`).
const STATE_ELEMS: usize = 8;

/// The kernels' parameter block (`struct SsdParams` in ssd.cu: same order, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct SsdParams {
    /// x, dt, A, B, C, z, out, D, dt_bias, initial_states, ssm_state, varlen_states,
    /// initial_state_indices, has_initial_state, final_state_indices, cu_chunk_seqlens,
    /// seq_idx, last_chunk_indices, scratch, error word, checkpoint_chunk_indices,
    /// checkpoint_state_indices.
    addrs: [u64; 22],
    /// x_t x_h dt_t dt_h a_h b_t b_g c_t c_g z_t z_h out_t out_h d_h d_p bias_h.
    tok: [i64; 16],
    /// init_b init_h init_p pool_s pool_h pool_p vs_r vs_h vs_p.
    states: [i64; 9],
    /// ii_s hi_s fi_s cu_s seq_s last_s ckc_s cks_s.
    tables: [i64; 8],
    pad: i64,
    slots: i64,
    /// Scratch offsets (elements) of dt_out, dA_cumsum, states, CB.
    ws_off: [i64; 4],
    /// tokens heads dim dstate groups nchunks batch chunk_rows q_row state_row ratio ntiles_n.
    dims: [i32; 12],
    lo: f32,
    hi: f32,
}

// SAFETY: `SsdParams` is `#[repr(C)]` plain old data (Pod: no padding, addresses as integers)
// laid out as `struct SsdParams` in ssd.cu.
unsafe impl DeviceRepr for SsdParams {}

const F_Z: u16 = 1;
const F_D: u16 = 2;
const F_BIAS: u16 = 4;
const F_SOFTPLUS: u16 = 8;
const F_HAS: u16 = 16;
const F_FINAL: u16 = 32;
const F_PAD: u16 = 64;
const F_VARLEN: u16 = 128;
const F_INTERMEDIATE: u16 = 256;
const F_X_VEC: u16 = 512;
const F_B_VEC: u16 = 1024;
const F_C_VEC: u16 = 2048;
const F_CKPT: u16 = 4096;
const F_DENSE: u16 = 8192;

/// The five entry points, in launch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SsdEntry {
    State,
    Cb,
    Pass,
    Scan,
    Final,
}

impl SsdEntry {
    fn name(self) -> &'static str {
        match self {
            SsdEntry::State => "ssd_state_kernel",
            SsdEntry::Cb => "ssd_cb_kernel",
            SsdEntry::Pass => "ssd_pass_kernel",
            SsdEntry::Scan => "ssd_scan_kernel",
            SsdEntry::Final => "ssd_final_kernel",
        }
    }
}

/// Everything that selects one compiled SSD kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SsdKey {
    /// x dt A B C z out D dt_bias initial_states state, then cu_chunk_seqlens seq_idx
    /// last_chunk_indices initial_state_indices has_initial_state final_state_indices
    /// checkpoint_chunk_indices checkpoint_state_indices (F32 / I32 where absent).
    types: [DType; 19],
    /// 0 bf16, 1 f16, 2 tf32 operands.
    op: u8,
    /// 0 zeros, 1 `initial_states`, 2 the pool.
    init_mode: u8,
    flags: u16,
    entry: SsdEntry,
    /// The product kernels' pipeline depth (`STAGES`: buffers per operand; tf32 keeps 2) and
    /// resident blocks asked per multiprocessor (`MINB`, the register cap).
    tune: SsdTune,
}

/// Pipeline depth and register cap of the product kernels, for the state/CB and the scan
/// kernels. Measured on an H200 (docs/PERF.md, `SSM_CUDA_SSD_TUNE` sweeps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SsdTune {
    stages: u8,
    minb: u8,
    /// The scan's causal weights computed in registers as `mma` A fragments (`REG_WEIGHTS`;
    /// 16-bit operands and 32-wide slices only; `regw=1`), else through shared memory (the
    /// default). Always false for the other entries.
    reg_weights: bool,
    /// The products' slice along k (`KT_ASKED`: 32 or 64; tf32 operands and three buffers
    /// keep 32). The pass and final kernels have no products and ignore it.
    kt: u8,
    /// The products on Hopper's `wgmma` (`WGMMA_ASKED`; `wg=` a mask: 1 the scan, 2 stages
    /// 1+2, 4 C·Bᵀ). Compiled for sm_90a where the device is sm_90 (`KernelSpec::target`);
    /// elsewhere, and for tf32 operands, the kernel keeps `mma.sync`.
    wgmma: bool,
    /// The state and scan kernels' block order (`TILES_FIRST`; `order=0|1`): one (chunk, head)'s
    /// tiles next to each other along the grid's x, the scan's longest row tiles first, so the
    /// rows those tiles share are read from DRAM once (the default), or the tile as the grid's z,
    /// each tile a full pass over the chunks and heads. Always false for the other entries.
    tiles_first: bool,
}

impl SsdTune {
    /// The defaults, or `SSM_CUDA_SSD_TUNE="stages=N,minb=M,scan_minb=K,regw=0|1,kt=32|64,
    /// scan_kt=32|64"` (tuning sweeps; unset in normal use). Measured on the H200
    /// (docs/PERF.md): the scan asks for five blocks per SM (3.6–5.8 % faster than four, six
    /// slower; run of 2026-12-04); register weights are 3–7 % slower; stages 1+2 and C·Bᵀ take
    /// 64-wide slices (1.2–3.0 % faster end to end), the scan 32-wide ones (64 spills at five
    /// blocks per SM and is 11–24 % slower at four; runs of 2026-12-05).
    fn of(entry: SsdEntry) -> SsdTune {
        static TUNE: TuneVar = TuneVar::new("SSM_CUDA_SSD_TUNE");
        let get = |k: &str, default: u8| TUNE.get(k).map_or(default, |v| v.clamp(1, 8) as u8);
        let slice = |k: &str, default: u8| TUNE.get(k).map_or(default, |v| if v >= 64 { 64 } else { 32 });
        let (minb, kt) = match entry {
            SsdEntry::Scan => (get("scan_minb", 5), slice("scan_kt", 32)),
            _ => (get("minb", 4), slice("kt", 64)),
        };
        let reg_weights = entry == SsdEntry::Scan && TUNE.get("regw").is_some_and(|v| v != 0);
        let bit = match entry {
            SsdEntry::Scan => 1,
            SsdEntry::State => 2,
            SsdEntry::Cb => 4,
            SsdEntry::Pass | SsdEntry::Final => 0,
        };
        let wgmma = TUNE.get("wg").unwrap_or(DEFAULT_WGMMA) & bit != 0;
        let tiles_first = matches!(entry, SsdEntry::State | SsdEntry::Scan) && TUNE.get("order").is_none_or(|v| v != 0);
        SsdTune { stages: get("stages", 2).clamp(2, 3), minb, reg_weights, kt, wgmma, tiles_first }
    }
}

/// The product kernels that take `wgmma` by default (`SsdTune::wgmma`'s mask): none, as the
/// form was 1.24–1.31× slower end to end on an H100 (docs/PERF.md, "Both `wgmma` forms on an
/// H100").
const DEFAULT_WGMMA: u32 = 0;

const TYPE_MACROS: [&str; 19] = [
    "X_T", "DT_T", "A_T", "B_T", "C_T", "Z_T", "OUT_T", "D_T", "BIAS_T", "INIT_T", "ST_T", "CU_T", "SEQ_T", "LAST_T",
    "II_T", "HI_T", "FI_T", "CKC_T", "CKS_T",
];

impl SsdKey {
    /// The NVRTC specialisation.
    pub(crate) fn spec(&self) -> KernelSpec {
        let mut defines: Vec<(&'static str, String)> =
            TYPE_MACROS.iter().zip(self.types).map(|(m, t)| (*m, c_type(t).to_string())).collect();
        defines.push(("OP_KIND", self.op.to_string()));
        defines.push(("INIT_MODE", self.init_mode.to_string()));
        defines.push(("STAGES_ASKED", self.tune.stages.to_string()));
        defines.push(("MINB", self.tune.minb.to_string()));
        defines.push(("REG_WEIGHTS", u8::from(self.tune.reg_weights).to_string()));
        defines.push(("KT_ASKED", self.tune.kt.to_string()));
        defines.push((WGMMA_ASKED, u8::from(self.tune.wgmma).to_string()));
        defines.push(("TILES_FIRST", u8::from(self.tune.tiles_first).to_string()));
        defines.extend(flag_defines(
            self.flags,
            &[
                ("HAS_Z", F_Z),
                ("HAS_D", F_D),
                ("HAS_BIAS", F_BIAS),
                ("SOFTPLUS", F_SOFTPLUS),
                ("HAS_HAS", F_HAS),
                ("HAS_FINAL", F_FINAL),
                ("HAS_PAD", F_PAD),
                ("HAS_VARLEN", F_VARLEN),
                ("INTERMEDIATE", F_INTERMEDIATE),
                ("X_VEC", F_X_VEC),
                ("B_VEC", F_B_VEC),
                ("C_VEC", F_C_VEC),
                ("HAS_CKPT", F_CKPT),
                ("DENSE_STATE", F_DENSE),
            ],
        ));
        KernelSpec { source: KernelSource::Ssd, entry: self.entry.name(), defines }
    }

    fn from_plan(p: &SsdPlan, args: &MambaChunkScanCombinedVarlenArgs<'_>, entry: SsdEntry) -> SsdKey {
        let io = p.io_dtypes;
        let opt = |t: Option<&TensorRef<'_>>, absent: DType| t.map_or(absent, |t| t.dtype());
        let types = [
            io.x,
            io.dt,
            args.a.dtype(),
            io.b,
            io.c,
            io.z.unwrap_or(DType::F32),
            io.out.unwrap_or(DType::F32),
            opt(args.d.as_ref(), DType::F32),
            opt(args.dt_bias.as_ref(), DType::F32),
            opt(args.initial_states.as_ref(), DType::F32),
            p.state_dtype,
            args.cu_chunk_seqlens.dtype(),
            args.seq_idx.dtype(),
            args.last_chunk_indices.dtype(),
            opt(args.initial_state_indices.as_ref(), DType::I32),
            opt(args.has_initial_state.as_ref(), DType::I32),
            opt(args.final_state_indices.as_ref(), DType::I32),
            opt(args.checkpoint_chunk_indices.as_ref(), DType::I32),
            opt(args.checkpoint_state_indices.as_ref(), DType::I32),
        ];
        let ops = [io.x, io.b, io.c];
        let op = if ops.contains(&DType::BF16) {
            0
        } else if ops.contains(&DType::F16) {
            1
        } else {
            2
        };
        let init_mode = if p.initial_states.is_some() {
            1
        } else if p.initial_state_indices.is_some() {
            2
        } else {
            0
        };
        let mut flags = 0u16;
        let mut set = |on: bool, f: u16| {
            if on {
                flags |= f
            }
        };
        set(p.z.is_some(), F_Z);
        set(p.d.is_some(), F_D);
        set(p.dt_bias.is_some(), F_BIAS);
        set(p.dt_softplus, F_SOFTPLUS);
        set(p.has_initial_state.is_some(), F_HAS);
        set(p.final_state_indices.is_some() && p.ssm_state.is_some(), F_FINAL);
        set(p.pad_slot_id.is_some(), F_PAD);
        set(p.varlen_states.is_some(), F_VARLEN);
        set(p.return_intermediate_states, F_INTERMEDIATE);
        set(p.checkpoint_state_indices.is_some() && p.ssm_state.is_some(), F_CKPT);
        set(p.scratch().state_row == p.dstate, F_DENSE);
        set(rows_of_eight(&args.x, p.x), F_X_VEC);
        set(rows_of_eight(&args.b, p.b), F_B_VEC);
        set(rows_of_eight(&args.c, p.c), F_C_VEC);
        SsdKey { types, op, init_mode, flags, entry, tune: SsdTune::of(entry) }
    }
}

/// Whether a `[tokens, heads or groups, columns]` tensor's rows can be read eight elements at a
/// time with 16-byte loads: both outer strides multiples of 8 elements and element 0 16-byte
/// aligned (the last stride is 1, checked by the plan).
fn rows_of_eight(t: &TensorRef<'_>, s: Strided<3>) -> bool {
    let es = t.dtype().size() as i128;
    let base = t.device_addr().unwrap_or(0) as i128 + s.offset as i128 * es;
    base % 16 == 0 && s.strides[0] % 8 == 0 && s.strides[1] % 8 == 0
}

fn s3(s: Option<Strided<3>>) -> (isize, [isize; 3]) {
    s.map_or((0, [0; 3]), |s| (s.offset, s.strides))
}

fn s4(s: Option<Strided<4>>) -> (isize, [isize; 4]) {
    s.map_or((0, [0; 4]), |s| (s.offset, s.strides))
}

/// The kernels' parameters; `ws` is the scratch's device address (element 0 of the layout).
fn params(p: &SsdPlan, a: &MambaChunkScanCombinedVarlenArgs<'_>, ws: u64, err: u64) -> SsdParams {
    let addr = |t: Option<&TensorRef<'_>>, off: isize| t.map_or(0, |t| addr_of(t.device_addr(), off, t.dtype()));
    let table = |t: Option<&TensorRef<'_>>, s: Option<ssm_tensor::SlotTable>| match (t, s) {
        (Some(t), Some(s)) => (addr_of(t.device_addr(), s.strides.offset, t.dtype()), s.strides.strides[0] as i64),
        _ => (0, 0),
    };
    let (z_off, zs) = s3(p.z);
    let (out_off, os) = s3(p.out);
    let (d_off, ds) = s3(p.d);
    let (init_off, is) = s4(p.initial_states);
    let (pool_off, ps) = s4(p.ssm_state);
    let (vs_off, vs) = s4(p.varlen_states);
    let out_ref = a.out.as_ref().map(|o| o.as_ref());
    let pool_ref = a.ssm_state.as_ref().map(|o| o.as_ref());
    let vs_ref = a.varlen_states.as_ref().map(|o| o.as_ref());
    let (ii, ii_s) = table(a.initial_state_indices.as_ref(), p.initial_state_indices);
    let (hi, hi_s) = table(a.has_initial_state.as_ref(), p.has_initial_state);
    let (fi, fi_s) = table(a.final_state_indices.as_ref(), p.final_state_indices);
    let (ckc, ckc_s) = table(a.checkpoint_chunk_indices.as_ref(), p.checkpoint_chunk_indices);
    let (cks, cks_s) = table(a.checkpoint_state_indices.as_ref(), p.checkpoint_state_indices);
    let w = p.scratch();
    SsdParams {
        addrs: [
            addr(Some(&a.x), p.x.offset),
            addr(Some(&a.dt), p.dt.offset),
            addr(Some(&a.a), p.a.offset),
            addr(Some(&a.b), p.b.offset),
            addr(Some(&a.c), p.c.offset),
            addr(a.z.as_ref(), z_off),
            addr(out_ref.as_ref(), out_off),
            addr(a.d.as_ref(), d_off),
            addr(a.dt_bias.as_ref(), p.dt_bias.map_or(0, |s| s.offset)),
            addr(a.initial_states.as_ref(), init_off),
            addr(pool_ref.as_ref(), pool_off),
            addr(vs_ref.as_ref(), vs_off),
            ii,
            hi,
            fi,
            addr(Some(&a.cu_chunk_seqlens), p.cu_chunk_seqlens.offset),
            addr(Some(&a.seq_idx), p.seq_idx.offset),
            addr(Some(&a.last_chunk_indices), p.last_chunk_indices.offset),
            ws,
            err,
            ckc,
            cks,
        ],
        tok: [
            p.x.strides[0],
            p.x.strides[1],
            p.dt.strides[0],
            p.dt.strides[1],
            p.a.strides[0],
            p.b.strides[0],
            p.b.strides[1],
            p.c.strides[0],
            p.c.strides[1],
            zs[0],
            zs[1],
            os[0],
            os[1],
            ds[0],
            ds[1],
            p.dt_bias.map_or(0, |s| s.strides[0]),
        ]
        .map(|v| v as i64),
        states: [is[0], is[1], is[2], ps[0], ps[1], ps[2], vs[0], vs[1], vs[2]].map(|v| v as i64),
        tables: [
            ii_s,
            hi_s,
            fi_s,
            p.cu_chunk_seqlens.strides[0] as i64,
            p.seq_idx.strides[0] as i64,
            p.last_chunk_indices.strides[0] as i64,
            ckc_s,
            cks_s,
        ],
        pad: p.pad_slot_id.unwrap_or(0),
        slots: p.slots as i64,
        ws_off: [w.dt_out, w.da_cumsum, w.states, w.cb].map(|v| v as i64),
        dims: [
            p.tokens,
            p.heads,
            p.dim,
            p.dstate,
            p.groups,
            p.nchunks,
            p.batch,
            p.chunk_rows,
            w.q_row,
            w.state_row,
            p.heads_per_group(),
            p.dstate.div_ceil(TILE),
        ]
        .map(|v| v as i32),
        lo: p.dt_limit.0,
        hi: p.dt_limit.1,
    }
}

/// Refuses the sizes the kernels do not implement (nothing launched): chunks longer than
/// [`MAX_CHUNK_ROWS`], and dimensions past the grid's y/z limits or `i32`.
fn limits(p: &SsdPlan) -> Result<(), CudaError> {
    if p.chunk_rows > MAX_CHUNK_ROWS {
        return Err(CudaError::Unsupported(format!(
            "SSD chunks of up to {} tokens (`chunk_size` = {}; with host-resident `cu_chunk_seqlens` the longest \
             chunk counts); this kernel holds at most {MAX_CHUNK_ROWS}",
            p.chunk_rows, p.chunk_size
        )));
    }
    let z_tiles = p.dim.div_ceil(TILE) * p.dstate.div_ceil(TILE);
    let z_scan = p.chunk_rows.div_ceil(TILE) * p.dim.div_ceil(TILE);
    let z_state = (p.dim * p.dstate).div_ceil(STATE_THREADS * STATE_ELEMS);
    let fits = p.heads <= 65535
        && p.groups <= 65535
        && z_tiles.max(z_scan).max(z_state) <= 65535
        && [p.tokens, p.nchunks, p.batch, p.dim * p.scratch().state_row].iter().all(|&v| v < i32::MAX as usize);
    if !fits {
        return Err(CudaError::Unsupported(format!(
            "SSD dimensions past the kernel's grid (heads {}, groups {}, dim {}, dstate {}, tokens {}, chunks {})",
            p.heads, p.groups, p.dim, p.dstate, p.tokens, p.nchunks
        )));
    }
    Ok(())
}

impl CudaBackend {
    fn ssd_function(&self, key: SsdKey) -> Result<cudarc::driver::CudaFunction, CudaError> {
        self.ssd_functions.get_or_load(self, key, SsdKey::spec)
    }

    /// [`prewarm`](Self::prewarm) for the five kernels an SSD call launches.
    pub fn prewarm_ssd(&self, call: &Planned<MambaChunkScanCombinedVarlenArgs<'_>>) -> Result<(), CudaError> {
        for key in self.ssd_keys(call.plan(), call.args()) {
            self.ssd_function(key)?;
        }
        Ok(())
    }

    /// The five kernels' keys of a call, compiled together where any is not loaded yet.
    fn ssd_keys(&self, plan: &SsdPlan, args: &MambaChunkScanCombinedVarlenArgs<'_>) -> [SsdKey; 5] {
        let keys = [SsdEntry::State, SsdEntry::Cb, SsdEntry::Pass, SsdEntry::Scan, SsdEntry::Final]
            .map(|e| SsdKey::from_plan(plan, args, e));
        self.ssd_functions.precompile(self, &keys, SsdKey::spec);
        keys
    }
}

impl Run<MambaChunkScanCombinedVarlenArgs<'_>> for CudaBackend {
    type Error = CudaError;
    fn run(&self, call: Planned<MambaChunkScanCombinedVarlenArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let p = &plan;
        limits(p)?;
        let keys = self.ssd_keys(p, &args);
        let [state, cb, pass, scan, fin] = keys.map(|k| self.ssd_function(k));
        let (state, cb, pass, scan, fin) = (state?, cb?, pass?, scan?, fin?);
        let len = p.scratch_len();
        // The caller's scratch, or one allocated for this call (freed stream-ordered on drop).
        let owned;
        let ws = match (args.scratch.as_ref(), p.scratch_offset) {
            (Some(t), Some(off)) => addr_of(t.as_ref().device_addr(), off as isize, DType::F32),
            _ => {
                // SAFETY: the allocation is only read where the kernels wrote it first (every
                // scratch element they read is written by an earlier launch on this stream).
                owned = unsafe { self.stream().alloc::<f32>(len.max(1)) }
                    .map_err(CudaError::driver("cuMemAllocAsync(ssd scratch)"))?;
                let (a, _sync) = owned.device_ptr(self.stream());
                a
            }
        };
        let prm = params(p, &args, ws, self.error_word_addr());
        let ptiles = p.dim.div_ceil(TILE);
        let qtiles = p.chunk_rows.div_ceil(TILE);
        let per_seq = ((p.dim * p.dstate).div_ceil(STATE_THREADS * STATE_ELEMS)) as u32;
        let (heads, groups) = (p.heads as u32, p.groups as u32);
        let launch = |f: &cudarc::driver::CudaFunction, grid: (u32, u32, u32), threads: u32, name: &'static str| {
            // SAFETY: every address comes from a device view whose creator promised
            // (TensorRef/TensorMut::from_device_ptr) that it is valid on this device for the call,
            // or from the scratch of at least `scratch_len` f32 elements; the plan checked every
            // shape and stride, so every element the kernels reach for chunk bounds inside
            // `[0, tokens]` no longer than `chunk_rows`, sequence indices in `[0, batch)`,
            // `last_chunk_indices` in `[-1, nchunks)` and slots in `[0, slots)` lies inside the
            // views, and the kernels check exactly those values before using them.
            unsafe { self.launch_kernel(f, grid, threads, &prm, name) }
        };
        let chunks = grid_x(p.nchunks)?;
        let seqs = grid_x(p.batch)?;
        let st = STATE_THREADS as u32;
        // A tile kernel's grid: the tiles of one (chunk, head) along x next to each other, or
        // along z (`SsdTune::tiles_first`, the kernels' `block_tile`).
        let tile_grid = |key: &SsdKey, nc: u32, tiles: usize| -> Result<(u32, u32, u32), CudaError> {
            if key.tune.tiles_first {
                let x = grid_x(p.nchunks * tiles)?.unwrap_or(0);
                Ok((x, heads, 1))
            } else {
                Ok((nc, heads, tiles as u32))
            }
        };
        if let Some(nc) = chunks {
            let grid = tile_grid(&keys[0], nc, ptiles * p.dstate.div_ceil(TILE))?;
            launch(&state, grid, MMA_THREADS, "cuLaunchKernel(ssd_state)")?;
            let pairs = (qtiles * (qtiles + 1) / 2) as u32;
            launch(&cb, (nc, groups, pairs), MMA_THREADS, "cuLaunchKernel(ssd_cb)")?;
        }
        if let Some(b) = seqs {
            launch(&pass, (b, heads, per_seq), st, "cuLaunchKernel(ssd_pass)")?;
        }
        if let (Some(nc), true) = (chunks, p.out.is_some()) {
            let grid = tile_grid(&keys[3], nc, qtiles * ptiles)?;
            launch(&scan, grid, MMA_THREADS, "cuLaunchKernel(ssd_scan)")?;
        }
        if let Some(b) = seqs {
            launch(&fin, (b, heads, per_seq), st, "cuLaunchKernel(ssd_final)")?;
        }
        Ok(())
    }
}

/// The catalogue `cargo xtask build-kernels` compiles: vLLM's Mamba2 prefill (bf16
/// activations, f32 state, pool tables, D and dt_bias, softplus) and its variants (f16 and f32
/// operands, `initial_states`, intermediate states, z, bf16 state), each of the five kernels,
/// and the final kernel with checkpoints.
pub fn ssd_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, Bool, F16, F32, I32, I64};
    let key_tuned = |act: DType, state: DType, init_mode: u8, flags: u16, entry: SsdEntry, tune: SsdTune| {
        let op = match act {
            BF16 => 0,
            F16 => 1,
            _ => 2,
        };
        let types =
            [act, act, F32, act, act, act, act, F32, F32, state, state, I32, I32, I32, I32, Bool, I64, I64, I32];
        SsdKey { types, op, init_mode, flags, entry, tune }.spec()
    };
    let key = |act, state, init_mode, flags, entry| key_tuned(act, state, init_mode, flags, entry, SsdTune::of(entry));
    // Model shapes' dstate is a multiple of 8 (DENSE_STATE); the f16 variant keeps the general
    // state layout.
    let vec = F_X_VEC | F_B_VEC | F_C_VEC | F_DENSE;
    let pooled = F_D | F_BIAS | F_SOFTPLUS | F_HAS | F_FINAL | F_PAD | vec;
    let mut out = Vec::new();
    for entry in [SsdEntry::State, SsdEntry::Cb, SsdEntry::Pass, SsdEntry::Scan, SsdEntry::Final] {
        let name = entry.name();
        out.push((format!("ssd {name} act=bf16 state=f32 pool"), key(BF16, F32, 2, pooled, entry)));
        out.push((format!("ssd {name} act=f16 state=f16 init z"), key(F16, F16, 1, F_Z | F_VARLEN, entry)));
        out.push((
            format!("ssd {name} act=f32 state=f32 intermediate"),
            key(F32, F32, 0, F_VARLEN | F_INTERMEDIATE | F_D | vec, entry),
        ));
        out.push((format!("ssd {name} act=bf16 state=bf16 pool"), key(BF16, BF16, 2, pooled | F_VARLEN, entry)));
    }
    // Prefix-caching checkpoints change only the final kernel.
    out.push((
        "ssd ssd_final_kernel act=bf16 state=f32 pool checkpoint".to_string(),
        key(BF16, F32, 2, pooled | F_CKPT, SsdEntry::Final),
    ));
    // The tuning variants (`SSM_CUDA_SSD_TUNE`) of two activation types, so that both forms
    // compile: the scan's other form of the causal weights (`regw=…`), and the product
    // kernels' other slice width (`kt=…`, `scan_kt=…`).
    let scan = SsdTune::of(SsdEntry::Scan);
    let other_weights = SsdTune { reg_weights: !scan.reg_weights, ..scan };
    let mut variants = vec![(SsdEntry::Scan, other_weights, format!("regw={}", u8::from(other_weights.reg_weights)))];
    for entry in [SsdEntry::State, SsdEntry::Cb, SsdEntry::Scan] {
        let tune = SsdTune::of(entry);
        let other = SsdTune { kt: if tune.kt == 64 { 32 } else { 64 }, ..tune };
        variants.push((entry, other, format!("kt={}", other.kt)));
        let other = SsdTune { wgmma: !tune.wgmma, ..tune };
        variants.push((entry, other, format!("wgmma={}", u8::from(other.wgmma))));
    }
    for (entry, tune, label) in variants {
        for (act, state, init_mode, flags, what) in [
            (BF16, F32, 2, pooled, "act=bf16 state=f32 pool"),
            (F16, F16, 1, F_Z | F_VARLEN, "act=f16 state=f16 init z"),
        ] {
            let spec = key_tuned(act, state, init_mode, flags, entry, tune);
            out.push((format!("ssd {} {what} {label}", entry.name()), spec));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 22 addresses, 16 + 9 + 8 strides, pad, slots, 4 offsets; 12 ints and 2 floats.
        assert_eq!(std::mem::size_of::<SsdParams>(), (22 + 16 + 9 + 8 + 2 + 4) * 8 + 12 * 4 + 2 * 4);
        assert_eq!(std::mem::align_of::<SsdParams>(), 8);
    }

    #[test]
    fn catalogue_defines_every_macro() {
        for (label, spec) in ssd_catalogue() {
            assert_eq!(spec.defines.len(), 19 + 8 + 14, "{label}");
        }
    }
}
