//! Random cases for the property tests of every backend: one generator per op family, drawn
//! by the CPU property tests and the GPU tests alike, so both check the same matrix.
//!
//! Seeds: [`base_seed`] reads `SSM_TEST_SEED` (tests print the seed they use, so a failure
//! replays with `SSM_TEST_SEED=<seed>`).

pub mod conv;
pub mod ring;
pub mod ring_random;
pub mod ssd;
pub mod ssu;

use ssm_tensor::{HostTensor, TensorMut, TensorRef};

/// The base seed of a property test: `SSM_TEST_SEED` when set, else `fallback`, else a fresh
/// random seed. Printed on stderr, so that a failing run can be replayed.
///
/// # Panics
/// If `SSM_TEST_SEED` is set but not an integer.
pub fn base_seed(fallback: Option<u64>) -> u64 {
    let seed = match std::env::var("SSM_TEST_SEED") {
        Ok(s) => s.parse().expect("SSM_TEST_SEED must be an integer"),
        Err(_) => fallback.unwrap_or_else(rand::random),
    };
    eprintln!("SSM_TEST_SEED={seed}");
    seed
}

/// An owned host tensor seen through a layout: stride-0 broadcasts of tied parameters, padded
/// state slots, permuted (e.g. dim-major) activations.
#[derive(Debug, Clone, PartialEq)]
pub struct StridedHost {
    /// The memory (its own shape is the compact one).
    pub memory: HostTensor,
    /// Shape of the view.
    pub shape: Vec<usize>,
    /// Strides of the view in elements.
    pub strides: Vec<isize>,
}

impl StridedHost {
    pub(crate) fn contiguous(memory: HostTensor) -> Self {
        let strides = memory.view().strides().to_vec();
        StridedHost { shape: memory.shape.clone(), memory, strides }
    }

    /// `memory` broadcast to `shape` (its size-1 axes get stride 0).
    pub(crate) fn expanded(memory: HostTensor, shape: &[usize]) -> Self {
        let strides = memory.view().expand(shape).expect("a broadcastable shape").strides().to_vec();
        StridedHost { memory, shape: shape.to_vec(), strides }
    }

    /// The read-only view.
    pub fn view(&self) -> TensorRef<'_> {
        self.memory.view().with_layout(&self.shape, &self.strides, 0).expect("the layout fits the memory")
    }

    /// The writable view.
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        let (shape, strides) = (self.shape.clone(), self.strides.clone());
        self.memory.view_mut().with_layout(&shape, &strides, 0).expect("the layout fits the memory")
    }
}
