//! `chunk_gated_delta_rule` on CUDA: four launches of `kernels/gdn_chunk.cu` over one
//! plan-sized scratch, split as FLA splits its prefill. An index kernel checks every
//! device-resident `cu_seqlens` range, `initial_state_indices` slot and `has_initial_state` flag
//! and numbers the live sequences' 64-token chunks; a prep kernel computes, for every (chunk,
//! value head) in parallel, the chunk's gates, (I + A)⁻¹, W and Uᵀ; a state kernel walks each
//! (sequence, value head, tile of value rows) through its chunks in order with the f32 state in
//! registers; an output kernel computes every chunk's output in parallel. Every product runs on
//! tensor cores (`mma.sync`, f32 accumulation; bf16 operands for bf16 q/k/v, f16 for f16, tf32
//! for f32). With the caller's `scratch` of at least
//! [`chunk_gated_delta_rule_scratch_size`](ssm_gdn::ChunkScratch::chunk_gated_delta_rule_scratch_size)
//! elements nothing is allocated and nothing syncs, so the call is capturable; without one the
//! call allocates its scratch stream-ordered (`cuMemAllocAsync`) and frees it after the launches.
//!
//! Invalid device values are reported in the error word and their sequences skipped; no access
//! leaves the views the plan checked or the scratch.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{DevicePtr, DeviceRepr};
use ssm_gdn::plan::ChunkPlan;
use ssm_gdn::{CHUNK_SIZE, ChunkGatedDeltaRuleArgs, StateLayout};
use ssm_tensor::{DType, Planned, Run, SlotTable, TensorRef};

use crate::compile::{KernelSource, KernelSpec, WGMMA_ASKED, c_type, flag_defines};
use crate::gdn::Tok4;
use crate::geometry::TuneVar;
use crate::{CudaBackend, CudaError, addr_of};

/// Threads of a block (`NTHREADS` in gdn_chunk.cu).
const THREADS: u32 = 256;
/// The largest `head_k_dim` the kernels hold (their shared-memory operands are `K`-wide).
pub const MAX_K: usize = 128;
/// Value rows of an output block (`VO` in gdn_chunk.cu).
const OUT_ROWS: usize = 128;
/// Alignment of the scratch's regions (and slack for aligning the caller's base), bytes.
const ALIGN: usize = 256;

/// The kernels' parameter block (`struct ChunkParams` in gdn_chunk.cu: same order, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct ChunkParams {
    /// q k v o g beta initial_state final_state initial_state_indices has_initial_state
    /// cu_seqlens, error word, scratch (aligned).
    addrs: [u64; 13],
    /// q k v o.
    tok: [Tok4; 4],
    /// g (b t h), beta (b t h).
    gates: [i64; 6],
    /// state row, final_state row, indices, has_initial_state, cu_seqlens strides.
    strides: [i64; 5],
    pad: i64,
    rows: i64,
    seqlen: i64,
    /// Chunks the scratch holds.
    nb: i64,
    /// Byte offsets of the scratch regions: sequences, chunk map, W, q and k rows, Uᵀ, H, G.
    offs: [i64; 7],
    /// seqs v_heads vdim group vtiles vp.
    dims: [i32; 6],
    scale: f32,
    eps: f32,
}

// SAFETY: `ChunkParams` is `#[repr(C)]` plain old data (Pod: no padding, addresses as integers)
// laid out as `struct ChunkParams` in gdn_chunk.cu.
unsafe impl DeviceRepr for ChunkParams {}

const F_L2NORM: u16 = 1;
const F_STATE: u16 = 2;
const F_IX: u16 = 4;
const F_HAS: u16 = 8;
const F_PAD: u16 = 16;
const F_INPLACE: u16 = 32;
const F_FINAL: u16 = 64;
const F_VARLEN: u16 = 128;
const F_KV: u16 = 256;

const TYPE_MACROS: [&str; 11] = ["Q_T", "K_T", "V_T", "O_T", "G_T", "BETA_T", "ST_T", "FS_T", "IX_T", "HAS_T", "CU_T"];

