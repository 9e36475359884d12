"""vLLM's own kernel tests run against ssm-kernels (issue 14, item 4).

This conftest sits at the root of a folder holding vLLM's ``tests/`` package, as
``xtask/peers/vllm_tests/fetch.sh`` extracts it from the vLLM 0.33.0 sdist (git-ignored, never
in the repository). Before pytest imports a test module it installs small stand-ins for the vLLM
modules those tests import, so that each op vLLM's tests call is ``ssm_kernels``' function of the
same name and signature:

- ``vllm.model_executor.layers.mamba.ops.mamba_ssm.selective_state_update``,
  ``....causal_conv1d.causal_conv1d_update`` / ``causal_conv1d_fn``,
  ``....ssd_combined.mamba_chunk_scan_combined_varlen`` and
  ``vllm.third_party.flash_linear_attention.ops``' ``fused_recurrent_gated_delta_rule``,
  ``fused_sigmoid_gating_delta_rule_update`` and ``fused_recurrent_gated_delta_rule_packed_decode``
  are ``ssm_kernels``' own;
- ops ssm-kernels does not have (``selective_scan_fn``, Mamba1's prefill scan) skip the test
  that calls them, naming the op, and so do tests of vLLM's Triton internals
  (``_chunk_scan_fwd``'s autotuner configs);
- ``compute_varlen_chunk_metadata`` (vLLM's test helper in ``mamba2_attn``) is written here from
  its documented contract;
- ``vllm.platforms.current_platform`` describes the CUDA device torch sees,
  ``set_random_seed`` seeds Python, numpy and torch, ``NULL_BLOCK_ID`` is vLLM's 0.

Run (on a machine with torch, CUDA and the ``ssm_kernels`` package on ``PYTHONPATH``):
``python3 -m pytest -q -p no:cacheprovider <folder>/tests/kernels/mamba/test_mamba_ssm.py ...``
(``run.sh vllm-tests`` lists the files). ``SSM_VLLM_TESTS_DEVICE=cpu`` runs them on torch CPU
tensors and the CPU backend instead (a dry run of the shim on a machine without a GPU; the
platform then claims to be CUDA-alike so that the tests' CUDA-only marks let them run).
"""

import importlib
import os
import random
import sys
import types

import numpy as np
import pytest
import torch

import ssm_kernels as sk


def _module(name, **attrs):
    """A stand-in module `name` (its parent packages created as needed), with `attrs`."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            pkg = types.ModuleType(parent)
            pkg.__path__ = []
            sys.modules[parent] = pkg
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    if len(parts) > 1:
        setattr(sys.modules[".".join(parts[:-1])], parts[-1], mod)
    return mod


_CPU_DRY_RUN = os.environ.get("SSM_VLLM_TESTS_DEVICE") == "cpu"


class _CudaPlatform:
    """What vLLM's tests ask of ``current_platform``: the CUDA device torch sees (or, in the CPU
    dry run, torch's CPU presented as an sm_90 CUDA-alike device)."""

    device_type = "cpu" if _CPU_DRY_RUN else "cuda"

    def is_cuda(self):
        return _CPU_DRY_RUN or torch.cuda.is_available()

    def is_cuda_alike(self):
        return self.is_cuda()

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return not self.is_cuda()

    def get_device_capability(self, device_id=0):
        return (9, 0) if _CPU_DRY_RUN else torch.cuda.get_device_capability(device_id)

    def is_device_capability_family(self, family, device_id=0):
        major, _ = self.get_device_capability(device_id)
        return major * 10 == family // 10 * 10

    def has_device_capability(self, capability, device_id=0):
        major, minor = self.get_device_capability(device_id)
        return major * 10 + minor >= capability


def set_random_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _absent(op):
    def call(*args, **kwargs):
        pytest.skip(f"ssm-kernels has no `{op}` (not an op of this library)")

    return call


