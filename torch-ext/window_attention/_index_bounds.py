"""Range check of `rel_pos_index` against the table, done once per index tensor instead of once per call.

Why: the kernels gather `rel_pos_table[rel_pos_index[i, j], h]` without bounds checks (and the CPU backward
scatters dtable through the same index), so an entry outside [0, rows) reads or writes outside the table, and on
CUDA an illegal address kills the whole process's CUDA context. Checking on the host costs a device -> host sync on
CUDA, which a per-call check would add to every Swin block. Swin models pass the same index buffer on every call,
so the range (min, max) is computed when an index tensor is first seen and cached under its identity plus a stamp
(version counter, data pointer, shape, strides, device): any in-place change bumps `_version` and any re-pointing
changes the pointer, so the tensor is re-checked then; the steady-state cost is a dict lookup and no sync.
A device-side assert in the CUDA gather was the alternative; it was not taken because a failed device assert is
itself a sticky error that ends the CUDA context, which is what this check exists to prevent.

Not cacheable, so checked on every call: inference tensors (no version counter; in-place writes inside
`torch.inference_mode` are not tracked). Not checked here: fake / meta tensors (no data: torch.compile tracing,
meta-device initialization); the compiled graph checks through the `check_rel_pos_index` op instead
(interface.py), and the CPU op also checks every call in torch_binding.cpp (host memory: no sync needed).
Writes that bypass torch's version counter (a NumPy view or DLPack export of the index modified in place) are not
seen; re-pass a fresh tensor after such writes. CUDA graphs: a replay runs no host code, so no check runs; an index
changed in place after capture is read as it is (keep it constant, as Swin's buffer is). First sight inside a
capture raises RuntimeError asking for a warm-up call (the range read would be a sync, which capture forbids).
"""

import weakref
from typing import Dict, Tuple

import torch

# id(index) -> (weak reference, stamp, min, max). The weak reference's callback drops the entry when the tensor
# dies, so an id reused by a later tensor never finds a stale entry (the identity test below guards it too).
_seen: Dict[int, Tuple[weakref.ref, tuple, int, int]] = {}


def _stamp(index: torch.Tensor) -> tuple:
    return index._version, index.data_ptr(), index.shape, index.stride(), index.device


def _has_data(index: torch.Tensor) -> bool:
    if index.is_meta:
        return False
    from torch._subclasses.fake_tensor import is_fake

    return not is_fake(index)


def _range(index: torch.Tensor) -> Tuple[int, int]:
    lo, hi = torch.aminmax(index)
    return int(lo), int(hi)  # the one device -> host sync on CUDA


def _raise(index: torch.Tensor, rows: int, lo: int, hi: int) -> None:
    bad = ((index < 0) | (index >= rows)).nonzero()[0].tolist()
    value = int(index[tuple(bad)])
    raise IndexError(
        f"rel_pos_index has value {value} at {tuple(bad)} (range [{lo}, {hi}]) but rel_pos_table has {rows} "
        f"rows: every entry must lie in [0, {rows - 1}] (negative indices do not wrap around)"
    )


def check_rel_pos_index(index: torch.Tensor, rows: int) -> None:
    """Raise IndexError unless every entry of the integer tensor `index` lies in [0, rows)."""
    key = id(index)
    entry = _seen.get(key)
    # Fast path first (about 1 us): only real tensors with data are ever cached, so a hit needs no further test.
    if entry is not None and entry[0]() is index and entry[1] == _stamp(index):
        lo, hi = entry[2], entry[3]
    elif index.numel() == 0 or not _has_data(index):
        return
    elif index.is_cuda and torch.cuda.is_current_stream_capturing():
        # The range read below is a device -> host sync, which CUDA graph capture forbids (it would invalidate the
        # capture with a generic CUDA error): say what to do instead.
        raise RuntimeError(
            "window_attention: rel_pos_index is seen for the first time (or was changed in place) while a CUDA "
            "graph is being captured; its range check needs a device -> host sync, which capture forbids. Run the "
            "call once with this index tensor before capturing (the warm-up torch.cuda.graphs asks for anyway); "
            "inference-mode index tensors are checked on every call and cannot be captured"
        )
    elif index.is_inference():
        lo, hi = _range(index)
    else:
        lo, hi = _range(index)
        ref = weakref.ref(index, lambda _, key=key: _seen.pop(key, None))
        _seen[key] = (ref, _stamp(index), lo, hi)
    if lo < 0 or hi >= rows:
        _raise(index, rows, lo, hi)
