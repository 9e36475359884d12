"""The Python package on numpy arrays: vLLM-shaped calls against a numpy transcription of vLLM's
formulas, in-place writes into the caller's arrays (slices and broadcasts included), and typed
errors that write nothing."""

import numpy as np
import pytest

import ssm_kernels as sk


def softplus(v):
    return np.where(v <= 20.0, np.log1p(np.exp(np.minimum(v, 20.0))), v)


def ssu_reference(state, x, dt, A, B, C, D, dt_bias, z, softplus_on, slots, pad):
    """vLLM's selective_state_update on Mamba2 shapes, in float64; returns (state, out)."""
    state = state.astype(np.float64).copy()
    batch, nheads, dim = x.shape
    groups = B.shape[1]
    out = np.zeros((batch, nheads, dim))
    for b in range(batch):
        s = slots[b]
        for h in range(nheads):
            g = h // (nheads // groups)
            d = dt[b, h].astype(np.float64) + dt_bias[h]
            if softplus_on:
                d = softplus(d)
            st = state[s, h] if s != pad else np.zeros((dim, A.shape[-1]))
            st = st * np.exp(A[h][:, :] * d[:, None]) + (d * x[b, h])[:, None] * B[b, g][None, :]
            y = st @ C[b, g] + D[h] * x[b, h]
            if z is not None:
                y = y * z[b, h] / (1 + np.exp(-z[b, h]))
            out[b, h] = y
            if s != pad:
                state[s, h] = st
    return state, out


def test_selective_state_update_matches_vllms_formula_in_place():
    rng = np.random.default_rng(0)
    batch, nheads, dim, dstate, groups, slots = 4, 4, 8, 16, 2, 7
    pool = rng.standard_normal((slots, 2, nheads, dim, dstate)).astype(np.float32)
    state = pool[:, 1]  # a strided view: the call must write the parent's memory
    x = rng.standard_normal((batch, nheads, dim)).astype(np.float32)
    dt = np.broadcast_to(rng.uniform(-2, 1, (batch, nheads, 1)).astype(np.float32), (batch, nheads, dim))
    A = np.broadcast_to(-rng.uniform(0.1, 2, (nheads, 1, 1)).astype(np.float32), (nheads, dim, dstate))
    dt_bias = np.broadcast_to(rng.uniform(-1, 1, (nheads, 1)).astype(np.float32), (nheads, dim))
    D = np.broadcast_to(rng.uniform(0.5, 1.5, (nheads, 1)).astype(np.float32), (nheads, dim))
    B = rng.standard_normal((batch, groups, dstate)).astype(np.float32)
    C = rng.standard_normal((batch, groups, dstate)).astype(np.float32)
    z = rng.standard_normal((batch, nheads, dim)).astype(np.float32)
    table = np.array([5, 0, 2, 6], dtype=np.int32)  # row 1 is the pad (null block 0)
    before = pool.copy()
    want_state, want_out = ssu_reference(state, x, dt, A, B, C, D[:, 0], dt_bias[:, 0], z, True, table, 0)

    out = sk.selective_state_update(state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=True,
                                    state_batch_indices=table)
    assert out.shape == x.shape
    np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pool[:, 1], want_state, rtol=1e-5, atol=1e-5)
    # Untouched: the pad's slot 0, slots no row names, and the other half of the pool.
    for s in (0, 1, 3, 4):
        np.testing.assert_array_equal(pool[s], before[s])
    np.testing.assert_array_equal(pool[:, 0], before[:, 0])


