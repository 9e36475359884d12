#!/bin/bash
# run.sh's tests, conformance, examples and python in one device call: the bundle is copied
# outside the workspace (it must pass wherever it is unpacked), its examples run first (which
# unpacks bin/ once), then the GPU test binaries in ACCEPT_STREAMS groups and the CPU tests +
# conformance + python as one more stream, all in parallel, each with its own OUT. From the
# repository root with the bundle carried:
#   [ACCEPT_STREAMS=4] [ACCEPT_DIR=/tmp/ssm-bundle] bash xtask/probes/accept_streams.sh
# Every stream's summary lines are printed last ($OUT/summary-all.txt); the exit status is
# nonzero if any stream failed. Tests that read the device's free memory
# (`calls_allocate_no_device_memory`) would see the other streams' allocations: the GPU streams
# skip them (run.sh's SSM_TEST_ARGS), and they run afterwards, one binary at a time, once every
# stream has finished (their own lines in $OUT/alloc, so a binary has two summary lines).
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
dest="${ACCEPT_DIR:-/tmp/ssm-bundle}"
rm -rf "$dest" && cp -r "$root/bundle" "$dest" && rm -rf "$dest/bin" "$dest/out"
export SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-/tmp/ssmcache}"
OUT="$out/examples" bash "$dest/run.sh" examples >"$out/examples.log" 2>&1
mapfile -t gpu < <(grep -v '^$' "$dest/bin/gpu-tests.txt")
cpu=()
for t in "$dest"/bin/test-*; do
  n="$(basename "$t")"
  printf '%s\n' "${gpu[@]}" | grep -qx "$n" || cpu+=("$n")
done
streams="${ACCEPT_STREAMS:-4}"
alloc=allocate_no_device_memory
groups=()
for i in "${!gpu[@]}"; do groups[$((i % streams))]+="${gpu[$i]} "; done
pids=()
for i in "${!groups[@]}"; do
  OUT="$out/gpu$i" SSM_TEST_BINS="${groups[$i]}" SSM_TEST_ARGS="--skip $alloc" bash "$dest/run.sh" tests >"$out/gpu$i.log" 2>&1 &
  pids+=($!)
done
OUT="$out/cpu" SSM_TEST_BINS="${cpu[*]}" bash "$dest/run.sh" tests conformance python >"$out/cpu.log" 2>&1 &
pids+=($!)
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
serial=()
for b in "${gpu[@]}"; do
  "$dest/bin/$b" --list --format terse 2>/dev/null | grep -q "$alloc" && serial+=("$b")
done
if [ ${#serial[@]} -gt 0 ]; then
  OUT="$out/alloc" SSM_TEST_BINS="${serial[*]}" SSM_TEST_ARGS="$alloc" bash "$dest/run.sh" tests >"$out/alloc.log" 2>&1 || status=1
fi
cat "$out"/*/summary.txt | grep -v '^$' >"$out/summary-all.txt"
echo "accept_streams: $(grep -c ': ok' "$out/summary-all.txt") ok, $(grep -c 'FAILED' "$out/summary-all.txt") failed"
cat "$out/summary-all.txt"
exit $status
