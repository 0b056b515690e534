"""The window-attention kernel as a diffusers attention backend (`window_attn_hub`), for diffusers 0.42.x.

    import winattn.integrations.diffusers as wd
    wd.register()                                   # once per process, before selecting the backend
    transformer.set_attention_backend("window_attn_hub")   # fetches + verifies the kernel now (winattn.load)
    with diffusers.attention_backend("window_attn_hub"): ...    # same, scoped

What `register()` does (diffusers has no public extension point, backends.md §A.3):

- injects a complete `AttentionBackendName` member (every enum map; pickles by value, `deepcopy` keeps identity);
- registers a backend function with explicit parameters `(query, key, value, attn_mask, dropout_p, is_causal, scale,
  enable_gqa, return_lse, _parallel_config)`, the constraints run under `DIFFUSERS_ATTN_CHECKS` (device, dtype,
  shape, head dim) and `supports_context_parallel=True` (ring and Ulysses attention through forward/backward ops
  that return the LSE);
- hooks the three selection paths so the kernel is fetched and verified when the backend is *selected*:
  `ModelMixin.set_attention_backend`, the `attention_backend()` context manager (both through diffusers'
  `_maybe_download_kernel_for_backend`) and the per-module `AttentionModuleMixin.set_attention_backend`, which
  never downloads anything for diffusers' own `*_hub` backends (diffusers#13284). A variant that does not fit the
  machine, an untrusted publisher or an unsupported head dim fails there, with the reasons.

Trust follows diffusers' `*_hub` backends: publishers the Hub marks as trusted load as is;
`DIFFUSERS_TRUST_REMOTE_KERNELS=1` opts in to untrusted ones; `DIFFUSERS_DISABLE_REMOTE_CODE=1` wins over it. Both are
read at selection time (as well as diffusers' own import-time copies of them). Offline (`HF_HUB_OFFLINE=1`) an opt-in
made by an earlier online selection is not remembered: `winattn.load` reuses only a trusted-publisher verdict, so
`DIFFUSERS_DISABLE_REMOTE_CODE=1` wins offline too (tests/security/test_loader_offline_trust.py).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import torch

from . import check_head_dim, env_flag, head_dim_problem, inject_enum_member, kernel_device_type, kernel_dtypes
from . import install_torchvision_shim, kernel_mask_args, load_kernel

# diffusers imports torchvision whenever it is installed; with PyPI's cu130 wheel beside CPU torch that import fails
# unless the op schemas are defined first (as winattn.integrations.timm does; a no-op with a working torchvision).
install_torchvision_shim()

logger = logging.getLogger(__name__)

DEFAULT_NAME = "window_attn_hub"
DEFAULT_REPO_ID = "winattn/window-attention"

__all__ = ["register", "load_backend", "unload", "registered_backends", "attention_backward", "DEFAULT_NAME",
           "DEFAULT_REPO_ID"]


@dataclass
class _Backend:
    """One registered backend name and what it loads."""

    value: str
    member: Any
    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    load_kwargs: dict
    module: Any = None  # the loaded kernel, set at selection
    lock: threading.Lock = field(default_factory=threading.Lock)
    forward_op: Any = None  # context-parallel ops (diffusers' templated ring / Ulysses attention)
    backward_op: Any = None

    def kernel(self):
        module = self.module
        if module is None:
            raise RuntimeError(
                f"attention backend '{self.value}' was not selected through diffusers, so its kernel is not loaded. "
                f"Select it with `model.set_attention_backend('{self.value}')`, `with attention_backend("
                f"'{self.value}')`, or call `winattn.integrations.diffusers.load_backend('{self.value}')` first "
                "(setting `processor._attention_backend` by hand or DIFFUSERS_ATTN_BACKEND skips the selection step)."
            )
        return module


_BACKENDS: dict = {}  # value -> _Backend
_REGISTER_LOCK = threading.RLock()


def registered_backends() -> dict:
    """{backend value: repo id} of every name registered in this process."""
    return {v: b.repo_id for v, b in _BACKENDS.items()}


# ----------------------------------------------------------------------------------------------------------------
# Registration


def register(name: str = DEFAULT_NAME, repo_id: str = DEFAULT_REPO_ID, version: Optional[int] = 1, *,
             revision: Optional[str] = None, **load_kwargs: Any):
    """Add the kernel to diffusers as attention backend `name` and return its `AttentionBackendName` member.

    Args:
        name: backend name as passed to `set_attention_backend` (lower case; diffusers lower-cases names).
        repo_id: Hub repository of the kernel.
        version: kernel major version (branch `v<N>`); ignored when `revision` is given.
        revision: a branch, tag or commit instead of `version`.
        **load_kwargs: passed to `winattn.load` at selection (`public_keys`, `require_signature`, `fallback`,
            `vendored`, `endpoint`, `token`, ...). Trust is not a keyword here: it comes from
            DIFFUSERS_TRUST_REMOTE_KERNELS / DIFFUSERS_DISABLE_REMOTE_CODE, as for diffusers' own `*_hub` backends.

    Registering the same name again with other arguments replaces them (and drops an already loaded kernel).
    Nothing is downloaded here.
    """
    from diffusers.models import attention_dispatch as ad

    if "trust_remote_code" in load_kwargs:
        raise TypeError(
            "register() takes no trust_remote_code: like diffusers' *_hub backends, trust comes from the environment "
            "(DIFFUSERS_TRUST_REMOTE_KERNELS=1 allows untrusted publishers; DIFFUSERS_DISABLE_REMOTE_CODE=1 wins)"
        )
    if not isinstance(name, str) or not name or name != name.lower() or not name.replace("_", "a").isalnum():
        raise ValueError(f"backend name must be a lower-case identifier such as 'window_attn_hub', got {name!r}")
    if revision is not None:
        version = None
    with _REGISTER_LOCK:
        Name = ad.AttentionBackendName
        existing = Name._value2member_map_.get(name)
        if existing is not None and name not in _BACKENDS:
            raise ValueError(f"'{name}' is one of diffusers' own attention backends; choose another name")
        member = inject_enum_member(Name, name.upper(), name)
        backend = _BACKENDS.get(name)
        if backend is None:
            backend = _Backend(name, member, repo_id, version, revision, dict(load_kwargs))
            _BACKENDS[name] = backend
        elif (backend.repo_id, backend.version, backend.revision, backend.load_kwargs) != (
                repo_id, version, revision, load_kwargs):
            backend.repo_id, backend.version, backend.revision = repo_id, version, revision
            backend.load_kwargs = dict(load_kwargs)
            backend.module = None
        fn = _make_backend_fn(backend)
        ad._AttentionBackendRegistry.register(
            member,
            constraints=[ad._check_device, _check_dtype_for(backend), ad._check_shape, _check_head_dim,
                         _check_dropout],
            supports_context_parallel=True,
        )(fn)
        _install_selection_hooks()
    return member


def load_backend(name: str = DEFAULT_NAME, *, modules: Optional[Iterable[torch.nn.Module]] = None):
    """Fetch, verify and import the kernel of backend `name` now (what selecting the backend does) and return it.

    With `modules`, also check that every attention module among them has a head dim the kernel supports.
    """
    backend = _BACKENDS.get(str(getattr(name, "value", name)).lower())
    if backend is None:
        raise ValueError(f"'{name}' is not a registered window-attention backend; call register() first")
    if modules is not None:
        _check_modules(backend, modules)
    return _select(backend)


def unload(name: Optional[str] = None) -> None:
    """Forget the loaded kernel of backend `name` (all when None): the next selection runs `winattn.load` again."""
    from . import clear_kernel_cache

    for value, backend in _BACKENDS.items():
        if name is None or value == name:
            backend.module = None
    clear_kernel_cache()


def _trust() -> tuple:
    """(trust_remote_code, disabled) from DIFFUSERS_TRUST_REMOTE_KERNELS / DIFFUSERS_DISABLE_REMOTE_CODE."""
    try:
        from diffusers.utils import constants
    except Exception:  # pragma: no cover - diffusers without the constants
        constants = None
    disabled = env_flag("DIFFUSERS_DISABLE_REMOTE_CODE") or bool(
        getattr(constants, "DIFFUSERS_DISABLE_REMOTE_CODE", False))
    trusted = env_flag("DIFFUSERS_TRUST_REMOTE_KERNELS") or bool(
        getattr(constants, "DIFFUSERS_TRUST_REMOTE_KERNELS", False))
    return (trusted and not disabled), disabled


def _select(backend: _Backend):
    """Selection-time load: winattn.load under diffusers' trust rules, once per process (cached)."""
    with backend.lock:
        if backend.module is not None:
            return backend.module
        from winattn.errors import UntrustedKernelError

        trust_remote_code, disabled = _trust()
        pin = f"revision {backend.revision}" if backend.revision else f"version {backend.version}"
        what = f"`{backend.repo_id}` ({pin})"
        try:
            module = load_kernel(backend.repo_id, version=backend.version, revision=backend.revision,
                                 trust_remote_code=trust_remote_code, **backend.load_kwargs)
        except UntrustedKernelError as e:
            message = (
                f"Backend '{backend.value}' loads {what}, which is not published by a trusted kernel publisher on the "
                "Hub, so loading it downloads and executes remote code. Set `DIFFUSERS_TRUST_REMOTE_KERNELS=true` to "
                "allow it."
            )
            if disabled:
                message += (" DIFFUSERS_DISABLE_REMOTE_CODE is set and overrides DIFFUSERS_TRUST_REMOTE_KERNELS: unset "
                            "it to allow remote kernels.")
            # Raised, not also logged: the caller sees the message once. The loader's own hint names
            # `trust_remote_code=`, which register() does not take: keep its reason only.
            reason = str(e).split(" Set trust_remote_code=True")[0]
            raise UntrustedKernelError(f"{message}\nLoader: {reason}") from e
        except Exception as e:  # raised with a note, not also logged (diffusers' own *_hub backends log it twice)
            e.add_note(f"while selecting the diffusers attention backend '{backend.value}' ({backend.repo_id})")
            raise
        if not callable(getattr(module, "attention", None)):
            raise RuntimeError(f"kernel {what} has no `attention` function; backend '{backend.value}' needs it")
        backend.module = module
        return module


