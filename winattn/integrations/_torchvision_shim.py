"""Let the PyPI torchvision 0.28.0 wheel (a cu130 build) import next to the CPU torch 2.13.0 wheel.

torchvision's `_C.so` links libc10_cuda/libtorch_cuda, so beside CPU torch it cannot load and its ops are never
defined. `torchvision/_meta_registrations.py` still registers fake kernels for `torchvision::nms` / `qnms`
unconditionally, which raises `RuntimeError: operator torchvision::nms does not exist` at `import torchvision`
(and so at `import timm` and `import fastvideo`, which need torchvision at import).

Defining the two op schemas first is enough: the fake registrations then succeed, and the rest of torchvision
(transforms, `ops.misc.FrozenBatchNorm2d`, `utils.make_grid`) works. torchvision's compiled ops (nms, roi_align,
deform_conv2d, image/video decoding) stay unavailable; timm's Swin and FastVideo's attention path do not use them.

Import this module before torchvision/timm/fastvideo (`winattn.integrations.install_torchvision_shim()` does it).
It is a no-op when torchvision's own ops are already registered (a matching CPU or CUDA torchvision build) or
when it already ran.
"""

import torch


def _needed() -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
        return False  # a working torchvision (or this shim) already defined the ops
    except RuntimeError:
        return True


if _needed():
    # The three lines (torch.library.Library keeps the definitions alive for the process's lifetime).
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
