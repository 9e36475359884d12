//! CUDA backend of ssm-kernels.
//!
//! Built on `cudarc` with dynamic loading: the crate compiles and its CPU-side tests run on
//! machines without CUDA, and [`probe`] reports a missing driver or device instead of
//! panicking. Kernels are CUDA C++ under `kernels/`, embedded with `include_str!` and
//! compiled by NVRTC to a cubin for the device's architecture, one specialisation per
//! (dtypes, dstate, tile, flags), cached in memory and on disk ([`compile`]).
//!
//! Layers, lowest first:
//! - [`nvrtc`] and the driver calls in [`CudaBackend`]: thin wrappers over cudarc's `sys` /
//!   `result` layers, every `unsafe` block with its `// SAFETY:` reason;
//! - launch: `#[repr(C)]` Pod parameter blocks (`ssu::SsuParams`) pushed through cudarc's
//!   launch builder on the backend's stream;
//! - safe ops: `impl Run<SelectiveStateUpdateArgs> for CudaBackend` (and a typed
//!   [`ssm_tensor::Unsupported`] for every op without a kernel yet), which takes device tensor views
//!   (`TensorRef::from_device_ptr`), never allocates when `out` is given, never copies a value
//!   back to the host and never synchronises; [`CudaBackend::check`] reads the device error
//!   word off the hot path.

pub mod bench;
pub mod bench_gdn;
pub mod bench_gdn_chunk;
pub mod bench_ring;
pub mod bench_ssd;
mod buffer;
pub mod compile;
pub mod conv;
mod error;
pub mod gdn;
pub mod gdn_chunk;
mod geometry;
pub mod nvrtc;
pub mod ring;
pub mod rows;
pub mod ssd;
pub mod ssu;
pub mod testing;

pub use cudarc;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg, sys};

pub use buffer::DeviceBuffer;
pub use compile::{Arch, Compiler, KernelSource, KernelSpec};
pub use error::{CudaError, DeviceErrors};
pub use geometry::RowGeometry;
pub use nvrtc::{nvrtc_available, nvrtc_version};
pub use ssm_ssu::SsuAlgorithm;
pub use ssu::ssu_kernel_spec;

/// What [`probe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// `libcuda` could not be loaded.
    NoDriver,
    /// The driver loaded but reports no usable device.
    NoDevice,
    /// The driver reports `devices` devices.
    Ready {
        /// Number of devices.
        devices: usize,
    },
}

impl std::fmt::Display for Availability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Availability::NoDriver => f.write_str("no CUDA driver (libcuda not found)"),
            Availability::NoDevice => f.write_str("CUDA driver present but no device"),
            Availability::Ready { devices } => write!(f, "{devices} CUDA device(s)"),
        }
    }
}

/// Whether CUDA can be used here. Never panics: the driver library is looked for with
/// `dlopen` before any driver function is called.
pub fn probe() -> Availability {
    // SAFETY: `is_culib_present` only tries to `dlopen` candidate library names.
    if !unsafe { sys::is_culib_present() } {
        return Availability::NoDriver;
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Availability::Ready { devices: n as usize },
        _ => Availability::NoDevice,
    }
}

/// The SSU algorithms in the order [`CudaBackend`] stores them.
const ALGORITHMS: [SsuAlgorithm; 4] =
    [SsuAlgorithm::Auto, SsuAlgorithm::Simple, SsuAlgorithm::Vertical, SsuAlgorithm::Horizontal];

fn algorithm_index(a: SsuAlgorithm) -> u8 {
    ALGORITHMS.iter().position(|&b| b == a).unwrap_or(0) as u8
}

/// The device address of element `offset` of a view whose memory starts at `base` (0 for an
/// absent tensor): what every parameter block passes, so kernels index from element 0.
pub(crate) fn addr_of(base: Option<u64>, offset: isize, dtype: ssm_tensor::DType) -> u64 {
    base.map_or(0, |a| a.wrapping_add_signed((offset * dtype.size() as isize) as i64))
}