/// The four entry points, in launch order (`ENTRY` in gdn_chunk.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ChunkEntry {
    /// One block: checks and numbers the sequences' chunks.
    Index,
    /// Per (chunk, value head): gates, (I + A)⁻¹, W, Uᵀ.
    Prep,
    /// Per (sequence, value head, value tile): the state recurrence.
    State,
    /// Per (chunk, value head, 64 value rows): the output.
    Out,
}

impl ChunkEntry {
    const ALL: [ChunkEntry; 4] = [ChunkEntry::Index, ChunkEntry::Prep, ChunkEntry::State, ChunkEntry::Out];

    fn name(self) -> &'static str {
        match self {
            ChunkEntry::Index => "gdn_chunk_index_kernel",
            ChunkEntry::Prep => "gdn_chunk_prep_kernel",
            ChunkEntry::State => "gdn_chunk_state_kernel",
            ChunkEntry::Out => "gdn_chunk_out_kernel",
        }
    }
}

/// The products' operand type for q/k/v of these dtypes (`OP_KIND`): 0 bf16 when any is bf16,
/// else 1 f16 when any is f16, else 2 tf32.
fn op_kind(qkv: [DType; 3]) -> u8 {
    if qkv.contains(&DType::BF16) {
        0
    } else if qkv.contains(&DType::F16) {
        1
    } else {
        2
    }
}

/// Bytes of one operand of kind `op` (tf32 operands are kept as f32).
fn op_bytes(op: u8) -> usize {
    if op == 2 { 4 } else { 2 }
}

/// Everything that selects one compiled chunked-prefill kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ChunkKey {
    /// q k v o g beta initial_state final_state, then initial_state_indices has_initial_state
    /// cu_seqlens (F32 / I32 where absent).
    types: [DType; 11],
    /// 0 bf16, 1 f16, 2 tf32 operands.
    op: u8,
    /// `head_k_dim`.
    kdim: u16,
    /// Value rows per state block: 16 or 32 (0 in the other entries' keys).
    bv: u8,
    flags: u16,
    entry: ChunkEntry,
    /// The output entry's products on Hopper's `wgmma` (`WGMMA_ASKED`), asked for by
    /// `SSM_CUDA_GDN_CHUNK_TUNE=wg=1` (operand tiles staged a core matrix at a time, eight
    /// threads down its rows) or `wg=2` (staged along the global rows, `OUT_STAGE_ROWS`); 0:
    /// `mma.sync`, the default (docs/PERF.md: slower on an H100). Compiled for sm_90a where the
    /// device is sm_90 (`KernelSpec::target`); elsewhere, and for tf32 operands, the kernel
    /// keeps `mma.sync`. 0 in the other entries' keys.
    wgmma: u8,
}

/// The output entry's `wgmma` form (`ChunkKey::wgmma`; `SSM_CUDA_GDN_CHUNK_TUNE=wg=0|1|2`, a
/// tuning switch, unset in normal use).
fn out_wgmma() -> u8 {
    static TUNE: TuneVar = TuneVar::new("SSM_CUDA_GDN_CHUNK_TUNE");
    TUNE.get("wg").map_or(DEFAULT_OUT_WGMMA, |v| v.min(2) as u8)
}

/// The output entry's form by default: `mma.sync` (the `wgmma` forms were slower on an H100,
/// docs/PERF.md, "Both `wgmma` forms on an H100").
const DEFAULT_OUT_WGMMA: u8 = 0;

impl ChunkKey {
    /// `head_k_dim` rounded up to the kernel's 64-column blocks.
    fn kp(&self) -> usize {
        (self.kdim as usize).div_ceil(64) * 64
    }

