#!/bin/bash
# Nsight Compute over one launch of each decode kernel whose H200 figure misses its target by
# more than the H100's did, inside the bench's graph replay over rotating pools (caches and
# clocks uncontrolled, as the bench runs): whether it streams at the memory's rate or waits on
# its own instruction stream.
#   replay_<state>_b64 / plain_<state>_b64: ReplaySSM's checkpointing SSU and the plain
#     speculative SSU on the same 4-token step (Mamba2-2.7B shapes);
#   gdn_f32_b256 / packed_f32_b256: our GDN decode (sigmoid gating) and vLLM's packed decode.
# From the repository root with the bundle and the vLLM folder carried:
#   [PROF_STATES="bf16"] [PROF_GDN=1] PEER_VLLM=peers/vllm bash xtask/probes/decode_profile.sh
# Reports: $OUT/ncu_<case>.txt, their key lines printed last.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/probe_env.sh"
ncu_args=("${ncu_common[@]}" --cache-control none --section WarpStateStats --section InstructionStats
  --section MemoryWorkloadAnalysis)
for st in ${PROF_STATES:-bf16}; do
  for k in replay:checkpointing_ssu_kernel plain:ssu_kernel; do
    ncu "${ncu_args[@]}" --kernel-name "regex:${k#*:}" "$root/bundle/bin/xtask" bench-cuda-ssu \
      --batches 64 --states "$st" --tokens 4 --int16 false --int8 false --copy-bytes 67108864 \
      >"$out/ncu_${k%%:*}_${st}_b64.txt" 2>&1
  done
done
if [ "${PROF_GDN:-1}" = 1 ]; then
  ncu "${ncu_args[@]}" --kernel-name regex:gdn_recurrent_kernel "$root/bundle/bin/xtask" bench-cuda-gdn \
    --batches 256 --states f32 --spec-batch 0 --step-batches 1 --conv-batches 1 --copy-bytes 67108864 \
    >"$out/ncu_gdn_f32_b256.txt" 2>&1
  shapes='[{"op": "sigmoid", "batch": 256, "state": "f32", "tokens": 1, "heads": 16, "v_heads": 32, "k": 128, "v": 128}]'
  ncu "${ncu_args[@]}" --kernel-name regex:packed_decode python3 "$root/bundle/peers/gdn_peer.py" \
    --vllm "${PEER_VLLM:-$root/peers/vllm}" --shapes "$shapes" >"$out/ncu_packed_f32_b256.txt" 2>&1
fi
for f in "$out"/ncu_*.txt; do
  echo "== $(basename "$f")"
  ncu_key_lines "$f"
done
