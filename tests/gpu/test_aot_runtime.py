"""The AOT runtime on a real GPU: AOT output equals the JIT's bit for bit for every built decode
variant (and the JIT compiles the same split and merge cubins), misaligned inputs take the generic binary and
stay correct, first loads are thread-safe, and the AOT path never imports triton."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from aotc import loader
from aotc.kernels.decode import spec as decode_spec
from aotc.kernels.decode.reference import decode_reference
from aotc.kernels.variants import GENERIC
from aotc.loader import artifacts, dispatch
from aotc.loader.fallback import AotcJitFallbackWarning
from tests.gpu.aot_jit import jit_cubin_shas, loaded_entries

TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
         "fp32": torch.float32}


def make_case(axes, batch=3, kv_heads=2, group=4, page=16, lens=(1, 100, 300), seed=0):
    """Random inputs for one split-kernel variant, built through the public ops."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    hd, q_dt, kv = axes["head_dim"], TORCH[axes["q"]], axes["kv"]
    pages_per = (max(lens) + page - 1) // page
    num_pages = batch * pages_per + 3
    q = torch.randn(batch, kv_heads * group, hd, device="cuda", dtype=q_dt, generator=g)
    k = torch.randn(num_pages * page, kv_heads, hd, device="cuda", dtype=q_dt, generator=g)
    v = torch.randn(num_pages * page, kv_heads, hd, device="cuda", dtype=q_dt, generator=g)
    kw = {}
    if axes.get("score") == "mod":  # vLLM's score modifiers: the "mod" binaries
        kw = dict(softcap=20.0, alibi_slopes=torch.rand(kv_heads * group, device="cuda", generator=g),
                  alibi_sqrt=hd == 128)
    if axes.get("kv_align") in (4, 8):  # vLLM's per-token-head caches
        from tests.cpu.kernels.decode.test_vllm_caches import _shifted_by_4, vllm_inline_cache

        fmt = kv
        kc, vc, ks, vs, _, _ = vllm_inline_cache(k.view(num_pages, page, kv_heads, hd),
                                                 v.view(num_pages, page, kv_heads, hd), fmt)
        if axes["kv_align"] == 4:  # 8 takes vLLM's record as it is
            if kv == "int8" and axes.get("score") != "mod":  # 4-byte rows off the record (16-byte ones: 16)
                kc, vc, ks, vs = _shifted_by_4(kc, vc, ks, vs)
            else:
                kc, vc, ks, vs = kc.contiguous(), vc.contiguous(), ks.contiguous(), vs.contiguous()
        kw.update(k_scale=ks, v_scale=vs, kv_format=fmt)
    elif kv == "int4_zp":  # vLLM's INT4_PER_TOKEN_HEAD codes, read as the kernel does (no rotation)
        from tests.cpu.kernels.decode.test_vllm_int4 import int4_cache

        kc, vc, ks, vs, _, _ = int4_cache(k.view(num_pages, page, kv_heads, hd), v.view(num_pages, page, kv_heads, hd))
        kw.update(k_scale=ks, v_scale=vs, kv_format="int4_zp")
    elif kv in ("fp16", "bf16"):
        kc, vc = k.view(num_pages, page, kv_heads, hd), v.view(num_pages, page, kv_heads, hd)
    elif axes.get("scales") == "channel":  # int8, fp32 scales [kv_heads, head_dim]
        kc = torch.zeros(num_pages, page, kv_heads, hd, device="cuda", dtype=torch.int8)
        vc = torch.zeros_like(kc)
        ks = (2.0 + 4.0 * torch.rand(kv_heads, hd, device="cuda", generator=g)) / 127
        vs = (2.0 + 4.0 * torch.rand(kv_heads, hd, device="cuda", generator=g)) / 127
        kw = dict(k_scale=ks, v_scale=vs, kv_format=kv, scale_layout="channel")
        slots = torch.arange(num_pages * page, device="cuda", dtype=torch.int32)
        loader.store_kv(k, v, kc, vc, slots, **kw)
    elif kv in ("int8", "int4"):
        width = hd // 2 if kv == "int4" else hd
        # the group size that selects the variant: one scale a token, 64 channels (int8 at head_dim
        # 128: "chunk"), 32 ("group") or 16
        qg = {"token": hd, "chunk": 64, "group": 32}.get(axes.get("scales"), 16)
        kc = torch.zeros(num_pages, page, kv_heads, width, device="cuda", dtype=torch.int8)
        vc = torch.zeros_like(kc)
        ks = torch.zeros(num_pages, page, kv_heads, hd // qg, device="cuda", dtype=TORCH[axes["scale"]])
        vs = torch.zeros_like(ks)
        slots = torch.arange(num_pages * page, device="cuda", dtype=torch.int32)
        loader.store_kv(k, v, kc, vc, slots, k_scale=ks, v_scale=vs, kv_format=kv)
        kw.update(k_scale=ks, v_scale=vs, kv_format=kv)
    else:
        scale = torch.rand(kv_heads, device="cuda", generator=g) + 0.5
        kc = (k.float() / scale[None, :, None]).to(TORCH[kv]).view(num_pages, page, kv_heads, hd)
        vc = (v.float() / scale[None, :, None]).to(TORCH[kv]).view(num_pages, page, kv_heads, hd)
        kw.update(k_scale=scale, v_scale=scale.clone(), kv_format=kv)
    table = torch.randperm(num_pages, device="cuda", generator=g)[: batch * pages_per].to(torch.int32).view(batch, pages_per)
    seq_lens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    return (q, kc, vc, table, seq_lens), kw


def batch_for_tile(axes, kv_heads=2, group=4) -> int:
    """The smallest batch from 3 at which the op picks this variant's tile (spec.choose_tile)."""
    tiles = decode_spec.split_tiles(axes["kv"], axes["head_dim"], axes["scales"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = 3
    while decode_spec.choose_tile(tiles, batch * kv_heads * decode_spec.head_blocks(group), sms) != axes["tile"]:
        batch += 1
    return batch


def built_split_variants():
    tgt = artifacts.load_target(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
    if tgt is None:
        return []
    return sorted({e.key.rsplit("@", 1)[0] for e in tgt.manifest.entries if e.kernel == "decode_split"})


@pytest.fixture
def jit_only(tmp_path, monkeypatch):
    """Switch the loader to an empty artifacts folder: every call runs through Triton's JIT."""
    def switch(on):
        loader.set_artifacts(tmp_path if on else None)
    monkeypatch.setenv("AOTC_MISS_LOG", str(tmp_path / "misses.jsonl"))
    yield switch
    loader.set_artifacts(None)


def test_every_built_decode_variant_matches_the_jit_bit_for_bit(jit_only):
    variants = built_split_variants()
    assert variants, "no decode_split artifacts: run aotc build --arch sm90 first"
    # AOTC_DECODE_PARITY: alternatives joined by ",", each parts joined by "+" (e.g.
    # "kv_align=4+q=bf16,score=mod+head_dim=128"): the built keys holding every part of one of them
    # (each JIT compile takes ~5 s; by default every built variant)
    only = os.environ.get("AOTC_DECODE_PARITY", "")
    if only:
        variants = [v for v in variants if any(all(p in v for p in alt.split("+")) for alt in only.split(","))]
        assert variants, f"AOTC_DECODE_PARITY={only!r} matches no built decode_split key"
    target = artifacts.load_target(torch.cuda.get_device_capability())
    jit_only(False)  # forget the binaries earlier tests of this process loaded (loaded_entries)
    for key_text in variants:
        axes = {k: (int(v) if v.isdigit() else v) for k, v in
                (p.split("=") for p in key_text[key_text.index("(") + 1:-1].split(","))}
        batch = batch_for_tile(axes)  # narrow int4 per-token takes a grid that fills the GPU
        args, kw = make_case(axes, batch=batch, lens=((1, 100, 300) * batch)[:batch])
        with warnings.catch_warnings():
            warnings.simplefilter("error", AotcJitFallbackWarning)  # the AOT run must not fall back
            aot = loader.decode(*args, **kw)
        torch.cuda.synchronize()
        used = loaded_entries(decode_spec.SPLIT.name, axes)
        assert used, f"the AOT run loaded no binary of {key_text}"
        jit_only(True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AotcJitFallbackWarning)
            jit = loader.decode(*args, **kw)
        jit_only(False)
        torch.cuda.synchronize()
        assert torch.equal(aot, jit), key_text
        # the level the case's addresses took (vLLM's inline rows: GENERIC), each built binary it loaded
        shas = jit_cubin_shas(decode_spec.SPLIT)
        for entry in used:
            assert entry.sha256 in shas, f"JIT cubin differs for {entry.key}"
    # The merge kernels the JIT compiled (sm90: programmatic dependent launches) are built bytes too.
    merges = [e for e in target.manifest.entries if e.kernel == "decode_merge"]
    jit_merges = jit_cubin_shas(decode_spec.MERGE)
    assert jit_merges and jit_merges <= {e.sha256 for e in merges}
    if torch.cuda.get_device_capability() >= (9, 0):
        assert all(e.launch_pdl for e in merges)


def test_aot_matches_the_reference():
    axes = decode_spec.split_axes("bf16", "bf16", "fp32", 128)
    args, kw = make_case(axes, batch=6, lens=(0, 1, 63, 64, 65, 5000))
    out = loader.decode(*args, **kw)
    ref = decode_reference(*args, **kw)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_misaligned_query_takes_the_generic_binary_and_stays_correct():
    axes = decode_spec.split_axes("fp16", "fp16", "fp32", 128)
    (q, kc, vc, table, lens), kw = make_case(axes, batch=2, lens=(77, 300))
    buf = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    q_mis = buf[1:].view_as(q)  # 2 bytes off 16-byte alignment
    q_mis.copy_(q)
    out = loader.decode(q_mis, kc, vc, table, lens)
    sel = next(s for (name, _, _), s in dispatch._selections.items()
               if name == "decode_split" and s.axes["q"] == "fp16" and s.axes["kv"] == "fp16" and s.axes["head_dim"] == 128)
    assert GENERIC in sel.loaded
    ref = decode_reference(q, kc, vc, table, lens)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_first_loads_from_many_threads_at_once():
    code = r"""
import threading, torch
from aotc import loader
from tests.gpu.test_aot_runtime import make_case
from aotc.kernels.decode import spec
from aotc.kernels.decode.reference import decode_reference
args, kw = make_case(spec.split_axes("bf16", "bf16", "fp32", 128))
ref = decode_reference(*args)
errors, outs = [], [None] * 8
def work(i):
    try:
        outs[i] = loader.decode(*args, **kw); torch.cuda.synchronize()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
assert not errors, errors
for o in outs:
    torch.testing.assert_close(o.float(), ref.float(), atol=3e-2, rtol=3e-2)
import sys
from aotc.loader import dispatch
loaded = [len(s.loaded) for s in dispatch._selections.values()]
print("OK", "triton" in sys.modules, loaded)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    ok, triton_imported, _ = out.stdout.split(maxsplit=2)
    assert ok == "OK"


def test_aot_calls_never_import_triton():
    code = r"""
import sys, torch
from aotc import loader
from tests.gpu.test_aot_runtime import make_case
from aotc.kernels.decode import spec
for kv, scale in (("bf16", "fp32"), ("int4", "bf16"), ("int8", "fp32")):
    args, kw = make_case(spec.split_axes("bf16", kv, scale, 128, quant_group=32))
    loader.decode(*args, **kw)
torch.cuda.synchronize()
print(sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_bad_values_raise_before_launch_on_the_gpu():
    axes = decode_spec.split_axes("bf16", "bf16", "fp32", 128)
    (q, kc, vc, table, lens), _ = make_case(axes, batch=2, lens=(10, 40))
    out = torch.full_like(q, float("nan"))
    cap = table.shape[1] * kc.shape[1]
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = .* is outside"):
        loader.decode(q, kc, vc, table, torch.tensor([10, cap + 1], device="cuda", dtype=torch.int32), out=out)
    bad_table = table.clone()
    bad_table[1, 0] = kc.shape[0] + 5
    with pytest.raises(ValueError, match=r"table\[1, 0\] = .* is not a page"):
        loader.decode(q, kc, vc, bad_table, lens, out=out)
    with pytest.raises(ValueError, match=r"req_idx\[0\] = 7 is outside"):
        loader.decode(q, kc, vc, table, lens, req_idx=torch.tensor([7, 0], device="cuda", dtype=torch.int32), out=out)
    torch.cuda.synchronize()
    assert out.isnan().all()  # nothing was launched