/// The loaded functions of one kernel family by its compact key: a per-call lookup that hashes
/// a few bytes rather than a [`KernelSpec`]'s macro strings. A miss builds the spec and goes
/// through [`CudaBackend::function`] (the spec cache, then NVRTC).
struct KeyedFunctions<K>(Mutex<HashMap<K, CudaFunction>>);

impl<K> Default for KeyedFunctions<K> {
    fn default() -> Self {
        KeyedFunctions(Mutex::new(HashMap::new()))
    }
}

impl<K: Copy + Eq + std::hash::Hash> KeyedFunctions<K> {
    /// Compiles the kernels of `keys` not loaded yet concurrently into the compiler's cache, so
    /// that the `get_or_load`s that follow (a call's several stages) only load modules. Errors
    /// are left to those `get_or_load`s, which report them per kernel.
    fn precompile(&self, backend: &CudaBackend, keys: &[K], spec: impl Fn(&K) -> KernelSpec) {
        let missing: Vec<KernelSpec> = {
            let loaded = self.0.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter().filter(|k| !loaded.contains_key(k)).map(&spec).collect()
        };
        if missing.len() > 1 {
            let _ = backend.compiler.cubins(&missing);
        }
    }

    fn get_or_load(
        &self,
        backend: &CudaBackend,
        key: K,
        spec: impl FnOnce(&K) -> KernelSpec,
    ) -> Result<CudaFunction, CudaError> {
        if let Some(f) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(f.clone());
        }
        let f = backend.function(&spec(&key))?;
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key, f.clone());
        Ok(f)
    }
}

/// The CUDA backend: one device, one stream, a kernel cache and a device error word.
pub struct CudaBackend {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    compiler: Compiler,
    functions: Mutex<HashMap<KernelSpec, CudaFunction>>,
    ssu_functions: KeyedFunctions<ssu::SsuKey>,
    gdn_functions: KeyedFunctions<gdn::GdnKey>,
    conv_functions: KeyedFunctions<conv::ConvKey>,
    ring_functions: KeyedFunctions<ring::RingKey>,
    ssd_functions: KeyedFunctions<ssd::SsdKey>,
    gdn_chunk_functions: KeyedFunctions<gdn_chunk::ChunkKey>,
    /// Multiprocessors of the device.
    sm_count: usize,
    /// Shared memory a block may opt in to, in bytes.
    shared_optin: usize,
    error_word: CudaSlice<u32>,
    error_word_addr: u64,
    /// [`gdn::STEP_COUNTERS`] zeroed arrival counters of the fused GDN decode step (each launch
    /// leaves them zero again).
    _step_counters: CudaSlice<u32>,
    step_counters_addr: u64,
    /// The SSU algorithm ([`SsuAlgorithm`] as `u8`, see [`CudaBackend::set_ssu_algorithm`]).
    ssu_algorithm: AtomicU8,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("ordinal", &self.ordinal).field("arch", &self.compiler.arch()).finish()
    }
}

impl CudaBackend {
    /// A backend on device `ordinal` with its own non-blocking stream.
    ///
    /// Errors: [`CudaError::NoDriver`] / [`CudaError::NoDevice`] when [`probe`] finds none,
    /// or the driver's error when the context or stream cannot be created.
    pub fn new(ordinal: u32) -> Result<Self, CudaError> {
        let ctx = Self::context_for(ordinal)?;
        let stream = ctx.new_stream().map_err(CudaError::driver("cuStreamCreate"))?;
        Self::with_stream(ctx, stream)
    }

    /// A backend that launches on a stream owned by someone else (e.g. PyTorch's current stream).
    ///
    /// # Safety
    /// `cu_stream` must be a valid stream of device `ordinal`'s primary context, kept alive by
    /// its owner for as long as this backend is used; ordering with the owner's other work is
    /// the caller's responsibility.
    pub unsafe fn with_borrowed_stream(ordinal: u32, cu_stream: sys::CUstream) -> Result<Self, CudaError> {
        let ctx = Self::context_for(ordinal)?;
        // SAFETY: forwarded from this function's contract.
        let stream = unsafe { ctx.wrap_borrowed_stream(cu_stream) };
        Self::with_stream(ctx, stream)
    }

