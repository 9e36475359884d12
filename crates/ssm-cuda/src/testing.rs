//! Device buffers and host↔device mirroring, for tests, benches and tools.
//!
//! Not on any hot path: these allocate, copy and synchronise.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvError, ConvStateLayout};
use ssm_ssu::{SelectiveStateUpdate, SsuError};
use ssm_tensor::{DType, Planned, Run, TensorError, TensorMut, TensorRef};

use crate::{CudaBackend, CudaError};

/// An owned device allocation and its address.
pub struct DeviceBuffer {
    slice: CudaSlice<u8>,
    addr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    device: ssm_tensor::Device,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer").field("addr", &self.addr).field("len", &self.len).finish()
    }
}

impl DeviceBuffer {
    /// `len` zero bytes on the backend's device (at least 16 bytes are allocated).
    pub fn zeroed(backend: &CudaBackend, len: usize) -> Result<Self, CudaError> {
        let stream = backend.stream().clone();
        let slice = stream.alloc_zeros::<u8>(len.max(16)).map_err(CudaError::driver("cuMemAlloc"))?;
        let addr = {
            let (a, _sync) = slice.device_ptr(&stream);
            a
        };
        Ok(DeviceBuffer { slice, addr, len, stream, device: backend.device() })
    }

    /// A copy of `bytes` on the device.
    pub fn from_host(backend: &CudaBackend, bytes: &[u8]) -> Result<Self, CudaError> {
        let mut b = Self::zeroed(backend, bytes.len())?;
        b.upload(bytes)?;
        Ok(b)
    }

    /// Device address of byte 0.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Overwrites the start of the buffer with `bytes` (stream-ordered, then waits).
    pub fn upload(&mut self, bytes: &[u8]) -> Result<(), CudaError> {
        assert!(bytes.len() <= self.len, "upload of {} bytes into a buffer of {}", bytes.len(), self.len);
        if bytes.is_empty() {
            return Ok(());
        }
        let mut view = self.slice.slice_mut(0..bytes.len());
        self.stream.memcpy_htod(bytes, &mut view).map_err(CudaError::driver("cuMemcpyHtoD"))?;
        self.stream.synchronize().map_err(CudaError::driver("cuStreamSynchronize"))
    }

    /// The buffer's bytes (waits for the stream).
    pub fn download(&self) -> Result<Vec<u8>, CudaError> {
        let mut v = vec![0u8; self.len];
        if self.len > 0 {
            let view = self.slice.slice(0..self.len);
            self.stream.memcpy_dtoh(&view, &mut v).map_err(CudaError::driver("cuMemcpyDtoH"))?;
        }
        self.stream.synchronize().map_err(CudaError::driver("cuStreamSynchronize"))?;
        Ok(v)
    }

    /// A read-only view of the buffer as `dtype` with a layout (bounds-checked).
    pub fn view(
        &self,
        dtype: DType,
        shape: &[usize],
        strides: &[isize],
        offset: usize,
    ) -> Result<TensorRef<'_>, TensorError> {
        let len = self.len / dtype.size();
        // SAFETY: the buffer holds `len` elements of `dtype` on this device and lives as long as
        // the returned view borrows `self`.
        let t = unsafe { TensorRef::from_device_ptr(self.addr, len, dtype, self.device, &[len], &[1]) }?;
        t.with_layout(shape, strides, offset)
    }

    /// A writable view of the buffer as `dtype` with a layout (bounds-checked).
    pub fn view_mut(
        &mut self,
        dtype: DType,
        shape: &[usize],
        strides: &[isize],
        offset: usize,
    ) -> Result<TensorMut<'_>, TensorError> {
        let len = self.len / dtype.size();
        // SAFETY: as in `view`; `&mut self` makes the view the only access path while it lives.
        let t = unsafe { TensorMut::from_device_ptr(self.addr, len, dtype, self.device, &[len], &[1]) }?;
        t.with_layout(shape, strides, offset)
    }
}

