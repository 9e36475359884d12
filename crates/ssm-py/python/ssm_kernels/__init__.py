"""ssm-kernels from Python: vLLM's op signatures on numpy arrays and DLPack tensors.

Every array is used where it lives: the kernels read and write the arrays' own memory, found
through ``__array_interface__`` (numpy) or ``__dlpack__`` (torch CPU tensors and other DLPack
producers; bfloat16 included), with shape, strides and offset kept and nothing copied, on the
CPU backend with every core. A call the op refuses raises :class:`SsmError` (a ``ValueError``) with
the op's typed message and writes nothing.

Supported today: ``selective_state_update``, ``causal_conv1d_update``,
``fused_recurrent_gated_delta_rule``, ``fused_sigmoid_gating_delta_rule_update``,
``fused_recurrent_gated_delta_rule_packed_decode`` (the decode-path ops of Mamba2 and Qwen3-Next
layers) and ``mamba_chunk_scan_combined_varlen`` (Mamba2
prefill, with :func:`compute_chunk_metadata`), float32/float16 data and int32/int64 index
tables; CUDA tensors through DLPack (torch), launched on torch's current stream with no host
synchronisation (:func:`check` reads the device error word). Not yet: ``__cuda_array_interface__``
without DLPack.
"""

try:
    import numpy as np
except ImportError:  # torch-only environments: numpy is needed for numpy arrays only
    np = None

from ._core import SsmError, check
from . import _core

__all__ = [
    "SsmError",
    "check",
    "selective_state_update",
    "causal_conv1d_update",
    "fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "mamba_chunk_scan_combined_varlen",
    "compute_chunk_metadata",
    "causal_conv1d_fn",
    "chunk_gated_delta_rule",
    "NULL_BLOCK_ID",
]

#: vLLM's pad value of the slot tables (``vllm.v1.attention.backends.utils.NULL_BLOCK_ID``).
NULL_BLOCK_ID = 0


def _stream(t):
    """torch's current stream on ``t``'s device for a CUDA tensor (the op is launched there, so
    it is ordered with torch's work), else None."""
    if getattr(t, "is_cuda", False):
        import torch

        return torch.cuda.current_stream(t.device).cuda_stream
    return None


