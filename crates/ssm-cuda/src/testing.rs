//! Device buffers and host↔device mirroring, for tests, benches and tools.
//!
//! Not on any hot path: these allocate, copy and synchronise.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ssm_ssu::{SelectiveStateUpdate, SsuError};
use ssm_tensor::{DType, Run, TensorError, TensorMut, TensorRef};

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

/// Failure of [`run_ssu_mirrored`] and [`stage_ssu`].
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The device arguments did not plan.
    #[error(transparent)]
    Plan(#[from] SsuError),
    /// The device arguments of a GDN op did not plan.
    #[error(transparent)]
    GdnPlan(#[from] ssm_gdn::GdnError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A view could not be built.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The launcher given to [`stage_ssu`] failed (its message).
    #[error("{0}")]
    Run(String),
}

struct Mirrored {
    buf: DeviceBuffer,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

fn mirror(backend: &CudaBackend, t: &TensorRef<'_>) -> Result<Mirrored, MirrorError> {
    let bytes = t.host_bytes().ok_or(TensorError::NotHost(t.device()))?;
    Ok(Mirrored {
        buf: DeviceBuffer::from_host(backend, bytes)?,
        dtype: t.dtype(),
        shape: t.shape().to_vec(),
        strides: t.strides().to_vec(),
        offset: t.layout().offset(),
    })
}

impl Mirrored {
    fn view(&self) -> Result<TensorRef<'_>, TensorError> {
        self.buf.view(self.dtype, &self.shape, &self.strides, self.offset)
    }
    fn view_mut(&mut self) -> Result<TensorMut<'_>, TensorError> {
        self.buf.view_mut(self.dtype, &self.shape, &self.strides, self.offset)
    }
}

/// The tensors of one selective state update, copied to the device (whole borrowed memory,
/// same layouts), plus its scalar arguments.
pub struct DeviceSsuArgs {
    state: Mirrored,
    out: Mirrored,
    x: Mirrored,
    dt: Mirrored,
    a: Mirrored,
    b: Mirrored,
    c: Mirrored,
    d: Option<Mirrored>,
    dt_bias: Option<Mirrored>,
    z: Option<Mirrored>,
    sbi: Option<Mirrored>,
    dst: Option<Mirrored>,
    nacc: Option<Mirrored>,
    cu: Option<Mirrored>,
    dt_softplus: bool,
    pad_slot_id: Option<i64>,
    stochastic_rounding: Option<ssm_ssu::StochasticRounding>,
}

fn ov(m: &Option<Mirrored>) -> Result<Option<TensorRef<'_>>, TensorError> {
    m.as_ref().map(|m| m.view()).transpose()
}

impl DeviceSsuArgs {
    /// Copies every tensor of `args` (host tensors) to the backend's device.
    pub fn upload(backend: &CudaBackend, args: &SelectiveStateUpdate<'_>) -> Result<Self, MirrorError> {
        let opt = |t: &Option<TensorRef<'_>>| t.as_ref().map(|t| mirror(backend, t)).transpose();
        Ok(DeviceSsuArgs {
            state: mirror(backend, &args.state.as_ref())?,
            out: mirror(backend, &args.out.as_ref())?,
            x: mirror(backend, &args.x)?,
            dt: mirror(backend, &args.dt)?,
            a: mirror(backend, &args.a)?,
            b: mirror(backend, &args.b)?,
            c: mirror(backend, &args.c)?,
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
            d: ov(&self.d)?,
            dt_bias: ov(&self.dt_bias)?,
            z: ov(&self.z)?,
            dt_softplus: self.dt_softplus,
            state_batch_indices: ov(&self.sbi)?,
            dst_state_batch_indices: ov(&self.dst)?,
            pad_slot_id: self.pad_slot_id,
            out: self.out.view_mut()?,
            num_accepted_tokens: ov(&self.nacc)?,
            cu_seqlens: ov(&self.cu)?,
            stochastic_rounding: self.stochastic_rounding,
        })
    }

    /// The state pool's device buffer.
    pub fn state_buffer(&mut self) -> &mut DeviceBuffer {
        &mut self.state.buf
    }

