//! `ssm_kernels._core`: the Rust side of the Python package. Each function takes host arrays
//! (numpy's `__array_interface__`, or DLPack: torch CPU tensors), views their memory where it is (shape,
//! strides and offset kept, nothing copied), runs the op on the process's CPU runtime and
//! raises `ssm_kernels.SsmError` (a `ValueError`) with the op's typed message when the call is
//! refused; a refused call writes nothing. The vLLM-shaped signatures, defaults and output
//! allocation live in `python/ssm_kernels/__init__.py`.

use std::sync::OnceLock;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{BackendKind, Config, Runtime};
use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedRecurrentGatedDeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs,
    GateInputs,
};
use ssm_ssd::MambaChunkScanCombinedVarlenArgs;
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, Device, TensorMut, TensorRef};

pyo3::create_exception!(
    _core,
    SsmError,
    PyValueError,
    "A call ssm-kernels refused (its typed message); nothing was written."
);

/// The process's CPU runtime (every core), started on first use.
fn cpu_runtime() -> PyResult<&'static Runtime> {
    static RT: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(&Config::cpu(None)).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("ssm-kernels could not start its CPU runtime: {e}")))
}

/// The runtime of a call: the CPU one for host arrays; for arrays on CUDA device `d`, a runtime
/// whose CUDA backend launches on `stream` (the caller's, e.g. torch's current stream, so that
/// the op is ordered with the caller's work; 0 is the legacy default stream), one per
/// (device, stream), started on first use and kept for the process.
fn runtime(t: &Arrays<'_>, stream: Option<usize>) -> PyResult<&'static Runtime> {
    let Some(device) = t.list.iter().find_map(|a| match a.device {
        Device::Cuda(d) => Some(d),
        Device::Cpu => None,
    }) else {
        return cpu_runtime();
    };
    let stream = stream.unwrap_or(0);
    let mut map = cuda_runtimes().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = map.get(&(device, stream)) {
        return Ok(rt);
    }
    let start = || -> Result<Runtime, String> {
        // SAFETY: `stream` is a stream of `device`'s primary context (torch's current stream
        // there), or 0, the legacy default stream. The runtime launches on it only inside calls
        // that pass this same handle as the caller's current stream, when it is alive; a handle
        // value reused by a later stream is that live stream.
        let be = unsafe {
            ssm_cuda::CudaBackend::with_borrowed_stream(device, stream as ssm_cuda::cudarc::driver::sys::CUstream)
        }
        .map_err(|e| e.to_string())?;
        let config = Config { backend: BackendKind::Cuda, cuda_device: device, ..Config::default() };
        Runtime::with_cuda_backend(&config, be).map_err(|e| e.to_string())
    };
    let rt: &'static Runtime = Box::leak(Box::new(start().map_err(|e| {
        PyRuntimeError::new_err(format!("ssm-kernels could not start a CUDA runtime on device {device}: {e}"))
    })?));
    map.insert((device, stream), rt);
    Ok(rt)
}

/// The CUDA runtimes started so far, by (device, stream).
fn cuda_runtimes() -> &'static std::sync::Mutex<std::collections::HashMap<(u32, usize), &'static Runtime>> {
    static CUDA: OnceLock<std::sync::Mutex<std::collections::HashMap<(u32, usize), &'static Runtime>>> =
        OnceLock::new();
    CUDA.get_or_init(Default::default)
}

/// Waits for the CUDA work of every runtime started so far and reads (and clears) their device
/// error words: raises `SsmError` when a kernel skipped rows for invalid device-resident
/// indices. Off the hot path: it synchronises. Host calls check their indices up front.
#[pyfunction]
fn check() -> PyResult<()> {
    let runtimes: Vec<&'static Runtime> =
        cuda_runtimes().lock().unwrap_or_else(|e| e.into_inner()).values().copied().collect();
    runtimes.into_iter().try_for_each(|rt| rt.check().map_err(op_err))
}

/// One host array as its `__array_interface__` describes it.
struct Array {
    name: &'static str,
    /// First byte of the memory the view can reach.
    start: usize,
    /// Bytes from `start` the view can reach (0 for an empty array).
    bytes: usize,
    readonly: bool,
    dtype: DType,
    shape: Vec<usize>,
    /// Element strides.
    strides: Vec<isize>,
    /// Element offset of element `[0, …]` from `start`.
    offset: usize,
    /// Host memory, or a CUDA device's (then `start` is a device address).
    device: Device,
}

fn dtype_of(name: &'static str, typestr: &str) -> PyResult<DType> {
    Ok(match typestr {
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        "<i2" => DType::I16,
        "|i1" => DType::I8,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|b1" => DType::Bool,
        other => {
            let known = match other {
                "<f8" => " (float64)",
                "|u1" => " (uint8)",
                "|i1" => " (int8)",
                "<u4" => " (uint32)",
                "<V2" | "|V2" => " (a 2-byte void type, e.g. ml_dtypes' bfloat16)",
                _ => "",
            };
            return Err(PyTypeError::new_err(format!(
                "`{name}`: dtype {other}{known} is not supported (float32, float16, int16, int8, int32, int64, bool)"
            )));
        }
    })
}

