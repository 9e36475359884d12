//! A CUDA runtime for the GPU tests of the facade, and device copies of host tensors.

use ssm_cuda::testing::{StagedTensor, gpu_ready};
use ssm_dispatch::{BackendKind, Config, Runtime};
use ssm_tensor::HostTensor;

/// A CUDA runtime, or `None` where there is no GPU ([`gpu_ready`]'s skip rule).
pub(crate) fn cuda(test: &str) -> Option<Runtime> {
    gpu_ready(test)
        .then(|| Runtime::new(&Config { backend: BackendKind::Cuda, ..Config::default() }).expect("CUDA runtime"))
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
