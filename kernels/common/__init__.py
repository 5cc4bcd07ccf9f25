"""What the kernel families share, beside them rather than inside one: the quantized cache formats
(formats.py), their dequantization on the GPU (dequant.py) and float32 reference (quant_reference.py),
and the flattened block schedule (schedule.py). A family imports only these and kernels/variants.py
(tests/cpu/kernels/test_layout.py)."""
