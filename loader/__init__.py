"""aotc.loader: run the built kernels with no JIT.

    from aotc import loader
    out = loader.decode(q, k_cache, v_cache, table, seq_lens)

Public ops: `decode` (and `DecodePlan`: one step planned once, run per layer), `mla_decode`
(a latent MLA cache, and `MLADecodePlan`; `decode` also takes key and value head sizes that
differ), `store_kv`,
`prefix_prefill`, `gated_delta_decode`, `gated_delta_prefill` (each with its plan object:
`PrefixPrefillPlan`, `GatedDeltaDecodePlan`, `GatedDeltaPrefillPlan`). Artifacts come from `set_artifacts(...)`,
`AOTC_ARTIFACTS` (a folder or `hf://ORG/NAME@REV`), or the `artifacts/` folder beside this
package. Importing this module imports neither triton, click nor huggingface_hub; the ops are
imported on first use.
"""
from .artifacts import current_source, set_artifacts as _set_artifacts

_OPS = {
    "decode": "aotc.loader.ops.decode",
    "mla_decode": "aotc.loader.ops.mla",
    "MLADecodePlan": "aotc.loader.ops.mla_plan",
    "store_kv": "aotc.loader.ops.store_kv",
    "prefix_prefill": "aotc.loader.ops.prefix_prefill",
    "gated_delta_decode": "aotc.loader.ops.gated_delta",
    "DecodePlan": "aotc.loader.ops.decode_plan",
    "gated_delta_prefill": "aotc.loader.ops.gated_delta_prefill",
    "PrefixPrefillPlan": "aotc.loader.ops.prefix_prefill_plan",
    "GatedDeltaDecodePlan": "aotc.loader.ops.gated_delta_plan",
    "GatedDeltaPrefillPlan": "aotc.loader.ops.gated_delta_prefill_plan",
}

__all__ = ["decode", "mla_decode", "MLADecodePlan", "DecodePlan", "store_kv", "prefix_prefill", "PrefixPrefillPlan",
           "gated_delta_decode", "GatedDeltaDecodePlan", "gated_delta_prefill", "GatedDeltaPrefillPlan",
           "set_artifacts", "current_source"]


def set_artifacts(source) -> None:
    """Use artifacts from `source` (a folder or `hf://ORG/NAME@REV`); None restores the default."""
    from . import dispatch

    _set_artifacts(source)
    dispatch.reset()


def __getattr__(name):
    if name in _OPS:
        import importlib

        value = getattr(importlib.import_module(_OPS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aotc.loader' has no attribute {name!r}")
