// Definitions behind launch.h, included only by the instantiation translation units.
#pragma once
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "bwd_kernel.h"
#include "fwd_kernel.h"
#include "launch.h"

namespace winattn {
namespace cuda {

// Per (device, kernel) host state, so that a call costs a launch and not a round of driver queries (the Swin forward
// is ~0.4 ms of GPU time; the queries used to add about as much host time per call): the dynamic shared memory
// limit already raised, and resident CTAs per SM per shared memory size.
struct KernelHostCache {
  std::mutex mu;
  std::map<std::pair<int, const void*>, int> smem_limit;
  std::map<std::tuple<int, const void*, int, int>, int> occupancy;
  static KernelHostCache& get() {
    static KernelHostCache c;
    return c;
  }
};

inline void raise_smem_limit(const void* kernel, int smem, const char* what) {
  if (smem <= 48 * 1024) return;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), what);
  KernelHostCache& c = KernelHostCache::get();
  std::lock_guard<std::mutex> lock(c.mu);
  int& have = c.smem_limit[{dev, kernel}];
  if (have >= smem) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  have = smem;
}

template <typename Kernel>
inline void launch_kernel(Kernel kernel, int64_t grid, int threads, int smem, cudaStream_t stream,
                          const KParams& p, const char* what) {
  if (grid <= 0) return;
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, what);
  kernel<<<dim3(static_cast<unsigned>(grid)), dim3(threads), smem, stream>>>(p);
  check_cuda(cudaGetLastError(), what);
}

template <typename Kernel>
inline int blocks_per_sm(Kernel kernel, int threads, int smem) {
  const void* key = reinterpret_cast<const void*>(kernel);
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "occupancy");
  KernelHostCache& c = KernelHostCache::get();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.occupancy.find({dev, key, threads, smem});
    if (it != c.occupancy.end()) return it->second;
  }
  raise_smem_limit(key, smem, "occupancy");
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem), "occupancy");
  std::lock_guard<std::mutex> lock(c.mu);
  c.occupancy[{dev, key, threads, smem}] = n;
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
