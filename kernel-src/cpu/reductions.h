// Score-gradient reductions: dS tiles added into a broadcast-shaped fp32 accumulator (dbias in the bias's own
// shape, or the per-head [H, Sq, Sk] accumulator of the relative-position table). Size-1 dims of the target sum
// over the tile's rows/columns. Each accumulator is written by one task at a time (see bwd_kernel.h), so plain
// adds in a fixed order: deterministic. ISA-specific; no include guard.

inline void sink_add_tile(const DsSink& sk, int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk,
                          const float* dS, int64_t lds) {
  float* slab = sk.base + ((b % sk.period) * sk.heads + (sk.heads == 1 ? 0 : h)) * sk.rows * sk.cols;
  for (int64_t r = 0; r < mq; ++r) {
    const float* src = dS + r * lds;
    float* dst = slab + (sk.rows == 1 ? 0 : (i0 + r)) * sk.cols;
    if (sk.cols == 1) {
      float acc = 0.f;
      for (int64_t j = 0; j < nk; ++j) acc += src[j];
      dst[0] += acc;
    } else {
      dst += j0;
      int64_t j = 0;
      for (; j + Vec::W <= nk; j += Vec::W) (Vec::load(dst + j) + Vec::load(src + j)).store(dst + j);
      for (; j < nk; ++j) dst[j] += src[j];
    }
  }
}
