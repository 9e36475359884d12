#!/usr/bin/env bash
# Valgrind memcheck over the CPU kernels' tests and a bounded fuzz run, on the AVX2 lanes and on
# the portable (`wide`) lanes. Installs valgrind from Debian's packages when it is missing.
# Exit status: non-zero on any memcheck error (or a failing test).
#
#   bash ci/valgrind.sh            # both lane sets
#   SSM_VALGRIND_LANES=portable bash ci/valgrind.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    echo "== installing valgrind (Debian package)"
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq valgrind >/dev/null
fi
valgrind --version

# The test binaries of ssm-cpu and ssm-fuzz, from the same build as README's test command
# (test profile: optimised, with debug assertions and overflow checks).
mapfile -t BINS < <(cargo test --workspace --all-features --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    pkg = m.get("manifest_path", "").split("/")[-2:-1]
    if (m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]
            and pkg in (["ssm-cpu"], ["ssm-fuzz"])):
        print(m["executable"])')
[ ${#BINS[@]} -gt 0 ] || { echo "no test binaries found"; exit 1; }

# Bounded: the fuzz harness at 8 mutated calls per template, 2 random templates per generator.
export SSM_FUZZ_ITERATIONS="${SSM_FUZZ_ITERATIONS:-8}" SSM_FUZZ_TEMPLATES="${SSM_FUZZ_TEMPLATES:-2}"
export SSM_FUZZ_HANG_S=600 RUST_BACKTRACE=0
status=0
for lanes in ${SSM_VALGRIND_LANES:-avx2 portable}; do
    for bin in "${BINS[@]}"; do
        name=$(basename "$bin")
        case "$name" in
            # The determinism test repeats the same calls at 1, 2 and 8 threads; one lane set is enough.
            determinism-*) [ "$lanes" = avx2 ] || continue ;;
            # Batch invariance reruns the kernels the other tests cover over 256-sequence pools
            # (half a minute natively, far too long under memcheck); GPU tests skip here anyway.
            batch_invariance-* | gpu_*) continue ;;
        esac
        echo "== memcheck ($lanes lanes): $name"
        start=$(date +%s)
        # valgrind has no AVX-512: its lanes are AVX2 (asked for, on a CPU that has both) or portable.
        export SSM_CPU_SIMD="$lanes"
        if ! valgrind --tool=memcheck --error-exitcode=99 --errors-for-leak-kinds=none --quiet \
            "$bin" --test-threads=2 -q; then
            echo "memcheck: $name FAILED ($lanes lanes)"
            status=1
        fi
        echo "   $(( $(date +%s) - start )) s"
    done
done
[ $status = 0 ] && echo "memcheck: 0 errors"
exit $status
