// Definitions behind launch.h, included only by the instantiation translation units.
#pragma once
#include "bwd_kernel.h"
#include "fwd_kernel.h"
#include "launch.h"

namespace winattn {
namespace cuda {

template <typename Kernel>
inline void launch_kernel(Kernel kernel, int64_t grid, int threads, int smem, cudaStream_t stream,
                          const KParams& p, const char* what) {
  if (grid <= 0) return;
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  kernel<<<dim3(static_cast<unsigned>(grid)), dim3(threads), smem, stream>>>(p);
  check_cuda(cudaGetLastError(), what);
}

template <typename Kernel>
inline int blocks_per_sm(Kernel kernel, int threads, int smem) {
  if (smem > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "occupancy");
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem), "occupancy");
  return n;
}

template <int D>
int fwd_blocks_per_sm(int dtype, int smem) {
  using Tr = FwdTraits<D>;
  return dtype == 0 ? blocks_per_sm(fwd_kernel<Tr, __half>, Tr::kNThreads, smem)
                    : blocks_per_sm(fwd_kernel<Tr, __nv_bfloat16>, Tr::kNThreads, smem);
}

// Calls f(BwdTraits<D, cfg>{}) for the run-time configuration cfg (out of range: the default, 0).
template <int D, int Cfg = 0, typename F>
inline void with_bwd_traits(int cfg, F&& f) {
  using Tr = BwdTraits<D, Cfg>;
  using Tr0 = BwdTraits<D, 0>;
  static_assert(Tr::kBlockM == Tr0::kBlockM && Tr::kBlockN == Tr0::kBlockN && Tr::kQStages == Tr0::kQStages &&
                    Tr::kKVStages == Tr0::kKVStages && Tr::kSmemBytes == Tr0::kSmemBytes && Tr::kLdAcc == Tr0::kLdAcc,
                "the planner assumes one tile geometry per head dim");
  if constexpr (Cfg + 1 < kBwdConfigs<D>) {
    if (cfg != Cfg) return with_bwd_traits<D, Cfg + 1>(cfg, f);
  }
  f(Tr{});
}

template <int D>
int bwd_blocks_per_sm(int dtype, int smem, int cfg) {
  int n = 0;
  with_bwd_traits<D>(cfg, [&](auto tr) {
    using Tr = decltype(tr);
    n = dtype == 0 ? blocks_per_sm(bwd_kernel<Tr, __half>, Tr::kNThreads, smem)
                   : blocks_per_sm(bwd_kernel<Tr, __nv_bfloat16>, Tr::kNThreads, smem);
  });
  return n;
}

template <int D>
void run_fwd(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using Tr = FwdTraits<D>;
  if (dtype == 0)
    launch_kernel(fwd_kernel<Tr, __half>, grid, Tr::kNThreads, smem, stream, p, "window_attention fwd");
  else
    launch_kernel(fwd_kernel<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p, "window_attention fwd");
}

template <int D>
void run_bwd(const KParams& p, int dtype, int64_t grid, int smem, int cfg, cudaStream_t stream) {
  with_bwd_traits<D>(cfg, [&](auto tr) {
    using Tr = decltype(tr);
    if (dtype == 0)
      launch_kernel(bwd_kernel<Tr, __half>, grid, Tr::kNThreads, smem, stream, p, "window_attention bwd");
    else
      launch_kernel(bwd_kernel<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p, "window_attention bwd");
  });
}

}  // namespace cuda
}  // namespace winattn
