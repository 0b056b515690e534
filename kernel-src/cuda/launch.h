// Launch templates: one explicit instantiation per (head dim, direction) lives in instantiations/*.cu so the
// heavy kernels compile in parallel; the dispatch (winattn_cuda.cu) only sees these declarations.
#pragma once
#include <cuda_runtime.h>

#include "kernel_params.h"

namespace winattn {
namespace cuda {

// dtype: 0 fp16, 1 bf16. `grid` CTAs (already planned by the dispatch), `smem` dynamic shared bytes, `cfg` the
// backward configuration BwdTraits<D, cfg> (kernel_traits.h; 0 = default).
template <int D>
void run_fwd(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream);
template <int D>
void run_bwd(const KParams& p, int dtype, int64_t grid, int smem, int cfg, cudaStream_t stream);

// Resident CTAs per SM for the kernel at this dynamic shared memory size (registers and smem both count).
template <int D>
int fwd_blocks_per_sm(int dtype, int smem);
template <int D>
int bwd_blocks_per_sm(int dtype, int smem, int cfg);

// Hopper forward v3 (sm90/fwd_pipelined_sm90.h, TMA + warp specialization), every head dim of kernel_head_dim():
// `terms` / `tile` (sm90::V3Tile) / `persistent` / `kv_resident` / `stage_bytes` as kernel_choice.h's FwdChoice says;
// `tile_counter`: the dynamic schedule's zeroed int in the workspace (FwdChoice::v3_dynamic), else nullptr.
// fwd_pipelined_sm90_ready: whether this binary holds sm_90a code (built with 9.0a) on this device, i.e. whether any
// sm90 kernel can run.
template <int D>
bool fwd_pipelined_sm90_ready(int dtype);
template <int D>
void run_fwd_pipelined_sm90(const KParams& p, int dtype, int terms, int tile, bool persistent, bool kv_resident,
                            int* tile_counter, int stage_bytes, int sms, cudaStream_t stream);
// Window mode on Hopper (sm90/fwd_windows_sm90.h): head dim 32 with key blocks 64, 128, 160, 256; head dim 64 with 64.
template <int D, int BN>
int fwd_windows_sm90_blocks_per_sm(int dtype, int smem, const KParams& p);  // (p: the instance it runs)
template <int D, int BN>
void run_fwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream);
// Window-mode backward on Hopper (sm90/bwd_windows_sm90.h), head dim 32 (its own translation unit).
template <int D>
int bwd_windows_sm90_blocks_per_sm(int dtype, int smem);
template <int D>
void run_bwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream);

// Wide-window backward on Hopper (sm90/bwd_windows_wide_sm90.h), head dim 32, windows of up to N = 128 / 144 / 256
// tokens: lse2 holds the v3 preprocess rows ([B, H, sq_pad = N]); `grid` counts work items (N = 256: a cluster of
// four CTAs each).
template <int N>
int bwd_windows_wide_sm90_cluster_slots(int dtype);  // resident CTAs in whole clusters (split instance), else 0
template <int N>
void run_bwd_windows_wide_sm90(const KParams& p, const float* lse2, int sq_pad, int dtype, int64_t grid,
                               cudaStream_t stream);

// Split-KV decode forward (fwd_decode.h), every architecture: H / Hkv x Sq <= 16 query rows per CTA, the keys in
// `splits` chunks of `chunk`; with splits > 1 the partial rows go through o_part / lse_part (workspace,
// kernel_choice.h's FwdChoice says how large) and a combine step.
void run_fwd_decode(const KParams& p, int dtype, int dk, int splits, int chunk, float* o_part,
                    float* lse_part, cudaStream_t stream);
// The same call on Hopper with K / V loaded by TMA (sm90/fwd_decode_sm90.h; the table's there): the same
// split contract (chunk a multiple of 64 keys) and workspace, sm_90a only. run_decode_combine: the combine step of
// both (splits > 1), in fwd_decode.cu.
void run_fwd_decode_tma(const KParams& p, int dtype, int dk, int splits, int chunk, float* o_part,
                        float* lse_part, cudaStream_t stream);
void run_decode_combine(const KParams& p, int dtype, int splits, float* o_part, float* lse_part,
                        cudaStream_t stream);

void check_cuda(cudaError_t err, const char* what);

}  // namespace cuda
}  // namespace winattn
