//! A Mamba2 layer's decode step on CUDA, the way an engine wires it in:
//! - the engine's own context, stream and `cudarc` buffers; the runtime launches on that
//!   stream (`CudaBackend::with_borrowed_stream`, `Runtime::with_cuda_backend`);
//! - `prewarm` the two kernels of the step, then capture the step (`causal_conv1d_update`,
//!   then `selective_state_update` reading x, B and C out of the conv output through strided
//!   views) in one CUDA graph;
//! - replay the graph, and `Runtime::check()` off the hot path.
//!
//! Prints why it skips on a machine without a CUDA device.
//!
//!     cargo run --release -p ssm-dispatch --features cuda --example mamba2_decode_cuda [-- REPLAYS]

use std::time::Instant;

use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{BackendKind, Config, CudaBackend, Runtime};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, Device, TensorMut, TensorRef, bf16};

use ssm_cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use ssm_cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

/// Mamba2-2.7B's layer: 80 heads of 64, dstate 128, one group, conv width 4.
const HEADS: usize = 80;
const DIM: usize = 64;
const DSTATE: usize = 128;
const WIDTH: usize = 4;
const CONV_DIM: usize = HEADS * DIM + 2 * DSTATE;
const SLOTS: usize = 512;
const BATCH: usize = 256;
const PAD: i64 = -1;

/// The device address of a buffer. The buffers outlive every use, and every use is ordered
/// on the one stream, so the guard cudarc returns is not kept.
fn addr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// A read-only view of `len` elements at `a` with `shape` and `strides` (elements).
fn view(a: u64, len: usize, dtype: DType, dev: Device, shape: &[usize], strides: &[isize]) -> TensorRef<'static> {
    // SAFETY: `a` is a live allocation of at least `len` elements of `dtype` on `dev` that
    // outlives the program's use of the view (the buffers are dropped at the end of `main`).
    unsafe { TensorRef::from_device_ptr(a, len, dtype, dev, &[len], &[1]) }
        .and_then(|t| t.with_layout(shape, strides, 0))
        .expect("the example's views fit their buffers")
}

