// Split-KV decode forward on Hopper (sm_90a) with K / V loaded by TMA: the math, score terms, split and partial
// layout of fwd_decode.h (same DecodeParams, decode_score, decode_combine_kernel), a different way of feeding it.
//
// Why: fwd_decode.h reaches ~3.85 TB/s on Llama-3-8B decode at batch 32 (0.279 ms; cuDNN / FA4 ~4.4 TB/s). ncu saw
// it issue-bound at 8 warps per SM, a large part of the instructions being its loads (every thread computes
// addresses and issues 16-byte cp.async), and each CTA waiting on its whole tile group at a __syncthreads before the
// next load is issued. Here:
//   * one producer warp (one elected lane) issues the bulk tensor copies of a 64-key K tile and V tile per stage,
//     32-column boxes of the cached [B, S, H, D] maps (tensor_map_sm90.h), into a ring of kStages stages, each with
//     a "full" mbarrier (TMA transaction bytes) and an "empty" one (one arrival per consumer warp). A stage is
//     refilled as soon as the last warp is done with it, so while a warp waits for tile t, tiles t .. t + kStages - 1
//     are all in flight; the consumers execute no load instruction for K / V at all.
//   * four consumer warps take 16 keys each of every tile (as fwd_decode.h: the stage is freed after one tile's
//     worth of compute), S = Q K^T and O += P V on mma.sync m16n8k16 with ldmatrix from the 64-byte-swizzled tiles
//     TMA writes (lane addresses: DecodeLaneOffsets below), Q's A fragments held in registers for the whole key
//     range (D <= 128), a per-warp online softmax that rescales O only when some row's max moved (exact: the factor
//     is 2^0 = 1 otherwise), the warps merged at the end through the stages' space.
//   * sizing (H200: 228 KB of shared memory per SM, 1 KB of it reserved per CTA, 227 KB per CTA at most): the
//     stage count is what the budget of kCtasPerSm CTAs leaves after Q and the barriers. D = 64: 6 stages of 16 KB,
//     D = 128: 3 stages of 32 KB, two CTAs per SM each (~192 KB of K / V in flight per SM against ~128 KB at most
//     for fwd_decode.h, whose next load waits for the barrier); D = 256: 3 stages of 64 KB, one CTA per SM (a
//     second would leave each one stage). Two CTAs per SM where they fit, so that one CTA's start (barrier init,
//     Q, the first TMA's latency) or end (the merge) overlaps the other's streaming.
// The planner (kernel_choice.h try_fwd_decode, forced name fwd_decode_tma) sizes the splits to one wave of these
// resident CTAs (decode_tma_ctas_per_sm), chunks of whole 128 keys so that no 64-key tile straddles two splits: a
// tile's keys past the split's end are then past Sk, which TMA fills with zeros (as fwd_decode.h's zero-fill: P V
// never meets another split's values).
#pragma once
#include <cuda.h>

#include "../fwd_decode.h"
#include "pipeline_sm90.h"
#include "tile_sm90.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// Kernel parameters: the decode call plus the K / V tensor maps (built by the host, __grid_constant__ so TMA reads
// them from the parameter space; maps first: CUtensorMap is 64-byte aligned).
struct DecodeTmaParams {
  CUtensorMap tk, tv;
  DecodeParams d;
};

