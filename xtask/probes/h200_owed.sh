#!/bin/bash
# What the next H200 call owes issues 10 and 12, in one device call, each step skipped when less
# than its time is left of OWED_LIMIT seconds. The twenty-second session (docs/PERF.md, "Batch
# invariance restored") ran every test on an H100 and the GDN benches with vLLM on the H200, and
# settled the one-token f32 tile's lanes (32: the fused step's kernel covers only those); so:
#   1. memcheck and racecheck over gpu_gdn and gpu_gdn_step (gpu_gdn passed them on the H200
#      with the speculative f32 tile on 16 lanes at every batch; the step's tests with it);
#   2. accept_streams.sh: every test, in streams, on the H200 (on the H100 all passed but
#      gpu_reliability, fixed since and passed on the H200 alone);
#   3. run.sh bench ssu with vLLM (issue 12's table on the bundle's head).
# On any card but an H200 it runs nothing (OWED_ANY_CARD=1 runs it anyway). From the repository
# root with the bundle and the vLLM folder (peers/vllm) carried:
#   [OWED_LIMIT=560] bash xtask/probes/h200_owed.sh
# Results: $OUT/owed.tgz (every step's OUT), the key lines printed as they come.
set -u
root="$(pwd)"; o="${OUT:-/tmp/out}"; mkdir -p "$o"
here="$(cd "$(dirname "$0")" && pwd)"
name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
echo "card: $name"
case "$name" in
  *H200*) ;;
  *) [ "${OWED_ANY_CARD:-0}" = 1 ] || { echo "not an H200: nothing run"; exit 0; } ;;
esac
t0=$(date +%s); lim="${OWED_LIMIT:-560}"
el() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( lim - $(el) )); }
vllm="$root/peers/vllm"
export SSM_CUDA_CACHE_DIR=/tmp/ssmcache
if [ "$(left)" -gt 160 ]; then
  (OUT=$o/san SSM_SANITIZE_BINS="test-ssm-cuda-gpu_gdn test-ssm-cuda-gpu_gdn_step" timeout 150 bash "$root/bundle/run.sh" sanitize) >"$o/san.log" 2>&1
  echo "sanitizer rc=$? $(el)s"; cat "$o/san/summary.txt"
fi
if [ "$(left)" -gt 240 ]; then
  (OUT=$o/accept ACCEPT_STREAMS=5 timeout "$(( $(left) - 10 ))" bash "$here/accept_streams.sh") >"$o/accept.log" 2>&1
  echo "accept rc=$? $(el)s"; grep -v ': ok' "$o/accept/summary-all.txt"; grep -c ': ok' "$o/accept/summary-all.txt"
fi
rm -rf /tmp/owed-bundle && cp -r "$root/bundle" /tmp/owed-bundle
if [ "$(left)" -gt 100 ]; then
  (OUT=$o/bench SSM_BENCH_OPS=ssu PEER_VLLM=$vllm timeout "$(( $(left) - 10 ))" bash /tmp/owed-bundle/run.sh bench) >"$o/bench_ssu.log" 2>&1
  echo "bench ssu rc=$? $(el)s"; grep -E "speedup|^(f32|bf16) " "$o/bench_ssu.log" | head -n 40
fi
cd "$o" && tar czf /tmp/owed.tgz . && find "$o" -mindepth 1 -delete && mv /tmp/owed.tgz "$o/owed.tgz"
