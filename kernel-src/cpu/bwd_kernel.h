// Backward (flash-attention 2 style): P is recomputed from the saved lse, then
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,  dK = scale dS^T Q.
//
// Parallelization (no atomics, no write races):
//   task = (batch, kv head, split of the k-tiles). A task owns its k-tiles, so dK/dV are accumulated in
//   tile-local fp32 buffers and written once. dQ gets contributions from every k-tile, so it is accumulated in an
//   fp32 buffer [split, B, H, Sq, D]: the task owns the (b, group heads) slice of its split. The common case is a
//   single split (enough (b, kv head) pairs to feed every thread), i.e. one fp32 copy of dq and no recomputation;
//   splits only appear for small B * H_kv and are summed in split order at the end.
//   Tasks are cut into `nchunks` contiguous chunks (see BwdPlan in cpu_common.h), each run sequentially by the
//   thread that takes it from a shared counter. dS reductions into dbias / the table accumulator go straight to the output when no two chunks can hit
//   the same slot (tasks that could are kept in one chunk), else into a per-chunk buffer; chunk buffers are summed
//   in chunk order. Every sum therefore has a fixed order: the backward is bit-reproducible for a given thread
//   count whether or not `deterministic` is set (it costs nothing here, so the flag needs no separate path).
// ISA-specific; no include guard.

struct BwdScratch {
  std::vector<float> buf;
  float *q, *dout, *kt, *kn, *vt, *s, *dp, *dk, *dv, *colb, *row, *lse_row, *delta_row;
  int64_t lds;

  explicit BwdScratch(int64_t D) {
    lds = round_up(kBwdBlockK, 16);
    const int64_t sizes[] = {kBwdBlockQ * D, kBwdBlockQ * D, D * lds, kBwdBlockK * D, D * lds,
                             kBwdBlockQ * lds, kBwdBlockQ * lds, kBwdBlockK * D, kBwdBlockK * D, lds, 8 * D,
                             kBwdBlockQ, kBwdBlockQ};
    constexpr int n = sizeof(sizes) / sizeof(sizes[0]);
    int64_t total = 0;
    for (int64_t s : sizes) total += align16(s);
    buf.assign(total, 0.f);
    float* at = buf.data();
    float** dst[n] = {&q, &dout, &kt, &kn, &vt, &s, &dp, &dk, &dv, &colb, &row, &lse_row, &delta_row};
    for (int x = 0; x < n; ++x) {
      *dst[x] = at;
      at += align16(sizes[x]);
    }
#if defined(WINATTN_BF16_DOT)
    const int64_t ldd = round_up(D, 16);
    kp.assign(D / 2 * lds, 0u);
    vtp.assign(D / 2 * lds, 0u);
    kip.assign(lds / 2 * ldd, 0u);
    pp.assign(ceil_div(kBwdBlockQ, 2) * lds, 0u);
    dsp.assign(ceil_div(kBwdBlockQ, 2) * lds, 0u);
    dsb.assign(kBwdBlockQ * lds, 0);
    dkt.assign(D * lds, 0.f);
    dvt.assign(D * lds, 0.f);
#endif
  }
#if defined(WINATTN_BF16_DOT)
  // Operands of gemm_bf16.h: k / v word-transposed (B of q.k^T, dO.v^T), k row pairs (B of dS.k), P and dS row
  // pairs (B of dO^T.P, q^T.dS), dS rounded (A of dS.k); dK^T / dV^T accumulators [D][keys].
  std::vector<uint32_t> kp, vtp, kip, pp, dsp;
  std::vector<uint16_t> dsb;
  std::vector<float> dkt, dvt;
#endif
};

struct BwdCtx {
  const BwdParams& p;
  const BwdPlan& plan;
  float* ws;  // fp32 workspace (layout in BwdPlan)
};

