"""aotc.kernels: Triton sources, float32 torch references and variant tables, one folder per family."""
