//! Device buffers and host↔device mirroring, for tests, benches and tools.
//!
//! Not on any hot path: these allocate, copy and synchronise.

use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvError, ConvStateLayout};
use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, GdnError, StateLayout,
};
use ssm_ring::{CheckpointingSsuArgs, CommitRingTrackersArgs, RingError, RingTrackers, UpdateRingTrackersArgs};
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, SsdError};
use ssm_ssu::{SelectiveStateUpdateArgs, SsuError};
use ssm_tensor::{CopyRowsArgs, DType, Op, Planned, RowDirection, RowsError, Run, TensorError, TensorMut, TensorRef};

pub use crate::DeviceBuffer;
use crate::{CudaBackend, CudaError};

/// The skip rule of every GPU test: `true` where a device and NVRTC are ready; otherwise prints
/// why `test` is skipped and returns `false`, or panics when `SSM_REQUIRE_GPU=1` (the GPU
/// bundle's `run.sh` sets it, so a missing GPU fails there instead of passing silently).
pub fn gpu_ready(test: &str) -> bool {
    let require = std::env::var("SSM_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let reason = match crate::probe() {
        crate::Availability::Ready { .. } if !crate::nvrtc_available() => {
            "NVRTC (libnvrtc.so.13) not found".to_string()
        }
        crate::Availability::Ready { .. } => return true,
        other => other.to_string(),
    };
    assert!(!require, "{test}: SSM_REQUIRE_GPU=1 but {reason}");
    eprintln!("skipping {test}: {reason}");
    false
}

