"""build.toml -> BuildConfig.

`kernels._rust.Build.open` (the parser kernel-builder and the `kernels` loader share) validates the file: edition 5,
unknown keys (kebab-case, `deny_unknown_fields`), required fields, names, backends. Its Python surface only exposes
`general.backends` (and kernel-depends), so every other field is read here with tomllib from the same, already
validated, file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BuildError

try:  # Python >= 3.11
    import tomllib as _toml

    def load_toml(text: str) -> dict:
        return _toml.loads(text)

except ImportError:  # Python 3.10: tomlkit is a dependency of `kernels`
    import tomlkit as _toml

    def load_toml(text: str) -> dict:
        return _toml.loads(text).unwrap()


BUILD_TOML = "build.toml"
SUPPORTED_BACKENDS = ("cpu", "cuda")
# Only `torch` is on hand outside Nix; cutlass & co. come from nix-builder's package set.
SUPPORTED_DEPENDS = ("torch",)
C_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx")
CUDA_SOURCE_SUFFIXES = (".cu",)
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl")
_CAPABILITY_RE = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


@dataclass
class KernelSpec:
    """One `[kernel.<name>]` section."""

    name: str
    backend: str
    src: list[str]
    include: list[str] = field(default_factory=list)
    depends: list[str] = field(default_factory=list)
    cxx_flags: list[str] = field(default_factory=list)
    cuda_flags: list[str] = field(default_factory=list)
    cuda_capabilities: list[str] | None = None
    cuda_minver: str | None = None

    @property
    def key(self) -> str:
        return f"[kernel.{self.name}]"


@dataclass
class BuildConfig:
    root: Path
    name: str
    version: int
    license: str
    backends: list[str]
    torch_src: list[str]
    torch_include: list[str]
    torch_cxx_flags: list[str]
    pyext: list[str]
    stable_abi: str | dict | None
    kernels: list[KernelSpec]
    python_depends: dict[str, list[str]]  # "general" and per-backend lists
    upstream: str | None = None
    source: str | None = None

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def python_dir(self) -> Path:
        return self.root / "torch-ext" / self.python_name

    def stable_abi_for(self, backend: str) -> str:
        """The stable-ABI torch version ("2.10") of `backend`; winattn build only makes stable-ABI variants."""
        abi = self.stable_abi
        if isinstance(abi, dict):
            abi = abi.get(backend)
        if abi is None:
            raise BuildError(
                f"{BUILD_TOML}: [torch] stable-abi has no version for backend '{backend}'; winattn build only makes "
                "torch-stable-abi variants (use Nix/kernel-builder for per-torch variants)"
            )
        if not isinstance(abi, str) or not re.fullmatch(r"\d+\.\d+", abi):
            raise BuildError(f"{BUILD_TOML}: [torch] stable-abi must be a 'major.minor' string, got {abi!r}")
        return abi

    def kernels_for(self, backend: str) -> list[KernelSpec]:
        return [k for k in self.kernels if k.backend == backend]

    def python_depends_for(self, backend: str) -> list[str]:
        return list(self.python_depends.get("general", [])) + list(self.python_depends.get(backend, []))


def _str_list(value, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BuildError(f"{BUILD_TOML}: {key} must be a list of strings, got {value!r}")
    return list(value)


def parse_capability(cap: str, key: str = "cuda-capabilities") -> tuple[int, int, str, bool]:
    """'9.0a+PTX' -> (9, 0, 'a', True)."""
    m = _CAPABILITY_RE.match(cap)
    if not m:
        raise BuildError(f"{BUILD_TOML}: {key}: '{cap}' is not a CUDA capability like '8.0', '9.0a' or '12.0+PTX'")
    return int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4))


def load_config(root: Path) -> BuildConfig:
    root = Path(root).resolve()
    path = root / BUILD_TOML
    if not path.is_file():
        raise BuildError(f"{path}: not found (is {root} a kernel repository?)")

    from .._kernels_private import Backend, Build

    try:
        parsed = Build.open(str(root))
    except ValueError as e:
        raise BuildError(f"{path}: {e}") from None
    backends = [str(b).split(".")[-1].lower() for b in parsed.general.backends]
    for b in backends:
        if parsed.all_kernel_depends(Backend.from_str(b)):
            raise BuildError(f"{BUILD_TOML}: kernel-depends (backend {b}) is not supported by winattn build")

    # kernels._rust.Build exposes only general.backends: the rest is read here from the file it just validated.
    try:
        data = load_toml(path.read_text())
    except Exception as e:  # noqa: BLE001 - already validated by Build.open; keep the message anyway
        raise BuildError(f"{path}: {e}") from None
    general = data.get("general", {})
    torch = data.get("torch")
    if torch is None:
        raise BuildError(f"{BUILD_TOML}: winattn build needs a [torch] section (the only framework it builds)")

    kernels = []
    for name, section in data.get("kernel", {}).items():
        key = f"[kernel.{name}]"
        caps = section.get("cuda-capabilities")
        spec = KernelSpec(
            name=name,
            backend=section.get("backend", ""),
            src=_str_list(section.get("src"), f"{key} src"),
            include=_str_list(section.get("include"), f"{key} include"),
            depends=_str_list(section.get("depends"), f"{key} depends"),
            cxx_flags=_str_list(section.get("cxx-flags"), f"{key} cxx-flags"),
            cuda_flags=_str_list(section.get("cuda-flags"), f"{key} cuda-flags"),
            cuda_capabilities=None if caps is None else _str_list(caps, f"{key} cuda-capabilities"),
            cuda_minver=section.get("cuda-minver"),
        )
        if spec.cuda_capabilities is not None:
            for cap in spec.cuda_capabilities:
                parse_capability(cap, f"{key} cuda-capabilities")
        kernels.append(spec)

    python_depends = {"general": _str_list(general.get("python-depends"), "[general] python-depends")}
    for b in SUPPORTED_BACKENDS:
        sub = general.get(b, {})
        if isinstance(sub, dict) and sub.get("python-depends"):
            python_depends[b] = _str_list(sub.get("python-depends"), f"[general.{b}] python-depends")

    return BuildConfig(
        root=root,
        name=general["name"],
        version=int(general["version"]),
        license=general["license"],
        backends=backends,
        torch_src=_str_list(torch.get("src"), "[torch] src"),
        torch_include=_str_list(torch.get("include"), "[torch] include"),
        torch_cxx_flags=_str_list(torch.get("cxx-flags"), "[torch] cxx-flags"),
        pyext=_str_list(torch.get("pyext"), "[torch] pyext") or ["py", "pyi"],
        stable_abi=torch.get("stable-abi"),
        kernels=kernels,
        python_depends=python_depends,
        upstream=general.get("upstream"),
        source=general.get("source"),
    )


def check_backend(cfg: BuildConfig, backend: str) -> list[KernelSpec]:
    """Validate what building `backend` needs from build.toml; returns its kernels."""
    if backend not in SUPPORTED_BACKENDS:
        raise BuildError(f"backend '{backend}' is not supported by winattn build (choose from {SUPPORTED_BACKENDS})")
    if backend not in cfg.backends:
        raise BuildError(f"{BUILD_TOML}: [general] backends = {cfg.backends} does not list '{backend}'")
    kernels = cfg.kernels_for(backend)
    if not kernels:
        raise BuildError(f"{BUILD_TOML}: no [kernel.*] section has backend = \"{backend}\"")
    cfg.stable_abi_for(backend)
    if not (cfg.python_dir / "__init__.py").is_file():
        raise BuildError(
            f"{BUILD_TOML}: [general] name = '{cfg.name}' needs the Python package "
            f"torch-ext/{cfg.python_name}/__init__.py, which does not exist"
        )

    def check_files(paths: list[str], key: str, what: str, is_dir: bool) -> None:
        for rel in paths:
            p = cfg.root / rel
            if not (p.is_dir() if is_dir else p.is_file()):
                raise BuildError(f"{BUILD_TOML}: {key} {what}: {rel} does not exist")

    check_files(cfg.torch_src, "[torch]", "src", False)
    check_files(cfg.torch_include, "[torch]", "include", True)
    if not any(s.endswith(C_SOURCE_SUFFIXES) for s in cfg.torch_src):
        raise BuildError(f"{BUILD_TOML}: [torch] src lists no C++ source (.cpp) to compile")
    for k in kernels:
        check_files(k.src, k.key, "src", False)
        check_files(k.include, k.key, "include", True)
        for dep in k.depends:
            if dep not in SUPPORTED_DEPENDS:
                raise BuildError(
                    f"{BUILD_TOML}: {k.key} depends: '{dep}' is not available to winattn build "
                    f"(supported: {', '.join(SUPPORTED_DEPENDS)})"
                )
        for s in k.src:
            if not s.endswith(C_SOURCE_SUFFIXES + CUDA_SOURCE_SUFFIXES + HEADER_SUFFIXES):
                raise BuildError(f"{BUILD_TOML}: {k.key} src: {s} has an unknown file type")
            if s.endswith(CUDA_SOURCE_SUFFIXES) and backend != "cuda":
                raise BuildError(f"{BUILD_TOML}: {k.key} src: {s} is CUDA but the kernel's backend is {backend}")
    return kernels
