use std::marker::PhantomData;

use crate::{DType, Element, Layout, TensorError};

/// Where a tensor's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// Memory of the CUDA device with this ordinal.
    Cuda(u32),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

// Host memory is held as a pointer and a length borrowed for `'a` (not as a slice), so that
// [`TensorMut::aliased`] can hand out several views of one buffer without two live Rust
// references to it: a slice is made only for the duration of one access (`host_bytes`,
// `host_bytes_mut`, …).
#[derive(Clone, Copy)]
enum RefData<'a> {
    Host { ptr: *const u8, len: usize, _life: PhantomData<&'a [u8]> },
    Device { addr: u64, len: usize, _life: PhantomData<&'a ()> },
}

enum MutData<'a> {
    Host { ptr: *mut u8, len: usize, _life: PhantomData<&'a mut [u8]> },
    Device { addr: u64, len: usize, _life: PhantomData<&'a mut ()> },
}

impl<'a> RefData<'a> {
    fn host(data: &'a [u8]) -> Self {
        RefData::Host { ptr: data.as_ptr(), len: data.len(), _life: PhantomData }
    }
}

impl<'a> MutData<'a> {
    fn host(data: &'a mut [u8]) -> Self {
        MutData::Host { ptr: data.as_mut_ptr(), len: data.len(), _life: PhantomData }
    }
}

// SAFETY: a view is a borrowed `&[u8]`/`&mut [u8]` (or a device address, which is plain data)
// held as a pointer; it is `Send`/`Sync` exactly as those references are. Aliased writable
// views exist only through `TensorMut::aliased`, whose contract forbids concurrent use.
unsafe impl Send for TensorRef<'_> {}
// SAFETY: as for `Send`: shared access to a `TensorRef` only reads.
unsafe impl Sync for TensorRef<'_> {}
// SAFETY: as for `TensorRef`; a `TensorMut` is the unique writer of its memory unless made by
// `TensorMut::aliased`, whose caller promises the aliases are never used concurrently.
unsafe impl Send for TensorMut<'_> {}
// SAFETY: `&TensorMut` only reads (`as_ref`, accessors); writing needs `&mut`.
unsafe impl Sync for TensorMut<'_> {}

/// A read-only borrowed view.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    data: RefData<'a>,
    dtype: DType,
    device: Device,
    layout: Layout,
}

/// A writable borrowed view. Ops that update state in place take one of these.
pub struct TensorMut<'a> {
    data: MutData<'a>,
    dtype: DType,
    device: Device,
    layout: Layout,
}

fn check_bytes(bytes: &[u8], dtype: DType) -> Result<usize, TensorError> {
    let align = (bytes.as_ptr() as usize & 15).trailing_zeros().min(4);
    let align = 1usize << align;
    if !bytes.len().is_multiple_of(dtype.size()) || align < dtype.size().min(16) {
        return Err(TensorError::BadBytes { len: bytes.len(), align, dtype });
    }
    Ok(bytes.len() / dtype.size())
}

