// Definitions of the sm90 entry points declared in launch.h (readiness, occupancy, launch of each kernel family);
// included only by instantiations/{fwd,bwd}_sm90_hdim*.cu, which the build compiles for sm_90a alone (build.toml
// window_attention_sm90).
#pragma once
#include <cstdlib>
#include <type_traits>

#include "../host_env.h"
#include "../launch_template.h"
#include "fwd_pipelined_sm90.h"
#include "tensor_map_sm90.h"
#include "fwd_windows_sm90.h"
#include "bwd_windows_sm90.h"
#include "bwd_windows_wide_sm90.h"

namespace winattn {
namespace cuda {

// One kernel family per head dim: its traits, its fp16 / bf16 instantiations and the name errors report.
using KernelFn = void (*)(KParams);
template <int D, int BN>
struct FwdWindowsSm90 {  // (its own parameter struct: the TMA maps)
  using Tr = typename sm90::FwdWindowTraitsSm90For<D, BN>::type;
  using Fn = void (*)(sm90::FwdWindowParams);
  template <int kHide>
  static Fn pick_hiding(int dtype) {
    return dtype == 0 ? sm90::fwd_windows_kernel_sm90<Tr, __half, kHide>
                      : sm90::fwd_windows_kernel_sm90<Tr, __nv_bfloat16, kHide>;
  }
  // the instance for what the call hides per window (WindowHiding; the 64-key tile has one, see apply_terms)
  static Fn pick(int dtype, const KParams& p) {
    if constexpr (!Tr::kGeneralTerms) {
      switch (sm90::window_hiding(p)) {
        case sm90::kHideMaskBits: return pick_hiding<sm90::kHideMaskBits>(dtype);
        case sm90::kHidePaddedKeys: return pick_hiding<sm90::kHidePaddedKeys>(dtype);
        case sm90::kHideFoldedMask: return pick_hiding<sm90::kHideFoldedMask>(dtype);
        default: break;
      }
    } else if (p.term_hides) {  // (the 64-key tile's fast path reads the folded mask from its term table)
      return pick_hiding<sm90::kHideFoldedMask>(dtype);
    }
    return pick_hiding<sm90::kHideNothing>(dtype);
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

template <int D, int BN>
int fwd_windows_sm90_blocks_per_sm(int dtype, int smem, const KParams& p) {
  using K = FwdWindowsSm90<D, BN>;
  return blocks_per_sm(K::pick(dtype, p), K::Tr::kNThreads, smem);
}
template <int D, int BN>
void run_fwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  using K = FwdWindowsSm90<D, BN>;
  if (grid <= 0) return;
  sm90::FwdWindowParams args;
  args.tq = sm90::cached_rows_map(p.q, p.B, p.Sq, p.H, p.D, p.q_sb, p.q_ss, p.q_sh, K::Tr::kBlockM);
  args.tk = sm90::cached_rows_map(p.k, p.B, p.Sk, p.Hkv, p.D, p.k_sb, p.k_ss, p.k_sh, K::Tr::kBlockN);
  args.tv = sm90::cached_rows_map(p.v, p.B, p.Sk, p.Hkv, p.D, p.v_sb, p.v_ss, p.v_sh, K::Tr::kBlockN);
  if (p.mbits) args.tbits = sm90::make_mask_bits_map(p.mbits, p.mb_period, p.mb_heads, p.mb_rows, p.mb_words, 64);
  args.p = p;
  auto kernel = K::pick(dtype, p);
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, K::kName);
  kernel<<<dim3(unsigned(grid)), dim3(K::Tr::kNThreads), smem, stream>>>(args);
  check_cuda(cudaGetLastError(), K::kName);
}
template <int D>
int bwd_windows_sm90_blocks_per_sm(int dtype, int smem) {
  return family_blocks_per_sm<BwdWindowsSm90<D>>(dtype, smem);
}
template <int D>
void run_bwd_windows_sm90(const KParams& p, int dtype, int64_t grid, int smem, cudaStream_t stream) {
  launch_family<BwdWindowsSm90<D>>(p, dtype, grid, smem, stream);
}

// Wide-window backward (bwd_windows_wide_sm90.h), windows of up to N tokens: its own parameter struct (the v3
// preprocess rows), a fixed shared-memory size, one CTA per SM; `grid` counts work items (the split instance runs
// four CTAs, one cluster, per item).
template <int N>
struct BwdWideWindowsSm90 {
  using Tr = typename sm90::BwdWideWindowTraitsSm90For<N>::type;
  using Fn = void (*)(sm90::BwdWideWindowParams);
  template <int kHide>
  static Fn pick_hiding(int dtype) {
    return dtype == 0 ? sm90::bwd_windows_wide_kernel_sm90<Tr, __half, kHide>
                      : sm90::bwd_windows_wide_kernel_sm90<Tr, __nv_bfloat16, kHide>;
  }
  // the instance for what the call hides per window (WindowHiding); all three have the same shared memory and one
  // CTA per SM (the occupancy queries take the first)
  static Fn pick(int dtype, const KParams* p = nullptr) {
    switch (p ? sm90::window_hiding(*p) : sm90::kHideNothing) {
      case sm90::kHideMaskBits: return pick_hiding<sm90::kHideMaskBits>(dtype);
      case sm90::kHidePaddedKeys: return pick_hiding<sm90::kHidePaddedKeys>(dtype);
      case sm90::kHideFoldedMask: return pick_hiding<sm90::kHideFoldedMask>(dtype);
      default: return pick_hiding<sm90::kHideNothing>(dtype);
    }
  }
  static constexpr const char* kName = "window_attention bwd (sm90 wide windows)";
};
// A launch configuration with clusters of kCluster CTAs along x (for cudaLaunchKernelEx and the cluster occupancy
// query; the attribute lives with the configuration that points to it).
template <int kCluster>
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr{};
  ClusterLaunch(int64_t ctas, int threads, int smem, cudaStream_t stream) {
    cfg.gridDim = dim3(unsigned(ctas));
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // (cfg.attrs points into this object)
};

// CTAs of the split instance that can be resident at once: whole clusters of four (on the H200 30 clusters, 120 of
// the 132 SMs: the GPCs' SM counts are not all multiples of four); 0 for the unsplit instances or on failure.
template <int N>
int bwd_windows_wide_sm90_cluster_slots(int dtype) {
  using K = BwdWideWindowsSm90<N>;
  if constexpr (!K::Tr::kSplit) {
    return 0;
  } else {
    auto kernel = K::pick(dtype);
    raise_smem_limit(reinterpret_cast<const void*>(kernel), K::Tr::kSmemBytes, K::kName);
    ClusterLaunch<4> launch(4, K::Tr::kNThreads, K::Tr::kSmemBytes, nullptr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return 4 * clusters;
  }
}
template <int N>
void run_bwd_windows_wide_sm90(const KParams& p, const float* lse2, int sq_pad, int dtype, int64_t grid,
                               cudaStream_t stream) {
  using K = BwdWideWindowsSm90<N>;
  sm90::BwdWideWindowParams args;
  args.tq = sm90::cached_rows_map(p.q, p.B, p.Sq, p.H, p.D, p.q_sb, p.q_ss, p.q_sh, K::Tr::kQueries);
  args.tdo = sm90::cached_rows_map(p.dout, p.B, p.Sq, p.H, p.D, p.do_sb, p.do_ss, p.do_sh, K::Tr::kQueries);
  args.to = sm90::cached_rows_map(p.o, p.B, p.Sq, p.H, p.D, p.o_sb, p.o_ss, p.o_sh, K::Tr::kQueries);
  args.tk = sm90::cached_rows_map(p.k, p.B, p.Sk, p.Hkv, p.D, p.k_sb, p.k_ss, p.k_sh, K::Tr::kKeys);
  args.tv = sm90::cached_rows_map(p.v, p.B, p.Sk, p.Hkv, p.D, p.v_sb, p.v_ss, p.v_sh, K::Tr::kKeys);
  args.p = p;
  args.lse2 = lse2;
  args.sq_pad = sq_pad;
  if (sq_pad != K::Tr::kWindow)
    throw std::logic_error("window_attention (cuda): the wide-window backward needs its preprocess rows padded to " +
                           std::to_string(K::Tr::kWindow));
  auto kernel = K::pick(dtype, &p);
  raise_smem_limit(reinterpret_cast<const void*>(kernel), K::Tr::kSmemBytes, K::kName);
  if constexpr (K::Tr::kSplit) {  // a cluster of four CTAs per work item (one per window quarter)
    ClusterLaunch<4> launch(4 * grid, K::Tr::kNThreads, K::Tr::kSmemBytes, stream);
    check_cuda(cudaLaunchKernelEx(&launch.cfg, kernel, args), K::kName);
  } else {
    kernel<<<dim3(unsigned(grid)), dim3(K::Tr::kNThreads), K::Tr::kSmemBytes, stream>>>(args);
  }
  check_cuda(cudaGetLastError(), K::kName);
}

// Forward v3 (fwd_pipelined_sm90.h): picks the score-term mode and the tile, builds the Q / K / V (and bias) tensor
// maps and launches one CTA per (batch, head, query tile of 128 rows, 192 for the 192-row tile).
template <int D>
struct FwdPipelinedSm90 : sm90::FwdV3Tiles<D> {  // (the tiles by name: kernel_traits_sm90.h)
  using Fn = void (*)(sm90::FwdPipeParams);
  template <typename Tr, int kMode, bool kDynamic = false>
  static Fn pick_mode(int dtype) {
    return dtype == 0 ? sm90::fwd_pipelined_kernel_sm90<Tr, __half, kMode, kDynamic>
                      : sm90::fwd_pipelined_kernel_sm90<Tr, __nv_bfloat16, kMode, kDynamic>;
  }
  // The instances with a dynamic-schedule twin (kernel_choice.h takes the schedule for these only): the no-term
  // path's narrow tile, what causal and sliding-window calls run.
  template <typename Tr, int kMode>
  static constexpr bool has_dynamic() {
    return kMode == sm90::kTermsRaw && std::is_same<Tr, typename sm90::FwdV3Tiles<D>::Narrow>::value;
  }
  static constexpr const char* kName = "window_attention fwd (sm90 v3)";
};
template <int D>
bool fwd_pipelined_sm90_ready(int dtype) {
  using K = FwdPipelinedSm90<D>;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, K::template pick_mode<typename K::Narrow, sm90::kTermsRaw>(dtype)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}

// Launches what the plan chose (kernel_choice.h try_fwd_v3_for): the term path, the tile, the schedule. Persistent:
// one CTA per SM (Tr::kMinBlocks of them) walks the tiles (its epilogue overlapping the next tile's loads), strided
// or, given a zeroed tile_counter, dynamically; else one CTA per tile.
template <typename K, typename Tr, int kMode>
void launch_fwd_pipelined(sm90::FwdPipeParams& P, int dtype, bool persistent, int sms, cudaStream_t stream) {
  const KParams& p = P.p;
  P.tq = sm90::cached_rows_map(p.q, p.B, p.Sq, p.H, p.D, p.q_sb, p.q_ss, p.q_sh, Tr::kBlockM, Tr::kBlockCols);
  P.tk = sm90::cached_rows_map(p.k, p.B, p.Sk, p.Hkv, p.D, p.k_sb, p.k_ss, p.k_sh, Tr::kBlockN, Tr::kBlockCols);
  P.tv = sm90::cached_rows_map(p.v, p.B, p.Sk, p.Hkv, p.D, p.v_sb, p.v_ss, p.v_sh, Tr::kBlockN, Tr::kBlockCols);
  if (P.bias_stage_bytes > 0)
    P.tb = sm90::make_bias_map(p.bias.ptr, p.bias.period, p.bias.heads, p.Sq, p.Sk, p.bias.sb, p.bias.sh, p.bias.sq,
                               Tr::kBlockM);
  if constexpr (sm90::fwd_v3_o_via_smem<Tr>(kMode))  // (each consumer warp stores its 16 rows: fwd_epilogue_sm90.h)
    P.to = sm90::cached_rows_map(p.o, p.B, p.Sq, p.H, p.D, p.o_sb, p.o_ss, p.o_sh, 16, 32);
  // (kTermsRawBiasPadded's padding bits live in the mbarriers' kilobyte: PipeSmem::pad_bits)
  const int smem =
      sm90::fwd_v3_smem<Tr>(kMode, sm90::PipeSmem<Tr>::template term_slot_bytes<kMode>(P.bias_stage_bytes));
  const int64_t tiles = int64_t(ceil_div(p.Sq, Tr::kBlockM)) * p.H * p.B;
  const int64_t grid = persistent ? std::min<int64_t>(tiles, int64_t(sms) * Tr::kMinBlocks) : tiles;
  // (kv_reuse computes a tile on the K / V its stages hold: a plan that asks it of other tiles is a bug)
  if (P.kv_reuse && !(kMode == sm90::kTermsRaw && Tr::kStream && persistent && P.tile_counter == nullptr &&
                      !p.has_band && ceil_div(p.Sk, Tr::kBlockN) == Tr::kStages))
    throw std::logic_error(std::string(K::kName) + ": K / V resident where the tiles do not fill the stages alike");
  auto kernel = K::template pick_mode<Tr, kMode>(dtype);
  if (P.tile_counter != nullptr) {
    if constexpr (K::template has_dynamic<Tr, kMode>())
      kernel = K::template pick_mode<Tr, kMode, true>(dtype);
    if (kernel == K::template pick_mode<Tr, kMode>(dtype) || !persistent)
      throw std::logic_error(std::string(K::kName) + ": the dynamic schedule on an instance without it");
  }
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, K::kName);
  kernel<<<dim3(unsigned(grid)), dim3(Tr::kNThreads), smem, stream>>>(P);
  check_cuda(cudaGetLastError(), K::kName);
}

template <int D>
void run_fwd_pipelined_sm90(const KParams& p, int dtype, int terms, int tile, bool persistent, bool kv_resident,
                            int* tile_counter, int stage_bytes, int sms, cudaStream_t stream) {
  using K = FwdPipelinedSm90<D>;
  sm90::FwdPipeParams P;
  P.p = p;
  P.bias_stage_bytes = stage_bytes;
  P.tile_counter = tile_counter;
  P.kv_reuse = kv_resident;
  if (terms == sm90::kTermsRawBias && (tile == sm90::kV3TwoCtas || tile == sm90::kV3TwoCtasRagged)) {
    if constexpr (sm90::fwd_v3_two_ctas_stage_term(D)) {
      if (tile == sm90::kV3TwoCtas)
        launch_fwd_pipelined<K, typename K::TwoCtas, sm90::kTermsRawBias>(P, dtype, persistent, sms, stream);
      else
        launch_fwd_pipelined<K, typename K::Ragged, sm90::kTermsRawBias>(P, dtype, persistent, sms, stream);
    } else {
      throw std::logic_error("window_attention (cuda): no two-CTA staged-term forward at head dim " +
                             std::to_string(D));
    }
  } else if (terms == sm90::kTermsRawBias)
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRawBias>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawRow && tile == sm90::kV3Keys128)
    launch_fwd_pipelined<K, typename K::Keys128, sm90::kTermsRawRow>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawRow)
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRawRow>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawRowPadded && tile == sm90::kV3Keys128)
    launch_fwd_pipelined<K, typename K::Keys128, sm90::kTermsRawRowPadded>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawRowPadded)
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRawRowPadded>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawBiasPadded) {
    if constexpr (sm90::fwd_v3_stages_padding(D))
      launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRawBiasPadded>(P, dtype, persistent, sms, stream);
    else
      throw std::logic_error("window_attention (cuda): no staged-padding forward at head dim " + std::to_string(D));
  } else if (terms == sm90::kTermsRawBiasMasked)
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRawBiasMasked>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawBits && tile == sm90::kV3Keys128)
    launch_fwd_pipelined<K, typename K::Keys128, sm90::kTermsRawBits>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsRawBits)
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRawBits>(P, dtype, persistent, sms, stream);
  else if (terms == sm90::kTermsGeneral)
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsGeneral>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3Wide)
    launch_fwd_pipelined<K, typename K::Wide, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3Keys80)
    launch_fwd_pipelined<K, typename K::Keys80, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3Keys128)
    launch_fwd_pipelined<K, typename K::Keys128, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3Keys208)
    launch_fwd_pipelined<K, typename K::Keys208, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3Stream)
    launch_fwd_pipelined<K, typename K::Stream, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3TwoCtas)
    launch_fwd_pipelined<K, typename K::TwoCtas, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3TwoCtasRagged)
    launch_fwd_pipelined<K, typename K::Ragged, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else if (tile == sm90::kV3Rows192)
    launch_fwd_pipelined<K, typename K::Rows192, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
  else
    launch_fwd_pipelined<K, typename K::Narrow, sm90::kTermsRaw>(P, dtype, persistent, sms, stream);
}

