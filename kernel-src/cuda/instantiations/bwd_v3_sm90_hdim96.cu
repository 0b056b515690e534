// sm_90a backward v3 (pipelined, warp-specialized) for head dim 96 (fp16 and bf16): 16-column blocks with the 32-byte
// swizzle, so that each warpgroup's dQ half is whole blocks and head dims 65-96 run without padding to 128 (forced
// only: bwd_v3_fine_dims); compiled for 9.0a only.
#include "../sm90/launch_bwd_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_BWD_PIPELINED_SM90(96)
}  // namespace cuda
}  // namespace winattn
