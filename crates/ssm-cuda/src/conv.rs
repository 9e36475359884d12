//! `impl Run<CausalConv1dUpdateArgs>` and `impl Run<CausalConv1dFnArgs>` for [`CudaBackend`]:
//! each maps a checked [`ConvPlan`] (plus the call's index tables, which live on the device
//! and are checked by the kernel) onto one launch of `kernels/conv.cu`, specialised for the
//! dtype, width, channel vector, layout and flags.

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvOp, ConvPlan};
use ssm_tensor::{DType, Planned, Run, TensorMut, TensorRef};

use crate::compile::{KernelSource, KernelSpec, c_type, flag_defines};
use crate::geometry::{TuneVar, grid_x};
use crate::{CudaBackend, CudaError, addr_of};

/// The kernel's parameter block (`struct ConvParams` in conv.cu: same order, no padding).
/// Addresses already include each tensor's element offset.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
pub(crate) struct ConvParams {
    x: u64,
    w: u64,
    bias: u64,
    state: u64,
    out: u64,
    ci: u64,
    nacc: u64,
    qsl: u64,
    init: u64,
    blk: u64,
    err: u64,
    x_seq: i64,
    x_tok: i64,
    x_dim: i64,
    out_seq: i64,
    out_tok: i64,
    out_dim: i64,
    st_slot: i64,
    st_col: i64,
    st_dim: i64,
    w_dim: i64,
    w_tap: i64,
    b_dim: i64,
    ci_seq: i64,
    ci_col: i64,
    nacc_s: i64,
    qsl_s: i64,
    init_s: i64,
    blk_s: i64,
    slots: i64,
    state_len: i64,
    rows: i64,
    pad: i64,
    ci_cols: i64,
    batch: i32,
    dim: i32,
    seqlen: i32,
    chunk: i32,
    cblocks: i32,
    reserved: i32,
}

// SAFETY: `ConvParams` is `#[repr(C)]`, plain old data (Pod: no padding, addresses only as
// integers) and its layout equals `struct ConvParams` in conv.cu.
unsafe impl DeviceRepr for ConvParams {}

/// Tokens per chunk of the non-speculative routes (one thread walks one chunk of a sequence).
const CHUNK: usize = 64;
/// About this many blocks before token chunks are strided (132 SMs × 16 resident blocks × 2).
const TARGET_BLOCKS: usize = 4096;

const F_FN: u16 = 1;
const F_CI: u16 = 2;
const F_PAD: u16 = 4;
const F_VARLEN: u16 = 8;
const F_SPEC: u16 = 16;
const F_APC: u16 = 32;
const F_INIT: u16 = 64;
const F_BIAS: u16 = 128;
const F_SILU: u16 = 256;
const F_X_VEC: u16 = 512;
const F_OUT_VEC: u16 = 1024;
const F_ST_VEC: u16 = 2048;
const F_W_VEC: u16 = 4096;
const F_B_VEC: u16 = 8192;
/// `causal_conv1d_fn` with prefix-caching checkpoints (`checkpoint_offsets` in the `nacc` table,
/// `checkpoint_state_indices` in the `blk` table: the update's tables, unused by the fn).
const F_CKPT: u16 = 16384;
/// Each chunk's first input is loaded before the history (`XPRE`): one memory round trip less
/// before a one-token step computes, for more registers. Small grids only (latency-bound).
const F_XPRE: u16 = 32768;

/// Everything that selects one compiled conv kernel (compact, hashed per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConvKey {
    dtype: DType,
    /// `conv_state_indices` / `cache_indices`, `num_accepted_tokens`, `query_start_loc`,
    /// `initial_state_idx`, `block_idx_last_scheduled_token` (I32 when absent).
    index: [DType; 5],
    width: u8,
    vec: u8,
    threads: u16,
    flags: u16,
}