    /// Dynamic shared memory of one block, in bytes (the carving at the top of each entry).
    fn shared_bytes(&self) -> usize {
        let (ch, kp, bv) = (CHUNK_SIZE, self.kp(), self.bv as usize);
        let pad = if self.op == 2 { 4 } else { 8 };
        let (ldk, ldc, lda, op) = (kp + pad, ch + pad, ch + 1, op_bytes(self.op));
        match self.entry {
            ChunkEntry::Index => 0,
            ChunkEntry::Prep => op * (2 * ch * ldk + ch * ldc + 64 * ldc) + 4 * (ch * lda + 3 * 256 + 3 * ch),
            ChunkEntry::State => op * (4 * ch * ldk + 2 * bv * ldc + bv * ldk + bv * ldc) + 4 * 2 * ch,
            ChunkEntry::Out => op * (OUT_ROWS * ldk + OUT_ROWS * ldc + 2 * ch * ldk + ch * ldc) + 4 * ch,
        }
    }

    /// The NVRTC specialisation.
    pub(crate) fn spec(&self) -> KernelSpec {
        let mut defines: Vec<(&'static str, String)> =
            TYPE_MACROS.iter().zip(self.types).map(|(m, t)| (*m, c_type(t).to_string())).collect();
        defines.push(("ENTRY", (self.entry as u8).to_string()));
        defines.push(("OP_KIND", self.op.to_string()));
        defines.push(("KDIM", self.kdim.to_string()));
        defines.push(("KP", self.kp().to_string()));
        defines.push(("BV", self.bv.to_string()));
        if self.wgmma > 0 {
            defines.push((WGMMA_ASKED, "1".to_string()));
        }
        if self.wgmma == 2 {
            defines.push(("OUT_STAGE_ROWS", "1".to_string()));
        }
        defines.extend(flag_defines(
            self.flags,
            &[
                ("L2NORM", F_L2NORM),
                ("HAS_STATE", F_STATE),
                ("HAS_IX", F_IX),
                ("HAS_HAS", F_HAS),
                ("HAS_PAD", F_PAD),
                ("INPLACE", F_INPLACE),
                ("HAS_FINAL", F_FINAL),
                ("VARLEN", F_VARLEN),
                ("LAYOUT_KV", F_KV),
            ],
        ));
        KernelSpec { source: KernelSource::GdnChunk, entry: self.entry.name(), defines }
    }

    /// The key of `entry` of a planned call; `sms` (the device's multiprocessor count) picks
    /// the state tile: 32 value rows unless that leaves most multiprocessors idle, then 16.
    fn from_plan(p: &ChunkPlan, a: &ChunkGatedDeltaRuleArgs<'_>, sms: usize, entry: ChunkEntry) -> ChunkKey {
        let opt = |t: Option<&TensorRef<'_>>, absent: DType| t.map_or(absent, |t| t.dtype());
        let types = [
            p.q.1,
            p.k.1,
            p.v.1,
            p.o.1,
            p.g.1,
            p.beta.1,
            p.state.map_or(DType::F32, |s| s.dtype),
            p.final_state.map_or(DType::F32, |s| s.dtype),
            opt(a.initial_state_indices.as_ref(), DType::I32),
            opt(a.has_initial_state.as_ref(), DType::I32),
            opt(a.cu_seqlens.as_ref(), DType::I32),
        ];
        let op = op_kind([p.q.1, p.k.1, p.v.1]);
        let d = p.dims;
        let bv = match entry {
            // 32 value rows (two blocks fit a multiprocessor); 16 only when 32 would leave more
            // than half of the multiprocessors idle (16-row blocks restage the same W and k
            // rows twice as often: slower on the H200 at one sequence of Qwen3-Next, 351 µs
            // against 297 µs for 8192 tokens).
            ChunkEntry::State if 2 * d.seqs * d.v_heads * d.v.div_ceil(32) >= sms => 32,
            ChunkEntry::State => 16,
            _ => 0,
        };
        let mut flags = 0u16;
        for (on, f) in [
            (p.l2norm, F_L2NORM),
            (p.state.is_some(), F_STATE),
            (p.indices.is_some(), F_IX),
            (p.has_initial_state.is_some(), F_HAS),
            (p.pad_slot_id.is_some() && p.indices.is_some(), F_PAD),
            (p.inplace, F_INPLACE),
            (p.final_state.is_some(), F_FINAL),
            (p.cu_seqlens.is_some(), F_VARLEN),
            (p.layout == StateLayout::KV, F_KV),
        ] {
            if on {
                flags |= f;
            }
        }
        let wgmma = if entry == ChunkEntry::Out { out_wgmma() } else { 0 };
        ChunkKey { types, op, kdim: d.k as u16, bv, flags, entry, wgmma }
    }
}

/// Where each region of the scratch lies, in bytes from its (256-byte aligned) start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ScratchLayout {
    /// Chunks the scratch holds: every live sequence's chunks fit (`⌈T / 64⌉ + N` with
    /// `cu_seqlens`, `N·⌈T / 64⌉` without).
    nb: usize,
    /// `V` rounded up to 64.
    vp: usize,
    /// Offsets: sequences (32 bytes each), chunk map (8 bytes per chunk), W, normalised q and k
    /// rows, Uᵀ, H, G.
    offs: [usize; 7],
    /// Bytes in all.
    bytes: usize,
}

