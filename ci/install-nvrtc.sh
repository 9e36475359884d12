#!/usr/bin/env bash
# Installs NVRTC and the CUDA runtime headers from PyPI into a cache folder, so that
# `cargo xtask build-kernels` can compile every CUDA kernel on a machine without a GPU
# or a CUDA toolkit. Prints the environment to export (eval its output).
#
#   eval "$(bash ci/install-nvrtc.sh [DIR])"      # DIR defaults to .nvrtc (git-ignored)
#
# Wheels: nvidia-cuda-nvrtc (libnvrtc.so.13 + libnvrtc-builtins) and nvidia-cuda-runtime
# (cuda_fp16.h / cuda_bf16.h and friends). Pinned to the 13.x line that cudarc's
# `cuda-13040` feature loads (libnvrtc.so.13).
set -euo pipefail
dir="${1:-.nvrtc}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
stamp="$dir/.installed-13"
if [ ! -f "$stamp" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" \
        'nvidia-cuda-nvrtc>=13,<14' 'nvidia-cuda-runtime>=13,<14' >&2
    touch "$stamp"
fi
lib="$(dirname "$(find "$dir" -name 'libnvrtc.so.13*' | head -n1)")"
inc="$(dirname "$(find "$dir" -name cuda_fp16.h | head -n1)")"
if [ -z "$lib" ] || [ -z "$inc" ] || [ "$lib" = . ] || [ "$inc" = . ]; then
    echo "install-nvrtc: libnvrtc.so.13 or cuda_fp16.h not found under $dir" >&2
    exit 1
fi
# libnvrtc.so.13 is versioned; cudarc also tries the unversioned name, which a wheel lacks.
echo "export LD_LIBRARY_PATH=\"$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
echo "export SSM_CUDA_INCLUDE=\"$inc\""