impl ConvKey {
    /// The NVRTC specialisation.
    pub(crate) fn spec(&self) -> KernelSpec {
        let mut defines: Vec<(&'static str, String)> = vec![("ELEM_T", c_type(self.dtype).to_string())];
        for (name, t) in ["CI_T", "NACC_T", "QSL_T", "ISI_T", "BLK_T"].into_iter().zip(self.index) {
            defines.push((name, c_type(t).to_string()));
        }
        defines.extend([
            ("WIDTH", self.width.to_string()),
            ("VEC", self.vec.to_string()),
            ("NTHREADS", self.threads.to_string()),
        ]);
        defines.extend(flag_defines(
            self.flags,
            &[
                ("FN", F_FN),
                ("HAS_CI", F_CI),
                ("HAS_PAD", F_PAD),
                ("VARLEN", F_VARLEN),
                ("SPEC", F_SPEC),
                ("APC", F_APC),
                ("HAS_INIT", F_INIT),
                ("HAS_BIAS", F_BIAS),
                ("SILU", F_SILU),
                ("X_VEC", F_X_VEC),
                ("OUT_VEC", F_OUT_VEC),
                ("ST_VEC", F_ST_VEC),
                ("W_VEC", F_W_VEC),
                ("B_VEC", F_B_VEC),
                ("HAS_CKPT", F_CKPT),
                ("XPRE", F_XPRE),
            ],
        ));
        KernelSpec { source: KernelSource::Conv, entry: "conv_kernel", defines }
    }

    /// Whether the fused GDN decode step (`gdn.cu`'s `gdn_step_kernel`) can run this conv: a
    /// one-token update without token starts, accepted counts or prefix-caching columns.
    pub(crate) fn one_token_update(&self) -> bool {
        self.flags & (F_FN | F_VARLEN | F_SPEC | F_APC) == 0
    }

    /// The conv macros of the fused GDN decode step: dtype, table dtype, width and flags.
    pub(crate) fn step_defines(&self) -> Vec<(&'static str, String)> {
        let mut d = vec![
            ("CELEM_T", c_type(self.dtype).to_string()),
            ("CI_T", c_type(self.index[0]).to_string()),
            ("WIDTH", self.width.to_string()),
        ];
        d.extend(flag_defines(
            self.flags,
            &[("HAS_CI", F_CI), ("HAS_PAD", F_PAD), ("HAS_BIAS", F_BIAS), ("SILU", F_SILU)],
        ));
        d
    }

    /// The key of a Qwen3-Next decode conv (`dtype`, width 4, `[B]` i32 table with a pad, no
    /// bias, silu, 16-byte vectors), for the kernel catalogue.
    pub(crate) fn qwen_decode(dtype: DType) -> ConvKey {
        ConvKey {
            dtype,
            index: [DType::I32; 5],
            width: 4,
            vec: (16 / dtype.size()) as u8,
            threads: 128,
            flags: F_CI | F_PAD | F_SILU | F_X_VEC | F_OUT_VEC | F_ST_VEC | F_W_VEC,
        }
    }

    /// Channels per block.
    fn channels_per_block(&self) -> usize {
        self.threads as usize * self.vec as usize
    }
}

/// The tensors of one conv call, whichever op (device views: addresses and layouts).
pub(crate) struct Call<'c, 'a> {
    plan: &'c ConvPlan,
    x: &'c TensorRef<'a>,
    weight: &'c TensorRef<'a>,
    bias: Option<&'c TensorRef<'a>>,
    state: &'c TensorMut<'a>,
    out: &'c TensorMut<'a>,
    /// `conv_state_indices` / `cache_indices`.
    ci: Option<&'c TensorRef<'a>>,
    /// `num_accepted_tokens` (update) or `checkpoint_offsets` (fn).
    nacc: Option<&'c TensorRef<'a>>,
    qsl: Option<&'c TensorRef<'a>>,
    /// `initial_state_idx` (update) or `has_initial_state` (fn).
    init: Option<&'c TensorRef<'a>>,
    /// `block_idx_last_scheduled_token` (update) or `checkpoint_state_indices` (fn).
    blk: Option<&'c TensorRef<'a>>,
    pad: Option<i64>,
}

/// Whether a tensor can be accessed `vec` channels at a time with accesses of `bytes` bytes:
/// channel stride 1, every other stride a multiple of `bytes`, the first element aligned to it.
fn vec_ok(addr: Option<u64>, offset: usize, es: usize, bytes: usize, dim_stride: isize, others: &[isize]) -> bool {
    let (base, b) = (addr.unwrap_or(0) as i128 + offset as i128 * es as i128, bytes as i128);
    dim_stride == 1 && base % b == 0 && others.iter().all(|&s| (s as i128 * es as i128) % b == 0)
}

/// Blocks of 16-byte vectors below which a call takes 8-byte vectors (`Call::key`): on an
/// H100, Qwen3-Next's decode conv (8192 channels, bf16) took 2.12 / 3.55 µs at batch 1 / 8 with
/// 8-byte vectors against 2.43 / 3.80 with 16-byte ones, and 6.29 against 6.16 at batch 64
/// (docs/PERF.md, twelfth session, "The conv update").
const SMALL_GRID_BLOCKS: usize = 128;

/// `SSM_CUDA_CONV_TUNE="vec=1|2|4|8,threads=32..1024,xpre=0|1"` (tuning sweeps; unset in normal
/// use): channels per thread (at most 16 bytes of them, dividing `dim`), threads per block and
/// the early first input (`F_XPRE`), in place of [`ConvKey`]'s choice.
static CONV_TUNE: TuneVar = TuneVar::new("SSM_CUDA_CONV_TUNE");

impl Call<'_, '_> {
    /// `(sequence stride of x, of out, tokens per sequence)` of a non-varlen update.
    fn dense_geometry(&self) -> (isize, isize, usize) {
        if self.qsl.is_some() {
            return (0, 0, 0);
        }
        let (xs, os) = (self.x.strides(), self.out.strides());
        let seqlen = if self.x.rank() == 3 { self.x.shape()[1] } else { 1 };
        (xs[0], os[0], seqlen)
    }