/// An array of `dtype` at address `ptr` (its element `[0, …]`) with element `strides`: the
/// memory span its elements reach.
fn spanned(
    name: &'static str,
    (ptr, device): (usize, Device),
    readonly: bool,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
) -> Array {
    let es = dtype.size() as isize;
    let empty = shape.contains(&0);
    let (mut lo, mut hi) = (0isize, 0isize);
    if !empty {
        for (&n, &s) in shape.iter().zip(&strides) {
            let reach = (n as isize - 1) * s;
            if reach < 0 { lo += reach } else { hi += reach }
        }
    }
    let elems = if empty { 0 } else { (hi - lo + 1) as usize };
    Array {
        name,
        start: (ptr as isize + lo * es) as usize,
        bytes: elems * es as usize,
        readonly,
        dtype,
        shape,
        strides,
        offset: (-lo) as usize,
        device,
    }
}

/// C-order element strides of `shape`.
fn compact(shape: &[usize]) -> Vec<isize> {
    let mut st = vec![1isize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1] as isize;
    }
    st
}

/// An argument's array: through `__array_interface__` (numpy) or DLPack (`__dlpack__`: torch
/// and any other producer, CPU tensors). DLPack capsules are kept in `keep` for the call.
fn array<'py>(name: &'static str, obj: &Bound<'py, PyAny>, keep: &mut Vec<Bound<'py, PyAny>>) -> PyResult<Array> {
    if let Ok(ai) = obj.getattr("__array_interface__") {
        return array_interface(name, &ai);
    }
    if obj.hasattr("__dlpack__")? {
        return dlpack(name, obj, keep);
    }
    Err(PyTypeError::new_err(format!(
        "`{name}`: expected a host array (numpy's __array_interface__, or a DLPack producer such as a torch CPU tensor)"
    )))
}

fn array_interface(name: &'static str, ai: &Bound<'_, PyAny>) -> PyResult<Array> {
    let ai = ai
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err(format!("`{name}`: __array_interface__ is not a dict")))?;
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        ai.get_item(key)?.ok_or_else(|| PyTypeError::new_err(format!("`{name}`: __array_interface__ has no `{key}`")))
    };
    let (ptr, readonly): (usize, bool) = item("data")?.extract()?;
    let shape: Vec<usize> = item("shape")?.extract()?;
    let typestr: String = item("typestr")?.extract()?;
    let dtype = dtype_of(name, &typestr)?;
    let es = dtype.size() as isize;
    let strides: Vec<isize> = match ai.get_item("strides")? {
        Some(s) if !s.is_none() => {
            let bytes: Vec<isize> = s.extract()?;
            if bytes.len() != shape.len() || bytes.iter().any(|s| s % es != 0) {
                return Err(PyValueError::new_err(format!(
                    "`{name}`: strides {bytes:?} are not whole elements of {typestr}"
                )));
            }
            bytes.iter().map(|s| s / es).collect()
        }
        _ => compact(&shape),
    };
    Ok(spanned(name, (ptr, Device::Cpu), readonly, dtype, shape, strides))
}

/// DLPack's `DLTensor` (v0.8 ABI, what `__dlpack__()` returns without a `max_version`).
#[repr(C)]
struct DlTensor {
    data: *mut std::ffi::c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    code: u8,
    bits: u8,
    lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

fn dlpack<'py>(name: &'static str, obj: &Bound<'py, PyAny>, keep: &mut Vec<Bound<'py, PyAny>>) -> PyResult<Array> {
    use pyo3::types::PyCapsule;
    let cap = obj.call_method0("__dlpack__")?;
    let capsule = cap
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err(format!("`{name}`: __dlpack__ did not return a capsule")))?;
    let ptr = capsule.pointer_checked(Some(c"dltensor"))?;
    // SAFETY: a "dltensor" capsule holds a `DLManagedTensor`, whose first member is the
    // `DLTensor` mirrored by `DlTensor`; the capsule (kept alive in `keep` for the call, its
    // name unchanged so that its own destructor releases the tensor afterwards) keeps the
    // tensor and its shape and strides arrays alive, and no Python code runs while we read.
    let t = unsafe { &*ptr.cast::<DlTensor>().as_ptr() };
    let device = match t.device_type {
        1 => Device::Cpu,
        2 => Device::Cuda(t.device_id as u32),
        other => {
            return Err(PyTypeError::new_err(format!(
                "`{name}`: a DLPack tensor on device type {other} (CPU, 1, and CUDA, 2, are supported)"
            )));
        }
    };
    let dtype = match (t.code, t.bits, t.lanes) {
        (2, 32, 1) => DType::F32,
        (2, 16, 1) => DType::F16,
        (4, 16, 1) => DType::BF16,
        (0, 16, 1) => DType::I16,
        (0, 8, 1) => DType::I8,
        (0, 32, 1) => DType::I32,
        (0, 64, 1) => DType::I64,
        (6, 8, 1) => DType::Bool,
        (code, bits, lanes) => {
            return Err(PyTypeError::new_err(format!(
                "`{name}`: DLPack dtype (code {code}, {bits} bits, {lanes} lanes) is not supported (float32, float16, bfloat16, int16, int8, int32, int64, bool)"
            )));
        }
    };
    let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err(format!("`{name}`: negative ndim")))?;
    // SAFETY: `shape` (and `strides` when not null) point to `ndim` int64s (the DLPack contract).
    let (shape, strides) = unsafe {
        let shape: Vec<usize> = if ndim == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(t.shape, ndim).iter().map(|&n| n as usize).collect()
        };
        let strides = if t.strides.is_null() || ndim == 0 {
            compact(&shape)
        } else {
            std::slice::from_raw_parts(t.strides, ndim).iter().map(|&s| s as isize).collect()
        };
        (shape, strides)
    };
    keep.push(cap);
    Ok(spanned(name, (t.data as usize + t.byte_offset as usize, device), false, dtype, shape, strides))
}

