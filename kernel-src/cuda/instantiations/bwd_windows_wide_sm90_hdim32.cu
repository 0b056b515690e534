// sm_90a wide-window backward kernels for head dim 32 (windows of up to 128, 144 and 256 tokens: Swin W9-W16), fp16
// and bf16; compiled for 9.0a only (build.toml window_attention_sm90).
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_BWD_WINDOWS_WIDE_SM90(128)
WINATTN_INSTANTIATE_BWD_WINDOWS_WIDE_SM90(144)
WINATTN_INSTANTIATE_BWD_WINDOWS_WIDE_SM90(256)
}  // namespace cuda
}  // namespace winattn
