#!/usr/bin/env python3
"""Times vLLM's own Triton GDN chunked prefill (chunk_gated_delta_rule) on the GDN prefill bench shapes; prints JSON.

    python3 xtask/peers/gdn_chunk_peer.py --vllm DIR [--shapes JSON] [--json OUT] [--kernels]

DIR holds `vllm/third_party/flash_linear_attention/ops/` extracted from the PyPI `vllm` wheel
(`pip download --no-deps vllm`); DIR may also be the extracted `vllm/` folder itself. The peer's
code is never part of this repository. The few vLLM modules those files import are stubbed
(gdn_peer.install_vllm_stubs, plus the sync-debug and host-to-device helpers of `index.py`); the
kernels run unmodified, autotuned by Triton on the first call of each shape (before the timed
graph is captured).

The call is Qwen3-Next's prefill as vLLM 0.33's GDN layer makes it: bf16 q/k/v (`[1, T, H, K]`,
`[1, T, HV, V]`), f32 g and bf16 beta (`[1, T, HV]`), `use_qk_l2norm_in_kernel=True`, `batch`
sequences of `seqlen` tokens (or of the shape's `lens`) packed with `cu_seqlens` (with `chunk_indices` and
`chunk_offsets` precomputed, as the layer's metadata carries them), `core_attn_out` given, and
the final states returned. Two timings per shape:
- kernel "chunk": the call alone, with the initial states already gathered;
- kernel "chunk+pool": the layer's `initial_state = ssm_state[idx]`, zeroed where
  `has_initial_state` is false, the call, and `ssm_state[idx] = final_state.to(ssm_state.dtype)`:
  what our pooled in-place call does in one.

Timing mirrors ssm_cuda::bench (peer_common.graph_median_us): CUDA-graph replay of calls
rotating over enough problems to exceed the L2, median over 15 replays / calls.
--kernels adds peer_common.kernel_breakdown and triton_choices to the report.
"""

import contextlib
import json
import sys
import traceback

from gdn_peer import die, install_vllm_stubs, vllm_package_dir
from peer_common import graph_median_us, kernel_breakdown, parse_args, pool_counts, prefill_result, print_breakdown
from peer_common import profiler_range, seq_lens, seqs_label
from peer_common import report, stub_module, torch_and_triton, triton_choices, uniform


