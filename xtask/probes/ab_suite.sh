#!/bin/bash
# A named suite of A/Bs (xtask/probes/ab.sh: the bundle's xtask with and without a tuning
# variable, alternating) in one device call, after the tests of the kernels the suite touches
# (the bundle's run.sh). The suites docs/PERF.md quotes:
#   scatter    the one-pass outputs of the SSU and the GDN decode against their butterflies,
#              and ReplaySSM's 4-token step beside the SSU's (fourteenth session)
#   ssd-order  the SSD tile kernels' block order (`SSM_CUDA_SSD_TUNE=order=0`: the tile as the
#              grid's z) over 2k, 8 varied 8k and 32k tokens and Nemotron-H (fourteenth session)
#   conv-vec   the conv update's channels per thread at small batches (`SSM_CUDA_CONV_TUNE=vec=2`:
#              vLLM's two bf16 channels a thread; with `threads=64`, twice the blocks again)
#   ssu-alg    the SSU's three tilings (`ssu_algorithm` simple / vertical / horizontal) side by
#              side, shape by shape, in each round: the measurements `auto`'s table records
#   gdn-f32    the GDN decode's f32 geometry at batch ≥ 64, where the H200 missed 0.94 of copy
#              (sixteenth session): rows per lane 2 against the default 4 (52 registers), and 6
#              or 10 blocks per SM asked of the register allocator against the default 8 (60
#              registers; 10 spills 12 bytes on sm_90; rows per lane 8 spilled 104 and is left out)
# From the repository root with the bundle carried:
#   [AB_ROUNDS=2] [SUITE_TESTS=1] bash xtask/probes/ab_suite.sh scatter|ssd-order|conv-vec|gdn-f32|ssu-alg
# Results: $OUT/tests/summary.txt and $OUT/ab.txt.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
export SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-/tmp/ssmcache}"
# Each A/B: bench, its arguments, the variants.
ab() { OUT="$out" AB_ROUNDS="${AB_ROUNDS:-2}" AB_BENCH="$1" AB_ARGS="$2" AB_VARIANTS="$3" bash "$here/ab.sh" >/dev/null 2>&1; }
case "${1:-}" in
  scatter)
    tests="test-ssm-cuda-gpu_ssu test-ssm-cuda-gpu_gdn test-ssm-cuda-gpu_gdn_step test-ssm-cuda-gpu_ring \
test-ssm-cuda-gpu_conformance test-ssm-dispatch-gdn_core test-ssm-dispatch-ssd_ring"
    run() {
      ab ssu "--int16 false --int8 false" "new new:SSM_CUDA_SSU_TUNE=scatter=0"
      ab gdn "--spec-batch 64 --step-batches 1,8 --conv-batches 1" "new new:SSM_CUDA_GDN_TUNE=scatter=0"
    } ;;
  ssd-order)
    tests="test-ssm-cuda-gpu_ssd test-ssm-dispatch-ssd_ring test-ssm-dispatch-mamba2_core test-ssm-cuda-gpu_conformance"
    run() {
      ab ssd "--states f32,bf16 --mamba2 1x2048,8v8192,1x32768 --nemotron 4x2048" "new new:SSM_CUDA_SSD_TUNE=order=0"
    } ;;
  conv-vec)
    tests="test-ssm-cuda-gpu_conv test-ssm-cuda-gpu_gdn_step test-ssm-cuda-gpu_conformance"
    run() {
      ab gdn "--batches 1 --spec-batch 0 --step-batches 1 --conv-batches 1,2,4,8,16,32,64 --states bf16" \
        "new new:SSM_CUDA_CONV_TUNE=vec=2 new:SSM_CUDA_CONV_TUNE=vec=2,threads=64"
    } ;;
  gdn-f32)
    tests="test-ssm-cuda-gpu_gdn test-ssm-cuda-gpu_gdn_step test-ssm-cuda-gpu_conformance"
    run() {
      ab gdn "--batches 64,256,1024 --spec-batch 0 --step-batches 1 --conv-batches 1 --states f32" \
        "new new:SSM_CUDA_GDN_TUNE=rpt=2 new:SSM_CUDA_GDN_TUNE=minb=6 new:SSM_CUDA_GDN_TUNE=minb=10"
    } ;;
  ssu-alg)
    tests="test-ssm-cuda-gpu_ssu test-ssm-cuda-gpu_conformance"
    run() {
      for t in 1 4; do
        ab ssu "--algorithms simple,vertical,horizontal --tokens $t --int16 false --int8 false" "new"
      done
    } ;;
  *) echo "usage: ab_suite.sh scatter|ssd-order|conv-vec|gdn-f32|ssu-alg" >&2; exit 2 ;;
esac
if [ "${SUITE_TESTS:-1}" = 1 ]; then
  OUT="$out/tests" SSM_TEST_BINS="$tests" bash "$root/bundle/run.sh" tests >/dev/null 2>&1
  cat "$out/tests/summary.txt"
fi
run
grep -vE '^$' "$out/ab.txt" | head -400
