// Online softmax (flash-attention 2 style) over scores already in log2 units, with rows that may be fully hidden:
// such rows keep max = -inf, use 0 as the exponent base (exp2(-inf) = 0, no NaN), and end with sum 0.
#pragma once
#include "utils.h"

namespace winattn {
namespace cuda {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int MT>
struct OnlineSoftmax {
  float row_max[MT][2];
  float row_sum[MT][2];  // per-thread partial sums; reduced over the quad at the end

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        row_max[mt][hf] = -INFINITY;
        row_sum[mt][hf] = 0.f;
      }
  }

  // s: [MT][NT][4] log2-unit scores -> unnormalized probabilities; acc_o rescaled.
  template <int NT, int DT>
  __device__ __forceinline__ void update(float (&s)[MT][NT][4], float (&acc_o)[MT][DT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float m = row_max[mt][hf];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) m = fmaxf(m, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        m = quad_max(m);
        const float base = m == -INFINITY ? 0.f : m;
        const float corr = fast_exp2(row_max[mt][hf] - base);
        row_max[mt][hf] = m;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = fast_exp2(s[mt][nt][2 * hf + e] - base);
            s[mt][nt][2 * hf + e] = pv;
            sum += pv;
          }
        row_sum[mt][hf] = row_sum[mt][hf] * corr + sum;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          acc_o[mt][dt][2 * hf] *= corr;
          acc_o[mt][dt][2 * hf + 1] *= corr;
        }
      }
  }
};

}  // namespace cuda
}  // namespace winattn
