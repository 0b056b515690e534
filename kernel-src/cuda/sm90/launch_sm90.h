// Definitions of the sm90 forward entry points declared in launch.h; included only by
// instantiations/fwd_sm90_hdim*.cu, which the build compiles for sm_90a alone (build.toml window_attention_sm90).
#pragma once
#include "../launch_template.h"
#include "fwd_kernel_sm90.h"
#include "fwd_windows_sm90.h"
#include "bwd_windows_sm90.h"

namespace winattn {
namespace cuda {

template <int D>
bool fwd_sm90_ready(int dtype) {
  using Tr = typename sm90::FwdTraitsSm90For<D>::type;
  cudaFuncAttributes attr{};
  const cudaError_t err = dtype == 0 ? cudaFuncGetAttributes(&attr, sm90::fwd_kernel_sm90<Tr, __half>)
                                     : cudaFuncGetAttributes(&attr, sm90::fwd_kernel_sm90<Tr, __nv_bfloat16>);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no image for this device: clear the error, use v1
    return false;
  }
  return attr.binaryVersion == 90;
}

template <int D>
int fwd_sm90_blocks_per_sm(int dtype, int smem) {
  using Tr = typename sm90::FwdTraitsSm90For<D>::type;
  return dtype == 0 ? blocks_per_sm(sm90::fwd_kernel_sm90<Tr, __half>, Tr::kNThreads, smem)
                    : blocks_per_sm(sm90::fwd_kernel_sm90<Tr, __nv_bfloat16>, Tr::kNThreads, smem);
}

template <int D>
void run_fwd_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using Tr = typename sm90::FwdTraitsSm90For<D>::type;
  if (dtype == 0)
    launch_kernel(sm90::fwd_kernel_sm90<Tr, __half>, grid, Tr::kNThreads, smem, stream, p,
                  "window_attention fwd (sm90)");
  else
    launch_kernel(sm90::fwd_kernel_sm90<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p,
                  "window_attention fwd (sm90)");
}

template <int D>
int fwd_windows_sm90_blocks_per_sm(int dtype, int smem) {
  using Tr = typename sm90::FwdWindowTraitsSm90For<D>::type;
  return dtype == 0 ? blocks_per_sm(sm90::fwd_windows_kernel_sm90<Tr, __half>, Tr::kNThreads, smem)
                    : blocks_per_sm(sm90::fwd_windows_kernel_sm90<Tr, __nv_bfloat16>, Tr::kNThreads, smem);
}

template <int D>
void run_fwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using Tr = typename sm90::FwdWindowTraitsSm90For<D>::type;
  if (dtype == 0)
    launch_kernel(sm90::fwd_windows_kernel_sm90<Tr, __half>, grid, Tr::kNThreads, smem, stream, p,
                  "window_attention fwd (sm90 windows)");
  else
    launch_kernel(sm90::fwd_windows_kernel_sm90<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p,
                  "window_attention fwd (sm90 windows)");
}

template <int D>
int bwd_windows_sm90_blocks_per_sm(int dtype, int smem) {
  using Tr = typename sm90::BwdWindowTraitsSm90For<D>::type;
  return dtype == 0 ? blocks_per_sm(sm90::bwd_windows_kernel_sm90<Tr, __half>, Tr::kNThreads, smem)
                    : blocks_per_sm(sm90::bwd_windows_kernel_sm90<Tr, __nv_bfloat16>, Tr::kNThreads, smem);
}

template <int D>
void run_bwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using Tr = typename sm90::BwdWindowTraitsSm90For<D>::type;
  if (dtype == 0)
    launch_kernel(sm90::bwd_windows_kernel_sm90<Tr, __half>, grid, Tr::kNThreads, smem, stream, p,
                  "window_attention bwd (sm90 windows)");
  else
    launch_kernel(sm90::bwd_windows_kernel_sm90<Tr, __nv_bfloat16>, grid, Tr::kNThreads, smem, stream, p,
                  "window_attention bwd (sm90 windows)");
}

#define WINATTN_INSTANTIATE_BWD_WINDOWS_SM90(D)                                                      \
  template int bwd_windows_sm90_blocks_per_sm<D>(int, int);                                          \
  template void run_bwd_windows_sm90<D>(const KParams&, int, int64_t, int, cudaStream_t);

#define WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(D)                                                      \
  template int fwd_windows_sm90_blocks_per_sm<D>(int, int);                                          \
  template void run_fwd_windows_sm90<D>(const KParams&, int, int64_t, int, cudaStream_t);

#define WINATTN_INSTANTIATE_FWD_SM90(D)                                                              \
  template bool fwd_sm90_ready<D>(int);                                                              \
  template int fwd_sm90_blocks_per_sm<D>(int, int);                                                  \
  template void run_fwd_sm90<D>(const KParams&, int, int64_t, int, cudaStream_t);

}  // namespace cuda
}  // namespace winattn
