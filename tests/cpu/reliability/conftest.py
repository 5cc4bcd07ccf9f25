"""Fixtures of the reliability suite: the fake driver (no cuModuleLoadData reaches a GPU), the
tiny fixture family's build, and the fake Hugging Face Hub of tests/cpu/hub."""
import importlib.util
from pathlib import Path

from ..loader.conftest import FakeDriver, FakeTensor, fake_driver, tiny_artifacts  # noqa: F401

# tests/cpu/hub is not a package (its conftest is pytest's own module): load it under a name of its own.
_spec = importlib.util.spec_from_file_location("aotc_reliability_fake_hub",
                                               Path(__file__).resolve().parents[1] / "hub" / "conftest.py")
fake_hub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_hub)
_hub_server, hub = fake_hub._hub_server, fake_hub.hub
