// Forward kernel: tiled online softmax (flash-attention 2 style) with the score terms of score_mod.h.
//
// A CTA owns one query block of one head and a chunk of G batch items (window mode: many small windows per CTA;
// G = 1 for long sequences). It walks the flattened (item, key block) steps; the loads of step s + 1 (K, V, the
// additive-term tile, and the next item's Q when Q is double-buffered) are issued through cp.async at the top of
// step s. With a single Q buffer the next item's Q is loaded after the last S = Q K^T of the current item.
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
  constexpr int MT = Tr::kMT, NT = Tr::kNT, DT = Tr::kDT, NTH = Tr::kNThreads, QS = Tr::kQStages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);  // [QS][BM][LD]
  Elem* sK = sQ + QS * Tr::kQElems;               // [2][BN][LD]
  Elem* sV = sK + 2 * Tr::kKVElems;               // [2][BN][LD]
  unsigned char* sBias = reinterpret_cast<unsigned char*>(sV + 2 * Tr::kKVElems);  // [bias_stages][BM][pitch]

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
  if (n_lo >= n_hi) {  // no key of any row is in the band
    write_empty_rows<Elem, NTH>(p, w, h, i0, rows_valid, tid);
    return;
  }
  const int nper = n_hi - n_lo;
  const int nsteps = w.nitems * nper;
  const bool has_terms = p.bias.ptr != nullptr || p.mask.ptr != nullptr || p.kp != nullptr;
  const bool kp_only = p.kp_vec4 && p.bias.ptr == nullptr && p.mask.ptr == nullptr;  // see kp_block_all_kept
  const bool has_bias = p.bias.ptr != nullptr;
  const int bias_tile = BM * p.bias_pitch;

  auto load_q = [&](int b, int stage) {
    load_rows_async<Elem, BM, DK, NTH>(sQ + stage * Tr::kQElems,
                                       q + int64_t(b) * p.q_sb + int64_t(i0) * p.q_ss + int64_t(h) * p.q_sh,
                                       p.q_ss, rows_valid, p.D, p.q, tid);
  };
  auto load_step = [&](int s, int stage) {  // K, V (and the additive tile when prefetched) of step s
    const int b = w.batch(p, s / nper), n = n_lo + s % nper;
    const int j0 = n * BN, kv_rows = min(BN, p.Sk - j0);
    load_rows_async<Elem, BN, DK, NTH>(sK + stage * Tr::kKVElems,
                                       k + int64_t(b) * p.k_sb + int64_t(j0) * p.k_ss + int64_t(hkv) * p.k_sh,
                                       p.k_ss, kv_rows, p.D, p.k, tid);
    load_rows_async<Elem, BN, DK, NTH>(sV + stage * Tr::kKVElems,
                                       v + int64_t(b) * p.v_sb + int64_t(j0) * p.v_ss + int64_t(hkv) * p.v_sh,
                                       p.v_ss, kv_rows, p.D, p.v, tid);
    if (has_bias && p.bias_stages == 2) load_bias_tile<BM, BN, NTH>(sBias + stage * bias_tile, p, b, h, i0, j0, tid);
  };

  float acc_o[MT][DT][4];
  zero_acc(acc_o);
  OnlineSoftmax<MT> sm;
  sm.reset();

  load_q(w.batch(p, 0), 0);
  load_step(0, 0);
  cp_async_commit();

  for (int s = 0; s < nsteps; ++s) {
    const int t = s / nper, n = n_lo + s % nper;
    const int b = w.batch(p, t);
    const int qs = QS == 2 ? (t & 1) : 0;
    const bool item_end = (n == n_hi - 1);
    cp_async_wait_all();
    __syncthreads();
    const bool bias_sync = has_bias && p.bias_stages == 1;  // tile not prefetched: load it first, wait for it only
    if (bias_sync) {
      load_bias_tile<BM, BN, NTH>(sBias, p, b, h, i0, n * BN, tid);
      cp_async_commit();
    }
    if (s + 1 < nsteps) {
      load_step(s + 1, (s + 1) & 1);
      if constexpr (QS == 2)
        if (item_end) load_q(w.batch(p, t + 1), (t + 1) & 1);
    }
    cp_async_commit();
    const unsigned char* sB = nullptr;
    if (has_bias && p.bias_stages == 2) sB = sBias + (s & 1) * bias_tile;
    if (bias_sync) {
      cp_async_wait_group<1>();
      __syncthreads();
      sB = sBias;
    }

    // S = Q K^T
    float acc_s[MT][NT][4];
    zero_acc(acc_s);
    gemm_ss<Elem, MT, NT, DK / 16, false, false>(acc_s, sQ + qs * Tr::kQElems + wr * LD, LD,
                                                 sK + (s & 1) * Tr::kKVElems, LD, lane);
    if constexpr (QS == 1) {
      if (item_end && t + 1 < w.nitems) {
        __syncthreads();  // every warp is done with sQ
        load_q(w.batch(p, t + 1), 0);
        cp_async_commit();
      }
    }
    const bool need_mask = tile_needs_mask(p, m_block, n, BM, BN);
    if ((has_terms && !(kp_only && kp_block_all_kept<BN>(p, b, n * BN, lane))) || need_mask) {
      apply_terms<MT, NT>(acc_s, p, sB, b, h, i0, wr, n * BN, 0, lane, need_mask);
    } else {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] *= p.scale_log2;
    }

    sm.template update<NT, DT>(acc_s, acc_o);

    // O += P V
    uint32_t pf[MT][NT / 2][4];
    acc_to_afrag<Elem, MT, NT>(pf, acc_s);
    gemm_rs<Elem, MT, DT, NT / 2, true>(acc_o, pf, sV + (s & 1) * Tr::kKVElems, LD, lane);

    if (item_end) {
      // epilogue: normalize, write O and lse (empty and NaN rows: finalize_row, softmax.h)
      write_out_rows<Elem, MT, DT>(o, p, b, h, i0, wr, acc_o, sm.row_max, sm.row_sum, qr, qc);
      zero_acc(acc_o);
      sm.reset();
    }
  }
}

}  // namespace cuda
}  // namespace winattn
