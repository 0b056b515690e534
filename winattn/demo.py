"""`winattn demo`: the main job end to end on this machine.

build → start the embedded Hub (temp root, free port) → publish (signed) → load through `kernels.get_kernel(...,
version=1)` in one fresh process and through the verifying `winattn.load` in another → run both on a sample with a bias
and a mask → print a short report. Exits non-zero on any failure.

The loads run in child processes so that `huggingface_hub`/`kernels` read HF_ENDPOINT and the cache location at
import, exactly as a user's program would; in two of them because `winattn.load` never hands back a module another
loader imported (its bytes were not verified by winattn), and torch cannot register one op namespace twice.
"""

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ID = "winattn/window-attention"


def _repo_root() -> Path:
    here = Path.cwd()
    for d in (here, *here.parents):
        if (d / "build.toml").is_file() and (d / "torch-ext").is_dir():
            return d
    raise SystemExit("winattn demo: run it from the window-attention repository (no build.toml found)")


def _publish_and_serve(root: Path, work: Path) -> int:
    from .build import build_variant
    from .hub import HubServer
    from .publish import publish
    from .signing import generate_keypair

    t0 = time.perf_counter()
    variant = build_variant(root, backend="cpu", build_dir=root / "build")
    print(f"[demo] built {variant.name} in {time.perf_counter() - t0:.1f} s")

    private_key, public_key = work / "signing-key.pem", work / "signing-key.pub.pem"
    generate_keypair(private_key, public_key)
    token = secrets.token_hex(16)
    with HubServer(work / "hub", tokens=[token], trusted_orgs=["winattn"]) as hub:
        print(f"[demo] embedded Hub at {hub.url} (root {work / 'hub'})")
        commit = publish(
            REPO_ID, build_dir=root / "build", endpoint=hub.url, token=token, signing_key=private_key, repo_root=root
        )
        print(f"[demo] published {REPO_ID} v1 at commit {commit} (signed)")
        env = dict(
            os.environ,
            HF_ENDPOINT=hub.url,
            HF_HOME=str(work / "hf-home"),
            PYTHONUNBUFFERED="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",  # the report follows; a download bar would only interleave with it
        )
        # kernels 0.17.2 builds an invalid User-Agent when telemetry is disabled, so leave that variable unset.
        for name in ("HF_HUB_OFFLINE", "LOCAL_KERNELS", "HF_HUB_DISABLE_TELEMETRY", "HF_TOKEN"):
            env.pop(name, None)
        r = subprocess.run([sys.executable, "-m", "winattn.demo", "--kernels-client"], env=env, cwd=root,
                           stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(f"[demo] kernels.get_kernel failed (exit {r.returncode})", file=sys.stderr)
            return 1
        via_kernels = r.stdout.strip().splitlines()[-1]  # its JSON line
        args = [sys.executable, "-m", "winattn.demo", "--client", str(public_key), commit, via_kernels]
        return subprocess.run(args, env=env, cwd=root).returncode


def _inputs():
    """The sample both loads run on (same seed in both processes) and its float64 reference, with the shape."""
    import torch

    torch.manual_seed(0)
    B, S, H, D = 2, 256, 4, 64
    q, k, v = (torch.randn(B, S, H, D) for _ in range(3))
    bias = torch.randn(1, H, S, S) * 0.5
    mask = torch.rand(B, 1, S, S) > 0.1
    return (q, k, v, bias, mask), f"B={B} S={S} H={H} D={D}"


def _max_err(module, q, k, v, bias, mask) -> float:
    ref64 = module.reference.attention(q.double(), k.double(), v.double(), bias=bias.double(), mask=mask)
    return (module.attention(q, k, v, bias=bias, mask=mask).double() - ref64).abs().max().item()


def _kernels_client() -> int:
    """Runs in the first child process: `kernels.get_kernel`, run once; prints its load time and error as JSON."""
    import kernels

    (q, k, v, bias, mask), _ = _inputs()
    t0 = time.perf_counter()
    module = kernels.get_kernel(REPO_ID, version=1)
    load_s = time.perf_counter() - t0
    print(json.dumps({"load_s": load_s, "err": _max_err(module, q, k, v, bias, mask)}))
    return 0


def _client(public_key: Path, expected_commit: str, via_kernels: dict) -> int:
    """Runs in the second child process: the verified load, run, compare, time, report (with the first child's
    `kernels.get_kernel` numbers)."""
    import torch

    import winattn

    (q, k, v, bias, mask), shape = _inputs()
    B, S, H, D = q.shape
    t_kernels = via_kernels["load_s"]
    t0 = time.perf_counter()
    via_winattn = winattn.load(REPO_ID, version=1, public_keys=[public_key], require_signature=True)
    t_winattn = time.perf_counter() - t0
    info = via_winattn.__winattn_info__
    rows = [("kernels.get_kernel", via_kernels["err"]), ("winattn.load", _max_err(via_winattn, q, k, v, bias, mask))]

    def composite():
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * D**-0.5 + bias
        s = s.masked_fill(~mask, float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)

    def timed(fn, n=10):
        fn()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2] * 1e3

    t_kernel = timed(lambda: via_winattn.attention(q, k, v, bias=bias, mask=mask))
    t_composite = timed(composite)

    ok = all(err < 1e-4 for _, err in rows) and info.commit == expected_commit and info.source == "hub"
    print("\n".join(report_lines(info, expected_commit, rows, t_kernels, t_winattn, t_kernel, t_composite, ok,
                                  shape=shape)))
    return 0 if ok else 1


def report_lines(info, expected_commit: str, rows, t_kernels: float, t_winattn: float, t_kernel: float,
                 t_composite: float, ok: bool, *, shape: str) -> list:
    """The demo's report: each line labelled, the commit named once (the "published" line above has it in full)."""
    if info.commit == expected_commit:
        commit = f"commit {info.commit[:12]}, the one just published"
    else:
        commit = f"commit {info.commit} (MISMATCH: published {expected_commit})"
    lines = ["", "window-attention demo report",
             f"  repo         {REPO_ID} v1 -> {commit}",
             f"  variant      {info.variant} (trust: {info.trust}; signer: {info.signer})"]
    lines += [f"  check        {c.name:<14} {c.status:<5} {c.detail}" for c in info.checks]
    lines += [f"  rejected     {variant}: {reason}" for variant, reason in info.rejected]
    lines.append(f"  load time    kernels.get_kernel {t_kernels * 1e3:.0f} ms, winattn.load (verified) "
                 f"{t_winattn * 1e3:.0f} ms")
    lines += [f"  max |err|    {name:<20} {err:.2e} vs float64 reference ({shape}, bias + mask)" for name, err in rows]
    lines.append(f"  forward      kernel {t_kernel:.2f} ms vs PyTorch composite {t_composite:.2f} ms "
                 f"({t_composite / t_kernel:.2f}x)")
    lines.append(f"  result       {'OK' if ok else 'FAILED'}")
    lines.append("  json         " + json.dumps({"errors": dict(rows), "kernel_ms": t_kernel,
                                                  "composite_ms": t_composite}))
    return lines


def run(args) -> int:
    root = _repo_root()
    with tempfile.TemporaryDirectory(prefix="winattn-demo-") as tmp:
        return _publish_and_serve(root, Path(tmp))


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="build, publish to an embedded Hub, load verified, run, report")
    p.set_defaults(func=run)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--kernels-client":
        sys.exit(_kernels_client())
    if len(sys.argv) == 5 and sys.argv[1] == "--client":
        sys.exit(_client(Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])))
    sys.exit(run(None))