def _attention_head_dim(module) -> Optional[int]:
    head_dim = getattr(module, "head_dim", None)
    if isinstance(head_dim, int):
        return head_dim
    heads, inner = getattr(module, "heads", None), getattr(module, "inner_dim", None)
    if isinstance(heads, int) and isinstance(inner, int) and heads > 0 and inner % heads == 0:
        return inner // heads
    return None


def _check_modules(backend: _Backend, modules: Iterable[torch.nn.Module]) -> None:
    """Fail at selection when an attention module the backend would drive has an unsupported head dim."""
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention, MochiAttention

    problems = []
    for module in modules:
        if not isinstance(module, (Attention, MochiAttention, AttentionModuleMixin)):
            continue
        if not hasattr(getattr(module, "processor", None), "_attention_backend"):
            continue  # processors outside the dispatcher (e.g. AttnProcessor2_0) are not affected
        head_dim = _attention_head_dim(module)
        problem = None if head_dim is None else head_dim_problem(head_dim)
        if problem:
            problems.append(f"{type(module).__name__}: {problem}")
    if problems:
        unique = sorted(set(problems))
        raise ValueError(
            f"attention backend '{backend.value}' cannot run this model: " + "; ".join(unique)
            + ". Keep another backend (e.g. 'native') for it."
        )


