// Score terms added inside the softmax, computed directly in the mma accumulator layout (no [B,H,Sq,Sk] tensor is
// ever formed): the strided/broadcast additive bias, the expanded relative-position table term, the bool mask, the
// key-padding mask, the causal / sliding-window band and the sequence-end columns.
//
// Output is in log2 units (scores are kept as s * log2(e) so the softmax uses exp2); -inf marks a hidden key.
// Split in two parts so the batch-independent part (table term, band, column end) can be cached across the items of
// a window-mode CTA: terms_static() and terms_batch().
#pragma once
#include "kernel_params.h"
#include "utils.h"

namespace winattn {
namespace cuda {

__device__ __forceinline__ float ld_scalar(const void* base, int dtype, int64_t off) {
  if (dtype == 2) return __ldg(static_cast<const float*>(base) + off);
  if (dtype == 1) return __bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(base) + off));
  return __half2float(__ldg(static_cast<const __half*>(base) + off));
}
__device__ __forceinline__ float2 ld_pair(const void* base, int dtype, int64_t off) {  // off even, aligned
  if (dtype == 2) return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + off));
  if (dtype == 1)
    return __bfloat1622float2(__ldg(reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(base) + off)));
  return __half22float2(__ldg(reinterpret_cast<const __half2*>(static_cast<const __half*>(base) + off)));
}

// Bias values at columns (j, j + 1) of the row starting at element offset row_off (0 past Sk).
__device__ __forceinline__ float2 bias_pair(const Operand4d& op, int64_t row_off, int j, int Sk) {
  if (op.cols == 1) {
    const float x = ld_scalar(op.ptr, op.dtype, row_off);
    return make_float2(x, x);
  }
  if (op.vec2 && j + 1 < Sk) return ld_pair(op.ptr, op.dtype, row_off + j);
  float2 r;
  r.x = j < Sk ? ld_scalar(op.ptr, op.dtype, row_off + j * op.sk) : 0.f;
  r.y = j + 1 < Sk ? ld_scalar(op.ptr, op.dtype, row_off + (j + 1) * op.sk) : 0.f;
  return r;
}

// Bool mask at (j, j + 1): true = attend (false past Sk).
__device__ __forceinline__ void mask_pair(const Operand4d& op, int64_t row_off, int j, int Sk, bool& m0, bool& m1) {
  const unsigned char* base = static_cast<const unsigned char*>(op.ptr);
  if (op.cols == 1) {
    m0 = m1 = __ldg(base + row_off) != 0;
    return;
  }
  if (op.vec2 && j + 1 < Sk) {
    const unsigned short x = __ldg(reinterpret_cast<const unsigned short*>(base + row_off + j));
    m0 = (x & 0xff) != 0;
    m1 = (x >> 8) != 0;
    return;
  }
  m0 = j < Sk ? __ldg(base + row_off + j * op.sk) != 0 : false;
  m1 = j + 1 < Sk ? __ldg(base + row_off + (j + 1) * op.sk) != 0 : false;
}

// Batch-independent terms for the warp tile whose first row is i_w and first column j_w:
// table term (log2 units) where visible, -inf past Sk or outside the band.
template <int MT, int NT>
__device__ __forceinline__ void terms_static(float (&out)[MT][NT][4], const KParams& p, int h, int i_w, int j_w,
                                             int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = i_w + mt * 16 + qr + hf * 8;
      const bool row_ok = i < p.Sq;
      const float* tbrow = p.tb ? p.tb + (int64_t(h) * p.Sq + (row_ok ? i : 0)) * p.Sk : nullptr;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int j = j_w + nt * 8 + qc;
        float a0 = 0.f, a1 = 0.f;
        if (tbrow != nullptr && row_ok) {
          if (j + 1 < p.Sk && (p.Sk & 1) == 0) {
            const float2 x = __ldg(reinterpret_cast<const float2*>(tbrow + j));
            a0 = x.x;
            a1 = x.y;
          } else {
            a0 = j < p.Sk ? __ldg(tbrow + j) : 0.f;
            a1 = j + 1 < p.Sk ? __ldg(tbrow + j + 1) : 0.f;
          }
          a0 *= kLog2e;
          a1 *= kLog2e;
        }
        bool v0 = j < p.Sk, v1 = j + 1 < p.Sk;
        if (p.has_band) {
          const int64_t d = int64_t(j) - i;
          v0 = v0 && d >= p.band_lo && d <= p.band_hi;
          v1 = v1 && d + 1 >= p.band_lo && d + 1 <= p.band_hi;
        }
        out[mt][nt][2 * hf] = v0 ? a0 : -INFINITY;
        out[mt][nt][2 * hf + 1] = v1 ? a1 : -INFINITY;
      }
    }
}

// Batch-dependent terms added onto `out`: additive bias, bool mask, key padding.
template <int MT, int NT>
__device__ __forceinline__ void terms_batch(float (&out)[MT][NT][4], const KParams& p, int b, int h, int i_w,
                                            int j_w, int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  const bool has_bias = p.bias.ptr != nullptr, has_mask = p.mask.ptr != nullptr, has_kp = p.kp != nullptr;
  if (!has_bias && !has_mask && !has_kp) return;
  // key padding depends on the column only
  bool kp[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int j = j_w + nt * 8 + qc;
    kp[nt][0] = kp[nt][1] = true;
    if (has_kp) {
      const bool* row = p.kp + int64_t(b) * p.kp_sb;
      kp[nt][0] = j < p.Sk ? __ldg(reinterpret_cast<const unsigned char*>(row + int64_t(j) * p.kp_sk)) != 0 : false;
      kp[nt][1] =
          j + 1 < p.Sk ? __ldg(reinterpret_cast<const unsigned char*>(row + int64_t(j + 1) * p.kp_sk)) != 0 : false;
    }
  }
  const int64_t bias_bh = has_bias ? int64_t(b % p.bias.period) * p.bias.sb + int64_t(h) * p.bias.sh : 0;
  const int64_t mask_bh = has_mask ? int64_t(b % p.mask.period) * p.mask.sb + int64_t(h) * p.mask.sh : 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = i_w + mt * 16 + qr + hf * 8;
      const bool row_ok = i < p.Sq;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int j = j_w + nt * 8 + qc;
        float a0 = 0.f, a1 = 0.f;
        if (has_bias && row_ok) {
          const float2 x = bias_pair(p.bias, bias_bh + int64_t(i) * p.bias.sq, j, p.Sk);
          a0 = x.x * kLog2e;
          a1 = x.y * kLog2e;
        }
        bool v0 = kp[nt][0], v1 = kp[nt][1];
        if (has_mask && row_ok) {
          bool m0, m1;
          mask_pair(p.mask, mask_bh + int64_t(i) * p.mask.sq, j, p.Sk, m0, m1);
          v0 = v0 && m0;
          v1 = v1 && m1;
        }
        out[mt][nt][2 * hf] = v0 ? out[mt][nt][2 * hf] + a0 : -INFINITY;
        out[mt][nt][2 * hf + 1] = v1 ? out[mt][nt][2 * hf + 1] + a1 : -INFINITY;
      }
    }
}

}  // namespace cuda
}  // namespace winattn
