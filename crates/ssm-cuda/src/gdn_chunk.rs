//! `chunk_gated_delta_rule` on CUDA: one launch of `kernels/gdn_chunk.cu`, one block per
//! (sequence, value head, tile of value rows), each walking its sequence's 64-token chunks with
//! the state tile in shared memory and every chunk product on tensor cores (`mma.sync`, f32
//! accumulation; bf16 operands for bf16 q/k/v, f16 for f16, tf32 for f32). No scratch, no
//! allocation, no host sync: the call is capturable as it stands.
//!
//! Device-resident `cu_seqlens`, `initial_state_indices` and `has_initial_state` are read and
//! checked in the kernel (error word); no access leaves the views the plan checked.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::CUfunction_attribute_enum;
use ssm_gdn::plan::ChunkPlan;
use ssm_gdn::{CHUNK_SIZE, ChunkGatedDeltaRuleArgs, StateLayout};
use ssm_tensor::{DType, Planned, Run, SlotTable, Strided, TensorRef};

use crate::compile::{KernelSource, KernelSpec, c_type, flag_defines};
use crate::gdn::Tok4;
use crate::{CudaBackend, CudaError, addr_of};

/// Threads of a block (`NTHREADS` in gdn_chunk.cu).
const THREADS: u32 = 256;
/// The largest `head_k_dim` the kernel holds (its shared-memory operands are `K`-wide).
pub const MAX_K: usize = 128;

/// The kernel's parameter block (`struct ChunkParams` in gdn_chunk.cu: same order, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct ChunkParams {
    /// q k v o g beta initial_state final_state initial_state_indices has_initial_state
    /// cu_seqlens, error word.
    addrs: [u64; 12],
    /// q k v o.
    tok: [Tok4; 4],
    /// g (b t h), beta (b t h).
    gates: [i64; 6],
    /// state row, final_state row, indices, has_initial_state, cu_seqlens strides.
    strides: [i64; 5],
    pad: i64,
    rows: i64,
    seqlen: i64,
    /// seqs v_heads vdim group vtiles reserved.
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
const F_ASYNC: u16 = 512;

const TYPE_MACROS: [&str; 11] = ["Q_T", "K_T", "V_T", "O_T", "G_T", "BETA_T", "ST_T", "FS_T", "IX_T", "HAS_T", "CU_T"];

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
    /// Value rows per block: 32 or 64.
    bv: u8,
    flags: u16,
}

impl ChunkKey {
    /// `head_k_dim` rounded up to the kernel's 64-column blocks.
    fn kp(&self) -> usize {
        (self.kdim as usize).div_ceil(64) * 64
    }

    /// Dynamic shared memory of one block, in bytes (the carving at the top of the kernel).
    fn shared_bytes(&self) -> usize {
        let (ch, kp, bv) = (CHUNK_SIZE, self.kp(), self.bv as usize);
        let (op, pad) = if self.op == 2 { (4, 4) } else { (2, 8) };
        let (ldk, ldc) = (kp + pad, ch + pad);
        let f32s = kp * (bv + 4) + ch * (ch + 1) + 3 * 256 + 5 * ch;
        let ops = bv * ldk + 3 * ch * ldk + kp * ldc + 2 * ch * ldc + 2 * bv * ldc;
        let [q, k, v] = [self.types[0], self.types[1], self.types[2]].map(|t| t.size());
        let staging = ch * kp * (q + k) + ch * bv * v;
        4 * f32s + op * ops + staging
    }

    /// The NVRTC specialisation.
    pub(crate) fn spec(&self) -> KernelSpec {
        let mut defines: Vec<(&'static str, String)> =
            TYPE_MACROS.iter().zip(self.types).map(|(m, t)| (*m, c_type(t).to_string())).collect();
        defines.push(("OP_KIND", self.op.to_string()));
        defines.push(("KDIM", self.kdim.to_string()));
        defines.push(("KP", self.kp().to_string()));
        defines.push(("BV", self.bv.to_string()));
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
                ("ASYNC", F_ASYNC),
            ],
        ));
        KernelSpec { source: KernelSource::GdnChunk, entry: "gdn_chunk_kernel", defines }
    }

    /// The key of a planned call; `sms` (the device's multiprocessor count) picks the tile:
    /// 32 value rows when 64-row tiles would leave multiprocessors idle, and always for f32
    /// q/k/v (whose operands take twice the shared memory).
    fn from_plan(p: &ChunkPlan, a: &ChunkGatedDeltaRuleArgs<'_>, sms: usize) -> ChunkKey {
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
        let ops = [p.q.1, p.k.1, p.v.1];
        let op = if ops.contains(&DType::BF16) {
            0
        } else if ops.contains(&DType::F16) {
            1
        } else {
            2
        };
        let d = p.dims;
        let bv = if op == 2 || d.seqs * d.v_heads * d.v.div_ceil(64) < sms { 32 } else { 64 };
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
            (rows_of_16_bytes(&a.q, p.q.0) && rows_of_16_bytes(&a.k, p.k.0) && rows_of_16_bytes(&a.v, p.v.0), F_ASYNC),
        ] {
            if on {
                flags |= f;
            }
        }
        ChunkKey { types, op, kdim: d.k as u16, bv, flags }
    }
}