impl ScratchLayout {
    /// The layout for a plan; `None` when its size overflows `usize`.
    fn new(p: &ChunkPlan) -> Option<ScratchLayout> {
        let d = p.dims;
        let op = op_bytes(op_kind([p.q.1, p.k.1, p.v.1]));
        let ch = CHUNK_SIZE;
        let per_seq = d.seqlen.div_ceil(ch);
        let nb = if p.cu_seqlens.is_some() { per_seq.checked_add(d.seqs)? } else { per_seq.checked_mul(d.seqs)? };
        let kp = d.k.div_ceil(64) * 64;
        let vp = d.v.div_ceil(64) * 64;
        let per_chunk = |x: usize| nb.checked_mul(x);
        let sizes = [
            d.seqs.checked_mul(32)?,
            per_chunk(8)?,
            per_chunk(d.v_heads * ch * kp * op)?,
            per_chunk(d.heads * 2 * ch * kp * op)?,
            per_chunk(d.v_heads.checked_mul(vp * ch * op)?)?,
            per_chunk(d.v_heads.checked_mul(vp * kp * op)?)?,
            per_chunk(d.v_heads * ch * 4)?,
        ];
        let mut offs = [0usize; 7];
        let mut at = 0usize;
        for (o, s) in offs.iter_mut().zip(sizes) {
            *o = at;
            at = at.checked_add(s.checked_next_multiple_of(ALIGN)?)?;
        }
        Some(ScratchLayout { nb, vp, offs, bytes: at })
    }

    /// f32 elements a caller's scratch needs: the regions and the slack for aligning its base.
    fn f32_len(&self) -> usize {
        (self.bytes + ALIGN).div_ceil(4)
    }
}

/// Refuses what the kernels do not implement (nothing launched): `head_k_dim` past
/// [`MAX_K`], shared memory past the device's opt-in limit, counts past the kernels' 32-bit
/// block indices, and a scratch whose size overflows.
fn limits(p: &ChunkPlan, keys: &[ChunkKey; 4], shared_limit: usize) -> Result<ScratchLayout, CudaError> {
    let d = p.dims;
    if d.k > MAX_K {
        return Err(CudaError::Unsupported(format!(
            "chunk_gated_delta_rule: head_k_dim K = {} (these kernels hold K ≤ {MAX_K})",
            d.k
        )));
    }
    for key in keys {
        if key.shared_bytes() > shared_limit {
            return Err(CudaError::Unsupported(format!(
                "chunk_gated_delta_rule: K = {} with {} q/k/v needs {} bytes of shared memory per block in {}; the \
                 device allows {shared_limit}",
                d.k,
                p.q.1,
                key.shared_bytes(),
                key.entry.name()
            )));
        }
    }
    let too_big = || {
        CudaError::Unsupported(format!(
            "chunk_gated_delta_rule: {} sequences × {} tokens × {} value heads × V = {} exceed the kernels' 32-bit \
             counters or the scratch's size",
            d.seqs, d.seqlen, d.v_heads, d.v
        ))
    };
    let layout = ScratchLayout::new(p).ok_or_else(too_big)?;
    let bv = keys[2].bv as usize;
    let state_blocks = d.seqs as u64 * d.v_heads as u64 * d.v.div_ceil(bv) as u64;
    let i32max = i32::MAX as u64;
    if state_blocks > i32max
        || layout.nb as u64 > i32max
        || d.seqs as u64 > i32max
        || d.seqlen as u64 > i32max
        || d.v_heads > 65535
        || layout.vp.div_ceil(OUT_ROWS) > 65535
    {
        return Err(too_big());
    }
    Ok(layout)
}

