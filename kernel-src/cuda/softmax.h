// The online-softmax step every forward takes (flash-attention 2 style, softmax_step: scores in log2 units, or raw
// with the factor that takes them there), and the row policy every forward shares: rows that may be fully hidden
// keep max = -inf, use 0 as the exponent base (softmax_base) and end with sum 0; finalize_row turns a row's max and
// sum into the factor of its output and its lse (empty rows, NaN rows).
#pragma once
#include <type_traits>

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

// The scale argument of softmax_step for scores already in log2 units (v1, decode, the window forward): no multiply,
// where a float 1 would still cost an FMA per score (nvcc keeps fma(s, 1, -base)).
struct Log2Units {};
__device__ __forceinline__ float to_log2(float x, float sc) { return x * sc; }
__device__ __forceinline__ float to_log2(float x, Log2Units) { return x; }
__device__ __forceinline__ float exp2_from(float s, float sc, float base) { return fast_exp2(fmaf(s, sc, -base)); }
__device__ __forceinline__ float exp2_from(float s, Log2Units, float base) { return fast_exp2(s - base); }

// Lazy rescaling (kLazy, the v3 forward; FA4's idea on Blackwell): a row keeps its exponent base, the old max, while
// a block's max exceeds it by at most kLazySlackLog2, so that corr is exactly 1 and the caller skips rescaling O
// where no row of the warp moved (rescale_o). Its probabilities then reach 2^8 = 256 at most: far from overflow in the
// fp16 / bf16 P operand and the fp32 sums. Output and lse stay exact: row_max is then the base the sums were taken
// against, which finalize_row uses (lse = base + log2(l)), not the true max.
constexpr float kLazySlackLog2 = 8.f;

// One online-softmax step: one key block, row half hf of an MMA accumulator fragment s (elements 2 hf, 2 hf + 1 of
// each n-tile: row qr + 8 hf). It exists once because v1 / decode (OnlineSoftmax::update), v3 and the window forward
// each wrote it, and the copies had drifted. Units: s * sc is log2 of the unnormalized probability (sc = scale *
// log2(e) on raw Q K^T; Log2Units for scores already in log2 units); row_max is kept in log2 units. s becomes the
// block's unnormalized probabilities 2^(s * sc - base), row_max the new max (kLazy: the base), row_sum (this
// thread's share) the corrected running sum, corr the factor the caller multiplies the row's O accumulator by,
// 2^(old max - base).
// kOnly: the row's only key block (the window forward): nothing carried in, corr = 1, and row_sum comes back whole
// (reduced over the quad). Empty rows and NaN scores: the row policy above. The shape (one row half per call, corr
// an out-parameter, kOnly's reduction here) is the one that left every caller's PTX as it was when the copies merged;
// a returned corr swapped an FMA's operands in v3, and the reduction in the caller renumbered the window forward's
// registers.
template <bool kOnly = false, bool kLazy = false, int NT, typename Scale>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], int hf, Scale sc, float& row_max, float& row_sum,
                                             float& corr) {
  // in log2 units the old max joins the block's reduction; raw scores are reduced, scaled, then joined
  constexpr bool kLog2 = std::is_same<Scale, Log2Units>::value;
  float mx = kLog2 && !kOnly ? row_max : -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
  mx = to_log2(quad_max(mx), sc);
  const float m_new = kLog2 || kOnly ? mx : fmaxf(row_max, mx);
  // kLazy: the old base stays within the slack (false while row_max is -inf: the difference is +inf or NaN)
  const bool keep = kLazy && !kOnly && m_new - row_max <= kLazySlackLog2;
  const float m = keep ? row_max : m_new;
  const float base = softmax_base(m);
  corr = kOnly || keep ? 1.f : fast_exp2(row_max - base);
  row_max = m;
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pv = exp2_from(s[nt][2 * hf + e], sc, base);
      s[nt][2 * hf + e] = pv;
      sum += pv;
    }
  row_sum = kOnly ? quad_sum(sum) : row_sum * corr + sum;
}

// The running state of v1 and the decode forward: MT row tiles, two row halves each.
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
        float corr;
        softmax_step(s[mt], hf, Log2Units(), row_max[mt][hf], row_sum[mt][hf], corr);
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