fn view_mut(a: u64, len: usize, dtype: DType, dev: Device, shape: &[usize], strides: &[isize]) -> TensorMut<'static> {
    // SAFETY: as in `view`; each written buffer has exactly one writable view per call.
    unsafe { TensorMut::from_device_ptr(a, len, dtype, dev, &[len], &[1]) }
        .and_then(|t| t.with_layout(shape, strides, 0))
        .expect("the example's views fit their buffers")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let replays: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(100);
    if !matches!(ssm_cuda::probe(), ssm_cuda::Availability::Ready { .. }) {
        println!("mamba2_decode_cuda: no CUDA device here ({}); nothing to run", ssm_cuda::probe());
        return Ok(());
    }
    // The engine's context and stream.
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    // SAFETY: `stream` belongs to device 0's primary context and outlives the runtime (both
    // live until the end of `main`, the runtime is dropped first).
    let backend = unsafe { CudaBackend::with_borrowed_stream(0, stream.cu_stream())? };
    let rt = Runtime::with_cuda_backend(&Config { backend: BackendKind::Cuda, ..Config::default() }, backend)?;
    let dev = Device::Cuda(0);

    // The engine's buffers: weights, the two state pools, the step's inputs and outputs.
    let host = |n: usize, scale: f32| -> Vec<bf16> {
        (0..n).map(|i| bf16::from_f32(((i * 2654435761) % 1000) as f32 / 500.0 * scale - scale)).collect()
    };
    let conv_w = stream.clone_htod(&host(CONV_DIM * WIDTH, 0.5))?;
    let a = stream.clone_htod(&vec![-1.0f32; HEADS])?;
    let d = stream.clone_htod(&vec![1.0f32; HEADS])?;
    let dt_bias = stream.clone_htod(&vec![0.0f32; HEADS])?;
    let conv_state = stream.alloc_zeros::<bf16>(SLOTS * (WIDTH - 1) * CONV_DIM)?;
    let ssm_state = stream.alloc_zeros::<f32>(SLOTS * HEADS * DIM * DSTATE)?;
    let xbc = stream.clone_htod(&host(BATCH * CONV_DIM, 1.0))?;
    let dt = stream.clone_htod(&host(BATCH * HEADS, 1.0))?;
    // Scattered slots; the last row of the batch is padding.
    let slots: Vec<i64> = (0..BATCH).map(|b| if b == BATCH - 1 { PAD } else { ((b * 7) % SLOTS) as i64 }).collect();
    let slots = stream.clone_htod(&slots)?;
    let conv_out = stream.alloc_zeros::<bf16>(BATCH * CONV_DIM)?;
    let out = stream.alloc_zeros::<bf16>(BATCH * HEADS * DIM)?;

    // Every address is taken now, before any capture: taking one makes cudarc order the
    // stream after the buffer's last use, which a capture must not record.
    let (xbc_a, conv_state_a, conv_w_a, slots_a, conv_out_a) = (
        addr(&xbc, &stream),
        addr(&conv_state, &stream),
        addr(&conv_w, &stream),
        addr(&slots, &stream),
        addr(&conv_out, &stream),
    );
    let (ssm_state_a, dt_a, a_a, d_a, dt_bias_a, out_a) = (
        addr(&ssm_state, &stream),
        addr(&dt, &stream),
        addr(&a, &stream),
        addr(&d, &stream),
        addr(&dt_bias, &stream),
        addr(&out, &stream),
    );
    let (c, h, p, n) = (CONV_DIM as isize, HEADS as isize, DIM as isize, DSTATE as isize);
    let conv_args = || CausalConv1dUpdateArgs {
        x: view(xbc_a, BATCH * CONV_DIM, DType::BF16, dev, &[BATCH, CONV_DIM], &[c, 1]),
        conv_state: view_mut(
            conv_state_a,
            SLOTS * (WIDTH - 1) * CONV_DIM,
            DType::BF16,
            dev,
            &[SLOTS, WIDTH - 1, CONV_DIM],
            &[3 * c, c, 1],
        ),
        conv_state_layout: ConvStateLayout::StateLenDim,
        weight: view(conv_w_a, CONV_DIM * WIDTH, DType::BF16, dev, &[CONV_DIM, WIDTH], &[WIDTH as isize, 1]),
        bias: None,
        activation: Activation::Silu,
        conv_state_indices: Some(view(slots_a, BATCH, DType::I64, dev, &[BATCH], &[1])),
        num_accepted_tokens: None,
        query_start_loc: None,
        pad_slot_id: Some(PAD),
        block_idx_last_scheduled_token: None,
        initial_state_idx: None,
        out: view_mut(conv_out_a, BATCH * CONV_DIM, DType::BF16, dev, &[BATCH, CONV_DIM], &[c, 1]),
    };
    let co = conv_out_a;
    let (bo, coff) = (HEADS * DIM, HEADS * DIM + DSTATE);
    let ssu_args = || SelectiveStateUpdateArgs {
        d: Some(view(d_a, HEADS, DType::F32, dev, &[HEADS, DIM], &[1, 0])),
        dt_bias: Some(view(dt_bias_a, HEADS, DType::F32, dev, &[HEADS, DIM], &[1, 0])),
        dt_softplus: true,
        state_batch_indices: Some(view(slots_a, BATCH, DType::I64, dev, &[BATCH], &[1])),
        pad_slot_id: Some(PAD),
        ..SelectiveStateUpdateArgs::new(
            view_mut(
                ssm_state_a,
                SLOTS * HEADS * DIM * DSTATE,
                DType::F32,
                dev,
                &[SLOTS, HEADS, DIM, DSTATE],
                &[h * p * n, p * n, n, 1],
            ),
            // x, B and C: column ranges of the conv output (strided views, no copies).
            view(co, BATCH * CONV_DIM, DType::BF16, dev, &[BATCH, HEADS, DIM], &[c, p, 1]),
            view(dt_a, BATCH * HEADS, DType::BF16, dev, &[BATCH, HEADS, DIM], &[h, 1, 0]),
            view(a_a, HEADS, DType::F32, dev, &[HEADS, DIM, DSTATE], &[1, 0, 0]),
            view(co + 2 * bo as u64, BATCH * CONV_DIM - bo, DType::BF16, dev, &[BATCH, 1, DSTATE], &[c, n, 1]),
            view(co + 2 * coff as u64, BATCH * CONV_DIM - coff, DType::BF16, dev, &[BATCH, 1, DSTATE], &[c, n, 1]),
            view_mut(out_a, BATCH * HEADS * DIM, DType::BF16, dev, &[BATCH, HEADS, DIM], &[h * p, p, 1]),
        )
    };

    // Prewarm: compile and load both kernels now, so that the capture launches only.
    let cuda = rt.cuda().expect("a CUDA runtime");
    cuda.prewarm_conv_update(&ssm_conv::plan(conv_args())?)?;
    cuda.prewarm_ssu(ssm_ssu::plan(ssu_args())?.plan())?;

    // One eager step, then the same step captured in a graph.
    rt.causal_conv1d_update(conv_args())?;
    rt.selective_state_update(ssu_args())?;
    rt.check()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    // End the capture whatever the calls answer, then report their errors.
    let conv = rt.causal_conv1d_update(conv_args());
    let ssu = if conv.is_ok() { rt.selective_state_update(ssu_args()) } else { Ok(()) };
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    conv?;
    ssu?;
    let graph = graph.ok_or("the capture recorded no work")?;
    graph.upload()?;
    graph.launch()?;
    stream.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..replays {
        graph.launch()?;
    }
    stream.synchronize()?;
    let us = t0.elapsed().as_secs_f64() * 1e6 / replays as f64;
    rt.check()?; // device-side index errors (none here): off the hot path
    let live = BATCH - 1;
    println!(
        "mamba2_decode_cuda: {} on {}: one captured step (conv + SSU, {live} live rows and 1 pad, 80 heads, f32 state) replayed {replays}×: {us:.1} µs per step, {:.0} tokens/s per layer",
        ctx.name()?,
        cuda.arch().sm(),
        live as f64 / us * 1e6
    );
    let y: Vec<bf16> = stream.clone_dtoh(&out)?;
    let finite = y.iter().all(|v| v.is_finite());
    println!("outputs finite: {finite}");
    if !finite {
        return Err("non-finite output".into());
    }
    Ok(())
}
