// sm_90a window-mode forward kernels for head dim 32, key blocks 64 (Swin W7 / W8) and 128, 160, 256 (wide windows:
// Swin W9-W16), fp16 and bf16; compiled for 9.0a only (build.toml window_attention_sm90).
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 64)
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 128)
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 160)
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 256)
}  // namespace cuda
}  // namespace winattn