impl Array {
    fn overlaps(&self, other: &Array) -> bool {
        self.device == other.device
            && self.bytes > 0
            && other.bytes > 0
            && self.start < other.start + other.bytes
            && other.start < self.start + self.bytes
    }

    fn layout_err(&self, e: ssm_tensor::TensorError) -> PyErr {
        SsmError::new_err(format!("`{}`: {e}", self.name))
    }

    /// A read view.
    ///
    /// # Safety
    /// The array's memory must stay alive and unwritten by anyone else for `'a`.
    unsafe fn view<'a>(&self) -> PyResult<TensorRef<'a>> {
        let elems = self.bytes / self.dtype.size();
        let flat = match self.device {
            Device::Cpu => {
                // SAFETY: by the caller's contract; `start..start + bytes` is the memory the
                // array's interface says its elements reach.
                let bytes: &'a [u8] = if self.bytes == 0 {
                    &[]
                } else {
                    unsafe { std::slice::from_raw_parts(self.start as *const u8, self.bytes) }
                };
                TensorRef::from_bytes(bytes, self.dtype, &[elems])
            }
            // SAFETY: by the caller's contract: the producer's device memory, `elems` elements.
            device => unsafe {
                TensorRef::from_device_ptr(self.start as u64, elems, self.dtype, device, &[elems], &[1])
            },
        }
        .map_err(|e| self.layout_err(e))?;
        flat.with_layout(&self.shape, &self.strides, self.offset).map_err(|e| self.layout_err(e))
    }

    /// A write view.
    ///
    /// # Safety
    /// As [`Array::view`], and no other view of the call may reach this memory.
    unsafe fn view_mut<'a>(&self) -> PyResult<TensorMut<'a>> {
        if self.readonly {
            return Err(SsmError::new_err(format!("`{}` is read-only; the op writes it", self.name)));
        }
        let elems = self.bytes / self.dtype.size();
        let flat = match self.device {
            Device::Cpu => {
                // SAFETY: by the caller's contract (overlaps ruled out by `check_disjoint`).
                let bytes: &'a mut [u8] = if self.bytes == 0 {
                    &mut []
                } else {
                    unsafe { std::slice::from_raw_parts_mut(self.start as *mut u8, self.bytes) }
                };
                TensorMut::from_bytes(bytes, self.dtype, &[elems])
            }
            // SAFETY: as for `view`, and no other view of the call reaches this memory.
            device => unsafe {
                TensorMut::from_device_ptr(self.start as u64, elems, self.dtype, device, &[elems], &[1])
            },
        }
        .map_err(|e| self.layout_err(e))?;
        flat.with_layout(&self.shape, &self.strides, self.offset).map_err(|e| self.layout_err(e))
    }
}

/// The arrays of one call, by argument: the written ones are checked not to overlap any other
/// argument's memory before any view is made.
#[derive(Default)]
struct Arrays<'py> {
    list: Vec<Array>,
    written: Vec<usize>,
    /// DLPack capsules, alive until the call returns.
    keep: Vec<Bound<'py, PyAny>>,
}

impl<'py> Arrays<'py> {
    fn add(&mut self, name: &'static str, obj: &Bound<'py, PyAny>) -> PyResult<usize> {
        self.list.push(array(name, obj, &mut self.keep)?);
        Ok(self.list.len() - 1)
    }

    fn add_written(&mut self, name: &'static str, obj: &Bound<'py, PyAny>) -> PyResult<usize> {
        let i = self.add(name, obj)?;
        self.written.push(i);
        Ok(i)
    }

