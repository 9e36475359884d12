//! Host-memory helpers shared by the CPU kernels: the host bytes of an argument (or
//! [`CpuError::NotHost`]), scalar element access through `ssm_tensor::elem`, and the scalar
//! write of one element into memory that work items share.

use ssm_tensor::{DType, TensorMut, TensorRef};

use crate::shared::SharedBuf;
use crate::{CpuError, require_host};

/// Element `i` of a buffer of any dtype, widened to f32 (`ssm_tensor::elem::read_f32`).
pub(crate) use ssm_tensor::elem::read_f32 as rd;
/// Element `i` of an index buffer (`ssm_tensor::elem::read_i64`).
pub(crate) use ssm_tensor::elem::read_i64 as rd_int;

/// The bytes of a host tensor, or [`CpuError::NotHost`] naming `arg`.
pub(crate) fn host_ref<'a>(arg: &'static str, t: &TensorRef<'a>) -> Result<&'a [u8], CpuError> {
    t.host_bytes().ok_or(CpuError::NotHost { arg, device: t.device() })
}

/// The bytes and dtype of an optional host tensor.
pub(crate) fn host_opt<'a>(
    arg: &'static str,
    t: &Option<TensorRef<'a>>,
) -> Result<Option<(&'a [u8], DType)>, CpuError> {
    t.as_ref().map(|t| Ok((host_ref(arg, t)?, t.dtype()))).transpose()
}

/// The bytes of a written host tensor, shared between work items.
pub(crate) fn host_shared(arg: &'static str, t: &mut TensorMut<'_>) -> Result<SharedBuf<u8>, CpuError> {
    let device = t.device();
    require_host(arg, device)?;
    Ok(SharedBuf::new(t.host_bytes_mut().ok_or(CpuError::NotHost { arg, device })?))
}

/// The host bytes of the inputs every Mamba op reads: `x`, `dt`, `A`, `B`, `C`.
pub(crate) struct MambaInputs<'a> {
    pub(crate) x: &'a [u8],
    pub(crate) dt: &'a [u8],
    pub(crate) a: &'a [u8],
    pub(crate) b: &'a [u8],
    pub(crate) c: &'a [u8],
}

impl<'a> MambaInputs<'a> {
    /// The bytes of `[x, dt, A, B, C]`, or [`CpuError::NotHost`] naming the first that is not host memory.
    pub(crate) fn new([x, dt, a, b, c]: [&TensorRef<'a>; 5]) -> Result<Self, CpuError> {
        Ok(MambaInputs {
            x: host_ref("x", x)?,
            dt: host_ref("dt", dt)?,
            a: host_ref("A", a)?,
            b: host_ref("B", b)?,
            c: host_ref("C", c)?,
        })
    }
}

/// Writes `v` (rounded to nearest even) as element `i` of a `dtype` buffer.
///
/// # Safety
/// Element `i` of `dtype` must lie in `dst` and be accessed by no other thread now.
#[inline(always)]
pub(crate) unsafe fn wr(dst: SharedBuf<u8>, dtype: DType, i: usize, v: f32) {
    let size = dtype.size();
    // SAFETY: the element is in bounds (caller's contract; checked in debug builds) and exclusive.
    let bytes = unsafe { std::slice::from_raw_parts_mut(dst.elems::<u8>(i * size, size), size) };
    ssm_tensor::elem::write_f32(bytes, dtype, 0, v);
}

/// Element `i` of a `dtype` buffer that work items share, widened to f32.
///
/// # Safety
/// Element `i` of `dtype` must lie in `src` and be written by no other thread now.
#[inline(always)]
pub(crate) unsafe fn rd_shared(src: SharedBuf<u8>, dtype: DType, i: usize) -> f32 {
    let size = dtype.size();
    // SAFETY: the element is in bounds (caller's contract; checked in debug builds) and not
    // written concurrently; the slice lives for this read only.
    let bytes = unsafe { std::slice::from_raw_parts(src.elems::<u8>(i * size, size), size) };
    ssm_tensor::elem::read_f32(bytes, dtype, 0)
}