// Zeroes the task's slice of the fp32 dq accumulator: (its split, its batch, the G heads of its kv head).
inline void bwd_task_init(const BwdCtx& c, int64_t task) {
  const BwdParams& p = c.p;
  const int64_t H = p.heads, Sq = p.seqlen_q, D = p.head_dim, G = H / p.heads_kv;
  int64_t b, hk, sp;
  c.plan.decode(task, b, hk, sp);
  float* dq_acc = c.ws + c.plan.off_dq + sp * (p.batch * H * Sq * D);
  std::memset(dq_acc + (b * H + hk * G) * Sq * D, 0, sizeof(float) * G * Sq * D);
}

// One k-tile of a task = everything that touches dK/dV of those keys: the unit of work. Steps of tasks that
// differ only in the batch run k-tile-major (see run_bwd), so a bias / dbias strip shared across the batch stays
// in cache between them.
inline void bwd_step(const BwdCtx& c, int64_t task, int64_t kt, const DsSink& dbias, const DsSink& dtab,
                     BwdScratch& w) {
  const BwdParams& p = c.p;
  const BwdPlan& pl = c.plan;
  const int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, Sq = p.seqlen_q, Sk = p.seqlen_k, D = p.head_dim;
  const int64_t G = H / Hkv;
  int64_t b, hk, sp;
  pl.decode(task, b, hk, sp);
  float* dq_acc = c.ws + pl.off_dq + sp * (B * H * Sq * D);
  const float* delta = c.ws + pl.off_delta;
  const Band band(p);

  const int64_t j0 = kt * kBwdBlockK;
  const int64_t nk = std::min(kBwdBlockK, Sk - j0);
  const int64_t npad = round_up(nk, Vec::W);
  const int64_t koff = b * p.k_stride_b + j0 * p.k_stride_s + hk * p.k_stride_h;
  const int64_t voff = b * p.v_stride_b + j0 * p.v_stride_s + hk * p.v_stride_h;
  load_rows(w.kn, D, p.k, p.dtype, koff, p.k_stride_s, nk, D);
  load_rows_t(w.kt, npad, p.k, p.dtype, koff, p.k_stride_s, nk, npad, D, w.row);
  load_rows_t(w.vt, npad, p.v, p.dtype, voff, p.v_stride_s, nk, npad, D, w.row);
  std::fill(w.dk, w.dk + nk * D, 0.f);
  std::fill(w.dv, w.dv + nk * D, 0.f);
  const int64_t i_first = band.first_row(j0), i_last = band.last_row(j0 + nk);

  for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
    const ScoreMods mods(p, b, h);
    const bool has_col = mods.column_term(j0, nk, npad, w.colb);
    const float* lse = p.lse + (b * H + h) * Sq;
    const float* dl = delta + (b * H + h) * Sq;
    for (int64_t i0 = i_first; i0 <= i_last; i0 += kBwdBlockQ) {
      const int64_t mq = std::min(kBwdBlockQ, i_last + 1 - i0);
      const int64_t qoff = b * p.q_stride_b + i0 * p.q_stride_s + h * p.q_stride_h;
      const int64_t gooff = b * p.do_stride_b + i0 * p.do_stride_s + h * p.do_stride_h;
      load_rows(w.q, D, p.q, p.dtype, qoff, p.q_stride_s, mq, D, p.scale);
      load_rows(w.dout, D, p.dout, p.dtype, gooff, p.do_stride_s, mq, D);
      for (int64_t r = 0; r < mq; ++r) {
        w.lse_row[r] = lse[i0 + r] == kNegInf ? -kNegInf : lse[i0 + r];
        w.delta_row[r] = dl[i0 + r];
      }
      gemm_nt(mq, npad, D, w.q, D, w.kt, npad, w.s, w.lds);                      // S = (scale q) k^T
      mods.apply(w.s, w.lds, i0, mq, j0, nk, npad, has_col ? w.colb : nullptr);
      recompute_p(w.s, w.lds, mq, npad, w.lse_row);                             // P
      gemm_acc(nk, D, mq, w.s, 1, w.lds, w.dout, D, w.dv, D);                  // dV += P^T dO
      gemm_nt(mq, npad, D, w.dout, D, w.vt, npad, w.dp, w.lds);                 // dP = dO V^T
      softmax_grad(w.s, w.dp, w.lds, mq, npad, w.delta_row);                   // dS (in dp)
      gemm_acc(mq, D, nk, w.dp, w.lds, 1, w.kn, D, dq_acc + ((b * H + h) * Sq + i0) * D, D);  // dQ += dS K
      gemm_acc(nk, D, mq, w.dp, 1, w.lds, w.q, D, w.dk, D);                    // dK += dS^T (scale q)
      if (dbias.base) sink_add_tile(dbias, b, h, i0, mq, j0, nk, w.dp, w.lds);
      if (dtab.base) sink_add_tile(dtab, b, h, i0, mq, j0, nk, w.dp, w.lds);
    }
  }
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t off = ((b * Sk + j0 + r) * Hkv + hk) * D;  // dk/dv are contiguous [B, Sk, H_kv, D]
    store_row(p.dk, p.dtype, off, w.dk + r * D, D);
    store_row(p.dv, p.dtype, off, w.dv + r * D, D);
  }
}

