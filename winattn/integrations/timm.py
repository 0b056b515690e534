"""timm Swin on the window-attention kernel, through `kernels.kernelize`.

    from kernels import Mode
    from winattn.integrations.timm import kernelize_swin
    model = timm.create_model("swin_tiny_patch4_window7_224")
    kernelize_swin(model, mode=Mode.INFERENCE)            # or Mode.TRAINING, | Mode.TORCH_COMPILE

Every `timm.models.swin_transformer.WindowAttention` in the model then runs the kernel's
`layers.WindowAttention.forward`: q/k/v from the module's own `qkv`, the relative-position bias table gathered in the
kernel (its gradient from the kernel's dBias pass), the shift mask added in the kernel, then the module's `proj`.

How the layer gets to `kernelize`: timm's class is made extensible with kernels' `replace_kernel_forward_from_hub`,
and the mapping points at `VerifiedLayerRepository`, an object implementing kernels' layer-repository protocol
(`load()` + `layer_name`) whose `load()` is `winattn.load(...)`. kernels 0.17.2's own `LayerRepository` would fetch
and import the kernel with `kernels.get_kernel`, skipping winattn's verification (digest, signature, pins, smoke
test); `LocalLayerRepository` only takes a path. The protocol object keeps kernels' `kernelize` machinery (mode
selection, layer validation, fallback rules) and imports only a verified variant.

timm imports torchvision at import; with the cu130 torchvision wheel beside CPU torch this module installs the
op-schema shim first (`winattn.integrations._torchvision_shim`).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from . import check_head_dim, install_torchvision_shim, load_kernel

install_torchvision_shim()

import timm.models.swin_transformer as _swin  # noqa: E402
from kernels import Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping  # noqa: E402

DEFAULT_REPO_ID = "winattn/window-attention"
LAYER_NAME = "WindowAttention"

__all__ = ["kernelize_swin", "VerifiedLayerRepository", "LAYER_NAME", "Mode"]


class VerifiedLayerRepository:
    """A kernels layer repository (`kernels.layer.LayerRepositoryProtocol`) that loads through `winattn.load`.

    Args:
        repo_id, version, revision: the kernel (`revision` replaces `version`).
        layer_name: layer class in the kernel's `layers` module.
        **load_kwargs: more `winattn.load` keywords (`trust_remote_code`, `public_keys`, `require_signature`,
            `fallback`, `vendored`, `endpoint`, `token`).
    """

    def __init__(self, repo_id: str = DEFAULT_REPO_ID, *, layer_name: str = LAYER_NAME, version: Optional[int] = 1,
                 revision: Optional[str] = None, **load_kwargs: Any):
        self.repo_id = repo_id
        self._layer_name = layer_name
        self.version = None if revision is not None else version
        self.revision = revision
        self.load_kwargs = dict(load_kwargs)

    @property
    def layer_name(self) -> str:
        return self._layer_name

    def load_module(self):
        """The verified kernel module (cached per process by `winattn.integrations.load_kernel`)."""
        return load_kernel(self.repo_id, version=self.version, revision=self.revision, **self.load_kwargs)

    def load(self):
        module = self.load_module()
        layers = getattr(module, "layers", None)
        if layers is None:  # a kernel whose __init__ does not re-export `layers`
            try:
                layers = importlib.import_module(f"{module.__name__}.layers")
            except ImportError as e:
                raise ValueError(f"kernel {self} has no `layers` module ({e})") from e
        layer = getattr(layers, self._layer_name, None)
        if layer is None:
            raise ValueError(f"layer `{self._layer_name}` not found in kernel {self}")
        return layer

    def _key(self):
        return (self.repo_id, self._layer_name, self.version, self.revision,
                tuple(sorted((k, repr(v)) for k, v in self.load_kwargs.items())))

    def __eq__(self, other):
        return isinstance(other, VerifiedLayerRepository) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self) -> str:
        pin = f"revision {self.revision}" if self.revision else f"version {self.version}"
        return f"`{self.repo_id}` ({pin}, verified by winattn.load), layer `{self._layer_name}`"


def _swinv2_classes() -> tuple:
    classes = []
    for name in ("timm.models.swin_transformer_v2", "timm.models.swin_transformer_v2_cr"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in ("WindowAttention", "WindowMultiHeadAttention"):
            cls = getattr(module, attr, None)
            if isinstance(cls, type):
                classes.append(cls)
    return tuple(classes)


def _check_model(model, mode) -> int:
    """Refuse what the kernel layer cannot run, before anything is replaced; returns the number of Swin layers."""
    v2 = [name for name, m in model.named_modules() if isinstance(m, _swinv2_classes())]
    if v2:
        raise ValueError(
            f"kernelize_swin supports Swin (v1) only; this model has SwinV2 window attention ({v2[0]}, ...): cosine "
            "attention with a continuous position-bias MLP (logit_scale, cpb_mlp) has no relative-position bias table "
            "for the kernel to gather. Keep timm's own forward for SwinV2 models."
        )
    count = 0
    for name, m in model.named_modules():
        if not isinstance(m, _swin.WindowAttention):
            continue
        count += 1
        head_dim = m.qkv.out_features // 3 // m.num_heads
        check_head_dim(head_dim, f"kernelize_swin: {name}")
        drop = getattr(m.attn_drop, "p", 0.0)
        if Mode.TRAINING in mode and drop > 0.0:
            raise ValueError(f"kernelize_swin: {name} has attention dropout {drop}, which the kernel does not "
                             "implement; build the model with attn_drop_rate=0.0 to train with the kernel")
    return count


def kernelize_swin(model, *, mode: Mode = Mode.INFERENCE, repo_id: str = DEFAULT_REPO_ID,
                   version: Optional[int] = 1, revision: Optional[str] = None, device: Optional[str] = None,
                   use_fallback: bool = False, **load_kwargs: Any):
    """Run every timm Swin `WindowAttention` of `model` on the kernel (in place; returns `model`).

    Args:
        model: a timm Swin (v1) model, or any module containing `timm.models.swin_transformer.WindowAttention`s.
        mode: kernels `Mode` (`INFERENCE` or `TRAINING`, optionally `| TORCH_COMPILE`).
        repo_id, version, revision, **load_kwargs: the kernel, loaded with `winattn.load` (verified) at this call.
        device: device type to kernelize for (default: from the model's parameters).
        use_fallback: kernels' fallback policy; False (default) raises when the kernel cannot be used instead of
            silently keeping timm's forward.

    Raises:
        ValueError: SwinV2 attention, an unsupported head dim, or attention dropout in training mode.
        winattn errors (`UntrustedKernelError`, `KernelNotFoundError`, `VerificationError`, ...) from the load.
    """
    _check_model(model, mode)
    replace_kernel_forward_from_hub(_swin.WindowAttention, LAYER_NAME)
    repo = VerifiedLayerRepository(repo_id, version=version, revision=revision, **load_kwargs)
    repo.load()  # fetch + verify now, so that errors name the kernel rather than a layer
    mapping = {LAYER_NAME: {"cpu": repo, "cuda": repo}}
    with use_kernel_mapping(mapping):
        kernelize(model, mode=mode, device=device, use_fallback=use_fallback)
    return model
