// sm_90a window-mode backward kernels for head dim 32 (fp16 and bf16); compiled for 9.0a only (build.toml
// window_attention_sm90).
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_BWD_WINDOWS_SM90(32)
}  // namespace cuda
}  // namespace winattn