/// Failure of a staged run ([`stage`], [`run_staged`], [`Mirrored`]).
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The device arguments of a selective state update did not plan.
    #[error(transparent)]
    Plan(#[from] SsuError),
    /// The device arguments of a causal conv1d call did not plan.
    #[error(transparent)]
    ConvPlan(#[from] ConvError),
    /// The device arguments of a GDN op did not plan.
    #[error(transparent)]
    GdnPlan(#[from] GdnError),
    /// The device arguments of a ReplaySSM op did not plan.
    #[error(transparent)]
    RingPlan(#[from] RingError),
    /// The device arguments of an SSD prefill did not plan.
    #[error(transparent)]
    SsdPlan(#[from] SsdError),
    /// The device arguments of a `copy_rows` did not plan.
    #[error(transparent)]
    RowsPlan(#[from] RowsError),
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

fn opt_view_mut(m: &mut Option<StagedTensor>) -> Result<Option<TensorMut<'_>>, TensorError> {
    m.as_mut().map(|m| m.view_mut()).transpose()
}

fn opt_copy_back(m: &Option<StagedTensor>, host: Option<&mut TensorMut<'_>>) -> Result<(), MirrorError> {
    match (m, host) {
        (Some(m), Some(host)) => m.copy_back(host),
        _ => Ok(()),
    }
}

/// The per-op half of staging: how one op's arguments map onto [`StagedTensor`]s. The
/// sequence itself (upload, run, wait, copy back, read the error word) is [`stage`], shared
/// by every op.
pub trait StageArgs: Sized {
    /// The op's argument struct.
    type Args<'a>: Op;
    /// Copies every tensor of `args` (host tensors) to the backend's device.
    fn upload(backend: &CudaBackend, args: &Self::Args<'_>) -> Result<Self, MirrorError>;
    /// Device views of the staged tensors, as the arguments of one call (scalars as given).
    fn args(&mut self) -> Result<Self::Args<'_>, TensorError>;
    /// Copies every tensor the op writes back into the host arguments.
    fn copy_back(&self, host: &mut Self::Args<'_>) -> Result<(), MirrorError>;
    /// Plans `args` (device views: index values are left to the kernel) and runs them on
    /// `backend` itself ([`plan_and_run`]).
    fn launch(backend: &CudaBackend, args: Self::Args<'_>) -> Result<(), MirrorError>;
}

/// Plans a call whose tensors live on `backend`'s device and runs it there: what
/// [`StageArgs::launch`] does for every op.
pub fn plan_and_run<A: Op>(backend: &CudaBackend, args: A) -> Result<(), MirrorError>
where
    CudaBackend: Run<A, Error = CudaError>,
    MirrorError: From<A::Error>,
{
    Ok(backend.run(Planned::new(args)?)?)
}

/// Runs a call given with **host** tensors on the CUDA backend itself: [`stage`] with
/// [`StageArgs::launch`]. The plan sees the device copies, so index values are checked by the
/// kernel (the device error word), which is what the garbage-index tests need.
pub fn run_staged<S: StageArgs>(backend: &CudaBackend, args: S::Args<'_>) -> Result<(), MirrorError> {
    stage::<S>(backend, args, |dev| S::launch(backend, dev))
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
    disable_state_update: bool,
    ist: Option<StagedTensor>,
    isi: Option<StagedTensor>,
    seed: Option<StagedTensor>,
    scale: Option<StagedTensor>,
    ist_scales: Option<StagedTensor>,
}

impl DeviceSsuArgs {
    /// The state pool's device buffer.
    pub fn state_buffer(&mut self) -> &mut DeviceBuffer {
        self.state.buffer()
    }

    /// The output's device buffer.
    pub fn out_buffer(&mut self) -> &mut DeviceBuffer {
        self.out.buffer()
    }

    /// The `state_scale` tensor's device buffer, when staged (an i16 state).
    pub fn scale_buffer(&mut self) -> Option<&mut DeviceBuffer> {
        self.scale.as_mut().map(StagedTensor::buffer)
    }

    /// The `rand_seed` tensor's device buffer, when staged.
    pub fn seed_buffer(&mut self) -> Option<&mut DeviceBuffer> {
        self.seed.as_mut().map(StagedTensor::buffer)
    }
}

impl StageArgs for DeviceSsuArgs {
    type Args<'a> = SelectiveStateUpdateArgs<'a>;
    fn upload(backend: &CudaBackend, args: &SelectiveStateUpdateArgs<'_>) -> Result<Self, MirrorError> {
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
            disable_state_update: args.disable_state_update,
            ist: StagedTensor::upload_opt(
                backend,
                args.intermediate_states_buffer.as_ref().map(|t| t.as_ref()).as_ref(),
            )?,
            isi: opt(&args.intermediate_state_indices)?,
            seed: opt(&args.rand_seed)?,
            scale: StagedTensor::upload_opt(backend, args.state_scale.as_ref().map(|t| t.as_ref()).as_ref())?,
            ist_scales: StagedTensor::upload_opt(
                backend,
                args.intermediate_state_scales.as_ref().map(|t| t.as_ref()).as_ref(),
            )?,
        })
    }
    fn args(&mut self) -> Result<SelectiveStateUpdateArgs<'_>, TensorError> {
        Ok(SelectiveStateUpdateArgs {
            d: opt_view(&self.d)?,
            dt_bias: opt_view(&self.dt_bias)?,
            z: opt_view(&self.z)?,
            dt_softplus: self.dt_softplus,
            state_batch_indices: opt_view(&self.sbi)?,
            dst_state_batch_indices: opt_view(&self.dst)?,
            pad_slot_id: self.pad_slot_id,
            num_accepted_tokens: opt_view(&self.nacc)?,
            cu_seqlens: opt_view(&self.cu)?,
            stochastic_rounding: self.stochastic_rounding,
            disable_state_update: self.disable_state_update,
            intermediate_states_buffer: opt_view_mut(&mut self.ist)?,
            intermediate_state_indices: opt_view(&self.isi)?,
            rand_seed: opt_view(&self.seed)?,
            state_scale: opt_view_mut(&mut self.scale)?,
            intermediate_state_scales: opt_view_mut(&mut self.ist_scales)?,
            ..SelectiveStateUpdateArgs::new(
                self.state.view_mut()?,
                self.x.view()?,
                self.dt.view()?,
                self.a.view()?,
                self.b.view()?,
                self.c.view()?,
                self.out.view_mut()?,
            )
        })
    }
    fn copy_back(&self, host: &mut SelectiveStateUpdateArgs<'_>) -> Result<(), MirrorError> {
        self.state.copy_back(&mut host.state)?;
        opt_copy_back(&self.ist, host.intermediate_states_buffer.as_mut())?;
        opt_copy_back(&self.scale, host.state_scale.as_mut())?;
        opt_copy_back(&self.ist_scales, host.intermediate_state_scales.as_mut())?;
        self.out.copy_back(&mut host.out)
    }
    fn launch(backend: &CudaBackend, args: SelectiveStateUpdateArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
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
    fn launch(backend: &CudaBackend, args: CausalConv1dUpdateArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
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
    checkpoint_offsets: Option<StagedTensor>,
    checkpoint_state_indices: Option<StagedTensor>,
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
            checkpoint_offsets: opt(&a.checkpoint_offsets)?,
            checkpoint_state_indices: opt(&a.checkpoint_state_indices)?,
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
            checkpoint_offsets: opt_view(&self.checkpoint_offsets)?,
            checkpoint_state_indices: opt_view(&self.checkpoint_state_indices)?,
            out: self.out.view_mut()?,
        })
    }
    fn copy_back(&self, host: &mut CausalConv1dFnArgs<'_>) -> Result<(), MirrorError> {
        self.conv_states.copy_back(&mut host.conv_states)?;
        self.out.copy_back(&mut host.out)
    }
    fn launch(backend: &CudaBackend, args: CausalConv1dFnArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// [`GateInputs`] (what both gating GDN ops share) copied to the device.
struct StagedGates {
    a_log: StagedTensor,
    a: StagedTensor,
    b: StagedTensor,
    dt_bias: StagedTensor,
    beta: f32,
    threshold: f32,
}

impl StagedGates {
    fn upload(backend: &CudaBackend, g: &GateInputs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        Ok(StagedGates {
            a_log: up(&g.a_log)?,
            a: up(&g.a)?,
            b: up(&g.b)?,
            dt_bias: up(&g.dt_bias)?,
            beta: g.beta,
            threshold: g.threshold,
        })
    }

    fn inputs(&self) -> Result<GateInputs<'_>, TensorError> {
        Ok(GateInputs {
            a_log: self.a_log.view()?,
            a: self.a.view()?,
            b: self.b.view()?,
            dt_bias: self.dt_bias.view()?,
            beta: self.beta,
            threshold: self.threshold,
        })
    }
}

/// The tensors of one `copy_rows`, copied to the device, plus its direction.
pub struct DeviceCopyRowsArgs {
    src: StagedTensor,
    dst: StagedTensor,
    index: StagedTensor,
    direction: RowDirection,
}

impl StageArgs for DeviceCopyRowsArgs {
    type Args<'a> = CopyRowsArgs<'a>;
    fn upload(backend: &CudaBackend, a: &CopyRowsArgs<'_>) -> Result<Self, MirrorError> {
        Ok(DeviceCopyRowsArgs {
            src: StagedTensor::upload(backend, &a.src)?,
            dst: StagedTensor::upload(backend, &a.dst.as_ref())?,
            index: StagedTensor::upload(backend, &a.index)?,
            direction: a.direction,
        })
    }
    fn args(&mut self) -> Result<CopyRowsArgs<'_>, TensorError> {
        Ok(CopyRowsArgs {
            src: self.src.view()?,
            dst: self.dst.view_mut()?,
            index: self.index.view()?,
            direction: self.direction,
        })
    }
    fn copy_back(&self, host: &mut CopyRowsArgs<'_>) -> Result<(), MirrorError> {
        self.dst.copy_back(&mut host.dst)
    }
    fn launch(backend: &CudaBackend, args: CopyRowsArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The tensors of one `fused_gdn_gating`, copied to the device, plus its scalar arguments.
pub struct DeviceGdnGatingArgs {
    gates: StagedGates,
    g: StagedTensor,
    beta_output: StagedTensor,
}

impl StageArgs for DeviceGdnGatingArgs {
    type Args<'a> = FusedGdnGatingArgs<'a>;
    fn upload(backend: &CudaBackend, a: &FusedGdnGatingArgs<'_>) -> Result<Self, MirrorError> {
        Ok(DeviceGdnGatingArgs {
            gates: StagedGates::upload(backend, &a.gates)?,
            g: StagedTensor::upload(backend, &a.g.as_ref())?,
            beta_output: StagedTensor::upload(backend, &a.beta_output.as_ref())?,
        })
    }
    fn args(&mut self) -> Result<FusedGdnGatingArgs<'_>, TensorError> {
        Ok(FusedGdnGatingArgs {
            gates: self.gates.inputs()?,
            g: self.g.view_mut()?,
            beta_output: self.beta_output.view_mut()?,
        })
    }
    fn copy_back(&self, host: &mut FusedGdnGatingArgs<'_>) -> Result<(), MirrorError> {
        self.g.copy_back(&mut host.g)?;
        self.beta_output.copy_back(&mut host.beta_output)
    }
    fn launch(backend: &CudaBackend, args: FusedGdnGatingArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// A [`DeltaRuleArgs`] (what both recurrent GDN ops share) copied to the device: tensors
/// staged, scalars as given. One staging for [`DeviceGdnRecurrentArgs`] and
/// [`DeviceGdnSigmoidArgs`].
struct StagedRule {
    q: StagedTensor,
    k: StagedTensor,
    v: StagedTensor,
    o: StagedTensor,
    initial_state: Option<StagedTensor>,
    final_state: Option<StagedTensor>,
    tables: [Option<StagedTensor>; 3],
    scale: Option<f32>,
    l2norm: bool,
    eps: f32,
    layout: StateLayout,
}

impl StagedRule {
    fn upload(backend: &CudaBackend, a: &DeltaRuleArgs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: Option<&TensorRef<'_>>| StagedTensor::upload_opt(backend, t);
        let opt_mut = |t: &Option<TensorMut<'_>>| opt(t.as_ref().map(|t| t.as_ref()).as_ref());
        Ok(StagedRule {
            q: up(&a.q)?,
            k: up(&a.k)?,
            v: up(&a.v)?,
            o: up(&a.o.as_ref())?,
            initial_state: opt_mut(&a.initial_state)?,
            final_state: opt_mut(&a.final_state)?,
            tables: [
                opt(a.cu_seqlens.as_ref())?,
                opt(a.ssm_state_indices.as_ref())?,
                opt(a.num_accepted_tokens.as_ref())?,
            ],
            scale: a.scale,
            l2norm: a.use_qk_l2norm_in_kernel,
            eps: a.eps,
            layout: a.state_layout,
        })
    }

    fn args(&mut self) -> Result<DeltaRuleArgs<'_>, TensorError> {
        let [cu, ix, nacc] = &self.tables;
        Ok(DeltaRuleArgs {
            q: self.q.view()?,
            k: self.k.view()?,
            v: self.v.view()?,
            scale: self.scale,
            initial_state: opt_view_mut(&mut self.initial_state)?,
            final_state: opt_view_mut(&mut self.final_state)?,
            cu_seqlens: opt_view(cu)?,
            ssm_state_indices: opt_view(ix)?,
            num_accepted_tokens: opt_view(nacc)?,
            use_qk_l2norm_in_kernel: self.l2norm,
            eps: self.eps,
            state_layout: self.layout,
            o: self.o.view_mut()?,
        })
    }

    /// Copies `o` and both states back.
    fn copy_back(&self, host: &mut DeltaRuleArgs<'_>) -> Result<(), MirrorError> {
        self.o.copy_back(&mut host.o)?;
        opt_copy_back(&self.initial_state, host.initial_state.as_mut())?;
        opt_copy_back(&self.final_state, host.final_state.as_mut())
    }
}

/// The tensors of one `fused_recurrent_gated_delta_rule`, copied to the device, plus its scalars.
pub struct DeviceGdnRecurrentArgs {
    rule: StagedRule,
    g: StagedTensor,
    beta: Option<StagedTensor>,
}

impl StageArgs for DeviceGdnRecurrentArgs {
    type Args<'a> = FusedRecurrentGatedDeltaRuleArgs<'a>;
    fn upload(backend: &CudaBackend, a: &FusedRecurrentGatedDeltaRuleArgs<'_>) -> Result<Self, MirrorError> {
        Ok(DeviceGdnRecurrentArgs {
            rule: StagedRule::upload(backend, &a.rule)?,
            g: StagedTensor::upload(backend, &a.g)?,
            beta: StagedTensor::upload_opt(backend, a.beta.as_ref())?,
        })
    }
    fn args(&mut self) -> Result<FusedRecurrentGatedDeltaRuleArgs<'_>, TensorError> {
        Ok(FusedRecurrentGatedDeltaRuleArgs { g: self.g.view()?, beta: opt_view(&self.beta)?, rule: self.rule.args()? })
    }
    fn copy_back(&self, host: &mut FusedRecurrentGatedDeltaRuleArgs<'_>) -> Result<(), MirrorError> {
        self.rule.copy_back(&mut host.rule)
    }
    fn launch(backend: &CudaBackend, args: FusedRecurrentGatedDeltaRuleArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The tensors of one `fused_sigmoid_gating_delta_rule_update`, copied to the device, plus its
/// scalars.
pub struct DeviceGdnSigmoidArgs {
    rule: StagedRule,
    gates: StagedGates,
}

impl DeviceGdnSigmoidArgs {
    /// The state pool's device buffer (`initial_state`, which the op updates in place).
    pub fn state_buffer(&mut self) -> Option<&mut DeviceBuffer> {
        self.rule.initial_state.as_mut().map(StagedTensor::buffer)
    }

    /// The output's device buffer.
    pub fn out_buffer(&mut self) -> &mut DeviceBuffer {
        self.rule.o.buffer()
    }
}

impl StageArgs for DeviceGdnSigmoidArgs {
    type Args<'a> = FusedSigmoidGatingDeltaRuleUpdateArgs<'a>;
    fn upload(backend: &CudaBackend, a: &FusedSigmoidGatingDeltaRuleUpdateArgs<'_>) -> Result<Self, MirrorError> {
        Ok(DeviceGdnSigmoidArgs {
            rule: StagedRule::upload(backend, &a.rule)?,
            gates: StagedGates::upload(backend, &a.gates)?,
        })
    }
    fn args(&mut self) -> Result<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>, TensorError> {
        Ok(FusedSigmoidGatingDeltaRuleUpdateArgs { gates: self.gates.inputs()?, rule: self.rule.args()? })
    }
    fn copy_back(&self, host: &mut FusedSigmoidGatingDeltaRuleUpdateArgs<'_>) -> Result<(), MirrorError> {
        self.rule.copy_back(&mut host.rule)
    }
    fn launch(backend: &CudaBackend, args: FusedSigmoidGatingDeltaRuleUpdateArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The tensors of one `chunk_gated_delta_rule`, copied to the device, plus its scalars. The
/// caller's `scratch`, when given, is copied too (its contents are never read before the
/// kernels write them), so that a test can poison it.
pub struct DeviceChunkArgs {
    /// q, k, v, g, beta.
    inputs: [StagedTensor; 5],
    /// initial_state_indices, has_initial_state, cu_seqlens.
    tables: [Option<StagedTensor>; 3],
    initial_state: Option<StagedTensor>,
    final_state: Option<StagedTensor>,
    scratch: Option<StagedTensor>,
    o: StagedTensor,
    scale: Option<f32>,
    pad_slot_id: Option<i64>,
    inplace: bool,
    l2norm: bool,
    eps: f32,
    layout: StateLayout,
}

impl StageArgs for DeviceChunkArgs {
    type Args<'a> = ChunkGatedDeltaRuleArgs<'a>;
    fn upload(backend: &CudaBackend, a: &ChunkGatedDeltaRuleArgs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: Option<&TensorRef<'_>>| StagedTensor::upload_opt(backend, t);
        let opt_mut = |t: &Option<TensorMut<'_>>| opt(t.as_ref().map(|t| t.as_ref()).as_ref());
        Ok(DeviceChunkArgs {
            inputs: [up(&a.q)?, up(&a.k)?, up(&a.v)?, up(&a.g)?, up(&a.beta)?],
            tables: [
                opt(a.initial_state_indices.as_ref())?,
                opt(a.has_initial_state.as_ref())?,
                opt(a.cu_seqlens.as_ref())?,
            ],
            initial_state: opt_mut(&a.initial_state)?,
            final_state: opt_mut(&a.final_state)?,
            scratch: opt_mut(&a.scratch)?,
            o: up(&a.o.as_ref())?,
            scale: a.scale,
            pad_slot_id: a.pad_slot_id,
            inplace: a.inplace_final_state,
            l2norm: a.use_qk_l2norm_in_kernel,
            eps: a.eps,
            layout: a.state_layout,
        })
    }
    fn args(&mut self) -> Result<ChunkGatedDeltaRuleArgs<'_>, TensorError> {
        let [q, k, v, g, beta] = &self.inputs;
        let [ix, has, cu] = &self.tables;
        Ok(ChunkGatedDeltaRuleArgs {
            scale: self.scale,
            initial_state: opt_view_mut(&mut self.initial_state)?,
            initial_state_indices: opt_view(ix)?,
            has_initial_state: opt_view(has)?,
            pad_slot_id: self.pad_slot_id,
            inplace_final_state: self.inplace,
            final_state: opt_view_mut(&mut self.final_state)?,
            cu_seqlens: opt_view(cu)?,
            use_qk_l2norm_in_kernel: self.l2norm,
            eps: self.eps,
            state_layout: self.layout,
            scratch: opt_view_mut(&mut self.scratch)?,
            ..ChunkGatedDeltaRuleArgs::new(q.view()?, k.view()?, v.view()?, g.view()?, beta.view()?, self.o.view_mut()?)
        })
    }
    fn copy_back(&self, host: &mut ChunkGatedDeltaRuleArgs<'_>) -> Result<(), MirrorError> {
        self.o.copy_back(&mut host.o)?;
        opt_copy_back(&self.initial_state, host.initial_state.as_mut())?;
        opt_copy_back(&self.final_state, host.final_state.as_mut())
    }
    fn launch(backend: &CudaBackend, args: ChunkGatedDeltaRuleArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The three ReplaySSM cursor tensors, copied to the device.
pub struct StagedTrackers {
    ring_start: StagedTensor,
    prev_num_accepted: StagedTensor,
    prev_query_len: StagedTensor,
}

impl StagedTrackers {
    fn upload(backend: &CudaBackend, t: &RingTrackers<'_>) -> Result<Self, MirrorError> {
        Ok(StagedTrackers {
            ring_start: StagedTensor::upload(backend, &t.ring_start.as_ref())?,
            prev_num_accepted: StagedTensor::upload(backend, &t.prev_num_accepted.as_ref())?,
            prev_query_len: StagedTensor::upload(backend, &t.prev_query_len.as_ref())?,
        })
    }
    fn views(&mut self) -> Result<RingTrackers<'_>, TensorError> {
        Ok(RingTrackers {
            ring_start: self.ring_start.view_mut()?,
            prev_num_accepted: self.prev_num_accepted.view_mut()?,
            prev_query_len: self.prev_query_len.view_mut()?,
        })
    }
    fn copy_back(&self, host: &mut RingTrackers<'_>) -> Result<(), MirrorError> {
        self.ring_start.copy_back(&mut host.ring_start)?;
        self.prev_num_accepted.copy_back(&mut host.prev_num_accepted)?;
        self.prev_query_len.copy_back(&mut host.prev_query_len)
    }
}

/// The tensors of one `update_replayssm_ring_trackers` (or reset), copied to the device, plus
/// its scalar arguments.
pub struct DeviceUpdateTrackersArgs {
    trackers: StagedTrackers,
    sbi: StagedTensor,
    logical_window: Option<i64>,
    ring_buffer_len: Option<i64>,
    pad_slot_id: Option<i64>,
}

impl DeviceUpdateTrackersArgs {
    /// The three cursor tensors' device bytes (waits for the stream).
    pub fn tracker_buffers(&mut self) -> Vec<Vec<u8>> {
        let t = &mut self.trackers;
        [&mut t.ring_start, &mut t.prev_num_accepted, &mut t.prev_query_len]
            .into_iter()
            .map(|s| s.buffer().download().expect("a device-to-host copy"))
            .collect()
    }
}

impl StageArgs for DeviceUpdateTrackersArgs {
    type Args<'a> = UpdateRingTrackersArgs<'a>;
    fn upload(backend: &CudaBackend, args: &UpdateRingTrackersArgs<'_>) -> Result<Self, MirrorError> {
        Ok(DeviceUpdateTrackersArgs {
            trackers: StagedTrackers::upload(backend, &args.trackers)?,
            sbi: StagedTensor::upload(backend, &args.state_batch_indices)?,
            logical_window: args.logical_window,
            ring_buffer_len: args.ring_buffer_len,
            pad_slot_id: args.pad_slot_id,
        })
    }
    fn args(&mut self) -> Result<UpdateRingTrackersArgs<'_>, TensorError> {
        Ok(UpdateRingTrackersArgs {
            trackers: self.trackers.views()?,
            state_batch_indices: self.sbi.view()?,
            logical_window: self.logical_window,
            ring_buffer_len: self.ring_buffer_len,
            pad_slot_id: self.pad_slot_id,
        })
    }
    fn copy_back(&self, host: &mut UpdateRingTrackersArgs<'_>) -> Result<(), MirrorError> {
        self.trackers.copy_back(&mut host.trackers)
    }
    fn launch(backend: &CudaBackend, args: UpdateRingTrackersArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The tensors of one `commit_replayssm_ring_trackers`, copied to the device, plus its scalars.
pub struct DeviceCommitTrackersArgs {
    trackers: StagedTrackers,
    sbi: StagedTensor,
    accepted: StagedTensor,
    qsl: StagedTensor,
    logical_window: i64,
    ring_buffer_len: i64,
    pad_slot_id: Option<i64>,
}

impl StageArgs for DeviceCommitTrackersArgs {
    type Args<'a> = CommitRingTrackersArgs<'a>;
    fn upload(backend: &CudaBackend, args: &CommitRingTrackersArgs<'_>) -> Result<Self, MirrorError> {
        Ok(DeviceCommitTrackersArgs {
            trackers: StagedTrackers::upload(backend, &args.trackers)?,
            sbi: StagedTensor::upload(backend, &args.state_batch_indices)?,
            accepted: StagedTensor::upload(backend, &args.num_accepted_tokens)?,
            qsl: StagedTensor::upload(backend, &args.query_start_loc)?,
            logical_window: args.logical_window,
            ring_buffer_len: args.ring_buffer_len,
            pad_slot_id: args.pad_slot_id,
        })
    }
    fn args(&mut self) -> Result<CommitRingTrackersArgs<'_>, TensorError> {
        Ok(CommitRingTrackersArgs {
            trackers: self.trackers.views()?,
            state_batch_indices: self.sbi.view()?,
            num_accepted_tokens: self.accepted.view()?,
            query_start_loc: self.qsl.view()?,
            logical_window: self.logical_window,
            ring_buffer_len: self.ring_buffer_len,
            pad_slot_id: self.pad_slot_id,
        })
    }
    fn copy_back(&self, host: &mut CommitRingTrackersArgs<'_>) -> Result<(), MirrorError> {
        self.trackers.copy_back(&mut host.trackers)
    }
    fn launch(backend: &CudaBackend, args: CommitRingTrackersArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The tensors of one `checkpointing_ssu`, copied to the device, plus its scalar arguments.
pub struct DeviceCheckpointingSsuArgs {
    state: StagedTensor,
    x_cache: StagedTensor,
    b_cache: StagedTensor,
    dt_cache: StagedTensor,
    ring_start: StagedTensor,
    prev_num: StagedTensor,
    x: StagedTensor,
    dt: StagedTensor,
    a: StagedTensor,
    b: StagedTensor,
    c: StagedTensor,
    out: StagedTensor,
    d: Option<StagedTensor>,
    z: Option<StagedTensor>,
    dt_bias: Option<StagedTensor>,
    sbi: Option<StagedTensor>,
    cu: Option<StagedTensor>,
    dt_softplus: bool,
    pad_slot_id: Option<i64>,
    max_seqlen: Option<usize>,
}

impl DeviceCheckpointingSsuArgs {
    /// The checkpoint pool's device buffer.
    pub fn state_buffer(&mut self) -> &mut DeviceBuffer {
        self.state.buffer()
    }

    /// The output's device buffer.
    pub fn out_buffer(&mut self) -> &mut DeviceBuffer {
        self.out.buffer()
    }
}

impl StageArgs for DeviceCheckpointingSsuArgs {
    type Args<'a> = CheckpointingSsuArgs<'a>;
    fn upload(backend: &CudaBackend, args: &CheckpointingSsuArgs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: &Option<TensorRef<'_>>| StagedTensor::upload_opt(backend, t.as_ref());
        Ok(DeviceCheckpointingSsuArgs {
            state: up(&args.state.as_ref())?,
            x_cache: up(&args.x_cache.as_ref())?,
            b_cache: up(&args.b_cache.as_ref())?,
            dt_cache: up(&args.dt_cache.as_ref())?,
            ring_start: up(&args.ring_start)?,
            prev_num: up(&args.prev_num_accepted_tokens)?,
            x: up(&args.x)?,
            dt: up(&args.dt)?,
            a: up(&args.a)?,
            b: up(&args.b)?,
            c: up(&args.c)?,
            out: up(&args.out.as_ref())?,
            d: opt(&args.d)?,
            z: opt(&args.z)?,
            dt_bias: opt(&args.dt_bias)?,
            sbi: opt(&args.state_batch_indices)?,
            cu: opt(&args.cu_seqlens)?,
            dt_softplus: args.dt_softplus,
            pad_slot_id: args.pad_slot_id,
            max_seqlen: args.max_seqlen,
        })
    }
    fn args(&mut self) -> Result<CheckpointingSsuArgs<'_>, TensorError> {
        Ok(CheckpointingSsuArgs {
            state: self.state.view_mut()?,
            x_cache: self.x_cache.view_mut()?,
            b_cache: self.b_cache.view_mut()?,
            dt_cache: self.dt_cache.view_mut()?,
            ring_start: self.ring_start.view()?,
            prev_num_accepted_tokens: self.prev_num.view()?,
            x: self.x.view()?,
            dt: self.dt.view()?,
            a: self.a.view()?,
            b: self.b.view()?,
            c: self.c.view()?,
            out: self.out.view_mut()?,
            d: opt_view(&self.d)?,
            z: opt_view(&self.z)?,
            dt_bias: opt_view(&self.dt_bias)?,
            dt_softplus: self.dt_softplus,
            state_batch_indices: opt_view(&self.sbi)?,
            pad_slot_id: self.pad_slot_id,
            cu_seqlens: opt_view(&self.cu)?,
            max_seqlen: self.max_seqlen,
        })
    }
    fn copy_back(&self, host: &mut CheckpointingSsuArgs<'_>) -> Result<(), MirrorError> {
        self.state.copy_back(&mut host.state)?;
        self.x_cache.copy_back(&mut host.x_cache)?;
        self.b_cache.copy_back(&mut host.b_cache)?;
        self.dt_cache.copy_back(&mut host.dt_cache)?;
        self.out.copy_back(&mut host.out)
    }
    fn launch(backend: &CudaBackend, args: CheckpointingSsuArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// The tensors of one SSD chunked prefill (`mamba_chunk_scan_combined_varlen`), copied to
/// the device (chunk metadata and slot tables too, so the kernels check their values), plus
/// its scalar arguments.
pub struct DeviceSsdArgs {
    /// x, dt, A, B, C, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx.
    inputs: [StagedTensor; 9],
    /// D, z, dt_bias, initial_states, initial_state_indices, has_initial_state,
    /// final_state_indices, checkpoint_chunk_indices, checkpoint_state_indices.
    options: [Option<StagedTensor>; 9],
    out: Option<StagedTensor>,
    ssm_state: Option<StagedTensor>,
    varlen_states: Option<StagedTensor>,
    scratch: Option<StagedTensor>,
    chunk_size: usize,
    pad_slot_id: Option<i64>,
    dt_softplus: bool,
    dt_limit: (f32, f32),
    return_intermediate_states: bool,
    state_dtype: Option<DType>,
}

impl DeviceSsdArgs {
    /// The caller's scratch, staged at its element offset and grown to what the device plan
    /// needs: the staged chunk metadata lives on the device, where every chunk is sized
    /// `chunk_size` ([`ssm_ssd::SsdPlan::device_metadata_scratch_len`]), while the host plan
    /// sized the host scratch by the longest chunk.
    fn stage_scratch(
        backend: &CudaBackend,
        a: &MambaChunkScanCombinedVarlenArgs<'_>,
    ) -> Result<Option<StagedTensor>, MirrorError> {
        let Some(host) = a.scratch.as_ref().map(|t| t.as_ref()) else { return Ok(None) };
        let plan = ssm_tensor::Op::plan(a)?;
        let need = plan
            .device_metadata_scratch_len()
            .ok_or_else(|| MirrorError::Run("the device scratch size overflows".into()))?;
        let offset = host.layout().offset();
        let bytes = host.host_bytes().ok_or(TensorError::NotHost(host.device()))?;
        let mut buf = DeviceBuffer::zeroed(backend, (offset + need.max(host.shape()[0])) * 4)?;
        buf.upload(&bytes[..bytes.len().min(buf.len())])?;
        Ok(Some(StagedTensor {
            buf,
            dtype: DType::F32,
            shape: vec![need.max(host.shape()[0])],
            strides: vec![1],
            offset,
        }))
    }
}

impl StageArgs for DeviceSsdArgs {
    type Args<'a> = MambaChunkScanCombinedVarlenArgs<'a>;
    fn upload(backend: &CudaBackend, a: &MambaChunkScanCombinedVarlenArgs<'_>) -> Result<Self, MirrorError> {
        let up = |t: &TensorRef<'_>| StagedTensor::upload(backend, t);
        let opt = |t: Option<&TensorRef<'_>>| StagedTensor::upload_opt(backend, t);
        let opt_mut =
            |t: &Option<TensorMut<'_>>| StagedTensor::upload_opt(backend, t.as_ref().map(|t| t.as_ref()).as_ref());
        Ok(DeviceSsdArgs {
            inputs: [
                up(&a.x)?,
                up(&a.dt)?,
                up(&a.a)?,
                up(&a.b)?,
                up(&a.c)?,
                up(&a.cu_seqlens)?,
                up(&a.cu_chunk_seqlens)?,
                up(&a.last_chunk_indices)?,
                up(&a.seq_idx)?,
            ],
            options: [
                opt(a.d.as_ref())?,
                opt(a.z.as_ref())?,
                opt(a.dt_bias.as_ref())?,
                opt(a.initial_states.as_ref())?,
                opt(a.initial_state_indices.as_ref())?,
                opt(a.has_initial_state.as_ref())?,
                opt(a.final_state_indices.as_ref())?,
                opt(a.checkpoint_chunk_indices.as_ref())?,
                opt(a.checkpoint_state_indices.as_ref())?,
            ],
            out: opt_mut(&a.out)?,
            ssm_state: opt_mut(&a.ssm_state)?,
            varlen_states: opt_mut(&a.varlen_states)?,
            scratch: Self::stage_scratch(backend, a)?,
            chunk_size: a.chunk_size,
            pad_slot_id: a.pad_slot_id,
            dt_softplus: a.dt_softplus,
            dt_limit: a.dt_limit,
            return_intermediate_states: a.return_intermediate_states,
            state_dtype: a.state_dtype,
        })
    }
    fn args(&mut self) -> Result<MambaChunkScanCombinedVarlenArgs<'_>, TensorError> {
        let [x, dt, a, b, c, cu, cu_chunk, last, seq] = &self.inputs;
        let [d, z, dt_bias, init, init_idx, has, fin, ck_chunk, ck_slot] = &self.options;
        Ok(MambaChunkScanCombinedVarlenArgs {
            out: opt_view_mut(&mut self.out)?,
            d: opt_view(d)?,
            z: opt_view(z)?,
            dt_bias: opt_view(dt_bias)?,
            initial_states: opt_view(init)?,
            ssm_state: opt_view_mut(&mut self.ssm_state)?,
            initial_state_indices: opt_view(init_idx)?,
            has_initial_state: opt_view(has)?,
            final_state_indices: opt_view(fin)?,
            checkpoint_chunk_indices: opt_view(ck_chunk)?,
            checkpoint_state_indices: opt_view(ck_slot)?,
            pad_slot_id: self.pad_slot_id,
            dt_softplus: self.dt_softplus,
            dt_limit: self.dt_limit,
            return_intermediate_states: self.return_intermediate_states,
            state_dtype: self.state_dtype,
            varlen_states: opt_view_mut(&mut self.varlen_states)?,
            scratch: opt_view_mut(&mut self.scratch)?,
            ..MambaChunkScanCombinedVarlenArgs::new(
                x.view()?,
                dt.view()?,
                a.view()?,
                b.view()?,
                c.view()?,
                self.chunk_size,
                [cu.view()?, cu_chunk.view()?, last.view()?, seq.view()?],
            )
        })
    }
    fn copy_back(&self, host: &mut MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), MirrorError> {
        opt_copy_back(&self.out, host.out.as_mut())?;
        opt_copy_back(&self.ssm_state, host.ssm_state.as_mut())?;
        opt_copy_back(&self.varlen_states, host.varlen_states.as_mut())
    }
    fn launch(backend: &CudaBackend, args: MambaChunkScanCombinedVarlenArgs<'_>) -> Result<(), MirrorError> {
        plan_and_run(backend, args)
    }
}

/// A host-tensor façade of the CUDA backend: every call is staged ([`run_staged`]) and run on
/// the device, so generic checks written against a family trait ([`ssm_conv::ConvBackend`],
/// …) with host tensors run on the GPU unchanged. The call's host plan is dropped; the device
/// copies are planned again.
#[derive(Debug, Clone, Copy)]
pub struct Mirrored<'b>(pub &'b CudaBackend);

/// `Run` for [`Mirrored`]: each op's arguments and its staging.
macro_rules! mirrored {
    ($($args:ident => $staging:ty),* $(,)?) => {$(
        impl Run<$args<'_>> for Mirrored<'_> {
            type Error = MirrorError;
            fn run(&self, call: Planned<$args<'_>>) -> Result<(), MirrorError> {
                run_staged::<$staging>(self.0, call.into_parts().0)
            }
        }
    )*};
}

mirrored! {
    SelectiveStateUpdateArgs => DeviceSsuArgs,
    CausalConv1dUpdateArgs => DeviceConvUpdateArgs,
    CausalConv1dFnArgs => DeviceConvFnArgs,
    FusedGdnGatingArgs => DeviceGdnGatingArgs,
    FusedRecurrentGatedDeltaRuleArgs => DeviceGdnRecurrentArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs => DeviceGdnSigmoidArgs,
    UpdateRingTrackersArgs => DeviceUpdateTrackersArgs,
    CommitRingTrackersArgs => DeviceCommitTrackersArgs,
    CheckpointingSsuArgs => DeviceCheckpointingSsuArgs,
    MambaChunkScanCombinedVarlenArgs => DeviceSsdArgs,
    ChunkGatedDeltaRuleArgs => DeviceChunkArgs,
}
