#!/bin/bash
# Nsight Compute over one launch of the conv update (bf16, width 4, Qwen3-Next's 8192 channels,
# silu, one token), ours (`conv_kernel` inside bench-cuda-gdn's graph replay) and vLLM's
# (`_causal_conv1d_update_kernel` inside its peer script), at each batch of CONV_BATCHES:
#   - `--cache-control all`: L2 flushed before every replay pass, so the launch reads its slot
#     table, window and row from DRAM as the bench's rotating pools make it do, where earlier
#     reports (`--cache-control none`) were L2-warm;
#   - `--section SourceCounters`: where the warps wait, by SASS instruction
#     ($OUT/sass_conv_<who>_b<batch>.csv: each instruction's stall samples).
# Whether ours waits on more dependent memory round trips than vLLM's at batch 1 and 8.
# From the repository root with the bundle and the vLLM folder carried:
#   [CONV_BATCHES="1 8"] PEER_VLLM=peers/vllm bash xtask/probes/conv_profile.sh
# Reports: $OUT/ncu_conv_<who>_b<batch>.{txt,ncu-rep}, the key lines printed last.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/probe_env.sh"
ncu_args=("${ncu_common[@]}" --cache-control all --section WarpStateStats --section SourceCounters)
for b in ${CONV_BATCHES:-1 8}; do
  ncu "${ncu_args[@]}" -o "$out/ncu_conv_ours_b$b" --kernel-name regex:conv_kernel "$root/bundle/bin/xtask" \
    bench-cuda-gdn --batches 1 --states bf16 --spec-batch 0 --step-batches --conv-batches "$b" \
    --copy-bytes 67108864 >"$out/run_ours_b$b.log" 2>&1
  shapes="[{\"op\": \"conv\", \"batch\": $b, \"state\": \"bf16\", \"tokens\": 1, \"heads\": 16, \"v_heads\": 32, \"k\": 128, \"v\": 128}]"
  ncu "${ncu_args[@]}" -o "$out/ncu_conv_vllm_b$b" --kernel-name regex:causal_conv1d_update python3 \
    "$root/bundle/peers/gdn_peer.py" --vllm "${PEER_VLLM:-$root/peers/vllm}" --shapes "$shapes" \
    >"$out/run_vllm_b$b.log" 2>&1
  for who in ours vllm; do
    r="$out/ncu_conv_${who}_b$b.ncu-rep"
    ncu -i "$r" --page details >"${r%.ncu-rep}.txt" 2>&1
    ncu -i "$r" --page source --print-source sass --csv >"$out/sass_conv_${who}_b$b.csv" 2>&1
  done
done
for f in "$out"/ncu_conv_*.txt; do
  echo "== $(basename "$f")"
  ncu_key_lines "$f"
done
# The ten SASS instructions with the most stall samples, per report (columns as ncu names them).
for f in "$out"/sass_conv_*.csv; do
  echo "== $(basename "$f")"
  python3 - "$f" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hdr = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" in c for c in r)), None)
if hdr is None:
    print("\n".join(",".join(r) for r in rows[:5])); sys.exit()
h = rows[hdr]; body = [r for r in rows[hdr + 1:] if len(r) == len(h)]
col = next((i for i, c in enumerate(h) if "Warp Stall Sampling (All" in c), None)
src = next((i for i, c in enumerate(h) if c == "Source"), 1)
if col is None:
    print("columns:", h); sys.exit()
tot = sum(float(r[col] or 0) for r in body) or 1
for r in sorted(body, key=lambda r: -float(r[col] or 0))[:10]:
    print(f"{float(r[col] or 0) / tot:6.1%}  {r[0]}  {r[src]}")
PY
done
