// Score terms of the window-mode kernels (fwd_windows_sm90.h, bwd_windows_sm90.h). Every window of a CTA shares
// the additive term (the planner groups windows by its period), so when it is the only term ("fast path": no bool
// mask, key padding or band) it is converted once per CTA into an fp32 table in accumulator-fragment order
// ([NT][128 threads] float4), scaled by log2(e) and with -inf in the columns past Sk: one FMA per score after that.
#pragma once
#include "../kernel_params.h"
#include "../utils.h"

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
// first row is wr; the caller has waited for the tile.
template <int NT>
__device__ __forceinline__ void build_term_table(float4* sTerm, const unsigned char* sBias, const KParams& p, int wr,
                                                 int tid) {
  const int lane = tid & 31, qr = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = wr + qr + (i >> 1) * 8, c = nt * 8 + qc + (i & 1);
      e[i] = c >= p.Sk ? -INFINITY : (sBias != nullptr && r < p.Sq) ? staged_term(sBias, p, r, c) * kLog2e : 0.f;
    }
    sTerm[nt * 128 + tid] = make_float4(e[0], e[1], e[2], e[3]);
  }
}

// Raw Q K^T accumulator -> log2-unit scores with the term applied.
template <int NT>
__device__ __forceinline__ void apply_term_table(float (&acc)[NT][4], const float4* sTerm, float scale_log2,
                                                 int tid) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float4 e = sTerm[nt * 128 + tid];
    acc[nt][0] = fmaf(acc[nt][0], scale_log2, e.x);
    acc[nt][1] = fmaf(acc[nt][1], scale_log2, e.y);
    acc[nt][2] = fmaf(acc[nt][2], scale_log2, e.z);
    acc[nt][3] = fmaf(acc[nt][3], scale_log2, e.w);
  }
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