    fn opt(&mut self, name: &'static str, obj: Option<&Bound<'py, PyAny>>) -> PyResult<Option<usize>> {
        obj.filter(|o| !o.is_none()).map(|o| self.add(name, o)).transpose()
    }

    fn opt_written(&mut self, name: &'static str, obj: Option<&Bound<'py, PyAny>>) -> PyResult<Option<usize>> {
        obj.filter(|o| !o.is_none()).map(|o| self.add_written(name, o)).transpose()
    }

    /// Refuses a written array whose memory overlaps any other argument's.
    fn check_disjoint(&self) -> PyResult<()> {
        for &w in &self.written {
            let wa = &self.list[w];
            if let Some(o) = self.list.iter().enumerate().find(|&(i, o)| i != w && wa.overlaps(o)).map(|(_, o)| o) {
                return Err(SsmError::new_err(format!(
                    "`{}` overlaps `{}` in memory; an array the op writes must not share memory with another argument",
                    wa.name, o.name
                )));
            }
        }
        Ok(())
    }

    /// A read view of argument `i`.
    ///
    /// # Safety
    /// The Python objects the arrays came from stay alive, and nothing else touches their
    /// memory, for `'a` (the call holds the GIL and its arguments).
    unsafe fn r<'a>(&self, i: usize) -> PyResult<TensorRef<'a>> {
        // SAFETY: forwarded.
        unsafe { self.list[i].view() }
    }

    /// [`Arrays::r`] of an optional argument.
    ///
    /// # Safety
    /// As [`Arrays::r`].
    unsafe fn r_opt<'a>(&self, i: Option<usize>) -> PyResult<Option<TensorRef<'a>>> {
        // SAFETY: forwarded.
        i.map(|i| unsafe { self.r(i) }).transpose()
    }

    /// A write view of argument `i`, one of the written ones.
    ///
    /// # Safety
    /// As [`Arrays::r`], after [`Arrays::check_disjoint`]; each written argument viewed once.
    unsafe fn w<'a>(&self, i: usize) -> PyResult<TensorMut<'a>> {
        debug_assert!(self.written.contains(&i));
        // SAFETY: forwarded; `check_disjoint` ruled out overlaps with every other view.
        unsafe { self.list[i].view_mut() }
    }

    /// [`Arrays::w`] of an optional argument.
    ///
    /// # Safety
    /// As [`Arrays::w`].
    unsafe fn w_opt<'a>(&self, i: Option<usize>) -> PyResult<Option<TensorMut<'a>>> {
        // SAFETY: forwarded.
        i.map(|i| unsafe { self.w(i) }).transpose()
    }
}

fn op_err(e: ssm_dispatch::Error) -> PyErr {
    SsmError::new_err(e.to_string())
}

/// `selective_state_update` (vLLM's signature, plus FlashInfer's verification arguments and
/// block-scaled int16 / int8 states; see the Python wrapper): `state`, `out`, `state_scale`,
/// `intermediate_states_buffer` and `intermediate_state_scales` written in place.
#[pyfunction]
#[pyo3(signature = (state, x, dt, a, b, c, out, d=None, dt_bias=None, z=None, dt_softplus=false,
    state_batch_indices=None, dst_state_batch_indices=None, pad_slot_id=None, num_accepted_tokens=None,
    cu_seqlens=None, disable_state_update=false, intermediate_states_buffer=None,
    intermediate_state_indices=None, state_scale=None, intermediate_state_scales=None, stream=None))]
