// bwd kernels for head dim 128 (fp16 and bf16). One translation unit per (head dim, direction).
#include "../launch_template.h"

namespace winattn {
namespace cuda {
template void run_bwd<128>(const KParams&, int, int64_t, int, int, cudaStream_t);
template int bwd_blocks_per_sm<128>(int, int, int);
}  // namespace cuda
}  // namespace winattn
