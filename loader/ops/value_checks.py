"""When the ops may read argument values back to the host for their checks (lengths, indices,
page ids): never while torch.compile traces or a CUDA graph is being captured."""
from __future__ import annotations

import torch


def skip_value_checks(t) -> bool:
    """True where reading t's values would sync the device illegally: under tracing, or on a
    CUDA tensor while the current stream captures a graph."""
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())
