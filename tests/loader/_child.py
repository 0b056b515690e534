"""Child process of the loader tests (see conftest.run_child): reads a JSON list of cases on stdin, runs each load
in this fresh interpreter, and prints one JSON line with the outcome and the import evidence after each case.

A case: {"name": str, "call": "winattn" | "kernels", "kwargs": {...}, "run_attention": bool}; the first case may
carry "wait_for": a file to wait for before loading (to start several children at the same moment).
"""

import json
import logging
import os
import sys
import traceback

NAMESPACE_PREFIX = "_window_attention_"


def evidence() -> dict:
    """What of the kernel is in this process: modules, registered ops, mapped shared objects, kernels' registry."""
    import torch
    from kernels import importer

    modules = sorted(m for m in sys.modules if m.startswith(NAMESPACE_PREFIX))
    ops = sorted(op for op in torch._C._dispatch_get_all_op_names() if op.startswith(NAMESPACE_PREFIX))
    # Shared objects mapped from the kernel's name or from anywhere under the test's root (HF cache snapshots are
    # symlinks, so a loaded .so shows up as its blob: <cache>/blobs/<sha256>).
    root = os.path.dirname(os.environ.get("HF_HOME", "/nonexistent"))
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[-1].strip() for line in f if len(line.split(None, 5)) == 6}
    mapped = sorted(p for p in paths if NAMESPACE_PREFIX in p or p.startswith(root + os.sep))
    loaded = sorted(str(p) for p in importer._loaded_kernels)
    return {"modules": modules, "ops": ops, "mapped": mapped, "kernels_loaded": loaded}


def run_case(case: dict) -> dict:
    out = {"name": case.get("name"), "ok": False}
    try:
        if case.get("call") == "kernels":
            import kernels

            module = kernels.get_kernel(**case["kwargs"])
        else:
            import winattn

            module = winattn.load(**case["kwargs"])
        out["ok"] = True
        info = getattr(module, "__winattn_info__", None)
        if info is not None:
            out["info"] = {"commit": info.commit, "variant": info.variant, "source": info.source,
                           "checks": [list(c) + [c.status] for c in info.checks], "trust": info.trust,
                           "reused_from": info.reused_from}
        if case.get("run_attention"):
            import torch

            q, k, v = (torch.randn(2, 24, 4, 32) for _ in range(3))
            out["attention_err"] = (module.attention(q, k, v, causal=True)
                                    - module.reference.attention(q, k, v, causal=True)).abs().max().item()
            out["module_file"] = module.__file__
    except BaseException as e:  # report everything, including SystemExit from a crashing import
        out["error_type"] = type(e).__name__
        out["error_mro"] = [c.__name__ for c in type(e).__mro__]
        out["error"] = str(e)
        out["checks"] = [list(c) + [getattr(c, "status", None)] for c in getattr(e, "checks", [])]
        out["traceback"] = traceback.format_exc()
    out["evidence"] = evidence()
    return out


def _start_together(go_file: str) -> None:
    """Signal readiness (`<go_file>.ready.<pid>`) once the heavy imports are done, then wait for `go_file`."""
    import time

    import kernels  # noqa: F401
    import torch  # noqa: F401

    import winattn  # noqa: F401

    open(f"{go_file}.ready.{os.getpid()}", "w").close()
    deadline = time.time() + 60
    while not os.path.exists(go_file) and time.time() < deadline:
        time.sleep(0.01)


def spawn_worker(case: dict, barrier, results) -> None:
    """`multiprocessing` (spawn) entry point: import everything, wait for the others at `barrier`, load, report."""
    import kernels  # noqa: F401
    import torch  # noqa: F401

    import winattn  # noqa: F401

    barrier.wait(timeout=120)
    results.put(run_case(case))


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    cases = json.loads(sys.stdin.read())
    if cases and cases[0].get("wait_for"):
        _start_together(cases[0]["wait_for"])
    results = [run_case(case) for case in cases]
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
