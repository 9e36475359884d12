#!/bin/bash
# compute-sanitizer over every test of chosen GPU test binaries, one test per run
# (sanitize_tests.sh), SAN_JOBS runs at a time, so that a device call covers whole families.
# Tests that read the device's free memory (`calls_allocate_no_device_memory`) would see the
# other runs' allocations: they run afterwards, one at a time. From the repository root with
# the bundle carried:
#   [SAN_BINS="test-ssm-cuda-gpu_ssd test-ssm-cuda-gpu_ring"] [SAN_JOBS=4]   (default: every GPU test binary)
#   [SAN_TOOLS="racecheck memcheck"] [SAN_LIMIT=250] bash xtask/probes/sanitize_all.sh
# Each run's line lands in $OUT/san.txt (`tool test rc=… summary`); the totals are printed last.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/probe_env.sh"
serial_re='allocate_no_device_memory'
jobs="$out/san_jobs.txt"; : >"$jobs"; : >"$out/san_serial.txt"
for bin in ${SAN_BINS:-$(cat "$root/bundle/bin/gpu-tests.txt")}; do
  "$root/bundle/bin/$bin" --list --format terse 2>/dev/null | sed -n 's/: test$//p' | while read -r t; do
    if [[ "$t" =~ $serial_re ]]; then echo "$bin $t" >>"$out/san_serial.txt"; else echo "$bin $t" >>"$jobs"; fi
  done
done
echo "sanitize_all: $(wc -l <"$jobs") tests in parallel (${SAN_JOBS:-4} at a time), $(wc -l <"$out/san_serial.txt") after them"
run_one() { SAN_BIN="$1" SAN_TESTS="$2" bash "$here/sanitize_tests.sh" >/dev/null; }
export -f run_one; export here
xargs -P "${SAN_JOBS:-4}" -L 1 bash -c 'run_one "$0" "$1"' <"$jobs"
while read -r bin t; do run_one "$bin" "$t"; done <"$out/san_serial.txt"
runs=$(wc -l <"$out/san.txt")
host=$(grep -c ' no-cuda-call ' "$out/san.txt")
bad=$(grep -v ' no-cuda-call ' "$out/san.txt" | grep -vc ' rc=0 ')
echo "sanitize_all: $runs runs, $bad with a nonzero exit, $host of host-only tests (no CUDA call, passed)"
grep -v ' no-cuda-call ' "$out/san.txt" | grep -v ' rc=0 ' | head -20
grep -ho 'ERROR SUMMARY: [0-9]* error\|RACECHECK SUMMARY: [0-9]* hazard' "$out/san.txt" | sort | uniq -c
