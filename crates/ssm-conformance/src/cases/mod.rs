//! Random cases for the property tests of every backend: one generator per op family, drawn
//! by the CPU property tests and the GPU tests alike, so both check the same matrix.
//!
//! Seeds: [`base_seed`] reads `SSM_TEST_SEED` (tests print the seed they use, so a failure
//! replays with `SSM_TEST_SEED=<seed>`).

pub mod ring;
pub mod ssu;

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
