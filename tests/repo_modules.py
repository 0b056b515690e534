"""A repository script (scripts/, benchmarks/) loaded as a module from its file, for the tests of its pure parts: the
scripts are run as files, not installed, and some import their neighbours (kernel_time imports bench_shapes), so
their folder goes on sys.path; the module is registered under its name, where dataclasses look it up."""

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_repo_module(relpath: str):
    path = REPO_ROOT / relpath
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
