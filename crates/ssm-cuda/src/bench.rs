//! Benchmark pieces for `cargo xtask bench --op ssu --backend cuda`: the card's copy
//! bandwidth and the SSU kernel timed with CUDA-graph replay over rotating state pools. The
//! pool rotation ([`rotation`]) and the graph timing ([`time_graph`]) are shared with the GDN
//! bench ([`crate::bench_gdn`]).
//!
//! Methodology (docs/PERF.md): the copy bandwidth is the better of `cuMemcpyDtoDAsync` and the
//! 16-byte copy kernel over a 2 GiB buffer, counted as bytes read + written, measured after a
//! warm-up of about a second of copies (an idle H200 starts at low clocks). An SSU shape is
//! timed as a captured graph of many calls that rotate among enough state pools (each with its
//! own inputs and slot tables) to exceed the 60 MB L2 several times over; the time per call is
//! the median over replays divided by the calls in the graph. Achieved bandwidth counts the
//! fewest bytes the op must move: each state slot read once and written once (in speculative
//! mode once per token), every input read once, every output written once.

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, LaunchConfig, PushKernelArg};
use rand::{Rng, SeedableRng};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, Run, TensorError, TensorRef};

use crate::compile::{KernelSource, KernelSpec};
use crate::testing::DeviceBuffer;
use crate::{CudaBackend, CudaError};

/// The card's copy bandwidth (bytes read + written per second).
#[derive(Debug, Clone, Copy)]
pub struct CopyBandwidth {
    /// Bytes copied per call.
    pub bytes: usize,
    /// `cuMemcpyDtoDAsync`, GB/s.
    pub memcpy_gbps: f64,
    /// The 16-byte copy kernel, GB/s.
    pub kernel_gbps: f64,
}

impl CopyBandwidth {
    /// The better of the two.
    pub fn best_gbps(&self) -> f64 {
        self.memcpy_gbps.max(self.kernel_gbps)
    }
}

pub(crate) fn event(be: &CudaBackend) -> Result<CudaEvent, CudaError> {
    be.stream().record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(CudaError::driver("cuEventRecord"))
}