#if defined(WINATTN_BF16_DOT)
// bf16 inputs with AVX512-BF16: bwd_task with the five tile products on bf16 pairs. dV and dK are accumulated
// transposed (dV^T = dO^T.P, dK^T = q^T.dS) so that P and dS only need row-pair packing, never a transpose;
// q / dO come pre-packed from the workspace. q is not pre-scaled (bf16 rounding): scale multiplies S and dK.
inline void bwd_step_bf16(const BwdCtx& c, int64_t task, int64_t kt, const DsSink& dbias, const DsSink& dtab,
                          BwdScratch& w) {
  const BwdParams& p = c.p;
  const BwdPlan& pl = c.plan;
  const int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, Sq = p.seqlen_q, Sk = p.seqlen_k, D = p.head_dim;
  const int64_t G = H / Hkv, ldd = round_up(D, 16), S2 = ceil_div(Sq, 2);
  int64_t b, hk, sp;
  pl.decode(task, b, hk, sp);
  float* dq_acc = c.ws + pl.off_dq + sp * (B * H * Sq * D);
  const float* delta = c.ws + pl.off_delta;
  const uint16_t* qt_all = reinterpret_cast<const uint16_t*>(c.ws + pl.off_qt);
  const uint16_t* dot_all = reinterpret_cast<const uint16_t*>(c.ws + pl.off_dot);
  const uint16_t* qb = static_cast<const uint16_t*>(p.q);
  const uint16_t* kb = static_cast<const uint16_t*>(p.k);
  const uint16_t* vb = static_cast<const uint16_t*>(p.v);
  const uint16_t* gb = static_cast<const uint16_t*>(p.dout);
  const Band band(p);

  const int64_t j0 = kt * kBwdBlockK;
  const int64_t nk = std::min(kBwdBlockK, Sk - j0);
  const int64_t npad = round_up(nk, 16);
  const uint16_t* krows = kb + b * p.k_stride_b + j0 * p.k_stride_s + hk * p.k_stride_h;
  const uint16_t* vrows = vb + b * p.v_stride_b + j0 * p.v_stride_s + hk * p.v_stride_h;
  pack_words_t(w.kp.data(), npad, krows, p.k_stride_s, nk, npad, D, reinterpret_cast<uint32_t*>(w.row));
  pack_words_t(w.vtp.data(), npad, vrows, p.v_stride_s, nk, npad, D, reinterpret_cast<uint32_t*>(w.row));
  pack_rows_bf16(w.kip.data(), ldd, krows, p.k_stride_s, nk, npad, D);
  std::fill(w.dkt.begin(), w.dkt.begin() + D * npad, 0.f);
  std::fill(w.dvt.begin(), w.dvt.begin() + D * npad, 0.f);
  // q-tiles start on even rows so that row pairs line up with the pre-packed q^T / dO^T words (an extra leading
  // row sees no key of this tile: P = 0 there).
  const int64_t i_first = band.first_row(j0) & ~static_cast<int64_t>(1), i_last = band.last_row(j0 + nk);

  for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
    const ScoreMods mods(p, b, h);
    const bool has_col = mods.column_term(j0, nk, npad, w.colb);
    const float* lse = p.lse + (b * H + h) * Sq;
    const float* dl = delta + (b * H + h) * Sq;
    const uint16_t* qt = qt_all + (b * H + h) * D * 2 * S2;    // row d: 2 * S2 bf16 = S2 words
    const uint16_t* dot = dot_all + (b * H + h) * D * 2 * S2;
    for (int64_t i0 = i_first; i0 <= i_last; i0 += kBwdBlockQ) {
      const int64_t mq = std::min(kBwdBlockQ, i_last + 1 - i0), mq2 = ceil_div(mq, 2);
      const uint16_t* qrows = qb + b * p.q_stride_b + i0 * p.q_stride_s + h * p.q_stride_h;
      const uint16_t* grows = gb + b * p.do_stride_b + i0 * p.do_stride_s + h * p.do_stride_h;
      for (int64_t r = 0; r < mq; ++r) {
        w.lse_row[r] = lse[i0 + r] == kNegInf ? -kNegInf : lse[i0 + r];
        w.delta_row[r] = dl[i0 + r];
      }
      gemm_dp(mq, npad, D / 2, qrows, p.q_stride_s, w.kp.data(), npad, w.s, w.lds, false, p.scale);  // S
      mods.apply(w.s, w.lds, i0, mq, j0, nk, npad, has_col ? w.colb : nullptr);
      recompute_p(w.s, w.lds, mq, npad, w.lse_row);                                                // P
      pack_rows_f32(w.pp.data(), npad, w.s, w.lds, mq, npad);
      gemm_dp(D, npad, mq2, dot + i0, 2 * S2, w.pp.data(), npad, w.dvt.data(), npad, true);      // dV^T += dO^T P
      gemm_dp(mq, npad, D / 2, grows, p.do_stride_s, w.vtp.data(), npad, w.dp, w.lds, false);    // dP = dO v^T
      softmax_grad(w.s, w.dp, w.lds, mq, npad, w.delta_row);                                     // dS
      round_rows_bf16(w.dsb.data(), npad, w.dp, w.lds, mq, npad);
      gemm_dp(mq, D, npad / 2, w.dsb.data(), npad, w.kip.data(), ldd,                            // dQ += dS k
              dq_acc + ((b * H + h) * Sq + i0) * D, D, true);
      pack_rows_f32(w.dsp.data(), npad, w.dp, w.lds, mq, npad);
      gemm_dp(D, npad, mq2, qt + i0, 2 * S2, w.dsp.data(), npad, w.dkt.data(), npad, true);      // dK^T += q^T dS
      if (dbias.base) sink_add_tile(dbias, b, h, i0, mq, j0, nk, w.dp, w.lds);
      if (dtab.base) sink_add_tile(dtab, b, h, i0, mq, j0, nk, w.dp, w.lds);
    }
  }
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t off = ((b * Sk + j0 + r) * Hkv + hk) * D;
    for (int64_t d = 0; d < D; ++d) w.row[d] = w.dkt[d * npad + r];
    store_row(p.dk, p.dtype, off, w.row, D, p.scale);
    for (int64_t d = 0; d < D; ++d) w.row[d] = w.dvt[d * npad + r];
    store_row(p.dv, p.dtype, off, w.row, D);
  }
}
#endif

