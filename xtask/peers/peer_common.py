"""What the peer scripts (ssu_peer.py, gdn_peer.py, gdn_chunk_peer.py, ssd_peer.py) share: the vLLM import stubs, the pool
sizing, the CUDA-graph timing loop and the JSON report.

Imported by the scripts from their own folder (Python puts a script's folder first on
sys.path), so this file travels with them: `cargo xtask gpu-bundle` copies it into
`peers/` too. torch and triton are imported only inside the functions that need them.
"""

import argparse
import json
import sys
import types


def stub_module(name: str, path=None, **attrs):
    """Registers an empty module `name` (a package when `path` is given) with `attrs`."""
    m = types.ModuleType(name)
    if path is not None:
        m.__path__ = [path]
    for k, v in attrs.items():
        setattr(m, k, v)
    sys.modules[name] = m
    return m


class Platform:
    """vLLM's `current_platform`, as far as the peer kernels ask it: one CUDA device."""

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def get_device_name(self, device_id: int = 0) -> str:
        import torch

        return torch.cuda.get_device_name(device_id)

    def get_device_capability(self, device_id: int = 0):
        import torch

        return torch.cuda.get_device_capability(device_id)

    def is_arch_support_pdl(self) -> bool:
        """vLLM's CUDA platform: programmatic dependent launch from compute capability 9."""
        import torch

        return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9

    def is_device_capability(self, capability: int, device_id: int = 0) -> bool:
        import torch

        major, minor = torch.cuda.get_device_capability(device_id)
        return major * 10 + minor == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        import torch

        major, minor = torch.cuda.get_device_capability(device_id)
        return (major * 10 + minor) // 10 == capability // 10


def install_base_stubs(pkg_dir: str, init_logger) -> Platform:
    """The `vllm` package (its real folder `pkg_dir`, its __init__.py not run), likewise
    `vllm.model_executor` and `vllm.model_executor.layers` (so that a whole-wheel extraction,
    whose __init__.py files import the rest of vLLM, works as well as the ops folders alone),
    `vllm.logger` with `init_logger`, `vllm.platforms` and `vllm.triton_utils`; returns the
    platform."""
    import os

    import triton
    import triton.language as tl

    platform = Platform()
    stub_module("vllm", path=pkg_dir)
    stub_module("vllm.model_executor", path=os.path.join(pkg_dir, "model_executor"))
    stub_module("vllm.model_executor.layers", path=os.path.join(pkg_dir, "model_executor", "layers"))
    stub_module("vllm.logger", init_logger=init_logger)
    stub_module("vllm.platforms", current_platform=platform)
    stub_module("vllm.triton_utils", HAS_TRITON=True, tl=tl, triton=triton, tldevice=tl)
    return platform


