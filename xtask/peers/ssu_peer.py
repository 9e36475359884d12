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

import argparse
import json
import logging
import os
import re
import sys
import types


def install_vllm_stubs(root: str) -> None:
    import torch
    import triton
    import triton.language as tl

    pkg = types.ModuleType("vllm")
    pkg.__path__ = [os.path.join(root, "vllm")]
    sys.modules["vllm"] = pkg

    def module(name: str, **attrs):
        m = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(m, k, v)
        sys.modules[name] = m
        return m

    class Logger(logging.LoggerAdapter):
        def info_once(self, msg, *a, **k):
            k.pop("scope", None)
            self.info(msg, *a, **k)

        def warning_once(self, msg, *a, **k):
            k.pop("scope", None)
            self.warning(msg, *a, **k)

        def debug_once(self, msg, *a, **k):
            k.pop("scope", None)
            self.debug(msg, *a, **k)

    class Platform:
        def is_xpu(self):
            return False

        def is_cpu(self):
            return False

        def is_cuda(self):
            return True

        def get_device_name(self, device_id: int = 0) -> str:
            return torch.cuda.get_device_name(device_id)

    platform = Platform()
    module("vllm.envs", VLLM_TUNED_CONFIG_FOLDER=None)
    module("vllm._custom_ops")
    module("vllm.logger", init_logger=lambda name: Logger(logging.getLogger(name), {}))
    module("vllm.platforms", current_platform=platform)
    module("vllm.triton_utils", HAS_TRITON=True, tl=tl, triton=triton, tldevice=tl)
    module("vllm.utils")
    module(
        "vllm.utils.platform_utils",
        get_device_name_as_file_name=lambda device_id=0: re.sub(r"[\s/]+", "_", platform.get_device_name(device_id)),
    )
    for name in ["vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"]:
        module(name).__path__ = []
    module("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=0, PAD_SLOT_ID=-1)


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
    spec = t > 1
    pools = min(max(-(-400_000_000 // bytes_per_call(s)), 2), 128)
    calls = pools * max(-(-64 // pools), 1)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)

    def u(shape, lo, hi, dtype):
        return (torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * (hi - lo) + lo).to(dtype)

    A = u((h,), -2.0, -0.1, torch.float32)[:, None, None].expand(h, p, n)
    D = u((h,), -1.0, 1.0, torch.float32)[:, None].expand(h, p)
    dt_bias = u((h,), -1.0, 1.0, torch.float32)[:, None].expand(h, p)
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
            "sbi": perm.view(b, t) if spec else perm,
            "nacc": torch.randint(1, t + 1, (b,), device=dev, generator=gen, dtype=torch.int32) if spec else None,
            "cu": (torch.arange(b + 1, device=dev, dtype=torch.int32) * t) if spec else None,
        }
        ps.append(pool)

    def call(pool):
        ssu(
            pool["state"], pool["x"], pool["dt"], A, pool["B"], pool["C"], D, dt_bias,
            z=None, dt_softplus=True, state_batch_indices=pool["sbi"], null_block_id=-1,
            out=pool["out"], num_accepted_tokens=pool["nacc"], cu_seqlens=pool["cu"],
        )

    # Warm-up (Triton compiles) on a side stream, as graph capture requires.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for pool in ps:
            call(pool)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(ps[i % pools])
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e) * 1e3 / calls)
    times.sort()
    us = times[len(times) // 2]
    del ps, graph
    torch.cuda.empty_cache()
    return {**s, "us": us, "gbps": bytes_per_call(s) / (us * 1e-6) / 1e9, "pools": pools, "calls_per_graph": calls}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", required=True, help="folder holding the extracted vllm/ package files")
    ap.add_argument("--shapes", help="JSON list of shapes (default: the Mamba2-2.7B set)")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    import torch
    import triton

    install_vllm_stubs(a.vllm)
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update

    shapes = json.loads(a.shapes) if a.shapes else DEFAULT_SHAPES
    results = []
    for s in shapes:
        r = bench(selective_state_update, s, torch)
        print(f"peer {s['state']:>4} b{s['batch']:<5} tokens {s['tokens']}: {r['us']:9.2f} us {r['gbps']:8.1f} GB/s", file=sys.stderr)
        results.append(r)
    doc = {
        "peer": "vLLM Triton selective_state_update (mamba_ssm.py from the PyPI vllm wheel, unmodified; imports stubbed)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name(0),
        "results": results,
    }
    text = json.dumps(doc, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
