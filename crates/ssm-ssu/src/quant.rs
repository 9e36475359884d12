//! FlashInfer's block-scaled int16 state (semantics/ssu.md §5.3): one f32 *decode* scale per
//! (slot, head, row). A row is read as `q · scale`; a row of new state `s` is stored as
//! `q = rint(clamp(s · encode, ±32767))` with `encode = 32767 / max|s|` (1 for a zero row) and
//! the decode scale `1 / encode` beside it. Every backend quantizes through these functions
//! (the CUDA kernel mirrors them operation for operation), so that a row of f32 state becomes
//! the same integers and scale everywhere.

/// The largest stored magnitude: the clip is symmetric, so that negation is exact.
pub const I16_LIMIT: f32 = 32767.0;

/// The largest magnitude of a row, as the kernels reduce it: `fmaxf` from `f32::MIN`, so a
/// NaN element is ignored (the order of the reduction cannot change the result).
#[inline]
pub fn row_amax(row: &[f32]) -> f32 {
    row.iter().fold(f32::MIN, |m, v| m.max(v.abs()))
}

/// `(encode, decode)` of a row whose largest magnitude is `amax`: `encode = 32767 / amax`
/// (1 when `amax` is 0), `decode = 1 / encode`, both correctly rounded f32 divisions.
#[inline]
pub fn i16_scales(amax: f32) -> (f32, f32) {
    let encode = if amax == 0.0 { 1.0 } else { I16_LIMIT / amax };
    (encode, 1.0 / encode)
}

/// One element stored: `v · encode` clamped to ±32767 (NaN becomes −32767, as CUDA's
/// `fminf(fmaxf(v, −m), m)` makes it), rounded to nearest even.
#[inline]
#[allow(clippy::manual_clamp, reason = "`clamp` keeps NaN; the kernels' fmaxf/fminf make it −32767")]
pub fn quantize_i16(v: f32, encode: f32) -> i16 {
    (v * encode).max(-I16_LIMIT).min(I16_LIMIT).round_ties_even() as i16
}

/// Quantizes `row` into `out` (same length) and returns its decode scale.
#[inline]
pub fn quantize_row_i16(row: &[f32], out: &mut [i16]) -> f32 {
    let (encode, decode) = i16_scales(row_amax(row));
    for (q, &v) in out.iter_mut().zip(row) {
        *q = quantize_i16(v, encode);
    }
    decode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_round_trips_within_half_a_step() {
        let row = [0.5f32, -2.0, 1.25e-3, 0.0, 1.999];
        let mut q = [0i16; 5];
        let decode = quantize_row_i16(&row, &mut q);
        assert_eq!(q[1], -32767, "the largest magnitude maps to the limit");
        for (&v, &qi) in row.iter().zip(&q) {
            assert!((qi as f32 * decode - v).abs() <= 0.5 * decode * 1.0001, "{v} -> {qi}");
        }
    }

    #[test]
    fn zero_and_nan_rows_are_defined() {
        let mut q = [7i16; 2];
        assert_eq!(quantize_row_i16(&[0.0, -0.0], &mut q), 1.0);
        assert_eq!(q, [0, 0]);
        let decode = quantize_row_i16(&[f32::NAN, 1.0], &mut q);
        assert_eq!(q, [-32767, 32767]);
        assert_eq!(decode, 1.0 / 32767.0);
    }
}