def install_mamba_stubs(root: str) -> Platform:
    """The stubs `vllm/model_executor/layers/mamba/ops/*.py` need (mamba_ssm.py's imports:
    envs, custom ops, platform utils, the attention backends' pad ids) over the real package
    folder `root/vllm`; returns the platform."""
    import logging
    import os
    import re

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

    platform = install_base_stubs(
        os.path.join(root, "vllm"), init_logger=lambda name: Logger(logging.getLogger(name), {})
    )
    stub_module("vllm.envs", VLLM_TUNED_CONFIG_FOLDER=None)
    stub_module("vllm._custom_ops")
    stub_module("vllm.utils")
    stub_module(
        "vllm.utils.platform_utils",
        get_device_name_as_file_name=lambda device_id=0: re.sub(r"[\s/]+", "_", platform.get_device_name(device_id)),
    )
    for name in ["vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"]:
        stub_module(name).__path__ = []
    stub_module("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=0, PAD_SLOT_ID=-1)
    return platform


def pool_counts(nbytes: int):
    """(state pools, calls per graph): enough pools of `nbytes` per call to exceed the L2
    several times (2..128), and a whole number of rounds over them of at least 64 calls."""
    pools = min(max(-(-400_000_000 // nbytes), 2), 128)
    return pools, pools * max(-(-64 // pools), 1)


def uniform(torch, gen, dev):
    """`u(shape, lo, hi, dtype)`: uniform in [lo, hi) drawn as f32 from `gen`, cast to dtype."""

    def u(shape, lo, hi, dtype):
        return (torch.rand(shape, generator=gen, device=dev, dtype=torch.float32) * (hi - lo) + lo).to(dtype)

    return u


def mamba2_tied_params(torch, u, h: int, p: int, n: int):
    """(A, D, dt_bias) of a Mamba2 decode as vLLM passes them: one f32 value per head, drawn by
    `u` (see `uniform`), as stride-0 views over the head dim (and dstate for A)."""
    A = u((h,), -2.0, -0.1, torch.float32)[:, None, None].expand(h, p, n)
    D = u((h,), -1.0, 1.0, torch.float32)[:, None].expand(h, p)
    dt_bias = u((h,), -1.0, 1.0, torch.float32)[:, None].expand(h, p)
    return A, D, dt_bias


def spec_tables(torch, gen, dev, perm, b: int, t: int):
    """The slot table (`[b, t]` when speculative, else 1-D), `num_accepted_tokens` in 1..t and
    packed `cu_seqlens` (both None when t == 1) of one pool, as vLLM's decode paths pass them."""
    spec = t > 1
    return {
        "sbi": perm.view(b, t) if spec else perm,
        "nacc": torch.randint(1, t + 1, (b,), device=dev, generator=gen, dtype=torch.int32) if spec else None,
        "cu": (torch.arange(b + 1, device=dev, dtype=torch.int32) * t) if spec else None,
    }


def graph_median_us(torch, call, pools: list, calls: int) -> float:
    """Median µs per call of a CUDA graph of `calls` calls rotating over `pools`, over 15
    replays (after a warm-up on a side stream and 3 untimed replays)."""
    # Warm-up (Triton compiles) on a side stream, as graph capture requires.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for pool in pools:
            call(pool)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(pools[i % len(pools)])
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
    return times[len(times) // 2]


def seq_lens(s: dict) -> list:
    """The sequence lengths of a prefill shape: its "lens" (sequences of varied length), else
    `batch` sequences of `seqlen` tokens."""
    return [int(n) for n in s.get("lens") or [s["seqlen"]] * s["batch"]]


def seqs_label(s: dict) -> str:
    """A prefill shape's sequences as our bench labels them: `4x2048` or `8v2048` (varied)."""
    return f"{s['batch']}v{s['tokens']}" if s.get("varied") else f"{s['batch']}x{s['seqlen']}"


def prefill_result(torch, s: dict, kernel: str, us: float, outs: list, nbytes: int, pools: int, calls: int) -> dict:
    """The result row of one timed prefill variant (`kernel`), after checking that its output
    tensors `outs` are finite after the replays; frees the allocator's cached blocks."""
    if not all(bool(torch.isfinite(o).all()) for o in outs):
        raise RuntimeError(f"{kernel} {s}: non-finite output after the replays")
    torch.cuda.empty_cache()
    return {
        **s, "kernel": kernel, "us": us, "gbps": nbytes / (us * 1e-6) / 1e9,
        "tflops": s["flops"] / (us * 1e-6) / 1e12, "pools": pools, "calls_per_graph": calls,
    }


def torch_and_triton(die):
    """torch and triton, or `die` with the reason (not installed, no CUDA device)."""
    try:
        import torch
        import triton
    except ImportError as e:
        die(f"torch and triton are needed ({e})")
    if not torch.cuda.is_available():
        die("torch sees no CUDA device")
    return torch, triton


def parse_args(description: str, default_set: str):
    """The peer scripts' command line: --vllm DIR [--shapes JSON] [--json OUT]."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--vllm", required=True, help="folder holding the extracted vllm/ package files")
    ap.add_argument("--shapes", help=f"JSON list of shapes (default: the {default_set} set)")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="also profile each shape's call (torch.profiler) and report its kernels' device time per call",
    )
    return ap.parse_args()


def profiler_range(torch, call, pools: list):
    """With SSM_PEER_PROFILE_RANGE=1 in the environment, one more eager call (already warmed up:
    no autotuning or compilation) between cudaProfilerStart and cudaProfilerStop, so that a
    profiler started with `--profile-from-start off` (Nsight Compute, nsys) sees exactly the
    kernels of one call with the configs the timed graph ran. Does nothing otherwise."""
    import os

    if os.environ.get("SSM_PEER_PROFILE_RANGE") != "1":
        return
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call(pools[0])
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def kernel_breakdown(torch, call, pools: list, reps: int = 20) -> list:
    """The kernels of one call and their device µs per call: `reps` eager calls over `pools`
    (already warmed up, so no autotuning or compilation) under torch.profiler, each kernel's
    total device time divided by `reps`, largest first. Launches run back to back on one
    stream, as in the timed graph, so each kernel's time here includes no launch gaps."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            call(pools[i % len(pools)])
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        if t > 0:
            rows.append({"kernel": e.key, "us": t / reps, "launches": e.count / reps})
    rows.sort(key=lambda r: -r["us"])
    return rows


def _decorated(modules, cls):
    """(name, object) of every `cls` instance in `modules`, found also under other decorators
    (FLA puts `triton.heuristics` over `triton.autotune` over `triton.jit`): `.fn` is followed."""
    for m in modules:
        for name, obj in vars(m).items():
            for _ in range(4):
                if isinstance(obj, cls) or not hasattr(obj, "fn"):
                    break
                obj = obj.fn
            if isinstance(obj, cls):
                yield name, obj


def _compiled(kernel) -> dict:
    """One compiled Triton kernel: warps, stages, registers, spills, shared bytes, and how many
    `wgmma` (Hopper warpgroup) and `mma.sync` instructions its PTX holds."""
    md = kernel.metadata
    ptx = kernel.asm.get("ptx", "") if hasattr(kernel, "asm") else ""
    return {
        "warps": getattr(md, "num_warps", None), "stages": getattr(md, "num_stages", None),
        "regs": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None),
        "shared": getattr(md, "shared", None), "wgmma": ptx.count("wgmma.mma_async"), "mma_sync": ptx.count("mma.sync"),
    }


def triton_choices(modules) -> dict:
    """What Triton made of the kernels in `modules` after the runs: `chosen`, the config each
    autotuner picked per tuning key; `compiled`, every candidate it compiled (`_compiled`).
    Best effort: a Triton whose caches are laid out otherwise reports less."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    chosen = {n: {str(k): str(c) for k, c in a.cache.items()} for n, a in _decorated(modules, Autotuner) if a.cache}
    compiled = {}
    for name, fn in _decorated(modules, JITFunction):
        rows = []
        for cache in getattr(fn, "device_caches", {}).values():
            kernels = cache[0] if isinstance(cache, tuple) else cache
            for k in getattr(kernels, "values", lambda: [])():
                try:
                    rows.append(_compiled(k))
                except Exception as e:  # noqa: BLE001 (a diagnostic: report, never fail the bench)
                    rows.append({"error": repr(e)})
        if rows:
            compiled[name] = rows
    return {"chosen": chosen, "compiled": compiled}


def print_breakdown(label: str, rows: list) -> None:
    """One line per kernel of a breakdown, to stderr."""
    print(f"kernels of {label} (device µs per call):", file=sys.stderr)
    for r in rows:
        print(f"  {r['us']:9.2f}  x{r['launches']:.0f}  {r['kernel'][:110]}", file=sys.stderr)


def report(peer: str, torch, triton, results: list, json_path, autotuned=None) -> None:
    """Prints the result document (and writes it to `json_path` when given)."""
    doc = {
        "peer": peer,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name(0),
        "results": results,
    }
    if autotuned:
        doc["autotuned"] = autotuned
    text = json.dumps(doc, indent=1)
    if json_path:
        with open(json_path, "w") as f:
            f.write(text)
    print(text)

