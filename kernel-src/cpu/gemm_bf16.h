// bf16 dot-product tile products for bfloat16 inputs on CPUs with AVX512-BF16 (vdpbf16ps: 16 lanes, each
// accumulating a pair of bf16 products into fp32; about twice the fp32-FMA flop rate). Used only in the
// avx512bf16 namespace of winattn_cpu.cpp, for bf16 q/k/v.
//
// Operand formats ("word" = two bf16 of consecutive reduction indices, low half = even index):
//   A: row-major bf16, row r at A + r * lda (elements); word k2 = elements 2*k2, 2*k2+1 (any bf16 row whose
//      reduction dim is contiguous: q/dO rows straight from the input, P/dS rounded by pack_bf16.h)
//   B: word-major [K2][ldb words]; column j of word row k2 = (B[2*k2][j], B[2*k2+1][j]); zero-padded to whole
//      16-lane vectors
//   C: fp32 row-major; columns past n are neither read nor written (masked).
// No include guard (see winattn_cpu.cpp).

inline uint32_t load_word(const uint16_t* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));  // unaligned-safe
  return w;
}

template <int MR, int NV>
inline void mk_dp(const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, int64_t K2, float* C, int64_t ldc,
                  __mmask16 last_mask, bool accumulate, float mul) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      const __mmask16 m = c == NV - 1 ? last_mask : static_cast<__mmask16>(0xffff);
      acc[r][c] = accumulate ? _mm512_maskz_loadu_ps(m, C + r * ldc + c * 16) : _mm512_setzero_ps();
    }
  for (int64_t k2 = 0; k2 < K2; ++k2) {
    __m512bh b[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) b[c] = (__m512bh)_mm512_loadu_si512(B + k2 * ldb + c * 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(load_word(A + r * lda + 2 * k2)));
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, b[c]);
    }
  }
  const __m512 vmul = _mm512_set1_ps(mul);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) {
      const __mmask16 m = c == NV - 1 ? last_mask : static_cast<__mmask16>(0xffff);
      _mm512_mask_storeu_ps(C + r * ldc + c * 16, m, mul == 1.f ? acc[r][c] : _mm512_mul_ps(acc[r][c], vmul));
    }
}

template <int NV>
inline void dp_rows(int64_t mr, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, int64_t K2, float* C,
                    int64_t ldc, __mmask16 last, bool accumulate, float mul) {
  switch (mr) {
    case 6: mk_dp<6, NV>(A, lda, B, ldb, K2, C, ldc, last, accumulate, mul); break;
    case 5: mk_dp<5, NV>(A, lda, B, ldb, K2, C, ldc, last, accumulate, mul); break;
    case 4: mk_dp<4, NV>(A, lda, B, ldb, K2, C, ldc, last, accumulate, mul); break;
    case 3: mk_dp<3, NV>(A, lda, B, ldb, K2, C, ldc, last, accumulate, mul); break;
    case 2: mk_dp<2, NV>(A, lda, B, ldb, K2, C, ldc, last, accumulate, mul); break;
    default: mk_dp<1, NV>(A, lda, B, ldb, K2, C, ldc, last, accumulate, mul); break;
  }
}

// C[m][n] (+)= mul * (A[m][2*K2] . B[K2][n]); 6 x 64 register blocks (24 zmm accumulators).
inline void gemm_dp(int64_t m, int64_t n, int64_t K2, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
                    float* C, int64_t ldc, bool accumulate, float mul = 1.f) {
  for (int64_t j = 0; j < n; j += 64) {
    const int64_t cols = std::min<int64_t>(64, n - j);
    const int nv = static_cast<int>(ceil_div(cols, 16));
    const int64_t rem = cols - (nv - 1) * 16;
    const __mmask16 last = static_cast<__mmask16>(rem == 16 ? 0xffff : ((1u << rem) - 1));
    for (int64_t i = 0; i < m; i += 6) {
      const int64_t mr = std::min<int64_t>(6, m - i);
      const uint16_t* a = A + i * lda;
      float* c = C + i * ldc + j;
      switch (nv) {
        case 4: dp_rows<4>(mr, a, lda, B + j, ldb, K2, c, ldc, last, accumulate, mul); break;
        case 3: dp_rows<3>(mr, a, lda, B + j, ldb, K2, c, ldc, last, accumulate, mul); break;
        case 2: dp_rows<2>(mr, a, lda, B + j, ldb, K2, c, ldc, last, accumulate, mul); break;
        default: dp_rows<1>(mr, a, lda, B + j, ldb, K2, c, ldc, last, accumulate, mul); break;
      }
    }
  }
}
