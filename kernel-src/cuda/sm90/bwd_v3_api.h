// Entry points of the Hopper backward v3 (bwd_pipelined_sm90.h) for the planner in winattn_cuda.cu; defined in
// launch_bwd_sm90.h, instantiated per head dim in instantiations/bwd_v3_sm90_hdim*.cu (sm_90a only). Kept out of
// launch.h so the portable kernels' translation units do not depend on it.
#pragma once
#include <cuda_runtime.h>

#include "../kernel_params.h"

namespace winattn {
namespace cuda {

// The workspace buffers of one v3 backward call (planned by plan_bwd).
struct BwdV3Buffers {
  float* lse2 = nullptr;    // [B, H, sq_pad] lse * log2(e), written by the preprocess
  float* delta = nullptr;   // [B, H, sq_pad] rowsum(dO * O) - dlse, written by the preprocess
  float* dq_acc = nullptr;  // [B, H, sq_pad / 64, 64 * D] fp32 fragment order, zero-filled
  int* dq_sems = nullptr;   // deterministic only: [B, H, sq_pad / 64], zero-filled
  int sq_pad = 0;
  float* dbias = nullptr;   // fp32 [period, heads, Sq, Sk] (zero-filled by the caller), or null
  int dbias_period = 1, dbias_heads = 1;  // the user bias's broadcast (the kernel's term may be the combined one)
  bool dbias_shared = false;  // an element of dbias has more than one (b, h) contributor: reduce-add, not store
};

constexpr int kBwdV3BlockM = 64;  // query rows per pipeline stage (BwdPipeTraitsSm90::kBlockM)

// Head dims with a v3 backward (its dK / dV accumulators of 64 keys x D live in registers).
inline bool has_bwd_v3(int dk) { return dk == 64 || dk == 128; }

// Whether this binary holds the sm_90a kernel for head dim D (cudaFuncGetAttributes; false clears the error).
template <int D>
bool bwd_pipelined_sm90_ready(int dtype);
// Dynamic shared memory of the call, or 0 when its additive term cannot be staged (then the planner uses v1).
template <int D>
int bwd_pipelined_sm90_smem(const KParams& p, int dtype, bool dbias, int smem_optin);
template <int D>
void run_bwd_pipelined_sm90(const KParams& p, const BwdV3Buffers& buf, int dtype, int smem_optin,
                            cudaStream_t stream);

}  // namespace cuda
}  // namespace winattn
