#!/bin/bash
# The SSD tile kernels' block order (`SSM_CUDA_SSD_TUNE order=1`, the default: one (chunk, head)'s
# tiles next to each other; `order=0`: the tile as the grid's z) in one device call: the SSD tests
# with the default (gpu_ssd, ssd_ring, mamba2_core, gpu_conformance, with the bundle's run.sh),
# then an A/B of the SSD bench (xtask/probes/ab.sh, alternating). From the repository root with
# the bundle carried:
#   [ORDER_ROUNDS=2] [ORDER_TESTS=1] [ORDER_SHAPES=1x2048,8v8192,1x32768] bash xtask/probes/ssd_order_ab.sh
# Results: $OUT/tests/summary.txt and $OUT/ab.txt.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
export SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-/tmp/ssmcache}"
if [ "${ORDER_TESTS:-1}" = 1 ]; then
  OUT="$out/tests" SSM_TEST_BINS="test-ssm-cuda-gpu_ssd test-ssm-dispatch-ssd_ring test-ssm-dispatch-mamba2_core \
test-ssm-cuda-gpu_conformance" bash "$root/bundle/run.sh" tests >/dev/null 2>&1
  cat "$out/tests/summary.txt"
fi
OUT="$out" AB_ROUNDS="${ORDER_ROUNDS:-2}" AB_BENCH=ssd \
  AB_ARGS="--states f32,bf16 --mamba2 ${ORDER_SHAPES:-1x2048,8v8192,1x32768} --nemotron 4x2048" \
  AB_VARIANTS="new new:SSM_CUDA_SSD_TUNE=order=0" bash "$here/ab.sh" >/dev/null 2>&1
grep -vE '^$' "$out/ab.txt" | head -200
