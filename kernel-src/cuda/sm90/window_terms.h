// Score terms of the window-mode kernels (fwd_windows_sm90.h, bwd_windows_sm90.h). Every window of a CTA shares
// the additive term (the planner groups windows by its period), so when it is the only term ("fast path": no bool
// mask, key padding or band) it is converted once per CTA into a table in accumulator-fragment order
// ([NT][128 threads]), with -inf in the columns past Sk: one FMA per score after that (see build_term_table).
#pragma once
#include "../kernel_params.h"
#include "../utils.h"
#include "tile_sm90.h"

namespace winattn {
namespace cuda {
namespace sm90 {

__device__ __forceinline__ bool window_fast_terms(const KParams& p) {
  return p.mask.ptr == nullptr && p.kp == nullptr && !p.has_band;
}

// Element (r, c) of the staged additive tile (raw dtype, row pitch p.bias_pitch).
__device__ __forceinline__ float staged_term(const unsigned char* s, const KParams& p, int r, int c) {
  const unsigned char* at = s + r * p.bias_pitch;
  if (p.bias.dtype == 2) return reinterpret_cast<const float*>(at)[c];
  if (p.bias.dtype == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(at)[c]);
  return __half2float(reinterpret_cast<const __half*>(at)[c]);
}

// Fill this thread's column of the table from the staged tile sBias (nullptr: no additive term). The warp's
// first row is wr, `rows` rows of the tile are real; the caller has waited for the tile.
//   kHalf = false: float4 entries, term * log2(e), -inf past Sk;
//   kHalf = true:  uint2 entries (two half2), the staged fp16 term itself (exact: the planner takes this table only
//                  for fp16 tiles), -inf past Sk; log2(e) is applied in apply_term_table.
template <int NT, bool kHalf>
__device__ __forceinline__ void build_term_table(void* sTerm, const unsigned char* sBias, const KParams& p, int wr,
                                                 int rows, int tid) {
  const int lane = tid & 31, qr = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = wr + qr + (i >> 1) * 8, c = nt * 8 + qc + (i & 1);
      e[i] = c >= p.Sk ? -INFINITY : (sBias != nullptr && r < rows) ? staged_term(sBias, p, r, c) : 0.f;
    }
    if constexpr (kHalf) {
      const __half2 lo = __floats2half2_rn(e[0], e[1]), hi = __floats2half2_rn(e[2], e[3]);
      static_cast<uint2*>(sTerm)[nt * 128 + tid] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      static_cast<float4*>(sTerm)[nt * 128 + tid] =
          make_float4(e[0] * kLog2e, e[1] * kLog2e, e[2] * kLog2e, e[3] * kLog2e);
    }
  }
}

// The kHalf table for the wide-window backward's transposed tiles (bwd_windows_wide_sm90.h: rows = keys, columns =
// queries): one warp's [NQC chunks of QC queries][QC / 8][32 lanes] (warps holding only padding keys have none),
// read straight from the fp16 term in global memory (once per CTA: no staged tile needed); -inf past Sk and past
// Sq, so padding rows and columns get P = 0 whatever their scores. The warp's first key is key0, the CTA's first
// query q0 (a split window's quarter).
template <int NQC, int QC>
__device__ __forceinline__ void build_term_table_keys(uint2* table, const KParams& p, int b, int h, int key0, int q0,
                                                      int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  const Operand4d& op = p.bias;
  const __half* t = static_cast<const __half*>(op.ptr) + int64_t(b % op.period) * op.sb + int64_t(h) * op.sh;
#pragma unroll
  for (int m = 0; m < NQC; ++m)
#pragma unroll
    for (int nt = 0; nt < QC / 8; ++nt) {
      __half e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kk = key0 + qr + (i >> 1) * 8, qq = q0 + m * QC + nt * 8 + qc + (i & 1);
        e[i] = kk < p.Sk && qq < p.Sq ? t[int64_t(qq) * op.sq + int64_t(kk) * op.sk] : __float2half(-INFINITY);
      }
      const __half2 lo = __halves2half2(e[0], e[1]), hi = __halves2half2(e[2], e[3]);
      table[(m * (QC / 8) + nt) * 32 + lane] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
}

// Raw Q K^T accumulator -> log2-unit scores with the term applied (one FMA per score; two with kHalf). Entry nt of
// thread `tid` is at nt * kStride + tid (128: a warpgroup's table, 32: one warp's) of the table at shared address
// `table` (read with ld.shared: through a generic pointer the compiler no longer knows is shared, the reads were
// generic loads waiting on the long scoreboard).
template <int NT, bool kHalf, int kStride = 128>
__device__ __forceinline__ void apply_term_table(float (&acc)[NT][4], uint32_t table, float scale_log2, int tid) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float e[4];
    if constexpr (kHalf) {
      const float2 u = lds_f32x2(table + (nt * kStride + tid) * 8);  // (two half2, moved as raw bits)
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
      e[0] = lo.x * kLog2e, e[1] = lo.y * kLog2e, e[2] = hi.x * kLog2e, e[3] = hi.y * kLog2e;
    } else {
      const float4 f = lds_f32x4(table + (nt * kStride + tid) * 16);
      e[0] = f.x, e[1] = f.y, e[2] = f.z, e[3] = f.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = fmaf(acc[nt][i], scale_log2, e[i]);
  }
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
