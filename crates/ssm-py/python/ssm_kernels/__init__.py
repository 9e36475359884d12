"""ssm-kernels from Python: vLLM's op signatures on numpy arrays.

Every array is used where it lives: the kernels read and write the arrays' own memory through
their ``__array_interface__`` (shape, strides and offset kept; nothing is copied), on the CPU
backend with every core. A call the op refuses raises :class:`SsmError` (a ``ValueError``) with
the op's typed message and writes nothing.

Supported today: ``selective_state_update`` and ``causal_conv1d_update`` (the decode-path ops),
float32/float16 data and int32/int64 index tables on the host. Not yet: DLPack and
``__cuda_array_interface__`` (torch and CUDA tensors), bfloat16 (numpy has no such dtype).
"""

import numpy as np

from ._core import SsmError
from . import _core

__all__ = ["SsmError", "selective_state_update", "causal_conv1d_update", "NULL_BLOCK_ID"]

#: vLLM's pad value of the slot tables (``vllm.v1.attention.backends.utils.NULL_BLOCK_ID``).
NULL_BLOCK_ID = 0


def selective_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    dt_bias=None,
    z=None,
    dt_softplus=False,
    state_batch_indices=None,
    dst_state_batch_indices=None,
    null_block_id=NULL_BLOCK_ID,
    out=None,
    num_accepted_tokens=None,
    cu_seqlens=None,
):
    """vLLM's ``selective_state_update`` (``mamba_ssm.py``): one decode step, ``state`` updated
    in place through the slot tables, the output written to ``out`` (allocated like ``x`` when
    omitted) and returned. Shapes as vLLM documents them (Mamba1 ``[batch, dim]`` or Mamba2
    ``[batch, nheads, dim]``; tied ``dt``/``A``/``dt_bias`` as stride-0 broadcasts).
    ``null_block_id`` marks pad rows of the slot tables (``None``: no pads)."""
    if out is None:
        out = np.empty_like(x)
    _core.selective_state_update(
        state, x, dt, A, B, C, out, D, dt_bias, z, bool(dt_softplus),
        state_batch_indices, dst_state_batch_indices, null_block_id, num_accepted_tokens, cu_seqlens,
    )
    return out


def causal_conv1d_update(
    x,
    conv_state,
    weight,
    bias=None,
    activation=None,
    conv_state_indices=None,
    num_accepted_tokens=None,
    query_start_loc=None,
    max_query_len=-1,
    null_block_id=NULL_BLOCK_ID,
    validate_data=False,
    out=None,
):
    """vLLM's ``causal_conv1d_update`` (``causal_conv1d.py``): ``x`` is ``[batch, dim]``,
    ``[batch, dim, seqlen]`` or, with ``query_start_loc``, ``[num_tokens, dim]``; ``conv_state``
    ``[..., dim, state_len]`` is updated in place. The result goes to ``out`` when given;
    otherwise, as in vLLM, ``x`` is overwritten (the kernel writes a temporary that is then
    copied into ``x``, since an op's input and output never share memory here). Returns the
    output. ``max_query_len`` and ``validate_data`` are accepted for signature compatibility."""
    del max_query_len, validate_data
    if isinstance(activation, bool):
        silu = activation
    elif activation is None:
        silu = False
    elif activation in ("silu", "swish"):
        silu = True
    else:
        raise SsmError(f"`activation`: {activation!r} is not one of None, 'silu', 'swish', True, False")
    target = x if out is None else out
    result = np.empty_like(x) if out is None else out
    # vLLM's [batch, dim, seqlen] is our token-major [batch, seqlen, dim]: a transposed view.
    xv, rv = (x, result) if x.ndim == 2 else (x.transpose(0, 2, 1), result.transpose(0, 2, 1))
    _core.causal_conv1d_update(
        xv, conv_state, weight, rv, bias, silu, conv_state_indices, num_accepted_tokens,
        query_start_loc, null_block_id,
    )
    if out is None:
        np.copyto(target, result)
    return target