    /// The key of this call. `with_addrs`: take the tensors' device addresses into account
    /// for the vector flags (else allocation-aligned bases are assumed).
    pub(crate) fn key(&self, with_addrs: bool) -> ConvKey {
        let p = self.plan;
        let es = p.dtype.size();
        let addr = |a: Option<u64>| if with_addrs { a } else { None };
        let per16 = 16 / es;
        // A grid of fewer than SMALL_GRID_BLOCKS blocks of 128 threads with 16-byte vectors
        // (about one per SM: a decode of up to 8 sequences of 8192 channels) takes 8-byte
        // vectors: twice the blocks, half the work per thread.
        let small = p.batch * p.dim.div_ceil(per16 * 128) < SMALL_GRID_BLOCKS;
        let vec = match CONV_TUNE.get("vec").map(|v| v as usize) {
            Some(v) if v.is_power_of_two() && v <= per16 && p.dim.is_multiple_of(v) => v,
            _ if small && per16 > 1 && p.dim.is_multiple_of(per16) => per16 / 2,
            _ if p.dim.is_multiple_of(per16) => per16,
            _ => 1,
        };
        // Bytes of one vector access of `vec` channels.
        let vb = vec * es;
        let mut flags = 0u16;
        let mut set = |on: bool, f: u16| {
            if on {
                flags |= f
            }
        };
        set(p.op == ConvOp::Fn, F_FN);
        set(self.ci.is_some(), F_CI);
        set(self.pad.is_some(), F_PAD);
        set(self.qsl.is_some(), F_VARLEN);
        set(p.op == ConvOp::Update && self.nacc.is_some(), F_SPEC);
        set(p.op == ConvOp::Update && self.blk.is_some(), F_APC);
        set(p.op == ConvOp::Fn && self.nacc.is_some() && self.blk.is_some(), F_CKPT);
        set(p.op == ConvOp::Fn && self.init.is_some(), F_INIT);
        set(p.bias.is_some(), F_BIAS);
        set(p.activation == Activation::Silu, F_SILU);
        set(CONV_TUNE.get("xpre").map_or(small, |v| v != 0), F_XPRE);
        if vec > 1 {
            let (xseq, oseq, _) = self.dense_geometry();
            let (x, out) = (self.x.layout().offset(), self.out.layout().offset());
            set(vec_ok(addr(self.x.device_addr()), x, es, vb, p.x.dim, &[p.x.token, xseq]), F_X_VEC);
            set(vec_ok(addr(self.out.device_addr()), out, es, vb, p.out.dim, &[p.out.token, oseq]), F_OUT_VEC);
            let s = p.state;
            set(vec_ok(addr(self.state.device_addr()), s.offset, es, vb, s.dim, &[s.slot, s.col]), F_ST_VEC);
            // The weight's VEC × WIDTH taps load in 16-byte pieces (or one piece of 8 or 4
            // bytes): 16-byte alignment serves every case.
            let w = p.weight;
            set(
                w.dim == p.width as isize && vec_ok(addr(self.weight.device_addr()), w.offset, es, 16, w.tap, &[]),
                F_W_VEC,
            );
            if let (Some(b), Some(bs)) = (self.bias, p.bias) {
                set(vec_ok(addr(b.device_addr()), bs.offset, es, vb, bs.dim, &[]), F_B_VEC);
            }
        }
        let idx = |t: Option<&TensorRef<'_>>| t.map_or(DType::I32, |t| t.dtype());
        let (isi, blk) = match p.op {
            ConvOp::Update => (idx(self.init), idx(self.blk)),
            ConvOp::Fn => (DType::I32, idx(self.blk)),
        };
        // Small dims: fewer threads per block, so that most lanes have channels.
        let threads = match CONV_TUNE.get("threads") {
            Some(t @ 32..=1024) if t.is_power_of_two() => t as usize,
            _ => p.dim.div_ceil(vec).next_power_of_two().clamp(32, 128),
        };
        ConvKey {
            dtype: p.dtype,
            index: [idx(self.ci), idx(self.nacc), idx(self.qsl), isi, blk],
            width: p.width as u8,
            vec: vec as u8,
            threads: threads as u16,
            flags,
        }
    }

