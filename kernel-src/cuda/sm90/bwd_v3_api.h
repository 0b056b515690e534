// Entry points of the Hopper backward v3 (bwd_pipelined_sm90.h) for the planner in winattn_cuda.cu; defined in
// launch_bwd_sm90.h, instantiated per head dim in instantiations/bwd_v3_sm90_hdim*.cu (sm_90a only). Kept out of
// launch.h so the portable kernels' translation units do not depend on it.
#pragma once
#include <cuda_runtime.h>

#include "../kernel_modes.h"
#include "../kernel_params.h"

namespace winattn {
namespace cuda {

// The plan's types (BwdV3Buffers, the dbias and term modes, kBwdV3BlockM, bwd_v3_head_dim): kernel_modes.h.

template <int D>
void run_bwd_pipelined_sm90(const KParams& p, const BwdV3Buffers& buf, int dtype, cudaStream_t stream);

}  // namespace cuda
}  // namespace winattn
