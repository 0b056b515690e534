// Portable 8-lane fp32 "vector" (plain arrays; the compiler maps it to whatever SIMD the baseline ISA has).
// Same interface as simd_avx2.h; used on CPUs without AVX2/FMA, on non-x86 hosts, and when
// WINATTN_CPU_ISA=generic. Included without an include guard inside its own namespace.
struct Vec {
  static constexpr int W = 8;
  float v[8];

  static Vec zero() { return set1(0.f); }
  static Vec set1(float x) {
    Vec r;
    for (int t = 0; t < W; ++t) r.v[t] = x;
    return r;
  }
  static Vec load(const float* p) {
    Vec r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static Vec bcast(const float* p) { return set1(*p); }
  static Vec gather(const float* base, int64_t bs, const int64_t* idx, int64_t is) {
    Vec r;
    for (int t = 0; t < W; ++t) r.v[t] = base[idx[t * is] * bs];
    return r;
  }
  static Vec load_bf16(const uint16_t* p) {
    Vec r;
    for (int t = 0; t < W; ++t) {
      const uint32_t bits = static_cast<uint32_t>(p[t]) << 16;
      std::memcpy(&r.v[t], &bits, 4);
    }
    return r;
  }
  static Vec load_f16(const uint16_t* p) {
    Vec r;
    for (int t = 0; t < W; ++t) r.v[t] = c10::detail::fp16_ieee_to_fp32_value(p[t]);
    return r;
  }
  void store(float* p) const { std::memcpy(p, v, sizeof(v)); }

  static Vec fma(Vec a, Vec b, Vec c) {
    for (int t = 0; t < W; ++t) c.v[t] += a.v[t] * b.v[t];
    return c;
  }
  static Vec max(Vec a, Vec b) {
    for (int t = 0; t < W; ++t) a.v[t] = a.v[t] > b.v[t] ? a.v[t] : b.v[t];
    return a;
  }
  // term is 0 (keep s) or -inf (hide the key); see simd_avx2.h.
  static Vec hide(Vec s, Vec term) {
    for (int t = 0; t < W; ++t) s.v[t] = term.v[t] == 0.f ? s.v[t] : term.v[t];
    return s;
  }
  float reduce_max() const {
    float m = v[0];
    for (int t = 1; t < W; ++t) m = v[t] > m ? v[t] : m;
    return m;
  }
  float reduce_add() const {
    float s = 0.f;
    for (int t = 0; t < W; ++t) s += v[t];
    return s;
  }
  static Vec exp(Vec x) {
    for (int t = 0; t < W; ++t) x.v[t] = std::exp(x.v[t]);
    return x;
  }
};

inline Vec operator+(Vec a, Vec b) {
  for (int t = 0; t < Vec::W; ++t) a.v[t] += b.v[t];
  return a;
}
inline Vec operator-(Vec a, Vec b) {
  for (int t = 0; t < Vec::W; ++t) a.v[t] -= b.v[t];
  return a;
}
inline Vec operator*(Vec a, Vec b) {
  for (int t = 0; t < Vec::W; ++t) a.v[t] *= b.v[t];
  return a;
}

// dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 block of 32-bit values.
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) dst[c * ldd + r] = src[r * lds + c];
}