#[allow(clippy::too_many_arguments)]
fn selective_state_update(
    state: &Bound<'_, PyAny>,
    x: &Bound<'_, PyAny>,
    dt: &Bound<'_, PyAny>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    c: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    d: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    dt_softplus: bool,
    state_batch_indices: Option<&Bound<'_, PyAny>>,
    dst_state_batch_indices: Option<&Bound<'_, PyAny>>,
    pad_slot_id: Option<i64>,
    num_accepted_tokens: Option<&Bound<'_, PyAny>>,
    cu_seqlens: Option<&Bound<'_, PyAny>>,
    disable_state_update: bool,
    intermediate_states_buffer: Option<&Bound<'_, PyAny>>,
    intermediate_state_indices: Option<&Bound<'_, PyAny>>,
    state_scale: Option<&Bound<'_, PyAny>>,
    intermediate_state_scales: Option<&Bound<'_, PyAny>>,
    stream: Option<usize>,
) -> PyResult<()> {
    let mut t = Arrays::default();
    let (state, out) = (t.add_written("state", state)?, t.add_written("out", out)?);
    let ist = t.opt_written("intermediate_states_buffer", intermediate_states_buffer)?;
    let scale = t.opt_written("state_scale", state_scale)?;
    let ist_scales = t.opt_written("intermediate_state_scales", intermediate_state_scales)?;
    let isi = t.opt("intermediate_state_indices", intermediate_state_indices)?;
    let (x, dt, a, b, c) = (t.add("x", x)?, t.add("dt", dt)?, t.add("A", a)?, t.add("B", b)?, t.add("C", c)?);
    let (d, dt_bias, z) = (t.opt("D", d)?, t.opt("dt_bias", dt_bias)?, t.opt("z", z)?);
    let sbi = t.opt("state_batch_indices", state_batch_indices)?;
    let dst = t.opt("dst_state_batch_indices", dst_state_batch_indices)?;
    let (nacc, cu) = (t.opt("num_accepted_tokens", num_accepted_tokens)?, t.opt("cu_seqlens", cu_seqlens)?);
    t.check_disjoint()?;
    let rt = runtime(&t, stream)?;
    // SAFETY: the arrays are the call's arguments (alive for the call), the GIL is held
    // throughout, and the written ones overlap no other argument.
    let args = unsafe {
        SelectiveStateUpdateArgs {
            state: t.w(state)?,
            x: t.r(x)?,
            dt: t.r(dt)?,
            a: t.r(a)?,
            b: t.r(b)?,
            c: t.r(c)?,
            d: t.r_opt(d)?,
            dt_bias: t.r_opt(dt_bias)?,
            z: t.r_opt(z)?,
            dt_softplus,
            state_batch_indices: t.r_opt(sbi)?,
            dst_state_batch_indices: t.r_opt(dst)?,
            pad_slot_id,
            out: t.w(out)?,
            num_accepted_tokens: t.r_opt(nacc)?,
            cu_seqlens: t.r_opt(cu)?,
            stochastic_rounding: None,
            disable_state_update,
            intermediate_states_buffer: t.w_opt(ist)?,
            intermediate_state_indices: t.r_opt(isi)?,
            rand_seed: None,
            state_scale: t.w_opt(scale)?,
            intermediate_state_scales: t.w_opt(ist_scales)?,
        }
    };
    rt.selective_state_update(args).map_err(op_err)
}

/// `causal_conv1d_update` on `x` `[batch, dim]`, `[batch, seqlen, dim]` (token-major) or packed
/// `[tokens, dim]`, with a `[slots, dim, state_len]` pool: `conv_state` and `out` written in place.
#[pyfunction]
#[pyo3(signature = (x, conv_state, weight, out, bias=None, silu=false, conv_state_indices=None,
    num_accepted_tokens=None, query_start_loc=None, pad_slot_id=None, stream=None))]
#[allow(clippy::too_many_arguments)]
fn causal_conv1d_update(
    x: &Bound<'_, PyAny>,
    conv_state: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    silu: bool,
    conv_state_indices: Option<&Bound<'_, PyAny>>,
    num_accepted_tokens: Option<&Bound<'_, PyAny>>,
    query_start_loc: Option<&Bound<'_, PyAny>>,
    pad_slot_id: Option<i64>,
    stream: Option<usize>,
) -> PyResult<()> {
    let mut t = Arrays::default();
    let (conv_state, out) = (t.add_written("conv_state", conv_state)?, t.add_written("out", out)?);
    let (x, weight, bias) = (t.add("x", x)?, t.add("weight", weight)?, t.opt("bias", bias)?);
    let ci = t.opt("conv_state_indices", conv_state_indices)?;
    let nacc = t.opt("num_accepted_tokens", num_accepted_tokens)?;
    let qsl = t.opt("query_start_loc", query_start_loc)?;
    t.check_disjoint()?;
    let rt = runtime(&t, stream)?;
    // SAFETY: as in `selective_state_update`.
    let args = unsafe {
        CausalConv1dUpdateArgs {
            x: t.r(x)?,
            conv_state: t.w(conv_state)?,
            conv_state_layout: ConvStateLayout::DimStateLen,
            weight: t.r(weight)?,
            bias: t.r_opt(bias)?,
            activation: if silu { Activation::Silu } else { Activation::None },
            conv_state_indices: t.r_opt(ci)?,
            num_accepted_tokens: t.r_opt(nacc)?,
            query_start_loc: t.r_opt(qsl)?,
            pad_slot_id,
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out: t.w(out)?,
        }
    };
    rt.causal_conv1d_update(args).map_err(op_err)
}

/// Both recurrent GDN ops, vLLM's arguments from `q` on (`[V, K]` state): with `g` (and `beta`)
/// given, `fused_recurrent_gated_delta_rule`; with `A_log`, `a`, `b`, `dt_bias` given,
/// `fused_sigmoid_gating_delta_rule_update` (gates computed in the kernel with `softplus_beta`
/// and `threshold`). Writes `o`, and the pool `initial_state` in place or the per-token
/// `final_state`.
#[pyfunction]
#[pyo3(signature = (q, k, v, o, scale=None, initial_state=None, final_state=None, cu_seqlens=None,
    ssm_state_indices=None, num_accepted_tokens=None, use_qk_l2norm_in_kernel=false, g=None, beta=None,
    a_log=None, a=None, b=None, dt_bias=None, softplus_beta=1.0, threshold=20.0, stream=None))]
