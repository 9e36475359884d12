#!/bin/bash
# The H200 lines issues 10 and 12 still lack, cheapest first, in one device call (about 330 s
# without the A/Bs), each step skipped when less than its time is left of OWED_LIMIT seconds:
#   1. decode_profile.sh: the GDN decode's f32 state at batch 256, ours and vLLM's packed decode;
#   2. ssu_small_profile.sh: the SSU's bf16 one-token decode at batch 1024, ours and vLLM's;
#   3. run.sh tests over gpu_ssu and gpu_conformance, then memcheck and racecheck over
#      every_ssu_algorithm_matches_the_reference;
#   4. gdn_lanes.sh: the GDN decode's tuning variants (plain stores, 32 elements per thread):
#      tests, profile, A/B;
#      run.sh bench ssu with vLLM;
#   5. ab.sh: the bf16 decode at 8 (default), 4 and 2 rows per lane; ab_suite.sh ssu-alg;
#   6. accept_streams.sh: every test, in streams.
# On any card but an H200 it runs nothing (OWED_ANY_CARD=1 runs it anyway), or with
# OWED_ELSE=lanes only step 4's gdn_lanes.sh, a lead for the H200. From the repository root with
# the bundle and the vLLM folder (peers/vllm) carried:
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
       OUT="$o" LANES_LIMIT="${OWED_LIMIT:-560}" bash "$here/gdn_lanes.sh"
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
(OUT=$o/prof PROF_STATES=" " PEER_VLLM=$vllm timeout 70 bash "$here/decode_profile.sh") >"$o/prof.log" 2>&1
echo "gdn profile rc=$? $(el)s"; sed -n '/^==/,$p' "$o/prof.log"
(OUT=$o/sprof PROF_BATCHES=1024 PROF_STATES=bf16 PEER_VLLM=$vllm timeout 50 bash "$here/ssu_small_profile.sh") >"$o/sprof.log" 2>&1
echo "ssu profile rc=$? $(el)s"; sed -n '/^==/,$p' "$o/sprof.log"
rm -rf /tmp/owed-bundle && cp -r "$root/bundle" /tmp/owed-bundle
if [ "$(left)" -gt 160 ]; then
  (OUT=$o/ssut SSM_TEST_BINS="test-ssm-cuda-gpu_ssu test-ssm-cuda-gpu_conformance" timeout 120 bash /tmp/owed-bundle/run.sh tests) >"$o/ssut.log" 2>&1
  echo "ssu tests rc=$? $(el)s"; cat "$o/ssut/summary.txt"
  (OUT=$o/san SAN_BIN=test-ssm-cuda-gpu_ssu SAN_TESTS=every_ssu_algorithm_matches_the_reference SAN_TOOLS="memcheck racecheck" SAN_LIMIT=60 bash "$here/sanitize_tests.sh") >"$o/san.log" 2>&1
  echo "sanitizer rc=$? $(el)s"; cat "$o/san/san.txt"
fi
if [ "$(left)" -gt 230 ]; then
  (OUT=$o LANES_LIMIT=220 bash "$here/gdn_lanes.sh") 2>&1 | tee "$o/lanes.log" | grep -v '^\s*$'
  echo "lanes $(el)s"
fi
if [ "$(left)" -gt 100 ]; then
  (OUT=$o/bench SSM_BENCH_OPS=ssu SSM_BENCH_ARGS="--int8 false" PEER_VLLM=$vllm timeout 90 bash /tmp/owed-bundle/run.sh bench) >"$o/bench_ssu.log" 2>&1
  echo "bench ssu rc=$? $(el)s"; grep -A41 "speedup" "$o/bench_ssu.log" | head -n 42
fi
if [ "$(left)" -gt 150 ]; then
  (OUT=$o/rows AB_ROUNDS=2 AB_BENCH=ssu AB_ARGS="--states bf16 --tokens 1 --batches 8,64,256,1024 --int16 false --int8 false" \
    AB_VARIANTS="new new:SSM_CUDA_SSU_TUNE=rpt=4 new:SSM_CUDA_SSU_TUNE=rpt=2" timeout 140 bash "$here/ab.sh") >"$o/rows.log" 2>&1
  echo "rows per lane rc=$? $(el)s"; grep "of copy" "$o/rows/ab.txt"
fi
if [ "$(left)" -gt 150 ]; then
  (OUT=$o/alg AB_ROUNDS=2 SUITE_TESTS=0 timeout "$(left)" bash "$here/ab_suite.sh" ssu-alg) >"$o/alg.log" 2>&1
  echo "ssu-alg rc=$? $(el)s"; grep "of copy" "$o/alg/ab.txt"
fi
if [ "$(left)" -gt 240 ]; then
  (OUT=$o/accept ACCEPT_STREAMS=5 timeout "$(left)" bash "$here/accept_streams.sh") >"$o/accept.log" 2>&1
  echo "accept rc=$? $(el)s"; grep -v ': ok' "$o/accept/summary-all.txt"; grep -c ': ok' "$o/accept/summary-all.txt"
fi
cd "$o" && tar czf /tmp/owed.tgz . && find "$o" -mindepth 1 -delete && mv /tmp/owed.tgz "$o/owed.tgz"
