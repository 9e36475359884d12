//! Philox-4x32 and the stochastic rounding of an f32 to f16 (semantics/ssu.md §6).
//!
//! This module is the single definition every backend reproduces bit for bit (the CUDA
//! kernels mirror it in `kernels/ssu.cu`):
//!
//! 1. **Random bits.** `philox4x32(seed, offset, rounds)` is Triton's `tl.randint4x`: key
//!    `(seed lo, seed hi)`, counter `(offset lo, offset hi, 0, 0)`, `rounds` rounds (10 by
//!    default). The offset of state element `(slot, h, p, n)` is its element offset in the
//!    state tensor, `slot·stride0 + h·stride1 + p·stride2 + n·stride3`, with the **source**
//!    slot (vLLM's `rand_offsets`).
//! 2. **Pairing** (vLLM's `cvt.rs.f16x2.f32` use, §6.3): elements `n` and `n+1` for even `n`
//!    share the word `r = philox(seed, offset(n)).0`; the even element rounds with bits
//!    `r[12:0]`, the odd one with `r[28:16]`.
//! 3. **Rounding** ([`round_f16_stochastic`]): the 13 random bits are added just below the
//!    last kept bit of |x| and the result is truncated, which rounds away from zero with
//!    probability equal to the discarded fraction (to 13-bit resolution). For f16 normals
//!    the discarded part is the low 13 bits of the f32 mantissa; for f16 subnormals it is the
//!    fraction of |x| in units of 2⁻²⁴. Results above 65504 become ±inf, NaN stays NaN.
//!    sm_90 has no `cvt.rs`, so this is also what our CUDA kernel computes in software.

use half::f16;

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Triton's `tl.randint4x(seed, offset, rounds)`.
pub fn philox4x32(seed: u64, offset: u64, rounds: u32) -> [u32; 4] {
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    let (mut c0, mut c1, mut c2, mut c3) = (offset as u32, (offset >> 32) as u32, 0u32, 0u32);
    for _ in 0..rounds {
        let (a, b) = (c0, c2);
        c0 = (((M1 as u64 * b as u64) >> 32) as u32) ^ c1 ^ k0;
        c2 = (((M0 as u64 * a as u64) >> 32) as u32) ^ c3 ^ k1;
        c1 = M1.wrapping_mul(b);
        c3 = M0.wrapping_mul(a);
        k0 = k0.wrapping_add(W0);
        k1 = k1.wrapping_add(W1);
    }
    [c0, c1, c2, c3]
}

/// The 13 random bits state element `n` uses, given the element offset of its even partner
/// (`offset(n − n % 2)`).
#[inline]
pub fn sr_bits(seed: u64, rounds: u32, pair_offset: u64, odd: bool) -> u32 {
    let r = philox4x32(seed, pair_offset, rounds)[0];
    if odd { (r >> 16) & 0x1FFF } else { r & 0x1FFF }
}

/// Rounds `x` to f16 stochastically with 13 random bits `rbits` (see the module docs).
pub fn round_f16_stochastic(x: f32, rbits: u32) -> f16 {
    let rbits = rbits & 0x1FFF;
    if x.is_nan() {
        return f16::from_f32(x);
    }
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    let ax = x.abs();
    let mag: u16 = if ax >= 6.103_515_6e-5 {
        // |x| >= 2^-14: f16 normal (or overflow). Add below the 10th mantissa bit, truncate.
        let bits = ax.to_bits().wrapping_add(rbits) & !0x1FFF;
        let v = f32::from_bits(bits);
        if v > 65504.0 { 0x7C00 } else { f16::from_f32(v).to_bits() }
    } else {
        // f16 subnormal range: units of 2^-24.
        let q = ax * 16_777_216.0;
        let i = q.floor();
        let frac13 = ((q - i) * 8192.0).floor() as u32;
        let up = u32::from(frac13 + rbits >= 8192);
        (i as u32 + up) as u16
    };
    f16::from_bits(sign | mag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_documented_vectors() {
        assert_eq!(philox4x32(42, 0, 10), [2632642643, 2012563771, 314527917, 1463989207]);
        assert_eq!(philox4x32(42, 1, 10), [4242219303, 1404726525, 2207210094, 1951270651]);
        assert_eq!(philox4x32(42, 0, 4), [3557603155, 3391453543, 1959538716, 1676625527]);
    }

    #[test]
    fn exact_values_are_kept_and_bounds_hold() {
        for &v in &[0.0f32, 1.0, -2.5, 65504.0, 6.103_515_6e-5, 5.960_464_5e-8, -1024.0] {
            for r in [0, 1, 4095, 8191] {
                assert_eq!(round_f16_stochastic(v, r).to_f32(), v, "{v} with {r}");
            }
        }
        // Rounds to one of the two neighbours.
        let x = 1.000_1f32;
        let lo = f16::from_bits(0x3C00).to_f32();
        let hi = f16::from_bits(0x3C01).to_f32();
        for r in 0..8192 {
            let y = round_f16_stochastic(x, r).to_f32();
            assert!(y == lo || y == hi);
        }
        assert_eq!(round_f16_stochastic(x, 0).to_f32(), lo);
        assert_eq!(round_f16_stochastic(x, 8191).to_f32(), hi);
        assert!(round_f16_stochastic(70000.0, 0).to_f32().is_infinite());
        assert!(round_f16_stochastic(f32::NAN, 5).is_nan());
        assert_eq!(round_f16_stochastic(-1.000_1, 8191).to_f32(), -hi);
    }

    #[test]
    fn stochastic_rounding_is_unbiased() {
        // The mean of many rounded values converges to the f32 value, for normals and subnormals.
        for &x in &[1.000_123_4f32, -3.217_345, 0.1, 1.234_5e-6, -7.0e-8, 33333.33] {
            let n = 200_000u64;
            let mut sum = 0.0f64;
            for i in 0..n {
                let r = sr_bits(0x1234_5678_9abc, 10, i * 2, i % 3 == 0);
                sum += round_f16_stochastic(x, r).to_f32() as f64;
            }
            let mean = sum / n as f64;
            let lo = round_f16_stochastic(x, 0).to_f32() as f64;
            let hi = round_f16_stochastic(x, 8191).to_f32() as f64;
            let ulp = (hi - lo).abs();
            // 13-bit resolution bias is at most ulp/8192; sampling error ~ ulp/sqrt(n).
            assert!((mean - x as f64).abs() < ulp * (4.0 / (n as f64).sqrt() + 1.0 / 8192.0), "{x}: mean {mean}");
            let rne = f16::from_f32(x).to_f32() as f64;
            if (rne - x as f64).abs() > ulp * 0.1 {
                assert!((mean - x as f64).abs() < (rne - x as f64).abs(), "{x}: SR must beat RNE on average");
            }
        }
    }
}