    /// The output's device buffer.
    pub fn out_buffer(&mut self) -> &mut DeviceBuffer {
        &mut self.out.buf
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

/// The one host↔device staging of a selective state update: copies the whole memory of every
/// tensor of `args` (host tensors) to `backend`'s device, calls `run` with the same call over
/// the device copies (same layouts), waits for the device, copies `state` and `out` back into
/// the host tensors, and reads the device error word ([`CudaBackend::check`]). `run` is what
/// launches: the backend itself ([`run_ssu_mirrored`]) or a runtime on the same device.
pub fn stage_ssu(
    backend: &CudaBackend,
    mut args: SelectiveStateUpdate<'_>,
    run: impl FnOnce(SelectiveStateUpdate<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    let mut dev = DeviceSsuArgs::upload(backend, &args)?;
    run(dev.args()?)?;
    backend.synchronize()?;
    let sb = dev.state.buf.download()?;
    let ob = dev.out.buf.download()?;
    let state_dev = args.state.device();
    let hs = args.state.host_bytes_mut().ok_or(TensorError::NotHost(state_dev))?;
    hs.copy_from_slice(&sb[..hs.len()]);
    let out_dev = args.out.device();
    let ho = args.out.host_bytes_mut().ok_or(TensorError::NotHost(out_dev))?;
    ho.copy_from_slice(&ob[..ho.len()]);
    backend.check()?;
    Ok(())
}

/// One host tensor copied to the device (its whole borrowed memory, same layout): the generic
/// piece of every op's staging. Upload with [`StagedTensor::upload`], hand the device views
/// ([`view`](StagedTensor::view) / [`view_mut`](StagedTensor::view_mut)) to a call, and copy
/// written tensors back with [`download_into`](StagedTensor::download_into).
pub struct StagedTensor(Mirrored);

impl StagedTensor {
    /// Copies the whole memory of the host tensor `t` to `backend`'s device.
    pub fn upload(backend: &CudaBackend, t: &TensorRef<'_>) -> Result<Self, MirrorError> {
        Ok(StagedTensor(mirror(backend, t)?))
    }

    /// [`upload`](Self::upload) of an optional tensor.
    pub fn upload_opt(backend: &CudaBackend, t: Option<&TensorRef<'_>>) -> Result<Option<Self>, MirrorError> {
        t.map(|t| Self::upload(backend, t)).transpose()
    }

    /// The device view, with the host tensor's layout.
    pub fn view(&self) -> Result<TensorRef<'_>, TensorError> {
        self.0.view()
    }

    /// The writable device view, with the host tensor's layout.
    pub fn view_mut(&mut self) -> Result<TensorMut<'_>, TensorError> {
        self.0.view_mut()
    }

    /// The device buffer (e.g. to corrupt or inspect it in a test).
    pub fn buffer(&mut self) -> &mut DeviceBuffer {
        &mut self.0.buf
    }

    /// Copies the device memory back over the host tensor `t` (the one it was uploaded from;
    /// waits for the stream).
    pub fn download_into(&self, t: &mut TensorMut<'_>) -> Result<(), MirrorError> {
        let bytes = self.0.buf.download()?;
        let device = t.device();
        let host = t.host_bytes_mut().ok_or(TensorError::NotHost(device))?;
        host.copy_from_slice(&bytes[..host.len()]);
        Ok(())
    }
}

/// Optional device view of an optional staged tensor.
fn staged_ref(t: &Option<StagedTensor>) -> Result<Option<TensorRef<'_>>, TensorError> {
    t.as_ref().map(|t| t.view()).transpose()
}

fn staged_mut(t: &mut Option<StagedTensor>) -> Result<Option<TensorMut<'_>>, TensorError> {
    t.as_mut().map(|t| t.view_mut()).transpose()
}

fn download_opt(s: &Option<StagedTensor>, t: Option<&mut TensorMut<'_>>) -> Result<(), MirrorError> {
    if let (Some(s), Some(t)) = (s, t) {
        s.download_into(t)?;
    }
    Ok(())
}