#[allow(clippy::too_many_arguments)]
fn gated_delta_rule(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    o: &Bound<'_, PyAny>,
    scale: Option<f32>,
    initial_state: Option<&Bound<'_, PyAny>>,
    final_state: Option<&Bound<'_, PyAny>>,
    cu_seqlens: Option<&Bound<'_, PyAny>>,
    ssm_state_indices: Option<&Bound<'_, PyAny>>,
    num_accepted_tokens: Option<&Bound<'_, PyAny>>,
    use_qk_l2norm_in_kernel: bool,
    g: Option<&Bound<'_, PyAny>>,
    beta: Option<&Bound<'_, PyAny>>,
    a_log: Option<&Bound<'_, PyAny>>,
    a: Option<&Bound<'_, PyAny>>,
    b: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    softplus_beta: f32,
    threshold: f32,
    stream: Option<usize>,
) -> PyResult<()> {
    let mut t = Arrays::default();
    let o = t.add_written("o", o)?;
    let initial_state = t.opt_written("initial_state", initial_state)?;
    let final_state = t.opt_written("final_state", final_state)?;
    let (q, k, v) = (t.add("q", q)?, t.add("k", k)?, t.add("v", v)?);
    let (cu, idx) = (t.opt("cu_seqlens", cu_seqlens)?, t.opt("ssm_state_indices", ssm_state_indices)?);
    let nacc = t.opt("num_accepted_tokens", num_accepted_tokens)?;
    let (g, beta) = (t.opt("g", g)?, t.opt("beta", beta)?);
    let gates = [t.opt("A_log", a_log)?, t.opt("a", a)?, t.opt("b", b)?, t.opt("dt_bias", dt_bias)?];
    t.check_disjoint()?;
    let rt = runtime(&t, stream)?;
    // SAFETY: the arrays are the call's arguments (alive for the call), the GIL is held
    // throughout, and the written ones overlap no other argument.
    unsafe {
        let rule = DeltaRuleArgs {
            initial_state: t.w_opt(initial_state)?,
            final_state: t.w_opt(final_state)?,
            cu_seqlens: t.r_opt(cu)?,
            ssm_state_indices: t.r_opt(idx)?,
            num_accepted_tokens: t.r_opt(nacc)?,
            use_qk_l2norm_in_kernel,
            scale,
            ..DeltaRuleArgs::new(t.r(q)?, t.r(k)?, t.r(v)?, t.w(o)?)
        };
        match (g, gates) {
            (Some(g), [None, None, None, None]) => rt
                .fused_recurrent_gated_delta_rule(FusedRecurrentGatedDeltaRuleArgs {
                    g: t.r(g)?,
                    beta: t.r_opt(beta)?,
                    rule,
                })
                .map_err(op_err),
            (None, [Some(al), Some(a), Some(b), Some(db)]) if beta.is_none() => {
                let gates = GateInputs {
                    beta: softplus_beta,
                    threshold,
                    ..GateInputs::new(t.r(al)?, t.r(a)?, t.r(b)?, t.r(db)?)
                };
                rt.fused_sigmoid_gating_delta_rule_update(FusedSigmoidGatingDeltaRuleUpdateArgs { gates, rule })
                    .map_err(op_err)
            }
            _ => Err(SsmError::new_err(
                "give either `g` (and optionally `beta`) or all of `A_log`, `a`, `b` and `dt_bias`",
            )),
        }
    }
}

/// `mamba_chunk_scan_combined_varlen` (Mamba2 SSD prefill; vLLM's signature, see the Python
/// wrapper): writes `out`, and `varlen_states` (when given) or the pool `final_states_out`
/// through `final_state_indices`, and the checkpoints `checkpoint_chunk_indices` names into
/// the pool through `checkpoint_state_indices`.
#[pyfunction]
#[pyo3(signature = (x, dt, a, b, c, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx,
    out, d=None, z=None, dt_bias=None, initial_states=None, dt_softplus=false, dt_limit=(0.0, f32::INFINITY),
    return_intermediate_states=false, varlen_states=None, final_states_out=None, final_state_indices=None,
    checkpoint_chunk_indices=None, checkpoint_state_indices=None, pad_slot_id=None, stream=None))]