/// Whether every row of a `[b, t, head, dim]` tensor starts 16-byte aligned with its elements
/// contiguous, so that the kernel may stage rows with 16-byte `cp.async` copies.
fn rows_of_16_bytes(t: &TensorRef<'_>, s: Strided<4>) -> bool {
    let es = t.dtype().size() as i128;
    let base = t.device_addr().unwrap_or(0) as i128 + s.offset as i128 * es;
    let [b, tt, h, d] = s.strides.map(|x| x as i128);
    d == 1 && [base, b * es, tt * es, h * es].iter().all(|x| x % 16 == 0)
}

/// Refuses what the kernel does not implement (nothing launched): `head_k_dim` past
/// [`MAX_K`], shared memory past the device's opt-in limit (f32 q/k/v with `K` > 64), and
/// counts past the kernel's 32-bit block index.
fn limits(p: &ChunkPlan, key: &ChunkKey, shared_limit: usize) -> Result<(), CudaError> {
    let d = p.dims;
    if d.k > MAX_K {
        return Err(CudaError::Unsupported(format!(
            "chunk_gated_delta_rule: head_k_dim K = {} (this kernel holds K ≤ {MAX_K})",
            d.k
        )));
    }
    if key.shared_bytes() > shared_limit {
        return Err(CudaError::Unsupported(format!(
            "chunk_gated_delta_rule: K = {} with {} q/k/v needs {} bytes of shared memory per block; the device \
             allows {shared_limit} (16-bit q/k/v hold K ≤ {MAX_K}, f32 K ≤ 64)",
            d.k,
            p.q.1,
            key.shared_bytes()
        )));
    }
    let blocks = d.seqs as u64 * d.v_heads as u64 * d.v.div_ceil(key.bv as usize) as u64;
    if blocks > i32::MAX as u64 || d.v > i32::MAX as usize || d.seqlen as u64 > i32::MAX as u64 {
        return Err(CudaError::Unsupported(format!(
            "chunk_gated_delta_rule: {} sequences × {} value heads × V = {} exceed the kernel's 32-bit counters",
            d.seqs, d.v_heads, d.v
        )));
    }
    Ok(())
}

/// The kernel's parameters.
fn params(p: &ChunkPlan, a: &ChunkGatedDeltaRuleArgs<'_>, vtiles: usize, err: u64) -> ChunkParams {
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
        dims: [d.seqs, d.v_heads, d.v, d.group(), vtiles, 0].map(|v| v as i32),
        scale: p.scale,
        eps: p.eps,
    }
}

impl CudaBackend {
    fn gdn_chunk_function(&self, key: ChunkKey) -> Result<cudarc::driver::CudaFunction, CudaError> {
        let f = self.gdn_chunk_functions.get_or_load(self, key, ChunkKey::spec)?;
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            key.shared_bytes() as i32,
        )
        .map_err(CudaError::driver("cuFuncSetAttribute(gdn_chunk_kernel shared memory)"))?;
        Ok(f)
    }

    /// [`prewarm`](Self::prewarm) for the kernel a `chunk_gated_delta_rule` call launches.
    pub fn prewarm_gdn_chunk(&self, call: &Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), CudaError> {
        let key = ChunkKey::from_plan(call.plan(), call.args(), self.sm_count());
        limits(call.plan(), &key, self.shared_optin())?;
        self.gdn_chunk_function(key).map(|_| ())
    }
}

impl Run<ChunkGatedDeltaRuleArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// One launch on the backend's stream; no allocation, no sync. `scratch` is not needed (and
    /// not touched) on CUDA.
    fn run(&self, call: Planned<ChunkGatedDeltaRuleArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        let p = &plan;
        let key = ChunkKey::from_plan(p, &args, self.sm_count());
        limits(p, &key, self.shared_optin())?;
        let d = p.dims;
        let vtiles = d.v.div_ceil(key.bv as usize);
        let blocks = d.seqs * d.v_heads * vtiles;
        if blocks == 0 {
            return Ok(());
        }
        let func = self.gdn_chunk_function(key)?;
        let prm = params(p, &args, vtiles, self.error_word_addr());
        // SAFETY: every address comes from a device view whose creator promised
        // (TensorRef/TensorMut::from_device_ptr) that it is valid on this device for the call;
        // the plan checked every shape and stride, so every element the kernel reaches for
        // `cu_seqlens` ranges inside [0, T] and slots inside [0, rows) lies inside the views,
        // and the kernel checks exactly those values before using them. The shared memory
        // given is what the kernel carves (`ChunkKey::shared_bytes`), within the opt-in limit.
        unsafe {
            self.launch_kernel_shared(
                &func,
                (blocks as u32, 1, 1),
                THREADS,
                key.shared_bytes() as u32,
                &prm,
                "cuLaunchKernel(gdn_chunk_kernel)",
            )
        }
    }
}

impl ssm_gdn::ChunkScratch for CudaBackend {
    /// The CUDA kernel keeps each chunk's intermediates in shared memory: no scratch.
    fn chunk_gated_delta_rule_scratch_size(&self, _plan: &ChunkPlan) -> usize {
        0
    }
}

/// The catalogue `cargo xtask build-kernels` compiles: Qwen3-Next's prefill (bf16 q/k/v, K = V
/// = 128, an f32 or bf16 pool through `initial_state_indices` with `has_initial_state`, in
/// place, l2norm, varlen) in both tile widths, and the f16 and f32 variants of the vectors.
pub fn gdn_chunk_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, Bool, F16, F32, I32};
    let pool = F_L2NORM | F_STATE | F_IX | F_HAS | F_PAD | F_INPLACE | F_VARLEN | F_ASYNC;
    let dense = F_L2NORM | F_STATE | F_FINAL | F_VARLEN;
    let key = |io: DType, beta: DType, state: DType, kdim: u16, bv: u8, flags: u16| {
        let op = match io {
            BF16 => 0,
            F16 => 1,
            _ => 2,
        };
        let spec = ChunkKey { types: [io, io, io, io, F32, beta, state, F32, I32, Bool, I32], op, kdim, bv, flags };
        spec.spec()
    };
    vec![
        ("gdn_chunk act=bf16 state=f32 pool K=128 bv=64".into(), key(BF16, F32, F32, 128, 64, pool)),
        ("gdn_chunk act=bf16 state=f32 pool K=128 bv=32".into(), key(BF16, F32, F32, 128, 32, pool)),
        ("gdn_chunk act=bf16 state=bf16 pool K=128 bv=64".into(), key(BF16, F32, BF16, 128, 64, pool)),
        ("gdn_chunk act=f16 state=f32 dense K=64 bv=32".into(), key(F16, F16, F32, 64, 32, dense)),
        ("gdn_chunk act=f32 state=f32 K=64 kv".into(), key(F32, F32, F32, 64, 32, F_STATE | F_FINAL | F_KV)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 12 addresses, 16 token strides, 6 gate strides, 5 strides, pad rows seqlen; 6 ints, 2 floats.
        assert_eq!(std::mem::size_of::<ChunkParams>(), (12 + 16 + 6 + 5 + 3) * 8 + 6 * 4 + 2 * 4);
        assert_eq!(std::mem::align_of::<ChunkParams>(), 8);
    }

    #[test]
    fn catalogue_defines_every_macro_and_fits_an_sm90_block() {
        for (label, spec) in gdn_chunk_catalogue() {
            assert_eq!(spec.defines.len(), 11 + 4 + 10, "{label}");
        }
        // Qwen3-Next's shape in 64-row tiles, and f32 q/k/v at K = 64 (32-row tiles), fit the
        // 227 KiB opt-in; f32 q/k/v at K = 128 do not.
        let key = |io, op, kdim, bv| ChunkKey { types: [io; 11], op, kdim, bv, flags: 0 };
        assert_eq!(key(DType::BF16, 0, 128, 64).shared_bytes(), 221_696);
        assert!(key(DType::F32, 2, 64, 32).shared_bytes() <= 227 * 1024);
        assert!(key(DType::F32, 2, 128, 32).shared_bytes() > 227 * 1024);
    }
}
