"""The Python package on torch CUDA tensors (DLPack; launched on torch's current stream),
against the same call on numpy arrays on the CPU. Skipped without torch or a CUDA device; also
runs as a script (``python test_cuda.py``) where pytest is not installed."""

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

import ssm_kernels as sk

CUDA = torch is not None and torch.cuda.is_available()

try:
    import pytest

    pytestmark = pytest.mark.skipif(not CUDA, reason="needs torch with a CUDA device")
except ImportError:  # run as a script
    pass


def cuda(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def ssu_case(rng):
    batch, h, p, n, g, slots = 5, 4, 16, 32, 2, 8
    return dict(
        state=rng.standard_normal((slots, h, p, n)).astype(np.float32),
        x=rng.standard_normal((batch, h, p)).astype(np.float32),
        dt=rng.uniform(-2, 1, (batch, h, 1)).astype(np.float32),
        A=-rng.uniform(0.1, 2, (h, 1, 1)).astype(np.float32),
        B=rng.standard_normal((batch, g, n)).astype(np.float32),
        C=rng.standard_normal((batch, g, n)).astype(np.float32),
        D=rng.uniform(0.5, 1.5, (h, 1)).astype(np.float32),
        dt_bias=rng.uniform(-1, 1, (h, 1)).astype(np.float32),
        sbi=np.array([6, 0, 2, 7, 3], np.int32),
        shape=(batch, h, p, n),
    )


def run_ssu(c, to):
    batch, h, p, n = c["shape"]
    state = to(c["state"])
    bcast = np.broadcast_to if to is np.copy else (lambda a, s: a.expand(*s))
    out = sk.selective_state_update(
        state, to(c["x"]), bcast(to(c["dt"]), (batch, h, p)), bcast(to(c["A"]), (h, p, n)), to(c["B"]),
        to(c["C"]), bcast(to(c["D"]), (h, p)), bcast(to(c["dt_bias"]), (h, p)), dt_softplus=True,
        state_batch_indices=to(c["sbi"]))
    return state, out


def test_ssu_on_cuda_tensors_matches_the_cpu():
    c = ssu_case(np.random.default_rng(0))
    want_state, want_out = run_ssu(c, np.copy)
    got_state, got_out = run_ssu(c, cuda)
    torch.cuda.synchronize()
    sk.check()
    np.testing.assert_allclose(got_out.cpu().numpy(), want_out, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got_state.cpu().numpy(), want_state, rtol=2e-4, atol=2e-4)


def test_bf16_state_on_cuda_through_dlpack():
    c = ssu_case(np.random.default_rng(1))
    want_state, want_out = run_ssu(c, np.copy)
    bf = lambda a: cuda(a).to(torch.bfloat16) if a.dtype == np.float32 and a.ndim == 4 else cuda(a)
    got_state, got_out = run_ssu(c, bf)
    torch.cuda.synchronize()
    np.testing.assert_allclose(got_out.cpu().float().numpy(), want_out, rtol=3e-2, atol=3e-2)
    np.testing.assert_allclose(got_state.float().cpu().numpy(), want_state, rtol=3e-2, atol=3e-2)


def test_garbage_device_indices_are_reported_by_check():
    c = ssu_case(np.random.default_rng(2))
    c["sbi"] = np.array([6, 99, 2, 7, 3], np.int32)
    before = c["state"].copy()
    state, _ = run_ssu(c, cuda)  # no host sync: the kernel skips row 1 and flags it
    try:
        sk.check()
    except sk.SsmError as e:
        assert "slot" in str(e), e
    else:
        raise AssertionError("check() did not report the bad slot")
    untouched = [s for s in range(8) if s not in (6, 2, 7, 3)]
    np.testing.assert_array_equal(state.cpu().numpy()[untouched], before[untouched])


def test_gdn_decode_on_cuda_tensors_matches_the_cpu():
    rng = np.random.default_rng(3)
    n, h, hv, k, v, slots = 4, 2, 4, 32, 16, 6
    q, kk = (rng.standard_normal((n, 1, h, k)).astype(np.float32) for _ in range(2))
    vv = rng.standard_normal((n, 1, hv, v)).astype(np.float32)
    A_log, dt_bias = (rng.uniform(-1, 1, hv).astype(np.float32) for _ in range(2))
    a, b = (rng.standard_normal((n, hv)).astype(np.float32) for _ in range(2))
    state = (rng.standard_normal((slots, hv, v, k)) * 0.3).astype(np.float32)
    idx = np.array([5, 1, 3, 2], np.int32)
    args = (A_log, a, b, dt_bias, q, kk, vv)
    want_state = state.copy()
    want_o, _ = sk.fused_sigmoid_gating_delta_rule_update(*args, initial_state=want_state, ssm_state_indices=idx,
                                                         use_qk_l2norm_in_kernel=True)
    got_state = cuda(state)
    got_o, _ = sk.fused_sigmoid_gating_delta_rule_update(*map(cuda, args), initial_state=got_state,
                                                        ssm_state_indices=cuda(idx), use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    sk.check()
    np.testing.assert_allclose(got_o.cpu().numpy(), want_o, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got_state.cpu().numpy(), want_state, rtol=2e-4, atol=2e-4)


def test_gdn_prefill_on_cuda_tensors_matches_the_cpu():
    # f16 q/k/v/beta on both sides: the GPU's tensor-core prefill rounds its operands to f16 where
    # vLLM's Triton kernels do, the CPU computes in f32; both within 1e-2 of each other.
    rng = np.random.default_rng(5)
    h, hv, kd, vd, t = 2, 4, 64, 32, 150
    cu = np.array([0, 40, 40, 150], np.int32)
    q, kk = (rng.uniform(-1, 1, (1, t, h, kd)).astype(np.float16) for _ in range(2))
    vv = rng.uniform(-1, 1, (1, t, hv, vd)).astype(np.float16)
    g = -rng.uniform(0.01, 0.5, (1, t, hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (1, t, hv)).astype(np.float16)
    init = (rng.standard_normal((3, hv, vd, kd)) * 0.3).astype(np.float32)
    args = (q, kk, vv, g, beta)
    want_o, want_final = sk.chunk_gated_delta_rule(*args, initial_state=init, output_final_state=True, cu_seqlens=cu,
                                                   use_qk_l2norm_in_kernel=True)
    got_o, got_final = sk.chunk_gated_delta_rule(*map(cuda, args), initial_state=cuda(init), output_final_state=True,
                                                 cu_seqlens=cuda(cu), use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    sk.check()
    np.testing.assert_allclose(got_o.float().cpu().numpy(), want_o.astype(np.float32), rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(got_final.cpu().numpy(), want_final, rtol=1e-2, atol=1e-2)


def test_ssd_prefill_with_pool_and_checkpoint_on_cuda_matches_the_cpu():
    # bf16 x/B/C on the GPU (tensor-core operands), their f32 values on the CPU; final states
    # written through a slot table and a prefix-caching checkpoint into its own slot.
    rng = np.random.default_rng(8)
    lens, computed, chunk, offsets = [90, 37], [20, 0], 32, [50, 0]
    total, h, p, n, slots = sum(lens), 4, 16, 32, 5
    cu = np.array([0, 90, 127], np.int32)
    cu_chunk, seq_idx, last, ckpt = sk.compute_chunk_metadata(cu, computed, chunk, checkpoint_offsets=offsets)
    assert list(ckpt) == [2, -1]
    bf = [torch.from_numpy(rng.uniform(-1, 1, s).astype(np.float32)).bfloat16()
          for s in [(total, h, p), (total, 1, n), (total, 1, n)]]
    x, B, C = (t.float().numpy() for t in bf)
    dt = rng.uniform(-2, 0.5, (total, h)).astype(np.float32)
    A = -rng.uniform(0.2, 2, h).astype(np.float32)
    pool = (rng.standard_normal((slots, h, p, n)) * 0.3).astype(np.float32)
    fin, ck_slot = np.array([1, 3], np.int32), np.array([4, 0], np.int32)
    want_pool, want_out = pool.copy(), np.zeros((total, h, p), np.float32)
    sk.mamba_chunk_scan_combined_varlen(
        x, dt, A, B, C, chunk, cu, cu_chunk, last, seq_idx, want_out, dt_softplus=True,
        final_states_out=want_pool, final_state_indices=fin, checkpoint_chunk_indices=ckpt,
        checkpoint_state_indices=ck_slot)
    got_pool, got_out = cuda(pool), torch.zeros((total, h, p), dtype=torch.bfloat16, device="cuda")
    xg, Bg, Cg = (t.cuda() for t in bf)
    sk.mamba_chunk_scan_combined_varlen(
        xg, cuda(dt), cuda(A), Bg, Cg, chunk, cuda(cu), cuda(cu_chunk), cuda(last), cuda(seq_idx), got_out,
        dt_softplus=True, final_states_out=got_pool, final_state_indices=cuda(fin),
        checkpoint_chunk_indices=cuda(ckpt), checkpoint_state_indices=cuda(ck_slot))
    torch.cuda.synchronize()
    sk.check()
    got_pool = got_pool.cpu().numpy()
    np.testing.assert_allclose(got_out.float().cpu().numpy(), want_out, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(got_pool, want_pool, rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(got_pool[[0, 2]], pool[[0, 2]])  # untouched slots keep their bits
    assert not np.array_equal(want_pool[4], pool[4]), "the checkpoint was written"


def test_conv_prefill_with_checkpoints_on_cuda_matches_the_cpu():
    # Mamba2's conv prefill (width 4, vLLM's [dim, tokens] x) with prefix-caching checkpoints:
    # the conv state after each checkpoint's tokens goes to its own slot, bit for bit as on the CPU.
    rng = np.random.default_rng(9)
    dim, width, slots = 72, 4, 8
    cu = np.array([0, 70, 73, 150], np.int32)  # the first sequence spans two 64-token chunks
    x = rng.standard_normal((dim, 150)).astype(np.float32)
    weight = rng.standard_normal((dim, width)).astype(np.float32)
    bias = rng.standard_normal(dim).astype(np.float32)
    states = rng.standard_normal((slots, dim, width - 1)).astype(np.float32)
    cache, has = np.array([2, 5, 1], np.int32), np.array([True, False, True])
    offsets, ck_slots = np.array([66, 2, 1], np.int32), np.array([6, 3, 7], np.int32)
    want_states = states.copy()
    want = sk.causal_conv1d_fn(x, weight, bias, want_states, cu, cache_indices=cache, has_initial_state=has,
                               null_block_id=-1, checkpoint_offsets=offsets, checkpoint_state_indices=ck_slots)
    got_states = cuda(states)
    got = sk.causal_conv1d_fn(cuda(x), cuda(weight), cuda(bias), got_states, cuda(cu), cache_indices=cuda(cache),
                              has_initial_state=cuda(has), null_block_id=-1, checkpoint_offsets=cuda(offsets),
                              checkpoint_state_indices=cuda(ck_slots))
    torch.cuda.synchronize()
    sk.check()
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got_states.cpu().numpy(), want_states)
    assert not np.array_equal(want_states[6], states[6]), "the checkpoint was written"
    np.testing.assert_array_equal(want_states[[0, 4]], states[[0, 4]])  # unnamed slots keep their bits


if __name__ == "__main__":
    print(f"torch {torch.__version__ if torch else None}, CUDA {CUDA}")
    if not CUDA:
        raise SystemExit("needs torch with a CUDA device")
    for name, f in sorted(globals().items()):
        if name.startswith("test_"):
            f()
            print(f"{name}: ok")
