//! Helpers shared by the facade's integration tests.
#![allow(dead_code)]

use ssm_tensor::{DType, HostTensor};

/// Deterministic values in `[-scale, scale]` (xorshift from `seed`).
pub(crate) fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A host i32 index tensor `[v.len()]`.
pub(crate) fn ints(v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::I32, vec![v.len()], v)
}
pub(crate) mod gdn_batch;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
