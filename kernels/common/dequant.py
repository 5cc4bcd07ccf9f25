"""Dequantization of the quantized caches, as packed PTX on the GPU (decode's and prefix prefill's helpers).

int8/int4 words (int16 elements: int8 two channels, int4 four) and fp8 bytes become fp16 tensors
that tensor-core dots read: scaled values, exact codes, or codes plus a bias the caller removes.
Under TRITON_INTERPRET, and with PTX=0 (the kernels' constexpr: 0 on targets other than CUDA),
each helper takes a plain Triton branch that computes the same bits (tests/gpu/test_decode.py
compares the two on every byte value).
"""
import os

import triton
import triton.language as tl

# Packed PTX (four bytes a register, prmt/lop3/f16x2) in place of int->float conversions, which run
# at a quarter of the FP32 rate (BENCHMARKS.md, Kernel choices: packed dequantization). The
# interpreter cannot run PTX: it takes the plain Triton branch, which computes the same bits.
_INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


def _ptx(*lines: str) -> str:
    # One inline-asm block, a statement a line.
    return "{\n" + "".join(f"            {line}\n" for line in lines) + "            }"


def _i8_ptx(prmt=None, scales=None) -> str:
    """int8 codes -> fp16x2 $0 (bytes 0, 2 of $2) and $1 (bytes 1, 3): lop3 puts (byte ^ 0x80) under
    a 0x64 high byte (the fp16 1152 + code), minus 1152: the codes (exact), times the scale operands
    `scales` when given. prmt: a selector that first moves $2's bytes into that order."""
    src = "t" if prmt else "$2"
    lines = [".reg .b32 t, e, o, m;" if prmt else ".reg .b32 e, o, m;", "mov.b32 m, 0x64806480;",
             *([f"prmt.b32 t, $2, 0, {prmt};"] if prmt else []),
             f"lop3.b32 e, {src}, 0x00FF00FF, 0x64806480, 0x6A;", f"shr.b32 o, {src}, 8;",
             "lop3.b32 o, o, 0x00FF00FF, 0x64806480, 0x6A;"]
    if not scales:
        return _ptx(*lines, "sub.rn.f16x2 $0, e, m;", "sub.rn.f16x2 $1, o, m;")
    return _ptx(*lines, "sub.rn.f16x2 e, e, m;", "sub.rn.f16x2 o, o, m;", f"mul.rn.f16x2 $0, e, {scales[0]};",
                f"mul.rn.f16x2 $1, o, {scales[1]};")


def _e4m3_ptx(lo: str, hi: str, scales=None) -> str:
    """fp8 e4m3 bytes of $2 -> fp16x2 $0 (the bytes prmt selector lo picks) and $1 (hi), shifted
    under fp16's exponent: the value * 2^-8 (exact), or with the scale operands `scales`, times 256
    and the scale, rounded once."""
    a, b = ("e", "o") if scales else ("a", "b")
    widen = [f"prmt.b32 {a}, $2, 0, {lo};", f"prmt.b32 {b}, $2, 0, {hi};", f"shl.b32 {a}, {a}, 7;",
             f"shl.b32 {b}, {b}, 7;"]
    if not scales:
        return _ptx(".reg .b32 a, b;", *widen, "and.b32 $0, a, 0xBF80BF80;", "and.b32 $1, b, 0xBF80BF80;")
    return _ptx(".reg .b32 e, o, m;", "mov.b32 m, 0x5C005C00;", *widen, "and.b32 e, e, 0xBF80BF80;",
                "and.b32 o, o, 0xBF80BF80;", "mul.rn.f16x2 e, e, m;", "mul.rn.f16x2 o, o, m;",
                f"mul.rn.f16x2 $0, e, {scales[0]};", f"mul.rn.f16x2 $1, o, {scales[1]};")


