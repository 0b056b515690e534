// Forward: flash-attention style online softmax over k-tiles.
//
// One task = (batch, kv head, block of q rows) and covers the q rows of all G = H / H_kv heads sharing that kv
// head. Loop order inside a task: k-tile outer, (head, q-tile) inner, so each K^T / V tile is converted to fp32
// (or packed to bf16 pairs) once per task and reused by G * qblock query rows (the conversion, a transposition
// for K, would otherwise cost a sizeable fraction of the tile products). The running state (max, sum, unnormalized output)
// of the task's rows stays in task-local fp32 buffers; scratch is tile-sized, never [Sq, Sk].
// Tasks write disjoint rows of out/lse: race-free and deterministic. k-tiles outside the causal/window band
// of a q-tile are skipped. ISA-specific; no include guard.

struct FwdPlan {
  int64_t qblock = kFwdBlockQ;  // q rows per task and head (a multiple of kFwdBlockQ)
  int64_t nqb = 0, ntasks = 0;
  // Task order (b, kv head, q block), or (kv head, q block, b) when the bias / mask is shared across the batch:
  // consecutive tasks then read the same bias rows from cache instead of memory.
  bool batch_inner = false;

  void decode(int64_t t, int64_t B, int64_t Hkv, int64_t& b, int64_t& hk, int64_t& qb) const {
    if (batch_inner) {
      b = t % B;
      hk = (t / B) / nqb;
      qb = (t / B) % nqb;
    } else {
      b = t / (Hkv * nqb);
      hk = (t / nqb) % Hkv;
      qb = t % nqb;
    }
  }
};

inline FwdPlan make_fwd_plan(const FwdParams& p, int64_t nthreads) {
  FwdPlan pl;
  const int64_t G = p.heads / p.heads_kv;
  // Aim at ~256 rows per task (K/V conversion amortized 4x more than a single 64-row tile), but keep at least
  // 4 tasks per thread for load balance.
  pl.qblock = kFwdBlockQ * std::max<int64_t>(1, 4 / G);
  while (pl.qblock > kFwdBlockQ && p.batch * p.heads_kv * ceil_div(p.seqlen_q, pl.qblock) < 4 * nthreads)
    pl.qblock /= 2;
  pl.qblock = std::max(kFwdBlockQ, pl.qblock / kFwdBlockQ * kFwdBlockQ);
  pl.nqb = ceil_div(p.seqlen_q, pl.qblock);
  pl.ntasks = p.batch * p.heads_kv * pl.nqb;
  pl.batch_inner = (p.bias.ptr && p.bias.period < p.batch && p.bias.rows > 1) ||
                   (p.mask.ptr && p.mask.period < p.batch && p.mask.rows > 1);
  return pl;
}

struct FwdScratch {
  float *q, *o, *m, *l, *kt, *v, *s, *colb, *row;
  static constexpr int64_t kLds = (kFwdBlockK + 15) / 16 * 16;
  int64_t lds = kLds;  // row stride of the score tile
#if defined(WINATTN_BF16_DOT)
  uint32_t *kp, *vp;  // k as the B operand of q.k^T, v as the B operand of P.v (gemm_bf16.h)
  uint16_t* pb;       // P rounded to bf16
#endif

  // Uninitialized, from this thread's scratch arena (ScratchLease in cpu_common.h: why no fill, why reuse).
  FwdScratch(int64_t D, int64_t rows) : lease_(bytes(D, rows)) {
    float* at = reinterpret_cast<float*>(lease_.data());
    float** dst[] = {&q, &o, &m, &l, &kt, &v, &s, &colb, &row};
    const Sizes sz = sizes(D, rows);
    for (int x = 0; x < kBuffers; ++x) {
      *dst[x] = at;
      at += align16(sz.n[x]);
    }
#if defined(WINATTN_BF16_DOT)
    kp = reinterpret_cast<uint32_t*>(at);
    vp = kp + align16(sz.kp);
    pb = reinterpret_cast<uint16_t*>(vp + align16(sz.vp));
#endif
  }

 private:
  static constexpr int kBuffers = 9;
  struct Sizes {
    int64_t n[kBuffers];
    int64_t kp = 0, vp = 0, pb = 0;
  };
  static Sizes sizes(int64_t D, int64_t rows) {
    const int64_t lds = kLds;
    Sizes s{{rows * D, rows * D, rows, rows, D * lds, kFwdBlockK * D, kFwdBlockQ * lds, lds, 8 * D}};
#if defined(WINATTN_BF16_DOT)
    s.kp = D / 2 * lds;
    s.vp = ceil_div(kFwdBlockK, 2) * round_up(D, 16);
    s.pb = kFwdBlockQ * lds;
#endif
    return s;
  }
  static int64_t bytes(int64_t D, int64_t rows) {
    const Sizes s = sizes(D, rows);
    int64_t floats = 0;
    for (int64_t n : s.n) floats += align16(n);
    // kp / vp: 32-bit words, pb: 16-bit (rounded up to whole 64-byte blocks like the rest)
    return 4 * (floats + align16(s.kp) + align16(s.vp) + align16(ceil_div(s.pb, 2)));
  }
  ScratchLease lease_;