    fn context_for(ordinal: u32) -> Result<Arc<CudaContext>, CudaError> {
        let ordinal = ordinal as usize;
        match probe() {
            Availability::NoDriver => return Err(CudaError::NoDriver),
            Availability::NoDevice => return Err(CudaError::NoDevice { ordinal, found: 0 }),
            Availability::Ready { devices } if ordinal >= devices => {
                return Err(CudaError::NoDevice { ordinal, found: devices });
            }
            Availability::Ready { .. } => {}
        }
        CudaContext::new(ordinal).map_err(CudaError::driver("cuDevicePrimaryCtxRetain"))
    }

    fn with_stream(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self, CudaError> {
        let (major, minor) = ctx.compute_capability().map_err(CudaError::driver("cuDeviceGetAttribute"))?;
        let arch = Arch { major: major as u32, minor: minor as u32 };
        let attr = |a: sys::CUdevice_attribute| {
            ctx.attribute(a).map(|v| v.max(0) as usize).map_err(CudaError::driver("cuDeviceGetAttribute"))
        };
        let sm_count = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let shared_optin = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let error_word = stream.alloc_zeros::<u32>(1).map_err(CudaError::driver("cuMemAlloc(error word)"))?;
        let error_word_addr = {
            let (addr, _sync) = error_word.device_ptr(&stream);
            addr
        };
        let step_counters =
            stream.alloc_zeros::<u32>(gdn::STEP_COUNTERS).map_err(CudaError::driver("cuMemAlloc(step counters)"))?;
        let step_counters_addr = {
            let (addr, _sync) = step_counters.device_ptr(&stream);
            addr
        };
        Ok(CudaBackend {
            ordinal: ctx.ordinal(),
            ctx,
            stream,
            compiler: Compiler::new(arch, compile::default_cache_dir()),
            functions: Mutex::new(HashMap::new()),
            ssu_functions: KeyedFunctions::default(),
            gdn_functions: KeyedFunctions::default(),
            conv_functions: KeyedFunctions::default(),
            ring_functions: KeyedFunctions::default(),
            ssd_functions: KeyedFunctions::default(),
            gdn_chunk_functions: KeyedFunctions::default(),
            sm_count,
            shared_optin,
            error_word,
            error_word_addr,
            _step_counters: step_counters,
            step_counters_addr,
            ssu_algorithm: AtomicU8::new(0),
        })
    }

    /// Selects the SSU tiling the following calls run (vLLM's `--mamba-ssu-algorithm`; the
    /// runtime sets its configuration's): `auto` (the default) picks per shape from the
    /// measurements recorded in [`ssu::auto_algorithm`]'s table, `simple`, `vertical` and
    /// `horizontal` are the tilings [`ssu::SsuGeometry::with_algorithm`] describes. Every one
    /// computes the same result; a kernel not prewarmed under the new choice compiles on its
    /// first call, so set it before [`prewarm_ssu`](Self::prewarm_ssu) and graph capture.
    pub fn set_ssu_algorithm(&self, algorithm: SsuAlgorithm) {
        self.ssu_algorithm.store(algorithm_index(algorithm), Ordering::Relaxed);
    }

    /// The SSU algorithm the calls run (see [`set_ssu_algorithm`](Self::set_ssu_algorithm)).
    pub fn ssu_algorithm(&self) -> SsuAlgorithm {
        ALGORITHMS[usize::from(self.ssu_algorithm.load(Ordering::Relaxed)).min(ALGORITHMS.len() - 1)]
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal as u32
    }

    /// The device this backend runs on.
    pub fn device(&self) -> ssm_tensor::Device {
        ssm_tensor::Device::Cuda(self.ordinal as u32)
    }

    /// Refuses a planned call whose tensors live elsewhere: the one device comparison of a
    /// call (the plan already checked that every tensor shares this device).
    pub(crate) fn expect_device<A: ssm_tensor::Op>(&self, call: &ssm_tensor::Planned<A>) -> Result<(), CudaError> {
        if call.device() != self.device() {
            return Err(CudaError::WrongDevice { op: call.name(), expected: self.device(), actual: call.device() });
        }
        Ok(())
    }

    /// The device's multiprocessor count.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The shared memory one block may opt in to, in bytes.
    pub fn shared_optin(&self) -> usize {
        self.shared_optin
    }

    /// The device's compute capability.
    pub fn arch(&self) -> Arch {
        self.compiler.arch()
    }

    /// The cudarc context (the device's primary context, shared with the CUDA runtime and PyTorch).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The one kernel launch of every op: `func` over `grid` blocks of `threads` threads on the
    /// backend's stream, with one by-value parameter struct. `name` names the kernel in a
    /// driver error.
    ///
    /// # Safety
    /// Every device address in `params` must be valid, for the call, for every access the
    /// kernel makes through it: the callers take them from device views whose creators promised
    /// that (`TensorRef`/`TensorMut::from_device_ptr`), after a plan checked that every element
    /// the kernel can reach for valid index values lies inside those views; index values read on
    /// the device are the kernel's to check. The error word is owned by `self`.
    pub(crate) unsafe fn launch_kernel<P: cudarc::driver::DeviceRepr>(
        &self,
        func: &CudaFunction,
        grid: (u32, u32, u32),
        threads: u32,
        params: &P,
        name: &'static str,
    ) -> Result<(), CudaError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_kernel_shared(func, grid, threads, 0, params, name) }
    }

    /// [`launch_kernel`](Self::launch_kernel) with `shared` bytes of dynamic shared memory per
    /// block (past 48 KiB only for a function whose opt-in attribute allows it).
    ///
    /// # Safety
    /// As [`launch_kernel`](Self::launch_kernel); `shared` covers what the kernel carves.
    pub(crate) unsafe fn launch_kernel_shared<P: cudarc::driver::DeviceRepr>(
        &self,
        func: &CudaFunction,
        grid: (u32, u32, u32),
        threads: u32,
        shared: u32,
        params: &P,
        name: &'static str,
    ) -> Result<(), CudaError> {
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (threads, 1, 1), shared_mem_bytes: shared };
        let mut launch = self.stream.launch_builder(func);
        launch.arg(params);
        // SAFETY: the caller's contract above.
        unsafe { launch.launch(cfg) }.map_err(CudaError::driver(name))?;
        Ok(())
    }

    /// [`launch_kernel`](Self::launch_kernel) as the programmatic dependent of the kernel queued
    /// before it on the stream (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): it may
    /// start while that kernel runs, and must execute `griddepcontrol.wait` (`pdl_wait` in
    /// common.cuh) before it reads anything that kernel writes.
    ///
    /// # Safety
    /// As [`launch_kernel`](Self::launch_kernel); the kernel waits before reading the previous
    /// kernel's outputs and writes nothing that kernel reads or writes.
    pub(crate) unsafe fn launch_kernel_pdl<P: cudarc::driver::DeviceRepr>(
        &self,
        func: &CudaFunction,
        grid: (u32, u32, u32),
        threads: u32,
        params: &P,
        name: &'static str,
    ) -> Result<(), CudaError> {
        // SAFETY: a zeroed attribute is a valid "ignore" value; id and value are set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut args: [*mut std::ffi::c_void; 1] = [params as *const P as *mut std::ffi::c_void];
        // SAFETY: `config` and `attr` live across the call; `args` points at the one parameter
        // block the kernel takes (`P` mirrors it); the rest is the caller's contract.
        unsafe { sys::cuLaunchKernelEx(&config, func.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(CudaError::driver(name))
    }

    /// The device name (e.g. "NVIDIA H200").
    pub fn device_name(&self) -> Result<String, CudaError> {
        self.ctx.name().map_err(CudaError::driver("cuDeviceGetName"))
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.ctx.mem_get_info().map_err(CudaError::driver("cuMemGetInfo"))
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(CudaError::driver("cuStreamSynchronize"))
    }

    /// Device address of the error word kernels OR their [`DeviceErrors`] bits into.
    pub fn error_word_addr(&self) -> u64 {
        self.error_word_addr
    }

    /// Waits for the stream, then reads and clears the device error word.
    ///
    /// `Err(CudaError::InvalidIndices)` when a kernel since the last check met index values
    /// outside their range (those rows were skipped, nothing of them written). Synchronises:
    /// call it off the hot path.
    pub fn check(&self) -> Result<(), CudaError> {
        let mut word = [0u32];
        self.stream.memcpy_dtoh(&self.error_word, &mut word).map_err(CudaError::driver("cuMemcpyDtoH(error word)"))?;
        self.synchronize()?;
        if word[0] == 0 {
            return Ok(());
        }
        self.clear_error_word()?;
        Err(CudaError::InvalidIndices(DeviceErrors(word[0])))
    }

    fn clear_error_word(&self) -> Result<(), CudaError> {
        // SAFETY: the error word is a live 4-byte allocation owned by `self`; the memset is
        // ordered on our stream after every kernel that may write it.
        unsafe { sys::cuMemsetD32Async(self.error_word_addr, 0, 1, self.stream.cu_stream()) }
            .result()
            .map_err(CudaError::driver("cuMemsetD32Async(error word)"))?;
        self.synchronize()
    }

    /// Compiles (or loads from the caches) `spec` and loads it into the context, so that a
    /// later launch of it does no compilation or module load: call before CUDA-graph capture.
    pub fn prewarm(&self, spec: &KernelSpec) -> Result<(), CudaError> {
        self.function(spec).map(|_| ())
    }

    /// [`prewarm`](Self::prewarm) for the kernel an SSU plan launches under the backend's
    /// [`ssu_algorithm`](Self::ssu_algorithm).
    ///
    /// Errors: as the call's run would refuse it (an algorithm its state refuses), or the
    /// kernel's compilation or load.
    pub fn prewarm_ssu(&self, plan: &ssm_ssu::SsuPlan) -> Result<(), CudaError> {
        let key = ssu::SsuKey::from_plan(plan, None, self.ssu_algorithm())?;
        self.ssu_function(&key).map(|_| ())
    }

    /// [`prewarm`](Self::prewarm) for the kernel a GDN recurrent plan launches (either recurrent op).
    pub fn prewarm_gdn_recurrent(&self, plan: &ssm_gdn::RecurrentPlan) -> Result<(), CudaError> {
        self.prewarm(&gdn::recurrent_kernel_spec(plan))
    }

    /// The loaded function of `spec`.
    pub fn function(&self, spec: &KernelSpec) -> Result<CudaFunction, CudaError> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(spec) {
            return Ok(f.clone());
        }
        let compiled = self.compiler.cubin(spec)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.as_ref().clone()))
            .map_err(CudaError::driver("cuModuleLoadData"))?;
        let f = module.load_function(spec.entry).map_err(CudaError::driver("cuModuleGetFunction"))?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(spec.clone(), f.clone());
        Ok(f)
    }

    pub(crate) fn ssu_function(&self, key: &ssu::SsuKey) -> Result<CudaFunction, CudaError> {
        self.ssu_functions.get_or_load(self, *key, ssu::SsuKey::spec)
    }

    /// Copies `bytes` from `src` to `dst` with the 16-byte copy kernel (bandwidth yardstick).
    ///
    /// # Safety
    /// `src` and `dst` must be device allocations of at least `bytes` bytes on this device,
    /// 16-byte aligned, not overlapping; `bytes` a multiple of 16.
    pub unsafe fn copy_kernel(&self, src: u64, dst: u64, bytes: usize) -> Result<(), CudaError> {
        let f = self.function(&compile::copy_kernel_spec())?;
        let sms = self
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(CudaError::driver("cuDeviceGetAttribute"))? as u32;
        let n = (bytes / 16) as u64;
        let cfg = LaunchConfig { grid_dim: (sms * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&src).arg(&dst).arg(&n);
        // SAFETY: forwarded from this function's contract.
        unsafe { b.launch(cfg) }.map_err(CudaError::driver("cuLaunchKernel(copy_u128)"))?;
        Ok(())
    }

    /// Copies `bytes` from `src` to `dst` with `cuMemcpyDtoDAsync` on the backend's stream.
    ///
    /// # Safety
    /// As [`copy_kernel`](Self::copy_kernel), without the alignment requirement.
    pub unsafe fn copy_driver(&self, src: u64, dst: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream.cu_stream()) }
            .result()
            .map_err(CudaError::driver("cuMemcpyDtoDAsync"))
    }
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
