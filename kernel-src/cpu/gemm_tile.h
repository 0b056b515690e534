// Register-blocked fp32 tile products (the flops of the kernel). Each micro-kernel keeps an MR x (NV * W)
// block of C in registers (6 x 16 on AVX2: 12 accumulators + 2 loads + 1 broadcast = 15 of 16 ymm) and streams
// the reduction dim, broadcasting one A element per row and loading NV vectors of B per step.
// ISA-specific; included without an include guard inside the ISA namespace.

// C[i][j] = sum_k A[i][k] * BT[k][j]   (A [m][K] row stride lda; BT [K][n] row stride ldb; n % W == 0).
template <int MR, int NV>
inline void mk_nt(const float* A, int64_t lda, const float* BT, int64_t ldb, int64_t K, float* C, int64_t ldc) {
  Vec acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = Vec::zero();
  for (int64_t k = 0; k < K; ++k) {
    Vec b[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) b[c] = Vec::load(BT + k * ldb + c * Vec::W);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const Vec a = Vec::bcast(A + r * lda + k);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = Vec::fma(a, b[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c].store(C + r * ldc + c * Vec::W);
}

// C[i][j] += sum_k A(i, k) * B[k][j] with A(i, k) = A[i * sar + k * sac] (so A may be read transposed).
template <int MR, int NV>
inline void mk_acc(const float* A, int64_t sar, int64_t sac, const float* B, int64_t ldb, int64_t K, float* C,
                   int64_t ldc) {
  Vec acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = Vec::load(C + r * ldc + c * Vec::W);
  for (int64_t k = 0; k < K; ++k) {
    Vec b[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) b[c] = Vec::load(B + k * ldb + c * Vec::W);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const Vec a = Vec::bcast(A + r * sar + k * sac);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = Vec::fma(a, b[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c].store(C + r * ldc + c * Vec::W);
}

constexpr int kMR = 6;
constexpr int kNV = 2;

template <int NV>
inline void nt_rows(int64_t mr, const float* A, int64_t lda, const float* BT, int64_t ldb, int64_t K, float* C,
                    int64_t ldc) {
  switch (mr) {
    case 6: mk_nt<6, NV>(A, lda, BT, ldb, K, C, ldc); break;
    case 5: mk_nt<5, NV>(A, lda, BT, ldb, K, C, ldc); break;
    case 4: mk_nt<4, NV>(A, lda, BT, ldb, K, C, ldc); break;
    case 3: mk_nt<3, NV>(A, lda, BT, ldb, K, C, ldc); break;
    case 2: mk_nt<2, NV>(A, lda, BT, ldb, K, C, ldc); break;
    default: mk_nt<1, NV>(A, lda, BT, ldb, K, C, ldc); break;
  }
}

template <int NV>
inline void acc_rows(int64_t mr, const float* A, int64_t sar, int64_t sac, const float* B, int64_t ldb, int64_t K,
                     float* C, int64_t ldc) {
  switch (mr) {
    case 6: mk_acc<6, NV>(A, sar, sac, B, ldb, K, C, ldc); break;
    case 5: mk_acc<5, NV>(A, sar, sac, B, ldb, K, C, ldc); break;
    case 4: mk_acc<4, NV>(A, sar, sac, B, ldb, K, C, ldc); break;
    case 3: mk_acc<3, NV>(A, sar, sac, B, ldb, K, C, ldc); break;
    case 2: mk_acc<2, NV>(A, sar, sac, B, ldb, K, C, ldc); break;
    default: mk_acc<1, NV>(A, sar, sac, B, ldb, K, C, ldc); break;
  }
}

// C [m][n] = A [m][K] * BT [K][n]; n a multiple of W.
inline void gemm_nt(int64_t m, int64_t n, int64_t K, const float* A, int64_t lda, const float* BT, int64_t ldb,
                    float* C, int64_t ldc) {
  constexpr int64_t W = Vec::W;
  for (int64_t j = 0; j < n; j += kNV * W) {
    const bool full = j + kNV * W <= n;
    for (int64_t i = 0; i < m; i += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, m - i);
      if (full) nt_rows<kNV>(mr, A + i * lda, lda, BT + j, ldb, K, C + i * ldc + j, ldc);
      else nt_rows<1>(mr, A + i * lda, lda, BT + j, ldb, K, C + i * ldc + j, ldc);
    }
  }
}

// C [m][n] += A(m x K) * B [K][n]; A(i, k) = A[i * sar + k * sac]; n a multiple of W.
inline void gemm_acc(int64_t m, int64_t n, int64_t K, const float* A, int64_t sar, int64_t sac, const float* B,
                     int64_t ldb, float* C, int64_t ldc) {
  constexpr int64_t W = Vec::W;
  for (int64_t j = 0; j < n; j += kNV * W) {
    const bool full = j + kNV * W <= n;
    for (int64_t i = 0; i < m; i += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, m - i);
      if (full) acc_rows<kNV>(mr, A + i * sar, sar, sac, B + j, ldb, K, C + i * ldc + j, ldc);
      else acc_rows<1>(mr, A + i * sar, sar, sac, B + j, ldb, K, C + i * ldc + j, ldc);
    }
  }
}
