// Online softmax (flash-attention 2 style) over scores already in log2 units, and the row policy every forward
// shares: rows that may be fully hidden keep max = -inf, use 0 as the exponent base (softmax_base) and end with sum
// 0; finalize_row turns a row's max and sum into the factor of its output and its lse (empty rows, NaN rows).
#pragma once
#include "utils.h"

namespace winattn {
namespace cuda {

// 2^x (ex2.approx: 2^-inf = 0, and a NaN argument gives NaN, which is how a NaN score reaches the row's sum).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- the row policy -------------------------------------------------------------------------------------------
// The README's promise for every forward: a row whose keys are all hidden returns out = 0 and lse = -inf (its
// gradients are then 0); a NaN in q, k, the bias or the table gives NaN out and NaN lse in every row whose visible
// scores it reaches, as SDPA does. Every forward keeps, per row, a running max m in log2 units (the scores it
// exponentiates are s * scale * log2(e) + term * log2(e); m = -inf while the row has seen no visible key) and the
// sum l = sum_j 2^(s_j - m). Hidden keys are -inf by then.
//
// Where a NaN enters: not through the max. The kernels take it with fmaxf, which drops NaN (fmaxf(NaN, x) = x), so
// m is the max of the row's other scores, and -inf when every score of the row is NaN (a NaN in q). It enters
// through the exponent: p = 2^(NaN - base) = NaN, summed into l and, through P V, into the output accumulator. The
// base stays finite (softmax_base), and the NaN stays in its own rows.
//
// So l decides, and it must be tested with l == 0 alone: a NaN compares false with everything, so `l > 0 ? .. : -inf`
// turned a NaN row's lse into -inf (v1 and the window forward did), and `m == -inf` would take a row of NaN scores
// (a NaN in q) for an empty one. A row that saw a visible key has l >= ~1 (its max contributes 2^0), so l == 0 is
// exactly "no visible key".

// The exponent base of a row with running max m: m, or 0 while the row has seen no key (2^(-inf - 0) = 0, where
// 2^(-inf - (-inf)) would be NaN).
__device__ __forceinline__ float softmax_base(float m) { return m == -INFINITY ? 0.f : m; }

// What a forward writes for a row (see the row policy above), from m, the row's running max in log2 units (-inf:
// no key seen), and l, its whole sum (every thread's share reduced). Each result is computed where it is asked for,
// so an epilogue that writes lse from one lane of four, for rows inside the tile, pays log2f there only (computed
// up front, it raised the spills of v3's D = 256 staged-term kernel).
struct RowFinal {
  float m, l;
  // Multiplies the row's unnormalized output accumulator: 1 / l; 0 for an empty row; NaN for a NaN row.
  __device__ __forceinline__ float scale() const { return empty() ? 0.f : 1.f / l; }
  // Log-sum-exp of the row's scores in log2 units (what split-KV partials merge in): -inf for an empty row; NaN for
  // a NaN row.
  __device__ __forceinline__ float lse2() const { return empty() ? -INFINITY : m + log2f(l); }
  // The same in natural log (the lse the API returns).
  __device__ __forceinline__ float lse() const { return empty() ? -INFINITY : (m + log2f(l)) * kLn2; }
  // No visible key; false for a NaN l, so a NaN row keeps NaN in every result.
  __device__ __forceinline__ bool empty() const { return l == 0.f; }
};
__device__ __forceinline__ RowFinal finalize_row(float m, float l) { return RowFinal{m, l}; }

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
        const float base = softmax_base(m);
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
