// sm_90a backward v3 for head dim 256 (the split head-dim consumer, bwd_split_d_sm90.h; fp16 and bf16); compiled
// for 9.0a only. Head dims 136..256 run on it.
#include "../sm90/launch_bwd_sm90.h"

namespace winattn {
namespace cuda {
WINATTN_INSTANTIATE_BWD_PIPELINED_SM90(256)
}  // namespace cuda
}  // namespace winattn
