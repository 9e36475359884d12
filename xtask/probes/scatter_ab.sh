#!/bin/bash
# The one-pass outputs (reduce-scatter) of the SSU, the GDN decode and ReplaySSM, and
# ReplaySSM's L2 prefetch, against their old paths, in one device call: the tests of the
# kernels they touch (with the bundle's run.sh), then an A/B of each bench (xtask/probes/ab.sh,
# the bundle's xtask with and without the tuning variable). From the repository root with the
# bundle carried:
#   [SCATTER_ROUNDS=2] [SCATTER_TESTS=1] bash xtask/probes/scatter_ab.sh
# Results: $OUT/tests/summary.txt and $OUT/ab.txt.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
export SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-/tmp/ssmcache}"
if [ "${SCATTER_TESTS:-1}" = 1 ]; then
  OUT="$out/tests" SSM_TEST_BINS="test-ssm-cuda-gpu_ssu test-ssm-cuda-gpu_gdn test-ssm-cuda-gpu_gdn_step \
test-ssm-cuda-gpu_ring test-ssm-cuda-gpu_conformance test-ssm-dispatch-gdn_core test-ssm-dispatch-ssd_ring" \
    bash "$root/bundle/run.sh" tests >/dev/null 2>&1
  cat "$out/tests/summary.txt"
fi
rounds="${SCATTER_ROUNDS:-2}"
OUT="$out" AB_ROUNDS="$rounds" AB_BENCH=ssu AB_ARGS="--int16 false --int8 false" \
  AB_VARIANTS="new new:SSM_CUDA_SSU_TUNE=scatter=0" bash "$here/ab.sh" >/dev/null 2>&1
OUT="$out" AB_ROUNDS="$rounds" AB_BENCH=gdn AB_ARGS="--spec-batch 64 --step-batches 1,8 --conv-batches 1" \
  AB_VARIANTS="new new:SSM_CUDA_GDN_TUNE=scatter=0" bash "$here/ab.sh" >/dev/null 2>&1
OUT="$out" AB_ROUNDS="$rounds" AB_BENCH=ssu AB_ARGS="--batches 1,8,64,256 --tokens 4 --int16 false --int8 false" \
  AB_VARIANTS="new new:SSM_CUDA_CKPT_TUNE=prefetch=0 new:SSM_CUDA_SSU_TUNE=scatter=0" bash "$here/ab.sh" >/dev/null 2>&1
grep -E '^(##|# )|replayssm|ours' "$out/ab.txt" | head -400
