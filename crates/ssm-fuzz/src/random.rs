//! Templates from the property tests' random generators (odd sizes, pads, aliasing tables,
//! speculative routes), on top of the golden vectors.

use ssm_conformance::cases::{conv, ssu};
use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec};

use crate::driver::Fuzzer;
use crate::ops;

/// Fuzzes `random_templates` cases of each generator.
pub(crate) fn fuzz_random(f: &Fuzzer) {
    let seed = f.config().seed;
    let n = f.config().random_templates;
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    for i in 0..n {
        let s = seed.wrapping_add(i as u64);
        let mut case = ssu::Case::build(ssu::Spec::draw(&mut rng, i), s);
        f.fuzz::<ops::Ssu>(&format!("ssu-random{i}"), &case.args());

        let dtype = conv::FLOATS[i % 3];
        let mode = conv::MODES[i % conv::MODES.len()];
        let mut case = conv::Case::random(dtype, mode, s);
        if mode == conv::Mode::Prefill {
            f.fuzz::<ops::ConvFn>(&format!("conv-random{i}"), &case.fn_args());
        } else {
            f.fuzz::<ops::ConvUpdate>(&format!("conv-random{i}"), &case.update_args());
        }

        let mut case = RecurrentCase::random(RecurrentSpec::matrix(i), s);
        f.fuzz::<ops::GdnRecurrent>(&format!("gdn-random{i}"), &case.recurrent_args());
        let mut case = RecurrentCase::random(RecurrentSpec::matrix(i), s);
        f.fuzz::<ops::GdnSigmoid>(&format!("gdn-random{i}"), &case.sigmoid_args());
    }
}
