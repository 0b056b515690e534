"""Body of a FastVideo-style spawned worker (multiprocessing "spawn"), for test_fastvideo.py.

Nothing here imports winattn. The parent passes `AttentionBackendEnum.WINDOW_ATTN_HUB` as an argument, so unpickling
the arguments imports FastVideo before this function runs (as FastVideo's workers unpickle configs): the member only
resolves if the boot `sitecustomize` that `register(propagate=True)` put on PYTHONPATH made the post-import hook
register the backend in this process first.
"""

from __future__ import annotations

import json
import os
import sys


def run(member, result_path: str) -> None:
    result = {"member": [member.name, member.value]}
    result["hook_registered"] = "winattn.integrations.fastvideo" in sys.modules
    import torch
    from fastvideo.attention.layer import LocalAttention
    from fastvideo.forward_context import set_forward_context
    from fastvideo.platforms import AttentionBackendEnum as E

    result["same_member"] = member is E.WINDOW_ATTN_HUB
    result["env_backend"] = os.environ.get("FASTVIDEO_ATTENTION_BACKEND")
    # A layer with a hard-coded (FLASH_ATTN, TORCH_SDPA) tuple, selected through FASTVIDEO_ATTENTION_BACKEND.
    layer = LocalAttention(num_heads=2, head_size=16, supported_attention_backends=(E.FLASH_ATTN, E.TORCH_SDPA))
    result["impl"] = f"{type(layer.attn_impl).__module__}.{type(layer.attn_impl).__qualname__}"
    info = getattr(layer.attn_impl.kernel, "__winattn_info__", None)
    result["source"] = None if info is None else [info.repo_id, info.source]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 10, 2, 16, generator=g) for _ in range(3))
    with set_forward_context(current_timestep=0, attn_metadata=None):
        out = layer(q, k, v)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                           v.transpose(1, 2)).transpose(1, 2)
    result["max_err"] = float((out - ref).abs().max())
    with open(result_path, "w") as f:
        json.dump(result, f)
