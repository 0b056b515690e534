// Forward kernel: tiled online softmax (flash-attention 2 style) with the score terms of score_mod.h.
//
// A CTA owns one query block of one head and a chunk of G batch items (window mode: many small windows per CTA;
// G = 1 for long sequences). It walks the flattened (item, key block) steps with K/V double-buffered through
// cp.async: the loads of step s + 1 are issued at the top of step s. Q is single-buffered: the next item's Q is
// loaded after the last S = Q K^T of the current item.
#pragma once
#include "block_info.h"
#include "gemm.h"
#include "kernel_params.h"
#include "kernel_traits.h"
#include "score_mod.h"
#include "softmax.h"
#include "tile_io.h"

namespace winattn {
namespace cuda {

template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kNThreads) fwd_kernel(const KParams p) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, LD = Tr::kLd;
  constexpr int MT = Tr::kMT, NT = Tr::kNT, DT = Tr::kDT, NTH = Tr::kNThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sK = sQ + Tr::kQElems;        // [2][BN][LD]
  Elem* sV = sK + 2 * Tr::kKVElems;   // [2][BN][LD]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const Work w = decode_work(p, p.H);
  const int h = w.hx, m_block = w.blk, hkv = h / p.hgroup;
  const int i0 = m_block * BM;
  const int rows_valid = min(BM, p.Sq - i0);
  const int wr = warp * 16 * MT;  // warp's first row in the block
  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  Elem* o = static_cast<Elem*>(p.o);
  const int qr = lane >> 2, qc = (lane & 3) * 2;

  int n_lo, n_hi;
  n_block_range(p, m_block, BM, BN, n_lo, n_hi);
  if (n_lo >= n_hi) {  // no key of any row is in the band: zero output, lse = -inf
    for (int t = 0; t < w.nitems; ++t) {
      const int b = w.batch(p, t);
      for (int idx = tid; idx < rows_valid * p.D; idx += NTH) {
        const int r = idx / p.D, d = idx % p.D;
        o[int64_t(b) * p.o_sb + int64_t(i0 + r) * p.o_ss + int64_t(h) * p.o_sh + d] = Elem(0.f);
      }
      for (int r = tid; r < rows_valid; r += NTH) p.lse[(int64_t(b) * p.H + h) * p.Sq + i0 + r] = -INFINITY;
    }
    return;
  }
  const int nper = n_hi - n_lo;
  const int nsteps = w.nitems * nper;
  const bool has_static = p.tb != nullptr || p.has_band || (p.Sk % BN) != 0;
  const bool has_batch = p.bias.ptr != nullptr || p.mask.ptr != nullptr || p.kp != nullptr;

  auto load_q = [&](int b) {
    load_rows_async<Elem, BM, DK, NTH>(sQ, q + int64_t(b) * p.q_sb + int64_t(i0) * p.q_ss + int64_t(h) * p.q_sh,
                                       p.q_ss, rows_valid, p.D, p.q, tid);
  };
  auto load_kv = [&](int b, int n, int stage) {
    const int j0 = n * BN, kv_rows = min(BN, p.Sk - j0);
    load_rows_async<Elem, BN, DK, NTH>(sK + stage * Tr::kKVElems,
                                       k + int64_t(b) * p.k_sb + int64_t(j0) * p.k_ss + int64_t(hkv) * p.k_sh,
                                       p.k_ss, kv_rows, p.D, p.k, tid);
    load_rows_async<Elem, BN, DK, NTH>(sV + stage * Tr::kKVElems,
                                       v + int64_t(b) * p.v_sb + int64_t(j0) * p.v_ss + int64_t(hkv) * p.v_sh,
                                       p.v_ss, kv_rows, p.D, p.v, tid);
  };

  float acc_o[MT][DT][4];
  zero_acc(acc_o);
  OnlineSoftmax<MT> sm;
  sm.reset();
  float tbc[Tr::kCacheTB ? MT : 1][Tr::kCacheTB ? NT : 2][4];
  const bool use_cache = Tr::kCacheTB && p.cache_tb && nper == 1;

  load_q(w.batch(p, 0));
  load_kv(w.batch(p, 0), n_lo, 0);
  cp_async_commit();

  for (int s = 0; s < nsteps; ++s) {
    const int t = s / nper, n = n_lo + s % nper;
    const int b = w.batch(p, t);
    cp_async_wait_all();
    __syncthreads();
    if (s + 1 < nsteps) load_kv(w.batch(p, (s + 1) / nper), n_lo + (s + 1) % nper, (s + 1) & 1);
    cp_async_commit();

    // score terms (issued before the GEMM so their loads overlap it)
    float add[MT][NT][4];
    const bool need_terms = has_batch || (has_static && (p.tb != nullptr || tile_needs_mask(p, m_block, n, BM, BN)));
    if (need_terms) {
      if constexpr (Tr::kCacheTB) {
        if (use_cache) {
          if (s == 0) terms_static<MT, NT>(tbc, p, h, i0 + wr, n * BN, lane);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) add[mt][nt][e] = tbc[mt][nt][e];
        } else {
          terms_static<MT, NT>(add, p, h, i0 + wr, n * BN, lane);
        }
      } else {
        terms_static<MT, NT>(add, p, h, i0 + wr, n * BN, lane);
      }
      terms_batch<MT, NT>(add, p, b, h, i0 + wr, n * BN, lane);
    }

    // S = Q K^T
    float acc_s[MT][NT][4];
    zero_acc(acc_s);
    gemm_ss<Elem, MT, NT, DK / 16, false, false>(acc_s, sQ + wr * LD, LD, sK + (s & 1) * Tr::kKVElems, LD, lane);
    const bool item_end = (n == n_hi - 1);
    if (item_end && t + 1 < w.nitems) {
      __syncthreads();  // every warp is done with sQ
      load_q(w.batch(p, t + 1));
      cp_async_commit();
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc_s[mt][nt][e] = need_terms ? fmaf(acc_s[mt][nt][e], p.scale_log2, add[mt][nt][e])
                                        : acc_s[mt][nt][e] * p.scale_log2;

    sm.template update<NT, DT>(acc_s, acc_o);

    // O += P V
    uint32_t pf[MT][NT / 2][4];
    acc_to_afrag<Elem, MT, NT>(pf, acc_s);
    gemm_rs<Elem, MT, DT, NT / 2, true>(acc_o, pf, sV + (s & 1) * Tr::kKVElems, LD, lane);

    if (item_end) {
      // epilogue: normalize, write O and lse
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float l = quad_sum(sm.row_sum[mt][hf]);
          const float inv = l > 0.f ? 1.f / l : 0.f;
          const int i = i0 + wr + mt * 16 + qr + hf * 8;
          if (i < p.Sq) {
            Elem* orow = o + int64_t(b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
              const int d = dt * 8 + qc;
              if (d < p.D)
                *reinterpret_cast<uint32_t*>(orow + d) =
                    ElemTraits<Elem>::pack(acc_o[mt][dt][2 * hf] * inv, acc_o[mt][dt][2 * hf + 1] * inv);
            }
            if ((lane & 3) == 0)
              p.lse[(int64_t(b) * p.H + h) * p.Sq + i] =
                  l > 0.f ? (sm.row_max[mt][hf] + log2f(l)) * kLn2 : -INFINITY;
          }
        }
      zero_acc(acc_o);
      sm.reset();
    }
  }
}

}  // namespace cuda
}  // namespace winattn
