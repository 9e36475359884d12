//! Scalar element access by dtype: the one place that turns stored bytes of any [`DType`]
//! into `f32`/`f64`/`i64` and back. Indices are element indices into the whole borrowed
//! memory (what [`crate::Strided::at`] and [`crate::Layout::index`] return). SIMD kernels
//! have their own lane loads; everything scalar (plans, references, tests, comparisons)
//! reads and writes through here.

use half::{bf16, f16};

use crate::{DType, TensorMut, TensorRef};

#[inline(always)]
fn le<const N: usize>(bytes: &[u8], i: usize) -> [u8; N] {
    bytes[i * N..i * N + N].try_into().unwrap()
}

/// Element `i` of a `dtype` buffer as `f64`: floats widen exactly, integers and bools convert.
///
/// # Panics
/// If element `i` lies outside `bytes`.
#[inline]
pub fn read_f64(bytes: &[u8], dtype: DType, i: usize) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes(le(bytes, i)) as f64,
        DType::F16 => f16::from_le_bytes(le(bytes, i)).to_f64(),
        DType::BF16 => bf16::from_le_bytes(le(bytes, i)).to_f64(),
        DType::I16 => i16::from_le_bytes(le(bytes, i)) as f64,
        DType::I8 => bytes[i] as i8 as f64,
        DType::I32 => i32::from_le_bytes(le(bytes, i)) as f64,
        DType::I64 => i64::from_le_bytes(le(bytes, i)) as f64,
        DType::Bool => bytes[i] as f64,
    }
}

/// Element `i` of a `dtype` buffer as `f32`: floats widen exactly, integers and bools convert
/// (rounded to nearest for integers beyond 2^24).
///
/// # Panics
/// If element `i` lies outside `bytes`.
#[inline(always)]
pub fn read_f32(bytes: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(le(bytes, i)),
        DType::F16 => f16::from_le_bytes(le(bytes, i)).to_f32(),
        DType::BF16 => bf16::from_le_bytes(le(bytes, i)).to_f32(),
        DType::I16 | DType::I8 | DType::I32 | DType::I64 | DType::Bool => read_i64(bytes, dtype, i) as f32,
    }
}

/// Element `i` of a `dtype` buffer as `i64`: integers exactly, bools as 0/1, floats truncated
/// toward zero.
///
/// # Panics
/// If element `i` lies outside `bytes`.
#[inline(always)]
pub fn read_i64(bytes: &[u8], dtype: DType, i: usize) -> i64 {
    match dtype {
        DType::I16 => i16::from_le_bytes(le(bytes, i)) as i64,
        DType::I8 => bytes[i] as i8 as i64,
        DType::I32 => i32::from_le_bytes(le(bytes, i)) as i64,
        DType::I64 => i64::from_le_bytes(le(bytes, i)),
        DType::Bool => bytes[i] as i64,
        DType::F32 | DType::F16 | DType::BF16 => read_f64(bytes, dtype, i) as i64,
    }
}

