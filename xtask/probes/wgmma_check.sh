#!/usr/bin/env bash
# The `wgmma` forms on the GPU machine, in one device call, most important first: the layout
# probe; the SSD's form (SSM_CUDA_SSD_TUNE=wg=7) and GDN prefill's output kernel
# (SSM_CUDA_GDN_CHUNK_TUNE=wg=1), each tested, then timed against the default in alternating
# runs; vLLM's SSD peer; the conformance and mixer tests; the sanitizer (docs/PERF.md, "The SSD's
# products on wgmma" and the GDN output kernel's section after it).
# From the repository root with `cargo xtask gpu-bundle bundle` carried, and the vLLM wheel
# extracted under peers/vllm:  OUT=/some/dir bash xtask/probes/wgmma_check.sh
set -u
root="$PWD"; B="$root/bundle"; O="$OUT"; L="$O/all.log"
export SSM_CUDA_CACHE_DIR="$B/.cubin-cache" LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log() { echo "== $(date +%T) $*" | tee -a "$L"; }
[ -x "$B/bin/xtask" ] || bash "$B/run.sh" none >>"$L" 2>&1
X="$B/bin/xtask"
SSD="--states f32 --mamba2 1x2048,4x2048,16x512,1x16384 --nemotron 4x2048"
GDN="--states f32 --qwen3-next 1x2048,4x2048,1x8192"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >>"$O/summary.txt"
log probe; nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/wl "$root/xtask/probes/wgmma_layouts.cu" >/dev/null 2>&1 && timeout 20 /tmp/wl >"$O/probe.txt" 2>&1
# tests TAG ENV BINS: run.sh tests over BINS with ENV set, summary lines tagged.
tests() { log "tests [$1] $3"; mkdir -p "$O/t"; env OUT="$O/t" $2 SSM_TEST_BINS="$3" timeout 100 bash "$B/run.sh" tests >>"$L" 2>&1
  sed "s/^/[$1] /" "$O/t/summary.txt" >>"$O/summary.txt"; grep -h "panicked" "$O"/t/*.log | head -20 >>"$L"; rm -rf "$O/t"; }
# ab VAR CMD ARGS VARIANTS…: the bench under each value of VAR in turn ("default": unset).
ab() { local var=$1 cmd=$2 args=$3; shift 3; for v in "$@"; do t=$v; [ "$t" = default ] && t=""
  log "$cmd [$v]"; env "$var=$t" timeout 45 "$X" $cmd $args >"$O/b.txt" 2>&1
  echo "## $cmd $var=$v" >>"$O/bench_ab.txt"; grep -v '^$' "$O/b.txt" | tail -n 6 >>"$O/bench_ab.txt"; done; rm -f "$O/b.txt"; }
tests ssd-wg7 SSM_CUDA_SSD_TUNE=wg=7 test-ssm-cuda-gpu_ssd
tests gdn-wg1 SSM_CUDA_GDN_CHUNK_TUNE=wg=1 test-ssm-cuda-gpu_gdn_chunk
ab SSM_CUDA_SSD_TUNE bench-cuda-ssd "$SSD" default wg=7 default wg=7
ab SSM_CUDA_GDN_CHUNK_TUNE bench-cuda-gdn-chunk "$GDN" default wg=1 default wg=1
log "ssd peer wg=7"; SSM_CUDA_SSD_TUNE=wg=7 timeout 90 "$X" bench-cuda-ssd --peer-vllm "$root/peers/vllm" --peer-script "$B/peers/ssd_peer.py" $SSD --json "$O/bench_ssd_wg7.json" >"$O/bench_peer.txt" 2>&1
tests both "SSM_CUDA_SSD_TUNE=wg=7 SSM_CUDA_GDN_CHUNK_TUNE=wg=1" "test-ssm-cuda-gpu_conformance test-ssm-dispatch-mamba2_core test-ssm-dispatch-gpu_core"
log "sanitize"; mkdir -p "$O/s"; OUT="$O/s" SSM_CUDA_SSD_TUNE=wg=7 SSM_CUDA_GDN_CHUNK_TUNE=wg=1 SSM_SANITIZE_BINS="test-ssm-cuda-gpu_ssd test-ssm-cuda-gpu_gdn_chunk" timeout 150 bash "$B/run.sh" sanitize >>"$L" 2>&1
sed 's/^/[wg] /' "$O/s/summary.txt" >>"$O/summary.txt"; rm -rf "$O/s"
log done
