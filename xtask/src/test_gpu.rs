//! `cargo xtask test-gpu`: the GPU test suite on a machine with CUDA and cargo. Sets
//! `SSM_REQUIRE_GPU=1`, so a missing GPU, driver or NVRTC fails the run instead of skipping.

use std::process::Command;

use anyhow::{Context, bail};

/// Packages whose tests exercise the CUDA backend, with the cargo features they need.
pub(crate) const GPU_TEST_PACKAGES: &[(&str, &[&str])] = &[("ssm-cuda", &[]), ("ssm-dispatch", &["cuda"])];

/// Arguments of `test-gpu`.
#[derive(Debug, clap::Args)]
pub(crate) struct TestGpuArgs {
    /// Build in debug mode (default: release, as the bundle does).
    #[arg(long)]
    pub(crate) debug: bool,
    /// Extra arguments for the test binaries (after `--`), e.g. a test name filter.
    #[arg(last = true)]
    pub(crate) test_args: Vec<String>,
}

/// The `cargo test` arguments selecting the GPU packages and features that exist in this
/// workspace (packages not present yet are skipped with a note).
pub(crate) fn cargo_test_selection(root: &std::path::Path) -> Vec<String> {
    let mut sel = Vec::new();
    let mut features = Vec::new();
    for (pkg, feats) in GPU_TEST_PACKAGES {
        let manifest = root.join("crates").join(pkg).join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            eprintln!("note: {pkg} not in this workspace; its GPU tests are not run");
            continue;
        };
        sel.extend(["-p".to_string(), pkg.to_string()]);
        for f in *feats {
            if text.contains(&format!("\n{f} =")) || text.contains(&format!("\n{f}=")) {
                features.push(format!("{pkg}/{f}"));
            }
        }
    }
    if !features.is_empty() {
        sel.extend(["--features".to_string(), features.join(",")]);
    }
    sel
}

pub(crate) fn run(args: &TestGpuArgs) -> anyhow::Result<()> {
    let root = crate::project_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root).arg("test");
    if !args.debug {
        cmd.arg("--release");
    }
    cmd.args(cargo_test_selection(&root)).env("SSM_REQUIRE_GPU", "1");
    cmd.arg("--").args(&args.test_args);
    println!("SSM_REQUIRE_GPU=1 {:?}", cmd);
    let status = cmd.status().context("running cargo test")?;
    if !status.success() {
        bail!("GPU tests failed ({status})");
    }
    Ok(())
}
