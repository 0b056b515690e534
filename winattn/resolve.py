"""Where a kernel comes from: revision pinning and variant selection, delegated to `kernels` 0.17.2.

Selection is never re-implemented here: the variants of a Hub revision are listed with `kernels.variants.get_variants`
(the `build/` tree), local ones with `kernels.variants.get_variants_local`, and the choice and the per-variant
acceptance/rejection reasons come from `kernels.variants.resolve_variant` (the function behind `get_kernel`,
`get_kernel_variants` and `kernels info`). The only difference with `kernels` is that every Hub call goes through
the caller's `HfApi` (endpoint, token), and that a `version` is pinned to its commit once, here, for the whole load.
"""

from __future__ import annotations

import logging
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import safe_fs, untrusted
from .cache_layout import cache_dir, repo_cache_folder
from .errors import KernelNotFoundError, OfflineError
from .variant import DEFAULT_VERSION, REPO_TYPE

logger = logging.getLogger(__name__)

_VERSION_BRANCH = re.compile(r"(?:refs/heads/)?v(\d+)")
MAX_REF_BYTES = 4096  # a cache ref file holds one commit id


def is_commit(revision: Optional[str]) -> bool:
    return untrusted.is_commit(revision)


def branch_version(revision: Optional[str]) -> Optional[int]:
    """N when `revision` names the version branch `v<N>` (`"v1"`, `"refs/heads/v1"`), else None."""
    m = _VERSION_BRANCH.fullmatch(revision) if isinstance(revision, str) else None
    return int(m.group(1)) if m else None


def expected_version(version: Optional[int], revision: Optional[str]) -> int:
    """The version a signed build must be signed for, however it was asked for: `version=N`; a branch `v<N>`
    (`revision="v1"` or `"refs/heads/v1"`); else, for a commit id or any other ref, the default version 1 (pass
    `version=` with `revision=` to expect another one)."""
    if version is not None:
        return version
    return branch_version(revision) if branch_version(revision) is not None else DEFAULT_VERSION


@dataclass(frozen=True)
class Pin:
    """A revision pinned to a commit.

    Attributes:
        repo_id: the repository.
        version: the requested major version (branch `v<N>`), or None.
        revision: the requested revision, or `v<N>` for a version.
        commit: the 40-hex commit every download of this load uses.
    """

    repo_id: str
    version: Optional[int]
    revision: str
    commit: str

    def describe(self) -> str:
        if self.revision == self.commit:
            return f"{self.repo_id}@{self.commit[:12]}"
        return f"{self.repo_id} {self.revision} (commit {self.commit[:12]})"


@dataclass(frozen=True)
class Selection:
    """The outcome of variant resolution: the chosen variant name (or None) and kernels' decisions for all."""

    variant: Optional[str]
    decisions: list  # kernels.variants.VariantAccepted | VariantRejected, most preferred first
    system: str = ""  # what the variants were matched against (`system_description`)

    @property
    def rejected(self) -> list:
        """[(variant, reason)] for every rejected variant."""
        from kernels.variants import VariantRejected

        return [(d.variant.variant_str, d.reason) for d in self.decisions if isinstance(d, VariantRejected)]

    @property
    def accepted(self) -> list:
        from kernels.variants import VariantAccepted

        return [d.variant.variant_str for d in self.decisions if isinstance(d, VariantAccepted)]

    def trace(self) -> str:
        """kernels' own one-line-per-variant description (`variants_trace_str`)."""
        from kernels.variants import variants_trace_str

        return variants_trace_str(self.decisions) if self.decisions else "(no variants)"


