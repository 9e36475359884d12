#!/usr/bin/env python3
"""Times vLLM's own Triton ReplaySSM decode on the ReplaySSM bench's one-token shapes; prints JSON.

    python3 xtask/peers/replayssm_peer.py --vllm DIR [--shapes JSON] [--json OUT]

DIR holds `vllm/model_executor/layers/mamba/ops/{selective_state_update_replayssm_output_only.py,
replayssm_config.py,mamba_ssm.py,triton_helpers.py}` extracted from the PyPI `vllm` wheel; the
peer's code is never part of this repository. vLLM's imports are stubbed as in ssu_peer.py and
the kernels run unmodified, with vLLM's launch config for the card (`get_replayssm_config`).

The kernel is vLLM's Triton ReplaySSM (`selective_state_update_replayssm_output_only`: its
bc precompute and its output kernel), the decode path of `MambaMixer2` with `--use-replayssm`
on the Triton backend: one token per sequence a step, a ring of `max_cache_len` rows of x, dt
(f32) and B per slot, the checkpoint read every step and written on a flush. (vLLM runs
speculative ReplaySSM only through FlashInfer's `checkpointing_ssu`, which is not a Triton
kernel of the wheel, so the 4-token rows have no peer.)

The shapes mirror ssm_cuda::bench_ring: row `i` of the batch has `k = i mod P` cached rows
(`write_pos = k`, `P = window + 1 = max_cache_len`), and flushes when `k = window` (the ring
full), so one sequence in `P` writes its checkpoint. `write_pos` and `is_flush` stay fixed, as
vLLM's metadata builder would set them for that step, so every replay does the same work.
Inputs as in Mamba2 decode (tied A/dt/D/dt_bias stride-0 views, bf16 io, softplus, a slot
table), CUDA-graph replay rotating over enough pools to exceed the L2, median over replays.
"""

import json
import sys

from peer_common import (
    graph_median_us, install_mamba_stubs, mamba2_tied_params, parse_args, pool_counts, report, uniform,
)


DEFAULT_SHAPES = [
    {"batch": b, "state": s, "tokens": 1, "heads": 80, "dim": 64, "dstate": 128, "groups": 1, "window": 15}
    for s in ("f32", "bf16")
    for b in (1, 8, 64, 256)
]


def history(s, i: int) -> int:
    """Cached rows of batch row `i` (ssm_cuda::bench_ring::ReplaySsmBenchShape::history, T = 1)."""
    return i % (s["window"] + 1)


def bytes_per_call(s) -> int:
    """The fewest bytes a call moves, counted as ssm_cuda::bench_ring counts them (T = 1)."""
    b, h, p, n, g, w = s["batch"], s["heads"], s["dim"], s["dstate"], s["groups"], s["window"]
    es = 4 if s["state"] == "f32" else 2
    slot = h * p * n * es
    row = h * p * 2 + g * n * 2 + h * 4
    hist = sum(history(s, i) for i in range(b))
    flushing = sum(1 for i in range(b) if history(s, i) + 1 > w)
    tokens = b * (h * p * 2 * 2 + h * 2 + g * n * 2 * 2)
    return b * slot + flushing * slot + (hist + b) * row + tokens + 3 * h * 4 + 3 * b * 4


def bench(replay, s, torch):
    dev = "cuda"
    b, h, p, n, g, w = s["batch"], s["heads"], s["dim"], s["dstate"], s["groups"], s["window"]
    ring = w + 1
    sdt = torch.float32 if s["state"] == "f32" else torch.bfloat16
    io = torch.bfloat16
    nbytes = bytes_per_call(s)
    pools, calls = pool_counts(nbytes)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    u = uniform(torch, gen, dev)

    A, D, dt_bias = mamba2_tied_params(torch, u, h, p, n)
    hist = [history(s, i) for i in range(b)]
    write_pos = torch.tensor(hist, device=dev, dtype=torch.int32)
    is_flush = torch.tensor([k + 1 > w for k in hist], device=dev, dtype=torch.bool)
    ps = []
    for i in range(pools):
        ps.append({
            "state": u((b, h, p, n), -1.0, 1.0, sdt),
            "x_cache": u((b, h, ring, p), -1.0, 1.0, io),
            "dt_cache": u((b, h, ring), 0.01, 0.2, torch.float32),
            "B_cache": u((b, g, ring, n), -1.0, 1.0, io),
            "bc_pre": torch.empty((b, g, ring), device=dev, dtype=torch.float32),
            "x": u((b, h, p), -1.0, 1.0, io),
            "dt": u((b, h), -3.0, 1.0, io)[:, :, None].expand(b, h, p),
            "B": u((b, g, n), -1.0, 1.0, io),
            "C": u((b, g, n), -1.0, 1.0, io),
            "out": torch.empty((b, h, p), device=dev, dtype=io),
            "sbi": torch.randperm(b, device=dev, generator=gen).to(torch.int32),
        })

    def call(pool):
        replay(
            pool["state"], pool["x"], pool["dt"], A, pool["B"], pool["C"], D, dt_bias,
            z=None, dt_softplus=True, x_cache=pool["x_cache"], dt_cache=pool["dt_cache"],
            B_cache=pool["B_cache"], bc_pre=pool["bc_pre"], write_pos=write_pos, is_flush=is_flush,
            max_cache_len=ring, state_batch_indices=pool["sbi"], null_block_id=-1, out=pool["out"],
        )

    us = graph_median_us(torch, call, ps, calls)
    del ps
    torch.cuda.empty_cache()
    return {**s, "us": us, "gbps": nbytes / (us * 1e-6) / 1e9, "bytes": nbytes, "pools": pools,
            "calls_per_graph": calls, "flushing": int(is_flush.sum().item())}


def main():
    a = parse_args(__doc__.splitlines()[0], "Mamba2-2.7B one-token ReplaySSM")
    import torch
    import triton

    install_mamba_stubs(a.vllm)
    from vllm.model_executor.layers.mamba.ops.selective_state_update_replayssm_output_only import (
        selective_state_update_replayssm_output_only,
    )

    shapes = [s for s in (json.loads(a.shapes) if a.shapes else DEFAULT_SHAPES) if s["tokens"] == 1]
    results = []
    for s in shapes:
        r = bench(selective_state_update_replayssm_output_only, s, torch)
        print(f"peer replayssm {s['state']:>4} b{s['batch']:<5} w{s['window']}: {r['us']:9.2f} us {r['gbps']:8.1f} GB/s",
              file=sys.stderr)
        results.append(r)
    peer = ("vLLM Triton ReplaySSM decode, selective_state_update_replayssm_output_only "
            "(the PyPI vllm wheel's file, unmodified; imports stubbed)")
    report(peer, torch, triton, results, a.json)


if __name__ == "__main__":
    main()
