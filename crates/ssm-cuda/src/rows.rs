//! `impl Run<CopyRowsArgs>` for [`CudaBackend`]: one launch of `copy_rows` (kernels/copy.cu),
//! the layer cores' gather and scatter of token rows through a device index list. The kernel
//! checks every index value (out of range: the row is skipped, [`crate::DeviceErrors::ROW`]).

use bytemuck::{Pod, Zeroable};
use cudarc::driver::DeviceRepr;
use ssm_tensor::{CopyRowsArgs, DType, Planned, RowDirection, Run};

use crate::compile::{KernelSource, KernelSpec};
use crate::geometry::grid_x;
use crate::{CudaBackend, CudaError, addr_of};

/// `struct CopyRowsParams` in copy.cu: same order, no padding.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, Pod, Zeroable)]
struct CopyRowsParams {
    src: u64,
    dst: u64,
    index: u64,
    err: u64,
    src_pitch: i64,
    dst_pitch: i64,
    index_stride: i64,
    n: u64,
    width: u64,
    rows: u64,
    index_i64: i32,
    scatter: i32,
}

// SAFETY: plain-old-data with the C layout of the kernel's parameter struct.
unsafe impl DeviceRepr for CopyRowsParams {}

/// The access widths the kernel is built for (bytes), widest first.
const VECS: [usize; 5] = [16, 8, 4, 2, 1];

/// The `copy_rows` specialisation moving `vec` bytes per access.
pub fn copy_rows_spec(vec: usize) -> KernelSpec {
    KernelSpec { source: KernelSource::Copy, entry: "copy_rows", defines: vec![("VEC", vec.to_string())] }
}

/// The catalogue `cargo xtask build-kernels` compiles: every access width.
pub fn rows_catalogue() -> Vec<(String, KernelSpec)> {
    VECS.iter().map(|&v| (format!("copy_rows vec {v}"), copy_rows_spec(v))).collect()
}

/// The widest access that divides every byte quantity the kernel adds to an address.
fn access_width(quantities: &[u64]) -> usize {
    VECS.into_iter().find(|&v| quantities.iter().all(|q| q % v as u64 == 0)).unwrap_or(1)
}

impl Run<CopyRowsArgs<'_>> for CudaBackend {
    type Error = CudaError;

    /// One launch on the backend's stream, no allocation, no host synchronisation. Every
    /// tensor must be a device view on this backend's device (the index list too).
    fn run(&self, call: Planned<CopyRowsArgs<'_>>) -> Result<(), CudaError> {
        self.expect_device(&call)?;
        let (args, plan) = call.into_parts();
        if plan.n == 0 || plan.width == 0 {
            return Ok(());
        }
        let (dtype, es) = (args.src.dtype(), args.src.dtype().size() as i64);
        let src = addr_of(args.src.device_addr(), plan.offsets[0] as isize, dtype);
        let dst = addr_of(args.dst.as_ref().device_addr(), plan.offsets[1] as isize, dtype);
        let index = addr_of(args.index.device_addr(), args.index.layout().offset() as isize, args.index.dtype());
        let [src_pitch, dst_pitch] = plan.row_strides.map(|s| s as i64 * es);
        let width = plan.width as u64 * es as u64;
        let vec = access_width(&[src, dst, width, src_pitch.unsigned_abs(), dst_pitch.unsigned_abs()]);
        let addressed = match plan.direction {
            RowDirection::Gather => plan.rows[0],
            RowDirection::Scatter => plan.rows[1],
        };
        let params = CopyRowsParams {
            src,
            dst,
            index,
            err: self.error_word_addr(),
            src_pitch,
            dst_pitch,
            index_stride: args.index.strides()[0] as i64,
            n: plan.n as u64,
            width,
            rows: addressed as u64,
            index_i64: i32::from(args.index.dtype() == DType::I64),
            scatter: i32::from(plan.direction == RowDirection::Scatter),
        };
        // Enough blocks to fill the device; each loops over its rows.
        let Some(grid) = grid_x(plan.n.min(self.sm_count() * 16))? else { return Ok(()) };
        let func = self.function(&copy_rows_spec(vec))?;
        // SAFETY: the addresses come from device views whose creators promised them valid for
        // the views' memory (TensorRef/TensorMut::from_device_ptr); the plan checked that every
        // row `[0, rows)` of both tensors and entries `[0, n)` of the index list lie inside those
        // views, and the kernel checks each index value against the addressed tensor's rows
        // before using it. The error word is owned by `self`.
        unsafe { self.launch_kernel(&func, (grid, 1, 1), 256, &params, "cuLaunchKernel(copy_rows)") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_width_divides_every_quantity() {
        assert_eq!(access_width(&[0x1000, 0x2000, 256, 512]), 16);
        assert_eq!(access_width(&[0x1008, 0x2000, 256, 512]), 8);
        assert_eq!(access_width(&[0x1000, 0x2000, 6, 512]), 2);
        assert_eq!(access_width(&[0x1001, 0x2000, 256, 512]), 1);
        assert_eq!(rows_catalogue().len(), VECS.len());
    }
}
