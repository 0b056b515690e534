// Warp-level tile GEMMs on mma.sync m16n8k16 with operands in shared memory (ldmatrix) or registers.
//
// A warp computes acc[MT][NT] (MT 16-row tiles x NT 8-column tiles) += A (16*MT x 16*KSTEPS) * B (16*KSTEPS x 8*NT).
// Shared-memory operand layouts (all row-major with a leading dimension in elements, rows padded by 8 elements so
// ldmatrix is bank-conflict free):
//   A "MK": A[r][k] at a[r * lda + k]        (Q for S = Q K^T, dS for dQ = dS K)
//   A "KM": A[r][k] at a[k * lda + r]        (P^T / dS^T read from P / dS tiles)
//   B "NK": B[k][c] at b[c * ldb + k]        (K for S = Q K^T, V for dP = dO V^T)
//   B "KN": B[k][c] at b[k * ldb + c]        (V for O = P V, dO / Q / K in the backward)
#pragma once
#include "utils.h"

namespace winattn {
namespace cuda {

template <bool KM, typename Elem>
__device__ __forceinline__ void load_a_frag(uint32_t (&f)[4], const Elem* a, int lda, int r0, int k0, int lane) {
  if constexpr (!KM) {
    ldsm_x4(f, a + (r0 + (lane & 15)) * lda + k0 + (lane >> 4) * 8);
  } else {
    ldsm_x4_t(f, a + (k0 + (lane & 7) + (lane >> 4) * 8) * lda + r0 + ((lane >> 3) & 1) * 8);
  }
}

// Two adjacent 8-column B tiles (c0 .. c0 + 15) for one 16-deep k step: f[0..1] tile 0, f[2..3] tile 1.
template <bool KN, typename Elem>
__device__ __forceinline__ void load_b_frag2(uint32_t (&f)[4], const Elem* b, int ldb, int c0, int k0, int lane) {
  if constexpr (!KN) {
    ldsm_x4(f, b + (c0 + (lane & 7) + (lane >> 4) * 8) * ldb + k0 + ((lane >> 3) & 1) * 8);
  } else {
    ldsm_x4_t(f, b + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldb + c0 + (lane >> 4) * 8);
  }
}

template <typename Elem, int MT, int NT, int KSTEPS, bool A_KM, bool B_KN>
__device__ __forceinline__ void gemm_ss(float (&acc)[MT][NT][4], const Elem* a, int lda, const Elem* b, int ldb,
                                        int lane) {
  static_assert(NT % 2 == 0, "B tiles are loaded in pairs");
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a_frag<A_KM>(af[mt], a, lda, mt * 16, ks * 16, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bf[4];
      load_b_frag2<B_KN>(bf, b, ldb, np * 16, ks * 16, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<Elem>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
        mma16816<Elem>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
      }
    }
  }
}

// A from registers: af[MT][KSTEPS][4] in the m16k16 A-fragment layout.
template <typename Elem, int MT, int NT, int KSTEPS, bool B_KN>
__device__ __forceinline__ void gemm_rs(float (&acc)[MT][NT][4], const uint32_t (&af)[MT][KSTEPS][4], const Elem* b,
                                        int ldb, int lane) {
  static_assert(NT % 2 == 0, "B tiles are loaded in pairs");
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bf[4];
      load_b_frag2<B_KN>(bf, b, ldb, np * 16, ks * 16, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<Elem>(acc[mt][2 * np], af[mt][ks], bf[0], bf[1]);
        mma16816<Elem>(acc[mt][2 * np + 1], af[mt][ks], bf[2], bf[3]);
      }
    }
  }
}

// Accumulator (C layout, fp32) -> A fragments (k16 = two adjacent 8-column tiles), rounded to Elem.
template <typename Elem, int MT, int NT>
__device__ __forceinline__ void acc_to_afrag(uint32_t (&af)[MT][NT / 2][4], const float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
      af[mt][kk][0] = ElemTraits<Elem>::pack(acc[mt][2 * kk][0], acc[mt][2 * kk][1]);
      af[mt][kk][1] = ElemTraits<Elem>::pack(acc[mt][2 * kk][2], acc[mt][2 * kk][3]);
      af[mt][kk][2] = ElemTraits<Elem>::pack(acc[mt][2 * kk + 1][0], acc[mt][2 * kk + 1][1]);
      af[mt][kk][3] = ElemTraits<Elem>::pack(acc[mt][2 * kk + 1][2], acc[mt][2 * kk + 1][3]);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// Accumulator -> shared memory tile (row-major, leading dimension ld), rounded to Elem.
template <typename Elem, int MT, int NT>
__device__ __forceinline__ void acc_to_smem(Elem* s, int ld, const float (&acc)[MT][NT][4], int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        *reinterpret_cast<uint32_t*>(s + (mt * 16 + qr + hf * 8) * ld + nt * 8 + qc) =
            ElemTraits<Elem>::pack(acc[mt][nt][2 * hf], acc[mt][nt][2 * hf + 1]);
      }
}

}  // namespace cuda
}  // namespace winattn
