#!/usr/bin/env python3
"""Times vLLM's own Triton SSD prefill (mamba_chunk_scan_combined_varlen) on the SSD bench shapes; prints JSON.

    python3 xtask/peers/ssd_peer.py --vllm DIR [--shapes JSON] [--json OUT] [--kernels]

DIR holds the extracted `vllm/model_executor/layers/mamba/ops/` files of the PyPI `vllm`
wheel (`pip download --no-deps vllm`, then unzip `vllm/model_executor/layers/mamba/*`); the
peer's code is never part of this repository. The few vLLM modules they import are stubbed
(peer_common.install_mamba_stubs); the kernels run unmodified, autotuned by Triton on the
first call of each shape (before the timed graph is captured).

The call is vLLM 0.33's Mamba2 mixer prefill (mamba_mixer2.py): bf16 x, dt, B, C and out,
f32 A, D and dt_bias, dt_softplus, `batch` fresh sequences of `seqlen` tokens or of the shape's `lens` (chunk metadata
as vLLM builds it), `state_dtype` = the pool's dtype, and the final states written into the
pool by the kernel (`final_states_out=ssm_state`, `final_state_indices` a permutation of slots
1..batch). Two timings per shape:
- kernel "ssd": the call alone, with the initial states already gathered;
- kernel "ssd+gather": the mixer's `initial_states = torch.where(has_initial_states_p,
  ssm_state[state_indices], 0)` followed by the call, which is what our pooled call does in one.

Timing mirrors ssm_cuda::bench (peer_common.graph_median_us): CUDA-graph replay of calls
rotating over enough problems to exceed the L2, median over 15 replays / calls.
--kernels adds peer_common.kernel_breakdown and triton_choices to the report.
"""

import json
import sys

from peer_common import graph_median_us, kernel_breakdown, parse_args, pool_counts, prefill_result, print_breakdown
from peer_common import profiler_range, seq_lens, seqs_label
from peer_common import install_mamba_stubs, report, triton_choices, uniform


def chunk_metadata(torch, lens: list, chunk: int, dev):
    """vLLM's metadata of fresh sequences of `lens` tokens (no prefix: chunks start at each
    sequence's start)."""
    cu_chunk, seq_idx, last, cu = [0], [], [], [0]
    pos = 0
    for b, seqlen in enumerate(lens):
        cu.append(cu[-1] + seqlen)
        left = seqlen
        while left > 0:
            step = min(chunk, left)
            pos += step
            left -= step
            cu_chunk.append(pos)
            seq_idx.append(b)
        last.append(len(seq_idx) - 1)
    i32 = lambda v: torch.tensor(v, device=dev, dtype=torch.int32)  # noqa: E731
    return i32(cu), i32(cu_chunk), i32(last), i32(seq_idx)


def bench(fn, s, torch, gathered: bool, kernels: bool = False):
    dev = "cuda"
    b, h, p, n, g, q = s["batch"], s["heads"], s["dim"], s["dstate"], s["groups"], s["chunk"]
    lens = seq_lens(s)
    t = sum(lens)
    sdt = torch.float32 if s["state"] == "f32" else torch.bfloat16
    io = torch.bfloat16
    nbytes = int(s["bytes"])
    pools, calls = pool_counts(nbytes)
    gen = torch.Generator(device=dev)
    gen.manual_seed(777)
    u = uniform(torch, gen, dev)
    A = u((h,), -2.0, -0.1, torch.float32)
    D = u((h,), -1.0, 1.0, torch.float32)
    dt_bias = u((h,), -1.0, 1.0, torch.float32)
    cu, cu_chunk, last, seq_idx = chunk_metadata(torch, lens, q, dev)
    ps = []
    for _ in range(pools):
        slots = (torch.randperm(b, device=dev, generator=gen) + 1).to(torch.int32)
        ps.append({
            "x": u((t, h, p), -1.0, 1.0, io),
            "dt": u((t, h), -4.0, 0.0, io),
            "B": u((t, g, n), -1.0, 1.0, io),
            "C": u((t, g, n), -1.0, 1.0, io),
            "out": torch.empty((t, h, p), device=dev, dtype=io),
            "pool": u((b + 1, h, p, n), -0.5, 0.5, sdt),
            "slots": slots,
            "has": torch.ones((b,), device=dev, dtype=torch.bool),
        })
    for pool in ps:
        pool["init"] = pool["pool"][pool["slots"].long()].clone()

    def call(pool):
        if gathered:
            init = torch.where(pool["has"][:, None, None, None], pool["pool"][pool["slots"]], 0)
        else:
            init = pool["init"]
        fn(
            pool["x"], pool["dt"], A, pool["B"], pool["C"], q, cu, cu_chunk, last, seq_idx, pool["out"],
            D=D, z=None, dt_bias=dt_bias, initial_states=init, dt_softplus=True, dt_limit=(0.0, float("inf")),
            state_dtype=sdt, final_states_out=pool["pool"], final_state_indices=pool["slots"],
        )

    us = graph_median_us(torch, call, ps, calls)
    profiler_range(torch, call, ps)
    rows = kernel_breakdown(torch, call, ps) if kernels else None
    outs = [pp["out"] for pp in ps[:2]]
    del ps
    r = prefill_result(torch, s, "ssd+gather" if gathered else "ssd", us, outs, nbytes, pools, calls)
    if rows is not None:
        r["kernels"] = rows
    return r


def default_shapes():
    out = []
    for st in ("f32", "bf16"):
        for (b, L) in [(1, 2048), (4, 2048), (16, 512)]:
            h, p, n, g, q = 80, 64, 128, 1, 256
            t = b * L
            nbytes = 2 * t * h * p * 2 + t * h * 2 + 2 * t * g * n * 2 + 2 * b * h * p * n * (4 if st == "f32" else 2)
            out.append({"batch": b, "seqlen": L, "tokens": t, "state": st, "heads": h, "dim": p, "dstate": n,
                        "groups": g, "chunk": q, "bytes": nbytes, "flops": 0.0})
    return out


def main():
    a = parse_args(__doc__.splitlines()[0], "Mamba2-2.7B prefill")
    import torch
    import triton

    install_mamba_stubs(a.vllm)
    from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

    shapes = json.loads(a.shapes) if a.shapes else default_shapes()
    results = []
    for s in shapes:
        for gathered in (False, True):
            r = bench(mamba_chunk_scan_combined_varlen, s, torch, gathered, a.kernels)
            label = f"{r['kernel']:<10} {s['state']:>4} h{s['heads']} g{s['groups']} {seqs_label(s)}"
            print(f"peer {label}: {r['us']:9.2f} us", file=sys.stderr)
            if "kernels" in r:
                print_breakdown(label, r["kernels"])
            results.append(r)
    peer = "vLLM Triton mamba_chunk_scan_combined_varlen (ssd_*.py from the PyPI vllm wheel, unmodified; imports stubbed)"
    from vllm.model_executor.layers.mamba.ops import ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_state_passing

    tuned = triton_choices([ssd_bmm, ssd_chunk_scan, ssd_chunk_state, ssd_state_passing]) if a.kernels else None
    report(peer, torch, triton, results, a.json, tuned)


if __name__ == "__main__":
    main()