pub(crate) fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f64, CudaError> {
    a.elapsed_ms(b).map(f64::from).map_err(CudaError::driver("cuEventElapsedTime"))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Fills `n` elements of `dtype` at `addr` with uniform values in `[lo, hi)`.
pub(crate) fn fill(
    be: &CudaBackend,
    addr: u64,
    n: usize,
    dtype: DType,
    seed: u64,
    lo: f32,
    hi: f32,
) -> Result<(), CudaError> {
    let entry = match dtype {
        DType::F32 => "fill_uniform_f32",
        DType::F16 => "fill_uniform_f16",
        DType::BF16 => "fill_uniform_bf16",
        other => return Err(CudaError::Unsupported(format!("fill of {other}"))),
    };
    let spec = KernelSpec { source: KernelSource::Copy, entry, defines: vec![("UNROLL", "4".into())] };
    let f = be.function(&spec)?;
    let n64 = n as u64;
    let cfg = LaunchConfig { grid_dim: (1024, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut b = be.stream().launch_builder(&f);
    b.arg(&addr).arg(&n64).arg(&seed).arg(&lo).arg(&hi);
    // SAFETY: `addr` is a live device allocation of at least `n` elements of `dtype` (callers
    // pass DeviceBuffers sized for it); the kernel writes only indices below `n`.
    unsafe { b.launch(cfg) }.map_err(CudaError::driver("cuLaunchKernel(fill)"))?;
    Ok(())
}

/// Measures the copy bandwidth over `bytes` (e.g. 2 GiB), after a warm-up.
pub fn measure_copy_bandwidth(be: &CudaBackend, bytes: usize) -> Result<CopyBandwidth, CudaError> {
    let bytes = bytes / 16 * 16;
    let src = DeviceBuffer::zeroed(be, bytes)?;
    let dst = DeviceBuffer::zeroed(be, bytes)?;
    fill(be, src.addr(), bytes / 4, DType::F32, 1, -1.0, 1.0)?;
    // Warm-up: about a second of copies, so that the clocks are up.
    let t0 = std::time::Instant::now();
    while t0.elapsed().as_secs_f64() < 1.0 {
        for _ in 0..20 {
            // SAFETY: both buffers hold `bytes` bytes, are 256-byte aligned and distinct.
            unsafe { be.copy_kernel(src.addr(), dst.addr(), bytes) }?;
        }
        be.synchronize()?;
    }
    let reps = 10;
    let (mut memcpy, mut kernel) = (Vec::new(), Vec::new());
    for _round in 0..5 {
        for use_kernel in [false, true] {
            let a = event(be)?;
            for _ in 0..reps {
                // SAFETY: as above.
                unsafe {
                    if use_kernel {
                        be.copy_kernel(src.addr(), dst.addr(), bytes)
                    } else {
                        be.copy_driver(src.addr(), dst.addr(), bytes)
                    }
                }?;
            }
            let b = event(be)?;
            let ms = elapsed_ms(&a, &b)? / reps as f64;
            let gbps = 2.0 * bytes as f64 / (ms * 1e-3) / 1e9;
            if use_kernel { kernel.push(gbps) } else { memcpy.push(gbps) }
        }
    }
    Ok(CopyBandwidth { bytes, memcpy_gbps: median(memcpy), kernel_gbps: median(kernel) })
}

/// One SSU benchmark shape (Mamba2 form: tied parameters, bf16 io, no z, softplus, D and
/// dt_bias, slot tables; `tokens > 1` is speculative decoding with a `[batch, tokens]`
/// table, `num_accepted_tokens` and packed `cu_seqlens`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SsuBenchShape {
    /// Sequences.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Head dim.
    pub dim: usize,
    /// State size.
    pub dstate: usize,
    /// Groups of B/C.
    pub groups: usize,
    /// State dtype (I16 / I8: block-scaled states, FlashInfer's and the 8-bit one, with one f32
    /// decode scale per row).
    pub state: DType,
    /// Dtype of x, dt, B, C, out.
    pub io: DType,
    /// Tokens per sequence (1: plain decode; >1: speculative).
    pub tokens: usize,
    /// FlashInfer's verification without commit: every token's state goes to an intermediate
    /// buffer (`[batch, tokens, heads, dim, dstate]`, entry `b` for sequence `b`) and the pool is
    /// not written; the same bytes as the committing call.
    pub verify: bool,
    /// The SSU tiling the call runs (`ssu_algorithm`; `auto`, the default, as a runtime runs it).
    pub algorithm: ssm_ssu::SsuAlgorithm,
}

impl SsuBenchShape {
    /// Mamba2-2.7B: 80 heads, dim 64, dstate 128, one group, bf16 io.
    pub fn mamba2_2p7b(batch: usize, state: DType, tokens: usize) -> Self {
        SsuBenchShape {
            batch,
            heads: 80,
            dim: 64,
            dstate: 128,
            groups: 1,
            state,
            io: DType::BF16,
            tokens,
            verify: false,
            algorithm: ssm_ssu::SsuAlgorithm::Auto,
        }
    }

    /// A short label, e.g. `mamba2-2.7b f32 b64 spec4`.
    pub fn label(&self) -> String {
        let mode = if self.tokens > 1 { format!(" spec{}", self.tokens) } else { String::new() };
        let mode = if self.verify { format!("{mode} verify") } else { mode };
        let mode = format!("{mode}{}", self.algorithm_tag());
        format!("h{} d{} n{} g{} {} b{}{mode}", self.heads, self.dim, self.dstate, self.groups, self.state, self.batch)
    }

    /// ` <algorithm>` for a named algorithm, empty for `auto` (labels and table rows).
    pub fn algorithm_tag(&self) -> String {
        match self.algorithm {
            ssm_ssu::SsuAlgorithm::Auto => String::new(),
            a => format!(" {}", a.name()),
        }
    }

    /// Slots in one state pool.
    pub fn slots(&self) -> usize {
        self.batch * self.tokens
    }

    /// Bytes one call must move at least (see the module docs).
    pub fn bytes(&self) -> u64 {
        let (h, p, n, g) = (self.heads as u64, self.dim as u64, self.dstate as u64, self.groups as u64);
        let io = self.io.size() as u64;
        let rows = (self.batch * self.tokens) as u64;
        let tok = rows * h * p * io * 2 + rows * h * io + rows * g * n * io * 2;
        let params = 3 * h * 4;
        // Verification: the buffer rows replace the pool's per-token rows; plus its entry table.
        let entries = if self.verify { self.batch as u64 * 4 } else { 0 };
        // An integer row carries its f32 decode scale, read and written with it.
        let scales = if ssm_ssu::quant::limit(self.state).is_some() { h * p * 4 } else { 0 };
        state_and_table_bytes(self.batch, self.tokens, h * p * n * self.state.size() as u64 + scales)
            + tok
            + params
            + entries
    }
}

/// The bytes every decode bench call moves for its state pool and slot tables, `batch`
/// sequences of `tokens` tokens with slots of `slot_bytes`: each touched slot read once and
/// written once per token, and the tables (1-D: `B·4`; speculative: `B·T·4` table, `B·4`
/// accepted counts, `(B + 1)·4` `cu_seqlens`).
pub(crate) fn state_and_table_bytes(batch: usize, tokens: usize, slot_bytes: u64) -> u64 {
    let (b, t) = (batch as u64, tokens as u64);
    let tables = if t > 1 { b * t * 4 + b * 4 + (b + 1) * 4 } else { b * 4 };
    b * slot_bytes * (1 + t) + tables
}

/// Timing of one shape (SSU: [`SsuBenchResult`]; GDN: [`crate::bench_gdn::GdnBenchResult`]).
#[derive(Debug, Clone, Copy)]
pub struct BenchResult<S> {
    /// The shape.
    pub shape: S,
    /// Microseconds per call (median over graph replays).
    pub us: f64,
    /// Achieved GB/s (`shape.bytes()` per call).
    pub gbps: f64,
    /// State pools rotated through.
    pub pools: usize,
    /// Calls per captured graph.
    pub calls_per_graph: usize,
}

/// Timing of one SSU shape.
pub type SsuBenchResult = BenchResult<SsuBenchShape>;

/// The sequence lengths of a prefill bench shape: `batch` sequences of `seqlen` tokens each, or,
/// when `varied`, `batch` sequences of lengths in the ratio 1 : 2 : … : `batch` that sum to
/// `batch · seqlen` (the last takes what rounding left), so that most end inside a chunk. Every
/// length is at least 1 when `seqlen ≥ (batch + 1) / 2`.
pub fn prefill_lengths(batch: usize, seqlen: usize, varied: bool) -> Vec<usize> {
    if !varied || batch <= 1 {
        return vec![seqlen; batch];
    }
    let total = batch * seqlen;
    let weights = batch * (batch + 1) / 2;
    let mut lens: Vec<usize> = (1..batch).map(|i| total * i / weights).collect();
    lens.push(total - lens.iter().sum::<usize>());
    lens
}

/// How a prefill bench label writes its sequences: `4x2048` (4 of 2048 tokens) or `8v2048` (8 of
/// varied lengths, 2048 tokens in all).
pub(crate) fn prefill_sequences_label(batch: usize, seqlen: usize, varied: bool) -> String {
    match varied {
        true => format!("{batch}v{}", batch * seqlen),
        false => format!("{batch}x{seqlen}"),
    }
}

/// The lengths of the chunks of `chunk` tokens that sequences of `lens` tokens split into
/// (each sequence's last chunk may be short).
pub(crate) fn chunk_lengths(lens: &[usize], chunk: usize) -> impl Iterator<Item = usize> + '_ {
    lens.iter().flat_map(move |&len| (0..len).step_by(chunk).map(move |start| chunk.min(len - start)))
}

/// The `cu_seqlens` of sequences of `lens` tokens.
pub(crate) fn cu_seqlens(lens: &[usize]) -> Vec<i64> {
    std::iter::once(0)
        .chain(lens.iter().scan(0i64, |acc, &l| {
            *acc += l as i64;
            Some(*acc)
        }))
        .collect()
}

/// A random permutation of `0..n` drawn from `seed` (a bench's slot table: sequences gather
/// from all over the pool).
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<i32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut perm: Vec<i32> = (0..n as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.random_range(0..=i));
    }
    perm
}

