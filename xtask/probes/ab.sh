#!/bin/bash
# A/B on the GPU machine: a base xtask against the bundle's, alternating, in one device call.
# Build the base here in a worktree of the base commit (`CARGO_TARGET_DIR=/tmp/base-target cargo
# build --release -p xtask`), `xz -c /tmp/base-target/release/xtask > abbase/xtask.xz` (abbase/ is
# git-ignored), build the bundle of the new tree, and carry both:
#   AB_BENCH=ssd AB_ARGS="--states f32 --mamba2 1x2048" AB_ROUNDS=2 bash xtask/probes/ab.sh
# AB_VARIANTS lists what each round runs, in order: `base`, `new`, or `new:VAR=VALUE` (the
# bundle's xtask with one tuning variable set, e.g. `new:SSM_CUDA_CKPT_TUNE=tpr=16,minb=6`).
# Results (the bench's table lines) in $OUT/ab.txt.
set -u
root="$(pwd)"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
xz -dkf abbase/xtask.xz && chmod +x abbase/xtask
. "$(dirname "$0")/probe_env.sh"
bench="${AB_BENCH:-ssd}"
args="${AB_ARGS:---states f32 --mamba2 1x2048,4x2048,16x512,1x16384 --nemotron 4x2048}"
rounds="${AB_ROUNDS:-2}"
log="$out/ab.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log"
echo "# bench-cuda-$bench $args" >> "$log"
for r in $(seq 1 "$rounds"); do
  for v in ${AB_VARIANTS:-base new}; do
    tune=()
    case "$v" in
      base) x="$root/abbase/xtask"; cache="$root/abbase/.cache" ;;
      new) x="$root/bundle/bin/xtask"; cache=/tmp/ssmcache ;;
      new:*) x="$root/bundle/bin/xtask"; cache=/tmp/ssmcache; tune=("${v#new:}") ;;
      *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
    echo "## $bench $v $r" >> "$log"
    # shellcheck disable=SC2086 # AB_ARGS is a list of options, split on purpose
    env SSM_CUDA_CACHE_DIR="$cache" "${tune[@]}" timeout 200 "$x" "bench-cuda-$bench" $args 2>&1 \
      | grep -E '^(shape|state|h[0-9]|f32|bf16|ours)|copy|rror' >> "$log"
  done
done
cat "$log"