#[allow(clippy::too_many_arguments)]
fn mamba_chunk_scan_combined_varlen(
    x: &Bound<'_, PyAny>,
    dt: &Bound<'_, PyAny>,
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    c: &Bound<'_, PyAny>,
    chunk_size: usize,
    cu_seqlens: &Bound<'_, PyAny>,
    cu_chunk_seqlens: &Bound<'_, PyAny>,
    last_chunk_indices: &Bound<'_, PyAny>,
    seq_idx: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    d: Option<&Bound<'_, PyAny>>,
    z: Option<&Bound<'_, PyAny>>,
    dt_bias: Option<&Bound<'_, PyAny>>,
    initial_states: Option<&Bound<'_, PyAny>>,
    dt_softplus: bool,
    dt_limit: (f32, f32),
    return_intermediate_states: bool,
    varlen_states: Option<&Bound<'_, PyAny>>,
    final_states_out: Option<&Bound<'_, PyAny>>,
    final_state_indices: Option<&Bound<'_, PyAny>>,
    checkpoint_chunk_indices: Option<&Bound<'_, PyAny>>,
    checkpoint_state_indices: Option<&Bound<'_, PyAny>>,
    pad_slot_id: Option<i64>,
    stream: Option<usize>,
) -> PyResult<()> {
    let mut t = Arrays::default();
    let out = t.add_written("out", out)?;
    let states = t.opt_written("varlen_states", varlen_states)?;
    let pool = t.opt_written("final_states_out", final_states_out)?;
    let (x, dt, a, b, c) = (t.add("x", x)?, t.add("dt", dt)?, t.add("A", a)?, t.add("B", b)?, t.add("C", c)?);
    let tables = [
        t.add("cu_seqlens", cu_seqlens)?,
        t.add("cu_chunk_seqlens", cu_chunk_seqlens)?,
        t.add("last_chunk_indices", last_chunk_indices)?,
        t.add("seq_idx", seq_idx)?,
    ];
    let (d, z, dt_bias) = (t.opt("D", d)?, t.opt("z", z)?, t.opt("dt_bias", dt_bias)?);
    let init = t.opt("initial_states", initial_states)?;
    let final_idx = t.opt("final_state_indices", final_state_indices)?;
    let ck_chunk = t.opt("checkpoint_chunk_indices", checkpoint_chunk_indices)?;
    let ck_slot = t.opt("checkpoint_state_indices", checkpoint_state_indices)?;
    t.check_disjoint()?;
    let rt = runtime(&t, stream)?;
    // The returned states' dtype is the one the caller allocated them in (vLLM's `state_dtype`).
    let state_dtype = states.or(pool).map(|i| t.list[i].dtype);
    // SAFETY: the arrays are the call's arguments (alive for the call), the GIL is held
    // throughout, and the written ones overlap no other argument.
    let args = unsafe {
        MambaChunkScanCombinedVarlenArgs {
            out: Some(t.w(out)?),
            d: t.r_opt(d)?,
            z: t.r_opt(z)?,
            dt_bias: t.r_opt(dt_bias)?,
            initial_states: t.r_opt(init)?,
            ssm_state: t.w_opt(pool)?,
            final_state_indices: t.r_opt(final_idx)?,
            checkpoint_chunk_indices: t.r_opt(ck_chunk)?,
            checkpoint_state_indices: t.r_opt(ck_slot)?,
            pad_slot_id,
            dt_softplus,
            dt_limit,
            return_intermediate_states,
            state_dtype,
            varlen_states: t.w_opt(states)?,
            ..MambaChunkScanCombinedVarlenArgs::new(
                t.r(x)?,
                t.r(dt)?,
                t.r(a)?,
                t.r(b)?,
                t.r(c)?,
                chunk_size,
                [t.r(tables[0])?, t.r(tables[1])?, t.r(tables[2])?, t.r(tables[3])?],
            )
        }
    };
    rt.mamba_chunk_scan_combined_varlen(args).map_err(op_err)
}

/// vLLM's chunk metadata of a prefill batch
/// (`ssm_ssd::compute_chunk_metadata_with_checkpoints`): `(cu_chunk_seqlens, seq_idx,
/// last_chunk_indices, checkpoint_chunk_indices)`.
#[pyfunction]
#[pyo3(signature = (query_start_loc, num_computed_tokens, chunk_size, checkpoint_offsets=None))]
fn compute_chunk_metadata(
    query_start_loc: Vec<i64>,
    num_computed_tokens: Vec<i64>,
    chunk_size: usize,
    checkpoint_offsets: Option<Vec<i64>>,
) -> PyResult<[Vec<i32>; 4]> {
    let m = ssm_ssd::try_compute_chunk_metadata_with_checkpoints(
        &query_start_loc,
        &num_computed_tokens,
        chunk_size,
        checkpoint_offsets.as_deref().unwrap_or(&[]),
    )
    .map_err(|e| SsmError::new_err(e.to_string()))?;
    Ok([m.cu_chunk_seqlens, m.seq_idx, m.last_chunk_indices, m.checkpoint_chunk_indices])
}

/// `causal_conv1d_fn` (varlen prefill) on token-major `x` `[tokens, dim]` with a
/// `[slots, dim, state_len]` pool: `out` and the slots' first `width − 1` columns written (and,
/// with `checkpoint_offsets` / `checkpoint_state_indices`, each checkpoint's slot).
#[pyfunction]
#[pyo3(signature = (x, weight, conv_states, query_start_loc, out, bias=None, silu=true, cache_indices=None,
    has_initial_state=None, pad_slot_id=None, checkpoint_offsets=None, checkpoint_state_indices=None, stream=None))]