/// The kernels' parameters; `ws` is the scratch's aligned device address.
fn params(
    p: &ChunkPlan,
    a: &ChunkGatedDeltaRuleArgs<'_>,
    layout: &ScratchLayout,
    vtiles: usize,
    err: u64,
    ws: u64,
) -> ChunkParams {
    let addr = |t: &TensorRef<'_>, off: isize| addr_of(t.device_addr(), off, t.dtype());
    let table = |t: Option<&TensorRef<'_>>, s: Option<SlotTable>| match (t, s) {
        (Some(t), Some(s)) => (addr(t, s.strides.offset), s.strides.strides[0] as i64),
        _ => (0, 0),
    };
    let state = a.initial_state.as_ref().map(|t| t.as_ref());
    let fin = a.final_state.as_ref().map(|t| t.as_ref());
    let (st, st_row) = match (state.as_ref(), p.state) {
        (Some(t), Some(v)) => (addr(t, v.offset as isize), v.row_stride as i64),
        _ => (0, 0),
    };
    let (fs, fs_row) = match (fin.as_ref(), p.final_state) {
        (Some(t), Some(v)) => (addr(t, v.offset as isize), v.row_stride as i64),
        _ => (0, 0),
    };
    let (ix, ix_s) = table(a.initial_state_indices.as_ref(), p.indices);
    let (has, has_s) = table(a.has_initial_state.as_ref(), p.has_initial_state);
    let (cu, cu_s) = table(a.cu_seqlens.as_ref(), p.cu_seqlens);
    let o = a.o.as_ref();
    let d = p.dims;
    ChunkParams {
        addrs: [
            addr(&a.q, p.q.0.offset),
            addr(&a.k, p.k.0.offset),
            addr(&a.v, p.v.0.offset),
            addr(&o, p.o.0.offset),
            addr(&a.g, p.g.0.offset),
            addr(&a.beta, p.beta.0.offset),
            st,
            fs,
            ix,
            has,
            cu,
            err,
            ws,
        ],
        tok: [(&p.q.0).into(), (&p.k.0).into(), (&p.v.0).into(), (&p.o.0).into()],
        gates: [
            p.g.0.strides[0],
            p.g.0.strides[1],
            p.g.0.strides[2],
            p.beta.0.strides[0],
            p.beta.0.strides[1],
            p.beta.0.strides[2],
        ]
        .map(|v| v as i64),
        strides: [st_row, fs_row, ix_s, has_s, cu_s],
        pad: p.pad_slot_id.unwrap_or(0),
        rows: p.state.map_or(0, |s| s.rows as i64),
        seqlen: d.seqlen as i64,
        nb: layout.nb as i64,
        offs: layout.offs.map(|o| o as i64),
        dims: [d.seqs, d.v_heads, d.v, d.group(), vtiles, layout.vp].map(|v| v as i32),
        scale: p.scale,
        eps: p.eps,
    }
}

