//! The bf16-state SSU's inner loop on this process's lanes: per 8 state elements, load and
//! widen bf16, `state·dA + B·x`, round and store bf16, `acc += state·C`, over 128 KiB of state
//! (L2-resident, so the figure is the loop's compute, not memory). Prints the lane type and the
//! fastest of 25 timed passes in ns per 8 elements (the fastest, because this machine's
//! neighbours slow single passes by up to 2×). For comparing lane implementations
//! (docs/PERF.md, "AVX-512 BF16 rounding").
//!
//! ```text
//! cargo run --release -p ssm-cpu --example lanes_bf16                        # best lanes
//! SSM_CPU_SIMD=portable cargo run --release -p ssm-cpu --example lanes_bf16  # portable lanes
//! ```

use half::bf16;
use ssm_cpu::simd::{LANES, PowTwo, Simd, SimdKernel, dispatch, simd_level};

/// `reps` passes of the update over `state`.
struct Update<'a> {
    state: &'a mut [bf16],
    b: &'a [f32],
    c: &'a [f32],
    reps: usize,
}

impl SimdKernel for Update<'_> {
    type Output = f32;
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) -> f32 {
        let (da, x) = (S::splat(0.999), S::splat(0.01));
        let mut total = S::splat(0.0);
        for _ in 0..self.reps {
            let mut acc = S::splat(0.0);
            for n in (0..self.state.len()).step_by(LANES) {
                let k = n % self.b.len();
                let v = S::load_bf16(&self.state[n..]).mul_add(da, S::load(&self.b[k..]).mul(x));
                v.store_bf16(&mut self.state[n..]);
                acc = v.mul_add(S::load(&self.c[k..]), acc);
            }
            total = total.add(acc);
        }
        total.reduce_add()
    }
}

fn main() {
    let n = 64 * 1024;
    let mut state = vec![bf16::from_f32(0.5); n];
    let b: Vec<f32> = (0..128).map(|i| i as f32 * 0.01).collect();
    let c = b.clone();
    let reps = 400;
    let mut best = f64::INFINITY;
    let mut check = 0.0;
    for _ in 0..25 {
        let t = std::time::Instant::now();
        check += dispatch(Update { state: &mut state, b: &b, c: &c, reps });
        best = best.min(t.elapsed().as_nanos() as f64 / (reps * n / LANES) as f64);
    }
    println!(
        "{:?} lanes: {best:.3} ns per 8 bf16 state elements (fastest of 25 passes; checksum {check:e})",
        simd_level()
    );
}