#[allow(clippy::too_many_arguments)]
fn causal_conv1d_fn(
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    conv_states: &Bound<'_, PyAny>,
    query_start_loc: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    silu: bool,
    cache_indices: Option<&Bound<'_, PyAny>>,
    has_initial_state: Option<&Bound<'_, PyAny>>,
    pad_slot_id: Option<i64>,
    checkpoint_offsets: Option<&Bound<'_, PyAny>>,
    checkpoint_state_indices: Option<&Bound<'_, PyAny>>,
    stream: Option<usize>,
) -> PyResult<()> {
    let mut t = Arrays::default();
    let (states, out) = (t.add_written("conv_states", conv_states)?, t.add_written("out", out)?);
    let (x, weight, qsl) = (t.add("x", x)?, t.add("weight", weight)?, t.add("query_start_loc", query_start_loc)?);
    let (bias, ci) = (t.opt("bias", bias)?, t.opt("cache_indices", cache_indices)?);
    let has = t.opt("has_initial_state", has_initial_state)?;
    let ck_off = t.opt("checkpoint_offsets", checkpoint_offsets)?;
    let ck_slot = t.opt("checkpoint_state_indices", checkpoint_state_indices)?;
    t.check_disjoint()?;
    let rt = runtime(&t, stream)?;
    // SAFETY: the arrays are the call's arguments (alive for the call), the GIL is held
    // throughout, and the written ones overlap no other argument.
    let args = unsafe {
        CausalConv1dFnArgs {
            x: t.r(x)?,
            weight: t.r(weight)?,
            bias: t.r_opt(bias)?,
            conv_states: t.w(states)?,
            conv_state_layout: ConvStateLayout::DimStateLen,
            query_start_loc: t.r(qsl)?,
            cache_indices: t.r_opt(ci)?,
            has_initial_state: t.r_opt(has)?,
            activation: if silu { Activation::Silu } else { Activation::None },
            pad_slot_id,
            checkpoint_offsets: t.r_opt(ck_off)?,
            checkpoint_state_indices: t.r_opt(ck_slot)?,
            out: t.w(out)?,
        }
    };
    rt.causal_conv1d_fn(args).map_err(op_err)
}

/// `chunk_gated_delta_rule` (GDN chunked prefill, `[V, K]` states): writes `o` and, when given,
/// `final_state` `[N, HV, V, K]`; `initial_state` `[N, HV, V, K]` is read (dense, as FLA's).
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, o, scale=None, initial_state=None, final_state=None, cu_seqlens=None,
    use_qk_l2norm_in_kernel=false, stream=None))]
#[allow(clippy::too_many_arguments)]
fn chunk_gated_delta_rule(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    g: &Bound<'_, PyAny>,
    beta: &Bound<'_, PyAny>,
    o: &Bound<'_, PyAny>,
    scale: Option<f32>,
    initial_state: Option<&Bound<'_, PyAny>>,
    final_state: Option<&Bound<'_, PyAny>>,
    cu_seqlens: Option<&Bound<'_, PyAny>>,
    use_qk_l2norm_in_kernel: bool,
    stream: Option<usize>,
) -> PyResult<()> {
    let mut t = Arrays::default();
    let (o, fin) = (t.add_written("o", o)?, t.opt_written("final_state", final_state)?);
    // Read only: the op's `initial_state` is writable only for its in-place mode, unused here.
    let init = t.opt_written("initial_state", initial_state)?;
    let (q, k, v, g, beta) = (t.add("q", q)?, t.add("k", k)?, t.add("v", v)?, t.add("g", g)?, t.add("beta", beta)?);
    let cu = t.opt("cu_seqlens", cu_seqlens)?;
    t.check_disjoint()?;
    let rt = runtime(&t, stream)?;
    // SAFETY: as in `causal_conv1d_fn`.
    let args = unsafe {
        ChunkGatedDeltaRuleArgs {
            scale,
            initial_state: t.w_opt(init)?,
            final_state: t.w_opt(fin)?,
            cu_seqlens: t.r_opt(cu)?,
            use_qk_l2norm_in_kernel,
            ..ChunkGatedDeltaRuleArgs::new(t.r(q)?, t.r(k)?, t.r(v)?, t.r(g)?, t.r(beta)?, t.w(o)?)
        }
    };
    rt.chunk_gated_delta_rule(args).map_err(op_err)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("SsmError", m.py().get_type::<SsmError>())?;
    m.add_function(wrap_pyfunction!(selective_state_update, m)?)?;
    m.add_function(wrap_pyfunction!(causal_conv1d_update, m)?)?;
    m.add_function(wrap_pyfunction!(gated_delta_rule, m)?)?;
    m.add_function(wrap_pyfunction!(mamba_chunk_scan_combined_varlen, m)?)?;
    m.add_function(wrap_pyfunction!(compute_chunk_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(causal_conv1d_fn, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_gated_delta_rule, m)?)?;
    Ok(())
}