inline void run_bwd(const BwdParams& p, const BwdPlan& pl, float* ws) {
  const int64_t B = p.batch, H = p.heads, Sq = p.seqlen_q, Sk = p.seqlen_k, D = p.head_dim;
  if (B * H * Sq * D == 0 && B * p.heads_kv * Sk * D == 0) return;
  const BwdCtx c{p, pl, ws};

  // delta = rowsum(dO * O) - dlse per (b, h, i), from the rounded forward output as flash-attention does.
  float* delta = ws + pl.off_delta;
  torch::stable::parallel_for(0, B * H * Sq, 256, [&](int64_t begin, int64_t end) {
    std::vector<float> o(D), g(D);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * Sq), h = (r / Sq) % H, i = r % Sq;
      convert_row<false>(o.data(), p.out, p.dtype, b * p.o_stride_b + i * p.o_stride_s + h * p.o_stride_h, D);
      convert_row<false>(g.data(), p.dout, p.dtype, b * p.do_stride_b + i * p.do_stride_s + h * p.do_stride_h, D);
      Vec acc = Vec::zero();
      for (int64_t d = 0; d < D; d += Vec::W) acc = Vec::fma(Vec::load(o.data() + d), Vec::load(g.data() + d), acc);
      delta[r] = acc.reduce_add() - (p.dlse != nullptr ? p.dlse[r] : 0.f);
    }
  });

