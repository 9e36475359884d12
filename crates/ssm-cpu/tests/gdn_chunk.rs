//! The CPU chunked prefill against the f64 recurrence on the shared random matrix
//! (`ssm_conformance::gdn_random::ChunkSpec::matrix`, the generator the CUDA tests run too):
//! GVA, K ≠ V, odd K and V, both layouts, pads, mixed initial states, dense and varlen batches.

use ssm_conformance::gdn_random::{ChunkCase, ChunkSpec, check_chunk};
use ssm_cpu::{CpuBackend, Par};
use ssm_gdn::reference::Reference;
use ssm_tensor::{Planned, Run};

#[test]
fn chunked_prefill_matches_the_f64_recurrence_on_the_shared_matrix() {
    let be = CpuBackend::new(Par::Threads(std::num::NonZeroUsize::new(2).unwrap())).unwrap();
    for i in 0..8 {
        let spec = ChunkSpec::matrix(i);
        let base = ChunkCase::random(spec, 0xc0ffee + i as u64);
        let mut want = base.clone();
        Reference::F64.run(Planned::new(want.args()).unwrap()).unwrap();
        let mut got = base.clone();
        be.run(Planned::new(got.args()).unwrap()).unwrap();
        check_chunk(&got, &want, 2e-4, 2e-3).unwrap_or_else(|e| panic!("case {i} {spec:?} lens {:?}: {e}", base.lens));
    }
}
