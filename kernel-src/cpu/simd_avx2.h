// 8-lane fp32 vector on AVX2 + FMA + F16C. Included (no include guard, on purpose) inside the
// `#pragma GCC target("avx2,fma,f16c")` region of winattn_cpu.cpp, so every function here and in the kernel
// headers that use it is compiled for that ISA and only ever called after the runtime CPU check.
struct Vec {
  static constexpr int W = 8;
  __m256 v;

  static Vec zero() { return {_mm256_setzero_ps()}; }
  static Vec set1(float x) { return {_mm256_set1_ps(x)}; }
  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vec bcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
  static Vec load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
  }
  static Vec load_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  // {base[idx[x * is] * bs]} for x < 8, built in registers (a staging array read back as one vector would stall on
  // store forwarding).
  static Vec gather(const float* base, int64_t bs, const int64_t* idx, int64_t is) {
    return {_mm256_setr_ps(base[idx[0] * bs], base[idx[is] * bs], base[idx[2 * is] * bs], base[idx[3 * is] * bs],
                           base[idx[4 * is] * bs], base[idx[5 * is] * bs], base[idx[6 * is] * bs],
                           base[idx[7 * is] * bs])};
  }

  static Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c
  static Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
  // term is 0 (keep s) or -inf (hide the key): a select, not s + term, so that a NaN score of a hidden key
  // stays hidden as torch's masked_fill leaves it. blendv picks by the sign bit, which only -inf has set.
  static Vec hide(Vec s, Vec term) { return {_mm256_blendv_ps(s.v, term.v, term.v)}; }

  float reduce_max() const {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  float reduce_add() const {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  // exp(x) for x <= 0 ranges used by softmax (valid for all x; |rel err| ~ 2e-7). Cephes-style: x = n ln2 + r,
  // |r| <= ln2/2, degree-6 polynomial for e^r, 2^n built in the exponent bits. x < -87.3 (incl. -inf) gives
  // exactly 0 so masked scores contribute nothing. NaN gives NaN, as std::exp: max_ps / min_ps return their
  // second operand when either is NaN, so x goes second in the clamp (the other order turned NaN into
  // exp(-87.3) and hid a NaN score from the softmax; see online_softmax_tile).
  // Underflowing lanes (x < lo) are computed as exp(0) and then zeroed, not as exp(lo): that one ends in
  // 2^-126 * e^r with e^r just below 1, a subnormal product, and a multiply with a subnormal result takes a slow
  // microcode path. Swin's shift mask (-100 on hidden pairs) sent every hidden score there: +1.8 us (+20%) on one
  // 7x7 window. The results are unchanged (those lanes are 0 either way).
  static Vec exp(Vec x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);
    const __m256 lo = _mm256_set1_ps(-87.33654475f);
    const __m256 underflow = _mm256_cmp_ps(x.v, lo, _CMP_LT_OQ);
    __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x.v));
    xc = _mm256_andnot_ps(underflow, xc);  // underflowing lanes: 0
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    xc = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), xc);
    xc = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), xc);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, xc, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, xc, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, xc, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, xc, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, xc, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(xc, xc), _mm256_add_ps(xc, _mm256_set1_ps(1.f)));
    const __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(n));
    return {_mm256_andnot_ps(underflow, y)};
  }
};

// Free functions, not in-class friends: GCC does not apply `#pragma GCC target` to friends defined in a class.
inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }

// dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 block of 32-bit values (floats or bf16 pairs; only moved).
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int x = 0; x < 8; ++x) r[x] = _mm256_loadu_ps(src + x * lds);
#pragma GCC unroll 4
  for (int x = 0; x < 8; x += 2) {
    t[x] = _mm256_unpacklo_ps(r[x], r[x + 1]);
    t[x + 1] = _mm256_unpackhi_ps(r[x], r[x + 1]);
  }
#pragma GCC unroll 2
  for (int x = 0; x < 8; x += 4) {
    r[x] = _mm256_shuffle_ps(t[x], t[x + 2], 0x44);
    r[x + 1] = _mm256_shuffle_ps(t[x], t[x + 2], 0xEE);
    r[x + 2] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0x44);
    r[x + 3] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int x = 0; x < 4; ++x) {
    _mm256_storeu_ps(dst + x * ldd, _mm256_permute2f128_ps(r[x], r[x + 4], 0x20));
    _mm256_storeu_ps(dst + (x + 4) * ldd, _mm256_permute2f128_ps(r[x], r[x + 4], 0x31));
  }
}
