//! Host-memory helpers shared by the CPU kernels: typed reads and writes of plan-addressed
//! elements of any float or index dtype, and a pointer that work items share.

use half::{bf16, f16};
use ssm_tensor::DType;

/// A raw pointer that may cross threads. Each kernel writes through it only at elements its
/// plan assigns to exactly one work item at a time (the kernel's own `// SAFETY:` notes say
/// which), so sharing it is sound.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);
// SAFETY: see the type's doc: writes through it are disjoint between concurrent items.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

/// Element `i` of a float buffer, widened to f32.
#[inline(always)]
pub(crate) fn rd(bytes: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes(bytes[i * 2..i * 2 + 2].try_into().unwrap())).to_f32(),
        DType::F16 => f16::from_bits(u16::from_le_bytes(bytes[i * 2..i * 2 + 2].try_into().unwrap())).to_f32(),
        _ => unreachable!("plans admit float tensors only here"),
    }
}

/// Element `i` of an I32 or I64 buffer.
#[inline(always)]
pub(crate) fn rd_int(bytes: &[u8], dtype: DType, i: usize) -> i64 {
    match dtype {
        DType::I32 => i32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()) as i64,
        _ => i64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap()),
    }
}

/// Writes `v` (rounded to nearest even) as element `i` of a `dtype` buffer.
///
/// # Safety
/// `base` must point to a buffer holding element `i` of `dtype`, written by no other thread now.
#[inline(always)]
pub(crate) unsafe fn wr(base: *mut u8, dtype: DType, i: usize, v: f32) {
    // SAFETY: in bounds and exclusive by the caller's contract; unaligned writes.
    unsafe {
        match dtype {
            DType::F32 => (base.add(i * 4) as *mut f32).write_unaligned(v),
            DType::BF16 => (base.add(i * 2) as *mut u16).write_unaligned(bf16::from_f32(v).to_bits()),
            DType::F16 => (base.add(i * 2) as *mut u16).write_unaligned(f16::from_f32(v).to_bits()),
            _ => unreachable!("plans admit float outputs only"),
        }
    }
}
