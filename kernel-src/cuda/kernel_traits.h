// Tile shapes per head dim. Every configuration fits in 99 KB of shared memory (the sm86/sm89 per-block limit), so
// one instantiation serves sm80, sm86, sm89 and sm90.
//
// Instantiated head dims (others round up with zero padding; the padded columns are never read from or written to
// global memory): 32 (D = 8..32), 64 (40..64), 96 (72..96), 128 (104..128), 160 (136..160), 192 (168..192),
// 256 (200..256).
#pragma once
#include "utils.h"

namespace winattn {
namespace cuda {

constexpr int kHeadDims[] = {32, 64, 96, 128, 160, 192, 256};
// (a call's head dim -> its instance: kernel_head_dim, kernel_choice.h)

// Forward: kNWarps warps split the kBlockM query rows (16 * kMT rows each); K/V double-buffered, Q double-buffered
// for small head dims (window mode prefetches the next window's Q with its K/V). The additive-term tile
// (kBlockM x kBlockN, up to 2 stages) is added by the host to the dynamic shared memory when present.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kQStages_>
struct FwdTraitsBase {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kMT = kBlockM / (16 * kNWarps);  // 16-row tiles per warp
  static constexpr int kNT = kBlockN / 8;               // 8-column score tiles
  static constexpr int kDT = kHeadDim / 8;              // 8-column output tiles
  static constexpr int kQStages = kQStages_;
  static constexpr int kLd = kHeadDim + 8;  // padded smem row (elements)
  static constexpr int kQElems = kBlockM * kLd, kKVElems = kBlockN * kLd;
  static constexpr int kSmemBytes = (kQStages * kQElems + 4 * kKVElems) * 2;
  static_assert(kMT >= 1 && kBlockM == 16 * kMT * kNWarps, "bad fwd tile");
  static_assert(kNT % 2 == 0, "key tiles come in pairs");
  static_assert(kSmemBytes <= 101376, "must fit the sm86/sm89 shared memory limit");
};

template <int D> struct FwdTraits;
template <> struct FwdTraits<32> : FwdTraitsBase<32, 64, 64, 4, 2> {};
template <> struct FwdTraits<64> : FwdTraitsBase<64, 64, 64, 4, 2> {};
template <> struct FwdTraits<96> : FwdTraitsBase<96, 128, 32, 4, 1> {};
template <> struct FwdTraits<128> : FwdTraitsBase<128, 128, 32, 4, 1> {};
template <> struct FwdTraits<160> : FwdTraitsBase<160, 64, 32, 4, 1> {};
template <> struct FwdTraits<192> : FwdTraitsBase<192, 64, 32, 4, 1> {};
template <> struct FwdTraits<256> : FwdTraitsBase<256, 64, 16, 4, 1> {};

// Bytes per shared row of an additive-term tile of kBlockN columns (padded so fragment reads are conflict-free).
__host__ __device__ constexpr int bias_pitch_bytes(int block_n, int esize) {
  return block_n * esize + (esize == 4 ? 32 : 16);
}

// Backward (key-block outer, query-block inner, flash-attention 2 style). Three warp grids:
//   S / dP  [BM x BN]: kSdpWM x kSdpWN warps   (warps past the grid idle for these two GEMMs)
//   dK / dV [BN x D] : kKvWN  x kKvWD  warps
//   dQ      [BM x D] : kDqWM  x kDqWD  warps
// kMinBlocks: resident CTAs per SM the kernel is compiled for (__launch_bounds__ second argument), i.e. a register
// cap of 65536 / (kMinBlocks * kNThreads) per thread; 1 leaves ptxas free (up to 255).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kSdpWM_, int kSdpWN_, int kKvWN_, int kKvWD_,
          int kDqWM_, int kDqWD_, int kQStages_, int kKVStages_, int kMinBlocks_ = 1>
struct BwdTraitsBase {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_, kNWarps = kNWarps_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kSdpWM = kSdpWM_, kSdpWN = kSdpWN_, kKvWN = kKvWN_, kKvWD = kKvWD_, kDqWM = kDqWM_,
                       kDqWD = kDqWD_;
  static constexpr int kQStages = kQStages_, kKVStages = kKVStages_;
  // per-warp tile counts
  static constexpr int kSdpMT = kBlockM / (16 * kSdpWM), kSdpNT = kBlockN / (8 * kSdpWN);
  static constexpr int kKvMT = kBlockN / (16 * kKvWN), kKvNT = kHeadDim / (8 * kKvWD);
  static constexpr int kDqMT = kBlockM / (16 * kDqWM), kDqNT = kHeadDim / (8 * kDqWD);
  static_assert(kSdpWM * kSdpWN <= kNWarps && kKvWN * kKvWD <= kNWarps && kDqWM * kDqWD <= kNWarps, "warp grids");
  static_assert(kSdpMT * 16 * kSdpWM == kBlockM && kSdpNT * 8 * kSdpWN == kBlockN, "S/dP grid");
  static_assert(kKvMT * 16 * kKvWN == kBlockN && kKvNT * 8 * kKvWD == kHeadDim, "dK/dV grid");
  static_assert(kDqMT * 16 * kDqWM == kBlockM && kDqNT * 8 * kDqWD == kHeadDim, "dQ grid");
  static_assert(kSdpNT % 2 == 0 && kKvNT % 2 == 0 && kDqNT % 2 == 0, "B tiles come in pairs");
  static constexpr int kLd = kHeadDim + 8;   // Q, dO, K, V rows
  static constexpr int kLdS = kBlockN + 8;   // P, dS rows
  static constexpr int kQElems = kBlockM * kLd, kKVElems = kBlockN * kLd, kSElems = kBlockM * kLdS;
  // elements: Q + dO per stage, K + V per stage, P + dS; then fp32 lse + delta per stage
  static constexpr int kSmemBytes =
      (2 * kQStages * kQElems + 2 * kKVStages * kKVElems + 2 * kSElems) * 2 + 2 * kQStages * kBlockM * 4;
  static constexpr int kLdAcc = kBlockN + 8;  // fp32 window-mode dS accumulator rows
  static_assert(kSmemBytes <= 101376, "must fit the sm86/sm89 shared memory limit");
};

// Backward configurations per head dim: BwdTraits<D, 0> is the default; D = 32 (Swin: N <= 64 windows, one 64 x 64
// tile per window, many windows per CTA) has alternatives selected at run time by WINATTN_BWD_CFG (planner). Every
// configuration of one head dim shares BM, BN, the pipeline depths and the shared memory size, so the planner's
// tile arithmetic is configuration-independent (checked in launch_template.h).
//   D = 32, cfg 0 (default, v1.1): 8 warps (S/dP 4x2 warps of 16x32, dK/dV and dQ 4x2 warps of 16x16), registers
//     capped at 128 for 2 CTAs/SM = 16 warps/SM. v1 ran 4 warps at 236 registers: 2 CTAs = 8 warps/SM, 12%
//     occupancy, latency-bound (Nsight: 73% of cycles without an eligible warp). Halving each warp's tile halves
//     its accumulators (S/dP 64 -> 32 floats, dK/dV 32 -> 16), so the cap costs only 20 bytes of spills.
//     Measured (H200, Swin W7 bwd): 2.00 ms vs 2.48 ms for cfg 1 with the same planner (3.36 ms in v1).
//   D = 32, cfg 1: the v1 configuration (4 warps, no register cap: 236 registers), kept for comparison.
//   Tried and dropped: 4 warps capped at 168 registers for 3 CTAs/SM (84 / 308 bytes of spills, and the additive
//   tile must then be read from global to fit 3 x 75 KB): 2.98 ms.
template <int D, int Cfg = 0> struct BwdTraits;
template <int D> constexpr int kBwdConfigs = 1;
template <> constexpr int kBwdConfigs<32> = 2;
template <> struct BwdTraits<32, 0> : BwdTraitsBase<32, 64, 64, 8, 4, 2, 4, 2, 4, 2, 2, 2, 2> {};
template <> struct BwdTraits<32, 1> : BwdTraitsBase<32, 64, 64, 4, 4, 1, 4, 1, 4, 1, 2, 2> {};
template <> struct BwdTraits<64> : BwdTraitsBase<64, 64, 64, 4, 4, 1, 4, 1, 4, 1, 2, 2> {};
template <> struct BwdTraits<96> : BwdTraitsBase<96, 64, 64, 8, 4, 2, 4, 2, 4, 2, 2, 1> {};
template <> struct BwdTraits<128> : BwdTraitsBase<128, 64, 64, 8, 4, 2, 4, 2, 4, 2, 1, 1> {};
template <> struct BwdTraits<160> : BwdTraitsBase<160, 32, 64, 8, 2, 4, 4, 2, 2, 2, 1, 1> {};
template <> struct BwdTraits<192> : BwdTraitsBase<192, 32, 64, 8, 2, 4, 4, 2, 2, 2, 1, 1> {};
template <> struct BwdTraits<256> : BwdTraitsBase<256, 32, 32, 8, 2, 2, 2, 4, 2, 4, 1, 1> {};

}  // namespace cuda
}  // namespace winattn