# The packed dequantizers' PTX, Triton's helpers below and the Gluon prefix-prefill kernels'
# (kernels/prefix_prefill/kernel_ws.py, kernel_ws_rec.py) alike.
# int16 elements, two a 32-bit register (pack=2), fp16 scales: two int8 channels an element (even
# low byte, odd high byte) -> fp16 (even, odd) * s; without the scale, the codes (exact).
I8X2_DEQUANT_PTX = tl.constexpr(_i8_ptx(scales=("$3", "$3")))
I8X2_CODES_PTX = tl.constexpr(_i8_ptx())
# The same for two fp8 e4m3 channels an element: value * 2^-8, times 256 (exact), times s.
E4M3X2_DEQUANT_PTX = tl.constexpr(_e4m3_ptx("0xA280", "0xB391", scales=("$3", "$3")))
# Four bytes a register (pack=4), channel order: (c0, c1), (c2, c3). int8 codes times their scales
# (prmt puts bytes 0, 2 / 1, 3 in the halves); e4m3 codes times theirs; e4m3 value * 2^-8 (exact).
I8X4_DEQUANT_PTX = tl.constexpr(_i8_ptx(prmt="0x3120", scales=("$3", "$4")))
E4M3X4_DEQUANT_PTX = tl.constexpr(_e4m3_ptx("0x9180", "0xB3A2", scales=("$3", "$4")))
E4M3X4_BITS_PTX = tl.constexpr(_e4m3_ptx("0x9180", "0xB3A2"))
# Four int4 channels an element (nibble i = channel 4j + i, stored as code + 7) -> four fp16 * s.
I4X4_DEQUANT_PTX = tl.constexpr("""{
            .reg .b32 a, b, c, d, t, m;
            mov.b32 m, 0x64076407;
            lop3.b32 a, $4, 0x000F000F, 0x64006400, 0xEA;
            shr.b32 t, $4, 4;
            lop3.b32 b, t, 0x000F000F, 0x64006400, 0xEA;
            shr.b32 t, $4, 8;
            lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
            shr.b32 t, $4, 12;
            lop3.b32 d, t, 0x000F000F, 0x64006400, 0xEA;
            sub.rn.f16x2 a, a, m;
            sub.rn.f16x2 b, b, m;
            sub.rn.f16x2 c, c, m;
            sub.rn.f16x2 d, d, m;
            mul.rn.f16x2 $0, a, $5;
            mul.rn.f16x2 $1, b, $5;
            mul.rn.f16x2 $2, c, $5;
            mul.rn.f16x2 $3, d, $5;
            }""")


@triton.jit
def _i8x2_dequant(x, s, PTX: tl.constexpr):
    # int16 elements x, each two int8 channels (even low byte, odd high byte), fp16 scales s ->
    # fp16 (even, odd) * s. lop3 puts (byte ^ 0x80) under a 0x64 high byte: the fp16 1152 + code.
    if _INTERPRET or not PTX:
        sf = s.to(tl.float32)
        ev = (x << 8) >> 8
        od = x >> 8
        return (ev.to(tl.float32) * sf).to(tl.float16), (od.to(tl.float32) * sf).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            I8X2_DEQUANT_PTX,
            "=r,=r,r,r", [x, s], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _i4x4_dequant(x, s, PTX: tl.constexpr):
    # int16 elements x, each four int4 channels (nibble i = channel 4j + i, stored as code + 7),
    # fp16 scales s -> four fp16 tensors (channel 4j + i) * s. lop3 puts a nibble under 0x6400: 1024 + n.
    if _INTERPRET or not PTX:
        sf = s.to(tl.float32)
        c0 = (((x & 15).to(tl.float32) - 7.0) * sf).to(tl.float16)
        c1 = ((((x >> 4) & 15).to(tl.float32) - 7.0) * sf).to(tl.float16)
        c2 = ((((x >> 8) & 15).to(tl.float32) - 7.0) * sf).to(tl.float16)
        c3 = ((((x >> 12) & 15).to(tl.float32) - 7.0) * sf).to(tl.float16)
        return c0, c1, c2, c3
    else:
        return tl.inline_asm_elementwise(
            I4X4_DEQUANT_PTX,
            "=r,=r,=r,=r,r,r", [x, s], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True, pack=2)