def selective_state_update(state, x, dt, A, B, C, D=None, dt_bias=None, z=None, dt_softplus=False,
                           state_batch_indices=None, dst_state_batch_indices=None,
                           null_block_id=sk.NULL_BLOCK_ID, out=None, num_accepted_tokens=None,
                           cu_seqlens=None, is_blackwell=False, enable_stochastic_rounding=False,
                           cache_philox_rounds=0):
    """vLLM 0.33's signature; `is_blackwell` picks among vLLM's own Triton configs (no meaning
    here); stochastic rounding is not exposed by the Python package, so such a call skips."""
    del is_blackwell, cache_philox_rounds
    if enable_stochastic_rounding:
        pytest.skip("the ssm_kernels Python package does not expose stochastic rounding")
    return sk.selective_state_update(
        state, x, dt, A, B, C, D=D, dt_bias=dt_bias, z=z, dt_softplus=dt_softplus,
        state_batch_indices=state_batch_indices, dst_state_batch_indices=dst_state_batch_indices,
        null_block_id=null_block_id, out=out, num_accepted_tokens=num_accepted_tokens,
        cu_seqlens=cu_seqlens,
    )


def compute_varlen_chunk_metadata(query_start_loc, chunk_size):
    """vLLM's test helper (``vllm.v1.attention.backends.mamba2_attn``): the chunk metadata of
    packed sequences ``query_start_loc [B+1]``, as int32 tensors on its device,
    ``(cu_chunk_seqlens [nchunks+1], last_chunk_indices [B] (-1 for an empty sequence),
    seq_idx [nchunks])``. A chunk ends at its sequence's end and at every multiple of
    ``chunk_size`` of the packed token position."""
    bounds = [int(v) for v in query_start_loc.to(torch.int64).tolist()]
    assert bounds[0] == 0, "query_start_loc[0] must be 0"
    lens, seq_idx, last = [], [], [-1] * (len(bounds) - 1)
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        pos = start
        while pos < end:
            take = min(chunk_size - pos % chunk_size, end - pos)
            lens.append(take)
            seq_idx.append(b)
            last[b] = len(lens) - 1
            pos += take
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    dev = query_start_loc.device

    def t(v):
        return torch.tensor(v, dtype=torch.int32, device=dev)

    return t(cu), t(last), t(seq_idx)


class _TritonKernel:
    """Stands in for a Triton autotuned kernel whose configs a test iterates: one config, whose
    run (``_chunk_scan_fwd``) skips."""

    configs = [None]


def _opcheck(*args, **kwargs):
    pytest.skip("torch.library opcheck applies to vLLM's registered C++ ops only")


_module("vllm._custom_ops")
_module("vllm.platforms", current_platform=_CudaPlatform())
_module("vllm.utils.torch_utils", set_random_seed=set_random_seed)
_module("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=sk.NULL_BLOCK_ID, PAD_SLOT_ID=-1)
_module(
    "vllm.model_executor.layers.mamba.ops.mamba_ssm",
    selective_state_update=selective_state_update,
    selective_scan_fn=_absent("selective_scan_fn"),
)
_module(
    "vllm.model_executor.layers.mamba.ops.causal_conv1d",
    causal_conv1d_update=sk.causal_conv1d_update,
    causal_conv1d_fn=sk.causal_conv1d_fn,
)
_module(
    "vllm.model_executor.layers.mamba.ops.ssd_combined",
    mamba_chunk_scan_combined_varlen=sk.mamba_chunk_scan_combined_varlen,
)
_module(
    "vllm.model_executor.layers.mamba.ops.ssd_chunk_scan",
    _chunk_scan_fwd=_absent("_chunk_scan_fwd (a vLLM Triton internal, stage 5 alone)"),
    _chunk_scan_fwd_kernel=_TritonKernel(),
)
_module("vllm.v1.attention.backends.mamba2_attn", compute_varlen_chunk_metadata=compute_varlen_chunk_metadata)
_module(
    "vllm.third_party.flash_linear_attention.ops",
    fused_recurrent_gated_delta_rule=sk.fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update=sk.fused_sigmoid_gating_delta_rule_update,
    fused_recurrent_gated_delta_rule_packed_decode=sk.fused_recurrent_gated_delta_rule_packed_decode,
)
# vLLM's tests/kernels/utils.py imports most of vLLM; the mamba tests take only `opcheck` from it.
# The real `tests` and `tests.kernels` packages (beside this file) are imported first, so that the
# stand-in replaces that one module only.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
importlib.import_module("tests.kernels")
_module("tests.kernels.utils", opcheck=_opcheck)
