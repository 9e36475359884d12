//! A CUDA runtime for the GPU tests of the facade, and device copies of host tensors.

use ssm_cuda::testing::StagedTensor;
use ssm_cuda::{Availability, probe};
use ssm_dispatch::{BackendKind, Config, Runtime};
use ssm_tensor::HostTensor;

/// A CUDA runtime, or `None` (printing why) where there is no GPU (a failure instead with
/// `SSM_REQUIRE_GPU=1`).
pub(crate) fn cuda(test: &str) -> Option<Runtime> {
    let require = std::env::var("SSM_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let ready = matches!(probe(), Availability::Ready { .. }) && ssm_cuda::nvrtc_available();
    if !ready {
        assert!(!require, "{test}: SSM_REQUIRE_GPU=1 but no GPU: {}", probe());
        eprintln!("skipping {test}: {}", probe());
        return None;
    }
    Some(Runtime::new(&Config { backend: BackendKind::Cuda, ..Config::default() }).expect("CUDA runtime"))
}

/// Device copies of host tensors on a CUDA runtime, and back.
pub(crate) struct Dev<'r>(pub(crate) &'r Runtime);

impl Dev<'_> {
    /// A device copy of `t`.
    pub(crate) fn up(&self, t: &HostTensor) -> StagedTensor {
        StagedTensor::upload(self.0.cuda().expect("cuda backend"), &t.view()).expect("upload")
    }

    /// A host tensor shaped like `like` holding `d`'s bytes.
    pub(crate) fn down(&self, d: &StagedTensor, like: &HostTensor) -> HostTensor {
        let mut h = like.clone();
        d.copy_back(&mut h.view_mut()).expect("download");
        h
    }
}
