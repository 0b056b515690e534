// Entry points of the Hopper backward v3 (bwd_pipelined_sm90.h) for the planner in winattn_cuda.cu; defined in
// launch_bwd_sm90.h, instantiated per head dim in instantiations/bwd_v3_sm90_hdim*.cu (sm_90a only). Kept out of
// launch.h so the portable kernels' translation units do not depend on it.
#pragma once
#include <cuda_runtime.h>

#include "../kernel_params.h"

namespace winattn {
namespace cuda {

// How dS leaves as dbias: an fp32 store (one contributor per element, dbias float32), an fp32 reduce-add (elements
// shared by several (batch, head)), or a store in the input dtype (one writer per element and a bias of the input
// dtype: the caller allocates dbias in that dtype and skips the zero-fill and the conversion; bwd_dbias_layout).
// kDbiasAtomic: dbias broadcast over rows and / or columns, or rows that TMA cannot address (Sk % 4 != 0): dS summed
// over the broadcast dims in registers and shuffles, then fp32 atomics (deterministic=True keeps these on v1).
enum BwdDbias : int { kDbiasNone = 0, kDbiasStore = 1, kDbiasReduce = 2, kDbiasStore16 = 3, kDbiasAtomic = 4 };

// How the kernel reads the score terms: none (key padding and bands only), the additive term staged by TMA with Q /
// dO (16-bit input dtype, full rows and columns, 16-byte aligned rows), or the additive term and the bool mask read
// from global memory per element (any dtype, broadcast, stride; the path for everything TMA cannot stage).
enum BwdTerms : int { kBwdTermsNone = 0, kBwdTermsStaged = 1, kBwdTermsGlobal = 2 };

// The workspace buffers and dbias plan of one v3 backward call (planned by plan_bwd_v3).
struct BwdV3Buffers {
  float* lse2 = nullptr;    // [B, H, sq_pad] lse * log2(e), written by the preprocess
  float* delta = nullptr;   // [B, H, sq_pad] rowsum(dO * O) - dlse, written by the preprocess
  float* dq_acc = nullptr;  // [B, H, sq_pad / 64, 64 * D] fp32 fragment order, zero-filled
  int* dq_sems = nullptr;   // deterministic only: [B, H, sq_pad / 64], zero-filled
  int sq_pad = 0;
  void* dbias = nullptr;    // [period, heads, Sq, Sk]: fp32 zero-filled by the caller, or the input dtype (Store16)
  int dbias_period = 1, dbias_heads = 1;  // the user bias's broadcast (the kernel's term may be the combined one)
  int dbias_rows = 1, dbias_cols = 1;     // Sq / Sk, or 1 where broadcast (kDbiasAtomic)
  int dbias_mode = kDbiasNone;
  int dbias_bufs = 1;  // staging tiles (two where they fit)
  bool pair = false;   // pair mode (bwd_pipelined_sm90.h): one CTA owns the two batches that share a dbias tile
};

constexpr int kBwdV3BlockM = 64;  // query rows per pipeline stage (BwdPipeTraitsSm90::kBlockM)

// The v3 kernel's head dim for a call's D. The kernels are 64, 128 (dK / dV of 64 keys x D in each consumer's
// registers) and 256 (split by head-dim halves across the consumers, bwd_split_d_sm90.h); the head dims between
// run on the next one up with TMA's zero fill as padding (up to 2x the tensor-core work at D = 32, still ahead of
// the portable v1.1 kernel's occupancy-bound mma.sync loop).
inline int bwd_v3_head_dim(int D) { return D <= 64 ? 64 : D <= 128 ? 128 : 256; }

// Whether this binary holds the sm_90a kernel for head dim D (cudaFuncGetAttributes; false clears the error).
template <int D>
bool bwd_pipelined_sm90_ready(int dtype);
// Settles the dbias plan (buf.dbias_mode arrives as kDbiasStore for one contributor per element or kDbiasReduce;
// pair mode and the 16-bit store are chosen here, the latter only if `dbias16_ok`) and returns the call's dynamic
// shared memory, or 0 when it does not fit (then the planner uses v1).
template <int D>
int bwd_pipelined_sm90_configure(const KParams& p, int dtype, bool dbias16_ok, BwdV3Buffers& buf, int smem_optin);
template <int D>
void run_bwd_pipelined_sm90(const KParams& p, const BwdV3Buffers& buf, int dtype, int smem_optin,
                            cudaStream_t stream);

}  // namespace cuda
}  // namespace winattn
