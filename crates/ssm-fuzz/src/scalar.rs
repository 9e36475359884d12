//! Non-tensor arguments and how the fuzzer changes them: each type draws from its extremes
//! and its ordinary values.

use rand::{Rng, RngCore};
use ssm_tensor::DType;

/// A non-tensor argument the fuzzer can change.
pub trait Scalar {
    /// Replaces the value by one drawn from the type's extremes and ordinary values.
    fn mutate(&mut self, rng: &mut dyn RngCore);
    /// The value, for the report.
    fn describe(&self) -> String;
    /// Whether the value is a float far from ordinary use (non-finite, or large enough to
    /// overflow what it scales), so that results are compared only where finite.
    fn extreme_float(&self) -> bool {
        false
    }
}

fn extreme(v: f32) -> bool {
    !v.is_finite() || v.abs() > 1e6 || (v != 0.0 && v.abs() < 1e-20)
}

/// Integers at and near the edges that shape and index arithmetic trips on.
pub(crate) const I64_EDGES: &[i64] = &[
    i64::MIN,
    i64::MIN + 1,
    -(1 << 62),
    i32::MIN as i64,
    -4097,
    -2,
    -1,
    0,
    1,
    2,
    3,
    7,
    64,
    255,
    4096,
    i32::MAX as i64,
    1 << 32,
    1 << 40,
    1 << 61,
    i64::MAX - 1,
    i64::MAX,
];

pub(crate) fn edge_i64(rng: &mut dyn RngCore) -> i64 {
    I64_EDGES[rng.random_range(0..I64_EDGES.len())]
}

pub(crate) fn edge_usize(rng: &mut dyn RngCore) -> usize {
    const EDGES: &[usize] =
        &[0, 1, 2, 3, 8, 15, 16, 63, 64, 128, 256, 1 << 16, 1 << 31, 1 << 32, 1 << 61, usize::MAX / 2, usize::MAX];
    EDGES[rng.random_range(0..EDGES.len())]
}

fn edge_f32(rng: &mut dyn RngCore) -> f32 {
    const EDGES: &[f32] = &[
        0.0,
        -0.0,
        1e-30,
        1e-6,
        0.5,
        1.0,
        20.0,
        -1.0,
        1e30,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    EDGES[rng.random_range(0..EDGES.len())]
}

impl Scalar for bool {
    fn mutate(&mut self, _: &mut dyn RngCore) {
        *self = !*self;
    }
    fn describe(&self) -> String {
        self.to_string()
    }
}

impl Scalar for i64 {
    fn mutate(&mut self, rng: &mut dyn RngCore) {
        *self = edge_i64(rng);
    }
    fn describe(&self) -> String {
        self.to_string()
    }
}

impl Scalar for usize {
    fn mutate(&mut self, rng: &mut dyn RngCore) {
        *self = edge_usize(rng);
    }
    fn describe(&self) -> String {
        self.to_string()
    }
}

impl Scalar for f32 {
    fn mutate(&mut self, rng: &mut dyn RngCore) {
        *self = edge_f32(rng);
    }
    fn describe(&self) -> String {
        format!("{self:e}")
    }
    fn extreme_float(&self) -> bool {
        extreme(*self)
    }
}

impl Scalar for (f32, f32) {
    fn mutate(&mut self, rng: &mut dyn RngCore) {
        if rng.random_bool(0.5) {
            self.0 = edge_f32(rng);
        } else {
            self.1 = edge_f32(rng);
        }
    }
    fn describe(&self) -> String {
        format!("({:e}, {:e})", self.0, self.1)
    }
    fn extreme_float(&self) -> bool {
        extreme(self.0) || extreme(self.1)
    }
}

/// A value to start from when an absent optional scalar is set.
pub trait Fresh {
    /// The starting value.
    fn fresh() -> Self;
}
impl Fresh for i64 {
    fn fresh() -> Self {
        0
    }
}
impl Fresh for usize {
    fn fresh() -> Self {
        0
    }
}
impl Fresh for f32 {
    fn fresh() -> Self {
        1.0
    }
}
impl Fresh for DType {
    fn fresh() -> Self {
        DType::F32
    }
}
impl Fresh for ssm_ssu::StochasticRounding {
    fn fresh() -> Self {
        ssm_ssu::StochasticRounding { seed: 0, philox_rounds: 10 }
    }
}

/// `None`, or `Some` of a mutated value.
impl<T: Scalar + Fresh> Scalar for Option<T> {
    fn mutate(&mut self, rng: &mut dyn RngCore) {
        if self.is_some() && rng.random_bool(0.3) {
            *self = None;
        } else {
            let mut v = self.take().unwrap_or_else(T::fresh);
            v.mutate(rng);
            *self = Some(v);
        }
    }
    fn describe(&self) -> String {
        self.as_ref().map_or("None".into(), |v| v.describe())
    }
    fn extreme_float(&self) -> bool {
        self.as_ref().is_some_and(|v| v.extreme_float())
    }
}

impl Scalar for ssm_ssu::StochasticRounding {
    fn mutate(&mut self, rng: &mut dyn RngCore) {
        if rng.random_bool(0.5) {
            self.seed = rng.next_u64();
        } else {
            self.philox_rounds = [0, 1, 7, 10, 64, 1 << 20, u32::MAX][rng.random_range(0..7)];
        }
    }
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

/// Enums: the next variant.
macro_rules! cycle {
    ($t:ty: $($v:expr),+) => {
        impl Scalar for $t {
            fn mutate(&mut self, rng: &mut dyn RngCore) {
                let all = [$($v),+];
                *self = all[rng.random_range(0..all.len())];
            }
            fn describe(&self) -> String {
                format!("{self:?}")
            }
        }
    };
}
cycle!(ssm_gdn::StateLayout: ssm_gdn::StateLayout::VK, ssm_gdn::StateLayout::KV);
cycle!(ssm_conv::ConvStateLayout: ssm_conv::ConvStateLayout::DimStateLen, ssm_conv::ConvStateLayout::StateLenDim);
cycle!(ssm_conv::Activation: ssm_conv::Activation::None, ssm_conv::Activation::Silu);
cycle!(ssm_tensor::RowDirection: ssm_tensor::RowDirection::Gather, ssm_tensor::RowDirection::Scatter);
cycle!(DType: DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool);