/// Writes `v` as element `i` of a float buffer, rounded to nearest even for f16 and bf16.
/// Integer and bool buffers take `v` truncated toward zero.
///
/// # Panics
/// If element `i` lies outside `bytes`.
#[inline(always)]
pub fn write_f32(bytes: &mut [u8], dtype: DType, i: usize, v: f32) {
    match dtype {
        DType::F32 => bytes[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => bytes[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
        DType::BF16 => bytes[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
        DType::I16 | DType::I8 | DType::I32 | DType::I64 | DType::Bool => write_i64(bytes, dtype, i, v as i64),
    }
}

/// Writes `v` as element `i` of a float buffer, rounded once from f64 to the dtype (nearest
/// even; f16 and bf16 are rounded directly, not through f32). Integer and bool buffers take
/// `v` truncated toward zero.
///
/// # Panics
/// If element `i` lies outside `bytes`.
#[inline]
pub fn write_f64(bytes: &mut [u8], dtype: DType, i: usize, v: f64) {
    match dtype {
        DType::F32 => bytes[i * 4..i * 4 + 4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F16 => bytes[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        DType::BF16 => bytes[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        DType::I16 | DType::I8 | DType::I32 | DType::I64 | DType::Bool => write_i64(bytes, dtype, i, v as i64),
    }
}

/// Writes `v` as element `i` of an integer buffer (wrapping to i8 / i16 / i32 for `I8` / `I16` / `I32`, `v != 0` for
/// `Bool`). Float buffers take `v` converted.
///
/// # Panics
/// If element `i` lies outside `bytes`.
#[inline]
pub fn write_i64(bytes: &mut [u8], dtype: DType, i: usize, v: i64) {
    match dtype {
        DType::I16 => bytes[i * 2..i * 2 + 2].copy_from_slice(&(v as i16).to_le_bytes()),
        DType::I8 => bytes[i] = v as i8 as u8,
        DType::I32 => bytes[i * 4..i * 4 + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => bytes[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes()),
        DType::Bool => bytes[i] = (v != 0) as u8,
        DType::F32 | DType::F16 | DType::BF16 => write_f64(bytes, dtype, i, v as f64),
    }
}

impl TensorRef<'_> {
    fn host_elems(&self) -> &[u8] {
        self.host_bytes().expect("element access needs a host view (plans check devices first)")
    }

    /// Element `i` of the borrowed memory (an index from [`crate::Strided::at`] or
    /// [`crate::Layout::index`]) as `f32`, as [`read_f32`] converts it.
    ///
    /// # Panics
    /// On a device view, or if `i` lies outside the memory.
    #[inline]
    pub fn elem_f32(&self, i: usize) -> f32 {
        read_f32(self.host_elems(), self.dtype(), i)
    }

    /// Element `i` of the borrowed memory as `f64`, as [`read_f64`] converts it.
    ///
    /// # Panics
    /// On a device view, or if `i` lies outside the memory.
    #[inline]
    pub fn elem_f64(&self, i: usize) -> f64 {
        read_f64(self.host_elems(), self.dtype(), i)
    }

    /// Element `i` of the borrowed memory as `i64`, as [`read_i64`] converts it.
    ///
    /// # Panics
    /// On a device view, or if `i` lies outside the memory.
    #[inline]
    pub fn elem_i64(&self, i: usize) -> i64 {
        read_i64(self.host_elems(), self.dtype(), i)
    }
}

impl TensorMut<'_> {
    fn host_elems_mut(&mut self) -> (&mut [u8], DType) {
        let dtype = self.dtype();
        (self.host_bytes_mut().expect("element access needs a host view (plans check devices first)"), dtype)
    }

    /// Writes `v` to element `i` of the borrowed memory, rounded to the dtype as
    /// [`write_f32`] does. Touches nothing else.
    ///
    /// # Panics
    /// On a device view, or if `i` lies outside the memory.
    #[inline]
    pub fn set_f32(&mut self, i: usize, v: f32) {
        let (b, d) = self.host_elems_mut();
        write_f32(b, d, i, v)
    }

    /// Writes `v` to element `i`, rounded once to the dtype as [`write_f64`] does.
    ///
    /// # Panics
    /// On a device view, or if `i` lies outside the memory.
    #[inline]
    pub fn set_f64(&mut self, i: usize, v: f64) {
        let (b, d) = self.host_elems_mut();
        write_f64(b, d, i, v)
    }

    /// Writes `v` to element `i` as [`write_i64`] does.
    ///
    /// # Panics
    /// On a device view, or if `i` lies outside the memory.
    #[inline]
    pub fn set_i64(&mut self, i: usize, v: i64) {
        let (b, d) = self.host_elems_mut();
        write_i64(b, d, i, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::I16, DType::I8, DType::I32, DType::I64, DType::Bool] {
            let mut b = vec![0u8; 3 * dtype.size()];
            write_f32(&mut b, dtype, 2, 1.0);
            assert_eq!(read_f32(&b, dtype, 2), 1.0, "{dtype}");
            assert_eq!(read_f64(&b, dtype, 2), 1.0, "{dtype}");
            assert_eq!(read_i64(&b, dtype, 2), 1, "{dtype}");
            assert_eq!(read_i64(&b, dtype, 1), 0, "{dtype}");
        }
    }

    #[test]
    fn writes_round_to_nearest_even() {
        let mut b = vec![0u8; 2];
        // 1 + 2^-8 is halfway between two bf16 values; ties go to the even one (1.0).
        write_f32(&mut b, DType::BF16, 0, 1.0 + 1.0 / 256.0);
        assert_eq!(read_f32(&b, DType::BF16, 0), 1.0);
        write_f64(&mut b, DType::F16, 0, 1.0 + 1.0 / 4096.0);
        assert_eq!(read_f64(&b, DType::F16, 0), 1.0);
    }
}
