#!/usr/bin/env bash
# Nsight Compute over one call of each prefill, ours and vLLM's side by side, on the GPU machine:
# the SSD (Mamba2-2.7B, 1 × 2048, f32 pool) and GDN's chunked prefill (Qwen3-Next, 1 × 2048,
# f32 pool). Every kernel of the call with the full section set and its per-SASS-instruction
# source counters (instructions executed, stall samples by reason), caches left warm
# (`--cache-control none`, as in a call: the products read the scratch their producer wrote
# into the L2), clocks not locked. vLLM's kernels are the ones its timed graph ran (the peer
# scripts' SSM_PEER_PROFILE_RANGE=1: one eager call after warm-up inside a profiler range).
# From the repository root with `cargo xtask gpu-bundle bundle` carried and the vLLM wheel
# extracted under peers/vllm:  OUT=/some/dir bash xtask/probes/prefill_profile.sh [ssd|gdn|all]
# Leaves $OUT/summary.txt and $OUT/profiles.tgz (per report: `--page details` and `--page source
# --print-source sass`, both CSV) and the device-compiled cubins.
set -u
root="$PWD"; B="$root/bundle"; O="$OUT"; L="$O/all.log"; P="$O/p"; which=${1:-all}
mkdir -p "$P"
export SSM_CUDA_CACHE_DIR="$B/.cubin-cache" LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log() { echo "== $(date +%T) $*" | tee -a "$L"; }
[ -x "$B/bin/xtask" ] || bash "$B/run.sh" none >>"$L" 2>&1
X="$B/bin/xtask"
NCU=(ncu --clock-control none --cache-control none --set full --import-source no)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >>"$O/summary.txt"
ncu --version | tail -n 1 >>"$O/summary.txt"
# Bytes and FLOPs as the benches count them (docs/perf/*_cuda_h200_340cef1.json): the peer scripts
# size their rotating pools from the bytes, and a 0 there stopped the GDN peer (twenty-first session).
SSD_SHAPE='[{"batch":1,"seqlen":2048,"tokens":2048,"state":"f32","heads":80,"dim":64,"dstate":128,"groups":1,"chunk":256,"bytes":48562176,"flops":8130920448.0}]'
GDN_SHAPE='[{"batch":1,"seqlen":2048,"tokens":2048,"state":"f32","heads":16,"v_heads":32,"k":128,"v":128,"bytes":54919168,"flops":9168748544.0}]'
if [ "$which" != gdn ]; then
  log "ours ssd"; timeout 200 "${NCU[@]}" --kernel-name regex:ssd_ --launch-skip 12 --launch-count 6 -o "$P/ours_ssd" \
    "$X" bench-cuda-ssd --states f32 --mamba2 1x2048 --nemotron "" >>"$L" 2>&1
  log "vllm ssd"; SSM_PEER_PROFILE_RANGE=1 PYTHONUNBUFFERED=1 timeout 200 "${NCU[@]}" --profile-from-start off -o "$P/vllm_ssd" \
    python3 "$B/peers/ssd_peer.py" --vllm "$root/peers/vllm" --shapes "$SSD_SHAPE" >>"$L" 2>&1
fi
if [ "$which" != ssd ]; then
  log "ours gdn"; timeout 200 "${NCU[@]}" --kernel-name regex:gdn_chunk_ --launch-skip 12 --launch-count 5 -o "$P/ours_gdn" \
    "$X" bench-cuda-gdn-chunk --states f32 --qwen3-next 1x2048 >>"$L" 2>&1
  log "vllm gdn"; SSM_PEER_PROFILE_RANGE=1 PYTHONUNBUFFERED=1 timeout 200 "${NCU[@]}" --profile-from-start off -o "$P/vllm_gdn" \
    python3 "$B/peers/gdn_chunk_peer.py" --vllm "$root/peers/vllm" --shapes "$GDN_SHAPE" >>"$L" 2>&1
fi
for r in "$P"/*.ncu-rep; do
  [ -e "$r" ] || continue
  n=$(basename "$r" .ncu-rep)
  ncu -i "$r" --page details --csv >"$P/${n}_details.csv" 2>>"$L"
  ncu -i "$r" --page source --csv --print-source sass >"$P/${n}_sass.csv" 2>>"$L"
  # One line per kernel: name, duration, instructions executed, registers, achieved occupancy.
  ncu -i "$r" --page raw --csv --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
    >"$P/${n}_raw.csv" 2>>"$L"
  echo "## $n" >>"$O/summary.txt"; cut -c1-400 "$P/${n}_raw.csv" >>"$O/summary.txt"
done
# The device-compiled cubins of the profiled kernels (built with `-lineinfo`): `nvdisasm -gi`
# maps each sampled SASS address of the CSVs to its source line.
for c in "$SSM_CUDA_CACHE_DIR"/*.cubin; do
  [ -e "$c" ] || continue
  n=$(grep -ao -m1 -E "(ssd|gdn_chunk)_[a-z]+_kernel" "$c" | head -n1)
  [ -n "$n" ] && cp "$c" "$P/${n}_$(basename "$c")"
done
tar czf "$O/profiles.tgz" -C "$P" $(cd "$P" && ls *.csv *.cubin 2>/dev/null)
rm -rf "$P"
log done