/// One pool's slot table and its speculative companions, for `batch` sequences of `tokens`
/// tokens: a random permutation of the slots `first..first + batch·tokens` (sequences gather
/// from all over the pool), the accepted-token counts (in `1..=tokens`) and the packed
/// `cu_seqlens`.
pub(crate) struct SlotTables {
    batch: usize,
    tokens: usize,
    ix: DeviceBuffer,
    nacc: DeviceBuffer,
    cu: DeviceBuffer,
}

/// The views of [`SlotTables`]: the table (`[batch, tokens]` when speculative, else `[batch]`)
/// and, when speculative (`tokens > 1`), the counts `[batch]` and `cu_seqlens` `[batch + 1]`.
pub(crate) struct SlotTableViews<'a> {
    pub(crate) ix: TensorRef<'a>,
    pub(crate) nacc: Option<TensorRef<'a>>,
    pub(crate) cu: Option<TensorRef<'a>>,
}

impl SlotTables {
    pub(crate) fn new(be: &CudaBackend, batch: usize, tokens: usize, first: i32, seed: u64) -> Result<Self, CudaError> {
        let perm: Vec<i32> = permutation(batch * tokens, seed).into_iter().map(|s| s + first).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x55);
        let nacc: Vec<i32> = (0..batch).map(|_| rng.random_range(1..=tokens as i32)).collect();
        let cu: Vec<i32> = (0..=batch as i32).map(|i| i * tokens as i32).collect();
        Ok(SlotTables {
            batch,
            tokens,
            ix: DeviceBuffer::from_host(be, bytemuck::cast_slice(&perm))?,
            nacc: DeviceBuffer::from_host(be, bytemuck::cast_slice(&nacc))?,
            cu: DeviceBuffer::from_host(be, bytemuck::cast_slice(&cu))?,
        })
    }

    pub(crate) fn views(&self) -> Result<SlotTableViews<'_>, TensorError> {
        let (b, t) = (self.batch, self.tokens);
        if t > 1 {
            Ok(SlotTableViews {
                ix: self.ix.view(DType::I32, &[b, t], &[t as isize, 1], 0)?,
                nacc: Some(self.nacc.view(DType::I32, &[b], &[1], 0)?),
                cu: Some(self.cu.view(DType::I32, &[b + 1], &[1], 0)?),
            })
        } else {
            Ok(SlotTableViews { ix: self.ix.view(DType::I32, &[b], &[1], 0)?, nacc: None, cu: None })
        }
    }
}