def _empty_like(t, shape=None, dtype=None):
    """An uninitialised array like ``t`` (numpy or torch, same device), of ``shape`` and ``dtype``
    when given (a dtype of ``t``'s library, or a name such as ``"float32"``)."""
    shape = t.shape if shape is None else tuple(shape)
    if hasattr(t, "new_empty"):
        if isinstance(dtype, str):
            import torch

            dtype = getattr(torch, dtype)
        return t.new_empty(shape, dtype=dtype or t.dtype)
    return np.empty(shape, dtype=dtype or t.dtype)


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
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    state_scale=None,
    intermediate_state_scales=None,
):
    """vLLM's ``selective_state_update`` (``mamba_ssm.py``): one decode step, ``state`` updated
    in place through the slot tables, the output written to ``out`` (allocated like ``x`` when
    omitted) and returned. Shapes as vLLM documents them (Mamba1 ``[batch, dim]`` or Mamba2
    ``[batch, nheads, dim]``; tied ``dt``/``A``/``dt_bias`` as stride-0 broadcasts).
    ``null_block_id`` marks pad rows of the slot tables (``None``: no pads).

    FlashInfer's verification arguments: ``disable_state_update`` leaves ``state`` unwritten;
    ``intermediate_states_buffer`` ``[entries, steps, nheads, dim, dstate]`` (the state's dtype)
    receives every token's state at (``intermediate_state_indices[b]`` or the sequence's source
    slot, token), and ``state`` is not written.

    Block-scaled integer states (FlashInfer's int16, and int8): an ``int16`` or ``int8``
    ``state`` with ``state_scale`` ``[slots, nheads, dim]`` (float32, one decode scale per row)
    is read as ``state * scale``; every stored row is quantized (``LIMIT / max|row|``, rounded to
    nearest, clipped to ±LIMIT; LIMIT 32767 for int16, 127 for int8) and its decode scale
    rewritten. An integer ``intermediate_states_buffer`` takes ``intermediate_state_scales``
    ``[entries, steps, nheads, dim]`` likewise."""
    if out is None:
        out = _empty_like(x)
    _core.selective_state_update(
        state, x, dt, A, B, C, out, D, dt_bias, z, bool(dt_softplus),
        state_batch_indices, dst_state_batch_indices, null_block_id, num_accepted_tokens, cu_seqlens,
        bool(disable_state_update), intermediate_states_buffer, intermediate_state_indices,
        state_scale, intermediate_state_scales, stream=_stream(state),
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
    silu = _silu(activation)
    target = x if out is None else out
    result = _empty_like(x) if out is None else out
    # vLLM's [batch, dim, seqlen] is our token-major [batch, seqlen, dim]: a transposed view.
    xv, rv = (x, result) if x.ndim == 2 else (x.swapaxes(1, 2), result.swapaxes(1, 2))
    _core.causal_conv1d_update(
        xv, conv_state, weight, rv, bias, silu, conv_state_indices, num_accepted_tokens,
        query_start_loc, null_block_id, stream=_stream(conv_state),
    )
    if out is None:
        target[...] = result
    return target


def _gdn_outputs(q, v, initial_state, inplace_final_state):
    """vLLM's output allocation of the recurrent GDN ops: ``o`` like ``v`` in ``q``'s dtype;
    the final state in place, or one state per token ``[B·T, HV, V, K]``."""
    o = _empty_like(q, shape=v.shape)
    if inplace_final_state or initial_state is None:
        return o, None
    b, t = q.shape[0], q.shape[1]
    return o, _empty_like(initial_state, shape=(b * t,) + tuple(initial_state.shape[1:]))


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta=None,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
):
    """vLLM's ``fused_recurrent_gated_delta_rule`` (FLA, ``[V, K]`` state): returns
    ``(o, final_state)``; with ``inplace_final_state`` the pool ``initial_state`` is updated in
    place through ``ssm_state_indices`` and returned as ``final_state``."""
    o, final = _gdn_outputs(q, v, initial_state, inplace_final_state)
    _core.gated_delta_rule(
        q, k, v, o, scale, initial_state, final, cu_seqlens, ssm_state_indices, num_accepted_tokens,
        bool(use_qk_l2norm_in_kernel), g=g, beta=beta, stream=_stream(q),
    )
    return o, initial_state if final is None else final


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
):
    """vLLM's ``fused_sigmoid_gating_delta_rule_update``: the gates ``g = -exp(A_log) ·
    softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` computed in the kernel, then the delta rule
    as :func:`fused_recurrent_gated_delta_rule`. Returns ``(o, final_state)``."""
    if is_kda:
        raise SsmError("`is_kda`: the KDA variant is not implemented")
    o, final = _gdn_outputs(q, v, initial_state, inplace_final_state)
    _core.gated_delta_rule(
        q, k, v, o, scale, initial_state, final, cu_seqlens, ssm_state_indices, num_accepted_tokens,
        bool(use_qk_l2norm_in_kernel), a_log=A_log, a=a, b=b, dt_bias=dt_bias,
        softplus_beta=float(beta), threshold=float(threshold), stream=_stream(q),
    )
    return o, initial_state if final is None else final


def _heads_of(t, start, heads, dim):
    """Columns ``[start, start + heads·dim)`` of the rows of ``t [B, width]`` as ``[B, 1, heads,
    dim]``, a view of ``t``'s memory (rows may be strided)."""
    cols = t[:, start : start + heads * dim]
    if hasattr(cols, "unflatten"):
        return cols.unflatten(1, (heads, dim)).unsqueeze(1)
    return np.lib.stride_tricks.as_strided(
        cols, (t.shape[0], 1, heads, dim), (cols.strides[0], cols.strides[0], dim * cols.strides[1], cols.strides[1])
    )