/// The host↔device staging of `fused_gdn_gating` (as [`stage_ssu`]): uploads every tensor of
/// `args`, calls `run` with the device call, waits, copies `g` and `beta_output` back, and reads
/// the device error word.
pub fn stage_gdn_gating(
    backend: &CudaBackend,
    mut args: ssm_gdn::FusedGdnGatingArgs<'_>,
    run: impl FnOnce(ssm_gdn::FusedGdnGatingArgs<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
    let (a_log, a, b, dt_bias) = (up(&args.a_log)?, up(&args.a)?, up(&args.b)?, up(&args.dt_bias)?);
    let (mut g, mut beta_output) = (up(&args.g.as_ref())?, up(&args.beta_output.as_ref())?);
    run(ssm_gdn::FusedGdnGatingArgs {
        a_log: a_log.view()?,
        a: a.view()?,
        b: b.view()?,
        dt_bias: dt_bias.view()?,
        beta: args.beta,
        threshold: args.threshold,
        g: g.view_mut()?,
        beta_output: beta_output.view_mut()?,
    })?;
    backend.synchronize()?;
    g.download_into(&mut args.g)?;
    beta_output.download_into(&mut args.beta_output)?;
    backend.check()?;
    Ok(())
}

/// The tensors both recurrent GDN ops share, staged.
struct StagedRecurrent {
    q: StagedTensor,
    k: StagedTensor,
    v: StagedTensor,
    o: StagedTensor,
    initial_state: Option<StagedTensor>,
    final_state: Option<StagedTensor>,
    cu: Option<StagedTensor>,
    ix: Option<StagedTensor>,
    nacc: Option<StagedTensor>,
}

impl StagedRecurrent {
    #[allow(clippy::too_many_arguments)]
    fn upload(
        backend: &CudaBackend,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &TensorMut<'_>,
        initial_state: Option<&TensorMut<'_>>,
        final_state: Option<&TensorMut<'_>>,
        tables: [Option<&TensorRef<'_>>; 3],
    ) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        Ok(StagedRecurrent {
            q: up(q)?,
            k: up(k)?,
            v: up(v)?,
            o: up(&o.as_ref())?,
            initial_state: StagedTensor::upload_opt(backend, initial_state.map(|t| t.as_ref()).as_ref())?,
            final_state: StagedTensor::upload_opt(backend, final_state.map(|t| t.as_ref()).as_ref())?,
            cu: StagedTensor::upload_opt(backend, tables[0])?,
            ix: StagedTensor::upload_opt(backend, tables[1])?,
            nacc: StagedTensor::upload_opt(backend, tables[2])?,
        })
    }

    fn download(
        &self,
        backend: &CudaBackend,
        o: &mut TensorMut<'_>,
        initial_state: Option<&mut TensorMut<'_>>,
        final_state: Option<&mut TensorMut<'_>>,
    ) -> Result<(), MirrorError> {
        backend.synchronize()?;
        self.o.download_into(o)?;
        download_opt(&self.initial_state, initial_state)?;
        download_opt(&self.final_state, final_state)?;
        backend.check()?;
        Ok(())
    }
}

/// The host↔device staging of `fused_recurrent_gated_delta_rule` (as [`stage_ssu`]): `o`,
/// `initial_state` and `final_state` are copied back.
pub fn stage_gdn_recurrent(
    backend: &CudaBackend,
    mut args: ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    run: impl FnOnce(ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    let mut s = StagedRecurrent::upload(
        backend,
        &args.q,
        &args.k,
        &args.v,
        &args.o,
        args.initial_state.as_ref(),
        args.final_state.as_ref(),
        [args.cu_seqlens.as_ref(), args.ssm_state_indices.as_ref(), args.num_accepted_tokens.as_ref()],
    )?;
    let g = StagedTensor::upload(backend, &args.g)?;
    let beta = StagedTensor::upload_opt(backend, args.beta.as_ref())?;
    run(ssm_gdn::FusedRecurrentGatedDeltaRuleArgs {
        q: s.q.view()?,
        k: s.k.view()?,
        v: s.v.view()?,
        g: g.view()?,
        beta: staged_ref(&beta)?,
        scale: args.scale,
        initial_state: staged_mut(&mut s.initial_state)?,
        final_state: staged_mut(&mut s.final_state)?,
        cu_seqlens: staged_ref(&s.cu)?,
        ssm_state_indices: staged_ref(&s.ix)?,
        num_accepted_tokens: staged_ref(&s.nacc)?,
        use_qk_l2norm_in_kernel: args.use_qk_l2norm_in_kernel,
        eps: args.eps,
        state_layout: args.state_layout,
        o: s.o.view_mut()?,
    })?;
    s.download(backend, &mut args.o, args.initial_state.as_mut(), args.final_state.as_mut())
}

/// The host↔device staging of `fused_sigmoid_gating_delta_rule_update` (as [`stage_ssu`]): `o`,
/// `initial_state` and `final_state` are copied back.
pub fn stage_gdn_sigmoid(
    backend: &CudaBackend,
    mut args: ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    run: impl FnOnce(ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>) -> Result<(), MirrorError>,
) -> Result<(), MirrorError> {
    let mut s = StagedRecurrent::upload(
        backend,
        &args.q,
        &args.k,
        &args.v,
        &args.o,
        args.initial_state.as_ref(),
        args.final_state.as_ref(),
        [args.cu_seqlens.as_ref(), args.ssm_state_indices.as_ref(), args.num_accepted_tokens.as_ref()],
    )?;
    let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
    let (a_log, a, b, dt_bias) = (up(&args.a_log)?, up(&args.a)?, up(&args.b)?, up(&args.dt_bias)?);
    run(ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs {
        a_log: a_log.view()?,
        a: a.view()?,
        b: b.view()?,
        dt_bias: dt_bias.view()?,
        q: s.q.view()?,
        k: s.k.view()?,
        v: s.v.view()?,
        beta: args.beta,
        threshold: args.threshold,
        scale: args.scale,
        initial_state: staged_mut(&mut s.initial_state)?,
        final_state: staged_mut(&mut s.final_state)?,
        cu_seqlens: staged_ref(&s.cu)?,
        ssm_state_indices: staged_ref(&s.ix)?,
        num_accepted_tokens: staged_ref(&s.nacc)?,
        use_qk_l2norm_in_kernel: args.use_qk_l2norm_in_kernel,
        eps: args.eps,
        state_layout: args.state_layout,
        o: s.o.view_mut()?,
    })?;
    s.download(backend, &mut args.o, args.initial_state.as_mut(), args.final_state.as_mut())
}
