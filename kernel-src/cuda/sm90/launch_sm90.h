// Definitions of the sm90 entry points declared in launch.h (readiness, occupancy, launch of each kernel family);
// included only by instantiations/{fwd,bwd}_sm90_hdim*.cu, which the build compiles for sm_90a alone (build.toml
// window_attention_sm90).
#pragma once
#include "../launch_template.h"
#include "fwd_kernel_sm90.h"
#include "fwd_windows_sm90.h"
#include "bwd_windows_sm90.h"

namespace winattn {
namespace cuda {

// One kernel family per head dim: its traits, its fp16 / bf16 instantiations and the name errors report.
using KernelFn = void (*)(KParams);
template <int D>
struct FwdSm90 {
  using Tr = typename sm90::FwdTraitsSm90For<D>::type;
  static KernelFn pick(int dtype) {
    return dtype == 0 ? sm90::fwd_kernel_sm90<Tr, __half> : sm90::fwd_kernel_sm90<Tr, __nv_bfloat16>;
  }
  static constexpr const char* kName = "window_attention fwd (sm90)";
};
template <int D, int BN>
struct FwdWindowsSm90 {
  using Tr = typename sm90::FwdWindowTraitsSm90For<D, BN>::type;
  static KernelFn pick(int dtype) {
    return dtype == 0 ? sm90::fwd_windows_kernel_sm90<Tr, __half> : sm90::fwd_windows_kernel_sm90<Tr, __nv_bfloat16>;
  }
  static constexpr const char* kName = "window_attention fwd (sm90 windows)";
};
template <int D>
struct BwdWindowsSm90 {
  using Tr = typename sm90::BwdWindowTraitsSm90For<D>::type;
  static KernelFn pick(int dtype) {
    return dtype == 0 ? sm90::bwd_windows_kernel_sm90<Tr, __half> : sm90::bwd_windows_kernel_sm90<Tr, __nv_bfloat16>;
  }
  static constexpr const char* kName = "window_attention bwd (sm90 windows)";
};

template <typename K>
int family_blocks_per_sm(int dtype, int smem) {
  return blocks_per_sm(K::pick(dtype), K::Tr::kNThreads, smem);
}
template <typename K>
void launch_family(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  launch_kernel(K::pick(dtype), grid, K::Tr::kNThreads, smem, stream, p, K::kName);
}

template <int D>
bool fwd_sm90_ready(int dtype) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, FwdSm90<D>::pick(dtype)) != cudaSuccess) {
    (void)cudaGetLastError();  // no image for this device: clear the error, use v1
    return false;
  }
  return attr.binaryVersion == 90;
}

template <int D>
int fwd_sm90_blocks_per_sm(int dtype, int smem) {
  return family_blocks_per_sm<FwdSm90<D>>(dtype, smem);
}
template <int D>
void run_fwd_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  launch_family<FwdSm90<D>>(p, dtype, grid, smem, stream);
}
template <int D, int BN>
int fwd_windows_sm90_blocks_per_sm(int dtype, int smem) {
  return family_blocks_per_sm<FwdWindowsSm90<D, BN>>(dtype, smem);
}
template <int D, int BN>
void run_fwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  launch_family<FwdWindowsSm90<D, BN>>(p, dtype, grid, smem, stream);
}
template <int D>
int bwd_windows_sm90_blocks_per_sm(int dtype, int smem) {
  return family_blocks_per_sm<BwdWindowsSm90<D>>(dtype, smem);
}
template <int D>
void run_bwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  launch_family<BwdWindowsSm90<D>>(p, dtype, grid, smem, stream);
}

#define WINATTN_INSTANTIATE_BWD_WINDOWS_SM90(D)                                                      \
  template int bwd_windows_sm90_blocks_per_sm<D>(int, int);                                          \
  template void run_bwd_windows_sm90<D>(const KParams&, int, int64_t, int, cudaStream_t);

#define WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(D, BN)                                                  \
  template int fwd_windows_sm90_blocks_per_sm<D, BN>(int, int);                                      \
  template void run_fwd_windows_sm90<D, BN>(const KParams&, int, int64_t, int, cudaStream_t);

#define WINATTN_INSTANTIATE_FWD_SM90(D)                                                              \
  template bool fwd_sm90_ready<D>(int);                                                              \
  template int fwd_sm90_blocks_per_sm<D>(int, int);                                                  \
  template void run_fwd_sm90<D>(const KParams&, int, int64_t, int, cudaStream_t);

}  // namespace cuda
}  // namespace winattn
