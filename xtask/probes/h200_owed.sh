#!/bin/bash
# What the next H200 call owes issues 10 and 12, in one device call, each step skipped when less
# than its time is left of OWED_LIMIT seconds. The twenty-first session ran the previous list
# (docs/PERF.md, "The H200 again"); this one follows from it:
#   1. gdn_lanes.sh's tests with 32 elements per thread (`SSM_CUDA_GDN_TUNE=tpr=16,rpt=4,minb=6`)
#      over the fused decode step, the GDN decode and the attention core: whether the one-token
#      in-place f32 tile may take 16 lanes (the speculative step already does), then its A/B on
#      the decode and the decode step;
#   2. memcheck and racecheck over gpu_gdn (the speculative f32 step's new default tile);
#   3. accept_streams.sh: every test, in streams (the twenty-first session's `run.sh tests`
#      stopped after gpu_split);
#   4. run.sh bench gdn with vLLM (the decode table with the new default, vLLM in the process).
# On any card but an H200 it runs nothing (OWED_ANY_CARD=1 runs it anyway), or with
# OWED_ELSE=lanes only step 1, a lead for the H200. From the repository root with the bundle and
# the vLLM folder (peers/vllm) carried:
#   [OWED_LIMIT=560] [OWED_ELSE=lanes] bash xtask/probes/h200_owed.sh
# Results: $OUT/owed.tgz (every step's OUT), the key lines printed as they come.
set -u
root="$(pwd)"; o="${OUT:-/tmp/out}"; mkdir -p "$o"
here="$(cd "$(dirname "$0")" && pwd)"
name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
echo "card: $name"
case "$name" in
  *H200*) ;;
  *) if [ "${OWED_ELSE:-}" = lanes ]; then
       echo "not an H200: gdn_lanes.sh only"
       OUT="$o" LANES_LIMIT="${OWED_LIMIT:-560}" LANES_TEST_BINS="test-ssm-cuda-gpu_gdn_step test-ssm-cuda-gpu_gdn test-ssm-dispatch-gdn_core" LANES_TEST_VARIANTS=tpr=16,rpt=4,minb=6 LANES_VARIANTS=tpr=16,rpt=4,minb=6 LANES_AB_ARGS="--states f32 --batches 8,64,256,1024 --spec-batch 0 --step-batches 8,64 --conv-batches" bash "$here/gdn_lanes.sh"
       cd "$o" && tar czf /tmp/owed.tgz . && find "$o" -mindepth 1 -delete && mv /tmp/owed.tgz "$o/owed.tgz"
       exit 0
     fi
     [ "${OWED_ANY_CARD:-0}" = 1 ] || { echo "not an H200: nothing run"; exit 0; } ;;
esac
t0=$(date +%s); lim="${OWED_LIMIT:-560}"
el() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( lim - $(el) )); }
vllm="$root/peers/vllm"
export SSM_CUDA_CACHE_DIR=/tmp/ssmcache
(OUT=$o LANES_LIMIT=220 LANES_ROUNDS=1 LANES_TEST_BINS="test-ssm-cuda-gpu_gdn_step test-ssm-cuda-gpu_gdn test-ssm-dispatch-gdn_core" LANES_TEST_VARIANTS=tpr=16,rpt=4,minb=6 LANES_VARIANTS=tpr=16,rpt=4,minb=6 LANES_AB_ARGS="--states f32 --batches 8,64,256,1024 --spec-batch 0 --step-batches 8,64 --conv-batches" bash "$here/gdn_lanes.sh") 2>&1 | tee "$o/lanes.log" | grep -v '^\s*$'
echo "lanes $(el)s"
if [ "$(left)" -gt 100 ]; then
  (OUT=$o/san SSM_SANITIZE_BINS="test-ssm-cuda-gpu_gdn" timeout 90 bash "$root/bundle/run.sh" sanitize) >"$o/san.log" 2>&1
  echo "sanitizer rc=$? $(el)s"; cat "$o/san/summary.txt"
fi
if [ "$(left)" -gt 240 ]; then
  (OUT=$o/accept ACCEPT_STREAMS=5 timeout "$(( $(left) - 10 ))" bash "$here/accept_streams.sh") >"$o/accept.log" 2>&1
  echo "accept rc=$? $(el)s"; grep -v ': ok' "$o/accept/summary-all.txt"; grep -c ': ok' "$o/accept/summary-all.txt"
fi
rm -rf /tmp/owed-bundle && cp -r "$root/bundle" /tmp/owed-bundle
if [ "$(left)" -gt 100 ]; then
  (OUT=$o/bench SSM_BENCH_OPS=gdn PEER_VLLM=$vllm timeout "$(( $(left) - 10 ))" bash /tmp/owed-bundle/run.sh bench) >"$o/bench_gdn.log" 2>&1
  echo "bench gdn rc=$? $(el)s"; grep -E "speedup|^(f32|bf16) " "$o/bench_gdn.log" | head -n 40
fi
cd "$o" && tar czf /tmp/owed.tgz . && find "$o" -mindepth 1 -delete && mv /tmp/owed.tgz "$o/owed.tgz"
