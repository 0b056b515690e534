// Softmax pieces: the forward's online (running max / running sum) update per k-tile, and the backward's
// recomputation of P from the saved log-sum-exp. ISA-specific; no include guard (see winattn_cpu.cpp).

// Folds the score tile S [mq][npad] into the running state of each row: m (max), l (sum of exp), O (unnormalized
// output, rescaled by exp(m_old - m_new) when the max grows). S is overwritten with p = exp(s - m_new), which is
// 0 for masked scores and for rows that have seen no visible key yet (their max is -inf: exp is taken relative
// to 0 instead, and exp(-inf) = 0). With `pb` (bf16 dot-product build only) p is written rounded to bf16 into
// pb [mq][ldpb] instead of S.
// NaN (a NaN in q, k, bias or the table) propagates as in SDPA without a per-element test: the maxima below may
// drop a NaN (max_ps / std::max return the non-NaN operand), which keeps m finite for the rescale, but exp(NaN)
// is NaN, so the row's sum l and output O become NaN and stay NaN over later tiles; store_outputs writes NaN out
// and lse for such rows. Hidden keys are -inf, never NaN (ScoreMods selects rather than adds), so fully masked
// rows still give 0.
// Organized in passes over all rows (maxima; rescale factors, vectorized across rows; exponentials) with several
// rows in flight, so that the per-row reductions do not serialize the loop.
inline void online_softmax_tile(float* S, int64_t lds, int64_t mq, int64_t npad, float* m, float* l, float* O,
                                int64_t ldo, int64_t D, uint16_t* pb = nullptr, int64_t ldpb = 0) {
  constexpr int64_t W = Vec::W;
  constexpr int64_t kRows = 4;
  float m_use[kFwdBlockQ + Vec::W], diff[kFwdBlockQ + Vec::W], alpha[kFwdBlockQ + Vec::W], sums[kFwdBlockQ];
  (void)pb;
  (void)ldpb;

  // 1. row maxima -> new running max; exponentials are taken relative to m_use (0 while nothing is visible).
  for (int64_t r0 = 0; r0 < mq; r0 += kRows) {
    const int64_t nr = std::min(kRows, mq - r0);
    Vec mx[kRows];
#pragma GCC unroll 4
    for (int64_t x = 0; x < kRows; ++x) mx[x] = Vec::set1(kNegInf);
    for (int64_t j = 0; j < npad; j += W)
#pragma GCC unroll 4
      for (int64_t x = 0; x < kRows; ++x)
        if (x < nr) mx[x] = Vec::max(mx[x], Vec::load(S + (r0 + x) * lds + j));
    for (int64_t x = 0; x < nr; ++x) {
      const int64_t r = r0 + x;
      const float m_new = std::max(m[r], mx[x].reduce_max());
      m_use[r] = m_new == kNegInf ? 0.f : m_new;
      diff[r] = m[r] == kNegInf ? kNegInf : m[r] - m_new;  // exp -> alpha = 0 for a first visible tile
      m[r] = m_new;
    }
  }
  // 2. rescale factors of the previous state, W rows at a time.
  for (int64_t r = mq; r < round_up(mq, W); ++r) diff[r] = 0.f;
  for (int64_t r = 0; r < mq; r += W) Vec::exp(Vec::load(diff + r)).store(alpha + r);

  // 3. p = exp(s - m_use), row sums; kRows rows interleaved.
  for (int64_t r0 = 0; r0 < mq; r0 += kRows) {
    const int64_t nr = std::min(kRows, mq - r0);
    Vec acc[kRows], vm[kRows];
#pragma GCC unroll 4
    for (int64_t x = 0; x < kRows; ++x) {
      acc[x] = Vec::zero();
      vm[x] = Vec::set1(x < nr ? m_use[r0 + x] : 0.f);
    }
    for (int64_t j = 0; j < npad; j += W)
#pragma GCC unroll 4
      for (int64_t x = 0; x < kRows; ++x)
        if (x < nr) {
          float* s = S + (r0 + x) * lds + j;
          const Vec e = Vec::exp(Vec::load(s) - vm[x]);
          acc[x] = acc[x] + e;
#if defined(WINATTN_BF16_DOT)
          if (pb) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(pb + (r0 + x) * ldpb + j), (__m128i)_mm256_cvtneps_pbh(e.v));
            continue;
          }
#endif
          e.store(s);
        }
    for (int64_t x = 0; x < nr; ++x) sums[r0 + x] = acc[x].reduce_add();
  }

  // 4. running sums and output rows.
  for (int64_t r = 0; r < mq; ++r) {
    l[r] = l[r] * alpha[r] + sums[r];
    if (alpha[r] != 1.f) {
      float* o = O + r * ldo;
      const Vec va = Vec::set1(alpha[r]);
      for (int64_t d = 0; d < D; d += W) (Vec::load(o + d) * va).store(o + d);
    }
  }
}

// P = exp(S - lse_row) in place; lse_row is +inf for rows with no visible key, which makes P = 0 there.
inline void recompute_p(float* S, int64_t lds, int64_t mq, int64_t npad, const float* lse_row) {
  int64_t r = 0;
  for (; r + 2 <= mq; r += 2) {  // two rows in flight
    float* s0 = S + r * lds;
    float* s1 = s0 + lds;
    const Vec v0 = Vec::set1(lse_row[r]), v1 = Vec::set1(lse_row[r + 1]);
    for (int64_t j = 0; j < npad; j += Vec::W) {
      Vec::exp(Vec::load(s0 + j) - v0).store(s0 + j);
      Vec::exp(Vec::load(s1 + j) - v1).store(s1 + j);
    }
  }
  for (; r < mq; ++r) {
    float* s = S + r * lds;
    const Vec vl = Vec::set1(lse_row[r]);
    for (int64_t j = 0; j < npad; j += Vec::W) Vec::exp(Vec::load(s + j) - vl).store(s + j);
  }
}

// dS = P * (dP - delta_row), written over dP.
inline void softmax_grad(const float* P, float* dP, int64_t ld, int64_t mq, int64_t npad, const float* delta_row) {
  for (int64_t r = 0; r < mq; ++r) {
    const float* p = P + r * ld;
    float* dp = dP + r * ld;
    const Vec vd = Vec::set1(delta_row[r]);
    for (int64_t j = 0; j < npad; j += Vec::W) (Vec::load(p + j) * (Vec::load(dp + j) - vd)).store(dp + j);
  }
}