def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    scale,
    initial_state,
    out,
    ssm_state_indices,
    use_qk_l2norm_in_kernel=False,
):
    """vLLM's packed GDN decode (one token per sequence, semantics/gdn_conv.md §2.3): q, k and v
    read in place from ``mixed_qkv [B, 2·H·K + HV·V]`` (all q heads, then all k heads, then all
    v heads; rows may be strided), the gates computed from ``a, b [B, HV]``, ``A_log`` and
    ``dt_bias`` as :func:`fused_sigmoid_gating_delta_rule_update` does (beta in float32), the
    ``[slots, HV, V, K]`` pool ``initial_state`` updated in place through the 1-D
    ``ssm_state_indices``. Writes ``out [B, 1, HV, V]``: each sequence's output, zeros where its
    index is a pad (≤ 0). ``H`` is inferred from the widths. Returns ``(out, initial_state)``."""
    hv, vd, kd = initial_state.shape[-3:]
    width = mixed_qkv.shape[1] - hv * vd
    h = width // (2 * kd) if kd else 0
    if h <= 0 or 2 * h * kd != width or hv % h:
        raise SsmError(
            f"`mixed_qkv`: width {mixed_qkv.shape[1]} is not 2·H·K + HV·V with K = {kd}, HV·V = {hv * vd} "
            f"and HV a multiple of H"
        )
    q, k = _heads_of(mixed_qkv, 0, h, kd), _heads_of(mixed_qkv, h * kd, h, kd)
    v = _heads_of(mixed_qkv, 2 * h * kd, hv, vd)
    # One token per sequence as a dense batch of B sequences of T = 1: `out` is `o` itself.
    _core.gated_delta_rule(
        q, k, v, out, scale, initial_state, None, None, ssm_state_indices, None,
        bool(use_qk_l2norm_in_kernel), a_log=A_log, a=a, b=b, dt_bias=dt_bias, stream=_stream(mixed_qkv),
    )
    # vLLM's kernel writes zeros for a pad; the recurrent op leaves those rows alone.
    pads = ssm_state_indices <= 0
    if hasattr(out, "masked_fill_"):
        out.masked_fill_(pads.view(-1, 1, 1, 1), 0)  # on the device, no host synchronisation
    else:
        out[np.asarray(pads)] = 0
    return out, initial_state


def compute_chunk_metadata(query_start_loc, num_computed_tokens, chunk_size, checkpoint_offsets=None):
    """vLLM's chunk metadata of a prefill batch: ``(cu_chunk_seqlens, seq_idx,
    last_chunk_indices)`` as int32 arrays; chunk boundaries on multiples of ``chunk_size`` of
    each sequence's absolute position (a resumed sequence first finishes its partial chunk).

    With ``checkpoint_offsets`` (vLLM 0.33's prefix-caching checkpoints: per sequence, tokens
    into its new tokens, 0 for none) a chunk also ends on each checkpoint, and a fourth array,
    ``checkpoint_chunk_indices`` (the chunk ending there, -1 for none), is returned: the
    ``checkpoint_chunk_indices`` of :func:`mamba_chunk_scan_combined_varlen`."""
    offsets = None if checkpoint_offsets is None else [int(v) for v in checkpoint_offsets]
    cu, seq, last, ckpt = _core.compute_chunk_metadata(
        [int(v) for v in query_start_loc], [int(v) for v in num_computed_tokens], int(chunk_size), offsets
    )
    arrays = tuple(np.asarray(v, dtype=np.int32) for v in (cu, seq, last, ckpt))
    return arrays if offsets is not None else arrays[:3]


def mamba_chunk_scan_combined_varlen(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    cu_chunk_seqlens,
    last_chunk_indices,
    seq_idx,
    out,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    dt_softplus=False,
    dt_limit=(0.0, float("inf")),
    return_intermediate_states=False,
    state_dtype=None,
    final_states_out=None,
    final_state_indices=None,
    checkpoint_chunk_indices=None,
    checkpoint_state_indices=None,
):
    """vLLM's ``mamba_chunk_scan_combined_varlen`` (Mamba2 SSD prefill over packed sequences):
    writes ``out``; returns the final states ``[batch, nheads, headdim, dstate]`` (every chunk's
    with ``return_intermediate_states``) in ``state_dtype`` (default ``C``'s), or writes them to
    the pool ``final_states_out`` through ``final_state_indices`` and returns None.

    Prefix-caching checkpoints (vLLM 0.33's ``store_prefill_checkpoint`` of the SSM state, in
    the call): the end state of chunk ``checkpoint_chunk_indices[b]`` (-1: none; see
    :func:`compute_chunk_metadata`'s ``checkpoint_offsets``) is written to the pool slot
    ``checkpoint_state_indices[b]``; needs ``final_states_out``."""
    states = None
    if final_states_out is None:
        rows = len(cu_chunk_seqlens) - 1 if return_intermediate_states else len(cu_seqlens) - 1
        states = _empty_like(C, shape=(rows,) + tuple(x.shape[1:]) + (B.shape[-1],), dtype=state_dtype)
    _core.mamba_chunk_scan_combined_varlen(
        x, dt, A, B, C, int(chunk_size), cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out,
        D, z, dt_bias, initial_states, bool(dt_softplus), (float(dt_limit[0]), float(dt_limit[1])),
        bool(return_intermediate_states), states, final_states_out, final_state_indices,
        checkpoint_chunk_indices, checkpoint_state_indices,
        stream=_stream(x),
    )
    return states