/// Failure of the staged runs ([`stage`], [`run_ssu_mirrored`], [`stage_ssu`], [`stage_conv_update`], …).
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The device arguments of a selective state update did not plan.
    #[error(transparent)]
    Plan(#[from] SsuError),
    /// The device arguments of a causal conv1d call did not plan.
    #[error(transparent)]
    ConvPlan(#[from] ConvError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A view could not be built.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The launcher given to [`stage`] failed (its message).
    #[error("{0}")]
    Run(String),
}

/// One host tensor copied to the device: its whole borrowed memory, with the same dtype,
/// shape, strides and offset, so that a device view of it has the host view's layout.
pub struct StagedTensor {
    buf: DeviceBuffer,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

impl std::fmt::Debug for StagedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedTensor").field("dtype", &self.dtype).field("shape", &self.shape).finish()
    }
}

impl StagedTensor {
    /// Copies the whole memory of host tensor `t` to `backend`'s device.
    pub fn upload(backend: &CudaBackend, t: &TensorRef<'_>) -> Result<Self, MirrorError> {
        let bytes = t.host_bytes().ok_or(TensorError::NotHost(t.device()))?;
        Ok(StagedTensor {
            buf: DeviceBuffer::from_host(backend, bytes)?,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            strides: t.strides().to_vec(),
            offset: t.layout().offset(),
        })
    }

    /// [`upload`](Self::upload) of an optional tensor.
    pub fn upload_opt(backend: &CudaBackend, t: Option<&TensorRef<'_>>) -> Result<Option<Self>, MirrorError> {
        t.map(|t| Self::upload(backend, t)).transpose()
    }

    /// A device view with the host tensor's layout.
    pub fn view(&self) -> Result<TensorRef<'_>, TensorError> {
        self.buf.view(self.dtype, &self.shape, &self.strides, self.offset)
    }

    /// A writable device view with the host tensor's layout.
    pub fn view_mut(&mut self) -> Result<TensorMut<'_>, TensorError> {
        self.buf.view_mut(self.dtype, &self.shape, &self.strides, self.offset)
    }

    /// The device buffer.
    pub fn buffer(&mut self) -> &mut DeviceBuffer {
        &mut self.buf
    }

    /// Copies the device memory back over the host tensor's whole memory (waits for the stream).
    pub fn copy_back(&self, host: &mut TensorMut<'_>) -> Result<(), MirrorError> {
        let bytes = self.buf.download()?;
        let device = host.device();
        let h = host.host_bytes_mut().ok_or(TensorError::NotHost(device))?;
        h.copy_from_slice(&bytes[..h.len()]);
        Ok(())
    }
}

fn opt_view(m: &Option<StagedTensor>) -> Result<Option<TensorRef<'_>>, TensorError> {
    m.as_ref().map(|m| m.view()).transpose()
}