# ----------------------------------------------------------------------------------------------------------------
# Selection hooks


def _ours(backend) -> Optional[_Backend]:
    if backend is None:
        return None
    value = getattr(backend, "value", backend)
    return _BACKENDS.get(value.lower()) if isinstance(value, str) else None


def _install_selection_hooks() -> None:
    from diffusers.models import attention_dispatch as ad
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.modeling_utils import ModelMixin

    original_download = ad._maybe_download_kernel_for_backend
    if not getattr(original_download, "_winattn_hook", False):
        def _maybe_download_kernel_for_backend(backend):
            ours = _ours(backend)
            if ours is not None:
                _select(ours)
                return None
            return original_download(backend)

        _maybe_download_kernel_for_backend._winattn_hook = True
        _maybe_download_kernel_for_backend.__wrapped__ = original_download
        ad._maybe_download_kernel_for_backend = _maybe_download_kernel_for_backend

    model_set = ModelMixin.set_attention_backend
    if not getattr(model_set, "_winattn_hook", False):
        def set_attention_backend(self, backend: str) -> None:
            ours = _ours(backend)
            if ours is None:
                return model_set(self, backend)
            # Check the whole model, then load, before any processor changes.
            _check_modules(ours, self.modules())
            _select(ours)
            # diffusers also makes the name the process-wide default (`set_active_backend`), so every other model
            # would silently run on it too (diffusers#14249). This model's processors hold the member themselves;
            # keep the process-wide default as it was.
            previous = ad._AttentionBackendRegistry._active_backend
            try:
                return model_set(self, backend)
            finally:
                ad._AttentionBackendRegistry.set_active_backend(previous)

        set_attention_backend._winattn_hook = True
        set_attention_backend.__wrapped__ = model_set
        set_attention_backend.__doc__ = model_set.__doc__
        ModelMixin.set_attention_backend = set_attention_backend

    module_set = AttentionModuleMixin.set_attention_backend
    if not getattr(module_set, "_winattn_hook", False):
        def set_module_attention_backend(self, backend: str):
            ours = _ours(backend)
            if ours is not None:  # diffusers' per-module path neither downloads nor checks (diffusers#13284)
                _check_modules(ours, [self])
                _select(ours)
                backend = ours.value
            return module_set(self, backend)

        set_module_attention_backend._winattn_hook = True
        set_module_attention_backend.__wrapped__ = module_set
        AttentionModuleMixin.set_attention_backend = set_module_attention_backend