def _silu(activation):
    if isinstance(activation, bool):
        return activation
    if activation is None:
        return False
    if activation in ("silu", "swish"):
        return True
    raise SsmError(f"`activation`: {activation!r} is not one of None, 'silu', 'swish', True, False")


def causal_conv1d_fn(
    x,
    weight,
    bias,
    conv_states,
    query_start_loc,
    cache_indices=None,
    has_initial_state=None,
    activation="silu",
    pad_slot_id=-1,
    null_block_id=NULL_BLOCK_ID,
    metadata=None,
    validate_data=False,
    checkpoint_offsets=None,
    checkpoint_state_indices=None,
):
    """vLLM's ``causal_conv1d_fn`` (varlen prefill): ``x`` is ``[dim, total_tokens]`` (the
    sequences packed along the tokens, ``query_start_loc`` their starts); ``conv_states``
    ``[..., dim, width - 1]`` is read (``has_initial_state``) and updated in place through
    ``cache_indices`` (``null_block_id`` entries are pads). Returns the output, shaped as ``x``.
    ``pad_slot_id``, ``metadata`` and ``validate_data`` are accepted for signature
    compatibility (the pads of ``cache_indices`` are ``null_block_id``, as in vLLM's kernel).

    Prefix-caching checkpoints (vLLM 0.33's ``store_prefill_checkpoint`` of the conv state, in
    the call): with ``checkpoint_offsets`` (per sequence, 0 for none, else tokens into the
    sequence, ``1 <= offset < `` its tokens) and ``checkpoint_state_indices`` (the slot each
    checkpoint goes to, not the sequence's own), the slot's first ``width - 1`` columns take the
    conv state after that many tokens."""
    del pad_slot_id, metadata, validate_data
    out = _empty_like(x)
    _core.causal_conv1d_fn(
        x.T, weight, conv_states, query_start_loc, out.T, bias, _silu(activation), cache_indices,
        has_initial_state, null_block_id, checkpoint_offsets, checkpoint_state_indices,
        stream=_stream(conv_states),
    )
    return out


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    chunk_indices=None,
    chunk_offsets=None,
    use_qk_l2norm_in_kernel=False,
    core_attn_out=None,
):
    """vLLM's ``chunk_gated_delta_rule`` (FLA's GDN chunked prefill, ``[V, K]`` states): returns
    ``(o, final_state)``, ``final_state`` ``[N, HV, V, K]`` float32 when ``output_final_state``
    (else None), ``o`` written to ``core_attn_out`` when given. ``initial_state`` is dense
    ``[N, HV, V, K]``. ``chunk_indices`` and ``chunk_offsets`` (vLLM's precomputed chunk tables)
    are accepted and not needed."""
    del chunk_indices, chunk_offsets
    o = _empty_like(q, shape=v.shape) if core_attn_out is None else core_attn_out
    final = None
    if output_final_state:
        n = q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
        hv, vd, kd = v.shape[2], v.shape[3], k.shape[3]
        final = _empty_like(q, shape=(n, hv, vd, kd), dtype="float32")
    _core.chunk_gated_delta_rule(
        q, k, v, g, beta, o, scale, initial_state, final, cu_seqlens, bool(use_qk_l2norm_in_kernel),
        stream=_stream(q),
    )
    return o, final