template <int DK_>
struct DecodeTmaTraits {
  static constexpr int kHeadDim = DK_;  // instance head dim (the call's D <= it; columns past D arrive as zeros)
  static constexpr int kRows = 16;      // one m16 tile of query rows (H / Hkv x Sq <= 16)
  static constexpr int kConsumerWarps = 4, kThreads = 32 * (kConsumerWarps + 1);  // + the producer warp
  static constexpr int kKeysPerWarp = 16, kBlockN = kKeysPerWarp * kConsumerWarps;  // one 64-key tile per stage
  static constexpr int kCtasPerSm = DK_ > 128 ? 1 : 2;  // (kernel_choice.h decode_tma_ctas_per_sm mirrors it)
  static constexpr bool kQInRegs = DK_ <= 128;          // D = 256: 64 more registers next to O's 128; from smem
  // K or V of a stage: DK / 32 column blocks of [64 keys x 32 dims] (one TMA box each, 4 KB)
  static constexpr int kColBlocks = DK_ / 32, kBlockBytes = kBlockN * kSwizzleRowBytes;
  static constexpr int kTileBytes = kColBlocks * kBlockBytes, kStageBytes = 2 * kTileBytes;
  static constexpr int kQPitch = DK_ + 8;  // Q as fwd_decode.h has it: padded rows, ldmatrix without conflicts
  static constexpr int kQBytes = kRows * kQPitch * 2;
  static constexpr int kBarBytes = 128;  // full[kStages], empty[kStages]
  static constexpr int kAlignSlack = 1024;  // (align_1024 of the dynamic base: the swizzle is a function of it)
  static constexpr int kCtaBudget = (DK_ > 128 ? 227 * 1024 : 228 * 1024 / kCtasPerSm - 1024);
  static constexpr int kStages = (kCtaBudget - kAlignSlack - kQBytes - kBarBytes) / kStageBytes;
  // layout from the aligned base: stages (1024-aligned: every stage, K / V tile and column block is a multiple of
  // 1 KB), Q, barriers
  static constexpr int kQOffset = kStages * kStageBytes, kBarOffset = kQOffset + kQBytes;
  static constexpr int kSmemBytes = kAlignSlack + kBarOffset + kBarBytes;
  // the warps' merge reuses the stages: partial outputs [W][16][DK] and maxima / sums [2][W][16], fp32
  static constexpr int kMergeBytes = (kConsumerWarps * kRows * kHeadDim + 2 * kConsumerWarps * kRows) * 4;
  static_assert(DK_ == 64 || DK_ == 128 || DK_ == 256, "decode instances");
  static_assert(kStages >= 3 && kStages <= 8 && 2 * kStages * 8 <= kBarBytes, "stage ring");
  static_assert(kSmemBytes <= kCtaBudget, "kCtasPerSm CTAs fit an SM's shared memory");
  static_assert(kTileBytes % 1024 == 0 && kBlockBytes % 512 == 0, "swizzle atoms stay aligned");
  static_assert(kMergeBytes <= kStages * kStageBytes, "the merge fits in the stages");
};

// ---- ldmatrix lane addresses in the swizzled tiles ------------------------------------------------------------
// A K or V tile is [64 keys x DK] stored as DK/32 column blocks of [64 x 32] (tile_sm90.h): the 16-byte chunk c
// (dims 8c .. 8c+7) of key row r sits at
//     tile_chunk_offset<64>(r, c) = (c >> 2) * 64 * 64 + r * 64 + (((c & 3) ^ ((r >> 1) & 3)) << 4)
// (TMA's SWIZZLE_64B XORs address bits [4,6) with bits [7,9); bits 7-8 of r * 64 are bits 1-2 of r; the tile base
// is 1024-aligned, so tile offsets and shared addresses swizzle alike). One ldmatrix.x4 reads four 8x8 blocks; lane
// l gives the address of one 16-byte row of block l / 8. Per lane that row is a fixed key r (its bits 1-2 come from
// l alone: the warp's 16-key offset and the 8-key halves are multiples of 8) and a chunk c = 2 * step + h with a
// per-lane h in {0, 1} and a compile-time step (16 dims per k-step / per pair of n-tiles). With step = 2q + a:
//     c >> 2 = q,   c & 3 = 2a + h,
// so the address is   tile + q * kBlockBytes + off[a],   off[a] = tile_chunk_offset<64>(r, 2a + h),
// two registers per lane and operand, the rest an immediate.
//   K in S = Q K^T (B operand, "col": B[k = dim][n = key], ldmatrix non-transposed): block 0 keys 0-7 / dims
//     0-7 of the step (b0 of n-tile 0), block 1 keys 0-7 / dims 8-15 (b1), blocks 2 and 3 the same for keys 8-15
//     (n-tile 1): r = kw + (l & 7) + (l >> 4) * 8, h = (l >> 3) & 1 (gemm.h load_b_frag2<false>'s lanes);
//   V in O += P V (B[k = key][n = dim], ldmatrix.trans): block 0 keys 0-7 / dims 0-7 (b0 of n-tile 0), block 1
//     keys 8-15 / dims 0-7 (b1), blocks 2 and 3 dims 8-15 (n-tile 1): r = kw + (l & 7) + ((l >> 3) & 1) * 8,
//     h = l >> 4 (load_b_frag2<true>'s lanes).
struct DecodeLaneOffsets {
  uint32_t even, odd;  // off[0], off[1]
};
template <int BN>
__device__ __forceinline__ DecodeLaneOffsets decode_lane_offsets(int r, int h) {
  return {uint32_t(tile_chunk_offset<BN>(r, h)), uint32_t(tile_chunk_offset<BN>(r, 2 + h))};
}
template <int BN>
__device__ __forceinline__ uint32_t decode_lane_addr(uint32_t tile, const DecodeLaneOffsets& o, int step) {
  return tile + (step >> 1) * (BN * kSwizzleRowBytes) + ((step & 1) ? o.odd : o.even);
}