#if defined(WINATTN_BF16_DOT)
  {
    const int64_t S2 = ceil_div(Sq, 2);
    uint32_t* qt = reinterpret_cast<uint32_t*>(ws + pl.off_qt);
    uint32_t* dot = reinterpret_cast<uint32_t*>(ws + pl.off_dot);
    torch::stable::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t b = r / H, h = r % H;
        pack_pairs_t(qt + r * D * S2, S2, static_cast<const uint16_t*>(p.q) + b * p.q_stride_b + h * p.q_stride_h,
                     p.q_stride_s, Sq, D);
        pack_pairs_t(dot + r * D * S2, S2,
                     static_cast<const uint16_t*>(p.dout) + b * p.do_stride_b + h * p.do_stride_h, p.do_stride_s, Sq,
                     D);
      }
    });
  }
#endif
  const DsSink bias_shape{static_cast<float*>(p.dbias), p.bias.period, p.bias.heads, p.bias.rows, p.bias.cols};
  const DsSink table_shape{p.dtable ? ws + pl.off_dtable : nullptr, 1, H, Sq, Sk};
  if (table_shape.base && !pl.dtable_private) std::memset(table_shape.base, 0, sizeof(float) * table_shape.size());

  const bool main_pass = Sk > 0 && Sq > 0;
  if (main_pass) {
    // Chunks are taken from a shared counter (dynamic balancing); each chunk's work and buffer are fixed by its
    // index, so the result does not depend on the schedule.
    std::atomic<int64_t> next_chunk{0};
    torch::stable::parallel_for(0, std::min(pl.nchunks, num_workers()), 1, [&](int64_t, int64_t) {
      BwdScratch w(D);
      for (int64_t ch = next_chunk.fetch_add(1, std::memory_order_relaxed); ch < pl.nchunks;
           ch = next_chunk.fetch_add(1, std::memory_order_relaxed)) {
        DsSink dbias = bias_shape, dtab = table_shape;
        if (pl.dbias_private) {
          dbias.base = ws + pl.off_dbias + ch * align16(bias_shape.size());
          std::memset(dbias.base, 0, sizeof(float) * bias_shape.size());
        }
        if (pl.dtable_private) {
          dtab.base = ws + pl.off_dtable + ch * align16(table_shape.size());
          std::memset(dtab.base, 0, sizeof(float) * table_shape.size());
        }
        const int64_t nunits = pl.ntasks / pl.unit;
        const int64_t t0 = ch * nunits / pl.nchunks * pl.unit, t1 = (ch + 1) * nunits / pl.nchunks * pl.unit;
        for (int64_t t = t0; t < t1; ++t) bwd_task_init(c, t);
        // Runs of consecutive tasks that differ only in the batch (consecutive when the batch is the innermost
        // dim of the plan's order, i.e. when it carries a dbias/dtable conflict) execute k-tile-major.
        for (int64_t t = t0; t < t1;) {
          int64_t b, hk, sp, b2, hk2, sp2;
          pl.decode(t, b, hk, sp);
          int64_t run_end = t + 1;
          while (run_end < t1) {
            pl.decode(run_end, b2, hk2, sp2);
            if (hk2 != hk || sp2 != sp) break;
            ++run_end;
          }
          const int64_t kt_begin = sp * pl.ktiles / pl.nsplit, kt_end = (sp + 1) * pl.ktiles / pl.nsplit;
          for (int64_t kt = kt_begin; kt < kt_end; ++kt)
            for (int64_t u = t; u < run_end; ++u) {
#if defined(WINATTN_BF16_DOT)
              bwd_step_bf16(c, u, kt, dbias, dtab, w);
#else
              bwd_step(c, u, kt, dbias, dtab, w);
#endif
            }
          t = run_end;
        }
      }
    });
  } else {
    // No keys (dq = 0) or no queries (dk = dv = 0): nothing to reduce, just zero the gradients.
    std::memset(ws + pl.off_dq, 0, sizeof(float) * pl.nsplit * B * H * Sq * D);
    std::vector<float> zero(D, 0.f);
    for (int64_t r = 0; r < B * Sk * p.heads_kv; ++r) {
      store_row(p.dk, p.dtype, r * D, zero.data(), D);
      store_row(p.dv, p.dtype, r * D, zero.data(), D);
    }
  }

  // dq = scale * sum over splits (in split order) of the fp32 accumulators; layout [B, Sq, H, D].
  const float* dq_acc = ws + pl.off_dq;
  torch::stable::parallel_for(0, B * Sq * H, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> row(D);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (Sq * H), i = (r / H) % Sq, h = r % H;
      const int64_t src = ((b * H + h) * Sq + i) * D;
      std::memcpy(row.data(), dq_acc + src, sizeof(float) * D);
      for (int64_t s = 1; s < pl.nsplit; ++s) {
        const float* x = dq_acc + s * (B * H * Sq * D) + src;
        for (int64_t d = 0; d < D; ++d) row[d] += x[d];
      }
      store_row(p.dq, p.dtype, r * D, row.data(), D, p.scale);
    }
  });

  // Per-chunk dbias buffers -> dbias, summed in chunk order (elementwise: any split of the range is fine).
  if (main_pass && pl.dbias_private) {
    const int64_t n = bias_shape.size(), stride = align16(n);
    const float* bufs = ws + pl.off_dbias;
    torch::stable::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        float acc = bias_shape.base[e];
        for (int64_t ch = 0; ch < pl.nchunks; ++ch) acc += bufs[ch * stride + e];
        bias_shape.base[e] = acc;
      }
    });
  }

  // dtable[rel_index[i, j], h] += sum_b dS[b, h, i, j]: one head per worker (columns of dtable are disjoint),
  // (i, j) scanned in order, so the scatter is race-free and deterministic without atomics.
  if (main_pass && p.dtable) {
    const int64_t n = table_shape.size(), stride = align16(n);
    float* acc0 = ws + pl.off_dtable;
    const int64_t nbuf = pl.dtable_private ? pl.nchunks : 1;
    torch::stable::parallel_for(0, H, 1, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h) {
        float* a = acc0 + h * Sq * Sk;
        for (int64_t ch = 1; ch < nbuf; ++ch) {
          const float* x = acc0 + ch * stride + h * Sq * Sk;
          for (int64_t e = 0; e < Sq * Sk; ++e) a[e] += x[e];
        }
        for (int64_t i = 0; i < Sq; ++i)
          for (int64_t j = 0; j < Sk; ++j)
            p.dtable[p.rel_index[i * p.index_stride_q + j * p.index_stride_k] * H + h] += a[i * Sk + j];
      }
    });
  }
}
