"""Internals of `winattn build` (public entry: `winattn.build`, the CLI on top of these). Imports only go down:

config         build.toml -> BuildConfig (kernels' own parser validates, tomllib/tomlkit read the other fields)
toolchain      compilers, torch/Python/CUDA paths, variant name parts, unique id and git provenance
compile        registration.h, build.ninja and the ninja run (incremental)
layout         the variant directory: Python files, _ops.py, the .so, metadata.json (digest, provenance), ABI checks
variant_build  one variant: compile, check, lay out (`build`, `build_variant`, `variant_name_for`)
matrix         every variant this machine can make, each through `variant_build.build`
"""
