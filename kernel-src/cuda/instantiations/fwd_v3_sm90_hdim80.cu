// sm_90a forward v3 (pipelined, warp-specialized) for head dim 80 (fp16 and bf16): 96's tiles with GEMMs over 80
// columns (kernel_traits_sm90.h kTileCols), the table's for head dims 65-80; compiled for 9.0a only.
#include "../sm90/launch_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_FWD_PIPELINED_SM90(80)
}  // namespace cuda
}  // namespace winattn
