"""timm Swin, BEiT and the `vit_relpos` family on the window-attention kernel, through `kernels.kernelize`.

    from kernels import Mode
    from winattn.integrations.timm import kernelize_relpos, kernelize_swin
    model = timm.create_model("swin_tiny_patch4_window7_224")
    kernelize_swin(model, mode=Mode.INFERENCE)            # or Mode.TRAINING, | Mode.TORCH_COMPILE
    model = timm.create_model("beit_base_patch16_224")     # or a vit_relpos_* / vit_srelpos_* model
    kernelize_relpos(model, mode=Mode.TRAINING)

Every `timm.models.swin_transformer.WindowAttention` in the model then runs the kernel's
`layers.WindowAttention.forward`: q/k/v from the module's own `qkv`, the relative-position bias table gathered in the
kernel (its gradient from the kernel's dBias pass), the shift mask added in the kernel, then the module's `proj`.
`kernelize_relpos` does the same for `timm.models.beit.Attention` (layer `BeitAttention`: the (2W-1)^2 + 3-row table
with its class-token entries gathered in the kernel, the optional shared bias added in the kernel) and
`timm.models.vision_transformer_relpos.RelPosAttention` (layer `RelPosAttention`: `RelPosBias` tables gathered in the
kernel, `RelPosMlp` biases computed by the module and passed as `bias=` with dBias); a module the layer cannot run
exactly as timm does keeps timm's forward, with the reason in a warning (`relpos_support` lists them beforehand).

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

import contextvars
import importlib
import warnings
from typing import Any, Dict, Optional

from . import check_head_dim, install_torchvision_shim, load_kernel

install_torchvision_shim()

import timm.models.swin_transformer as _swin  # noqa: E402
from kernels import Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping  # noqa: E402

DEFAULT_REPO_ID = "winattn/window-attention"
LAYER_NAME = "WindowAttention"
BEIT_LAYER_NAME = "BeitAttention"
RELPOS_LAYER_NAME = "RelPosAttention"

__all__ = ["kernelize_swin", "kernelize_relpos", "relpos_support", "VerifiedLayerRepository", "LAYER_NAME",
           "BEIT_LAYER_NAME", "RELPOS_LAYER_NAME", "Mode"]


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


# ----------------------------------------------------------------------------------------------------------------
# BEiT and vit_relpos: timm's relative-position attention


def _relpos_classes() -> tuple:
    """((timm attention class, kernel layer name), ...): BEiT's Attention and vit_relpos' RelPosAttention."""
    import timm.models.beit as beit
    import timm.models.vision_transformer_relpos as relpos

    return ((beit.Attention, BEIT_LAYER_NAME), (relpos.RelPosAttention, RELPOS_LAYER_NAME))


def _relpos_class_of(module) -> Optional[tuple]:
    for cls, layer in _relpos_classes():
        if isinstance(module, cls):
            return cls, layer
    return None


def _head_dim_of(module) -> int:
    head_dim = getattr(module, "head_dim", None)  # RelPosAttention
    if head_dim is None:  # beit.Attention: qkv is [3 * nH * hd, C] (attn_head_dim may differ from C / nH)
        head_dim = module.qkv.out_features // 3 // module.num_heads
    return int(head_dim)


def _relpos_problem(module, mode: Optional[Mode]) -> Optional[str]:
    """Why the kernel layer cannot run this timm attention module exactly as timm does, or None when it can.

    mode None: the checks that do not depend on the kernelize mode only."""
    from timm.layers import RelPosBias, RelPosMlp

    from . import head_dim_problem

    cls, layer = _relpos_class_of(module)
    if type(module) is not cls:
        return (f"{type(module).__module__}.{type(module).__qualname__} subclasses timm's {cls.__qualname__}; its "
                f"forward may differ from the one layers.{layer} implements")
    problem = head_dim_problem(_head_dim_of(module))
    if problem:
        return problem
    if layer == RELPOS_LAYER_NAME:
        rel_pos = module.rel_pos
        if rel_pos is not None and type(rel_pos) not in (RelPosBias, RelPosMlp):
            return (f"its rel_pos is a {type(rel_pos).__module__}.{type(rel_pos).__qualname__}; the layer runs "
                    "timm's RelPosBias (table gathered in the kernel) and RelPosMlp (bias from get_bias()) only")
    drop = getattr(module.attn_drop, "p", 0.0)
    if mode is not None and Mode.TRAINING in mode and drop > 0.0:
        return (f"attention dropout {drop}, which the kernel does not implement (build the model with "
                "attn_drop_rate=0.0 to train it on the kernel)")
    return None


def relpos_support(model, *, mode: Mode = Mode.INFERENCE) -> Dict[str, Optional[str]]:
    """What `kernelize_relpos(model, mode=mode)` would do, module by module, without loading or changing anything.

    Returns:
        {module name: None (runs the kernel layer) or the reason it keeps timm's forward} for every BEiT
        `Attention` and vit_relpos `RelPosAttention` (subclasses included) in `model`, in `named_modules` order.
    """
    return {name: _relpos_problem(m, mode) for name, m in model.named_modules() if _relpos_class_of(m) is not None}


# Ids of the modules that the running kernelize_relpos call leaves on timm's forward (mode-dependent reasons); the
# kernels condition below reads it. Outside such a call (a kernelize of the caller's own) only the checks that do not
# depend on the mode apply, and the layers raise on attention dropout in training themselves.
_SKIP: contextvars.ContextVar = contextvars.ContextVar("winattn_timm_relpos_skip", default=frozenset())


def _relpos_condition(module) -> bool:
    return id(module) not in _SKIP.get() and _relpos_problem(module, None) is None


def kernelize_relpos(model, *, mode: Mode = Mode.INFERENCE, repo_id: str = DEFAULT_REPO_ID,
                     version: Optional[int] = 1, revision: Optional[str] = None, device: Optional[str] = None,
                     use_fallback: bool = False, strict: bool = False, **load_kwargs: Any):
    """Run every timm BEiT `Attention` and vit_relpos `RelPosAttention` of `model` on the kernel (in place; returns
    `model`).

    BEiT (`timm.models.beit.Attention`) runs the kernel layer `layers.BeitAttention`, vit_relpos
    (`timm.models.vision_transformer_relpos.RelPosAttention`) runs `layers.RelPosAttention`; see their docstrings for
    how each bias reaches the kernel. A module that the layer cannot run exactly as timm does (a subclass of either
    class, a head dim the kernel lacks, a `rel_pos` other than timm's RelPosBias / RelPosMlp, attention dropout in
    training mode) keeps timm's forward and is named with its reason in a `UserWarning`; `strict=True` raises
    instead. `relpos_support(model, mode=mode)` gives the same list without changing anything.

    Args:
        model: a timm BEiT / vit_relpos / vit_srelpos model, or any module containing those attention modules.
        mode: kernels `Mode` (`INFERENCE` or `TRAINING`, optionally `| TORCH_COMPILE`).
        repo_id, version, revision, **load_kwargs: the kernel, loaded with `winattn.load` (verified) at this call.
        device: device type to kernelize for (default: from the model's parameters).
        use_fallback: kernels' fallback policy; False (default) raises when the kernel cannot be used instead of
            silently keeping timm's forward.
        strict: raise ValueError, before anything is loaded or replaced, if any module would keep timm's forward.

    Raises:
        ValueError: with `strict=True`, a module the layer cannot run.
        winattn errors (`UntrustedKernelError`, `KernelNotFoundError`, `VerificationError`, ...) from the load.
    """
    support = relpos_support(model, mode=mode)
    native = {name: why for name, why in support.items() if why is not None}
    if strict and native:
        raise ValueError("kernelize_relpos(strict=True): " + _native_list(native))
    if not support:
        warnings.warn("kernelize_relpos: the model has no timm BEiT Attention or vit_relpos RelPosAttention; nothing "
                      "was replaced", UserWarning, stacklevel=2)
        return model
    if native:
        warnings.warn(f"kernelize_relpos: {len(native)} of {len(support)} attention modules keep timm's forward: "
                      + _native_list(native), UserWarning, stacklevel=2)
    mapping = {}
    for _, layer in _relpos_classes():
        repo = VerifiedLayerRepository(repo_id, layer_name=layer, version=version, revision=revision, **load_kwargs)
        # fetch + verify now, so that errors name the kernel rather than a module; a kernel without the layer (one
        # published before it existed) fails here too, before timm's classes or any module are touched
        repo.load()
        mapping[layer] = {"cpu": repo, "cuda": repo}
    for cls, layer in _relpos_classes():
        replace_kernel_forward_from_hub(cls, layer, condition=_relpos_condition)
    names = dict(model.named_modules())
    token = _SKIP.set(frozenset(id(names[name]) for name in native))
    try:
        with use_kernel_mapping(mapping):
            kernelize(model, mode=mode, device=device, use_fallback=use_fallback)
    finally:
        _SKIP.reset(token)
    return model


def _native_list(native: Dict[str, str]) -> str:
    return "; ".join(f"{name}: {why}" for name, why in native.items())