@triton.jit
def _e4m3x2_dequant(x, s, PTX: tl.constexpr):
    # int16 elements x, each two fp8 e4m3 channels (even low byte, odd high byte), fp16 scales s ->
    # fp16 (even, odd) * s, rounded once: _fp8_bits_to_fp16's value * 2^-8, times 256 (exact), times s.
    if _INTERPRET or not PTX:
        sf = s.to(tl.float32)
        ev = _fp8_bits_to_fp16(x.to(tl.int8), 3, PTX).to(tl.float32) * 256.0
        od = _fp8_bits_to_fp16((x >> 8).to(tl.int8), 3, PTX).to(tl.float32) * 256.0
        return (ev * sf).to(tl.float16), (od * sf).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            E4M3X2_DEQUANT_PTX,
            "=r,=r,r,r", [x, s], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _i8x2_codes(x, PTX: tl.constexpr):
    # _i8x2_dequant without the scale: the codes, exact in fp16.
    if _INTERPRET or not PTX:
        return ((x << 8) >> 8).to(tl.float16), (x >> 8).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            I8X2_CODES_PTX,
            "=r,=r,r", [x], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _i8x2_biased(x, PTX: tl.constexpr):
    # The codes plus 1152, exact in fp16, for a dot whose bias the caller subtracts: one lop3 a
    # register of two channels (no f16x2 subtraction).
    if _INTERPRET or not PTX:
        return (((x << 8) >> 8) + 1152).to(tl.float16), ((x >> 8) + 1152).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 o;
            lop3.b32 $0, $2, 0x00FF00FF, 0x64806480, 0x6A;
            shr.b32 o, $2, 8;
            lop3.b32 $1, o, 0x00FF00FF, 0x64806480, 0x6A;
            }""",
            "=r,=r,r", [x], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _i4x4_biased(x, PTX: tl.constexpr):
    # Nibbles of int16 words as fp16 1024 + n (parts 0, 2) and 1024 + 16 n (parts 1, 3: the nibble
    # is masked in place, no shift), exact, for a dot whose bias and 1/16 the caller removes: five
    # instructions a register of eight channels.
    if _INTERPRET or not PTX:
        return ((x & 15) + 1024).to(tl.float16), ((x & 240) + 1024).to(tl.float16), \
            (((x >> 8) & 15) + 1024).to(tl.float16), (((x >> 8) & 240) + 1024).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 t;
            lop3.b32 $0, $4, 0x000F000F, 0x64006400, 0xEA;
            lop3.b32 $1, $4, 0x00F000F0, 0x64006400, 0xEA;
            shr.b32 t, $4, 8;
            lop3.b32 $2, t, 0x000F000F, 0x64006400, 0xEA;
            lop3.b32 $3, t, 0x00F000F0, 0x64006400, 0xEA;
            }""",
            "=r,=r,=r,=r,r", [x], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _i4x4_codes16(x, PTX: tl.constexpr):
    # The codes (nibble - 7), exact in fp16, parts 1 and 3 times 16 (see _i4x4_biased).
    if _INTERPRET or not PTX:
        return ((x & 15) - 7).to(tl.float16), ((x & 240) - 112).to(tl.float16), \
            (((x >> 8) & 15) - 7).to(tl.float16), (((x >> 8) & 240) - 112).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 a, b, c, d, t, m0, m1;
            mov.b32 m0, 0x64076407;
            mov.b32 m1, 0x64706470;
            lop3.b32 a, $4, 0x000F000F, 0x64006400, 0xEA;
            lop3.b32 b, $4, 0x00F000F0, 0x64006400, 0xEA;
            shr.b32 t, $4, 8;
            lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
            lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
            sub.rn.f16x2 $0, a, m0;
            sub.rn.f16x2 $1, b, m1;
            sub.rn.f16x2 $2, c, m0;
            sub.rn.f16x2 $3, d, m1;
            }""",
            "=r,=r,=r,=r,r", [x], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _u4x4_codes16(x, PTX: tl.constexpr):
    # Unsigned nibbles (vLLM's int4 codes, zero point apart), exact in fp16: n in parts 0 and 2,
    # 16 n in parts 1 and 3 (masked in place, as _i4x4_biased), for the V dots of int4_zp.
    if _INTERPRET or not PTX:
        return (x & 15).to(tl.float16), (x & 240).to(tl.float16), \
            ((x >> 8) & 15).to(tl.float16), ((x >> 8) & 240).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .b32 a, b, c, d, t, m;
            mov.b32 m, 0x64006400;
            lop3.b32 a, $4, 0x000F000F, 0x64006400, 0xEA;
            lop3.b32 b, $4, 0x00F000F0, 0x64006400, 0xEA;
            shr.b32 t, $4, 8;
            lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
            lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
            sub.rn.f16x2 $0, a, m;
            sub.rn.f16x2 $1, b, m;
            sub.rn.f16x2 $2, c, m;
            sub.rn.f16x2 $3, d, m;
            }""",
            "=r,=r,=r,=r,r", [x], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=2)


@triton.jit
def _fp8_bits_to_fp16(x, KV_KIND: tl.constexpr, PTX: tl.constexpr):
    # x: int8 bytes of fp8 values -> fp16 holding the value (e5m2) or the value * 2^-8 (e4m3, whose
    # exponent bias is 7 to fp16's 15), subnormals included. e5m2 is the top byte of an fp16.
    # e4m3: sign-extend to 16 bits and shift exponent and mantissa under fp16's; the extension
    # also set bit 14 (the top exponent bit), cleared with the bits below the mantissa.
    if _INTERPRET or not PTX:
        w = x.to(tl.int16)
        if KV_KIND == 3:
            w = (w << 7) & -16385  # ~0x4000 as int16
        else:
            w = w << 8
        return w.to(tl.float16, bitcast=True)
    elif KV_KIND == 3:
        return tl.inline_asm_elementwise(
            E4M3X4_BITS_PTX,
            "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(
            """{
            prmt.b32 $0, $2, 0, 0x1404;
            prmt.b32 $1, $2, 0, 0x3424;
            }""",
            "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _expand(s, ROWS: tl.constexpr, COLS: tl.constexpr):
    # Per-run scales [ROWS, R] to per-column [ROWS, COLS], each repeated over its COLS // R columns.
    RUN: tl.constexpr = COLS // s.shape[1]
    return tl.reshape(tl.broadcast_to(s[:, :, None], [ROWS, s.shape[1], RUN]), [ROWS, COLS])