/// The per-op half of staging: how one op's arguments map onto [`StagedTensor`]s. The
/// sequence itself (upload, run, wait, copy back, read the error word) is [`stage`], shared
/// by every op.
pub trait StageArgs: Sized {
    /// The op's argument struct.
    type Args<'a>;
    /// Copies every tensor of `args` (host tensors) to the backend's device.
    fn upload(backend: &CudaBackend, args: &Self::Args<'_>) -> Result<Self, MirrorError>;
    /// Device views of the staged tensors, as the arguments of one call (scalars as given).
    fn args(&mut self) -> Result<Self::Args<'_>, TensorError>;
    /// Copies every tensor the op writes back into the host arguments.
    fn copy_back(&self, host: &mut Self::Args<'_>) -> Result<(), MirrorError>;
}

/// The one host↔device staging of every op: copies the whole memory of every tensor of
/// `args` (host tensors) to `backend`'s device, calls `run` with the same call over the device
/// copies (same layouts), waits for the device, copies the written tensors back into the host
/// tensors, and reads the device error word ([`CudaBackend::check`]). `run` is what launches:
/// the backend itself or a runtime on the same device.
pub fn stage<S: StageArgs>(
    backend: &CudaBackend,
    mut args: S::Args<'_>,
    run: impl FnOnce(S::Args<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    let mut dev = S::upload(backend, &args)?;
    run(dev.args()?)?;
    backend.synchronize()?;
    dev.copy_back(&mut args)?;
    backend.check()?;
    Ok(())
}

/// The tensors of one selective state update, copied to the device (whole borrowed memory,
/// same layouts), plus its scalar arguments.
pub struct DeviceSsuArgs {
    state: StagedTensor,
    out: StagedTensor,
    x: StagedTensor,
    dt: StagedTensor,
    a: StagedTensor,
    b: StagedTensor,
    c: StagedTensor,
    d: Option<StagedTensor>,
    dt_bias: Option<StagedTensor>,
    z: Option<StagedTensor>,
    sbi: Option<StagedTensor>,
    dst: Option<StagedTensor>,
    nacc: Option<StagedTensor>,
    cu: Option<StagedTensor>,
    dt_softplus: bool,
    pad_slot_id: Option<i64>,
    stochastic_rounding: Option<ssm_ssu::StochasticRounding>,
}

impl DeviceSsuArgs {
    /// Copies every tensor of `args` (host tensors) to the backend's device.
    pub fn upload(backend: &CudaBackend, args: &SelectiveStateUpdate<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: &Option<TensorRef<'_>>| StagedTensor::upload_opt(backend, t.as_ref());
        Ok(DeviceSsuArgs {
            state: up(&args.state.as_ref())?,
            out: up(&args.out.as_ref())?,
            x: up(&args.x)?,
            dt: up(&args.dt)?,
            a: up(&args.a)?,
            b: up(&args.b)?,
            c: up(&args.c)?,
            d: opt(&args.d)?,
            dt_bias: opt(&args.dt_bias)?,
            z: opt(&args.z)?,
            sbi: opt(&args.state_batch_indices)?,
            dst: opt(&args.dst_state_batch_indices)?,
            nacc: opt(&args.num_accepted_tokens)?,
            cu: opt(&args.cu_seqlens)?,
            dt_softplus: args.dt_softplus,
            pad_slot_id: args.pad_slot_id,
            stochastic_rounding: args.stochastic_rounding,
        })
    }

    /// Device views of the tensors, as arguments of one call.
    pub fn args(&mut self) -> Result<SelectiveStateUpdate<'_>, TensorError> {
        Ok(SelectiveStateUpdate {
            state: self.state.view_mut()?,
            x: self.x.view()?,
            dt: self.dt.view()?,
            a: self.a.view()?,
            b: self.b.view()?,
            c: self.c.view()?,
            d: opt_view(&self.d)?,
            dt_bias: opt_view(&self.dt_bias)?,
            z: opt_view(&self.z)?,
            dt_softplus: self.dt_softplus,
            state_batch_indices: opt_view(&self.sbi)?,
            dst_state_batch_indices: opt_view(&self.dst)?,
            pad_slot_id: self.pad_slot_id,
            out: self.out.view_mut()?,
            num_accepted_tokens: opt_view(&self.nacc)?,
            cu_seqlens: opt_view(&self.cu)?,
            stochastic_rounding: self.stochastic_rounding,
        })
    }

    /// The state pool's device buffer.
    pub fn state_buffer(&mut self) -> &mut DeviceBuffer {
        self.state.buffer()
    }

    /// The output's device buffer.
    pub fn out_buffer(&mut self) -> &mut DeviceBuffer {
        self.out.buffer()
    }
}

impl StageArgs for DeviceSsuArgs {
    type Args<'a> = SelectiveStateUpdate<'a>;
    fn upload(backend: &CudaBackend, args: &SelectiveStateUpdate<'_>) -> Result<Self, MirrorError> {
        DeviceSsuArgs::upload(backend, args)
    }
    fn args(&mut self) -> Result<SelectiveStateUpdate<'_>, TensorError> {
        DeviceSsuArgs::args(self)
    }
    fn copy_back(&self, host: &mut SelectiveStateUpdate<'_>) -> Result<(), MirrorError> {
        self.state.copy_back(&mut host.state)?;
        self.out.copy_back(&mut host.out)
    }
}

/// Runs a selective state update given with **host** tensors on the CUDA backend: copies the
/// whole memory of every tensor to the device, plans and launches there, waits, and copies
/// `state` and `out` back into the host tensors. Then reads the device error word
/// ([`CudaBackend::check`]). Index values are checked by the kernel, not by the plan (the
/// plan sees device tables), which is what the garbage-index tests need.
pub fn run_ssu_mirrored(backend: &CudaBackend, args: SelectiveStateUpdate<'_>) -> Result<(), MirrorError> {
    stage_ssu(backend, args, |dev_args| Ok(backend.run(ssm_ssu::plan(dev_args)?)?))
}

/// [`stage`] for a selective state update.
pub fn stage_ssu(
    backend: &CudaBackend,
    args: SelectiveStateUpdate<'_>,
    run: impl FnOnce(SelectiveStateUpdate<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    stage::<DeviceSsuArgs>(backend, args, run)
}

/// The tensors of one `causal_conv1d_update`, copied to the device, plus its scalar arguments.
pub struct DeviceConvUpdateArgs {
    x: StagedTensor,
    conv_state: StagedTensor,
    layout: ConvStateLayout,
    weight: StagedTensor,
    bias: Option<StagedTensor>,
    activation: Activation,
    indices: Option<StagedTensor>,
    accepted: Option<StagedTensor>,
    starts: Option<StagedTensor>,
    pad_slot_id: Option<i64>,
    last_block: Option<StagedTensor>,
    initial_idx: Option<StagedTensor>,
    out: StagedTensor,
}

impl DeviceConvUpdateArgs {
    /// The conv-state pool's device buffer.
    pub fn state_buffer(&mut self) -> &mut DeviceBuffer {
        self.conv_state.buffer()
    }

    /// The output's device buffer.
    pub fn out_buffer(&mut self) -> &mut DeviceBuffer {
        self.out.buffer()
    }
}

impl StageArgs for DeviceConvUpdateArgs {
    type Args<'a> = CausalConv1dUpdateArgs<'a>;
    fn upload(backend: &CudaBackend, a: &CausalConv1dUpdateArgs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: &Option<TensorRef<'_>>| StagedTensor::upload_opt(backend, t.as_ref());
        Ok(DeviceConvUpdateArgs {
            x: up(&a.x)?,
            conv_state: up(&a.conv_state.as_ref())?,
            layout: a.conv_state_layout,
            weight: up(&a.weight)?,
            bias: opt(&a.bias)?,
            activation: a.activation,
            indices: opt(&a.conv_state_indices)?,
            accepted: opt(&a.num_accepted_tokens)?,
            starts: opt(&a.query_start_loc)?,
            pad_slot_id: a.pad_slot_id,
            last_block: opt(&a.block_idx_last_scheduled_token)?,
            initial_idx: opt(&a.initial_state_idx)?,
            out: up(&a.out.as_ref())?,
        })
    }
    fn args(&mut self) -> Result<CausalConv1dUpdateArgs<'_>, TensorError> {
        Ok(CausalConv1dUpdateArgs {
            x: self.x.view()?,
            conv_state: self.conv_state.view_mut()?,
            conv_state_layout: self.layout,
            weight: self.weight.view()?,
            bias: opt_view(&self.bias)?,
            activation: self.activation,
            conv_state_indices: opt_view(&self.indices)?,
            num_accepted_tokens: opt_view(&self.accepted)?,
            query_start_loc: opt_view(&self.starts)?,
            pad_slot_id: self.pad_slot_id,
            block_idx_last_scheduled_token: opt_view(&self.last_block)?,
            initial_state_idx: opt_view(&self.initial_idx)?,
            out: self.out.view_mut()?,
        })
    }
    fn copy_back(&self, host: &mut CausalConv1dUpdateArgs<'_>) -> Result<(), MirrorError> {
        self.conv_state.copy_back(&mut host.conv_state)?;
        self.out.copy_back(&mut host.out)
    }
}

/// The tensors of one `causal_conv1d_fn`, copied to the device, plus its scalar arguments.
pub struct DeviceConvFnArgs {
    x: StagedTensor,
    weight: StagedTensor,
    bias: Option<StagedTensor>,
    conv_states: StagedTensor,
    layout: ConvStateLayout,
    starts: StagedTensor,
    indices: Option<StagedTensor>,
    has_initial_state: Option<StagedTensor>,
    activation: Activation,
    pad_slot_id: Option<i64>,
    out: StagedTensor,
}

impl StageArgs for DeviceConvFnArgs {
    type Args<'a> = CausalConv1dFnArgs<'a>;
    fn upload(backend: &CudaBackend, a: &CausalConv1dFnArgs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: &Option<TensorRef<'_>>| StagedTensor::upload_opt(backend, t.as_ref());
        Ok(DeviceConvFnArgs {
            x: up(&a.x)?,
            weight: up(&a.weight)?,
            bias: opt(&a.bias)?,
            conv_states: up(&a.conv_states.as_ref())?,
            layout: a.conv_state_layout,
            starts: up(&a.query_start_loc)?,
            indices: opt(&a.cache_indices)?,
            has_initial_state: opt(&a.has_initial_state)?,
            activation: a.activation,
            pad_slot_id: a.pad_slot_id,
            out: up(&a.out.as_ref())?,
        })
    }
    fn args(&mut self) -> Result<CausalConv1dFnArgs<'_>, TensorError> {
        Ok(CausalConv1dFnArgs {
            x: self.x.view()?,
            weight: self.weight.view()?,
            bias: opt_view(&self.bias)?,
            conv_states: self.conv_states.view_mut()?,
            conv_state_layout: self.layout,
            query_start_loc: self.starts.view()?,
            cache_indices: opt_view(&self.indices)?,
            has_initial_state: opt_view(&self.has_initial_state)?,
            activation: self.activation,
            pad_slot_id: self.pad_slot_id,
            out: self.out.view_mut()?,
        })
    }
    fn copy_back(&self, host: &mut CausalConv1dFnArgs<'_>) -> Result<(), MirrorError> {
        self.conv_states.copy_back(&mut host.conv_states)?;
        self.out.copy_back(&mut host.out)
    }
}