 public:
  FwdScratch(const FwdScratch&) = delete;
  FwdScratch& operator=(const FwdScratch&) = delete;
};

// Running max / sum / output of the task's rows (G heads x nrows), before the first k-tile.
inline void reset_accumulators(FwdScratch& w, const FwdPlan& pl, int64_t G, int64_t nrows, int64_t D) {
  for (int64_t hh = 0; hh < G; ++hh) {
    std::fill(w.m + hh * pl.qblock, w.m + hh * pl.qblock + nrows, kNegInf);
    std::fill(w.l + hh * pl.qblock, w.l + hh * pl.qblock + nrows, 0.f);
    std::fill(w.o + hh * pl.qblock * D, w.o + (hh * pl.qblock + nrows) * D, 0.f);
  }
}

// Epilogue: normalize, round to the output dtype; rows that saw no visible key (l = 0) -> out 0, lse -inf; rows
// with a NaN score (l = NaN, see online_softmax_tile) -> out and lse NaN, as SDPA.
inline void store_outputs(const FwdParams& p, const FwdPlan& pl, const FwdScratch& w, int64_t b, int64_t hk,
                          int64_t i_begin, int64_t nrows) {
  const int64_t D = p.head_dim, G = p.heads / p.heads_kv;
  for (int64_t hh = 0; hh < G; ++hh) {
    const int64_t h = hk * G + hh;
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t row = hh * pl.qblock + r, i = i_begin + r;
      const float l = w.l[row];
      store_row(p.out, p.dtype, b * p.o_stride_b + i * p.o_stride_s + h * p.o_stride_h, w.o + row * D, D,
                l == 0.f ? 0.f : 1.f / l);
      p.lse[(b * p.heads + h) * p.seqlen_q + i] = l == 0.f ? kNegInf : w.m[row] + std::log(l);
    }
  }
}

#if defined(WINATTN_BF16_DOT)
// bf16 inputs with AVX512-BF16: the same loop as fwd_task with the two tile products on bf16 pairs. q is read
// straight from the input (its rows are already bf16 pairs along D), scale is applied to the fp32 scores
// instead of q (exact), P is rounded to bf16 for P.v while the row sums use the fp32 P.
inline void fwd_task_bf16(const FwdParams& p, const FwdPlan& pl, int64_t b, int64_t hk, int64_t i_begin,
                          int64_t i_end, FwdScratch& w) {
  const int64_t D = p.head_dim, Sk = p.seqlen_k, G = p.heads / p.heads_kv;
  const int64_t nrows = i_end - i_begin, ldv = round_up(D, 16);
  const Band band(p);
  const uint16_t* qb = static_cast<const uint16_t*>(p.q);
  const uint16_t* kb = static_cast<const uint16_t*>(p.k);
  const uint16_t* vb = static_cast<const uint16_t*>(p.v);

  reset_accumulators(w, pl, G, nrows, D);
  const int64_t jlo = band.lo(i_begin), jhi = band.hi(i_end - 1);
  const int64_t kt_begin = jlo / kFwdBlockK;
  const int64_t kt_end = jhi < jlo ? kt_begin : jhi / kFwdBlockK + 1;
  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int64_t j0 = kt * kFwdBlockK;
    const int64_t nk = std::min(kFwdBlockK, Sk - j0);
    const int64_t npad = round_up(nk, 16);
    pack_words_t(w.kp, npad, kb + b * p.k_stride_b + j0 * p.k_stride_s + hk * p.k_stride_h, p.k_stride_s, nk,
                 npad, D, reinterpret_cast<uint32_t*>(w.row));
    pack_rows_bf16(w.vp, ldv, vb + b * p.v_stride_b + j0 * p.v_stride_s + hk * p.v_stride_h, p.v_stride_s, nk,
                   npad, D);
    for (int64_t hh = 0; hh < G; ++hh) {
      const int64_t h = hk * G + hh;
      const ScoreMods mods(p, b, h);
      const bool has_col = mods.column_term(j0, nk, npad, w.colb);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kFwdBlockQ) {
        const int64_t mq = std::min(kFwdBlockQ, i_end - i0);
        if (band.active() && (band.hi(i0 + mq - 1) < j0 || band.lo(i0) >= j0 + nk)) continue;
        const int64_t row = hh * pl.qblock + (i0 - i_begin);
        const uint16_t* qrows = qb + b * p.q_stride_b + i0 * p.q_stride_s + h * p.q_stride_h;
        gemm_dp(mq, npad, D / 2, qrows, p.q_stride_s, w.kp, npad, w.s, w.lds, false, p.scale);
        mods.apply(w.s, w.lds, i0, mq, j0, nk, npad, has_col ? w.colb : nullptr);
        online_softmax_tile(w.s, w.lds, mq, npad, w.m + row, w.l + row, w.o + row * D, D, D, w.pb, npad);
        gemm_dp(mq, D, npad / 2, w.pb, npad, w.vp, ldv, w.o + row * D, D, true);
      }
    }
  }
  store_outputs(p, pl, w, b, hk, i_begin, nrows);
}
#endif

