// sm_90a forward v3 (pipelined, warp-specialized) for head dim 192 (fp16 and bf16); compiled for 9.0a only.
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_FWD_PIPELINED_SM90(192)
}  // namespace cuda
}  // namespace winattn