__device__ __forceinline__ void ldsm_x4_at(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t_at(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// One CTA: keys [split * chunk, ...) of KV head hkv of batch b, for the rows r = (h - hkv * G) * Sq + i (as
// fwd_decode_kernel; the same launch order: the KV heads of one key range are neighbours).
template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kCtasPerSm)
    fwd_decode_tma_kernel(const __grid_constant__ DecodeTmaParams P) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int DK = Tr::kHeadDim, R = Tr::kRows, W = Tr::kConsumerWarps, BN = Tr::kBlockN, ST = Tr::kStages;
  constexpr int LD = Tr::kQPitch, DT = DK / 8, KS = DK / 16, CT = 32 * W;  // CT: the consumer threads
  const DecodeParams& DP = P.d;
  const KParams& p = DP.p;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  Elem* sQ = reinterpret_cast<Elem*>(smem + Tr::kQOffset);  // [16][LD], rows past the group and dims past D zero
  auto k_tile = [&](int s) { return base + s * Tr::kStageBytes; };
  auto v_tile = [&](int s) { return base + s * Tr::kStageBytes + Tr::kTileBytes; };
  auto full = [&](int s) { return base + Tr::kBarOffset + 8 * s; };
  auto empty = [&](int s) { return base + Tr::kBarOffset + 8 * (ST + s); };

  const int hkv = int(blockIdx.x % p.Hkv), split = int(blockIdx.x / p.Hkv % DP.splits);
  const int b = int(blockIdx.x / p.Hkv / DP.splits);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const DecodeRows dr = decode_rows(DP, b, hkv, split);
  const int key_lo = split * DP.chunk, key_hi = min(p.Sk, key_lo + DP.chunk);
  const int tiles = (key_hi - key_lo + BN - 1) / BN;  // >= 1: every split has a key (planner)
  // column blocks holding a dim < D (D < DK: 40 at 64, 96 at 128, 160 / 192 at 256); the others are never loaded (no
  // box lies wholly past the tensor's extent) and hold zeros (written once by the consumers below)
  const int nblocks = min(Tr::kColBlocks, (p.D + 31) / 32);

  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full(s), 1);      // the producer's arrive.expect_tx; the TMA bytes complete it
      mbar_init(empty(s), W);     // one arrival per consumer warp
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp == W) {
    // ---- producer: one lane issues every load of this CTA's key range, then the warp leaves ----
    // The whole warp walks the ring and waits on each empty barrier; lane 0 alone issues. It takes no part in the
    // merge: the consumers have waited on every tile's full barrier before they merge, so nothing it issued is still
    // in flight for them. (Through v5.3 it joined the merge at two __syncthreads, reached by the producer and the
    // consumers from different branches, and racecheck reported the merge's stores and loads as 17 hazards across
    // them: RESULTS v4.3, v4.4. The merge now syncs the consumers alone, on a named barrier.)
    if (lane == 0) {
      tma_prefetch_desc(&P.tk);
      tma_prefetch_desc(&P.tv);
    }
    int s = 0;
    uint32_t use_parity = 0;  // (t / ST) & 1
    for (int t = 0; t < tiles; ++t) {
      if (t >= ST) mbar_wait(empty(s), use_parity ^ 1u);  // every warp is done with tile t - ST
      if (lane == 0) {
        // (a box's rows past Sk and columns past D arrive as zeros and count in full)
        mbar_arrive_expect_tx(full(s), 2 * nblocks * Tr::kBlockBytes);
        const int row = key_lo + t * BN;
#pragma unroll
        for (int c = 0; c < Tr::kColBlocks; ++c)
          if (c < nblocks) tma_load_4d(k_tile(s) + c * Tr::kBlockBytes, &P.tk, full(s), c * 32, row, hkv, b);
#pragma unroll
        for (int c = 0; c < Tr::kColBlocks; ++c)
          if (c < nblocks) tma_load_4d(v_tile(s) + c * Tr::kBlockBytes, &P.tv, full(s), c * 32, row, hkv, b);
      }
      __syncwarp();
      if (++s == ST) s = 0, use_parity ^= 1u;
    }
    return;
  }

  // ---- consumers: Q once (cp.async, as fwd_decode.h), then every tile's 16 keys of this warp ----
  OnlineSoftmax<1> softmax;
  softmax.reset();
  float acc_o[1][DT][4];
  zero_acc(acc_o);
  decode_load_q<Elem, DK, LD>(sQ, p, b, hkv, tid, CT);
  cp_async_commit();
  if (nblocks < Tr::kColBlocks) {
    // the column blocks no TMA writes, zeroed once in every stage: K's meet Q's zero columns in S = Q K^T (0 x a
    // stale NaN would be NaN); V's only reach output columns past D, never written, zeroed alike
    constexpr int kChunksPerTile = Tr::kTileBytes / 16;
    const int from = nblocks * Tr::kBlockBytes / 16;
    for (int x = tid; x < 2 * ST * kChunksPerTile; x += CT) {
      const int tile = x / kChunksPerTile, chunk = x % kChunksPerTile;  // (tile: K / V of stage tile / 2)
      if (chunk >= from)
        *reinterpret_cast<uint4*>(smem + tile * Tr::kTileBytes + chunk * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
  cp_async_wait_all();
  named_sync(1, CT);  // (id 1: this kernel's only named barrier, the consumers') Q chunks and zeros landed

  uint32_t qf[Tr::kQInRegs ? KS : 1][4];  // Q's A fragments for the whole key range
  if constexpr (Tr::kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) load_a_frag<false>(qf[ks], sQ, LD, 0, ks * 16, lane);
  }
  const int kw = warp * Tr::kKeysPerWarp;
  const DecodeLaneOffsets ko = decode_lane_offsets<BN>(kw + (lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1);
  const DecodeLaneOffsets vo = decode_lane_offsets<BN>(kw + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);

  int s = 0;
  uint32_t use_parity = 0;
  for (int t = 0; t < tiles; ++t) {
    mbar_wait(full(s), use_parity);  // tile t's K and V landed
    const uint32_t kt = k_tile(s), vt = v_tile(s);
    float sc[1][2][4];
    zero_acc(sc);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t af[4], bf[4];
      if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) af[e] = qf[ks][e];
      } else {
        load_a_frag<false>(af, sQ, LD, 0, ks * 16, lane);
      }
      ldsm_x4_at(bf, decode_lane_addr<BN>(kt, ko, ks));
      mma16816<Elem>(sc[0][0], af, bf[0], bf[1]);
      mma16816<Elem>(sc[0][1], af, bf[2], bf[3]);
    }
    decode_scores(sc, p, dr, key_lo + t * BN + kw + (lane & 3) * 2, key_hi, lane);  // (fwd_decode.h's terms)
    // online softmax (softmax.h softmax_step, as OnlineSoftmax::update), O rescaled only when a row's max moved:
    // otherwise the factor is 2^(m - m) = 1, or the row has seen no key and O is 0 (either way a no-op)
    float corr[2];
    bool moved = false;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float m_old = softmax.row_max[0][hf];
      softmax_step(sc[0], hf, Log2Units(), softmax.row_max[0][hf], softmax.row_sum[0][hf], corr[hf]);
      moved |= softmax.row_max[0][hf] != m_old;
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][dt][e] *= corr[e >> 1];
    }
    uint32_t pa[1][1][4];
    acc_to_afrag<Elem, 1, 2>(pa, sc);