/// What [`TensorRef`] and [`TensorMut`] share, written once: the accessors, the device
/// constructor, re-layout, the memory length and the device address. `$access` completes the
/// device constructor's safety contract.
macro_rules! common_accessors {
    ($View:ident, $Data:ident, $access:literal) => {
        /// A view of device memory.
        ///
        /// # Safety
        /// `addr` must be the address of at least `len` elements of `dtype` on `device`, valid
        #[doc = $access]
        pub unsafe fn from_device_ptr(
            addr: u64,
            len: usize,
            dtype: DType,
            device: Device,
            shape: &[usize],
            strides: &[isize],
        ) -> Result<Self, TensorError> {
            let layout = Layout::new(shape, strides, 0)?;
            layout.check_bounds(len)?;
            Ok($View { data: $Data::Device { addr, len, _life: PhantomData }, dtype, device, layout })
        }
        /// The same memory seen through another shape, strides and element offset (bounds-checked).
        pub fn with_layout(self, shape: &[usize], strides: &[isize], offset: usize) -> Result<Self, TensorError> {
            let layout = Layout::new(shape, strides, offset)?;
            layout.check_bounds(self.memory_len())?;
            Ok($View { layout, ..self })
        }
        /// Elements in the borrowed memory (not the logical size).
        pub fn memory_len(&self) -> usize {
            match self.data {
                $Data::Host { len, .. } => len / self.dtype.size(),
                $Data::Device { len, .. } => len,
            }
        }
        /// Device base address (of memory element 0, before the layout offset), or `None` for a
        /// host view.
        pub fn device_addr(&self) -> Option<u64> {
            match self.data {
                $Data::Host { .. } => None,
                $Data::Device { addr, .. } => Some(addr),
            }
        }
        /// Element type.
        pub fn dtype(&self) -> DType {
            self.dtype
        }
        /// Where the memory lives.
        pub fn device(&self) -> Device {
            self.device
        }
        /// Shape, strides and offset.
        pub fn layout(&self) -> &Layout {
            &self.layout
        }
        /// Extent of each dimension.
        pub fn shape(&self) -> &[usize] {
            self.layout.shape()
        }
        /// Stride of each dimension in elements (0 = broadcast).
        pub fn strides(&self) -> &[isize] {
            self.layout.strides()
        }
        /// Number of dimensions.
        pub fn rank(&self) -> usize {
            self.layout.rank()
        }
        /// Number of logical elements.
        pub fn numel(&self) -> usize {
            self.layout.numel()
        }
        /// Whether the view is row-major contiguous.
        pub fn is_contiguous(&self) -> bool {
            self.layout.is_contiguous()
        }
    };
}

impl<'a> TensorRef<'a> {
    /// A contiguous host view of `data` with `shape`.
    pub fn from_slice<T: Element>(data: &'a [T], shape: &[usize]) -> Result<Self, TensorError> {
        let layout = Layout::contiguous(shape)?;
        layout.check_bounds(data.len())?;
        Ok(TensorRef { data: RefData::host(bytemuck::cast_slice(data)), dtype: T::DTYPE, device: Device::Cpu, layout })
    }

    /// A contiguous host view of raw bytes; they must be aligned for `dtype`.
    pub fn from_bytes(data: &'a [u8], dtype: DType, shape: &[usize]) -> Result<Self, TensorError> {
        let len = check_bytes(data, dtype)?;
        let layout = Layout::contiguous(shape)?;
        layout.check_bounds(len)?;
        Ok(TensorRef { data: RefData::host(data), dtype, device: Device::Cpu, layout })
    }

    /// The same memory with new strides (bounds-checked).
    pub fn with_strides(self, strides: &[isize]) -> Result<Self, TensorError> {
        let layout = self.layout;
        self.with_layout(layout.shape(), strides, layout.offset())
    }

    /// Broadcasts size-1 dimensions to `shape` with stride 0 (like `torch.expand`).
    pub fn expand(self, shape: &[usize]) -> Result<Self, TensorError> {
        if shape.len() != self.rank() {
            return Err(TensorError::StrideRank { shape: shape.len(), strides: self.rank() });
        }
        let mut strides = [0isize; crate::MAX_RANK];
        for (d, (&want, &have)) in shape.iter().zip(self.shape()).enumerate() {
            strides[d] = if want == have {
                self.strides()[d]
            } else if have == 1 {
                0
            } else {
                return Err(TensorError::OutOfBounds {
                    reach: want as i128,
                    offset: self.layout.offset(),
                    shape: self.shape().to_vec(),
                    strides: self.strides().to_vec(),
                    len: have,
                });
            };
        }
        self.with_layout(shape, &strides[..shape.len()], self.layout.offset())
    }

