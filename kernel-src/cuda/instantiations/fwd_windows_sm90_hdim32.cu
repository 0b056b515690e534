// sm_90a window-mode forward kernels for head dim 32 and wide windows (key blocks 128, 160, 256: Swin W9-W16), fp16
// and bf16; compiled for 9.0a only (build.toml window_attention_sm90). Key block 64 is in fwd_sm90_hdim32.cu.
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 128)
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 160)
WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(32, 256)
}  // namespace cuda
}  // namespace winattn
