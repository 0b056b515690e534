"""Internals of `winattn build` (public entry: `winattn.build`).

config     build.toml -> BuildConfig (kernels' own parser validates, tomllib reads the fields it does not expose)
toolchain  compilers, torch/Python/CUDA paths, variant name, unique id and git provenance
compile    registration.h, build.ninja and the ninja run (incremental)
layout     the variant directory: Python files, _ops.py, the .so, metadata.json (digest, provenance), ABI checks
"""
