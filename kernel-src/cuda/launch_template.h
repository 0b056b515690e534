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

template <int D>
void run_fwd(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using Tr = FwdTraits<D>;
  if (dtype == 0)
    launch_kernel(fwd_kernel<Tr, __half>, grid, Tr::kNThreads, smem, stream, p, "window_attention fwd");
  else
    launch_kernel(fwd_kernel<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p, "window_attention fwd");
}

template <int D>
void run_bwd(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using Tr = BwdTraits<D>;
  if (dtype == 0)
    launch_kernel(bwd_kernel<Tr, __half>, grid, Tr::kNThreads, smem, stream, p, "window_attention bwd");
  else
    launch_kernel(bwd_kernel<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p, "window_attention bwd");
}

}  // namespace cuda
}  // namespace winattn
