"""Run by test_no_triton.py in a Python where Triton cannot be imported (its site folders hold
everything but Triton): the loader's non-JIT paths work, and each need for Triton is a clear error.

    python -S no_triton_check.py SITE ARTIFACTS TMP     (cwd: the repository root)

Prints one "ok: ..." line per check; any failure raises.
"""
import importlib.metadata
import os
import shutil
import site
import sys
import warnings
from pathlib import Path

site_dir, art, tmp = sys.argv[1:4]
site.addsitedir(site_dir)  # the copy of the site folders without Triton (.pth files, the editable aotc)
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: tests.cpu...
tmp = Path(tmp)

try:
    import triton  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit(f"the check needs a Python without Triton; it imported {triton.__file__}")
try:
    importlib.metadata.version("triton")
except importlib.metadata.PackageNotFoundError:
    pass
else:
    raise SystemExit("the check needs a Python without Triton; its metadata is installed")
print("ok: no triton")

import torch  # noqa: E402

from aotc import loader  # noqa: E402
from aotc.kernels.registry import get_spec  # noqa: E402
from aotc.loader import artifacts, cuda_driver, dispatch, fallback  # noqa: E402
from aotc.loader.manifest import ManifestError, read_manifest  # noqa: E402
from tests.cpu.loader.conftest import FakeDriver, FakeTensor  # noqa: E402

for name in ("decode", "store_kv", "prefix_prefill"):  # every op module, and its torch.library op
    getattr(loader, name)
    assert hasattr(torch.ops.aotc, name)
assert "triton" not in sys.modules
print("ok: loader and ops import")

# Manifest loading and the variant choice, from artifacts built by the parent process.
loader.set_artifacts(art)
target = artifacts.load_target((9, 0))
assert target is not None and target.name == "sm90" and target.manifest.triton_version != "?"
spec, axes = get_spec("tiny_axpy"), {"block": 64, "dtype": "fp16"}
vals = [0x1000, 0x2002, 0x3000, 128, 100, 3, 0.5]
assert dispatch.resolve(spec, axes, target.entries, vals).level == "aligned"
res = dispatch.resolve(spec, axes, target.entries, [0x1008] + vals[1:])
assert res.level == "generic" and "x: data_ptr 4104 is not divisible by 16" in res.rejected["aligned"]
print("ok: manifest and variant choice")

# The AOT launch: the binary is sha256-checked, loaded and launched (a fake driver stands in for CUDA).
fake = FakeDriver()
fake.n_params = 9
cuda_driver._driver = fake
sel = dispatch.Selection(spec, axes, 0, target, (9, 0))
sel.launch((3, 1, 1), [FakeTensor(0x1000), FakeTensor(0x2002), FakeTensor(0x3000), 128, 100, 3, 0.5], stream=7)
assert [l[1] for l in fake.loaded] == [target.entries.get("tiny_axpy(block=64,dtype=fp16)@aligned").sha256]
assert len(fake.launches) == 1 and fake.launches[0][1] == (3, 1, 1)
shutil.copytree(Path(art) / "sm90", tmp / "bad" / "sm90")
entry = target.entries.get("tiny_axpy(block=64,dtype=fp16)@generic")
(tmp / "bad" / "sm90" / entry.path).write_bytes(b"\0" * entry.size)
bad = artifacts.TargetArtifacts("sm90", tmp / "bad" / "sm90", read_manifest(tmp / "bad" / "sm90"))
try:
    bad.read_binary(entry)
    raise AssertionError("a damaged binary was read")
except ManifestError as e:
    assert "damaged or altered" in str(e)
print("ok: AOT launch path")

# Validation: wrong inputs raise naming the argument, before anything would need Triton.
q = torch.randn(2, 4, 64, dtype=torch.float16)
cache = torch.randn(8, 16, 2, 64, dtype=torch.float16)
table = torch.zeros(2, 4, dtype=torch.int32)
lens = torch.tensor([5, 17], dtype=torch.int32)
for bad_args, err, words in (((q.float(), cache, cache, table, lens), TypeError, "q"),
                             ((q, cache, cache, table.long(), lens), TypeError, "table"),
                             ((q, cache, cache[:, :, :1], table, lens), ValueError, "v_cache")):
    try:
        loader.decode(*bad_args)
        raise AssertionError(f"no error for a bad {words}")
    except err as e:
        assert words in str(e), e
print("ok: validation errors")

# Where Triton is needed: a clear error naming the key, not an ImportError from deep inside.
os.environ["AOTC_MISS_LOG"] = str(tmp / "misses.jsonl")
built_with = target.manifest.triton_version
try:  # what a CUDA miss calls before it compiles (run_jit, jit_programs_per_sm)
    fallback.import_triton(spec, {"block": 256, "dtype": "fp16"}, 90, built_with)
    raise AssertionError("import_triton returned without Triton")
except fallback.TritonUnavailableError as e:
    text = str(e)
assert "tiny_axpy(block=256,dtype=fp16)@generic on sm90" in text and "aotc build --arch sm90" in text, text
assert f"pip install 'triton=={built_with}'" in text and "pip install 'aotc[build]'" in text, text
miss = dispatch.Selection(spec, {"block": 256, "dtype": "fp16"}, 0, target, (9, 0))
x = torch.randn(1, 8, dtype=torch.float16)
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    try:  # a key that was not built: logged for the build, then the JIT cannot run it
        miss.launch((1, 1, 1), [x, x, x.clone(), 8, 8, 1, 1.0], stream=0)
        raise AssertionError("a miss ran without Triton")
    except fallback.TritonUnavailableError as e:
        assert "tiny_axpy(block=256,dtype=fp16)@generic" in str(e), e
assert "tiny_axpy(block=256,dtype=fp16)@generic" in (tmp / "misses.jsonl").read_text()
os.environ["TRITON_INTERPRET"] = "1"
try:
    loader.decode(q, cache, cache, table, lens)
    raise AssertionError("the interpreter ran without Triton")
except fallback.TritonUnavailableError as e:
    assert "decode_split(" in str(e) and "interpreter" in str(e), e
del os.environ["TRITON_INTERPRET"]
print("ok: JIT needs are clear errors")

# The command line: list works; build stops before compiling, naming the version and the recipe.
from click.testing import CliRunner  # noqa: E402

from aotc.aot.cli import cli  # noqa: E402
from aotc.aot.triton_compat import SUPPORTED_TRITON  # noqa: E402

listed = CliRunner().invoke(cli, ["list", art])
assert listed.exit_code == 0 and "sm90" in listed.output and "tiny_axpy" in listed.output, listed.output
built = CliRunner().invoke(cli, ["build", "--arch", "sm90", "--kernel", "tiny_axpy", "--out", str(tmp / "out")])
assert built.exit_code == 1, (built.exit_code, built.output)
assert f"Triton {SUPPORTED_TRITON}" in built.output and "Triton is not installed" in built.output, built.output
assert "pip install 'aotc[build]'" in built.output and not (tmp / "out").exists(), built.output
print("ok: aotc list and build")