/// [`stage`] for `causal_conv1d_update`.
pub fn stage_conv_update(
    backend: &CudaBackend,
    args: CausalConv1dUpdateArgs<'_>,
    run: impl FnOnce(CausalConv1dUpdateArgs<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    stage::<DeviceConvUpdateArgs>(backend, args, run)
}

/// [`stage`] for `causal_conv1d_fn`.
pub fn stage_conv_fn(
    backend: &CudaBackend,
    args: CausalConv1dFnArgs<'_>,
    run: impl FnOnce(CausalConv1dFnArgs<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    stage::<DeviceConvFnArgs>(backend, args, run)
}

/// Runs a `causal_conv1d_update` given with host tensors on the CUDA backend itself (staged,
/// planned on the device views, so index values are checked by the kernel).
pub fn run_conv_update_mirrored(backend: &CudaBackend, args: CausalConv1dUpdateArgs<'_>) -> Result<(), MirrorError> {
    stage_conv_update(backend, args, |a| Ok(backend.run(ssm_conv::plan(a)?)?))
}

/// Runs a `causal_conv1d_fn` given with host tensors on the CUDA backend itself.
pub fn run_conv_fn_mirrored(backend: &CudaBackend, args: CausalConv1dFnArgs<'_>) -> Result<(), MirrorError> {
    stage_conv_fn(backend, args, |a| Ok(backend.run(ssm_conv::plan(a)?)?))
}

/// A host-tensor façade of the CUDA backend for the conv ops: every call is staged
/// ([`stage`]) and run on the device, so generic checks written against
/// [`ssm_conv::ConvBackend`] (host tensors) run on the GPU unchanged.
#[derive(Debug, Clone, Copy)]
pub struct Mirrored<'b>(pub &'b CudaBackend);

impl Run<CausalConv1dUpdateArgs<'_>> for Mirrored<'_> {
    type Error = MirrorError;
    fn run(&self, call: Planned<CausalConv1dUpdateArgs<'_>>) -> Result<(), MirrorError> {
        run_conv_update_mirrored(self.0, call.into_parts().0)
    }
}

impl Run<CausalConv1dFnArgs<'_>> for Mirrored<'_> {
    type Error = MirrorError;
    fn run(&self, call: Planned<CausalConv1dFnArgs<'_>>) -> Result<(), MirrorError> {
        run_conv_fn_mirrored(self.0, call.into_parts().0)
    }
}