# ----------------------------------------------------------------------------------------------------------------
# Constraints (run by dispatch_attention_fn when DIFFUSERS_ATTN_CHECKS / _checks_enabled is on)


def _check_dtype_for(backend: _Backend):
    def _check_qkv_dtype_window_attention(query, key, value, **kwargs) -> None:
        if query.dtype != key.dtype or query.dtype != value.dtype:
            raise ValueError("Query, key, and value must have the same dtype.")
        module = backend.module
        if module is None:
            return
        allowed = kernel_dtypes(module)
        if query.dtype not in allowed:
            raise ValueError(f"Backend '{backend.value}' ({kernel_device_type(module) or 'reference'} build) takes "
                             f"{[str(d) for d in allowed]} query/key/value, got {query.dtype}.")
        device_type = kernel_device_type(module)
        if device_type is not None and query.device.type != device_type:
            raise ValueError(f"Backend '{backend.value}' loaded the {device_type} build of the kernel, but query is "
                             f"on {query.device}.")

    return _check_qkv_dtype_window_attention


def _check_head_dim(query, key, value, **kwargs) -> None:
    check_head_dim(query.shape[-1], "window-attention backend")


def _check_dropout(query, key, value, dropout_p: float = 0.0, **kwargs) -> None:
    if dropout_p:
        raise ValueError(_dropout_message(dropout_p))


def _dropout_message(dropout_p) -> str:
    return (f"the window-attention backend does not implement attention dropout (dropout_p={dropout_p}); use "
            "dropout_p=0.0 or another backend")


# ----------------------------------------------------------------------------------------------------------------
# The backend function


def _check_flags(query, key, is_causal, return_lse, enable_gqa) -> None:
    """Refuse what would otherwise be ignored or read by truthiness (torch SDPA, diffusers' `native`, refuses both).

    - is_causal / return_lse must be bools: `if is_causal:` ran causal attention for is_causal="false".
    - enable_gqa=False with fewer K/V heads than Q heads: the kernel does GQA by itself, so the flag was ignored and
      a mis-shaped call that `native` refuses ran as grouped-query attention.
    """
    for name, flag in (("is_causal", is_causal), ("return_lse", return_lse), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise TypeError(f"window-attention backend: {name} must be a bool, got {type(flag).__name__} {flag!r}")
    if not enable_gqa and key.shape[2] != query.shape[2]:
        raise ValueError(
            f"window-attention backend: query has {query.shape[2]} heads but key/value have {key.shape[2]}; pass "
            "enable_gqa=True for grouped-query attention (as torch SDPA requires)")


def _call_kwargs(query, key, attn_mask, is_causal) -> dict:
    """Kernel keyword arguments for a diffusers (attn_mask, is_causal) pair."""
    B, Sq, Sk = query.shape[0], query.shape[1], key.shape[1]
    kwargs = kernel_mask_args(attn_mask, B, Sq, Sk, two_d="auto")
    if is_causal:
        if Sq == Sk:
            kwargs["causal"] = True
        elif Sq > Sk:
            # torch SDPA's is_causal is top-left aligned (j <= i); the kernel's band is bottom-right aligned.
            kwargs["window"] = (None, Sq - Sk)
        else:
            tril = torch.ones(Sq, Sk, dtype=torch.bool, device=query.device).tril()
            kwargs["mask"] = tril if "mask" not in kwargs else kwargs["mask"] & tril
    return kwargs


def _make_backend_fn(backend: _Backend):
    def _window_attention_hub(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        _parallel_config=None,
    ):
        """q/k/v [B, S, H, D] -> out [B, Sq, H, D] (and lse [B, Sq, H] with return_lse)."""
        if dropout_p:
            raise ValueError(_dropout_message(dropout_p))
        _check_flags(query, key, is_causal, return_lse, enable_gqa)
        module = backend.kernel()
        if _parallel_config is not None:
            from diffusers.models.attention_dispatch import _templated_context_parallel_attention

            ring = getattr(_parallel_config.context_parallel_config, "ring_degree", 1) or 1
            if attn_mask is not None and ring > 1:
                # diffusers' ring attention hands every rotated K/V chunk the same local mask shard, so a mask would
                # be applied to the wrong keys (measured on 2 H200s: 0.48 max error). Refuse instead of being wrong.
                raise ValueError(
                    f"{backend.value}: attention masks are not supported under diffusers' ring attention "
                    f"(ring_degree={ring}): diffusers does not rotate the mask with the K/V chunks. Use Ulysses "
                    "attention (ulysses_degree) for masked inputs."
                )

            return _templated_context_parallel_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                forward_op=backend.forward_op, backward_op=backend.backward_op, _parallel_config=_parallel_config,
            )
        kwargs = _call_kwargs(query, key, attn_mask, is_causal)
        if return_lse:
            out, lse = module.attention(query, key, value, scale=scale, return_lse=True, **kwargs)
            return out, lse.permute(0, 2, 1)
        return module.attention(query, key, value, scale=scale, **kwargs)

    _window_attention_hub.__name__ = f"_{backend.value}_attention"
    backend.forward_op = _make_forward_op(backend)
    backend.backward_op = _make_backward_op(backend)
    return _window_attention_hub