    pub(crate) fn params(&self, err: u64, key: &ConvKey) -> (ConvParams, u32) {
        let p = self.plan;
        let dt = p.dtype;
        let tab = |t: Option<&TensorRef<'_>>| match t {
            Some(t) => (addr_of(t.device_addr(), t.layout().offset() as isize, t.dtype()), t.strides()[0] as i64),
            None => (0, 0),
        };
        let (ci, ci_seq) = tab(self.ci);
        let (ci_col, ci_cols) = match self.ci {
            Some(t) if t.rank() == 2 => (t.strides()[1] as i64, t.shape()[1] as i64),
            _ => (0, 1),
        };
        let (nacc, nacc_s) = tab(self.nacc);
        let (qsl, qsl_s) = tab(self.qsl);
        let (init, init_s) = tab(self.init);
        let (blk, blk_s) = tab(self.blk);
        let (x_seq, out_seq, seqlen) = self.dense_geometry();
        let rows = if self.qsl.is_some() { self.x.shape()[0] } else { 0 };
        // Token chunks: the speculative route runs one chunk per sequence (its state writes
        // follow the tokens); the others split long sequences.
        let spec = key.flags & F_SPEC != 0;
        let max_len = if self.qsl.is_some() { rows } else { seqlen };
        let cblocks = p.dim.div_ceil(key.channels_per_block());
        let (chunk, nz) = if spec || max_len <= CHUNK {
            (i32::MAX, 1)
        } else {
            let cap = (TARGET_BLOCKS / (p.batch * cblocks).max(1)).clamp(1, 65535);
            (CHUNK as i32, max_len.div_ceil(CHUNK).min(cap))
        };
        let params = ConvParams {
            x: addr_of(self.x.device_addr(), self.x.layout().offset() as isize, dt),
            w: addr_of(self.weight.device_addr(), p.weight.offset as isize, dt),
            bias: match (self.bias, p.bias) {
                (Some(b), Some(s)) => addr_of(b.device_addr(), s.offset as isize, dt),
                _ => 0,
            },
            state: addr_of(self.state.device_addr(), p.state.offset as isize, dt),
            out: addr_of(self.out.device_addr(), self.out.layout().offset() as isize, dt),
            ci,
            nacc,
            qsl,
            init,
            blk,
            err,
            x_seq: x_seq as i64,
            x_tok: p.x.token as i64,
            x_dim: p.x.dim as i64,
            out_seq: out_seq as i64,
            out_tok: p.out.token as i64,
            out_dim: p.out.dim as i64,
            st_slot: p.state.slot as i64,
            st_col: p.state.col as i64,
            st_dim: p.state.dim as i64,
            w_dim: p.weight.dim as i64,
            w_tap: p.weight.tap as i64,
            b_dim: p.bias.map_or(0, |b| b.dim as i64),
            ci_seq,
            ci_col,
            nacc_s,
            qsl_s,
            init_s,
            blk_s,
            slots: p.slots as i64,
            state_len: p.state_len as i64,
            rows: rows as i64,
            pad: self.pad.unwrap_or(0),
            ci_cols,
            batch: p.batch as i32,
            dim: p.dim as i32,
            seqlen: seqlen as i32,
            chunk,
            cblocks: cblocks as i32,
            reserved: 0,
        };
        (params, nz as u32)
    }
}

pub(crate) fn update_call<'c, 'a>(plan: &'c ConvPlan, a: &'c CausalConv1dUpdateArgs<'a>) -> Call<'c, 'a> {
    Call {
        plan,
        x: &a.x,
        weight: &a.weight,
        bias: a.bias.as_ref(),
        state: &a.conv_state,
        out: &a.out,
        ci: a.conv_state_indices.as_ref(),
        nacc: a.num_accepted_tokens.as_ref(),
        qsl: a.query_start_loc.as_ref(),
        init: a.initial_state_idx.as_ref(),
        blk: a.block_idx_last_scheduled_token.as_ref(),
        pad: a.pad_slot_id,
    }
}