impl CudaBackend {
    fn gdn_chunk_function(&self, key: ChunkKey) -> Result<cudarc::driver::CudaFunction, CudaError> {
        let f = self.gdn_chunk_functions.get_or_load(self, key, ChunkKey::spec)?;
        if key.shared_bytes() > 48 * 1024 {
            f.set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                key.shared_bytes() as i32,
            )
            .map_err(CudaError::driver("cuFuncSetAttribute(gdn_chunk shared memory)"))?;
        }
        Ok(f)
    }

    fn gdn_chunk_keys(&self, call: &Planned<ChunkGatedDeltaRuleArgs<'_>>) -> [ChunkKey; 4] {
        ChunkEntry::ALL.map(|e| ChunkKey::from_plan(call.plan(), call.args(), self.sm_count(), e))
    }

    /// The four kernels of a call that passed `limits`, loaded (compiled together where any is
    /// not loaded yet).
    fn gdn_chunk_functions_of(&self, keys: [ChunkKey; 4]) -> [Result<cudarc::driver::CudaFunction, CudaError>; 4] {
        self.gdn_chunk_functions.precompile(self, &keys, ChunkKey::spec);
        keys.map(|k| self.gdn_chunk_function(k))
    }

    /// [`prewarm`](Self::prewarm) for the four kernels a `chunk_gated_delta_rule` call launches.
    pub fn prewarm_gdn_chunk(&self, call: &Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), CudaError> {
        let keys = self.gdn_chunk_keys(call);
        limits(call.plan(), &keys, self.shared_optin())?;
        for f in self.gdn_chunk_functions_of(keys) {
            f?;
        }
        Ok(())
    }
}

impl Run<ChunkGatedDeltaRuleArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// Four launches on the backend's stream, no sync; no allocation when the caller's
    /// `scratch` holds at least the size query's elements (else one stream-ordered allocation).
    fn run(&self, call: Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let keys = self.gdn_chunk_keys(&call);
        let (args, plan) = call.into_parts();
        let p = &plan;
        let layout = limits(p, &keys, self.shared_optin())?;
        let d = p.dims;
        if d.seqs == 0 || d.v_heads == 0 || d.v == 0 {
            return Ok(());
        }
        let funcs = self.gdn_chunk_functions_of(keys);
        let [index, prep, state, out] = funcs;
        let (index, prep, state, out) = (index?, prep?, state?, out?);
        let vtiles = d.v.div_ceil(keys[2].bv as usize);
        // The caller's scratch when it is large enough, or one allocated for this call (freed
        // stream-ordered on drop).
        let owned;
        let base = match args.scratch.as_ref() {
            Some(t) if p.scratch_len >= layout.f32_len() => {
                addr_of(t.as_ref().device_addr(), t.layout().offset() as isize, DType::F32)
            }
            _ => {
                // SAFETY: the allocation is only read where the kernels wrote it first: the
                // index kernel writes every sequence and chunk entry; the prep and state
                // kernels write every W, Kᵀ, Uᵀ, G and H element the later launches read.
                owned = unsafe { self.stream().alloc::<u8>(layout.bytes + ALIGN) }
                    .map_err(CudaError::driver("cuMemAllocAsync(gdn_chunk scratch)"))?;
                let (a, _sync) = owned.device_ptr(self.stream());
                a
            }
        };
        let ws = base.next_multiple_of(ALIGN as u64);
        let prm = params(p, &args, &layout, vtiles, self.error_word_addr(), ws);
        let launch = |f: &cudarc::driver::CudaFunction, key: &ChunkKey, grid: (u32, u32, u32), name: &'static str| {
            // SAFETY: every address comes from a device view whose creator promised
            // (TensorRef/TensorMut::from_device_ptr) that it is valid on this device for the
            // call, or from the scratch of at least `layout.bytes` bytes past `ws`; the plan
            // checked every shape and stride, so every element the kernels reach for
            // `cu_seqlens` ranges inside [0, T] and slots inside [0, rows) lies inside the
            // views, the index kernel checks exactly those values before any use, and chunk
            // numbers stay below `nb`. The shared memory given is what each kernel carves
            // (`ChunkKey::shared_bytes`), within the opt-in limit.
            unsafe { self.launch_kernel_shared(f, grid, THREADS, key.shared_bytes() as u32, &prm, name) }
        };
        let (nb, hv) = (layout.nb as u32, d.v_heads as u32);
        launch(&index, &keys[0], (1, 1, 1), "cuLaunchKernel(gdn_chunk_index)")?;
        if nb > 0 {
            launch(&prep, &keys[1], (nb, hv, 1), "cuLaunchKernel(gdn_chunk_prep)")?;
        }
        launch(&state, &keys[2], ((d.seqs * d.v_heads * vtiles) as u32, 1, 1), "cuLaunchKernel(gdn_chunk_state)")?;
        if nb > 0 {
            launch(&out, &keys[3], (nb, hv, layout.vp.div_ceil(OUT_ROWS) as u32), "cuLaunchKernel(gdn_chunk_out)")?;
        }
        Ok(())
    }
}

