//! The bounded fuzz run CI makes: every op's golden-vector and random templates, mutated;
//! no panic, no write before a refusal, no disagreement with the reference.

use ssm_fuzz::{FuzzConfig, Fuzzer};

#[test]
fn mutated_calls_are_refused_cleanly_or_match_the_reference() {
    let config = FuzzConfig::from_env(100, 10);
    eprintln!("fuzz config: {config:?}");
    let report = Fuzzer::new(config).run();
    eprint!("{}", report.summary());
    for f in &report.failures {
        eprintln!("FAIL {f}");
    }
    assert!(
        report.failures.is_empty(),
        "{} failed cases (replay one with SSM_FUZZ_OP and SSM_FUZZ_ONLY)",
        report.failures.len()
    );
}
