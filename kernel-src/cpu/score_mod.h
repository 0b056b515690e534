// Score modifiers applied to a tile of raw scores s = (scale * q) . k: additive bias (any broadcast, any float
// dtype), Swin relative-position table gathered through rel_index, bool mask, key padding, causal/window band.
// Masked scores become -inf; the softmax turns them into exact zeros. ISA-specific (convert_row uses Vec);
// included without an include guard inside the ISA namespace.

// s[j] += table[idx[j * isk] * tsr] for j < n: the relative-position term of one score row, gathered W values at a
// time into a vector (Vec::gather). Why: written as one loop over plain pointers, the compiler had to assume that
// every store to s may change table or idx, so it ran one element at a time with a store -> load dependence: the
// hottest loop of apply() on a 7x7 window.
inline void add_table_term(float* s, const float* table, int64_t tsr, const int64_t* idx, int64_t isk, int64_t n) {
  constexpr int64_t W = Vec::W;
  int64_t j = 0;
  for (; j + W <= n; j += W) (Vec::load(s + j) + Vec::gather(table, tsr, idx + j * isk, isk)).store(s + j);
  for (; j < n; ++j) s[j] += table[idx[j * isk] * tsr];
}

struct ScoreMods {
  const void* bias = nullptr;
  DType bias_t = DType::kFloat32;
  int64_t bias_row0 = 0, bias_sq = 0, bias_sk = 0;  // element offset at (b, h, 0, 0), row/col strides
  const bool* mask = nullptr;
  int64_t mask_row0 = 0, mask_sq = 0, mask_sk = 0;
  const float* table = nullptr;  // rel_table + h * stride_h
  int64_t table_sr = 0;
  const int64_t* index = nullptr;
  int64_t index_sq = 0, index_sk = 0;
  const bool* kp = nullptr;  // key_padding + b * stride_b
  int64_t kp_sk = 0;
  Band band;

  ScoreMods(const FwdParams& p, int64_t b, int64_t h) : band(p) {
    if (p.bias.ptr) {
      bias = p.bias.ptr;
      bias_t = p.bias.dtype;
      bias_row0 = row_offset(p.bias, b, h, 0);
      bias_sq = p.bias.rows == 1 ? 0 : p.bias.stride_q;
      bias_sk = col_stride(p.bias);
    }
    if (p.mask.ptr) {
      mask = static_cast<const bool*>(p.mask.ptr);
      mask_row0 = row_offset(p.mask, b, h, 0);
      mask_sq = p.mask.rows == 1 ? 0 : p.mask.stride_q;
      mask_sk = col_stride(p.mask);
    }
    if (p.rel_table) {
      table = p.rel_table + h * p.table_stride_h;
      table_sr = p.table_stride_r;
      index = p.rel_index;
      index_sq = p.index_stride_q;
      index_sk = p.index_stride_k;
    }
    if (p.key_padding) {
      kp = p.key_padding + b * p.kp_stride_b;
      kp_sk = p.kp_stride_k;
    }
  }

  // Column term of key tile [j0, j0 + nk) padded to npad: 0 for visible keys, -inf for padded-out keys and the
  // padding columns (exactly these two values: apply() selects by them). Returns false when it is all zeros (no
  // key padding, no padding columns).
  bool column_term(int64_t j0, int64_t nk, int64_t npad, float* colb) const {
    if (!kp && nk == npad) return false;
    for (int64_t j = 0; j < nk; ++j) colb[j] = (!kp || kp[(j0 + j) * kp_sk]) ? 0.f : kNegInf;
    for (int64_t j = nk; j < npad; ++j) colb[j] = kNegInf;
    return true;
  }

  // Tile rows i0 .. i0 + mq, keys j0 .. j0 + nk (row stride lds, npad columns; colb from column_term or null).
  void apply(float* S, int64_t lds, int64_t i0, int64_t mq, int64_t j0, int64_t nk, int64_t npad,
             const float* colb) const {
    for (int64_t r = 0; r < mq; ++r) {
      float* s = S + r * lds;
      const int64_t i = i0 + r;
      if (bias) {
        const int64_t off = bias_row0 + i * bias_sq + j0 * bias_sk;
        if (bias_sk == 1) {
          // The tile loops visit the tile below next (rows + mq, same keys): fetch its bias row now. A full
          // [Sq, Sk] bias is the one operand streamed from memory rather than cache, and its rows are strided.
          if (bias_sq != 0 && i + mq < band.sq) {
            const char* next = static_cast<const char*>(bias) + (off + mq * bias_sq) * elem_size(bias_t);
            for (int64_t x = 0; x < nk * elem_size(bias_t); x += 64) __builtin_prefetch(next + x, 0, 3);
          }
          convert_row<true>(s, bias, bias_t, off, nk);
        } else if (bias_sk == 0) {
          const float c = to_float(bias, bias_t, off);
          for (int64_t j = 0; j < nk; ++j) s[j] += c;
        } else {
          for (int64_t j = 0; j < nk; ++j) s[j] += to_float(bias, bias_t, off + j * bias_sk);
        }
      }
      if (table) add_table_term(s, table, table_sr, index + i * index_sq + j0 * index_sk, index_sk, nk);
      if (mask) {
        const bool* m = mask + mask_row0 + i * mask_sq + j0 * mask_sk;
        for (int64_t j = 0; j < nk; ++j) s[j] = m[j * mask_sk] ? s[j] : kNegInf;
      }
      if (colb) {  // select, not add: a NaN score of a padded-out key must stay hidden (Vec::hide)
        int64_t j = 0;
        for (; j + Vec::W <= npad; j += Vec::W) Vec::hide(Vec::load(s + j), Vec::load(colb + j)).store(s + j);
        for (; j < npad; ++j) s[j] = colb[j] == 0.f ? s[j] : colb[j];
      }
      if (band.active()) {
        const int64_t lo = std::min<int64_t>(npad, std::max<int64_t>(0, band.lo(i) - j0));
        const int64_t hi = std::max<int64_t>(0, std::min<int64_t>(npad, band.hi(i) - j0 + 1));
        for (int64_t j = 0; j < lo; ++j) s[j] = kNegInf;
        for (int64_t j = std::max(hi, lo); j < npad; ++j) s[j] = kNegInf;
      }
    }
  }
};