    /// The whole borrowed host memory, typed. Index it with [`Layout::index`].
    pub fn host_data<T: Element>(&self) -> Result<&'a [T], TensorError> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DType { expected: T::DTYPE, actual: self.dtype });
        }
        match self.host_bytes() {
            Some(b) => Ok(bytemuck::cast_slice(b)),
            None => Err(TensorError::NotHost(self.device)),
        }
    }

    /// The raw host bytes, or `None` for a device view.
    pub fn host_bytes(&self) -> Option<&'a [u8]> {
        match self.data {
            // SAFETY: `ptr`/`len` come from a `&'a [u8]` (or `&'a mut [u8]`) borrowed for `'a`;
            // no other path writes it while this view is in use (`TensorMut::aliased`'s contract).
            RefData::Host { ptr, len, .. } => Some(unsafe { std::slice::from_raw_parts(ptr, len) }),
            RefData::Device { .. } => None,
        }
    }

    /// Reads one element as `f64` (floats) — a slow path for validation and tests.
    pub fn get_f64(&self, idx: &[usize]) -> Result<f64, TensorError> {
        let bytes = self.host_bytes().ok_or(TensorError::NotHost(self.device))?;
        Ok(crate::elem::read_f64(bytes, self.dtype, self.layout.index(idx)))
    }

    /// Reads one element as `i64` (integers and bool) — a slow path for validation and tests.
    pub fn get_i64(&self, idx: &[usize]) -> Result<i64, TensorError> {
        let bytes = self.host_bytes().ok_or(TensorError::NotHost(self.device))?;
        Ok(crate::elem::read_i64(bytes, self.dtype, self.layout.index(idx)))
    }

    /// Gathers the logical elements in row-major order as `f32` (host only; tests and tools).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, TensorError> {
        let bytes = self.host_bytes().ok_or(TensorError::NotHost(self.device))?;
        let mut out = Vec::with_capacity(self.numel());
        for_each_index(self.shape(), |idx| {
            out.push(crate::elem::read_f64(bytes, self.dtype, self.layout.index(idx)) as f32)
        });
        Ok(out)
    }

    common_accessors!(TensorRef, RefData, "and not written through another path for the lifetime `'a`.");
}

impl<'a> TensorMut<'a> {
    /// A contiguous writable host view of `data` with `shape`.
    pub fn from_slice<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<Self, TensorError> {
        let layout = Layout::contiguous(shape)?;
        layout.check_bounds(data.len())?;
        Ok(TensorMut {
            data: MutData::host(bytemuck::cast_slice_mut(data)),
            dtype: T::DTYPE,
            device: Device::Cpu,
            layout,
        })
    }

    /// A contiguous writable host view of raw bytes; they must be aligned for `dtype`.
    pub fn from_bytes(data: &'a mut [u8], dtype: DType, shape: &[usize]) -> Result<Self, TensorError> {
        let len = check_bytes(data, dtype)?;
        let layout = Layout::contiguous(shape)?;
        layout.check_bounds(len)?;
        Ok(TensorMut { data: MutData::host(data), dtype, device: Device::Cpu, layout })
    }

    /// A read-only view of the same memory.
    pub fn as_ref(&self) -> TensorRef<'_> {
        let data = match self.data {
            MutData::Host { ptr, len, .. } => RefData::Host { ptr, len, _life: PhantomData },
            MutData::Device { addr, len, .. } => RefData::Device { addr, len, _life: PhantomData },
        };
        TensorRef { data, dtype: self.dtype, device: self.device, layout: self.layout }
    }

    /// A shorter-lived writable view of the same memory.
    pub fn reborrow(&mut self) -> TensorMut<'_> {
        let data = match self.data {
            MutData::Host { ptr, len, .. } => MutData::Host { ptr, len, _life: PhantomData },
            MutData::Device { addr, len, .. } => MutData::Device { addr, len, _life: PhantomData },
        };
        TensorMut { data, dtype: self.dtype, device: self.device, layout: self.layout }
    }

    /// Turns the writable view into a read-only one of the same memory and lifetime.
    pub fn into_ref(self) -> TensorRef<'a> {
        let data = match self.data {
            MutData::Host { ptr, len, .. } => RefData::Host { ptr, len, _life: PhantomData },
            MutData::Device { addr, len, .. } => RefData::Device { addr, len, _life: PhantomData },
        };
        TensorRef { data, dtype: self.dtype, device: self.device, layout: self.layout }
    }

    /// `N` writable views of this view's memory, with its layout, for calls that are planned
    /// together and run one after another (a layer core plans every op before it runs any, and
    /// several of its ops write the same state pool or hand a buffer from one op to the next).
    /// Each may be re-shaped ([`TensorMut::with_layout`]) or turned read-only
    /// ([`TensorMut::into_ref`]). The original view is consumed, so only the aliases remain.
    ///
    /// # Safety
    /// Until every view made from the result is dropped, accesses through different aliases
    /// must never overlap in time: each access (a host slice from `host_bytes`/`host_data`/…
    /// and its uses, a backend's run of a planned call holding the view, or, on a device, the
    /// kernels enqueued on one stream) is finished before an access through another alias
    /// begins. Host slices obtained through one alias must not be kept past that access.
    pub unsafe fn aliased<const N: usize>(self) -> [TensorMut<'a>; N] {
        std::array::from_fn(|_| {
            let data = match self.data {
                MutData::Host { ptr, len, .. } => MutData::Host { ptr, len, _life: PhantomData },
                MutData::Device { addr, len, .. } => MutData::Device { addr, len, _life: PhantomData },
            };
            TensorMut { data, dtype: self.dtype, device: self.device, layout: self.layout }
        })
    }

    /// The whole borrowed host memory, typed and writable. Index it with [`Layout::index`].
    pub fn host_data_mut<T: Element>(&mut self) -> Result<&mut [T], TensorError> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DType { expected: T::DTYPE, actual: self.dtype });
        }
        let device = self.device;
        match self.host_bytes_mut() {
            Some(b) => Ok(bytemuck::cast_slice_mut(b)),
            None => Err(TensorError::NotHost(device)),
        }
    }

    /// The raw writable host bytes, or `None` for a device view.
    pub fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self.data {
            // SAFETY: `ptr`/`len` come from a `&'a mut [u8]` borrowed for `'a`; `&mut self` makes
            // this the only access through this view, and `TensorMut::aliased`'s contract keeps
            // every alias idle while it lasts.
            MutData::Host { ptr, len, .. } => Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) }),
            MutData::Device { .. } => None,
        }
    }

    common_accessors!(TensorMut, MutData, "and not accessed through another path for the lifetime `'a`.");
}

