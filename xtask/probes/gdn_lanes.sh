#!/bin/bash
# Lanes per row of the GDN decode's [V,K] route (`SSM_CUDA_GDN_TUNE="tpr=N"`), in one device call:
# the default (32 lanes per f32 row, 4 columns each) against 16 and 8 lanes (8 and 16 columns per
# lane: fewer shuffles per row, more registers). The H100 profile (docs/PERF.md, eighteenth
# session) counted 3.3x vLLM's instructions at batch 256; this measures whether fewer lanes per
# row cut them and the time.
#   1. the GDN tests (gpu_gdn, gpu_gdn_step) under each variant (every [V,K] vector
#      specialisation takes it);
#   2. Nsight Compute over our f32 decode at batch 256 under each variant;
#   3. ab.sh: the f32 and bf16 decode and the speculative step under each variant.
# From the repository root with the bundle carried (the bundle in a writable copy):
#   [LANES_VARIANTS="tpr=16 tpr=8,minb=4"] [LANES_LIMIT=300] bash xtask/probes/gdn_lanes.sh
# Results under $OUT/lanes/: tests_<variant>/summary.txt, ncu_<variant>.txt, ab.txt.
set -u
root="$(pwd)"; o="${OUT:-/tmp/out}/lanes"; mkdir -p "$o"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/probe_env.sh"
t0=$(date +%s); lim="${LANES_LIMIT:-300}"
left() { echo $(( lim - ($(date +%s) - t0) )); }
variants="${LANES_VARIANTS:-tpr=16 tpr=8,minb=4}"
export SSM_CUDA_CACHE_DIR=/tmp/ssmcache
b=/tmp/lanes-bundle; [ -d "$b" ] || cp -r "$root/bundle" "$b"
for v in $variants; do
  [ "$(left)" -gt 60 ] || break
  tag="${v//[=,]/_}"
  (OUT=$o/tests_$tag SSM_CUDA_GDN_TUNE=$v SSM_TEST_BINS="test-ssm-cuda-gpu_gdn test-ssm-cuda-gpu_gdn_step" timeout 90 bash "$b/run.sh" tests) \
    >"$o/tests_$tag.log" 2>&1
  echo "tests $v rc=$?"; cat "$o/tests_$tag/summary.txt" 2>/dev/null
done
ncu_args=(--clock-control none --cache-control none --launch-skip 20 --launch-count 1
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section InstructionStats)
for v in default $variants; do
  [ "$(left)" -gt 45 ] || break
  tag="${v//[=,]/_}"; tune=(); [ "$v" = default ] || tune=("SSM_CUDA_GDN_TUNE=$v")
  env "${tune[@]}" timeout 40 ncu "${ncu_args[@]}" --kernel-name regex:gdn_recurrent_kernel "$root/bundle/bin/xtask" bench-cuda-gdn \
    --batches 256 --states f32 --spec-batch 0 --step-batches --conv-batches --copy-bytes 67108864 >"$o/ncu_$tag.txt" 2>&1
  echo "== ncu $v"
  grep -E '^\s+(Duration|Registers Per Thread|Achieved Occupancy|Executed Instructions |Issued Warp Per Scheduler|DRAM Throughput|Block Size)' "$o/ncu_$tag.txt" | head -8
done
if [ "$(left)" -gt 60 ]; then
  ab=("new")
  for v in $variants; do ab+=("new:SSM_CUDA_GDN_TUNE=$v"); done
  (OUT=$o AB_ROUNDS="${LANES_ROUNDS:-2}" AB_BENCH=gdn \
    AB_ARGS="--states f32,bf16 --batches 8,64,256,1024 --spec-batch 64 --step-batches --conv-batches" \
    AB_VARIANTS="${ab[*]}" timeout "$(( $(left) - 5 ))" bash "$here/ab.sh") >"$o/ab.log" 2>&1
  echo "lanes A/B rc=$?"; grep -E "^## |^ours sigmoid" "$o/ab.txt" | head -80
fi