# ----------------------------------------------------------------------------------------------------------------
# Context parallelism: forward/backward ops for diffusers' TemplatedRingAttention / TemplatedUlyssesAttention


def _make_forward_op(backend: _Backend):
    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        if dropout_p:
            raise ValueError(_dropout_message(dropout_p))
        _check_flags(query, key, is_causal, return_lse, enable_gqa)
        module = backend.kernel()
        kwargs = _call_kwargs(query, key, attn_mask, is_causal)
        out, lse = module.attention_forward(query, key, value, scale=scale, **kwargs)  # autograd: backward_op
        lse = lse.permute(0, 2, 1).contiguous()  # [B, Sq, H], diffusers' layout
        if _save_ctx:
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.winattn_kwargs = dict(kwargs, scale=scale)
        return (out, lse) if return_lse else out

    return forward_op


def _make_backward_op(backend: _Backend):
    def backward_op(ctx, grad_out, *args, query=None, key=None, value=None, out=None, lse=None, **kwargs):
        # Ring attention passes the rotated key/value chunk and the fully reduced out/lse; Ulysses passes nothing
        # and the tensors saved by forward_op are used. Gradients of the chunk follow from the global lse.
        saved_q, saved_k, saved_v, saved_out, saved_lse = ctx.saved_tensors
        query = saved_q if query is None else query
        key = saved_k if key is None else key
        value = saved_v if value is None else value
        out = saved_out if out is None else out
        lse = saved_lse if lse is None else lse
        if lse.dim() == 4:  # some templates keep a trailing singleton dim
            lse = lse.squeeze(-1)
        lse_bhs = lse.permute(0, 2, 1).float().contiguous()
        return attention_backward(backend.kernel(), grad_out, query, key, value, out.to(query.dtype), lse_bhs,
                                  **ctx.winattn_kwargs)

    return backward_op


def attention_backward(module, grad_out, q, k, v, out, lse, *, bias=None, mask=None, key_padding_mask=None,
                       causal=False, window=None, scale=None):
    """(dq, dk, dv) of `module.attention` for given out [B, Sq, H, D] and lse [B, H, Sq] (float32).

    `out`/`lse` may be those of a larger attention that this call's keys are one chunk of (ring attention): the
    flash-style backward then yields that chunk's share of the gradients. The kernel's public low-level op
    (`attention_backward`, in its `__all__`; the pure-PyTorch reference module has the same one).
    """
    dq, dk, dv, _ = module.attention_backward(grad_out, q, k, v, out, lse, bias=bias, mask=mask,
                                              key_padding_mask=key_padding_mask, causal=causal, window=window,
                                              scale=scale)
    return dq, dk, dv