def make_api(endpoint: Optional[str] = None, token=None):
    """The `HfApi` of a load: the caller's endpoint/token, else huggingface_hub's defaults (HF_ENDPOINT, HF_TOKEN)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token, library_name="winattn", library_version=_winattn_version())


def _winattn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("winattn")
    except PackageNotFoundError:
        return "0+unknown"


# Backend names that need a version to be a kernels backend (`cu130`, `rocm64`, `xpu20251`, `cann82`).
_FAMILIES = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU", "cann": "CANN"}

# Set by the CLI (`winattn info` / `verify` / `vendor`), which imports nothing of torch otherwise: read what kernels
# reads from torch without importing it where that is exact (`_probe_without_torch`). `winattn.load` imports torch
# anyway and keeps kernels' own detection.
PROBE_WITHOUT_TORCH_IMPORT = False


class _NoVersion:
    """A backend family named without a version (`--backend cuda`) when no variant of it is listed: every arch
    variant is rejected as "does not match selected backend (cuda)", noarch `cuda` variants are accepted."""

    def __init__(self, name: str):
        self.name = self.variant_str = name


def _variant_objects(variants) -> list:
    from kernels.variants import parse_variant

    out = []
    for v in variants:
        if isinstance(v, str):
            try:
                v = parse_variant(v)
            except ValueError:
                continue
        out.append(v)
    return out


def runs_here(backend: Optional[str]) -> bool:
    """Can this machine's torch run variants of `backend` (None: this machine's own)? kernels' `backend=` rule:
    "cpu" or the backend torch was built for (by name, e.g. "cuda", or its variant string, e.g. "cu130")."""
    if backend is None:
        return True
    here = _this_machine().backend
    return backend in ("cpu", here.name, here.variant_str)


def backend_for(backend: Optional[str], variants=()):
    """The kernels `Backend` to match variants against: this machine's for None; for a name, what a machine with
    that backend would be, without importing anything of it (so `winattn info --backend cuda` works on a CPU box):

    - a name kernels supports here ("cpu", this machine's backend) -> kernels' own;
    - a backend variant string (`cu130`, `rocm64`, `xpu20251`, `metal`, `cpu`, ...) -> that backend and version;
    - a family without a version (`cuda`, `rocm`, `xpu`, `cann`) -> the newest version of it among `variants` (what
      a machine whose torch has that version or newer loads);

    anything else is a ValueError naming what is accepted.
    """
    from kernels import backends as kb

    if backend is not None:
        check_backend_name(backend)
    here = _this_machine().backend
    if backend is None or backend == here.name or backend == here.variant_str:
        return here
    family = _FAMILIES.get(backend)
    if family is not None:
        versions = [v.arch.backend for v in _variant_objects(variants)
                    if type(getattr(getattr(v, "arch", None), "backend", None)).__name__ == family]
        if not versions:
            return _NoVersion(backend)
        return max(versions, key=lambda b: (b.version.major, b.version.minor))
    return kb.parse_backend(backend)


def check_backend_name(backend: str) -> str:
    """`backend` if it names a backend (`backend_for`), else ValueError saying which names are."""
    from kernels import backends as kb

    if backend in _FAMILIES:
        return backend
    try:
        kb.parse_backend(backend)
    except ValueError:
        raise ValueError(f"unknown backend {backend!r}: use cpu, cuda, rocm, xpu, cann, metal, neuron, tpu, or a "
                         "backend with its version as variant names spell it (cu130, rocm64, ...)") from None
    return backend


@dataclass(frozen=True)
class _System:
    """What kernels' `resolve_variants` matches variants against, but for a chosen backend."""

    backend: object
    cpu: str
    os: str
    torch_version: object
    tvm_ffi_version: object
    macos_version: object


_MACHINE: Optional[_System] = None


def _this_machine() -> _System:
    """This machine as kernels' `resolve_variants` sees it (its backend, CPU, OS, torch and tvm-ffi versions),
    computed once per process."""
    global _MACHINE
    if _MACHINE is None:
        probed = _probe_without_torch() if PROBE_WITHOUT_TORCH_IMPORT and "torch" not in sys.modules else None
        _MACHINE = probed or _probe_with_kernels()
    return _MACHINE


def _platform():
    from packaging.version import parse

    cpu, os_name, macos = platform.machine(), platform.system().lower(), None
    if os_name == "darwin":
        cpu = "aarch64" if cpu == "arm64" else cpu
        release = platform.mac_ver()[0]
        macos = parse(release) if release else None
    elif os_name == "windows":
        cpu = "x86_64" if cpu == "AMD64" else cpu
    return cpu, os_name, macos


def _major_minor(version: str):
    from packaging.version import Version, parse

    v = parse(version)
    return Version(f"{v.major}.{v.minor}")


def _tvm_ffi_version():
    from kernels.compat import has_tvm_ffi

    if not has_tvm_ffi:
        return None
    import tvm_ffi

    return _major_minor(tvm_ffi.__version__)


def _probe_with_kernels() -> _System:
    """kernels' own detection (`_kernels_private.detect_backend`, torch imported), as `resolve_variants` does it."""
    from kernels.compat import has_torch

    from ._kernels_private import detect_backend

    cpu, os_name, macos = _platform()
    torch_version = None
    if has_torch:
        import torch

        torch_version = _major_minor(torch.__version__)
    return _System(detect_backend(), cpu, os_name, torch_version, _tvm_ffi_version(), macos)


def _probe_without_torch() -> Optional[_System]:
    """The same as `_probe_with_kernels` from torch's `version.py`, without importing torch (~5 s on the CPU box),
    where that is exact: Linux, and no package that adds a device to torch when imported (torch_npu, torch_neuronx,
    torch_tpu, torch_xla, or a `torch.backends` entry point). None otherwise (then torch is imported)."""
    import ast
    import importlib.metadata
    import importlib.util

    from kernels import backends as kb
    from packaging.version import Version

    if platform.system() != "Linux":
        return None
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return None
        if any(importlib.util.find_spec(name) for name in ("torch_npu", "torch_neuronx", "torch_tpu", "torch_xla")):
            return None
        if importlib.metadata.entry_points(group="torch.backends"):
            return None
        source = Path(list(spec.submodule_search_locations)[0], "version.py").read_text()
        values = {}
        for node in ast.parse(source).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                getattr(node, "target", None) if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and node.value is not None:
                values[target.id] = ast.literal_eval(node.value)
        cuda, hip, xpu = values.get("cuda"), values.get("hip"), values.get("xpu")
        if cuda is not None:
            backend = kb.CUDA(version=Version(cuda))
        elif hip is not None:
            backend = kb.ROCm(version=Version(hip.split("-")[0]))
        elif xpu is not None:
            backend = kb.XPU(version=Version(f"{xpu[0:4]}.{xpu[5:6]}"))
        else:
            backend = kb.CPU()
        torch_version = _major_minor(values["__version__"])
    except (OSError, SyntaxError, ValueError, KeyError, TypeError, IndexError):
        return None
    cpu, os_name, macos = _platform()
    return _System(backend, cpu, os_name, torch_version, _tvm_ffi_version(), macos)


def _torch_cxx11_abi(os_name: str):
    from kernels.compat import has_torch

    if not has_torch or os_name != "linux":
        return None
    import torch

    return torch.compiled_with_cxx11_abi()


def system_description(backend: Optional[str] = None, variants=()) -> str:
    """e.g. "backend cpu, torch 2.13, x86_64-linux" (what the variants were matched against)."""
    machine = _this_machine()
    chosen = backend_for(backend, variants)
    torch_version = "none" if machine.torch_version is None else str(machine.torch_version)
    shown = chosen.variant_str
    if backend is not None and backend != shown:
        shown += f" (asked: {backend}" + ("; the newest of the variants" if backend in _FAMILIES else "") + ")"
    return f"backend {shown}, torch {torch_version}, {machine.cpu}-{machine.os}"


def check_version_args(version, revision, *, both: bool = False):
    """ValueError unless exactly one of `version` (a non-negative int) and `revision` (a branch, tag or 40-hex
    commit: a git ref name, it becomes a path under the cache's `refs/`) is given. With `both`, the two may come
    together ("this revision, which must be that version"), but a `v<N>` branch must then be version N."""
    if version is not None and revision is not None and not both:
        raise ValueError("pass either version= or revision=, not both")
    if version is None and revision is None:
        raise ValueError("a kernel version (version=<major>) or a revision (revision=<branch/tag/commit>) is needed")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValueError(f"version must be a non-negative integer (branch v<N>), got {version!r}")
    if revision is not None and not untrusted.is_revision(revision):
        raise ValueError(f"revision must be a branch, tag or 40-hex commit id (a git ref name: no '..', no component "
                         f"starting with '.', no control character or space), got {untrusted.shown(repr(revision))}")
    if version is not None and branch_version(revision) not in (None, version):
        raise ValueError(f"revision {revision!r} is the branch of version {branch_version(revision)}, not version "
                         f"{version}")


def pin(api, repo_id: str, *, version: Optional[int], revision: Optional[str]) -> Pin:
    """Resolve `version` (branch `v<N>`, as kernels' `_versions`) or `revision` to a commit, online. Every commit the
    Hub answers with is checked to be a commit id before it is used (`RemoteValueError` otherwise).

    Raises:
        KernelNotFoundError: no such repository, version branch or revision (`winattn.hub_errors.network_step`).
        DownloadError: the Hub cannot be reached.
        RemoteValueError: the Hub answered with something that is not a commit id.
    """
    from huggingface_hub.errors import RevisionNotFoundError

    from .hub_errors import network_step

    check_version_args(version, revision)
    if version is None and is_commit(revision):
        return Pin(repo_id, None, revision, revision)
    asked = f"v{version}" if version is not None else revision
    source = f"the Hub at {api.endpoint} (refs of {repo_id})"
    with network_step(f"resolving {repo_id} {asked}", repo_id=repo_id, endpoint=api.endpoint):
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
        if version is not None:
            versions = {}
            for branch in refs.branches:
                m = re.fullmatch(r"v(\d+)", branch.name)
                if m:
                    versions[int(m.group(1))] = branch
            if version not in versions:
                available = ", ".join(f"v{v}" for v in sorted(versions)) or "none"
                raise KernelNotFoundError(
                    f"version {version} of '{repo_id}' not found (no branch v{version}); available versions: "
                    f"{available}"
                )
            newest = max(versions)
            if newest > version:
                logger.warning("You are using version %d of '%s', but version %d is available.", version, repo_id,
                               newest)
            commit = untrusted.commit_id(versions[version].target_commit, source=f"{source}, branch v{version}")
            return Pin(repo_id, version, f"v{version}", commit)
        for ref in list(refs.branches) + list(refs.tags):
            if revision in (ref.name, ref.ref):
                return Pin(repo_id, None, revision,
                           untrusted.commit_id(ref.target_commit, source=f"{source}, {untrusted.shown(ref.ref)}"))
        try:
            info = api.repo_info(repo_id, repo_type=REPO_TYPE, revision=revision)
        except RevisionNotFoundError as e:
            branches = ", ".join(sorted(untrusted.shown(b.name) for b in refs.branches)) or "none"
            tags = ", ".join(sorted(untrusted.shown(t.name) for t in refs.tags)) or "none"
            error = KernelNotFoundError(
                f"revision '{untrusted.shown(revision)}' of '{repo_id}' not found (no branch, tag or commit of that "
                f"name; a commit is named by its full 40-hex id); branches: {branches}; tags: {tags}")
            error.cause = e
            raise error from None
    return Pin(repo_id, None, revision,
               untrusted.commit_id(info.sha, source=f"the Hub at {api.endpoint} (revision {revision} of {repo_id})"))


def pin_offline(repo_id: str, *, version: Optional[int], revision: Optional[str]) -> Pin:
    """Resolve from the cache only (`refs/` written by earlier downloads), as kernels' offline resolvers. The revision
    is checked before it becomes a path under `refs/`, the ref file is read without following a link, and what it
    holds must be a commit id (`RemoteValueError`: anyone who can write the cache writes these files)."""
    check_version_args(version, revision)
    if version is None and is_commit(revision):
        return Pin(repo_id, None, revision, revision)
    refs = repo_cache_folder(repo_id) / "refs"
    if version is not None:
        # `refs/v<N>` is read here like any other ref, not through kernels' `_get_available_versions_from_cache`:
        # that one follows a link and reads the whole file, so a cache writer's link to a file of the victim's (a
        # secret, /proc/self/environ) was read and its first bytes quoted in the refusal below.
        ref_file = untrusted.contained(refs, refs / f"v{version}", source=f"the cache ref v{version}")
        try:
            commit = safe_fs.read_small(ref_file, MAX_REF_BYTES).decode("utf-8", "replace").strip()
        except OSError:
            raise OfflineError(
                f"version {version} of '{repo_id}' is not in the local cache ({cache_dir()}) and the Hub is in "
                f"offline mode (HF_HUB_OFFLINE); load it once online, or pass revision=<commit>"
            ) from None
        return Pin(repo_id, version, f"v{version}", untrusted.commit_id(commit, source=f"the cache ref {ref_file}"))
    ref_file = untrusted.contained(refs, refs / revision, source=f"revision= {revision!r}")
    try:
        commit = safe_fs.read_small(ref_file, MAX_REF_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        raise OfflineError(
            f"revision '{revision}' of '{repo_id}' is not in the local cache ({cache_dir()}) and the Hub is in "
            f"offline mode (HF_HUB_OFFLINE)"
        ) from None
    return Pin(repo_id, None, revision, untrusted.commit_id(commit, source=f"the cache ref {ref_file}"))


def select(variant_names_or_variants, backend: Optional[str] = None) -> Selection:
    """kernels' variant resolution over a list of variants (or variant names), for this machine or, with `backend`,
    for a machine with that backend (`backend_for`): kernels' own rules
    (`_kernels_private.resolve_variant_for_system`), nothing re-implemented."""
    from kernels.variants import ArchVariant, Torch

    from ._kernels_private import resolve_variant_for_system

    variants = _variant_objects(variant_names_or_variants)
    machine = _this_machine()
    chosen = backend_for(backend, variants)
    # The C++ ABI only decides between `torch<NN>-cxx11/cxx98-...` variants: torch is imported only for those.
    needs_abi = any(isinstance(v, ArchVariant) and isinstance(v.framework, Torch) and v.framework.cxx11_abi is not None
                    for v in variants)
    resolved, decisions = resolve_variant_for_system(
        variants=variants, selected_backend=chosen, cpu=machine.cpu, os=machine.os,
        torch_version=machine.torch_version, torch_cxx11_abi=_torch_cxx11_abi(machine.os) if needs_abi else None,
        tvm_ffi_version=machine.tvm_ffi_version, macos_version=machine.macos_version,
    )
    return Selection(resolved[0].variant_str if resolved else None, list(decisions),
                     system_description(backend, variants))


def select_hub(api, pin_: Pin, backend: Optional[str] = None) -> Selection:
    """List the `build/` variants of the pinned commit on the Hub and resolve them (kernels' rules)."""
    from huggingface_hub.errors import EntryNotFoundError
    from kernels.variants import get_variants

    try:
        variants = get_variants(api, repo_id=pin_.repo_id, revision=pin_.commit)
    except EntryNotFoundError:
        variants = []
    return select(variants, backend)


def select_local(build_dir: Path, backend: Optional[str] = None) -> Selection:
    """Resolve the variant directories of a local `build/` (or vendored) directory (kernels' rules)."""
    from kernels.variants import get_variants_local

    return select(get_variants_local(Path(build_dir)), backend)


def not_found_message(what: str, selection: Selection, backend: Optional[str] = None) -> str:
    target = "this machine" if backend is None else f"a {backend} machine"
    return (
        f"no variant of {what} fits {target} ({selection.system or system_description(backend)}):\n"
        f"{selection.trace()}"
    )
