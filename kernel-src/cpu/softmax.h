// Softmax pieces: the forward's online (running max / running sum) update per k-tile, and the backward's
// recomputation of P from the saved log-sum-exp. ISA-specific; no include guard (see winattn_cpu.cpp).

// Folds the score tile S [mq][npad] into the running state of each row: m (max), l (sum of exp), O (unnormalized
// output, rescaled by exp(m_old - m_new) when the max grows). S is overwritten with p = exp(s - m_new), which is
// 0 for masked scores and for rows that have seen no visible key yet.
inline void online_softmax_tile(float* S, int64_t lds, int64_t mq, int64_t npad, float* m, float* l, float* O,
                                int64_t ldo, int64_t D) {
  constexpr int64_t W = Vec::W;
  for (int64_t r = 0; r < mq; ++r) {
    float* s = S + r * lds;
    Vec vmax = Vec::set1(kNegInf);
    for (int64_t j = 0; j < npad; j += W) vmax = Vec::max(vmax, Vec::load(s + j));
    const float m_new = std::max(m[r], vmax.reduce_max());
    if (m_new == kNegInf) {  // nothing visible yet: p = 0 (exp(-inf - -inf) would be NaN)
      std::memset(s, 0, sizeof(float) * npad);
      continue;
    }
    const Vec vm = Vec::set1(m_new);
    Vec vsum = Vec::zero();
    for (int64_t j = 0; j < npad; j += W) {
      const Vec e = Vec::exp(Vec::load(s + j) - vm);
      e.store(s + j);
      vsum = vsum + e;
    }
    const float alpha = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new);
    l[r] = l[r] * alpha + vsum.reduce_add();
    if (alpha != 1.f) {
      float* o = O + r * ldo;
      const Vec va = Vec::set1(alpha);
      for (int64_t d = 0; d < D; d += W) (Vec::load(o + d) * va).store(o + d);
    }
    m[r] = m_new;
  }
}

// P = exp(S - lse_row) in place; lse_row is +inf for rows with no visible key, which makes P = 0 there.
inline void recompute_p(float* S, int64_t lds, int64_t mq, int64_t npad, const float* lse_row) {
  for (int64_t r = 0; r < mq; ++r) {
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
