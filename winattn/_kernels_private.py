"""The one door to what `kernels` (0.17.2) does not export publicly: no other winattn module imports `kernels._*` or
touches kernels' private state (tests/unit/test_layering.py checks that on the source).

`kernels.Metadata`, `LoadedKernel`, `get_loaded_kernels` and the non-underscore names of `kernels.variants`,
`kernels.backends`, `kernels.validate` and `kernels.compat` are used directly where needed. What follows is private
in kernels, why winattn needs it, and what a kernels upgrade that changes it breaks (each breaks here, in one place):

- `Backend`, `Build`, `Digest`, `DigestAlgorithm` (`kernels._rust`, the Rust extension; only `Metadata` of it is
  re-exported). `Backend` names a variant's backend type (arch check, device of the smoke test); `Build.open`
  validates `build.toml` with the parser kernel-builder and kernels share (publish, builder); `Digest.hash_variant`
  computes a variant's digest the way kernels checks it. A rename breaks publishing, building and every load.
- `detect_backend` (`kernels.backends._backend`): this machine's backend as kernels' resolver sees it. Breaks
  variant selection (every load, `winattn info`).
- `resolve_variant_for_system` (`kernels.variants._resolve_variant_for_system`): kernels' variant choice for a given
  backend, which `resolve_variant` only offers for this machine. Breaks variant selection.
- `register_loaded_kernel` / `forget_loaded_kernels` (`kernels.importer._loaded_kernels`, the registry behind the
  public `get_loaded_kernels()`): a winattn load is recorded there as `get_local_kernel` would, and dropped after a
  failed load. Breaks `kernels.get_loaded_kernels()` reporting winattn's loads.

Everything is imported when first used: importing kernels is not free, and most of winattn never needs it.
"""

from __future__ import annotations

from pathlib import Path

_RUST_NAMES = ("Backend", "Build", "Digest", "DigestAlgorithm")


def __getattr__(name: str):
    """`from winattn._kernels_private import Backend` (etc.) imports `kernels._rust` only then."""
    if name in _RUST_NAMES:
        from kernels import _rust

        return getattr(_rust, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def detect_backend():
    """This machine's kernels `Backend` (torch is imported), as kernels' `resolve_variants` detects it."""
    from kernels.backends import _backend

    return _backend()


def resolve_variant_for_system(**system):
    """kernels' own variant resolution for the given system (`selected_backend`, `cpu`, `os`, versions...):
    (resolved variants, decisions)."""
    from kernels.variants import _resolve_variant_for_system

    return _resolve_variant_for_system(**system)


def register_loaded_kernel(copy: Path, metadata, module) -> None:
    """Record `module`, imported from `copy`, in kernels' registry (`kernels.get_loaded_kernels()`)."""
    from kernels import LoadedKernel, importer

    importer._loaded_kernels[Path(copy)] = LoadedKernel(metadata=metadata, module=module, repo_info=None)


def forget_loaded_kernels(module_id: str, copy=None) -> None:
    """Drop the registry entries of `module_id` (only the one imported from `copy`, when given)."""
    from kernels import importer

    for path, loaded in list(importer._loaded_kernels.items()):
        if loaded.metadata.id == module_id and (copy is None or Path(path) == Path(copy)):
            importer._loaded_kernels.pop(path, None)


def resolve_all() -> dict:
    """Every private name above, resolved against the installed kernels (a test calls it, so that an upgrade that
    renames one fails there, by name)."""
    from kernels import importer
    from kernels.backends import _backend
    from kernels.variants import _resolve_variant_for_system

    found = {name: __getattr__(name) for name in _RUST_NAMES}
    found.update(_backend=_backend, _resolve_variant_for_system=_resolve_variant_for_system,
                 _loaded_kernels=importer._loaded_kernels)
    return found
