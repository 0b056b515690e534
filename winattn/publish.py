"""`winattn publish`: check, optionally sign, and upload the built variants to a Hub kernel repo.

Layout on the Hub:

    main:    README.md              the filled CARD.md
             benchmarks/benchmark*.py, benchmarks/RESULTS.md
    v<N>:    build/<variant>/...    every variant in the build dir, stale files of those variants deleted

All variant files go to `v<N>` in one `create_commit` (pinned to the branch head it was computed against), so a reader
of the branch sees either the old or the new version, never a mix. Nothing is uploaded unless every variant passes
`check_variant`. The version branch holds nothing but `build/` (kernel-builder's `upload` also puts `benchmarks/`
there): `kernels lock` / `kernels download` / `kernels.load_kernel(lockfile=...)` and an offline `kernels.get_kernel`
need every file of the commit in the cache, and `kernels download` fetches only `build/` (kernels 0.17.2). The
benchmarks go to `main` with the card, in one commit.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ._build.config import load_toml
from .errors import PublishError
from .hub_errors import describe_hub_error, hub_call_errors  # noqa: F401  (also importable from here, as before)
from .variant import ABI3_TARGET as PYTHON_ABI
from .digest import check_digest
from .variant import DEFAULT_REPO, METADATA_FILENAME, REPO_TYPE, abi3_violations, list_variants
from .variant import variant_files  # noqa: F401  (publish's file list is the variant's)
BENCHMARK_PATTERNS = ("benchmark*.py", "RESULTS.md")


@dataclass(frozen=True)
class BuildConfig:
    name: str
    version: int
    license: str
    hub_repo_id: str | None


def read_build_config(repo_root: Path) -> BuildConfig:
    """Validate `build.toml` with kernels' own parser (`kernels._rust.Build.open`), then read it (tomllib, or tomlkit
    on Python 3.10: `winattn._build.config.load_toml`)."""
    from ._kernels_private import Build

    path = Path(repo_root) / "build.toml"
    if not path.is_file():
        raise PublishError(f"{path} is missing: run publish inside the kernel repository or pass --repo-root DIR")
    try:
        Build.open(str(Path(repo_root)))
    except Exception as e:  # noqa: BLE001  (kernels raises ValueError/OSError with the parser's message)
        raise PublishError(f"{path} is not a valid kernel-builder config: {e}") from None
    general = load_toml(path.read_text())["general"]
    return BuildConfig(
        name=general["name"],
        version=int(general["version"]),
        license=general.get("license", "apache-2.0"),
        hub_repo_id=general.get("hub", {}).get("repo-id"),
    )


def find_variants(build_dir: Path) -> list[Path]:
    """Dirs of `build_dir` named like a kernels variant (`winattn.variant.list_variants`); at least one."""
    build_dir = Path(build_dir)
    if not build_dir.is_dir():
        raise PublishError(f"build dir {build_dir} does not exist: run `winattn build` first")
    variants = list_variants(build_dir)
    if not variants:
        raise PublishError(f"no variants in {build_dir} (expected build/<variant>/ dirs): run `winattn build` first")
    return variants


def check_variant(
    variant_dir: Path,
    *,
    expect_name: str | None = None,
    expect_version: int | None = None,
    check_signature: bool = True,
) -> None:
    """Refuse a variant that kernels could not load or that does not match its metadata.

    Checks: `__init__.py` and `_ops.py` exist; exactly one `*.abi3.so`; `metadata.json` parses with
    `kernels.Metadata` (and matches the build's name/version when given); it has a digest and the files match it
    (`winattn.digest.check_digest`); the `.so` uses only the Python 3.9 limited API (`kernel_abi_check`); with
    `check_signature`, an existing `metadata.json.sigstore` was made for this metadata.json (not stale; the signature
    itself is verified by loaders, which hold the public keys).

    Raises:
        PublishError: naming the variant and the first failed check.
    """
    from kernels import Metadata

    vdir = Path(variant_dir)
    variant = vdir.name

    def refuse(cause: str):
        raise PublishError(f"variant {variant} refused: {cause}")

    for required in ("__init__.py", "_ops.py", METADATA_FILENAME):
        if not (vdir / required).is_file():
            refuse(f"{required} is missing (broken build; rebuild with `winattn build`)")
    libs = sorted(p.name for p in vdir.glob("*.abi3.so"))
    if len(libs) != 1:
        refuse(f"expected exactly one *.abi3.so, found {len(libs)}" + (f": {', '.join(libs)}" if libs else ""))
    try:
        metadata = Metadata.read_from_file(str(vdir / "metadata.json"))
    except Exception as e:  # noqa: BLE001
        refuse(f"metadata.json does not parse: {e}")
    if expect_name is not None and str(metadata.name) != expect_name:
        refuse(f"metadata.json name {str(metadata.name)!r} is not build.toml's {expect_name!r}")
    if expect_version is not None and metadata.version != expect_version:
        refuse(
            f"metadata.json version {metadata.version} is not build.toml's {expect_version} "
            f"(stale build: rebuild before publishing to v{expect_version})"
        )
    if metadata.digest is None:
        refuse("metadata.json has no digest")
    try:
        check_digest(vdir)
    except ValueError as e:
        refuse(str(e))
    from .signing import signed_metadata_sha256  # light: model_signing is imported only to sign/verify

    try:
        signed = signed_metadata_sha256(vdir) if check_signature else None
    except ValueError as e:
        refuse(f"unreadable signature: {e}")
    if signed is not None and signed != hashlib.sha256((vdir / "metadata.json").read_bytes()).hexdigest():
        refuse(
            "stale signature: metadata.json changed after metadata.json.sigstore was made "
            "(re-sign with --signing-key, or delete the .sigstore file)"
        )
    try:
        violations = abi3_violations(vdir / libs[0])
    except ValueError as e:
        refuse(f"{libs[0]} cannot be read as a shared library: {e}")
    if violations:
        refuse(f"{libs[0]} is not abi3 for Python {PYTHON_ABI}: {len(violations)} symbol(s): "
               + ", ".join(violations[:10]))


def benchmark_files(repo_root: Path) -> list[Path]:
    """`benchmarks/benchmark*.py` and `benchmarks/RESULTS.md`, relative to repo_root.

    Raises:
        PublishError: `benchmarks/` or one of those files is a link. They are uploaded to the public `main` (and
            RESULTS.md quoted into the card) as they are: a link (git stores links, so a contributed
            `RESULTS.md -> ~/.ssh/id_ed25519` arrives with a pull) published the file it points at.
    """
    bench = Path(repo_root) / "benchmarks"
    if bench.is_symlink():
        raise PublishError(f"{bench} is a link: publish uploads only the repository's own files; replace it by a "
                           "directory")
    if not bench.is_dir():
        return []
    found = sorted(p for p in bench.iterdir() if any(fnmatch.fnmatch(p.name, pat) for pat in BENCHMARK_PATTERNS))
    links = [p for p in found if p.is_symlink()]
    if links:
        raise PublishError(f"{', '.join(str(p.relative_to(repo_root)) for p in links)}: a link, not a file; publish "
                           "uploads only the repository's own files (replace it by the file, or remove it)")
    return [p.relative_to(repo_root) for p in found if p.is_file()]


def _is_benchmark_file(path: str) -> bool:
    return path.startswith("benchmarks/") and "/" not in path[len("benchmarks/"):] and any(
        fnmatch.fnmatch(path[len("benchmarks/"):], pat) for pat in BENCHMARK_PATTERNS)


def _stale_files(remote: list[str], uploads: set[str], variants: list[str], new_branch: bool) -> list[str]:
    """Files of the version branch to delete: stale files of uploaded variants, and benchmarks (they live on main;
    earlier publishes put them here); on a new branch, everything that is not uploaded."""
    stale = []
    for path in remote:
        if path in uploads:
            continue
        if new_branch:
            stale.append(path)  # the branch starts as a copy of main (README.md, benchmarks/): keep it build-only
        elif any(path.startswith(f"build/{v}/") for v in variants) or _is_benchmark_file(path):
            stale.append(path)
    return stale


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory at or above `start` (default: the current one) holding `build.toml`.

    So that `winattn publish` works from any subdirectory of the kernel repository, as `git` does.
    """
    start = Path(start or Path.cwd()).resolve()
    for d in (start, *start.parents):
        if (d / "build.toml").is_file():
            return d
    raise PublishError(f"no build.toml in {start} or any parent directory: run publish inside the kernel "
                       f"repository or pass --repo-root DIR")


@dataclass(frozen=True)
class PublishResult:
    """What one `publish` did, for its summary.

    Attributes:
        repo_id, branch: where the variants went (`v<version>`).
        commit: sha of the branch head after the upload; `changed` is False when the branch already held these files.
        commit_url: the Hub's URL of that commit.
        variants: names of the uploaded variants.
        signer: `sha256:<hex>` fingerprint of the public half of --signing-key, or None (unsigned).
        card: "updated", "unchanged" or the reason it was left as is (a newer major exists).
        endpoint: the Hub it talked to.
    """

    repo_id: str
    branch: str
    commit: str
    commit_url: str
    changed: bool
    variants: tuple
    signer: str | None
    card: str
    endpoint: str

    def summary(self) -> str:
        signed = f"signed by key {self.signer}" if self.signer else "unsigned (pass --signing-key to sign)"
        state = "uploaded" if self.changed else "unchanged (the branch already held these files)"
        lines = [f"{self.repo_id} {self.branch} at {self.endpoint}: {state}"]
        lines += [f"  variant  {v} ({signed})" for v in self.variants]
        lines += [f"  commit   {self.commit}", f"           {self.commit_url}", f"  card     main README.md {self.card}"]
        return "\n".join(lines)


def _signer_fingerprint(signing_key: Path) -> str:
    """`sha256:<hex>` of the public key derived from the private key (what `winattn keygen` prints)."""
    from cryptography.hazmat.primitives import serialization

    from .signing import public_key_fingerprint

    try:
        private = serialization.load_pem_private_key(Path(signing_key).read_bytes(), password=None)
    except (ValueError, TypeError) as e:
        raise PublishError(f"--signing-key {signing_key} is not an unencrypted PEM private key: {e}") from None
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pub = Path(tmp) / "key.pub.pem"
        pub.write_bytes(private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        return f"sha256:{public_key_fingerprint(pub)}"


def _refuse_foreign_signatures(variant_dirs: list[Path]) -> None:
    """Without --signing-key, a `metadata.json.sigstore` in build/ was made by someone else (an earlier publish, the
    demo's throwaway key): uploading it would publish a signature this command cannot vouch for."""
    from .signing import SIGNATURE_FILENAME

    signed = [v for v in variant_dirs if (v / SIGNATURE_FILENAME).exists()]
    if signed:
        paths = " ".join(str(v / SIGNATURE_FILENAME) for v in signed)
        raise PublishError(
            f"{paths}: a signature this publish did not make (no --signing-key given); it would be uploaded as "
            f"is. Pass --signing-key KEY to sign with your key, or delete it to publish unsigned: rm {paths}"
        )


@contextlib.contextmanager
def _quiet_hub_logs():
    """huggingface_hub warns "No files have been modified" for a no-op commit; the summary says it once instead."""
    import logging

    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def publish(repo_id: str = DEFAULT_REPO, **kwargs) -> str:
    """`publish_report(...)`, returning only the commit sha on `v<version>` (see there)."""
    return publish_report(repo_id, **kwargs).commit


def publish_report(
    repo_id: str = DEFAULT_REPO,
    *,
    build_dir: Path = Path("build"),
    endpoint: str | None = None,
    token: str | None = None,
    private: bool = False,
    signing_key: Path | None = None,
    repo_root: Path = Path("."),
    commit_message: str | None = None,
    progress=None,
) -> PublishResult:
    """Upload every variant of `build_dir` to branch `v<version>`, and the card and the benchmarks to `main`.

    Args:
        repo_id: Hub kernel repo (`org/name`); created (repo type `kernel`) if missing.
        build_dir: directory holding `<variant>/` dirs (relative paths are relative to the current directory).
        endpoint, token: Hub endpoint and token; `None` = huggingface_hub's defaults (`HF_ENDPOINT`, `HF_TOKEN`).
        private: create the repo private (an existing repo keeps its visibility).
        signing_key: EC P-256 private key (PEM); each variant is signed for `repo_id`, the build's version and the
            variant's name (`winattn.signing.statement_for`) in a staging copy: `build_dir` is never modified.
            Without it, a variant that already holds a signature is refused (nobody vouches for that signature).
        repo_root: kernel source root holding `build.toml`, `CARD.md` and `benchmarks/`.
        commit_message: title of the commit on `v<version>` (default: "Publish <name> v<N>: <variants>").
        progress: callable taking one line of progress text (default: none); large files also get
            huggingface_hub's own upload bars.

    Returns:
        PublishResult. The card and the benchmarks on `main` are updated unless a newer `v<N>` exists.

    Raises:
        PublishError: bad build.toml, a refused variant or signature (nothing is uploaded then), or a failed Hub call.
    """
    import tempfile

    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import OfflineModeIsEnabled

    from .card import dirty_variants, render_card

    say = progress or (lambda line: None)
    repo_root = Path(repo_root)
    build_dir = Path(build_dir)
    config = read_build_config(repo_root)
    branch = f"v{config.version}"
    variant_dirs = find_variants(build_dir)
    signer = None
    if signing_key is None:
        _refuse_foreign_signatures(variant_dirs)
    else:
        signing_key = Path(signing_key)
        if not signing_key.is_file():
            raise PublishError(f"signing key {signing_key} does not exist (create one with `winattn keygen`)")
        signer = _signer_fingerprint(signing_key)
    for vdir in variant_dirs:
        # A signature about to be replaced by this publish's own need not be current.
        check_variant(
            vdir, expect_name=config.name, expect_version=config.version, check_signature=signing_key is None
        )
    with tempfile.TemporaryDirectory(prefix="winattn-publish-") as staging:
        signatures: dict[str, Path] = {}
        if signing_key is not None:
            from .signing import SIGNATURE_FILENAME, sign_variant

            for vdir in variant_dirs:
                # Signed in a copy: a signature in build/ changes only when the user makes it change.
                copy = Path(staging) / vdir.name
                shutil.copytree(vdir, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                          SIGNATURE_FILENAME))
                try:
                    # The statement binds the repository and version uploaded to (winattn.signing): the signature
                    # cannot be reused for another repository, version or variant.
                    signatures[vdir.name] = sign_variant(copy, signing_key, repo_id=repo_id, version=config.version)
                except Exception as e:  # noqa: BLE001  (bad key format, unsupported curve, ...)
                    raise PublishError(f"variant {vdir.name}: signing failed: {e}") from None
        # Before the card reads RESULTS.md: a linked benchmark file is refused before any of it is read.
        benchmarks = {rel.as_posix() for rel in benchmark_files(repo_root)}
        for name in dirty_variants(variant_dirs):
            print(f"winattn publish: warning: {name} was built from a dirty git tree (noted on the card)",
                  file=sys.stderr)
        card = render_card(
            repo_root,
            repo_id=repo_id,
            name=config.name,
            version=config.version,
            license=config.license,
            variant_dirs=variant_dirs,
            signed=set(signatures),  # signed in the staging copy: build/ holds no signature (refused without a key)
            signer=signer,
        )

        operations: list = []
        uploads: set[str] = set()
        for vdir in variant_dirs:
            files = [rel for rel in variant_files(vdir) if rel.as_posix() != "metadata.json.sigstore"]
            size = sum((vdir / rel).stat().st_size for rel in files)
            say(f"{vdir.name}: {len(files) + (vdir.name in signatures)} files, {size / 2**20:.1f} MiB")
            for rel in files:
                path_in_repo = f"build/{vdir.name}/{rel.as_posix()}"
                uploads.add(path_in_repo)
                operations.append(CommitOperationAdd(path_in_repo=path_in_repo, path_or_fileobj=str(vdir / rel)))
            if vdir.name in signatures:
                path_in_repo = f"build/{vdir.name}/metadata.json.sigstore"
                uploads.add(path_in_repo)
                operations.append(CommitOperationAdd(path_in_repo=path_in_repo,
                                                     path_or_fileobj=signatures[vdir.name].read_bytes()))
        main_operations: list = [CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode())]
        for rel in sorted(benchmarks):
            main_operations.append(CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(repo_root / rel)))

        api = HfApi(endpoint=endpoint, token=token)
        variant_names = [v.name for v in variant_dirs]
        try:
            with _quiet_hub_logs():
                api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True)
                refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
                heads = {b.name: b.target_commit for b in refs.branches}
                new_branch = branch not in heads
                if new_branch:
                    api.create_branch(repo_id, branch=branch, repo_type=REPO_TYPE, exist_ok=True)
                    heads = {b.name: b.target_commit
                             for b in api.list_repo_refs(repo_id, repo_type=REPO_TYPE).branches}
                parent = heads.get(branch)
                remote = api.list_repo_files(repo_id, revision=parent or branch, repo_type=REPO_TYPE)
                unsigning = [v for v in variant_names if signing_key is None and not new_branch
                             and f"build/{v}/metadata.json.sigstore" in remote]
                if unsigning:
                    print(f"winattn publish: warning: {branch} holds {', '.join(unsigning)} signed; this publish "
                          "replaces them unsigned, and loads that require a signature will refuse them (pass "
                          "--signing-key to sign)", file=sys.stderr)
                for path in _stale_files(remote, uploads, variant_names, new_branch):
                    operations.append(CommitOperationDelete(path_in_repo=path))
                say(f"uploading to {repo_id} {branch} at {api.endpoint} ...")
                info = api.create_commit(
                    repo_id,
                    operations,
                    commit_message=commit_message or
                    f"Publish {config.name} v{config.version}: {', '.join(variant_names)}",
                    commit_description="Uploaded with `winattn publish`.",
                    repo_type=REPO_TYPE,
                    revision=branch,
                    parent_commit=parent,
                )
                newer = sorted(int(b[1:]) for b in heads
                               if b[:1] == "v" and b[1:].isdigit() and int(b[1:]) > config.version)
                if newer:  # a fix to an older major must not turn the card back to it
                    card_state = f"left as is: v{newer[-1]} is newer than v{config.version}"
                else:
                    main_files = api.list_repo_files(repo_id, revision="main", repo_type=REPO_TYPE)
                    main_operations += [CommitOperationDelete(path_in_repo=path) for path in main_files
                                        if _is_benchmark_file(path) and path not in benchmarks]
                    card_info = api.create_commit(
                        repo_id,
                        main_operations,
                        commit_message=f"Card and benchmarks for {config.name} v{config.version}",
                        repo_type=REPO_TYPE,
                        revision="main",
                    )
                    card_state = "updated" if card_info.oid != heads.get("main") else "unchanged"
        except hub_call_errors() as e:
            raise PublishError(f"upload to {repo_id} at {api.endpoint} failed: {describe_hub_error(e)}") from None
        except OfflineModeIsEnabled:
            raise PublishError(f"cannot publish to {repo_id} at {api.endpoint} in offline mode (HF_HUB_OFFLINE is "
                               "set); unset HF_HUB_OFFLINE") from None
    if newer:
        print(f"winattn publish: main's card {card_state}", file=sys.stderr)
    return PublishResult(
        repo_id=repo_id, branch=branch, commit=info.oid, commit_url=info.commit_url, changed=info.oid != parent,
        variants=tuple(variant_names), signer=signer, card=card_state, endpoint=api.endpoint,
    )


