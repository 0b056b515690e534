"""The Swin and BEiT relative-position indices of a ws x ws window (timm's `relative_position_index`), shared by the
tests.

Importable from every test folder because pytest puts tests/ on sys.path (as hub_clients.py).
"""

import torch


def swin_relative_index(ws: int, device="cpu") -> torch.Tensor:
    """[N, N] int64 (N = ws * ws): row of the (2 ws - 1)^2-row table for query i and key j."""
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)  # [2, N]
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)  # [N, N, 2]
    return (rel[..., 0] * (2 * ws - 1) + rel[..., 1]).to(device)


def beit_relative_index(ws: int, device="cpu") -> torch.Tensor:
    """[N + 1, N + 1] int64 with a class token first (timm.models.beit.gen_relative_position_index): the Swin index
    between patches, and three more table rows T - 3, T - 2, T - 1 (T = (2 ws - 1)^2 + 3) for class -> patch,
    patch -> class and class -> class."""
    n, t = ws * ws, (2 * ws - 1) ** 2 + 3
    index = torch.zeros(n + 1, n + 1, dtype=torch.long)
    index[1:, 1:] = swin_relative_index(ws)
    index[0, :] = t - 3
    index[:, 0] = t - 2
    index[0, 0] = t - 1
    return index.to(device)