impl ssm_gdn::ChunkScratch for CudaBackend {
    /// The scratch of the four kernels: per chunk of the plan's bound, W, the normalised q and k
    /// rows, Uᵀ (then V'ᵀ), the state at the chunk's start and G in the operand type (f32 for G),
    /// plus the sequence table and chunk map. 0 for a plan whose scratch would overflow.
    fn chunk_gated_delta_rule_scratch_size(&self, plan: &ChunkPlan) -> usize {
        ScratchLayout::new(plan).map_or(0, |l| l.f32_len())
    }
}

/// The catalogue `cargo xtask build-kernels` compiles, each of the four kernels: Qwen3-Next's
/// prefill (bf16 q/k/v, K = V = 128, an f32 or bf16 pool through `initial_state_indices` with
/// `has_initial_state`, in place, l2norm, varlen) in the state tile widths, and the f16 and f32
/// variants of the vectors.
pub fn gdn_chunk_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, Bool, F16, F32, I32};
    let pool = F_L2NORM | F_STATE | F_IX | F_HAS | F_PAD | F_INPLACE | F_VARLEN;
    let dense = F_L2NORM | F_STATE | F_FINAL | F_VARLEN;
    let key_wg = |io: DType, beta: DType, state: DType, kdim: u16, bv: u8, flags: u16, entry: ChunkEntry, wgmma| {
        let op = op_kind([io; 3]);
        let bv = if entry == ChunkEntry::State { bv } else { 0 };
        let types = [io, io, io, io, F32, beta, state, F32, I32, Bool, I32];
        ChunkKey { types, op, kdim, bv, flags, entry, wgmma }.spec()
    };
    let key = |io, beta, state, kdim, bv, flags, entry| key_wg(io, beta, state, kdim, bv, flags, entry, 0);
    let mut out = Vec::new();
    for entry in ChunkEntry::ALL {
        let name = entry.name();
        let widths: &[u8] = if entry == ChunkEntry::State { &[32, 16] } else { &[0] };
        for &bv in widths {
            out.push((
                format!("{name} act=bf16 state=f32 pool K=128 bv={bv}"),
                key(BF16, F32, F32, 128, bv, pool, entry),
            ));
            out.push((
                format!("{name} act=bf16 state=bf16 pool K=128 bv={bv}"),
                key(BF16, F32, BF16, 128, bv, pool, entry),
            ));
        }
        if entry == ChunkEntry::Out {
            // The `wgmma` forms (SSM_CUDA_GDN_CHUNK_TUNE=wg=1|2), compile-checked beside the default.
            for wg in [1, 2] {
                out.push((
                    format!("{name} act=bf16 state=f32 pool K=128 wgmma={wg}"),
                    key_wg(BF16, F32, F32, 128, 0, pool, entry, wg),
                ));
            }
        }
        out.push((format!("{name} act=f16 state=f32 dense K=64"), key(F16, F16, F32, 64, 16, dense, entry)));
        out.push((
            format!("{name} act=f32 state=f32 K=64 kv"),
            key(F32, F32, F32, 64, 16, F_STATE | F_FINAL | F_KV, entry),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 13 addresses, 16 token strides, 6 gate strides, 5 strides, pad rows seqlen nb, 7
        // offsets; 6 ints, 2 floats.
        assert_eq!(std::mem::size_of::<ChunkParams>(), (13 + 16 + 6 + 5 + 4 + 7) * 8 + 6 * 4 + 2 * 4);
        assert_eq!(std::mem::align_of::<ChunkParams>(), 8);
    }

    #[test]
    fn scratch_layout_holds_every_live_chunk_in_aligned_disjoint_regions() {
        use ssm_conformance::gdn_random::{ChunkCase, ChunkSpec};
        for i in 0..8 {
            let mut case = ChunkCase::random(ChunkSpec::matrix(i), 3 + i as u64);
            let lens = case.lens.clone();
            let planned = Planned::new(case.args()).unwrap();
            let p = planned.plan();
            let (d, l) = (p.dims, ScratchLayout::new(p).unwrap());
            let per_seq = d.seqlen.div_ceil(CHUNK_SIZE);
            let bound = if p.cu_seqlens.is_some() { per_seq + d.seqs } else { per_seq * d.seqs };
            assert_eq!(l.nb, bound, "case {i}");
            let live: usize = lens.iter().map(|n| n.div_ceil(CHUNK_SIZE)).sum();
            assert!(live <= l.nb, "case {i}: {live} chunks, room for {}", l.nb);
            assert_eq!(l.vp % 64, 0);
            assert!(l.vp >= d.v && l.vp < d.v + 64);
            // In order, 256-byte aligned, each at least as large as the kernel indexes it.
            let op = if [p.q.1, p.k.1, p.v.1].iter().any(|t| t.size() == 2) { 2 } else { 4 };
            let kp = d.k.div_ceil(64) * 64;
            let sizes = [
                d.seqs * 32,
                l.nb * 8,
                l.nb * d.v_heads * CHUNK_SIZE * kp * op,
                l.nb * d.heads * 2 * CHUNK_SIZE * kp * op,
                l.nb * d.v_heads * l.vp * CHUNK_SIZE * op,
                l.nb * d.v_heads * l.vp * kp * op,
                l.nb * d.v_heads * CHUNK_SIZE * 4,
            ];
            let ends: Vec<usize> = l.offs[1..].iter().copied().chain([l.bytes]).collect();
            for ((o, e), s) in l.offs.iter().zip(&ends).zip(sizes) {
                assert_eq!(o % ALIGN, 0, "case {i}");
                assert!(o + s <= *e, "case {i}: region at {o} of {s} bytes overlaps the next at {e}");
            }
            // The size query leaves room to align any 4-byte aligned base.
            assert!(l.f32_len() * 4 >= l.bytes + ALIGN - 4);
        }
    }

    #[test]
    fn catalogue_defines_every_macro_and_fits_an_sm90_block() {
        let mut wgmma = Vec::new();
        for (label, spec) in gdn_chunk_catalogue() {
            let wg = spec.defines.iter().any(|(k, v)| *k == WGMMA_ASKED && v == "1");
            let rows = spec.defines.iter().any(|(k, _)| *k == "OUT_STAGE_ROWS");
            assert_eq!(spec.defines.len(), 11 + 5 + 9 + usize::from(wg) + usize::from(rows), "{label}");
            if wg {
                wgmma.push(spec.entry);
            }
        }
        // The output entry's two `wgmma` forms are compile-checked beside the default.
        assert_eq!(wgmma, ["gdn_chunk_out_kernel"; 2]);
        // Every entry of Qwen3-Next's shape, and of f32 q/k/v at K = 128 in 32-row state
        // tiles, fits the 227 KiB opt-in (the state kernel's 32-row tile: two blocks per SM).
        let key = |io, op, kdim, bv, entry| ChunkKey { types: [io; 11], op, kdim, bv, flags: 0, entry, wgmma: 0 };
        for entry in ChunkEntry::ALL {
            assert!(key(DType::BF16, 0, 128, 64, entry).shared_bytes() <= 227 * 1024, "{entry:?}");
            assert!(key(DType::F32, 2, 128, 32, entry).shared_bytes() <= 227 * 1024, "{entry:?}");
        }
        assert_eq!(
            key(DType::BF16, 0, 128, 32, ChunkEntry::State).shared_bytes(),
            2 * (4 * 64 * 136 + 2 * 32 * 72 + 32 * 136 + 32 * 72) + 512
        );
    }
}