fn fn_call<'c, 'a>(plan: &'c ConvPlan, a: &'c CausalConv1dFnArgs<'a>) -> Call<'c, 'a> {
    Call {
        plan,
        x: &a.x,
        weight: &a.weight,
        bias: a.bias.as_ref(),
        state: &a.conv_states,
        out: &a.out,
        ci: a.cache_indices.as_ref(),
        nacc: a.checkpoint_offsets.as_ref(),
        qsl: Some(&a.query_start_loc),
        init: a.has_initial_state.as_ref(),
        blk: a.checkpoint_state_indices.as_ref(),
        pad: a.pad_slot_id,
    }
}

impl CudaBackend {
    fn conv_launch(&self, call: &Call<'_, '_>) -> Result<(), CudaError> {
        let p = call.plan;
        for (what, v) in [("batch", p.batch), ("dim", p.dim), ("tokens", call.x.shape()[0])] {
            if v > i32::MAX as usize {
                return Err(CudaError::Unsupported(format!("{what} = {v} exceeds the kernel's 32-bit counters")));
            }
        }
        let key = call.key(true);
        let cblocks = p.dim.div_ceil(key.channels_per_block());
        let blocks = p.batch * cblocks;
        let Some(grid) = grid_x(blocks)? else { return Ok(()) };
        let func = self.conv_function(&key)?;
        let (params, nz) = call.params(self.error_word_addr(), &key);
        // SAFETY: every address in `params` comes from a device view whose creator promised
        // (TensorRef/TensorMut::from_device_ptr) that it is valid for the view's memory on this
        // device for the call; the plan checked that every element the kernel can reach for
        // valid index values lies inside those views, and the kernel checks every index value
        // read on the device (slots, columns, token starts, accepted counts) before using it.
        // The error word is owned by `self`.
        unsafe { self.launch_kernel(&func, (grid, 1, nz), key.threads as u32, &params, "cuLaunchKernel(conv_kernel)") }
    }

    fn conv_function(&self, key: &ConvKey) -> Result<cudarc::driver::CudaFunction, CudaError> {
        self.conv_functions.get_or_load(self, *key, ConvKey::spec)
    }

    /// [`prewarm`](Self::prewarm) for the kernel a `causal_conv1d_update` call launches (its
    /// tables and flags pick the specialisation), e.g. before CUDA-graph capture.
    pub fn prewarm_conv_update(&self, call: &Planned<CausalConv1dUpdateArgs<'_>>) -> Result<(), CudaError> {
        let key = update_call(call.plan(), call.args()).key(true);
        self.conv_function(&key).map(|_| ())
    }

    /// [`prewarm`](Self::prewarm) for the kernel a `causal_conv1d_fn` call launches.
    pub fn prewarm_conv_fn(&self, call: &Planned<CausalConv1dFnArgs<'_>>) -> Result<(), CudaError> {
        let key = fn_call(call.plan(), call.args()).key(true);
        self.conv_function(&key).map(|_| ())
    }
}

impl Run<CausalConv1dUpdateArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// Launches one conv kernel on the backend's stream. Every tensor must be a device view on
    /// this backend's device. Nothing is allocated, nothing is copied back to the host, and
    /// the call does not wait for the kernel: invalid device index values are reported later
    /// by [`CudaBackend::check`].
    fn run(&self, call: Planned<CausalConv1dUpdateArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        self.conv_launch(&update_call(&plan, &args))
    }
}

impl Run<CausalConv1dFnArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// As the update: one launch, no allocation, no host synchronisation.
    fn run(&self, call: Planned<CausalConv1dFnArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        self.conv_launch(&fn_call(&plan, &args))
    }
}

