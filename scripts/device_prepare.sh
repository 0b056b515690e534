#!/usr/bin/env bash
# Stage here (on the development machine) what a session on the H200 device machine needs, in git-ignored folders
# of the repo root that a device call carries (the device has no network and torch 2.11's headers; a new checkout
# has none of these, so each session runs this once, ~1 minute plus `make setup`):
#   .whl/       the wheels the image lacks (kernels, diffusers, huggingface_hub 2.4 and its needs, timm 1.0.31, ...:
#               bench_models.py's docstring), ~17 MB
#   .whlmin/    kernels and kernel-abi-check (a build's ABI check needs it) and their needs (~3 MB), for calls that
#               carry much else (FA4's 40 MB half, two builds)
#   .torchinc/  torch 2.13's include/ (~3.4 MB), for WINATTN_TORCH_INCLUDE: a 9.0-only build there takes ~2 minutes
#   .base/      with BASE_REV: `git archive BASE_REV`, the baseline that scripts/gpu_ab.sh builds beside this tree
# Usage: scripts/device_prepare.sh [BASE_REV] [--fa4]   (--fa4 also runs ../shared/device/fa4_wheels.sh: .fa4/1, .fa4/2)
# Then, with the device tool (carry lists: .whl/.whlmin, .torchinc, .base, .ab, .abv): scripts/gpu_ab.sh, gpu_check.sh,
# gpu_variants.sh (variants built here).
# A build made here runs on the device as it is and spends no device time: `.venv/bin/python -m winattn build
# --backend cuda --cuda-archs 9.0` (~6 minutes on 2 cores; scripts/build_variants.sh builds several), `tar cJf .ab/new.tar.xz build/<variant>` (~2 MB), carried
# and unpacked there, WINATTN_VARIANT_DIR pointing at it (RESULTS v4.5: its last part was built so).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
base=""; fa4=0
for a in "$@"; do [ "$a" = --fa4 ] && fa4=1 || base=$a; done
for d in /.whl/ /.whlmin/ /.torchinc/ /.base/ /.ab/ /.abv/; do
  grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude
done
make -s setup
../shared/device/wheelhouse.sh kernel-abi-check==0.14.1 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 click==8.5.1 hf-xet==1.8.0 timm==1.0.31 >/dev/null
rm -rf .whlmin && mkdir -p .whlmin && cp .whl/kernels-* .whl/kernel_abi_check-* .whl/tomlkit-* .whl/importlib_metadata-* .whl/zipp-* .whlmin/
torch_dir=$(.venv/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))')
mkdir -p .torchinc && tar cJf .torchinc/include.tar.xz -C "$torch_dir" include
if [ -n "$base" ]; then
  mkdir -p .base && git archive "$base" | xz -T2 > .base/base.tar.xz && git rev-parse "$base" > .base/REV
fi
[ $fa4 = 1 ] && ../shared/device/fa4_wheels.sh
du -sh .whl .whlmin .torchinc ${base:+.base} 2>/dev/null
