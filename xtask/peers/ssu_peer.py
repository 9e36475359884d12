#!/usr/bin/env python3
"""Times vLLM's own Triton `selective_state_update` on the SSU bench shapes; prints JSON.

    python3 xtask/peers/ssu_peer.py --vllm DIR [--shapes JSON] [--json OUT]

DIR holds `vllm/model_executor/layers/mamba/ops/{mamba_ssm.py,triton_helpers.py,configs/}`
extracted from the PyPI `vllm` wheel (`pip download --no-deps vllm`); the peer's code is
never part of this repository. The few vLLM modules those files import are stubbed here
(logger, platform, envs, triton re-exports, NULL_BLOCK_ID); the kernels run unmodified,
with vLLM's bundled tuned launch configs (H200 headdim 64 / dstate 128 ship with the wheel).

Timing mirrors ssm_cuda::bench: inputs as in Mamba2 decode (tied A/dt/D/dt_bias stride-0
views, bf16 io, softplus, 1-D slot table; speculative: 2-D table, num_accepted_tokens,
packed cu_seqlens), CUDA-graph replay of many calls rotating over enough state pools to
exceed the L2 several times, median over replays.
"""

import json
import sys

from peer_common import (
    graph_median_us, install_mamba_stubs, mamba2_tied_params, parse_args, pool_counts, report, spec_tables, uniform,
)


DEFAULT_SHAPES = [
    {"batch": b, "state": s, "tokens": t, "heads": 80, "dim": 64, "dstate": 128, "groups": 1}
    for t in (1, 4)
    for s in ("f32", "bf16")
    for b in (1, 8, 64, 256, 1024)
]


def bytes_per_call(s) -> int:
    b, t, h, p, n, g = s["batch"], s["tokens"], s["heads"], s["dim"], s["dstate"], s["groups"]
    es = 4 if s["state"] == "f32" else 2
    rows = b * t
    state = b * h * p * n * es * (1 + t)
    tok = rows * h * p * 2 * 2 + rows * h * 2 + rows * g * n * 2 * 2
    params = 3 * h * 4
    tables = b * t * 4 + b * 4 + (b + 1) * 4 if t > 1 else b * 4
    return state + tok + params + tables


def bench(ssu, s, torch):
    dev = "cuda"
    b, t, h, p, n, g = s["batch"], s["tokens"], s["heads"], s["dim"], s["dstate"], s["groups"]
    sdt = torch.float32 if s["state"] == "f32" else torch.bfloat16
    io = torch.bfloat16
    rows, slots = b * t, b * t
    pools, calls = pool_counts(bytes_per_call(s))
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    u = uniform(torch, gen, dev)

    A, D, dt_bias = mamba2_tied_params(torch, u, h, p, n)
    ps = []
    for i in range(pools):
        perm = torch.randperm(slots, device=dev, generator=gen).to(torch.int32)
        pool = {
            "state": u((slots, h, p, n), -1.0, 1.0, sdt),
            "x": u((rows, h, p), -1.0, 1.0, io),
            "dt": u((rows, h), -3.0, 1.0, io)[:, :, None].expand(rows, h, p),
            "B": u((rows, g, n), -1.0, 1.0, io),
            "C": u((rows, g, n), -1.0, 1.0, io),
            "out": torch.empty((rows, h, p), device=dev, dtype=io),
            **spec_tables(torch, gen, dev, perm, b, t),
        }
        ps.append(pool)

    def call(pool):
        ssu(
            pool["state"], pool["x"], pool["dt"], A, pool["B"], pool["C"], D, dt_bias,
            z=None, dt_softplus=True, state_batch_indices=pool["sbi"], null_block_id=-1,
            out=pool["out"], num_accepted_tokens=pool["nacc"], cu_seqlens=pool["cu"],
        )

    us = graph_median_us(torch, call, ps, calls)
    del ps
    torch.cuda.empty_cache()
    return {**s, "us": us, "gbps": bytes_per_call(s) / (us * 1e-6) / 1e9, "pools": pools, "calls_per_graph": calls}


def main():
    a = parse_args(__doc__.splitlines()[0], "Mamba2-2.7B")
    import torch
    import triton

    install_mamba_stubs(a.vllm)
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update

    shapes = json.loads(a.shapes) if a.shapes else DEFAULT_SHAPES
    results = []
    for s in shapes:
        r = bench(selective_state_update, s, torch)
        print(f"peer {s['state']:>4} b{s['batch']:<5} tokens {s['tokens']}: {r['us']:9.2f} us {r['gbps']:8.1f} GB/s", file=sys.stderr)
        results.append(r)
    peer = "vLLM Triton selective_state_update (mamba_ssm.py from the PyPI vllm wheel, unmodified; imports stubbed)"
    report(peer, torch, triton, results, a.json)


if __name__ == "__main__":
    main()