struct Pool {
    state: DeviceBuffer,
    x: DeviceBuffer,
    dt: DeviceBuffer,
    a: DeviceBuffer,
    b: DeviceBuffer,
    c: DeviceBuffer,
    d: DeviceBuffer,
    dt_bias: DeviceBuffer,
    out: DeviceBuffer,
    tables: SlotTables,
    /// The intermediate buffer and its entry table (verification shapes).
    verify: Option<(DeviceBuffer, DeviceBuffer)>,
    /// An integer state's decode scales `[slots, heads, dim]`, and the buffer's (verification).
    scales: Option<(DeviceBuffer, Option<DeviceBuffer>)>,
}

impl Pool {
    fn new(be: &CudaBackend, s: &SsuBenchShape, seed: u64) -> Result<Self, CudaError> {
        let (h, p, n, g) = (s.heads, s.dim, s.dstate, s.groups);
        let rows = s.batch * s.tokens;
        let slots = s.slots();
        let buf = |elems: usize, dtype: DType| DeviceBuffer::zeroed(be, elems * dtype.size());
        let pool = Pool {
            state: buf(slots * h * p * n, s.state)?,
            x: buf(rows * h * p, s.io)?,
            dt: buf(rows * h, s.io)?,
            a: buf(h, DType::F32)?,
            b: buf(rows * g * n, s.io)?,
            c: buf(rows * g * n, s.io)?,
            d: buf(h, DType::F32)?,
            dt_bias: buf(h, DType::F32)?,
            out: buf(rows * h * p, s.io)?,
            tables: SlotTables::new(be, s.batch, s.tokens, 0, seed)?,
            verify: match s.verify {
                true => {
                    let entries: Vec<i32> = (0..s.batch as i32).collect();
                    Some((
                        buf(rows * h * p * n, s.state)?,
                        DeviceBuffer::from_host(be, bytemuck::cast_slice(&entries))?,
                    ))
                }
                false => None,
            },
            scales: match ssm_ssu::quant::limit(s.state) {
                Some(_) => Some((
                    buf(slots * h * p, DType::F32)?,
                    s.verify.then(|| buf(rows * h * p, DType::F32)).transpose()?,
                )),
                None => None,
            },
        };
        // An integer state's integers: the bit patterns of bf16 values (arbitrary integers, as a
        // quantized state holds), each row decoded by a small scale.
        let elems = slots * h * p * n;
        let (fill_as, fill_elems) = match s.state {
            DType::I16 => (DType::BF16, elems),
            DType::I8 => (DType::BF16, elems / 2),
            other => (other, elems),
        };
        fill(be, pool.state.addr(), fill_elems, fill_as, seed, -1.0, 1.0)?;
        if let Some((scales, _)) = &pool.scales {
            fill(be, scales.addr(), slots * h * p, DType::F32, seed + 8, 1e-5, 4e-5)?;
        }
        fill(be, pool.x.addr(), rows * h * p, s.io, seed + 1, -1.0, 1.0)?;
        fill(be, pool.dt.addr(), rows * h, s.io, seed + 2, -3.0, 1.0)?;
        fill(be, pool.a.addr(), h, DType::F32, seed + 3, -2.0, -0.1)?;
        fill(be, pool.b.addr(), rows * g * n, s.io, seed + 4, -1.0, 1.0)?;
        fill(be, pool.c.addr(), rows * g * n, s.io, seed + 5, -1.0, 1.0)?;
        fill(be, pool.d.addr(), h, DType::F32, seed + 6, -1.0, 1.0)?;
        fill(be, pool.dt_bias.addr(), h, DType::F32, seed + 7, -1.0, 1.0)?;
        Ok(pool)
    }

