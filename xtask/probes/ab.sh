#!/bin/bash
# A/B on the GPU machine: a base xtask against the bundle's, alternating, in one device call.
# Build the base here in a worktree of the base commit (`CARGO_TARGET_DIR=/tmp/base-target cargo
# build --release -p xtask`), `xz -c /tmp/base-target/release/xtask > abbase/xtask.xz` (abbase/ is
# git-ignored), build the bundle of the new tree, and carry both:
#   AB_ARGS="--states f32 --mamba2 1x2048" AB_ROUNDS=2 bash xtask/probes/ab.sh   (ssd; results in $OUT/ab.txt)
set -u
root="$(pwd)"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
xz -dkf abbase/xtask.xz && chmod +x abbase/xtask
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
done
export SSM_CONFORMANCE_DIR="$root/bundle/vectors"
newx="$root/bundle/bin/xtask"
[ -x "$newx" ] || newx="$out/bin/xtask"
args="${AB_ARGS:---states f32 --mamba2 1x2048,4x2048,16x512,1x16384 --nemotron 4x2048}"
rounds="${AB_ROUNDS:-2}"
log="$out/ab.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log"
echo "# args: $args" >> "$log"
for r in $(seq 1 "$rounds"); do
  for v in base new; do
    if [ $v = base ]; then x="$root/abbase/xtask"; export SSM_CUDA_CACHE_DIR="$root/abbase/.cache"; else x="$newx"; export SSM_CUDA_CACHE_DIR="$root/bundle/.cubin-cache"; fi
    echo "## ssd $v $r" >> "$log"
    timeout 200 "$x" bench-cuda-ssd $args 2>&1 | grep -E '^(shape|h[0-9])|copy|error|Error' >> "$log"
  done
done
cat "$log"
