#!/usr/bin/env bash
# Extracts vLLM 0.33.0's mamba, SSD and FLA (GDN) kernel tests from its sdist on PyPI into DIR (default
# peers/vllm_tests, git-ignored: vLLM's tests never enter this repository) and puts this folder's
# conftest.py beside them. Usage: bash xtask/peers/vllm_tests/fetch.sh [DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$here/../../../peers/vllm_tests}"
sdist="https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz"
sha="f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
curl -sSfL -o "$tmp/vllm.tar.gz" "$sdist"
echo "$sha  $tmp/vllm.tar.gz" | sha256sum -c --quiet
mkdir -p "$dir"
tar xzf "$tmp/vllm.tar.gz" -C "$dir" --strip-components=1 \
    vllm-0.33.0/tests/__init__.py vllm-0.33.0/tests/kernels/__init__.py \
    vllm-0.33.0/tests/kernels/mamba/__init__.py vllm-0.33.0/tests/kernels/mamba/utils.py \
    vllm-0.33.0/tests/kernels/mamba/test_mamba_ssm.py vllm-0.33.0/tests/kernels/mamba/test_causal_conv1d.py \
    vllm-0.33.0/tests/kernels/mamba/test_mamba_ssm_ssd.py vllm-0.33.0/tests/kernels/fla/__init__.py \
    vllm-0.33.0/tests/kernels/fla/test_fused_sigmoid_gating_delta_rule.py \
    vllm-0.33.0/tests/kernels/fla/test_fused_recurrent_packed_decode.py
cp "$here/conftest.py" "$dir/conftest.py"
echo "vLLM 0.33.0 mamba kernel tests in $dir"
