#!/bin/bash
# Nsight Compute over our SSU kernel and vLLM's at small batches, one token, both state dtypes:
# one launch each, profiled inside the bench's graph replay over rotating pools (caches and
# clocks uncontrolled, as the bench runs), so the launch's duration, occupancy, warp stalls and
# instruction counts at batch 1 and 8 sit beside vLLM's. From the repository root with the
# bundle and the vLLM folder carried:
#   [PROF_BATCHES="1 8"] [PROF_STATES="f32 bf16"] PEER_VLLM=peers/vllm bash xtask/probes/ssu_small_profile.sh
# Reports: $OUT/ncu_ssu_{ours,vllm}_<state>_b<batch>.txt.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
. "$(dirname "$0")/probe_env.sh"
ncu_args=("${ncu_common[@]}" --cache-control none --section WarpStateStats --section InstructionStats
  --section MemoryWorkloadAnalysis)
for st in ${PROF_STATES:-f32 bf16}; do
  for b in ${PROF_BATCHES:-1 8}; do
    ncu "${ncu_args[@]}" --kernel-name regex:ssu_kernel "$root/bundle/bin/xtask" bench-cuda-ssu \
      --batches "$b" --states "$st" --tokens 1 --int16 false --int8 false --copy-bytes 67108864 \
      >"$out/ncu_ssu_ours_${st}_b$b.txt" 2>&1
    shapes="[{\"batch\": $b, \"state\": \"$st\", \"tokens\": 1, \"heads\": 80, \"dim\": 64, \"dstate\": 128, \"groups\": 1}]"
    ncu "${ncu_args[@]}" --kernel-name regex:selective_scan_update python3 "$root/bundle/peers/ssu_peer.py" \
      --vllm "${PEER_VLLM:-$root/peers/vllm}" --shapes "$shapes" >"$out/ncu_ssu_vllm_${st}_b$b.txt" 2>&1
  done
done
for f in "$out"/ncu_ssu_*.txt; do
  echo "== $(basename "$f")"
  ncu_key_lines "$f"
done