/// The catalogue `cargo xtask build-kernels` compiles: Qwen3-Next decode (bf16, width 4, both
/// state layouts) and the speculative, varlen, prefix-caching and prefill routes, every dtype
/// and width, the scalar (odd-dim) fallback and i64 tables. Each entry is `(label, spec)`.
pub fn conv_catalogue() -> Vec<(String, KernelSpec)> {
    use DType::{BF16, F16, F32, I32, I64};
    let all_vec = F_X_VEC | F_OUT_VEC | F_ST_VEC | F_W_VEC | F_B_VEC;
    let ds_vec = F_X_VEC | F_OUT_VEC | F_W_VEC | F_B_VEC;
    let base = F_CI | F_PAD | F_BIAS | F_SILU;
    let key = |dtype: DType, width: u8, vec: bool, idx: DType, flags: u16| ConvKey {
        dtype,
        index: [idx; 5],
        width,
        vec: if vec { (16 / dtype.size()) as u8 } else { 1 },
        threads: if vec { 128 } else { 32 },
        flags: if vec { flags } else { flags & !all_vec },
    };
    let mut out = Vec::new();
    let mut push = |label: String, k: ConvKey| out.push((label, k.spec()));
    for t in [F32, F16, BF16] {
        for w in 2..=4u8 {
            push(format!("conv update SD t={t} width={w}"), key(t, w, true, I32, base | all_vec));
        }
        push(format!("conv update DS t={t} width=4"), key(t, 4, true, I32, base | ds_vec));
        push(
            format!("conv update spec varlen SD t={t} width=4"),
            key(t, 4, true, I32, base | all_vec | F_SPEC | F_VARLEN),
        );
        push(
            format!("conv fn varlen init SD t={t} width=4"),
            key(t, 4, true, I32, base | all_vec | F_FN | F_VARLEN | F_INIT),
        );
        push(format!("conv update scalar t={t} width=3"), key(t, 3, false, I32, base));
    }
    // Narrower vectors (8- and 4-byte accesses; small grids, with the early first input).
    for (t, w, v) in [(BF16, 4, 4), (BF16, 3, 4), (BF16, 4, 2), (F32, 4, 2)] {
        let k = ConvKey { vec: v, ..key(t, w, true, I32, base | all_vec | F_XPRE) };
        push(format!("conv update SD t={t} width={w} vec={v} xpre"), k);
    }
    push(
        "conv update spec varlen SD bf16 width=4 xpre".into(),
        key(BF16, 4, true, I32, base | all_vec | F_SPEC | F_VARLEN | F_XPRE),
    );
    push("conv update spec DS bf16 width=4".into(), key(BF16, 4, true, I32, base | ds_vec | F_SPEC));
    push("conv update apc SD bf16 width=4".into(), key(BF16, 4, true, I32, base | all_vec | F_APC));
    push("conv update no tables/bias/silu bf16 width=4".into(), key(BF16, 4, true, I32, all_vec));
    push("conv update i64 tables varlen bf16 width=4".into(), key(BF16, 4, true, I64, base | all_vec | F_VARLEN));
    push("conv fn DS scalar f16 width=2".into(), key(F16, 2, false, I64, base | F_FN | F_VARLEN | F_INIT));
    // Prefix-caching checkpoints (Mamba2's conv: bf16, width 4; and the scalar DS form).
    push(
        "conv fn ckpt SD bf16 width=4".into(),
        key(BF16, 4, true, I32, base | all_vec | F_FN | F_VARLEN | F_INIT | F_CKPT),
    );
    push(
        "conv fn ckpt DS scalar f32 width=3".into(),
        key(F32, 3, false, I64, base | F_FN | F_VARLEN | F_INIT | F_CKPT),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_have_no_padding_and_match_the_kernel_layout() {
        // 11 addresses, 23 strides and scalars, 6 ints.
        assert_eq!(std::mem::size_of::<ConvParams>(), 11 * 8 + 23 * 8 + 6 * 4);
        assert_eq!(std::mem::align_of::<ConvParams>(), 8);
    }

    #[test]
    fn vector_access_needs_unit_stride_and_alignment() {
        assert!(vec_ok(Some(256), 8, 2, 16, 1, &[8192, 0]));
        assert!(!vec_ok(Some(256), 3, 2, 16, 1, &[8192]), "offset");
        assert!(!vec_ok(Some(256), 0, 2, 16, 3, &[]), "channel stride");
        assert!(!vec_ok(Some(256), 0, 4, 16, 1, &[6]), "token stride");
        assert!(vec_ok(None, 0, 4, 16, 1, &[-4]), "negative strides of 16 bytes");
        // 8-byte vectors (four 16-bit channels): 8-byte alignment is enough.
        assert!(vec_ok(Some(256), 4, 2, 8, 1, &[12]));
        assert!(!vec_ok(Some(256), 4, 2, 16, 1, &[12]));
        assert!(!vec_ok(Some(256), 2, 2, 8, 1, &[12]), "offset of 4 bytes");
    }

    #[test]
    fn catalogue_defines_every_macro() {
        for (label, spec) in conv_catalogue() {
            assert_eq!(spec.defines.len(), 25, "{label}");
        }
    }
}