def test_selective_state_update_verifies_without_commit():
    """FlashInfer's verification arguments: with ``disable_state_update`` the pool is untouched
    and ``out`` is the committing call's; with an intermediate buffer each sequence's new state
    lands at its entry (step 0) instead of the pool."""
    rng = np.random.default_rng(5)
    batch, nheads, dim, dstate, slots = 3, 2, 8, 16, 5
    state = rng.standard_normal((slots, nheads, dim, dstate)).astype(np.float32)
    x = rng.standard_normal((batch, nheads, dim)).astype(np.float32)
    dt = np.broadcast_to(rng.uniform(-2, 1, (batch, nheads, 1)).astype(np.float32), (batch, nheads, dim))
    A = np.broadcast_to(-rng.uniform(0.1, 2, (nheads, 1, 1)).astype(np.float32), (nheads, dim, dstate))
    B, C = (rng.standard_normal((batch, 1, dstate)).astype(np.float32) for _ in range(2))
    table = np.array([4, 1, 2], dtype=np.int32)
    committed = state.copy()
    want_out = sk.selective_state_update(committed, x, dt, A, B, C, dt_softplus=True, state_batch_indices=table)

    kept = state.copy()
    out = sk.selective_state_update(kept, x, dt, A, B, C, dt_softplus=True, state_batch_indices=table,
                                    disable_state_update=True)
    np.testing.assert_array_equal(kept, state)
    np.testing.assert_array_equal(out, want_out)

    buf = np.full((5, 2, nheads, dim, dstate), np.nan, np.float32)
    entries = np.array([2, 4, 1], dtype=np.int32)  # entry 0 would be the pad (null block 0)
    kept = state.copy()
    out = sk.selective_state_update(kept, x, dt, A, B, C, dt_softplus=True, state_batch_indices=table,
                                    intermediate_states_buffer=buf, intermediate_state_indices=entries)
    np.testing.assert_array_equal(kept, state)
    np.testing.assert_array_equal(out, want_out)
    for b in range(batch):
        np.testing.assert_array_equal(buf[entries[b], 0], committed[table[b]])
        assert np.isnan(buf[entries[b], 1]).all()


@pytest.mark.parametrize("dtype,limit", [(np.int16, 32767), (np.int8, 127)])
def test_selective_state_update_integer_state(dtype, limit):
    """Block-scaled integer states (FlashInfer's int16, and int8): rows read as ``q * scale``, the
    new rows quantized with ``limit / max|row|`` and their decode scales rewritten; close to the
    f32-state call."""
    rng = np.random.default_rng(9)
    batch, nheads, dim, dstate, slots = 3, 2, 8, 16, 5
    f32_state = rng.standard_normal((slots, nheads, dim, dstate)).astype(np.float32)
    amax = np.abs(f32_state).max(axis=-1)
    scale = (amax / limit).astype(np.float32)
    q = np.clip(np.rint(f32_state / scale[..., None]), -limit, limit).astype(dtype)
    x = rng.standard_normal((batch, nheads, dim)).astype(np.float32)
    dt = np.broadcast_to(rng.uniform(-2, 1, (batch, nheads, 1)).astype(np.float32), (batch, nheads, dim))
    A = np.broadcast_to(-rng.uniform(0.1, 2, (nheads, 1, 1)).astype(np.float32), (nheads, dim, dstate))
    B, C = (rng.standard_normal((batch, 1, dstate)).astype(np.float32) for _ in range(2))
    table = np.array([4, 1, 2], dtype=np.int32)
    dequant = (q * scale[..., None]).astype(np.float32)
    want_state = dequant.copy()
    want_out = sk.selective_state_update(want_state, x, dt, A, B, C, dt_softplus=True, state_batch_indices=table)
    state, sc = q.copy(), scale.copy()
    out = sk.selective_state_update(state, x, dt, A, B, C, dt_softplus=True, state_batch_indices=table,
                                    state_scale=sc)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    for s in table:
        row_amax = np.abs(want_state[s]).max(axis=-1)
        np.testing.assert_allclose(sc[s], row_amax / limit, rtol=1e-5)
        assert np.abs(state[s].astype(np.int32)).max(axis=-1).min() == limit
        np.testing.assert_allclose(state[s] * sc[s][..., None], want_state[s], atol=float(sc[s].max()))
    for s in (0, 3):
        np.testing.assert_array_equal(state[s], q[s])
        np.testing.assert_array_equal(sc[s], scale[s])
    with pytest.raises(sk.SsmError, match="state_scale"):
        sk.selective_state_update(q.copy(), x, dt, A, B, C, state_batch_indices=table)


