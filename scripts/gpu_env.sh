# Sourced by gpu_check.sh, gpu_profile.sh and gpu_ab.sh: repo root as the working directory, the results folder, the Python
# packages the GPU image lacks (they travel as wheels in .whl/, made by scripts/device_prepare.sh) and the
# variant to run (WINATTN_VARIANT_DIR, default the stable-ABI cu130 build).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1
results=${RESULTS_DIR:-results}
mkdir -p "$results"
wheels=${WHL:-.whl}  # (WHL=.whlmin: kernels and kernel-abi-check, for calls that carry much else; scripts/device_prepare.sh)
if [ -d "$wheels" ] && ! python3 -c "import kernels" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheels"/*.whl && \
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH="$root:${PYTHONPATH:-}"
variant=${WINATTN_VARIANT_DIR:-build/torch-stable-abi210-cu130-x86_64-linux}
