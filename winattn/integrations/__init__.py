"""Backend integrations of the window-attention kernel: diffusers, FastVideo and timm.

Each integration lives in its own module and imports its framework only when used:

- `winattn.integrations.diffusers.register()` adds the `window_attn_hub` attention backend to diffusers 0.42.x.
- `winattn.integrations.fastvideo.register()` adds `AttentionBackendEnum.WINDOW_ATTN_HUB` to FastVideo 0.2.x.
- `winattn.integrations.timm.kernelize_swin(model)` runs timm Swin's `WindowAttention` on the kernel's
  `layers.WindowAttention` through `kernels.kernelize`; `kernelize_relpos(model)` runs timm's BEiT `Attention` and
  vit_relpos `RelPosAttention` on `layers.BeitAttention` / `layers.RelPosAttention` the same way.

Every integration fetches the kernel through `winattn.load` (verified before import) at selection time, never at
the first attention call. This module holds what they share: the loader call with its per-process cache, the trust
environment variables, the kernel's capability checks and the mapping of framework masks onto the kernel's
`bias` / `mask` / `key_padding_mask` arguments. It imports nothing heavy.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional, Tuple

__all__ = ["install_torchvision_shim", "load_kernel", "kernel_mask_args", "check_head_dim", "MAX_HEAD_DIM"]

MAX_HEAD_DIM = 256
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # diffusers' ENV_VARS_TRUE_VALUES

_CACHE_LOCK = threading.RLock()
_CACHE: dict = {}


def env_flag(name: str, default: str = "false") -> bool:
    """True when the environment variable is set to 1/ON/YES/TRUE (any case), as diffusers parses its flags."""
    return os.environ.get(name, default).upper() in _TRUE_VALUES


def install_torchvision_shim() -> None:
    """Make `import torchvision` work with the cu130 torchvision 0.28.0 wheel beside CPU torch 2.13.0.

    See `winattn.integrations._torchvision_shim`. Needed before importing timm, FastVideo, or diffusers models that
    import torchvision (diffusers imports it whenever it is installed). A no-op with a working torchvision.
    """
    from . import _torchvision_shim  # noqa: F401  (defines the op schemas at import)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def _resolve_loader() -> Callable:
    import winattn

    load = getattr(winattn, "load", None)
    if load is None or not callable(load):
        import importlib

        load = importlib.import_module("winattn.load")
    if not callable(load):  # `winattn.load` the module: take its function
        load = getattr(load, "load")
    return load


def load_kernel(repo_id: str, *, version: Optional[int] = 1, revision: Optional[str] = None,
                trust_remote_code: Any = False, **load_kwargs: Any):
    """Fetch, verify and import the kernel through `winattn.load`, once per process per distinct request.

    Errors of `winattn.load` (`UntrustedKernelError`, `KernelNotFoundError`, `VerificationError`, ...) propagate
    unchanged; callers wrap them with their framework's context. A failed load is not cached.
    """
    key = (repo_id, version, revision, _freeze(trust_remote_code), _freeze(load_kwargs))
    with _CACHE_LOCK:
        module = _CACHE.get(key)
        if module is None:
            load = _resolve_loader()
            module = load(repo_id, version=version, revision=revision, trust_remote_code=trust_remote_code,
                          **load_kwargs)
            _CACHE[key] = module
        return module


def clear_kernel_cache() -> None:
    """Forget every module loaded by `load_kernel` (tests; a new `winattn.load` then runs on the next selection)."""
    with _CACHE_LOCK:
        _CACHE.clear()


# ----------------------------------------------------------------------------------------------------------------
# Closed enums


def inject_enum_member(enum_cls, name: str, value: Any):
    """Add member `name` = `value` to an existing Enum class, as if it had been declared in the class body.

    Fills every map the enum machinery reads (`_member_map_`, `_member_names_`, `_value2member_map_`, the class
    attribute), so `E(value)`, `E[name]`, `E.name`, iteration, `__members__`, pickling (by value) and `deepcopy`
    (identity) behave as for a declared member. Idempotent for the same (name, value); a clash raises ValueError.
    Works for `str` mix-in enums (diffusers' `AttentionBackendName`) and plain ones (FastVideo's).
    """
    existing = enum_cls._member_map_.get(name)
    if existing is not None:
        if existing._value_ != value:
            raise ValueError(f"{enum_cls.__name__}.{name} already exists with value {existing._value_!r}")
        return existing
    if value in enum_cls._value2member_map_:
        other = enum_cls._value2member_map_[value]
        raise ValueError(f"value {value!r} is already taken by {enum_cls.__name__}.{other._name_}")
    mixin = enum_cls._member_type_
    member = object.__new__(enum_cls) if mixin is object else mixin.__new__(enum_cls, value)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    member._sort_order_ = len(enum_cls._member_names_)
    member.__init__(value)
    add_member = getattr(enum_cls, "_add_member_", None)  # CPython >= 3.13
    if add_member is not None:
        add_member(name, member)
    else:
        type.__setattr__(enum_cls, name, member)
        enum_cls._member_map_[name] = member
    enum_cls._member_names_.append(name)
    enum_cls._value2member_map_[value] = member
    return member


# ----------------------------------------------------------------------------------------------------------------
# Capabilities


def kernel_device_type(module) -> Optional[str]:
    """'cpu' or 'cuda' for a compiled variant, None for the pure-PyTorch reference (runs anywhere)."""
    return module.BUILD_DEVICE  # the kernel's public name (None for the reference)


def kernel_dtypes(module) -> Tuple[str, ...]:
    import torch

    if kernel_device_type(module) == "cuda":
        return (torch.float16, torch.bfloat16)
    if getattr(module, "IS_REFERENCE", False):
        return (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    return (torch.float16, torch.bfloat16, torch.float32)


def head_dim_problem(head_dim: int) -> Optional[str]:
    """Why the kernel cannot run this head dim, or None when it can."""
    if head_dim % 8 != 0 or head_dim < 8 or head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} is not supported (window-attention needs a multiple of 8 in [8, {MAX_HEAD_DIM}])"
    return None


def check_head_dim(head_dim: int, where: str = "") -> None:
    problem = head_dim_problem(head_dim)
    if problem:
        raise ValueError(f"{where}{': ' if where else ''}{problem}")


# ----------------------------------------------------------------------------------------------------------------
# Masks


def kernel_mask_args(attn_mask, batch: int, seqlen_q: int, seqlen_k: int, *, two_d: str = "auto") -> dict:
    """Map a framework attention mask onto the kernel's `bias` / `mask` / `key_padding_mask` keyword arguments.

    Nothing is expanded to [B, H, Sq, Sk]: the kernel reads `bias` and `mask` by stride with broadcasting.

    - bool (True = attend) goes to `mask`, float (additive) to `bias`; integer 0/1 masks are turned into bool.
    - [B, Sk] (2-D with B rows) is a key-padding mask: bool -> `key_padding_mask`, float -> `bias` [B, 1, 1, Sk].
      With `two_d="auto"` (diffusers' native rule) a 2-D mask is key padding when its shape is (B, Sk), else the
      torch SDPA meaning [Sq, Sk]; `two_d="key_padding"` always reads 2-D masks as [B, Sk] (FastVideo's rule).
    - [B, 1, 1, Sk] bool with the full batch goes to `key_padding_mask` too (QwenImage, HunyuanVideo).
    - [B, Sq, Sk] (3-D) is read with a batch dim: [B, 1, Sq, Sk].
    - [B|1, H|1, Sq|1, Sk] (4-D) and 1-D [Sk] broadcast as in torch SDPA.
    """
    import torch

    if attn_mask is None:
        return {}
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    m = attn_mask
    # A 0-D mask has no key axis (m.shape[-1] below raised a bare IndexError), and a complex one has no meaning as
    # bool or additive bias (torch SDPA refuses it; `!= 0` below would silently make it a bool mask).
    if m.dim() == 0:
        raise ValueError("attn_mask is a 0-D tensor; it needs at least a key dimension [.., Sk]")
    if m.is_complex():
        raise ValueError(f"attn_mask has complex dtype {m.dtype}; use a bool (True = attend) or float (additive) mask")
    if m.dtype != torch.bool and not m.is_floating_point():
        m = m != 0
    is_bool = m.dtype == torch.bool
    if m.shape[-1] != seqlen_k:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not match the key length {seqlen_k}")
    if m.dim() == 2:
        key_padding = two_d == "key_padding" or (tuple(m.shape) == (batch, seqlen_k))
        if key_padding:
            if m.shape[0] not in (1, batch):
                raise ValueError(f"a 2-D key-padding attn_mask must be [B, Sk] = [{batch}, {seqlen_k}], "
                                 f"got {tuple(m.shape)}")
            if is_bool and m.shape[0] == batch:
                return {"key_padding_mask": m}
            m = m[:, None, None, :]
        # else: [Sq, Sk], broadcast by the kernel like SDPA
    elif m.dim() == 3:
        m = m[:, None, :, :]
    elif m.dim() == 4:
        if is_bool and m.shape[0] == batch and m.shape[1] == 1 and m.shape[2] == 1:
            return {"key_padding_mask": m.reshape(batch, seqlen_k)}
    elif m.dim() != 1:
        raise ValueError(f"attn_mask must have 1 to 4 dims, got shape {tuple(attn_mask.shape)}")
    return {"mask": m} if is_bool else {"bias": m}


# The FastVideo post-import hook lives with FastVideo's boot code (`_fastvideo_hook`, stdlib only, imported by the
# workers' sitecustomize before FastVideo exists); these names stay importable from here, resolved on first use.
_HOOK_NAMES = ("FASTVIDEO_AUTOREGISTER_ENV", "PostImportFinder", "install_post_import_hook",
               "fastvideo_autoregister_requested", "install_fastvideo_autoregister")


def __getattr__(name):
    if name in _HOOK_NAMES:
        from . import _fastvideo_hook

        return getattr(_fastvideo_hook, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