def test_causal_conv1d_update_in_vllm_layouts():
    rng = np.random.default_rng(1)
    batch, dim, width, seqlen, slots = 3, 16, 4, 2, 5
    conv_state = rng.standard_normal((slots, dim, width - 1)).astype(np.float32)
    weight = rng.standard_normal((dim, width)).astype(np.float32)
    bias = rng.standard_normal(dim).astype(np.float32)
    x = rng.standard_normal((batch, dim, seqlen)).astype(np.float32)
    table = np.array([4, 1, 3], dtype=np.int64)
    # Reference: the window is history ++ tokens; out[t] = silu(bias + Σ_k w[k]·window[t + k]).
    want = np.zeros_like(x)
    want_state = conv_state.copy()
    for b in range(batch):
        win = np.concatenate([conv_state[table[b]], x[b]], axis=1)  # [dim, width - 1 + seqlen]
        for t in range(seqlen):
            y = (win[:, t:t + width] * weight).sum(axis=1) + bias
            want[b, :, t] = y / (1 + np.exp(-y))
        want_state[table[b]] = win[:, -(width - 1):]
    x_before = x.copy()
    got = sk.causal_conv1d_update(x, conv_state, weight, bias, activation="silu", conv_state_indices=table)
    assert got is x, "without `out`, x is overwritten and returned, as in vLLM"
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(conv_state, want_state, rtol=0, atol=0)
    # With `out`: x stays as it was.
    out = np.zeros_like(x_before)
    conv_state2 = want_state.copy()
    sk.causal_conv1d_update(x_before, conv_state2, weight, bias, activation=True, conv_state_indices=table, out=out)
    assert np.all(np.isfinite(out))


def small_ssu():
    state = np.ones((2, 1, 4, 8), np.float32)
    x = np.ones((2, 1, 4), np.float32)
    dt = np.ones((2, 1, 4), np.float32)
    A = -np.ones((1, 4, 8), np.float32)
    B = np.ones((2, 1, 8), np.float32)
    C = np.ones((2, 1, 8), np.float32)
    return state, x, dt, A, B, C


def test_refused_calls_raise_the_typed_message_and_write_nothing():
    state, x, dt, A, B, C = small_ssu()
    bad_c = np.ones((2, 1, 5), np.float32)
    with pytest.raises(sk.SsmError, match="C"):
        sk.selective_state_update(state, x, dt, A, B, bad_c)
    assert isinstance(sk.SsmError("m"), ValueError)
    # An output that shares memory with an input.
    with pytest.raises(sk.SsmError, match="`out` overlaps `x`"):
        sk.selective_state_update(state, x, dt, A, B, C, out=x)
    # A read-only state.
    frozen = state.copy()
    frozen.flags.writeable = False
    with pytest.raises(sk.SsmError, match="read-only"):
        sk.selective_state_update(frozen, x, dt, A, B, C)
    # A slot outside the pool.
    with pytest.raises(sk.SsmError, match="state_batch_indices"):
        sk.selective_state_update(state, x, dt, A, B, C, state_batch_indices=np.array([1, 9], np.int32))
    np.testing.assert_array_equal(state, np.ones_like(state))
    with pytest.raises(TypeError, match="float64"):
        sk.selective_state_update(state, x.astype(np.float64), dt, A, B, C)


