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

// Same rows, transposed: dst[d * ldd + r]; columns r in [n, npad) are zero (padding to whole vectors; npad a
// multiple of 8). `tmp` is scratch of 8 * D floats: rows are converted 8 at a time, then moved by 8 x 8 block
// transposes (a scalar scatter with stride ldd would cost about as much as a tile product at small q blocks).
inline void load_rows_t(float* dst, int64_t ldd, const void* base, DType t, int64_t offset, int64_t stride,
                        int64_t n, int64_t npad, int64_t D, float* tmp) {
  for (int64_t r0 = 0; r0 < npad; r0 += 8) {
    for (int64_t x = 0; x < 8; ++x) {
      if (r0 + x < n) convert_row<false>(tmp + x * D, base, t, offset + (r0 + x) * stride, D);
      else std::memset(tmp + x * D, 0, sizeof(float) * D);
    }
    for (int64_t d = 0; d < D; d += 8) transpose8x8(tmp + d, D, dst + d * ldd + r0, ldd);
  }
}
