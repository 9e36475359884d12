//! Element access on host views by dtype, for the plan's index checks and the reference.

use ssm_tensor::{DType, TensorMut, TensorRef, bf16, f16};

/// Reads element `i` (an index into the whole borrowed memory) as i64. Host views only.
pub(crate) fn read_int(t: &TensorRef<'_>, i: usize) -> i64 {
    let b = t.host_bytes().expect("host view");
    match t.dtype() {
        DType::I32 => i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as i64,
        DType::I64 => i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()),
        DType::Bool => b[i] as i64,
        _ => read_float(t, i) as i64,
    }
}

/// Reads element `i` as f32 (floats widen exactly). Host views only.
pub(crate) fn read_float(t: &TensorRef<'_>, i: usize) -> f32 {
    let b = t.host_bytes().expect("host view");
    match t.dtype() {
        DType::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()),
        DType::F16 => f16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f32(),
        DType::BF16 => bf16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f32(),
        _ => read_int(t, i) as f32,
    }
}

/// Writes an integer to element `i` of an integer view. Host views only.
pub(crate) fn write_int(t: &mut TensorMut<'_>, i: usize, v: i64) {
    let dtype = t.dtype();
    let b = t.host_bytes_mut().expect("host view");
    match dtype {
        DType::I32 => b[i * 4..i * 4 + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes()),
        d => unreachable!("integer write to a {d} view"),
    }
}

/// Writes `v` rounded to nearest even to element `i` of a float view. Host views only.
pub(crate) fn write_float(t: &mut TensorMut<'_>, i: usize, v: f32) {
    let dtype = t.dtype();
    let b = t.host_bytes_mut().expect("host view");
    match dtype {
        DType::F32 => b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => b[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
        DType::BF16 => b[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
        d => unreachable!("float write to a {d} view"),
    }
}