def gdn_reference(q, k, v, g, beta, state, slots, l2norm):
    """FLA's recurrence with a [V, K] state per value head, float64; returns (o, state)."""
    state = state.astype(np.float64).copy()
    n, t, h, kd = q.shape
    hv = v.shape[2]
    o = np.zeros(v.shape)
    for s in range(n):
        for head in range(hv):
            qh = head // (hv // h)
            st = state[slots[s], head]
            for tok in range(t):
                qq, kk = q[s, tok, qh].astype(np.float64), k[s, tok, qh].astype(np.float64)
                if l2norm:
                    qq = qq / np.sqrt((qq * qq).sum() + 1e-6)
                    kk = kk / np.sqrt((kk * kk).sum() + 1e-6)
                qq = qq * kd ** -0.5
                st = st * np.exp(g[s, tok, head])
                vv = (v[s, tok, head] - st @ kk) * beta[s, tok, head]
                st = st + np.outer(vv, kk)
                o[s, tok, head] = st @ qq
            state[slots[s], head] = st
    return o, state


def gdn_inputs(rng, n=3, t=2, h=2, hv=4, kd=8, vd=6, slots=6):
    q = rng.standard_normal((n, t, h, kd)).astype(np.float32)
    k = rng.standard_normal((n, t, h, kd)).astype(np.float32)
    v = rng.standard_normal((n, t, hv, vd)).astype(np.float32)
    state = rng.standard_normal((slots, hv, vd, kd)).astype(np.float32) * 0.3
    table = np.array([4, 1, 5], dtype=np.int32)
    return q, k, v, state, table


def test_recurrent_gdn_matches_flas_formula_in_place():
    rng = np.random.default_rng(2)
    q, k, v, state, table = gdn_inputs(rng)
    g = -rng.uniform(0.01, 1.0, v.shape[:3]).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, v.shape[:3]).astype(np.float32)
    want_o, want_state = gdn_reference(q, k, v, g, beta, state, table, True)
    before = state.copy()
    o, final = sk.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                   ssm_state_indices=table, use_qk_l2norm_in_kernel=True)
    assert final is state
    np.testing.assert_allclose(o, want_o, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=2e-4)
    for s in (0, 2, 3):
        np.testing.assert_array_equal(state[s], before[s])


def test_sigmoid_gating_gdn_computes_vllms_gates():
    rng = np.random.default_rng(3)
    q, k, v, state, table = gdn_inputs(rng)
    hv = v.shape[2]
    A_log = rng.uniform(-1, 1, hv).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, hv).astype(np.float32)
    a = rng.standard_normal(v.shape[:3]).astype(np.float32)
    b = rng.standard_normal(v.shape[:3]).astype(np.float32)
    g = -np.exp(A_log) * softplus((a + dt_bias).astype(np.float64))
    beta = 1 / (1 + np.exp(-b.astype(np.float64)))
    want_o, want_state = gdn_reference(q, k, v, g, beta, state, table, False)
    o, _ = sk.fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, initial_state=state,
                                                     ssm_state_indices=table)
    np.testing.assert_allclose(o, want_o, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("strided", [False, True])
def test_packed_decode_reads_q_k_v_in_place_and_zeroes_pads(strided):
    # vLLM's packed decode: one token per sequence from [q heads | k heads | v heads] rows (a
    # strided view of a wider projection when `strided`), pads (<= 0) give zero rows and keep
    # every slot; the rest equals fused_sigmoid_gating_delta_rule_update on the split tensors.
    rng = np.random.default_rng(7)
    n, h, hv, kd, vd = 5, 2, 4, 8, 6
    width = 2 * h * kd + hv * vd
    proj = rng.standard_normal((n, width + (16 if strided else 0))).astype(np.float32)
    mixed = proj[:, :width]
    a = rng.standard_normal((n, hv)).astype(np.float32)
    b = rng.standard_normal((n, hv)).astype(np.float32)
    A_log = rng.uniform(-1, 1, hv).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, hv).astype(np.float32)
    pool = rng.standard_normal((7, hv, vd, kd)).astype(np.float32) * 0.3
    table = np.array([3, -1, 6, 0, 1], dtype=np.int32)
    want_pool = pool.copy()
    q = mixed[:, : h * kd].reshape(n, 1, h, kd).copy()
    k = mixed[:, h * kd : 2 * h * kd].reshape(n, 1, h, kd).copy()
    v = mixed[:, 2 * h * kd :].reshape(n, 1, hv, vd).copy()
    want_o, _ = sk.fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, scale=0.3,
                                                          initial_state=want_pool, ssm_state_indices=table,
                                                          use_qk_l2norm_in_kernel=True)
    before = pool.copy()
    out = np.full((n, 1, hv, vd), np.nan, dtype=np.float32)
    got, final = sk.fused_recurrent_gated_delta_rule_packed_decode(mixed, a, b, A_log, dt_bias, 0.3, pool, out, table,
                                                                   use_qk_l2norm_in_kernel=True)
    assert got is out and final is pool
    live = table > 0
    np.testing.assert_array_equal(out[live], want_o[live])
    np.testing.assert_array_equal(out[~live], 0)
    np.testing.assert_array_equal(pool, want_pool)
    for s in (0, 2, 4, 5):
        np.testing.assert_array_equal(pool[s], before[s])
    with pytest.raises(sk.SsmError, match="mixed_qkv"):
        sk.fused_recurrent_gated_delta_rule_packed_decode(mixed[:, 1:], a, b, A_log, dt_bias, 0.3, pool, out, table)


