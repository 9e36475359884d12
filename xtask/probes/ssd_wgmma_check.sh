#!/usr/bin/env bash
# The SSD's wgmma form on the GPU machine, in one device call, most important first: the layout
# probe, gpu_ssd with SSM_CUDA_SSD_TUNE=wg=7, the A/B against the default, vLLM's peer, the
# conformance and mixer tests, the sanitizer (docs/PERF.md, "The SSD's products on wgmma").
# From the repository root with `cargo xtask gpu-bundle bundle` carried, and the vLLM wheel
# extracted under peers/vllm:  OUT=/some/dir bash xtask/probes/ssd_wgmma_check.sh
set -u
root="$PWD"; B="$root/bundle"; O="$OUT"; L="$O/all.log"
export SSM_CUDA_CACHE_DIR="$B/.cubin-cache" LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log() { echo "== $(date +%T) $*" | tee -a "$L"; }
[ -x "$B/bin/xtask" ] || bash "$B/run.sh" none >>"$L" 2>&1
X="$B/bin/xtask"; S="--states f32 --mamba2 1x2048,4x2048,16x512,1x16384 --nemotron 4x2048"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >>"$O/summary.txt"
log probe; nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/wl "$root/xtask/probes/wgmma_layouts.cu" >/dev/null 2>&1 && /tmp/wl >"$O/probe.txt" 2>&1
tests() { log "tests wg=7 $1"; mkdir -p "$O/t"; OUT="$O/t" SSM_CUDA_SSD_TUNE=wg=7 SSM_TEST_BINS="$1" timeout 100 bash "$B/run.sh" tests >>"$L" 2>&1
  sed 's/^/[wg=7] /' "$O/t/summary.txt" >>"$O/summary.txt"; grep -h "panicked" "$O"/t/*.log | head -20 >>"$L"; rm -rf "$O/t"; }
tests test-ssm-cuda-gpu_ssd
for v in ${AB:-default wg=7 default wg=7 wg=7,scan_kt=64,scan_minb=4}; do
  t=$v; [ "$t" = default ] && t=""
  log "bench [$v]"; SSM_CUDA_SSD_TUNE=$t timeout 50 "$X" bench-cuda-ssd $S >"$O/b.txt" 2>&1
  echo "## $v" >>"$O/bench_ab.txt"; grep -v '^$' "$O/b.txt" | tail -n 6 >>"$O/bench_ab.txt"
done; rm -f "$O/b.txt"
log "peer wg=7"; SSM_CUDA_SSD_TUNE=wg=7 timeout 90 "$X" bench-cuda-ssd --peer-vllm "$root/peers/vllm" --peer-script "$B/peers/ssd_peer.py" $S --json "$O/bench_ssd_wg7.json" >"$O/bench_peer.txt" 2>&1
tests "test-ssm-cuda-gpu_conformance test-ssm-dispatch-mamba2_core test-ssm-dispatch-gpu_core"
log "sanitize wg=7"; mkdir -p "$O/s"; OUT="$O/s" SSM_CUDA_SSD_TUNE=wg=7 SSM_SANITIZE_BINS="test-ssm-cuda-gpu_ssd" timeout 150 bash "$B/run.sh" sanitize >>"$L" 2>&1
sed 's/^/[wg=7] /' "$O/s/summary.txt" >>"$O/summary.txt"; rm -rf "$O/s"
log done