#define WINATTN_INSTANTIATE_FWD_PIPELINED_SM90(D)                                                    \
  template bool fwd_pipelined_sm90_ready<D>(int);                                                    \
  template void run_fwd_pipelined_sm90<D>(const KParams&, int, int, int, bool, bool, int*, int, int, cudaStream_t);

#define WINATTN_INSTANTIATE_BWD_WINDOWS_SM90(D)                                                      \
  template int bwd_windows_sm90_blocks_per_sm<D>(int, int);                                          \
  template void run_bwd_windows_sm90<D>(const KParams&, int, int64_t, int, cudaStream_t);

#define WINATTN_INSTANTIATE_BWD_WINDOWS_WIDE_SM90(N)                                                \
  template int bwd_windows_wide_sm90_cluster_slots<N>(int);                                          \
  template void run_bwd_windows_wide_sm90<N>(const KParams&, const float*, int, int, int64_t, cudaStream_t);

#define WINATTN_INSTANTIATE_FWD_WINDOWS_SM90(D, BN)                                                  \
  template int fwd_windows_sm90_blocks_per_sm<D, BN>(int, int, const KParams&);                      \
  template void run_fwd_windows_sm90<D, BN>(const KParams&, int, int64_t, int, cudaStream_t);

}  // namespace cuda
}  // namespace winattn
