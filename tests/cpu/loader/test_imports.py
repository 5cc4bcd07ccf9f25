"""Importing the loader (and taking the AOT path's modules) pulls in neither triton, click nor
huggingface_hub."""
import subprocess
import sys


def test_loader_import_is_light():
    code = ("import sys; from aotc import loader; import aotc.loader.dispatch, aotc.loader.launch, "
            "aotc.loader.artifacts, aotc.loader.cuda_driver; "
            "print(sorted(m for m in ('triton', 'click', 'huggingface_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