/// Calls `f` with every multi-index of `shape` in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = [0usize; crate::MAX_RANK];
    let rank = shape.len();
    loop {
        f(&idx[..rank]);
        let mut d = rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_views_are_bounds_checked() {
        let data = vec![1.0f32; 12];
        let t = TensorRef::from_slice(&data, &[3, 4]).unwrap();
        assert_eq!(t.shape(), &[3, 4]);
        assert!(TensorRef::from_slice(&data, &[4, 4]).is_err());
        assert!(t.with_layout(&[3, 4], &[4, 1], 1).is_err());
        let col = t.with_layout(&[3], &[4], 1).unwrap();
        assert_eq!(col.to_f32_vec().unwrap(), vec![1.0; 3]);
    }

    #[test]
    fn expand_makes_stride_zero() {
        let a = [1.0f32, 2.0];
        let t = TensorRef::from_slice(&a, &[2, 1, 1]).unwrap().expand(&[2, 3, 4]).unwrap();
        assert_eq!(t.strides(), &[1, 0, 0]);
        assert_eq!(t.get_f64(&[1, 2, 3]).unwrap(), 2.0);
        assert!(TensorRef::from_slice(&a, &[2, 1]).unwrap().expand(&[3, 1]).is_err());
    }

    #[test]
    fn typed_access_checks_dtype_and_device() {
        let mut v = vec![0i32; 4];
        let mut t = TensorMut::from_slice(&mut v, &[4]).unwrap();
        assert!(t.host_data_mut::<i64>().is_err());
        t.host_data_mut::<i32>().unwrap()[2] = 7;
        assert_eq!(t.as_ref().get_i64(&[2]).unwrap(), 7);
        // SAFETY: the view is never dereferenced on the host; only its metadata is read.
        let d =
            unsafe { TensorRef::from_device_ptr(0x1000, 8, DType::F32, Device::Cuda(0), &[2, 4], &[4, 1]) }.unwrap();
        assert_eq!(d.host_data::<f32>().unwrap_err(), TensorError::NotHost(Device::Cuda(0)));
    }

    #[test]
    fn misaligned_bytes_are_refused() {
        let v = vec![0u32; 4];
        let bytes: &[u8] = bytemuck::cast_slice(&v);
        assert!(TensorRef::from_bytes(&bytes[1..5], DType::F32, &[1]).is_err());
        assert!(TensorRef::from_bytes(&bytes[4..8], DType::F32, &[1]).is_ok());
    }
}