// Rows [i_begin, i_end) of every head of kv head hk, batch b. Row r of head hh lives at (hh * qblock + r).
inline void fwd_task(const FwdParams& p, const FwdPlan& pl, int64_t b, int64_t hk, int64_t i_begin, int64_t i_end,
                     FwdScratch& w) {
  const int64_t D = p.head_dim, Sk = p.seqlen_k, G = p.heads / p.heads_kv;
  const int64_t nrows = i_end - i_begin;
  const Band band(p);

  for (int64_t hh = 0; hh < G; ++hh) {
    const int64_t h = hk * G + hh;
    load_rows(w.q + hh * pl.qblock * D, D, p.q, p.dtype, b * p.q_stride_b + i_begin * p.q_stride_s + h * p.q_stride_h,
              p.q_stride_s, nrows, D, p.scale);
  }
  reset_accumulators(w, pl, G, nrows, D);

  // k-tiles meeting the band of any row (band.lo / band.hi are monotone in the row).
  const int64_t jlo = band.lo(i_begin), jhi = band.hi(i_end - 1);
  const int64_t kt_begin = jlo / kFwdBlockK;
  const int64_t kt_end = jhi < jlo ? kt_begin : jhi / kFwdBlockK + 1;
  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int64_t j0 = kt * kFwdBlockK;
    const int64_t nk = std::min(kFwdBlockK, Sk - j0);
    const int64_t npad = round_up(nk, Vec::W);
    const int64_t koff = b * p.k_stride_b + j0 * p.k_stride_s + hk * p.k_stride_h;
    const int64_t voff = b * p.v_stride_b + j0 * p.v_stride_s + hk * p.v_stride_h;
    load_rows_t(w.kt, npad, p.k, p.dtype, koff, p.k_stride_s, nk, npad, D, w.row);
    load_rows(w.v, D, p.v, p.dtype, voff, p.v_stride_s, nk, D);

    for (int64_t hh = 0; hh < G; ++hh) {
      const ScoreMods mods(p, b, hk * G + hh);
      const bool has_col = mods.column_term(j0, nk, npad, w.colb);
      for (int64_t i0 = i_begin; i0 < i_end; i0 += kFwdBlockQ) {
        const int64_t mq = std::min(kFwdBlockQ, i_end - i0);
        if (band.active() && (band.hi(i0 + mq - 1) < j0 || band.lo(i0) >= j0 + nk)) continue;
        const int64_t row = hh * pl.qblock + (i0 - i_begin);
        gemm_nt(mq, npad, D, w.q + row * D, D, w.kt, npad, w.s, w.lds);
        mods.apply(w.s, w.lds, i0, mq, j0, nk, npad, has_col ? w.colb : nullptr);
        online_softmax_tile(w.s, w.lds, mq, npad, w.m + row, w.l + row, w.o + row * D, D, D);
        gemm_acc(mq, D, nk, w.s, w.lds, 1, w.v, D, w.o + row * D, D);
      }
    }
  }

  store_outputs(p, pl, w, b, hk, i_begin, nrows);
}

inline void run_fwd(const FwdParams& p, int64_t nthreads) {
  const FwdPlan pl = make_fwd_plan(p, nthreads);
  if (pl.ntasks == 0) return;
  const int64_t G = p.heads / p.heads_kv;
  // Tasks are taken from a shared counter: dynamic balancing of causal / windowed work and of cores shared with
  // other processes (tasks are independent, so the schedule never changes the result).
  std::atomic<int64_t> next_task{0};
  torch::stable::parallel_for(0, std::min(pl.ntasks, num_workers()), 1, [&](int64_t, int64_t) {
    FwdScratch w(p.head_dim, G * pl.qblock);
    for (int64_t t = next_task.fetch_add(1, std::memory_order_relaxed); t < pl.ntasks;
         t = next_task.fetch_add(1, std::memory_order_relaxed)) {
      int64_t b, hk, qb;
      pl.decode(t, p.batch, p.heads_kv, b, hk, qb);
      const int64_t i0 = qb * pl.qblock;
#if defined(WINATTN_BF16_DOT)
      fwd_task_bf16(p, pl, b, hk, i0, std::min(i0 + pl.qblock, p.seqlen_q), w);
#else
      fwd_task(p, pl, b, hk, i0, std::min(i0 + pl.qblock, p.seqlen_q), w);
#endif
    }
  });
}
