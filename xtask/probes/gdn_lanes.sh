#!/bin/bash
# The GDN decode's [V,K] route under tuning variants (`SSM_CUDA_GDN_TUNE`), in one device call.
# On sm_90 the default f32 decode runs 16 state elements per thread (32 lanes per row, 4 rows
# per lane) and about 700 instructions per thread, most of them per-thread set-up: the H100
# profile (docs/PERF.md, eighteenth session) counted 3.3x vLLM's instructions at batch 256.
# Variants: `wide=0` (the state's 16-byte stores as plain stores, which NVRTC split into four
# 4-byte ones: the code before the intrinsic), `tpr=16,rpt=4,minb=6` (32 elements per thread,
# 80 registers), `rpt=8,minb=4` (32 elements, 114 registers).
#   1. the GDN tests (LANES_TEST_BINS, gpu_gdn by default) under each of LANES_TEST_VARIANTS
#      (every [V,K] vector specialisation takes it);
#   2. ab.sh: the f32 and bf16 decode and the speculative step (LANES_AB_ARGS: the bench's
#      arguments), default and each variant;
#   3. Nsight Compute over our f32 decode at batch 256, default and each variant.
# From the repository root with the bundle carried:
#   [LANES_VARIANTS="..."] [LANES_TEST_VARIANTS="..."] [LANES_LIMIT=300] bash xtask/probes/gdn_lanes.sh
# Results under $OUT/lanes/: tests_<variant>/summary.txt, ncu_<variant>.txt, ab.txt.
set -u
root="$(pwd)"; o="${OUT:-/tmp/out}/lanes"; mkdir -p "$o"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/probe_env.sh"
t0=$(date +%s); lim="${LANES_LIMIT:-300}"
left() { echo $(( lim - ($(date +%s) - t0) )); }
variants="${LANES_VARIANTS:-wide=0 tpr=16,rpt=4,minb=6 rpt=8,minb=4}"
export SSM_CUDA_CACHE_DIR=/tmp/ssmcache
b=/tmp/lanes-bundle; [ -d "$b" ] || cp -r "$root/bundle" "$b"
for v in ${LANES_TEST_VARIANTS:-tpr=16,rpt=4,minb=6 rpt=8,minb=4}; do
  [ "$(left)" -gt 60 ] || break
  tag="${v//[=,]/_}"
  (OUT=$o/tests_$tag SSM_CUDA_GDN_TUNE=$v SSM_TEST_BINS="${LANES_TEST_BINS:-test-ssm-cuda-gpu_gdn}" timeout 90 bash "$b/run.sh" tests) \
    >"$o/tests_$tag.log" 2>&1
  echo "tests $v rc=$?"; cat "$o/tests_$tag/summary.txt" 2>/dev/null
done
if [ "$(left)" -gt 90 ]; then
  ab=("new")
  for v in $variants; do ab+=("new:SSM_CUDA_GDN_TUNE=$v"); done
  (OUT=$o AB_ROUNDS="${LANES_ROUNDS:-2}" AB_BENCH=gdn \
    AB_ARGS="${LANES_AB_ARGS:---states f32,bf16 --batches 8,64,256,1024 --spec-batch 64 --step-batches --conv-batches}" \
    AB_VARIANTS="${ab[*]}" timeout "$(( $(left) - 40 ))" bash "$here/ab.sh") >"$o/ab.log" 2>&1
  echo "lanes A/B rc=$?"; grep -E "^## |^ours sigmoid" "$o/ab.txt" | head -80
fi
ncu_args=("${ncu_common[@]}" --cache-control none --section InstructionStats)
for v in default $variants; do
  [ "$(left)" -gt 45 ] || break
  tag="${v//[=,]/_}"; tune=(); [ "$v" = default ] || tune=("SSM_CUDA_GDN_TUNE=$v")
  env "${tune[@]}" timeout 40 ncu "${ncu_args[@]}" --kernel-name regex:gdn_recurrent_kernel "$root/bundle/bin/xtask" bench-cuda-gdn \
    --batches 256 --states f32 --spec-batch 0 --step-batches --conv-batches --copy-bytes 67108864 >"$o/ncu_$tag.txt" 2>&1
  echo "== ncu $v"
  ncu_key_lines "$o/ncu_$tag.txt"
done
