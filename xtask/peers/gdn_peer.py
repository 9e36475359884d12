#!/usr/bin/env python3
"""Times vLLM's own Triton GDN decode kernels on the GDN bench shapes; prints JSON.

    python3 xtask/peers/gdn_peer.py --vllm DIR [--shapes JSON] [--json OUT]

DIR holds `vllm/third_party/flash_linear_attention/ops/{fused_recurrent.py,
fused_sigmoid_gating.py,op.py,utils.py}` extracted from the PyPI `vllm` wheel (`pip download
--no-deps vllm`); DIR may also be the extracted `vllm/` folder itself. The peer's code is never
part of this repository. The few vLLM modules those files import are stubbed here (platform,
triton re-exports) and the `ops` package's `__init__.py` (which pulls in the chunked prefill,
KDA, einops, custom ops) is bypassed; the kernels run unmodified.

Kernels, on the shapes `xtask bench-cuda-gdn` passes (Qwen3-Next: H 16, HV 32, K = V = 128,
bf16 q/k/v/o, state `[slots, HV, V, K]` f32 or bf16, q/k l2norm in the kernel, in place):
- `fused_sigmoid_gating_delta_rule_update` (op "sigmoid": gates fused), every shape;
- `fused_recurrent_gated_delta_rule_packed_decode` (op "sigmoid", one token only: vLLM's
  fastest decode path; q/k/v packed in one `mixed_qkv` row, 1-D slot table);
- `fused_recurrent_gated_delta_rule` (op "recurrent": g f32 and beta bf16 precomputed);
- vLLM's decode step (op "step", one token): `causal_conv1d_update` (from
  `vllm/model_executor/layers/mamba/ops/causal_conv1d.py`, bf16, width 4, no bias, silu, the SD
  conv-state storage `[slots, 3, dim]` passed transposed as the layer does, written to a separate
  output) then the packed decode on its output, timed as one pair per call. Ops "step_parts"
  and "step_fused" (our step on its other routes) have no peer of their own;
- `causal_conv1d_update` alone (op "conv"): the step's conv as above, one token per sequence.
Plain decode: dense `[B, 1, ...]` inputs, 1-D table. Speculative (tokens > 1): packed
`[1, B*T, ...]` inputs with `cu_seqlens`, a `[B, T]` table and `num_accepted_tokens` in 1..T,
as vLLM's spec-decode path calls them.

Timing mirrors ssm_cuda::bench: CUDA-graph replay of many calls rotating over enough state
pools to exceed the L2 several times (each pool with its own inputs and a random permutation of
slots 1..slots; slot 0 is the null block), median over 15 replays / calls. Bytes per call come
from the caller's shape JSON ("bytes"), the same figure our side uses (computed here when absent).
Any failure (missing file, import error, kernel error) exits nonzero with a message on stderr.
"""

import json
import os
import sys
import traceback

from peer_common import (
    graph_median_us,
    install_mamba_stubs,
    parse_args,
    pool_counts,
    report,
    spec_tables,
    stub_module,
    torch_and_triton,
    uniform,
)

OPS = "third_party/flash_linear_attention/ops"
NEEDED = ["fused_recurrent.py", "fused_sigmoid_gating.py", "op.py", "utils.py"]

SIGMOID = "fused_sigmoid_gating_delta_rule_update"
PACKED = "fused_recurrent_gated_delta_rule_packed_decode"
RECURRENT = "fused_recurrent_gated_delta_rule"
STEP = "causal_conv1d_update+fused_recurrent_gated_delta_rule_packed_decode"
CONV = "causal_conv1d_update"
STEP_WIDTH = 4