def generate_keys(args) -> int:
    from .signing import generate_keypair, public_key_fingerprint

    for path in (args.private_key, args.public_key):
        if path.exists() and not args.force:
            raise PublishError(f"{path} exists (pass --force to overwrite)")
    generate_keypair(args.private_key, args.public_key)
    fingerprint = public_key_fingerprint(args.public_key)
    print(f"private key: {args.private_key}\npublic key:  {args.public_key} (sha256:{fingerprint})")
    return 0


def _run(args) -> int:
    from .cli_args import resolved_repo_id

    repo_root = args.repo_root if args.repo_root is not None else find_repo_root()
    build_dir = args.build_dir if args.build_dir is not None else repo_root / "build"
    result = publish_report(
        resolved_repo_id(args),
        build_dir=build_dir,
        endpoint=args.endpoint,
        token=args.token,
        private=args.private,
        signing_key=args.signing_key,
        repo_root=repo_root,
        commit_message=args.commit_message,
        progress=lambda line: print(f"winattn publish: {line}", file=sys.stderr, flush=True),
    )
    print(result.summary())
    return 0


class _VersionFromBuildToml(argparse.Action):
    """`winattn publish --version N` / `--revision R`: a usage error that says where the version comes from (without
    it, argparse took N for the REPO_ID and reported "'2' is not a Hub repo id")."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not an option of publish: it uploads to branch v<version> with the version "
                     "build.toml names ([general] version); change it there to publish another major version")


def register(subparsers) -> None:
    from .cli_args import add_hub_args, add_repo_id

    p = subparsers.add_parser(
        "publish",
        help="check, sign and upload the built variants to a Hub kernel repository",
        description=(
            "Check every variant in the build directory (layout, digest, abi3), sign it with --signing-key, and "
            "upload all of them to branch v<version> (version from build.toml) in one commit; the filled CARD.md "
            "becomes README.md on main, with benchmarks/. Prints a summary: variants, signing key, commit URL. "
            "Works from any directory inside the kernel repository."
        ),
    )
    add_repo_id(p, legacy_flag=True)
    for flag in ("--version", "--revision"):  # said plainly, not misread as REPO_ID
        p.add_argument(flag, action=_VersionFromBuildToml, nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--signing-key", type=Path, metavar="KEY",
                   help="EC P-256 private key (PEM, from `winattn keygen`) to sign every variant with; without it "
                        "the variants are uploaded unsigned, and a signature already in the build directory is "
                        "refused")
    p.add_argument("--commit-message", default=None, metavar="TEXT",
                   help="title of the commit on v<version> (default: Publish <name> v<version>: <variants>)")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--build-dir", type=Path, default=None, metavar="DIR",
                   help="directory holding the <variant>/ directories (default: build/ of the repository)")
    p.add_argument("--repo-root", type=Path, default=None, metavar="DIR",
                   help="kernel repository holding build.toml (default: the nearest one at or above the current "
                        "directory)")
    add_hub_args(p, write=True)
    p.set_defaults(func=_run)

    k = subparsers.add_parser(
        "keygen",
        help="create an EC P-256 key pair for `winattn publish --signing-key`",
        description="Write a PEM private key (mode 0600) and its public key, and print the public key's "
                    "fingerprint. Keep the private key; give the public key to whoever loads the kernel "
                    "(`winattn.load(public_keys=[...])`, `winattn verify --public-key`).",
    )
    k.add_argument("private_key", type=Path, metavar="PRIVATE_KEY",
                   help="where to write the private key, e.g. signing-key.pem")
    k.add_argument("public_key", type=Path, metavar="PUBLIC_KEY",
                   help="where to write the public key, e.g. signing-key.pub.pem")
    k.add_argument("--force", action="store_true", help="overwrite existing files")
    k.set_defaults(func=generate_keys)
