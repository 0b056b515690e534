// sm_90a forward v3 (pipelined, warp-specialized) for head dim 48 (fp16 and bf16): 16-column blocks with the 32-byte
// swizzle, so that head dims 33-48 run without padding to 64 (the table's choice there since v4.3); compiled for
// 9.0a only.
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_FWD_PIPELINED_SM90(48)
}  // namespace cuda
}  // namespace winattn
