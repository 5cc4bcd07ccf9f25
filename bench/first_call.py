"""First-call latency of loader.decode in a fresh process, after CUDA is initialized: AOT with
local artifacts, JIT with an empty Triton cache, JIT with a warm Triton cache."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from harness import Rows

CHILD = r"""
import sys, time, torch
validate = sys.argv[1] == "1"
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
from launch_overhead import decode_inputs
q, k, v, table, lens = decode_inputs()
torch.cuda.synchronize()
t0 = time.perf_counter()
from aotc import loader
decode = loader.decode  # imports the op module (torch.library registration)
t1 = time.perf_counter()
out = decode(q, k, v, table, lens, validate=validate)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"{(t2 - t1) * 1e3:.3f} {'triton' in sys.modules} {(t1 - t0) * 1e3:.3f}")
"""


def run(env_extra, validate=False, imports=None):
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, "1" if validate else "0"], capture_output=True,
                         text=True, env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
    if out.returncode:
        raise RuntimeError(out.stderr)
    ms, triton_loaded, import_ms = out.stdout.split()
    if imports is not None:
        imports.append(float(import_ms))
    return float(ms), triton_loaded == "True"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    rows = Rows(a.out)
    empty = tempfile.mkdtemp(prefix="no-artifacts-")
    results = {}
    imports = []
    aot = [run({}, imports=imports) for _ in range(a.repeats)]
    assert not any(t for _, t in aot), "the AOT path imported triton"
    results["aot"] = sorted(ms for ms, _ in aot)
    results["aot_validated"] = sorted(run({}, validate=True)[0] for _ in range(a.repeats))
    results["import_ops_ms"] = sorted(imports)
    cold, warm = [], []
    for _ in range(max(1, a.repeats // 2)):
        cache = tempfile.mkdtemp(prefix="triton-cache-")
        jit_env = {"AOTC_ARTIFACTS": empty, "TRITON_CACHE_DIR": cache, "AOTC_MISS_LOG": os.path.join(cache, "m.jsonl")}
        cold.append(run(jit_env)[0])
        warm.append(run(jit_env)[0])
    results["jit_cold_cache"] = sorted(cold)
    results["jit_warm_cache"] = sorted(warm)
    print("first loader.decode in a fresh process (ms, after CUDA init and `from aotc import loader`; "
          "min / median / max). aot: validate=False; aot_validated: the default value check;")
    print("import_ops_ms: importing the op module (torch.library registration), not part of the call:")
    for name, vals in results.items():
        med = vals[len(vals) // 2]
        print(f"  {name:16s} {vals[0]:9.2f} {med:9.2f} {vals[-1]:9.2f}")
        rows.add("decode", "bf16 b1 h32/8 d128 page16 len256", name, "first_call", "ms_median", med)


if __name__ == "__main__":
    main()