#pragma unroll
    for (int np = 0; np < DK / 16; ++np) {
      uint32_t bf[4];
      ldsm_x4_t_at(bf, decode_lane_addr<BN>(vt, vo, np));
      mma16816<Elem>(acc_o[0][2 * np], pa[0][0], bf[0], bf[1]);
      mma16816<Elem>(acc_o[0][2 * np + 1], pa[0][0], bf[2], bf[3]);
    }
    __syncwarp();  // every lane's ldmatrix of the stage is done before the warp's arrival frees it
    if (lane == 0) mbar_arrive(empty(s));
    if (++s == ST) s = 0, use_parity ^= 1u;
  }

  // ---- merge the consumer warps (each with its own max) through shared memory, in the stages' space ----
  // (every TMA write has landed: each consumer waited on every tile's full barrier; the first barrier keeps a warp
  // still reading its last tile from the others' writes)
  named_sync(1, CT);
  float* sO = reinterpret_cast<float*>(smem);  // [W][16][DK]
  float* sM = sO + W * R * DK;                 // [W][16] maxima, then [W][16] sums
  decode_park_warp<W, DK>(sO, sM, softmax, acc_o, warp, lane);
  named_sync(1, CT);
  decode_write_rows<Elem, W, DK>(DP, dr, sO, sM, tid, CT);
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (DeviceCaps::sm90a)
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
