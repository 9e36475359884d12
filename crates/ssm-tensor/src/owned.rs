use crate::{DType, TensorError, TensorMut, TensorRef};

/// 64 bytes, 64-byte aligned: the storage unit of [`HostTensor`]. Buffers start on a cache
/// line, as a serving stack's allocator gives them (PyTorch aligns to 64), so kernels can use
/// aligned (streaming) stores on them.
#[derive(Clone, Copy, PartialEq, Debug)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: a plain byte array without padding (size 64 equals its alignment); every bit pattern
// is valid and zero is a valid value.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Line {}

/// An owned host tensor (64-byte aligned storage) that hands out views.
///
/// Its shape describes its bytes (checked when it is built: rank, element count, length), so
/// [`HostTensor::view`] and [`HostTensor::view_mut`] succeed unless `dtype` or `shape` were
/// later edited to no longer describe them (they panic then).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    words: Vec<Line>,
    len: usize,
}

impl HostTensor {
    /// A tensor from little-endian bytes, or the [`TensorError`] that a view of `shape`
    /// over them would meet (rank above [`crate::MAX_RANK`], an element count that overflows,
    /// fewer bytes than the shape needs, a length that is not a whole number of elements).
    pub fn try_from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Self, TensorError> {
        let mut words = vec![Line([0; 64]); bytes.len().div_ceil(64)];
        bytemuck::cast_slice_mut::<Line, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        let t = HostTensor { dtype, shape, words, len: bytes.len() };
        TensorRef::from_bytes(t.bytes(), t.dtype, &t.shape)?;
        Ok(t)
    }

    /// A tensor from little-endian bytes.
    ///
    /// # Panics
    /// Where [`HostTensor::try_from_bytes`] returns an error.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Self {
        Self::try_from_bytes(dtype, shape, bytes).unwrap_or_else(|e| panic!("HostTensor::from_bytes: {e}"))
    }

    /// Elements of `shape`.
    ///
    /// # Panics
    /// If `shape` has too many dimensions or its element count overflows.
    fn numel_of(shape: &[usize]) -> usize {
        crate::Layout::contiguous(shape).unwrap_or_else(|e| panic!("HostTensor of shape {shape:?}: {e}")).numel()
    }

    /// A tensor of `shape` filled with `value` (floats).
    ///
    /// # Panics
    /// If `shape` has too many dimensions or its element count overflows.
    pub fn filled(dtype: DType, shape: Vec<usize>, value: f32) -> Self {
        let n = Self::numel_of(&shape);
        let mut bytes = vec![0u8; n * dtype.size()];
        if dtype.is_float() {
            (0..n).for_each(|i| crate::elem::write_f32(&mut bytes, dtype, i, value));
        }
        Self::from_bytes(dtype, shape, &bytes)
    }

    /// A float tensor from f32 values, rounded to nearest even in `dtype` (F32, F16 or BF16).
    pub fn from_f32(dtype: DType, shape: Vec<usize>, values: &[f32]) -> Self {
        assert_eq!(values.len(), Self::numel_of(&shape), "values must fill the shape");
        assert!(dtype.is_float(), "from_f32 makes float tensors, not {dtype}");
        let mut bytes = vec![0u8; values.len() * dtype.size()];
        for (i, &v) in values.iter().enumerate() {
            crate::elem::write_f32(&mut bytes, dtype, i, v);
        }
        Self::from_bytes(dtype, shape, &bytes)
    }

    /// An integer tensor (I8, I16, I32 or I64; values wrap) from i64 values, or a Bool tensor
    /// (nonzero = true).
    pub fn from_i64(dtype: DType, shape: Vec<usize>, values: &[i64]) -> Self {
        assert_eq!(values.len(), Self::numel_of(&shape), "values must fill the shape");
        let bytes: Vec<u8> = match dtype {
            DType::I8 => values.iter().map(|&v| v as i8 as u8).collect(),
            DType::I16 => values.iter().flat_map(|&v| (v as i16).to_le_bytes()).collect(),
            DType::I32 => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
            DType::I64 => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
            DType::Bool => values.iter().map(|&v| u8::from(v != 0)).collect(),
            other => panic!("from_i64 makes index tensors, not {other}"),
        };
        Self::from_bytes(dtype, shape, &bytes)
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(&self.words)[..self.len]
    }

    /// The raw bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut::<Line, u8>(&mut self.words)[..len]
    }

    /// A contiguous read-only view.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef::from_bytes(self.bytes(), self.dtype, &self.shape).expect("a HostTensor's shape describes its bytes")
    }

    /// A contiguous writable view.
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        let (dtype, shape) = (self.dtype, self.shape.clone());
        TensorMut::from_bytes(self.bytes_mut(), dtype, &shape).expect("a HostTensor's shape describes its bytes")
    }

    /// `[.., a, b]` → `[.., b, a]` as a contiguous copy, element-exact (states handed over in
    /// the other layout, e.g. `[.., V, K]` → `[.., K, V]`).
    ///
    /// # Panics
    /// If the tensor has fewer than two dimensions.
    pub fn transpose_last2(&self) -> HostTensor {
        let n = self.shape.len();
        assert!(n >= 2, "transpose_last2 of a {n}-D tensor");
        let (a, b) = (self.shape[n - 2], self.shape[n - 1]);
        let es = self.dtype.size();
        let src = self.bytes();
        let mut shape = self.shape.clone();
        shape.swap(n - 2, n - 1);
        let mut dst = vec![0u8; src.len()];
        for m in 0..src.len() / (a * b * es).max(1) {
            let base = m * a * b * es;
            for i in 0..a {
                for j in 0..b {
                    let (s, d) = (base + (i * b + j) * es, base + (j * a + i) * es);
                    dst[d..d + es].copy_from_slice(&src[s..s + es]);
                }
            }
        }
        HostTensor::from_bytes(self.dtype, shape, &dst)
    }

    /// Elements as f64 (floats, ints and bools), row-major.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let b = self.bytes();
        let s = self.dtype.size();
        (0..self.len / s).map(|i| crate::elem::read_f64(b, self.dtype, i)).collect()
    }
}
