"""Let the PyPI torchvision 0.28.0 wheel (a cu130 build) import next to the CPU torch 2.13.0 wheel.

torchvision's `_C.so` links libc10_cuda/libtorch_cuda, so beside CPU torch it cannot load and its ops are never
defined. `torchvision/_meta_registrations.py` still registers fake kernels for `torchvision::nms` / `qnms`
unconditionally, which raises `RuntimeError: operator torchvision::nms does not exist` at `import torchvision`
(and so at `import timm` and `import fastvideo`, which need torchvision at import).

Defining the two op schemas first is enough: the fake registrations then succeed, and the rest of torchvision
(transforms, `ops.misc.FrozenBatchNorm2d`, `utils.make_grid`) works. torchvision's compiled ops (nms, roi_align,
deform_conv2d, image/video decoding) stay unavailable; timm's Swin and FastVideo's attention path do not use them.

Import this module before torchvision/timm/fastvideo (`winattn.integrations.install_torchvision_shim()` does it).
It is a no-op when torchvision imports as it is (a matching CPU or CUDA build) or when it already ran.
"""

import sys

import torch


def _torchvision_imports() -> bool:
    """Import torchvision as it is; False only for the CPU-torch + cu130-wheel failure this shim exists for."""
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        return True  # not installed: nothing to fix
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
        # Drop the half-imported package so the retry below runs its __init__ again.
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


# Shim only after the real failure: defining the schemas *before* a working torchvision loads its own `_C` would
# register them twice and abort the process (seen on the H200 with a matching CUDA torchvision).
if not _torchvision_imports():
    # The three lines (torch.library.Library keeps the definitions alive for the process's lifetime).
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision  # noqa: F401,E402
