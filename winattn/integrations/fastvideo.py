"""The window-attention kernel as a FastVideo attention backend: `AttentionBackendEnum.WINDOW_ATTN_HUB`.

    import winattn.integrations.fastvideo as wf
    wf.register()                                     # before FastVideoArgs / models are built
    # then FASTVIDEO_ATTENTION_BACKEND=WINDOW_ATTN_HUB, or attention_backend="window_attn_hub"

FastVideo 0.2.x has a closed enum, a hard-coded platform `if/elif` and per-layer support tuples (backends.md §B).
`register()`:

1. injects the `WINDOW_ATTN_HUB` member into `AttentionBackendEnum` (fixed value, so it pickles between processes);
2. wraps the current platform's `get_attn_backend_cls`: for this member it fetches and verifies the kernel through
   `winattn.load` (once per process), checks head size and dtype, and returns `WindowAttnHubBackend`. When the kernel
   cannot be had it raises: FastVideo's usual silent fallback to another backend never happens;
3. adds the member to `_supported_attention_backends` of every DiT class that supports TORCH_SDPA (present and
   future subclasses of `BaseDiT`), and - `extend_sdpa_layers=True`, the default - lets any layer that accepts
   TORCH_SDPA (e.g. Wan's cross-attention, whose tuple is hard-coded) take WINDOW_ATTN_HUB when it is requested;
4. with `propagate=True` (default) makes FastVideo's spawned workers register too: it exports the settings in
   WINATTN_FASTVIDEO_AUTOREGISTER and prepends `boot_dir()` to PYTHONPATH. That directory's `sitecustomize` installs
   a `sys.meta_path` post-import hook in each child process; the hook calls `register()` there as soon as FastVideo
   is imported, before the worker unpickles its arguments or builds a model. No `.pth` file is installed.

`WindowAttnHubImpl` works in FastVideo's [B, S, H, D] layout and accepts `attn_metadata=None` or metadata with an
`attn_mask` (SDPA's convention: 2-D [B, Sk] key padding, int/bool/float, front-padded as "attend" when shorter than
the keys; 3-D [B, Sq, Sk]; 4-D).
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m winattn.integrations.fastvideo --boot-dir`, before FastVideo is imported
    import sys as _sys

    from winattn.integrations._fastvideo_hook import main as _main

    _sys.exit(_main())

import json
import logging
import os
import threading
from typing import Any, Optional

import torch
from fastvideo.attention.backends.abstract import (AttentionBackend, AttentionImpl, AttentionMetadata,
                                                   AttentionMetadataBuilder)

from . import check_head_dim, head_dim_problem, kernel_device_type, kernel_dtypes, kernel_mask_args, load_kernel
from ._fastvideo_hook import FASTVIDEO_AUTOREGISTER_ENV, boot_dir, fastvideo_autoregister_requested

logger = logging.getLogger(__name__)

MEMBER_NAME = "WINDOW_ATTN_HUB"
# FastVideo's members are enum.auto() ints (1, 2, ...). A fixed, far-away value keeps the member's pickle (by value)
# identical in every process, whatever FastVideo adds later.
MEMBER_VALUE = 0x57_41_48  # "WAH"
DEFAULT_REPO_ID = "winattn/window-attention"
SUPPORTED_HEAD_SIZES = list(range(8, 257, 8))

__all__ = ["register", "load_backend", "unload", "boot_dir", "WindowAttnHubBackend", "WindowAttnHubImpl", "MEMBER_NAME",
           "SUPPORTED_HEAD_SIZES"]


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.config: Optional[dict] = None  # repo_id, version, revision, trust_remote_code, load_kwargs
        self.module = None
        self.member = None
        self.extend_sdpa_layers = True


_STATE = _State()


# ----------------------------------------------------------------------------------------------------------------
# Registration


def register(repo_id: str = DEFAULT_REPO_ID, version: Optional[int] = 1, *, revision: Optional[str] = None,
             trust_remote_code: Any = False, extend_sdpa_layers: bool = True, propagate: bool = True,
             **load_kwargs: Any):
    """Add `AttentionBackendEnum.WINDOW_ATTN_HUB` to FastVideo and return the member. Idempotent.

    Args:
        repo_id, version, revision: the kernel to load at selection (`revision` replaces `version`).
        trust_remote_code: passed to `winattn.load` (False: only publishers the Hub marks as trusted).
        extend_sdpa_layers: let every layer that supports TORCH_SDPA use the kernel when WINDOW_ATTN_HUB is
            requested, not only the DiT classes' own tuples (FastVideo otherwise falls back for hard-coded tuples).
        propagate: export these settings to child processes (FastVideo's spawned workers) through
            WINATTN_FASTVIDEO_AUTOREGISTER and PYTHONPATH (see the module docstring). Needs JSON-serializable
            settings.
        **load_kwargs: more `winattn.load` keywords (`endpoint`, `token`, `public_keys`, `require_signature`, ...).

    Nothing is downloaded here; the kernel is fetched when a layer selects the backend.
    """
    from fastvideo.platforms import AttentionBackendEnum

    from . import inject_enum_member

    if revision is not None:
        version = None
    config = {"repo_id": repo_id, "version": version, "revision": revision,
              "trust_remote_code": trust_remote_code, "load_kwargs": dict(load_kwargs)}
    encoded = _encode_settings(config, extend_sdpa_layers) if propagate else None  # refuse before changing anything
    with _STATE.lock:
        member = inject_enum_member(AttentionBackendEnum, MEMBER_NAME, MEMBER_VALUE)
        if _STATE.config != config:
            _STATE.config = config
            _STATE.module = None
        _STATE.member = member
        _STATE.extend_sdpa_layers = bool(extend_sdpa_layers)
        _wrap_platform_selector()
        _wrap_layer_selection()
        _extend_dit_classes()
        if encoded is not None:
            _export_to_children(encoded)
    return member


def load_backend():
    """Fetch, verify and import the kernel now (what selecting the backend does) and return it."""
    return _kernel()


def unload() -> None:
    """Forget the loaded kernel: the next selection runs `winattn.load` again (tests, or after changing the cache)."""
    from . import clear_kernel_cache

    with _STATE.lock:
        _STATE.module = None
    clear_kernel_cache()


def _kernel():
    with _STATE.lock:
        if _STATE.module is not None:
            return _STATE.module
        if _STATE.config is None:
            raise RuntimeError("the WINDOW_ATTN_HUB backend is not registered: call "
                               "winattn.integrations.fastvideo.register() first")
        c = _STATE.config
        what = f"`{c['repo_id']}` ({'revision ' + c['revision'] if c['revision'] else 'version ' + str(c['version'])})"
        try:
            module = load_kernel(c["repo_id"], version=c["version"], revision=c["revision"],
                                 trust_remote_code=c["trust_remote_code"], **c["load_kwargs"])
        except Exception as e:
            e.add_note(f"while selecting the FastVideo attention backend {MEMBER_NAME} ({what}); FastVideo does not "
                       "fall back to another backend for it: pick another backend or fix the kernel source")
            raise
        if not callable(getattr(module, "attention", None)):
            raise RuntimeError(f"kernel {what} has no `attention` function")
        _STATE.module = module
        return module


def _register_from_env() -> None:
    """Register from WINATTN_FASTVIDEO_AUTOREGISTER ("1" = defaults, or the JSON settings a parent exported)."""
    raw = os.environ.get(FASTVIDEO_AUTOREGISTER_ENV, "").strip()
    settings: dict = {}
    if raw.startswith("{"):
        settings = json.loads(raw)
    kwargs = dict(settings.get("load_kwargs") or {})
    register(repo_id=settings.get("repo_id", DEFAULT_REPO_ID), version=settings.get("version", 1),
             revision=settings.get("revision"), trust_remote_code=settings.get("trust_remote_code", False),
             extend_sdpa_layers=settings.get("extend_sdpa_layers", True), propagate=False, **kwargs)


def _encode_settings(config: dict, extend_sdpa_layers: bool) -> str:
    settings = dict(config, extend_sdpa_layers=bool(extend_sdpa_layers))
    try:
        return json.dumps(settings, sort_keys=True, default=_json_path)
    except TypeError as e:
        raise TypeError(
            f"register(propagate=True) exports its settings to FastVideo's worker processes as JSON, but they are "
            f"not JSON-serializable ({e}); pass propagate=False and call register() in the workers yourself"
        ) from None


def _export_to_children(encoded: str) -> None:
    os.environ[FASTVIDEO_AUTOREGISTER_ENV] = encoded
    boot = boot_dir()
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if boot not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([boot] + parts)


def _json_path(value):
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# ----------------------------------------------------------------------------------------------------------------
# FastVideo wiring


def _wrap_platform_selector() -> None:
    from fastvideo.platforms import current_platform

    cls = type(current_platform)
    current = cls.get_attn_backend_cls
    if getattr(current, "_winattn_hook", False):
        return
    # A platform that defines its own chain (CUDA, ROCm, MPS, NPU) keeps it for every other member; one that
    # inherits it (CPU) keeps inheriting, looked up at call time.
    own = cls.__dict__.get("get_attn_backend_cls")
    original = own.__func__ if isinstance(own, classmethod) else None

    def get_attn_backend_cls(platform_cls, selected_backend, head_size, dtype):
        if selected_backend is not None and selected_backend is _STATE.member:
            return _select(head_size, dtype, platform_cls)
        if original is not None:
            return original(platform_cls, selected_backend, head_size, dtype)
        return super(cls, platform_cls).get_attn_backend_cls(selected_backend, head_size, dtype)

    get_attn_backend_cls._winattn_hook = True
    get_attn_backend_cls.__wrapped__ = original
    cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)


def _select(head_size: int, dtype: torch.dtype, platform_cls) -> str:
    """Selection-time check: load the kernel and make sure it can serve this layer, or raise."""
    module = _kernel()
    problem = head_dim_problem(int(head_size))
    if problem is None and dtype not in kernel_dtypes(module):
        problem = (f"compute dtype {dtype} is not supported by the {kernel_device_type(module) or 'reference'} "
                   f"build (takes {[str(d) for d in kernel_dtypes(module)]})")
    device_type = kernel_device_type(module)
    platform_type = getattr(platform_cls, "device_type", None)
    if problem is None and device_type is not None and platform_type not in (None, device_type):
        problem = f"the loaded kernel is the {device_type} build but FastVideo runs on {platform_type}"
    if problem:
        raise ValueError(f"attention backend {MEMBER_NAME} was selected but cannot serve this layer: {problem}. "
                         "FastVideo does not fall back for it; select another backend for this model.")
    return f"{__name__}.WindowAttnHubBackend"


def _wrap_layer_selection() -> None:
    """Let layers whose support tuple has TORCH_SDPA but not WINDOW_ATTN_HUB take it when it is requested."""
    import inspect

    from fastvideo.attention import selector
    from fastvideo.platforms import AttentionBackendEnum

    current = selector._cached_get_attn_backend
    if getattr(current, "_winattn_hook", False):
        return
    signature = inspect.signature(current)

    def _cached_get_attn_backend(*args, **kwargs):
        if _STATE.extend_sdpa_layers and _STATE.member is not None:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            effective = a.get("requested")
            if effective is None and a.get("env_backend") is not None:
                effective = selector.backend_name_to_enum(a["env_backend"])
            if effective is None:
                effective = a.get("default_backend")
            supported = a.get("supported_attention_backends")
            if (effective is _STATE.member and supported and _STATE.member not in supported
                    and AttentionBackendEnum.TORCH_SDPA in supported):
                a["supported_attention_backends"] = tuple(supported) + (_STATE.member,)
            return current(*bound.args, **bound.kwargs)
        return current(*args, **kwargs)

    _cached_get_attn_backend._winattn_hook = True
    _cached_get_attn_backend.__wrapped__ = current
    for name in ("cache_clear", "cache_info", "cache_parameters"):
        if hasattr(current, name):
            setattr(_cached_get_attn_backend, name, getattr(current, name))
    selector._cached_get_attn_backend = _cached_get_attn_backend


def _extend_tuple(cls) -> None:
    from fastvideo.platforms import AttentionBackendEnum

    backends = getattr(cls, "_supported_attention_backends", None)
    member = _STATE.member
    if isinstance(backends, tuple) and member not in backends and AttentionBackendEnum.TORCH_SDPA in backends:
        cls._supported_attention_backends = backends + (member,)


def _extend_dit_classes() -> None:
    from fastvideo.models.dits.base import BaseDiT

    stack = [BaseDiT]
    while stack:
        cls = stack.pop()
        _extend_tuple(cls)
        stack.extend(cls.__subclasses__())
    current = BaseDiT.__dict__.get("__init_subclass__")
    if getattr(getattr(current, "__func__", None), "_winattn_hook", False):
        return

    def __init_subclass__(cls, **kwargs):
        if current is not None:
            current.__func__(cls, **kwargs)
        else:
            super(BaseDiT, cls).__init_subclass__(**kwargs)
        _extend_tuple(cls)

    __init_subclass__._winattn_hook = True
    BaseDiT.__init_subclass__ = classmethod(__init_subclass__)


# ----------------------------------------------------------------------------------------------------------------
# Backend and implementation


class WindowAttnHubMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self):
        pass

    def prepare(self):
        pass

    def build(self, current_timestep: int, attn_mask: Optional[torch.Tensor] = None, **kwargs):  # type: ignore
        from fastvideo.attention.backends.sdpa import SDPAMetadata

        return SDPAMetadata(current_timestep=current_timestep, attn_mask=attn_mask)


class WindowAttnHubBackend(AttentionBackend):
    """FastVideo backend class for WINDOW_ATTN_HUB (static methods only, never instantiated)."""

    accept_output_buffer: bool = False

    @staticmethod
    def get_name() -> str:
        return MEMBER_NAME

    @staticmethod
    def get_impl_cls() -> type["WindowAttnHubImpl"]:
        return WindowAttnHubImpl

    @staticmethod
    def get_metadata_cls() -> type:
        from fastvideo.attention.backends.sdpa import SDPAMetadata

        return SDPAMetadata

    @staticmethod
    def get_builder_cls() -> type:
        return WindowAttnHubMetadataBuilder

    @staticmethod
    def get_supported_head_sizes() -> list:
        return list(SUPPORTED_HEAD_SIZES)


def fastvideo_mask_args(attn_mask, query: torch.Tensor, key: torch.Tensor) -> dict:
    """Kernel mask keywords for an SDPA-style FastVideo mask (see `_normalize_attn_mask_for_sdpa`)."""
    if attn_mask is None:
        return {}
    m = attn_mask.to(device=query.device)
    # (first: a 0-D mask ended in a bare IndexError at m.shape[-1] below)
    if m.dim() not in (2, 3, 4):
        raise ValueError(f"unsupported attention mask shape {tuple(m.shape)}: expected [B, Sk], [B, Sq, Sk] or 4-D")
    if m.dtype != torch.bool and not m.is_floating_point():
        m = m != 0
    Sk = key.shape[1]
    if m.shape[-1] > Sk:
        raise ValueError(f"attention mask covers {m.shape[-1]} keys but there are only {Sk}")
    if m.shape[-1] < Sk:  # front-pad as "attend" (HYWorld prepends tokens the tokenizer mask does not cover)
        pad = torch.ones if m.dtype == torch.bool else torch.zeros
        m = torch.cat([pad((*m.shape[:-1], Sk - m.shape[-1]), dtype=m.dtype, device=m.device), m], dim=-1)
    return kernel_mask_args(m, query.shape[0], query.shape[1], Sk, two_d="key_padding")


class WindowAttnHubImpl(AttentionImpl):
    """[B, S, H, D] attention on the window-attention kernel (GQA/MQA through the kernel's head grouping)."""

    def __init__(self, num_heads: int, head_size: int, softmax_scale: float, causal: bool = False,
                 num_kv_heads: Optional[int] = None, prefix: str = "", **extra_impl_args) -> None:
        dropout = extra_impl_args.get("dropout_p", extra_impl_args.get("dropout_rate", 0.0)) or 0.0
        if dropout:
            raise ValueError(f"{MEMBER_NAME} does not implement attention dropout (dropout={dropout}); use 0.0 or "
                             "another backend")
        check_head_dim(int(head_size), MEMBER_NAME)
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
        self.softmax_scale = softmax_scale if softmax_scale is not None else head_size**-0.5
        self.causal = bool(causal)
        self.prefix = prefix
        self.kernel = _kernel()

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_metadata: Optional[AttentionMetadata]) -> torch.Tensor:
        attn_mask = getattr(attn_metadata, "attn_mask", None) if attn_metadata is not None else None
        kwargs = fastvideo_mask_args(attn_mask, query, key)
        if self.causal:
            Sq, Sk = query.shape[1], key.shape[1]
            if Sq == Sk:
                kwargs["causal"] = True
            elif Sq > Sk:  # torch SDPA's top-left causal alignment, as SDPAImpl computes it
                kwargs["window"] = (None, Sq - Sk)
            else:
                tril = torch.ones(Sq, Sk, dtype=torch.bool, device=query.device).tril()
                kwargs["mask"] = tril if "mask" not in kwargs else kwargs["mask"] & tril
        return self.kernel.attention(query, key, value, scale=self.softmax_scale, **kwargs)


# A process started with WINATTN_FASTVIDEO_AUTOREGISTER (a FastVideo worker of a parent that called register()) that
# imports this module before FastVideo finished importing registers here (the post-import hook defers to it).
def _autoregister_at_import() -> None:
    if fastvideo_autoregister_requested() and _STATE.config is None:
        _register_from_env()


_autoregister_at_import()
