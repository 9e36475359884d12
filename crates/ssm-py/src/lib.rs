//! `ssm_kernels._core`: the Rust side of the Python package. Each function takes numpy arrays
//! (anything with `__array_interface__` on the host), views their memory where it is (shape,
//! strides and offset kept, nothing copied), runs the op on the process's CPU runtime and
//! raises `ssm_kernels.SsmError` (a `ValueError`) with the op's typed message when the call is
//! refused; a refused call writes nothing. The vLLM-shaped signatures, defaults and output
//! allocation live in `python/ssm_kernels/__init__.py`.

use std::sync::OnceLock;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{Config, Runtime};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, TensorMut, TensorRef};

pyo3::create_exception!(
    _core,
    SsmError,
    PyValueError,
    "A call ssm-kernels refused (its typed message); nothing was written."
);

/// The process's runtime: the CPU backend on every core, started on first use.
fn runtime() -> PyResult<&'static Runtime> {
    static RT: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(&Config::cpu(None)).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("ssm-kernels could not start its CPU runtime: {e}")))
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
}

fn dtype_of(name: &'static str, typestr: &str) -> PyResult<DType> {
    Ok(match typestr {
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "|b1" => DType::Bool,
        other => {
            let known = match other {
                "<f8" => " (float64)",
                "|u1" => " (uint8)",
                "|i1" => " (int8)",
                "<i2" => " (int16)",
                "<u4" => " (uint32)",
                "<V2" | "|V2" => " (a 2-byte void type, e.g. ml_dtypes' bfloat16)",
                _ => "",
            };
            return Err(PyTypeError::new_err(format!(
                "`{name}`: dtype {other}{known} is not supported (float32, float16, int32, int64, bool)"
            )));
        }
    })
}

fn array(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Array> {
    let ai = obj.getattr("__array_interface__").map_err(|_| {
        PyTypeError::new_err(format!("`{name}`: expected a host array with __array_interface__ (a numpy array)"))
    })?;
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
    let byte_strides: Vec<isize> = match ai.get_item("strides")? {
        Some(s) if !s.is_none() => s.extract()?,
        _ => {
            // C order.
            let mut st = vec![es; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                st[i] = st[i + 1] * shape[i + 1] as isize;
            }
            st
        }
    };
    if byte_strides.len() != shape.len() || byte_strides.iter().any(|s| s % es != 0) {
        return Err(PyValueError::new_err(format!(
            "`{name}`: strides {byte_strides:?} are not whole elements of {typestr}"
        )));
    }
    let strides: Vec<isize> = byte_strides.iter().map(|s| s / es).collect();
    let empty = shape.contains(&0);
    let (mut lo, mut hi) = (0isize, 0isize);
    if !empty {
        for (&n, &s) in shape.iter().zip(&strides) {
            let reach = (n as isize - 1) * s;
            if reach < 0 { lo += reach } else { hi += reach }
        }
    }
    let elems = if empty { 0 } else { (hi - lo + 1) as usize };
    Ok(Array {
        name,
        start: (ptr as isize + lo * es) as usize,
        bytes: elems * es as usize,
        readonly,
        dtype,
        shape,
        strides,
        offset: (-lo) as usize,
    })
}

fn opt_array(name: &'static str, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Array>> {
    obj.filter(|o| !o.is_none()).map(|o| array(name, o)).transpose()
}

impl Array {
    fn overlaps(&self, other: &Array) -> bool {
        self.bytes > 0
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
        // SAFETY: by the caller's contract; `start..start + bytes` is the memory the array's
        // interface says its elements reach.
        let bytes: &'a [u8] = if self.bytes == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(self.start as *const u8, self.bytes) }
        };
        let flat = TensorRef::from_bytes(bytes, self.dtype, &[self.bytes / self.dtype.size()])
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
        // SAFETY: by the caller's contract (checked by `checked_disjoint` for the call's views).
        let bytes: &'a mut [u8] = if self.bytes == 0 {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(self.start as *mut u8, self.bytes) }
        };
        let flat = TensorMut::from_bytes(bytes, self.dtype, &[self.bytes / self.dtype.size()])
            .map_err(|e| self.layout_err(e))?;
        flat.with_layout(&self.shape, &self.strides, self.offset).map_err(|e| self.layout_err(e))
    }
}

/// Refuses a written array whose memory overlaps any other argument's.
fn checked_disjoint(written: &[&Array], all: &[&Array]) -> PyResult<()> {
    for w in written {
        if let Some(o) = all.iter().find(|o| !std::ptr::eq(**o, *w) && w.overlaps(o)) {
            return Err(SsmError::new_err(format!(
                "`{}` overlaps `{}` in memory; an array the op writes must not share memory with another argument",
                w.name, o.name
            )));
        }
    }
    Ok(())
}

