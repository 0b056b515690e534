// sm_90a backward v3 (pipelined, warp-specialized) for head dim 128 (fp16 and bf16); compiled for 9.0a only.
#include "../sm90/launch_bwd_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_BWD_PIPELINED_SM90(128)
}  // namespace cuda
}  // namespace winattn
