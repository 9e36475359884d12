//! Block-scaled integer states: FlashInfer's int16 state (semantics/ssu.md §5.3) and its 8-bit
//! sibling, one f32 *decode* scale per (slot, head, row) for both. A row is read as
//! `q · scale`; a row of new state `s` is stored as `q = rint(clamp(s · encode, ±LIMIT))` with
//! `encode = LIMIT / max|s|` (1 for a zero row) and the decode scale `1 / encode` beside it.
//! `LIMIT` is 32767 for i16 and 127 for i8 (FlashInfer's `QUANT_MAX` of its int8 state). Every
//! backend quantizes through these functions (the CUDA kernel mirrors them operation for
//! operation), so that a row of f32 state becomes the same integers and scale everywhere.

use ssm_tensor::DType;

/// The largest stored magnitude of an i16 row: the clip is symmetric, so that negation is exact.
pub const I16_LIMIT: f32 = 32767.0;
/// The largest stored magnitude of an i8 row (symmetric, as for i16).
pub const I8_LIMIT: f32 = 127.0;

/// The integer types of a block-scaled state.
pub trait QuantInt: Copy + Into<i64> {
    /// The largest stored magnitude.
    const LIMIT: f32;
    /// The integer of an already clamped, integral `v` (|v| ≤ `LIMIT`).
    fn from_clamped(v: f32) -> Self;
}

impl QuantInt for i16 {
    const LIMIT: f32 = I16_LIMIT;
    #[inline(always)]
    fn from_clamped(v: f32) -> Self {
        v as i16
    }
}

impl QuantInt for i8 {
    const LIMIT: f32 = I8_LIMIT;
    #[inline(always)]
    fn from_clamped(v: f32) -> Self {
        v as i8
    }
}

/// The largest stored magnitude of a block-scaled state of `dtype` (i16 or i8), `None` for any
/// other dtype (a float state carries no scales).
pub const fn limit(dtype: DType) -> Option<f32> {
    match dtype {
        DType::I16 => Some(I16_LIMIT),
        DType::I8 => Some(I8_LIMIT),
        _ => None,
    }
}

/// The largest magnitude of a row, as the kernels reduce it: `fmaxf` from `f32::MIN`, so a
/// NaN element is ignored (the order of the reduction cannot change the result).
#[inline]
pub fn row_amax(row: &[f32]) -> f32 {
    row.iter().fold(f32::MIN, |m, v| m.max(v.abs()))
}

/// `(encode, decode)` of a row whose largest magnitude is `amax`, for integers up to `limit`:
/// `encode = limit / amax` (1 when `amax` is 0), `decode = 1 / encode`, both correctly rounded
/// f32 divisions.
#[inline]
pub fn scales(amax: f32, limit: f32) -> (f32, f32) {
    let encode = if amax == 0.0 { 1.0 } else { limit / amax };
    (encode, 1.0 / encode)
}

/// One element encoded: `v · encode` clamped to ±`limit` (NaN becomes −`limit`, as CUDA's
/// `fminf(fmaxf(v, −m), m)` makes it), rounded to nearest even; an integral f32.
#[inline]
#[allow(clippy::manual_clamp, reason = "`clamp` keeps NaN; the kernels' fmaxf/fminf make it −limit")]
pub fn encode(v: f32, encode: f32, limit: f32) -> f32 {
    (v * encode).max(-limit).min(limit).round_ties_even()
}

/// One element stored as `Q` ([`encode`] with `Q`'s limit).
#[inline]
pub fn quantize<Q: QuantInt>(v: f32, enc: f32) -> Q {
    Q::from_clamped(encode(v, enc, Q::LIMIT))
}

/// Quantizes `row` into `out` (same length) and returns its decode scale.
#[inline]
pub fn quantize_row<Q: QuantInt>(row: &[f32], out: &mut [Q]) -> f32 {
    let (enc, decode) = scales(row_amax(row), Q::LIMIT);
    for (q, &v) in out.iter_mut().zip(row) {
        *q = quantize(v, enc);
    }
    decode
}

/// Quantizes `row` for a state of `dtype` (i16 or i8): its integers and decode scale.
///
/// # Panics
/// If `dtype` is not a block-scaled state's (callers hold a plan that admitted it).
pub fn quantize_row_as(dtype: DType, row: &[f32]) -> (Vec<i64>, f32) {
    fn go<Q: QuantInt + Default>(row: &[f32]) -> (Vec<i64>, f32) {
        let mut q = vec![Q::default(); row.len()];
        let decode = quantize_row(row, &mut q);
        (q.into_iter().map(Into::into).collect(), decode)
    }
    match dtype {
        DType::I16 => go::<i16>(row),
        DType::I8 => go::<i8>(row),
        other => panic!("{other} is not a block-scaled state dtype"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<Q: QuantInt + Default>() {
        let row = [0.5f32, -2.0, 1.25e-3, 0.0, 1.999];
        let mut q = [Q::default(); 5];
        let decode = quantize_row(&row, &mut q);
        assert_eq!(q[1].into(), -(Q::LIMIT as i64), "the largest magnitude maps to the limit");
        for (&v, &qi) in row.iter().zip(&q) {
            let back = qi.into() as f32 * decode;
            assert!((back - v).abs() <= 0.5 * decode * 1.0001, "{v} -> {}", qi.into());
        }
    }

    #[test]
    fn a_row_round_trips_within_half_a_step() {
        round_trip::<i16>();
        round_trip::<i8>();
    }

    #[test]
    fn zero_and_nan_rows_are_defined() {
        let mut q = [7i16; 2];
        assert_eq!(quantize_row(&[0.0, -0.0], &mut q), 1.0);
        assert_eq!(q, [0, 0]);
        let decode = quantize_row(&[f32::NAN, 1.0], &mut q);
        assert_eq!(q, [-32767, 32767]);
        assert_eq!(decode, 1.0 / 32767.0);
        let mut q8 = [7i8; 2];
        let decode = quantize_row(&[f32::NAN, -1.0], &mut q8);
        assert_eq!(q8, [-127, -127]);
        assert_eq!(decode, 1.0 / 127.0);
    }

    #[test]
    fn limits_by_dtype() {
        assert_eq!(limit(DType::I16), Some(32767.0));
        assert_eq!(limit(DType::I8), Some(127.0));
        assert_eq!(limit(DType::BF16), None);
        let (q, d) = quantize_row_as(DType::I8, &[1.0, -0.5]);
        assert_eq!((q, d), (vec![127, -64], 1.0 / 127.0));
    }
}