class DLPackOnly:
    """An array seen only through DLPack (as a torch CPU tensor is)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_producers_run_in_place_like_numpy_arrays():
    rng = np.random.default_rng(4)
    state, x, dt, A, B, C = small_ssu()
    state = rng.standard_normal(state.shape).astype(np.float32)
    x = rng.standard_normal(x.shape).astype(np.float32)
    want_state, want_out = state.copy(), np.empty_like(x)
    sk.selective_state_update(want_state, x, dt, A, B, C, out=want_out)
    out = np.empty_like(x)
    wrapped = [DLPackOnly(t) for t in (state, x, dt, A, B, C)]
    sk._core.selective_state_update(*wrapped, DLPackOnly(out))
    np.testing.assert_array_equal(state, want_state)
    np.testing.assert_array_equal(out, want_out)
    with pytest.raises(TypeError, match="DLPack dtype"):
        sk._core.selective_state_update(*wrapped[:1], DLPackOnly(x.astype(np.float64)), *wrapped[2:], DLPackOnly(out))


def test_ssd_prefill_equals_the_token_by_token_recurrence():
    rng = np.random.default_rng(5)
    lens, computed, chunk = [20, 7, 33], [0, 5, 0], 16
    total, h, p, n, g = sum(lens), 4, 8, 16, 2
    cu = np.array([0, 20, 27, 60], np.int32)
    cu_chunk, seq_idx, last = sk.compute_chunk_metadata(cu, computed, chunk)
    assert cu_chunk[0] == 0 and cu_chunk[-1] == total and len(last) == 3
    x = rng.standard_normal((total, h, p)).astype(np.float32)
    dt = rng.uniform(-2, 0.5, (total, h)).astype(np.float32)
    A = -rng.uniform(0.2, 2, h).astype(np.float32)
    B = rng.standard_normal((total, g, n)).astype(np.float32)
    C = rng.standard_normal((total, g, n)).astype(np.float32)
    D = rng.uniform(0.5, 1.5, h).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, h).astype(np.float32)
    init = rng.standard_normal((3, h, p, n)).astype(np.float32) * 0.5
    out = np.full_like(x, np.nan)
    states = sk.mamba_chunk_scan_combined_varlen(
        x, dt, A, B, C, chunk, cu, cu_chunk, last, seq_idx, out, D=D, dt_bias=dt_bias,
        initial_states=init, dt_softplus=True)
    # The recurrence, token by token, in float64.
    want_out, want_states = np.zeros(x.shape), np.zeros(init.shape)
    for s in range(3):
        st = init[s].astype(np.float64)
        for t in range(cu[s], cu[s + 1]):
            for hh in range(h):
                gg = hh // (h // g)
                d = softplus(np.float64(dt[t, hh]) + dt_bias[hh])
                st[hh] = st[hh] * np.exp(A[hh] * d) + d * np.outer(x[t, hh], B[t, gg])
                want_out[t, hh] = st[hh] @ C[t, gg] + D[hh] * x[t, hh]
        want_states[s] = st
    np.testing.assert_allclose(out, want_out, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(states, want_states, rtol=2e-4, atol=2e-4)
    with pytest.raises(sk.SsmError, match="query_start_loc"):
        sk.compute_chunk_metadata([0, 5, 3], [0, 0], 16)


def test_ssd_prefill_checkpoints_equal_the_state_at_their_token():
    # vLLM 0.33's prefix-caching checkpoint: a chunk ends on the checkpoint and its end state goes
    # to its own pool slot in the same call; it equals the token-by-token state there.
    rng = np.random.default_rng(15)
    lens, computed, chunk, offsets = [21, 9], [3, 0], 8, [10, 0]
    total, h, p, n = sum(lens), 2, 4, 8
    cu = np.array([0, 21, 30], np.int32)
    cu_chunk, seq_idx, last, ckpt = sk.compute_chunk_metadata(cu, computed, chunk, checkpoint_offsets=offsets)
    assert list(ckpt) == [1, -1] and cu_chunk[ckpt[0] + 1] == 10
    assert len(sk.compute_chunk_metadata(cu, computed, chunk)) == 3
    x = rng.standard_normal((total, h, p)).astype(np.float32)
    dt = rng.uniform(0.01, 0.3, (total, h)).astype(np.float32)
    A = -rng.uniform(0.2, 2, h).astype(np.float32)
    B = rng.standard_normal((total, 1, n)).astype(np.float32)
    C = rng.standard_normal((total, 1, n)).astype(np.float32)
    pool = np.full((4, h, p, n), 7.0, np.float32)
    out = np.full_like(x, np.nan)
    sk.mamba_chunk_scan_combined_varlen(
        x, dt, A, B, C, chunk, cu, cu_chunk, last, seq_idx, out,
        final_states_out=pool, final_state_indices=np.array([0, 1], np.int32),
        checkpoint_chunk_indices=ckpt, checkpoint_state_indices=np.array([2, -1], np.int32))
    st = np.zeros((h, p, n))
    for t in range(offsets[0]):
        st = st * np.exp(A * dt[t])[:, None, None] + dt[t][:, None, None] * x[t][:, :, None] * B[t, 0][None, None, :]
    np.testing.assert_allclose(pool[2], st, rtol=2e-4, atol=2e-4)
    assert np.all(pool[3] == 7.0), "an unnamed slot was written"
    with pytest.raises(sk.SsmError, match="checkpoint_offsets"):
        sk.compute_chunk_metadata(cu, computed, chunk, checkpoint_offsets=[21, 0])


def test_causal_conv1d_fn_prefill_in_vllms_layout():
    rng = np.random.default_rng(6)
    dim, width, slots = 12, 4, 5
    lens = [6, 1, 9]
    cu = np.array([0, 6, 7, 16], np.int32)
    x = rng.standard_normal((dim, 16)).astype(np.float32)  # vLLM's [dim, total_tokens]
    weight = rng.standard_normal((dim, width)).astype(np.float32)
    bias = rng.standard_normal(dim).astype(np.float32)
    conv_states = rng.standard_normal((slots, dim, width - 1)).astype(np.float32)
    cache = np.array([3, 0, 1], np.int32)  # the second sequence is a pad (null block 0)
    has = np.array([True, False, False])
    want = np.full_like(x, np.nan)
    want_states = conv_states.copy()
    for s in range(3):
        if cache[s] == 0:
            continue
        hist = conv_states[cache[s]] if has[s] else np.zeros((dim, width - 1), np.float32)
        win = np.concatenate([hist, x[:, cu[s]:cu[s + 1]]], axis=1)
        for t in range(lens[s]):
            y = (win[:, t:t + width] * weight).sum(axis=1) + bias
            want[:, cu[s] + t] = y / (1 + np.exp(-y))
        want_states[cache[s]] = win[:, -(width - 1):]
    out = sk.causal_conv1d_fn(x, weight, bias, conv_states, cu, cache_indices=cache, has_initial_state=has)
    written = ~np.isnan(want)
    np.testing.assert_allclose(out[written], want[written], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(conv_states, want_states, rtol=0, atol=0)


def test_causal_conv1d_fn_writes_prefix_caching_checkpoints():
    rng = np.random.default_rng(16)
    dim, width, slots = 10, 4, 7
    cu = np.array([0, 6, 8, 17], np.int32)
    x = rng.standard_normal((dim, 17)).astype(np.float32)
    weight = rng.standard_normal((dim, width)).astype(np.float32)
    conv_states = rng.standard_normal((slots, dim, width - 1)).astype(np.float32)
    cache = np.array([3, 1, 2], np.int32)
    has = np.array([True, False, True])
    # Sequence 0 after 4 tokens into slot 5; sequence 1 none; sequence 2 after 1 token (two
    # history columns kept) into slot 6.
    offsets = np.array([4, 0, 1], np.int32)
    ck_slots = np.array([5, 0, 6], np.int32)
    before = conv_states.copy()
    sk.causal_conv1d_fn(x, weight, None, conv_states, cu, cache_indices=cache, has_initial_state=has,
                        null_block_id=-1, checkpoint_offsets=offsets, checkpoint_state_indices=ck_slots)
    for s, (slot, off) in enumerate(zip(ck_slots, offsets)):
        if off == 0:
            continue
        hist = before[cache[s]] if has[s] else np.zeros((dim, width - 1), np.float32)
        win = np.concatenate([hist, x[:, cu[s]:cu[s] + off]], axis=1)
        np.testing.assert_array_equal(conv_states[slot], win[:, -(width - 1):])
    assert np.all(conv_states[[0, 4]] == before[[0, 4]]), "an unnamed slot was written"
    with pytest.raises(sk.SsmError, match="checkpoint_offsets"):
        sk.causal_conv1d_fn(x, weight, None, conv_states, cu, cache_indices=cache, has_initial_state=has,
                            null_block_id=-1, checkpoint_offsets=np.array([6, 0, 1], np.int32),
                            checkpoint_state_indices=ck_slots)


def test_chunk_gated_delta_rule_equals_the_recurrence():
    rng = np.random.default_rng(7)
    h, hv, kd, vd = 2, 4, 16, 8
    lens = [40, 0, 70]
    cu = np.array([0, 40, 40, 110], np.int32)
    q = rng.standard_normal((1, 110, h, kd)).astype(np.float32)
    k = rng.standard_normal((1, 110, h, kd)).astype(np.float32)
    v = rng.standard_normal((1, 110, hv, vd)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (1, 110, hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (1, 110, hv)).astype(np.float32)
    init = (rng.standard_normal((3, hv, vd, kd)) * 0.3).astype(np.float32)
    o, final = sk.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                         cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    for s in range(3):
        a, e = cu[s], cu[s + 1]
        seq = lambda t: t[:, a:e]
        want_o, want_state = gdn_reference(seq(q), seq(k), seq(v), seq(g), seq(beta), init[s:s + 1],
                                           np.array([0]), True)
        np.testing.assert_allclose(o[:, a:e], want_o, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(final[s], want_state[0], rtol=1e-3, atol=1e-3)
