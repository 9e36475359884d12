//! [`DeviceBuffer`]: an owned device allocation on a backend's stream, with bounds-checked
//! views. Allocated stream-ordered (`cuMemAllocAsync` where the driver has it) and freed the
//! same way when dropped; `upload` and `download` wait for the stream (tests and tools only).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use ssm_tensor::{DType, TensorError, TensorMut, TensorRef};

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
