# Sourced by the probes (`. "$here/probe_env.sh"` with $root the repository root): the device's
# NVRTC on the library path, the bundle's vectors and a kernel cache, and the bundle's binaries
# unpacked once.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; fi
done
export SSM_CONFORMANCE_DIR="$root/bundle/vectors" SSM_CUDA_CACHE_DIR="${SSM_CUDA_CACHE_DIR:-/tmp/ssmcache}"
[ -x "$root/bundle/bin/xtask" ] || { mkdir -p "$root/bundle/bin" && tar xJf "$root/bundle/bin.tar.xz" -C "$root/bundle/bin"; }

# The key lines of an Nsight Compute report (`ncu --page details` text, file $1), at most $2 (18):
# the probes' summaries print these for each report.
ncu_key_lines() {
  grep -E '^\s+(Duration|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Grid Size|Block Size|Executed Instructions |Issued Warp Per Scheduler|Issue Slots Busy|No Eligible|Warp Cycles Per Issued Instruction|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|SM Active Cycles|Elapsed Cycles)' "$1" | head -n "${2:-18}"
}

# What every profiling probe asks of Nsight Compute: one launch after 20 (past the warm-up),
# clocks as the bench runs them, and the sections each summary reads. Each probe adds its cache
# control and any further sections.
ncu_common=(--clock-control none --launch-skip 20 --launch-count 1
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats)