    fn args(&mut self, s: &SsuBenchShape) -> Result<SelectiveStateUpdateArgs<'_>, TensorError> {
        let (h, p, n, g) = (s.heads, s.dim, s.dstate, s.groups);
        let rows = s.batch * s.tokens;
        let (hi, pi, ni) = (h as isize, p as isize, n as isize);
        let tables = self.tables.views()?;
        let (t, ti) = (s.tokens, s.tokens as isize);
        let (buffer, entries) = match &mut self.verify {
            Some((b, e)) => (
                Some(b.view_mut(
                    s.state,
                    &[s.batch, t, h, p, n],
                    &[ti * hi * pi * ni, hi * pi * ni, pi * ni, ni, 1],
                    0,
                )?),
                Some(e.view(DType::I32, &[s.batch], &[1], 0)?),
            ),
            None => (None, None),
        };
        let (state_scale, intermediate_state_scales) = match &mut self.scales {
            Some((sc, isc)) => (
                Some(sc.view_mut(DType::F32, &[s.slots(), h, p], &[hi * pi, pi, 1], 0)?),
                match isc {
                    Some(isc) => {
                        Some(isc.view_mut(DType::F32, &[s.batch, t, h, p], &[ti * hi * pi, hi * pi, pi, 1], 0)?)
                    }
                    None => None,
                },
            ),
            None => (None, None),
        };
        Ok(SelectiveStateUpdateArgs {
            d: Some(self.d.view(DType::F32, &[h, p], &[1, 0], 0)?),
            dt_bias: Some(self.dt_bias.view(DType::F32, &[h, p], &[1, 0], 0)?),
            dt_softplus: true,
            state_batch_indices: Some(tables.ix),
            pad_slot_id: Some(-1),
            num_accepted_tokens: tables.nacc,
            cu_seqlens: tables.cu,
            intermediate_states_buffer: buffer,
            intermediate_state_indices: entries,
            state_scale,
            intermediate_state_scales,
            ..SelectiveStateUpdateArgs::new(
                self.state.view_mut(s.state, &[s.slots(), h, p, n], &[hi * pi * ni, pi * ni, ni, 1], 0)?,
                self.x.view(s.io, &[rows, h, p], &[hi * pi, pi, 1], 0)?,
                self.dt.view(s.io, &[rows, h, p], &[hi, 1, 0], 0)?,
                self.a.view(DType::F32, &[h, p, n], &[1, 0, 0], 0)?,
                self.b.view(s.io, &[rows, g, n], &[g as isize * ni, ni, 1], 0)?,
                self.c.view(s.io, &[rows, g, n], &[g as isize * ni, ni, 1], 0)?,
                self.out.view_mut(s.io, &[rows, h, p], &[hi * pi, pi, 1], 0)?,
            )
        })
    }
}