def bench(fn, s, torch, pooled: bool, kernels: bool = False):
    dev = "cuda"
    b, h, hv, k, v = s["batch"], s["heads"], s["v_heads"], s["k"], s["v"]
    lens = seq_lens(s)
    t = sum(lens)
    sdt = torch.float32 if s["state"] == "f32" else torch.bfloat16
    io = torch.bfloat16
    nbytes = int(s["bytes"])
    pools, calls = pool_counts(nbytes)
    gen = torch.Generator(device=dev)
    gen.manual_seed(2024)
    u = uniform(torch, gen, dev)
    # FLA's prepare_chunk_indices / prepare_chunk_offsets of these cu_seqlens (chunks of 64).
    ncs = [-(-n // 64) for n in lens]
    cu = torch.tensor([sum(lens[:i]) for i in range(b + 1)], device=dev, dtype=torch.int32)
    chunk_indices = torch.tensor([[i, j] for i, nc in enumerate(ncs) for j in range(nc)], dtype=torch.int32).to(dev)
    chunk_offsets = torch.tensor([sum(ncs[:i]) for i in range(b + 1)], device=dev, dtype=torch.int32)
    ps = []
    for _ in range(pools):
        slots = (torch.randperm(b, device=dev, generator=gen) + 1).long()
        ps.append({
            "q": u((1, t, h, k), -1.0, 1.0, io),
            "k": u((1, t, h, k), -1.0, 1.0, io),
            "v": u((1, t, hv, v), -1.0, 1.0, io),
            "g": u((1, t, hv), -1.0, -0.001, torch.float32),
            "beta": u((1, t, hv), 0.05, 0.95, io),
            "o": torch.empty((1, t, hv, v), device=dev, dtype=io),
            "state": u((b + 1, hv, v, k), -0.5, 0.5, sdt),
            "slots": slots,
            "has": torch.ones((b,), device=dev, dtype=torch.bool),
        })
    for pool in ps:
        pool["init"] = pool["state"][pool["slots"]].clone()

    def call(pool):
        if pooled:
            init = torch.where(pool["has"][:, None, None, None], pool["state"][pool["slots"]], 0)
        else:
            init = pool["init"]
        _, final = fn(
            pool["q"], pool["k"], pool["v"], pool["g"], pool["beta"], scale=k ** -0.5, initial_state=init,
            output_final_state=True, cu_seqlens=cu, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
            use_qk_l2norm_in_kernel=True, core_attn_out=pool["o"],
        )
        if pooled:
            pool["state"][pool["slots"]] = final.to(sdt)

    us = graph_median_us(torch, call, ps, calls)
    profiler_range(torch, call, ps)
    rows = kernel_breakdown(torch, call, ps) if kernels else None
    outs = [pp["o"] for pp in ps[:2]]
    del ps
    r = prefill_result(torch, s, "chunk+pool" if pooled else "chunk", us, outs, nbytes, pools, calls)
    if rows is not None:
        r["kernels"] = rows
    return r


def default_shapes():
    out = []
    for st in ("f32", "bf16"):
        for (b, L) in [(1, 2048), (4, 2048), (16, 512)]:
            h, hv, k, v = 16, 32, 128, 128
            t = b * L
            nbytes = 2 * t * h * k * 2 + 2 * t * hv * v * 2 + t * hv * 6 + 2 * b * hv * v * k * (4 if st == "f32" else 2)
            out.append({"batch": b, "seqlen": L, "tokens": t, "state": st, "heads": h, "v_heads": hv, "k": k, "v": v,
                        "bytes": nbytes, "flops": 0.0})
    return out


def main():
    a = parse_args(__doc__.splitlines()[0], "Qwen3-Next prefill")
    pkg = vllm_package_dir(a.vllm)
    torch, triton = torch_and_triton(die)
    try:
        install_vllm_stubs(pkg)
        stub_module("vllm.utils").__path__ = []
        stub_module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=contextlib.nullcontext)
        stub_module(
            "vllm.utils.torch_utils",
            async_tensor_h2d=lambda x, device, dtype, **kw: x.to(device=device, dtype=dtype),
        )
        from vllm.third_party.flash_linear_attention.ops.chunk import chunk_gated_delta_rule
    except Exception:
        traceback.print_exc()
        die(f"could not import vLLM's chunk_gated_delta_rule from {pkg}")

    shapes = json.loads(a.shapes) if a.shapes else default_shapes()
    results = []
    for s in shapes:
        for pooled in (False, True):
            try:
                with torch.inference_mode():
                    r = bench(chunk_gated_delta_rule, s, torch, pooled, a.kernels)
            except Exception:
                traceback.print_exc()
                die(f"chunk_gated_delta_rule failed on {s}")
            label = f"{r['kernel']:<10} {s['state']:>4} hv{s['v_heads']} {seqs_label(s)}"
            print(f"peer {label}: {r['us']:9.2f} us", file=sys.stderr)
            if "kernels" in r:
                print_breakdown(label, r["kernels"])
            results.append(r)
    peer = "vLLM Triton chunk_gated_delta_rule (flash_linear_attention/ops/*.py from the PyPI vllm wheel, unmodified; imports stubbed)"
    tuned = None
    if a.kernels:
        ops = "vllm.third_party.flash_linear_attention.ops."
        names = ("chunk", "chunk_delta_h", "chunk_o", "chunk_scaled_dot_kkt", "cumsum", "l2norm", "solve_tril", "wy_fast")
        tuned = triton_choices([sys.modules[ops + n] for n in names if ops + n in sys.modules])
    report(peer, torch, triton, results, a.json, tuned)


if __name__ == "__main__":
    main()
