#!/bin/bash
# What branch ring-invariant owes before it lands, in one device call on any card: ReplaySSM's
# lanes per state row from dstate alone (16 up to 128) instead of 8 for multi-token steps under
# 2048 (sequence, head) blocks.
#   1. gpu_ring and gpu_reliability (the bit-identity tests) with the bundle's default;
#   2. memcheck and racecheck over gpu_ring;
#   3. the A/B of the small multi-token steps: the default (16 lanes, 4 blocks per SM) against the
#      old 8 lanes (`SSM_CUDA_CKPT_TUNE=tpr=8`), two rounds, batch 8 / 16 / 25 at 4 tokens.
# From the repository root with the bundle carried: bash xtask/probes/ring_lanes.sh
# Results: $OUT/ring.tgz, the key lines printed as they come.
set -u
root="$(pwd)"; o="${OUT:-/tmp/out}"; mkdir -p "$o"
here="$(cd "$(dirname "$0")" && pwd)"
export SSM_CUDA_CACHE_DIR=/tmp/ssmcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(OUT=$o/t SSM_TEST_BINS="test-ssm-cuda-gpu_ring test-ssm-fuzz-gpu_reliability" timeout 200 bash "$root/bundle/run.sh" tests) >"$o/tests.log" 2>&1
echo "tests rc=$? ${SECONDS}s"; cat "$o/t/summary.txt"
(OUT=$o/san SSM_SANITIZE_BINS="test-ssm-cuda-gpu_ring" timeout 120 bash "$root/bundle/run.sh" sanitize) >"$o/san.log" 2>&1
echo "sanitizer rc=$? ${SECONDS}s"; cat "$o/san/summary.txt"
mkdir -p "$root/abbase" && [ -f "$root/abbase/xtask.xz" ] || xz -c "$root/bundle/bin/xtask" >"$root/abbase/xtask.xz"
(OUT=$o/ab AB_BENCH=ssu AB_ARGS="--batches 8,16,25 --tokens 4 --int16 false --int8 false" AB_ROUNDS=2 \
  AB_VARIANTS="new new:SSM_CUDA_CKPT_TUNE=tpr=8" timeout 200 bash "$here/ab.sh") >"$o/ab.log" 2>&1
echo "ab rc=$? ${SECONDS}s"; grep -iE "##|checkpoint|replay|copy" "$o/ab/ab.txt" | cut -c1-140
cd "$o" && tar czf /tmp/ring.tgz . && find "$o" -mindepth 1 -delete && mv /tmp/ring.tgz "$o/ring.tgz"
