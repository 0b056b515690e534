// Tile loads/stores: every q/k/v/dO tile is converted to fp32 once, into a layout the micro-kernels stream
// through (natural [rows][D] or transposed [D][cols] zero-padded to a whole number of vectors).
// ISA-specific (uses Vec); included without an include guard inside the ISA namespace.

// dst[x] (+)= float(src[x]) for x < n; src = base + offset elements of dtype t, contiguous.
template <bool kAccumulate>
inline void convert_row(float* dst, const void* base, DType t, int64_t offset, int64_t n, float mul = 1.f) {
  const Vec vm = Vec::set1(mul);
  int64_t x = 0;
  auto put = [&](int64_t at, Vec val) {
    if (kAccumulate) val = val + Vec::load(dst + at);
    val.store(dst + at);
  };
  switch (t) {
    case DType::kFloat32: {
      const float* s = static_cast<const float*>(base) + offset;
      for (; x + Vec::W <= n; x += Vec::W) put(x, Vec::load(s + x) * vm);
      for (; x < n; ++x) dst[x] = (kAccumulate ? dst[x] : 0.f) + s[x] * mul;
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
      for (; x + Vec::W <= n; x += Vec::W) put(x, Vec::load_bf16(s + x) * vm);
      break;
    }
    case DType::kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
      for (; x + Vec::W <= n; x += Vec::W) put(x, Vec::load_f16(s + x) * vm);
      break;
    }
  }
  for (; x < n; ++x) dst[x] = (kAccumulate ? dst[x] : 0.f) + to_float(base, t, offset + x) * mul;
}

// n rows of D elements (row r at element offset + r * stride) -> dst[r * ldd + d], scaled by mul.
inline void load_rows(float* dst, int64_t ldd, const void* base, DType t, int64_t offset, int64_t stride,
                      int64_t n, int64_t D, float mul = 1.f) {
  for (int64_t r = 0; r < n; ++r) convert_row<false>(dst + r * ldd, base, t, offset + r * stride, D, mul);
}

// Same rows, transposed: dst[d * ldd + r]; columns r in [n, npad) are zero (padding to whole vectors).
// `row` is scratch of D floats.
inline void load_rows_t(float* dst, int64_t ldd, const void* base, DType t, int64_t offset, int64_t stride,
                        int64_t n, int64_t npad, int64_t D, float* row) {
  for (int64_t r = 0; r < n; ++r) {
    convert_row<false>(row, base, t, offset + r * stride, D);
    for (int64_t d = 0; d < D; ++d) dst[d * ldd + r] = row[d];
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t r = n; r < npad; ++r) dst[d * ldd + r] = 0.f;
}
