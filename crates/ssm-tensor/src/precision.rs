//! The arithmetic the scalar references are generic over, so that one reference body runs in
//! f32 (the peer's precision) and in f64 (the error oracle).

use std::ops::{Add, Div, Mul, Sub};

/// Which arithmetic a scalar reference runs in, chosen at run time: the peer's f32, or f64
/// without intermediate rounding (the error oracle). Every op crate's reference and the
/// conformance harness take this one enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// f32, as the peer computes (with the peer's roundings).
    F32,
    /// f64 throughout, no intermediate rounding.
    F64,
}

/// Arithmetic the references are generic over (f32 or f64).
pub trait Precision:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + PartialOrd
{
    /// Zero.
    const ZERO: Self;
    /// From f32 (exact).
    fn of(v: f32) -> Self;
    /// To f32 (rounded).
    fn f32(self) -> f32;
    /// `e^self`.
    fn exp(self) -> Self;
    /// `ln(1 + self)`.
    fn ln_1p(self) -> Self;
}

impl Precision for f32 {
    const ZERO: Self = 0.0;
    fn of(v: f32) -> Self {
        v
    }
    fn f32(self) -> f32 {
        self
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln_1p(self) -> Self {
        f32::ln_1p(self)
    }
}

impl Precision for f64 {
    const ZERO: Self = 0.0;
    fn of(v: f32) -> Self {
        v as f64
    }
    fn f32(self) -> f32 {
        self as f32
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln_1p(self) -> Self {
        f64::ln_1p(self)
    }
}
