// sm_90a window-mode forward kernels for head dim 64 (key block 64), fp16 and bf16; compiled for 9.0a only
// (build.toml window_attention_sm90).
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(64, 64)
}  // namespace cuda
}  // namespace winattn
