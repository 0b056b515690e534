#!/usr/bin/env bash
# Build CUDA 9.0 variants of several revisions here, for scripts/gpu_variants.sh to time on the device without
# building there. Run it in a worktree of its own (it checks the revisions out, detached, one after the other):
#   git worktree add --detach ../exp main && cd ../exp && scripts/build_variants.sh v49=main lazy=fwd-lazy-rescale
# Each NAME=REV is checked out, built (`winattn build --unique-id NAME`) and packed as $ABV_DIR/NAME.tar.xz
# (default: .abv in this tree; copy them to the checkout the device call runs from). The first takes ~6 minutes on
# 2 cores (354-364 s in the twenty-seventh and twenty-eighth sessions); the next ones recompile only the units whose
# sources changed (ninja, one object folder: kernel units do not depend on the unique id): ~1 minute for a backward
# change, ~6 for one in a header every forward unit includes.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
[ -z "$(git status --porcelain --untracked-files=no)" ] \
  || { echo "the tree has changes: run this in a worktree of its own"; exit 1; }
abv=${ABV_DIR:-.abv}; mkdir -p "$abv"
py=${PYTHON:-.venv/bin/python}; [ -x "$py" ] || py=python3
V=torch-stable-abi210-cu130-x86_64-linux
for spec in "$@"; do
  name=${spec%%=*}; rev=${spec#*=}
  git checkout -q --detach "$rev"
  echo "== $name = $(git log --oneline -1)"
  "$py" -m winattn build --backend cuda --cuda-archs 9.0 --unique-id "$name" > "/tmp/build_$name.log" 2>&1 \
    || { tail -30 "/tmp/build_$name.log"; exit 1; }
  tar cJf "$abv/$name.tar.xz" build/$V
  ls -la "$abv/$name.tar.xz"
done
