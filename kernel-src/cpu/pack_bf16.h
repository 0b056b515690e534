// Packing into the operand formats of gemm_bf16.h. bf16 sources are copied bit-exactly; fp32 sources (P, dS)
// are rounded to bf16 (round-to-nearest-even), as GPU flash-attention does before its P.V and dS.K products.
// No include guard (see winattn_cpu.cpp).

// Word-transpose: dst[d2 * ldd + j] = word d2 of source row j (rows j < n at src + j * stride), zero for
// n <= j < npad (npad a multiple of 8). Turns k (or v) rows into the B operand of q.k^T (or dO.v^T). 8 rows at a
// time through 8 x 8 block transposes; `tmp` is scratch of 4 * D words.
inline void pack_words_t(uint32_t* dst, int64_t ldd, const uint16_t* src, int64_t stride, int64_t n, int64_t npad,
                         int64_t D, uint32_t* tmp) {
  const int64_t D2 = D / 2;
  for (int64_t j0 = 0; j0 < npad; j0 += 8) {
    for (int64_t x = 0; x < 8; ++x) {
      if (j0 + x < n) std::memcpy(tmp + x * D2, src + (j0 + x) * stride, sizeof(uint16_t) * D);
      else std::memset(tmp + x * D2, 0, sizeof(uint32_t) * D2);
    }
    int64_t d2 = 0;
    for (; d2 + 8 <= D2; d2 += 8)
      transpose8x8(reinterpret_cast<const float*>(tmp + d2), D2, reinterpret_cast<float*>(dst + d2 * ldd + j0), ldd);
    for (; d2 < D2; ++d2)
      for (int64_t x = 0; x < 8; ++x) dst[d2 * ldd + j0 + x] = tmp[x * D2 + d2];
  }
}

// Row-pair interleave of bf16 rows: dst[r2 * ldd + d] = (src row 2*r2)[d] | (src row 2*r2+1)[d] << 16, for
// r2 < ceil(npad_rows / 2); rows >= n and columns D..ldd are zero. Turns k / v rows into the B operand of
// dS.k / P.v.
inline void pack_rows_bf16(uint32_t* dst, int64_t ldd, const uint16_t* src, int64_t stride, int64_t n,
                           int64_t npad_rows, int64_t D) {
  const int64_t n2 = ceil_div(npad_rows, 2);
  for (int64_t r2 = 0; r2 < n2; ++r2) {
    uint32_t* out = dst + r2 * ldd;
    const int64_t r0 = 2 * r2, r1 = 2 * r2 + 1;
    if (r0 >= n) {
      std::memset(out, 0, sizeof(uint32_t) * ldd);
      continue;
    }
    const uint16_t* a = src + r0 * stride;
    const uint16_t* b = r1 < n ? src + r1 * stride : nullptr;
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d)));
      const __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d)))
                           : _mm512_setzero_si512();
      _mm512_storeu_si512(out + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
    for (; d < D; ++d) out[d] = static_cast<uint32_t>(a[d]) | (b ? static_cast<uint32_t>(b[d]) << 16 : 0u);
    for (; d < ldd; ++d) out[d] = 0;
  }
}

// fp32 -> bf16 bits (RNE) of 16 floats, zero-extended into 32-bit lanes.
inline __m512i bf16_bits(const float* p, __mmask16 m) {
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, p)));
}

// Rounds fp32 rows to bf16 rows: dst[r * ldd + j] for j < n (n even, a multiple of 16 is fastest).
inline void round_rows_bf16(uint16_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t m, int64_t n) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; j += 16) {
      const int64_t rem = std::min<int64_t>(16, n - j);
      const __mmask16 mk = static_cast<__mmask16>(rem == 16 ? 0xffff : ((1u << rem) - 1));
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, src + r * lds + j));
      _mm256_mask_storeu_epi16(dst + r * ldd + j, mk, h);
    }
  }
}

// Row-pair interleave of fp32 rows rounded to bf16: dst[r2 * ldd + j] = bf16(src[2*r2][j]) |
// bf16(src[2*r2+1][j]) << 16 for j < n (n a multiple of 16), r2 < ceil(m / 2); a missing odd row is zero.
// Turns P / dS into the B operand of dO^T.P / q^T.dS.
inline void pack_rows_f32(uint32_t* dst, int64_t ldd, const float* src, int64_t lds, int64_t m, int64_t n) {
  for (int64_t r2 = 0; r2 < ceil_div(m, 2); ++r2) {
    const float* a = src + 2 * r2 * lds;
    const bool has_b = 2 * r2 + 1 < m;
    for (int64_t j = 0; j < n; j += 16) {
      const __m512i lo = bf16_bits(a + j, 0xffff);
      const __m512i hi = has_b ? bf16_bits(a + lds + j, 0xffff) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + r2 * ldd + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// Transposed row-pair interleave of whole q / dO (one (b, h)): dst[d * ldd + i2] = x[2*i2][d] | x[2*i2+1][d] << 16
// for i2 < ceil(S / 2) (missing odd row: 0). The A operand of dO^T.P and q^T.dS, built once per backward.
inline void pack_pairs_t(uint32_t* dst, int64_t ldd, const uint16_t* src, int64_t stride, int64_t S, int64_t D) {
  for (int64_t i2 = 0; i2 < ceil_div(S, 2); ++i2) {
    const uint16_t* a = src + 2 * i2 * stride;
    const uint16_t* b = 2 * i2 + 1 < S ? a + stride : nullptr;
    for (int64_t d = 0; d < D; ++d)
      dst[d * ldd + i2] = static_cast<uint32_t>(a[d]) | (b ? static_cast<uint32_t>(b[d]) << 16 : 0u);
  }
}
