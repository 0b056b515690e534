"""The Swin relative-position index of a ws x ws window (timm's `relative_position_index`), shared by the tests.

Importable from every test folder because pytest puts tests/ on sys.path (as hub_clients.py).
"""

import torch


def swin_relative_index(ws: int, device="cpu") -> torch.Tensor:
    """[N, N] int64 (N = ws * ws): row of the (2 ws - 1)^2-row table for query i and key j."""
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)  # [2, N]
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)  # [N, N, 2]
    return (rel[..., 0] * (2 * ws - 1) + rel[..., 1]).to(device)
