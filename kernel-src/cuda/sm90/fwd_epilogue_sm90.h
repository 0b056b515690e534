// Forward v3's epilogue (fwd_pipelined_sm90.h): a finished tile's O normalized, rounded to the input dtype and
// written, and its lse.
//
// Through shared memory (fwd_v3_o_via_smem, kernel_traits_sm90.h): each consumer warp stores its 16 rows into its
// slice of the warpgroup's output tile with stmatrix (the 64-byte-swizzled 32-column blocks of tile_sm90.h,
// whatever Q's blocks are) and its lane 0 hands them to one TMA store per 32-column block; the map
// (FwdPipeParams::to) clips rows past Sq and columns past D. The warp goes on to its next tile at once: the store
// reads the slice asynchronously, and lane 0 waits for that read (bulk_wait_read) only before the slice is written
// again or the CTA exits. Per warp, not per warpgroup: a warp's slice needs no barrier but __syncwarp.
// Why: the fragment stores of write_out_rows (tile_io.h) are 32 four-byte stores per thread per tile at D = 128,
// each writing 16 of a row's bytes; in ncu of Wan 2.1's cross-attention forward (RESULTS v4.7) 18% of the stall
// samples sat on them and on what waited behind them (FA3 and FA4 store O through shared memory and TMA too).
#pragma once
#include <cuda.h>

#include "../gemm.h"
#include "../kernel_params.h"
#include "../softmax.h"
#include "../tile_io.h"
#include "pipeline_sm90.h"
#include "tile_sm90.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// Warp `warp` (of its warpgroup's four) of the consumer warpgroup whose output tile starts at o_tile: its rows
// i0 + wr .. + 15 of (b, h) from the accumulator acc_o, lse from the quads' lane 0. Each 16-column step is scaled,
// packed and stored in turn (all of O packed first spilled 48-60 bytes at head dim 128: ptxas).
template <typename Elem, int DK>
__device__ __forceinline__ void store_o_via_smem(const CUtensorMap* to, const KParams& p, uint32_t o_tile, int b,
                                                 int h, int i0, int wr, const float (&acc_o)[1][DK / 8][4],
                                                 const float (&row_max)[2], const float (&row_sum)[2], int qr,
                                                 int qc, int warp, int lane) {
  static_assert(DK % 16 == 0, "whole 16-column steps (the last 32-column block half written at 80: the map clips it)");
  float inv[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const RowFinal f = finalize_row(row_max[hf], quad_sum(row_sum[hf]));
    inv[hf] = f.scale();
    const int i = i0 + wr + qr + hf * 8;
    if (qc == 0 && i < p.Sq) p.lse[(int64_t(b) * p.H + h) * p.Sq + i] = f.lse();
  }
  if (lane == 0) bulk_wait_read<0>();  // the store of this warp's previous tile has read the slice
  __syncwarp();
  // stmatrix: lane 8 m + j gives row j of 8 x 8 block m (m = 0..3: rows 0-7 / 8-15 of the warp's 16, then the same
  // 8 columns on), the fragment order of acc_to_afrag (gemm.h)
  // (tile_chunk_offset<64>(row, 2 ks + half) from two addresses: chunk 2 ks + half of a 32-column block is chunk
  // half XOR 2 (ks & 1); eight addresses kept live across tiles spilled 48 bytes at head dim 128)
  const int row = (warp & 3) * 16 + (lane & 7) + (lane & 8), half = lane >> 4;
  const uint32_t at0 = o_tile + tile_chunk_offset<64>(row, half), at1 = at0 ^ 32u;
  const float(&a)[DK / 8][4] = acc_o[0];
#pragma unroll
  for (int ks = 0; ks < DK / 16; ++ks)
    stmatrix_x4((ks & 1 ? at1 : at0) + (ks >> 1) * 64 * kSwizzleRowBytes,
                ElemTraits<Elem>::pack(a[2 * ks][0] * inv[0], a[2 * ks][1] * inv[0]),
                ElemTraits<Elem>::pack(a[2 * ks][2] * inv[1], a[2 * ks][3] * inv[1]),
                ElemTraits<Elem>::pack(a[2 * ks + 1][0] * inv[0], a[2 * ks + 1][1] * inv[0]),
                ElemTraits<Elem>::pack(a[2 * ks + 1][2] * inv[1], a[2 * ks + 1][3] * inv[1]));
  fence_view_async_shared();  // (the generic proxy's writes, before the async proxy reads them)
  __syncwarp();
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < ceil_div(DK, 32); ++c)
      tma_store_4d(to, o_tile + c * 64 * kSwizzleRowBytes + (warp & 3) * 16 * kSwizzleRowBytes, c * 32, i0 + wr, h, b);
    bulk_commit();
  }
}

// A consumer warp's last TMA stores have read its slice, before the CTA's shared memory goes away. Called inside the
// consumer branches: the same test after the producer / consumer split kept its operands live through the producer's
// 24 registers, which spilled.
template <bool kViaSmem>
__device__ __forceinline__ void o_stores_read(int lane) {
  if (kViaSmem && lane == 0) bulk_wait_read<0>();
}

// The epilogue of one consumer warp: through shared memory where the kernel has the output tile (kViaSmem), else
// each thread's fragment stored directly. qr = lane / 4, qc = (lane % 4) * 2: the thread's row and first column in
// each 16 x 8 tile (from the caller, where they were computed before: the kernels without the tile keep their SASS).
template <typename Elem, int DK, bool kViaSmem>
__device__ __forceinline__ void write_tile_out(const CUtensorMap* to, const KParams& p, uint32_t o_tile, int b, int h,
                                               int i0, int wr, const float (&acc_o)[1][DK / 8][4],
                                               const float (&row_max)[2], const float (&row_sum)[2], int qr, int qc,
                                               int warp, int lane) {
  if constexpr (kViaSmem)
    store_o_via_smem<Elem, DK>(to, p, o_tile, b, h, i0, wr, acc_o, row_max, row_sum, qr, qc, warp, lane);
  else
    write_out_rows<Elem, 1, DK / 8>(static_cast<Elem*>(p.o), p, b, h, i0, wr, acc_o,
                                    reinterpret_cast<const float (&)[1][2]>(row_max),
                                    reinterpret_cast<const float (&)[1][2]>(row_sum), qr, qc);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