def die(msg: str) -> None:
    print(f"gdn_peer.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def vllm_package_dir(root: str) -> str:
    """The extracted `vllm/` package folder: DIR/vllm, or DIR itself."""
    for cand in (os.path.join(root, "vllm"), root):
        if all(os.path.isfile(os.path.join(cand, OPS, f)) for f in NEEDED):
            return os.path.abspath(cand)
    die(
        f"{root} holds neither vllm/{OPS}/ nor {OPS}/ with {', '.join(NEEDED)} "
        "(extract them from the vllm 0.33 wheel)"
    )
    return ""


def install_vllm_stubs(pkg_dir: str) -> None:
    # The mamba stubs (a superset of the base ones) also let causal_conv1d.py import.
    install_mamba_stubs(os.path.dirname(pkg_dir))
    # Package modules with their real folders but without running their __init__.py: the ops
    # package's would import the whole FLA stack (chunk, KDA, einops, vLLM custom ops).
    tp = os.path.join(pkg_dir, "third_party")
    stub_module("vllm.third_party", path=tp)
    stub_module("vllm.third_party.flash_linear_attention", path=os.path.join(tp, "flash_linear_attention"))
    stub_module("vllm.third_party.flash_linear_attention.ops", path=os.path.join(pkg_dir, OPS))


def default_bytes(s) -> int:
    """Bytes one call must move at least (ssm_cuda::bench_gdn::GdnBenchShape::bytes)."""
    b, t, h, hv, k, v = s["batch"], s["tokens"], s["heads"], s["v_heads"], s["k"], s["v"]
    es = 4 if s["state"] == "f32" else 2
    rows = b * t
    state = b * hv * v * k * es * (1 + t)
    tok = 2 * rows * h * k * 2 + 2 * rows * hv * v * 2
    gates = 2 * rows * hv * 2 + 2 * hv * 4 if s["op"] == "sigmoid" else rows * hv * (4 + 2)
    tables = b * t * 4 + b * 4 + (b + 1) * 4 if t > 1 else b * 4
    return state + tok + gates + tables


def bench(kernel, fn, s, torch):
    dev = "cuda"
    b, t, h, hv, k, v = s["batch"], s["tokens"], s["heads"], s["v_heads"], s["k"], s["v"]
    sdt = torch.float32 if s["state"] == "f32" else torch.bfloat16
    io = torch.bfloat16
    rows, slots = b * t, b * t
    spec = t > 1
    nbytes = int(s.get("bytes") or default_bytes(s))
    pools, calls = pool_counts(nbytes)
    bsz, tt = (1, rows) if spec else (b, 1)
    gen = torch.Generator(device=dev)
    gen.manual_seed(4321)
    u = uniform(torch, gen, dev)

    A_log = u((hv,), -1.0, 1.0, torch.float32)
    dt_bias = u((hv,), -1.0, 1.0, torch.float32)
    ps = []
    for _ in range(pools):
        perm = (torch.randperm(slots, device=dev, generator=gen) + 1).to(torch.int32)
        pool = {
            # The conv alone touches no recurrent state.
            "state": u((1,) if kernel == CONV else (slots + 1, hv, v, k), -0.5, 0.5, sdt),
            **spec_tables(torch, gen, dev, perm, b, t),
        }
        if kernel == CONV:
            dim = 2 * h * k + hv * v
            pool["x"] = u((b, dim), -1.0, 1.0, io)
            pool["conv_state"] = u((slots + 1, STEP_WIDTH - 1, dim), -1.0, 1.0, io)
            pool["conv_out"] = torch.empty((b, dim), device=dev, dtype=io)
        elif kernel == STEP:
            dim = 2 * h * k + hv * v
            pool["x"] = u((b, dim), -1.0, 1.0, io)
            pool["conv_state"] = u((slots + 1, STEP_WIDTH - 1, dim), -1.0, 1.0, io)
            pool["conv_out"] = torch.empty((b, dim), device=dev, dtype=io)
            pool["a"] = u((b, hv), -3.0, 3.0, io)
            pool["b"] = u((b, hv), -3.0, 3.0, io)
            pool["out"] = torch.empty((b, 1, hv, v), device=dev, dtype=io)
        elif kernel == PACKED:
            pool["mixed_qkv"] = u((b, 2 * h * k + hv * v), -1.0, 1.0, io)
            pool["a"] = u((b, hv), -3.0, 3.0, io)
            pool["b"] = u((b, hv), -3.0, 3.0, io)
            pool["out"] = torch.empty((b, 1, hv, v), device=dev, dtype=io)
        else:
            pool["q"] = u((bsz, tt, h, k), -1.0, 1.0, io)
            pool["k"] = u((bsz, tt, h, k), -1.0, 1.0, io)
            pool["v"] = u((bsz, tt, hv, v), -1.0, 1.0, io)
            if kernel == SIGMOID:
                pool["a"] = u((rows, hv), -3.0, 3.0, io)
                pool["b"] = u((rows, hv), -3.0, 3.0, io)
            else:
                pool["g"] = u((bsz, tt, hv), -1.5, -0.001, torch.float32)
                pool["beta"] = u((bsz, tt, hv), 0.05, 0.95, io)
        ps.append(pool)
    scale = k**-0.5
    conv_w = u((2 * h * k + hv * v, STEP_WIDTH), -0.5, 0.5, io) if kernel in (STEP, CONV) else None

    def call(p):
        if kernel == CONV:
            fn(
                p["x"], p["conv_state"].transpose(-1, -2), conv_w, bias=None, activation="silu",
                conv_state_indices=p["sbi"], out=p["conv_out"],
            )
        elif kernel == STEP:
            conv_update, packed = fn
            conv_update(
                p["x"], p["conv_state"].transpose(-1, -2), conv_w, bias=None, activation="silu",
                conv_state_indices=p["sbi"], out=p["conv_out"],
            )
            packed(
                mixed_qkv=p["conv_out"], a=p["a"], b=p["b"], A_log=A_log, dt_bias=dt_bias, scale=scale,
                initial_state=p["state"], out=p["out"], ssm_state_indices=p["sbi"], use_qk_l2norm_in_kernel=True,
            )
        elif kernel == PACKED:
            fn(
                mixed_qkv=p["mixed_qkv"], a=p["a"], b=p["b"], A_log=A_log, dt_bias=dt_bias, scale=scale,
                initial_state=p["state"], out=p["out"], ssm_state_indices=p["sbi"], use_qk_l2norm_in_kernel=True,
            )
        elif kernel == SIGMOID:
            fn(
                A_log=A_log, a=p["a"], b=p["b"], dt_bias=dt_bias, q=p["q"], k=p["k"], v=p["v"],
                beta=1.0, threshold=20.0, scale=scale, initial_state=p["state"], inplace_final_state=True,
                cu_seqlens=p["cu"], ssm_state_indices=p["sbi"], num_accepted_tokens=p["nacc"],
                use_qk_l2norm_in_kernel=True,
            )
        else:
            fn(
                q=p["q"], k=p["k"], v=p["v"], g=p["g"], beta=p["beta"], scale=scale, initial_state=p["state"],
                inplace_final_state=True, cu_seqlens=p["cu"], ssm_state_indices=p["sbi"],
                num_accepted_tokens=p["nacc"], use_qk_l2norm_in_kernel=True,
            )

    us = graph_median_us(torch, call, ps, calls)
    # A state that went non-finite would mean the peer ran something else than intended.
    checked = "conv_state" if kernel == CONV else "state"
    if not all(bool(torch.isfinite(p[checked]).all()) for p in ps[:2]):
        raise RuntimeError(f"{kernel} {s}: non-finite state after the replays")
    del ps
    torch.cuda.empty_cache()
    return {
        "op": s["op"], "kernel": kernel, "state": s["state"], "batch": b, "tokens": t, "heads": h,
        "v_heads": hv, "k": k, "v": v, "bytes": nbytes, "us": us, "gbps": nbytes / (us * 1e-6) / 1e9,
        "pools": pools, "calls_per_graph": calls,
    }


DEFAULT_SHAPES = [
    {"op": op, "batch": bt, "state": st, "tokens": t, "heads": 16, "v_heads": 32, "k": 128, "v": 128}
    for op in ("sigmoid", "recurrent")
    for st in ("f32", "bf16")
    for (bt, t) in [(1, 1), (8, 1), (64, 1), (256, 1), (1024, 1), (64, 3)]
]


def main():
    a = parse_args(__doc__.splitlines()[0], "Qwen3-Next")
    pkg = vllm_package_dir(a.vllm)
    torch, triton = torch_and_triton(die)
    try:
        install_vllm_stubs(pkg)
        from vllm.third_party.flash_linear_attention.ops.fused_recurrent import (
            fused_recurrent_gated_delta_rule,
            fused_recurrent_gated_delta_rule_packed_decode,
        )
        from vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating import (
            fused_sigmoid_gating_delta_rule_update,
        )
    except Exception:
        traceback.print_exc()
        die(f"could not import vLLM's GDN kernels from {pkg}")
    fns = {
        SIGMOID: fused_sigmoid_gating_delta_rule_update,
        PACKED: fused_recurrent_gated_delta_rule_packed_decode,
        RECURRENT: fused_recurrent_gated_delta_rule,
    }

    shapes = json.loads(a.shapes) if a.shapes else DEFAULT_SHAPES
    if any(s["op"] in ("step", "conv") for s in shapes):
        try:
            from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
        except Exception:
            traceback.print_exc()
            die(f"could not import vLLM's causal_conv1d_update from {pkg} (extract vllm/model_executor/layers/mamba/*)")
        fns[STEP] = (causal_conv1d_update, fused_recurrent_gated_delta_rule_packed_decode)
        fns[CONV] = causal_conv1d_update
    results = []
    for s in shapes:
        if s["op"] == "sigmoid":
            kernels = [SIGMOID] + ([PACKED] if s["tokens"] == 1 else [])
        elif s["op"] == "recurrent":
            kernels = [RECURRENT]
        elif s["op"] == "step":
            kernels = [STEP]
        elif s["op"] == "conv":
            kernels = [CONV]
        elif s["op"] in ("step_parts", "step_fused"):
            kernels = []
        else:
            die(f"unknown op {s['op']!r} in shape {s}")
        for kernel in kernels:
            try:
                with torch.inference_mode():
                    r = bench(kernel, fns[kernel], s, torch)
            except Exception:
                traceback.print_exc()
                die(f"{kernel} failed on {s}")
            print(
                f"peer {kernel:<47} {s['state']:>4} b{s['batch']:<5} tokens {s['tokens']}: "
                f"{r['us']:9.2f} us {r['gbps']:8.1f} GB/s",
                file=sys.stderr,
            )
            results.append(r)
    peer = (
        "vLLM Triton GDN decode kernels (fused_recurrent.py, fused_sigmoid_gating.py from the PyPI "
        "vllm wheel, unmodified; imports stubbed)"
    )
    report(peer, torch, triton, results, a.json)


if __name__ == "__main__":
    main()