pub(crate) fn tensor_err(e: TensorError) -> CudaError {
    CudaError::Unsupported(format!("bench view: {e}"))
}

fn plan(args: SelectiveStateUpdateArgs<'_>) -> Result<ssm_tensor::Planned<SelectiveStateUpdateArgs<'_>>, CudaError> {
    ssm_ssu::plan(args).map_err(|e| CudaError::Unsupported(format!("bench plan: {e}")))
}

/// State pools and calls per captured graph for a call that moves `bytes`: enough pools that
/// one pass over them moves about 400 MB (the 60 MB L2 several times over; 2 to 128 pools),
/// and at least 64 calls, a whole number of passes.
pub fn rotation(bytes: u64) -> (usize, usize) {
    let pools = (400_000_000u64.div_ceil(bytes.max(1)) as usize).clamp(2, 128);
    (pools, pools * 64usize.div_ceil(pools).max(1))
}

/// Captures `calls` launches (`launch(i)` enqueues call `i` on the backend's stream) into one
/// CUDA graph, replays it 3 times to warm up, then 15 times timed; the median replay over
/// `calls` is the time of one call, in microseconds. The caller runs each distinct call once
/// eagerly first (compilation, module load), and `be.check()`s afterwards.
pub fn time_graph(
    be: &CudaBackend,
    calls: usize,
    mut launch: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let stream: Arc<_> = be.stream().clone();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(CudaError::driver("cuStreamBeginCapture"))?;
    let captured = (0..calls).try_for_each(&mut launch);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(CudaError::driver("cuStreamEndCapture"))?;
    captured?;
    let graph = graph.ok_or_else(|| CudaError::Unsupported("empty graph".into()))?;
    graph.upload().map_err(CudaError::driver("cuGraphUpload"))?;
    for _ in 0..3 {
        graph.launch().map_err(CudaError::driver("cuGraphLaunch"))?;
    }
    be.synchronize()?;
    let mut per_call = Vec::new();
    for _ in 0..15 {
        let a = event(be)?;
        graph.launch().map_err(CudaError::driver("cuGraphLaunch"))?;
        let b = event(be)?;
        per_call.push(elapsed_ms(&a, &b)? * 1e3 / calls as f64);
    }
    Ok(median(per_call))
}

/// Times `shape`, which moves `bytes` per call: CUDA-graph replay of many calls rotating over
/// enough pools ([`rotation`]; pool `i` is `new_pool(seed0 + 17·i)`) to defeat the L2.
/// `launch` enqueues one call over a pool; each pool's call runs once eagerly first (compiles
/// and loads the kernel), and the device error word is checked before and after the timing.
pub(crate) fn bench_rotating<S: Copy, P>(
    be: &CudaBackend,
    shape: &S,
    bytes: u64,
    seed0: u64,
    mut new_pool: impl FnMut(u64) -> Result<P, CudaError>,
    mut launch: impl FnMut(&mut P) -> Result<(), CudaError>,
) -> Result<BenchResult<S>, CudaError> {
    let (pools, calls) = rotation(bytes);
    let mut ps = Vec::with_capacity(pools);
    for i in 0..pools {
        ps.push(new_pool(seed0 + 17 * i as u64)?);
    }
    for p in ps.iter_mut() {
        launch(p)?;
    }
    be.check()?;
    let us = time_graph(be, calls, |i| launch(&mut ps[i % pools]))?;
    be.check()?;
    Ok(BenchResult { shape: *shape, us, gbps: bytes as f64 / (us * 1e-6) / 1e9, pools, calls_per_graph: calls })
}

/// Times `shape` under its `algorithm` (the backend's choice is restored after): CUDA-graph
/// replay of many calls rotating over enough pools to defeat the L2.
pub fn bench_ssu(be: &CudaBackend, shape: &SsuBenchShape) -> Result<SsuBenchResult, CudaError> {
    let before = be.ssu_algorithm();
    be.set_ssu_algorithm(shape.algorithm);
    let r = bench_ssu_as_set(be, shape);
    be.set_ssu_algorithm(before);
    r
}

fn bench_ssu_as_set(be: &CudaBackend, shape: &SsuBenchShape) -> Result<SsuBenchResult, CudaError> {
    bench_rotating(
        be,
        shape,
        shape.bytes(),
        1000,
        |seed| Pool::new(be, shape, seed),
        |p| be.run(plan(p.args(shape).map_err(tensor_err)?)?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_lengths_vary_and_keep_the_total() {
        assert_eq!(prefill_lengths(4, 512, false), [512; 4]);
        assert_eq!(prefill_lengths(1, 2048, true), [2048]);
        let lens = prefill_lengths(8, 256, true);
        assert_eq!(lens, [56, 113, 170, 227, 284, 341, 398, 459]);
        assert_eq!(cu_seqlens(&lens).last(), Some(&2048));
        assert_eq!(chunk_lengths(&[300, 20], 256).collect::<Vec<_>>(), [256, 44, 20]);
        assert_eq!(prefill_sequences_label(8, 256, true), "8v2048");
        assert_eq!(prefill_sequences_label(8, 256, false), "8x256");
    }

    #[test]
    fn byte_count_of_mamba2_decode() {
        let s = SsuBenchShape::mamba2_2p7b(64, DType::F32, 1);
        let state = 64 * 80 * 64 * 128 * 4 * 2;
        let tok = 64 * 80 * 64 * 2 * 2 + 64 * 80 * 2 + 64 * 128 * 2 * 2;
        assert_eq!(s.bytes(), (state + tok + 3 * 80 * 4 + 64 * 4) as u64);
        // Speculative: one read and one write per token.
        let s4 = SsuBenchShape::mamba2_2p7b(64, DType::BF16, 4);
        assert!(s4.bytes() > 64 * 80 * 64 * 128 * 2 * 5);
        assert_eq!(s4.slots(), 256);
        assert_eq!(s.label(), "h80 d64 n128 g1 f32 b64");
    }
}