fn op_err(e: ssm_dispatch::Error) -> PyErr {
    SsmError::new_err(e.to_string())
}

/// `selective_state_update` (vLLM's signature; see the Python wrapper): `state` and `out`
/// written in place.
#[pyfunction]
#[pyo3(signature = (state, x, dt, a, b, c, out, d=None, dt_bias=None, z=None, dt_softplus=false,
    state_batch_indices=None, dst_state_batch_indices=None, pad_slot_id=None, num_accepted_tokens=None,
    cu_seqlens=None))]
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
) -> PyResult<()> {
    let rt = runtime()?;
    let req = [
        array("state", state)?,
        array("x", x)?,
        array("dt", dt)?,
        array("A", a)?,
        array("B", b)?,
        array("C", c)?,
        array("out", out)?,
    ];
    let opt = [
        opt_array("D", d)?,
        opt_array("dt_bias", dt_bias)?,
        opt_array("z", z)?,
        opt_array("state_batch_indices", state_batch_indices)?,
        opt_array("dst_state_batch_indices", dst_state_batch_indices)?,
        opt_array("num_accepted_tokens", num_accepted_tokens)?,
        opt_array("cu_seqlens", cu_seqlens)?,
    ];
    let all: Vec<&Array> = req.iter().chain(opt.iter().flatten()).collect();
    checked_disjoint(&[&req[0], &req[6]], &all)?;
    // SAFETY: the arrays are borrowed from Python objects alive for this call (the arguments),
    // the GIL is held throughout (no Python code runs meanwhile), and the written arrays were
    // checked not to overlap any other argument.
    let args = unsafe {
        let v = |o: &Option<Array>| o.as_ref().map(|a| a.view()).transpose();
        SelectiveStateUpdateArgs {
            state: req[0].view_mut()?,
            x: req[1].view()?,
            dt: req[2].view()?,
            a: req[3].view()?,
            b: req[4].view()?,
            c: req[5].view()?,
            d: v(&opt[0])?,
            dt_bias: v(&opt[1])?,
            z: v(&opt[2])?,
            dt_softplus,
            state_batch_indices: v(&opt[3])?,
            dst_state_batch_indices: v(&opt[4])?,
            pad_slot_id,
            out: req[6].view_mut()?,
            num_accepted_tokens: v(&opt[5])?,
            cu_seqlens: v(&opt[6])?,
            stochastic_rounding: None,
        }
    };
    rt.selective_state_update(args).map_err(op_err)
}

/// `causal_conv1d_update` on `x` `[batch, dim]`, `[batch, seqlen, dim]` (token-major) or packed
/// `[tokens, dim]`, with a `[slots, dim, state_len]` pool: `conv_state` and `out` written in place.
#[pyfunction]
#[pyo3(signature = (x, conv_state, weight, out, bias=None, silu=false, conv_state_indices=None,
    num_accepted_tokens=None, query_start_loc=None, pad_slot_id=None))]
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
) -> PyResult<()> {
    let rt = runtime()?;
    let req = [array("x", x)?, array("conv_state", conv_state)?, array("weight", weight)?, array("out", out)?];
    let opt = [
        opt_array("bias", bias)?,
        opt_array("conv_state_indices", conv_state_indices)?,
        opt_array("num_accepted_tokens", num_accepted_tokens)?,
        opt_array("query_start_loc", query_start_loc)?,
    ];
    let all: Vec<&Array> = req.iter().chain(opt.iter().flatten()).collect();
    checked_disjoint(&[&req[1], &req[3]], &all)?;
    // SAFETY: as in `selective_state_update`.
    let args = unsafe {
        let v = |o: &Option<Array>| o.as_ref().map(|a| a.view()).transpose();
        CausalConv1dUpdateArgs {
            x: req[0].view()?,
            conv_state: req[1].view_mut()?,
            conv_state_layout: ConvStateLayout::DimStateLen,
            weight: req[2].view()?,
            bias: v(&opt[0])?,
            activation: if silu { Activation::Silu } else { Activation::None },
            conv_state_indices: v(&opt[1])?,
            num_accepted_tokens: v(&opt[2])?,
            query_start_loc: v(&opt[3])?,
            pad_slot_id,
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out: req[3].view_mut()?,
        }
    };
    rt.causal_conv1d_update(args).map_err(op_err)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("SsmError", m.py().get_type::<SsmError>())?;
    m.add_function(wrap_pyfunction!(selective_state_update, m)?)?;
    m.add_function(wrap_pyfunction!(causal_conv1d_update, m)?)?;
    Ok(())
}
