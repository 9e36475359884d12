#!/bin/bash
# compute-sanitizer over chosen tests of one GPU test binary, one test per run (`--exact`), so that
# a binary whose host reference is slow can be checked test by test; kernels cached outside the
# carried bundle (a carried path is replaced on each call, its cache with it). From the repository
# root with the bundle carried:
#   SAN_TESTS="ssd_pool_addressing_equals_gather_call_scatter" [SAN_BIN=test-ssm-cuda-gpu_ssd]
#   [SAN_TOOLS="racecheck memcheck"] [SAN_LIMIT=250] bash xtask/probes/sanitize_tests.sh
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
. "$(dirname "$0")/probe_env.sh"
export SSM_REQUIRE_GPU=1 INSTA_WORKSPACE_ROOT="$root/bundle/workspace" INSTA_UPDATE=no CI=true
b="$root/bundle/bin/${SAN_BIN:-test-ssm-cuda-gpu_ssd}"
for tool in ${SAN_TOOLS:-racecheck memcheck}; do
  for t in ${SAN_TESTS}; do
    log="$out/san-$tool-$(basename "$b")-$t.log"
    (cd "$out" && timeout "${SAN_LIMIT:-250}" compute-sanitizer --tool $tool --error-exitcode 99 "$b" --test-threads=1 --exact "$t") > "$log" 2>&1
    rc=$?
    # A host-only test (no CUDA call) ends the sanitizer with 255 and this line: say so, as run.sh does.
    if [ $rc -eq 255 ] && grep -q 'terminated before first instrumented API call' "$log" \
        && grep -qE '^test result: ok' "$log"; then
      echo "$tool $(basename "$b") $t no-cuda-call $(grep -E '^test result' "$log" | sed 's/; finished.*//')" | tee -a "$out/san.txt"
      continue
    fi
    echo "$tool $(basename "$b") $t rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$log" | sed 's/; finished.*//' | tr '\n' ' ')" | tee -a "$out/san.txt"
  done
done
