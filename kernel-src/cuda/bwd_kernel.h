// Backward kernel (flash-attention 2 algorithm: key-block outer loop, query-block inner loop, P and dS staged in
// shared memory), with the gradient of the additive score terms reduced on-chip to their broadcast shapes.
//
// A CTA owns one key block of one K/V head and a chunk of G batch items; for GQA it loops over the q-heads of the
// group, so dK/dV of the group accumulate in registers without atomics. Per step (item, q-head, query block):
//   S = Q K^T, P = exp2(S * scale * log2e + terms - lse * log2e), dP = dO V^T, dS = P * (dP - delta)
//   dV += P^T dO, dK += dS^T Q, dQ (+)= dS K
// dQ: written directly when there is a single key block; otherwise added into an fp32 accumulator (atomics, or a
// fixed contributor order with semaphores in deterministic mode).
// dS for dbias / dtb (see Target): plain store, atomics, ordered read-add-write, or (window mode) summed over the CTA's items
// in a shared fp32 tile that is flushed once to per-CTA partials (reduced in a fixed order by a later kernel).
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

// Non-deterministic dS reduction into a [rows in {1, Sq}, cols in {1, Sk}] slot with fp32 atomics; broadcast rows /
// cols are summed inside the warp first (quad / column shuffles) so a broadcast slot gets one atomic per warp row /
// column instead of one per score.
template <int MT, int NT>
__device__ __forceinline__ void target_atomic(float* base, int rows, int cols, const float (&ds)[MT][NT][4], int Sq,
                                              int Sk, int i_w, int j_w, int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  if (rows != 1 && cols != 1) {
    const bool pairs = (cols & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = i_w + mt * 16 + qr + hf * 8;
        if (i >= Sq) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int j = j_w + nt * 8 + qc;
          float* ptr = base + int64_t(i) * cols + j;
          if (pairs && j + 1 < Sk) {
            atomic_add2(ptr, ds[mt][nt][2 * hf], ds[mt][nt][2 * hf + 1]);
          } else {
            if (j < Sk) atomicAdd(ptr, ds[mt][nt][2 * hf]);
            if (j + 1 < Sk) atomicAdd(ptr + 1, ds[mt][nt][2 * hf + 1]);
          }
        }
      }
    return;
  }
  if (cols == 1 && rows != 1) {  // row sums
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) sum += (j_w + nt * 8 + qc + e < Sk) ? ds[mt][nt][2 * hf + e] : 0.f;
        sum = quad_sum(sum);
        const int i = i_w + mt * 16 + qr + hf * 8;
        if ((lane & 3) == 0 && i < Sq) atomicAdd(base + i, sum);
      }
    return;
  }
  // column sums (rows == 1), or everything (rows == cols == 1)
  float total = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float sum = 0.f;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) sum += (i_w + mt * 16 + qr + hf * 8 < Sq) ? ds[mt][nt][2 * hf + e] : 0.f;
      const int j = j_w + nt * 8 + qc + e;
      if (j >= Sk) sum = 0.f;
      if (cols == 1) {
        total += sum;
      } else {
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        sum += __shfl_xor_sync(0xffffffffu, sum, 8);
        sum += __shfl_xor_sync(0xffffffffu, sum, 16);
        if (lane < 4 && j < Sk) atomicAdd(base + j, sum);
      }
    }
  if (cols == 1) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
    if (lane == 0) atomicAdd(base, total);
  }
}

template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kNThreads, Tr::kMinBlocks) bwd_kernel(const KParams p) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, LD = Tr::kLd, LDS = Tr::kLdS;
  constexpr int NTH = Tr::kNThreads;
  constexpr int SMT = Tr::kSdpMT, SNT = Tr::kSdpNT, KMT = Tr::kKvMT, KNT = Tr::kKvNT, QMT = Tr::kDqMT,
                QNT = Tr::kDqNT;
  constexpr int QS = Tr::kQStages, KS = Tr::kKVStages;
  static_assert(!(QS == 1 && KS == 2), "unsupported pipeline");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);  // [QS][BM][LD]
  Elem* sdO = sQ + QS * Tr::kQElems;              // [QS][BM][LD]
  Elem* sK = sdO + QS * Tr::kQElems;              // [KS][BN][LD]
  Elem* sV = sK + KS * Tr::kKVElems;              // [KS][BN][LD]
  Elem* sP = sV + KS * Tr::kKVElems;              // [BM][LDS]
  Elem* sdS = sP + Tr::kSElems;                   // [BM][LDS]
  float* sLse = reinterpret_cast<float*>(sdS + Tr::kSElems);  // [QS][BM]
  float* sDelta = sLse + QS * BM;                             // [QS][BM]
  unsigned char* sBias = reinterpret_cast<unsigned char*>(sDelta + QS * BM);  // [bias_stages][BM][bias_pitch]
  float* sAcc = reinterpret_cast<float*>(sBias + p.bias_stages * BM * p.bias_pitch);  // window: [Sq][kLdAcc]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  const Work w = decode_work(p, p.Hkv);
  const int hkv = w.hx, n_block = w.blk;
  const int j0 = n_block * BN, kv_rows = min(BN, p.Sk - j0);
  const int mblocks = ceil_div(p.Sq, BM), nblocks = ceil_div(p.Sk, BN);
  const bool window_mode = p.partials != nullptr;

  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  const Elem* dout = static_cast<const Elem*>(p.dout);
  Elem* dq = static_cast<Elem*>(p.dq);
  Elem* dk = static_cast<Elem*>(p.dk);
  Elem* dv = static_cast<Elem*>(p.dv);
  const int64_t dq_ss = int64_t(p.H) * p.D, dq_sb = int64_t(p.Sq) * dq_ss;
  const int64_t dk_ss = int64_t(p.Hkv) * p.D, dk_sb = int64_t(p.Sk) * dk_ss;

  int m_lo, m_hi;
  m_block_range(p, n_block, BM, BN, m_lo, m_hi);
  const int mcount = max(0, m_hi - m_lo);
  const int per_item = p.hgroup * mcount;
  const int nsteps = w.nitems * per_item;

  if (window_mode) {
    const int acc_elems = p.Sq * Tr::kLdAcc;
    for (int idx = tid; idx < acc_elems; idx += NTH) sAcc[idx] = 0.f;
  }

  // dQ rows no key block reaches (single key block only: otherwise the zero-filled accumulator covers them)
  if (p.dq_mode == DqMode::kDirect && mcount < mblocks) {
    for (int t = 0; t < w.nitems; ++t) {
      const int b = w.batch(p, t);
      for (int g = 0; g < p.hgroup; ++g) {
        const int h = hkv * p.hgroup + g;
        for (int m = 0; m < mblocks; ++m) {
          if (m >= m_lo && m < m_hi) continue;
          const int rows = min(BM, p.Sq - m * BM);
          for (int idx = tid; idx < rows * p.D; idx += NTH) {
            const int r = idx / p.D, d = idx % p.D;
            dq[int64_t(b) * dq_sb + int64_t(m * BM + r) * dq_ss + int64_t(h) * p.D + d] = Elem(0.f);
          }
        }
      }
    }
  }

  const bool has_terms = p.bias.ptr != nullptr || p.mask.ptr != nullptr || p.kp != nullptr;
  const bool kp_only = p.kp_vec4 && p.bias.ptr == nullptr && p.mask.ptr == nullptr;  // see kp_block_all_kept
  // additive tile: prefetched with Q / dO (bias_stages == QS), or loaded at the top of its own step
  // (bias_stages == 1 with a double-buffered Q / dO), or read from global memory (0)
  const bool bias_prefetch = p.bias.ptr != nullptr && p.bias_stages == QS;
  const bool bias_sync = p.bias.ptr != nullptr && p.bias_stages == 1 && QS == 2;
  const int bias_tile = BM * p.bias_pitch;

  auto step_coords = [&](int s, int& t, int& g, int& m) {
    t = s / per_item;
    const int rem = s % per_item;
    g = rem / mcount;
    m = m_lo + rem % mcount;
  };
  auto load_q_do = [&](int s, int stage) {
    int t, g, m;
    step_coords(s, t, g, m);
    const int b = w.batch(p, t), h = hkv * p.hgroup + g, i0 = m * BM, rows = min(BM, p.Sq - i0);
    load_rows_async<Elem, BM, DK, NTH>(sQ + stage * Tr::kQElems,
                                       q + int64_t(b) * p.q_sb + int64_t(i0) * p.q_ss + int64_t(h) * p.q_sh,
                                       p.q_ss, rows, p.D, p.q, tid);
    load_rows_async<Elem, BM, DK, NTH>(sdO + stage * Tr::kQElems,
                                       dout + int64_t(b) * p.do_sb + int64_t(i0) * p.do_ss + int64_t(h) * p.do_sh,
                                       p.do_ss, rows, p.D, p.dout, tid);
    const int64_t row0 = (int64_t(b) * p.H + h) * p.Sq + i0;
    load_vec_async<BM, NTH>(sLse + stage * BM, p.lse + row0, rows, tid);
    load_vec_async<BM, NTH>(sDelta + stage * BM, p.delta + row0, rows, tid);
    if (bias_prefetch) load_bias_tile<BM, BN, NTH>(sBias + stage * bias_tile, p, b, h, i0, j0, tid);
  };
  auto load_kv = [&](int t, int stage) {
    const int b = w.batch(p, t);
    load_rows_async<Elem, BN, DK, NTH>(sK + stage * Tr::kKVElems,
                                       k + int64_t(b) * p.k_sb + int64_t(j0) * p.k_ss + int64_t(hkv) * p.k_sh,
                                       p.k_ss, kv_rows, p.D, p.k, tid);
    load_rows_async<Elem, BN, DK, NTH>(sV + stage * Tr::kKVElems,
                                       v + int64_t(b) * p.v_sb + int64_t(j0) * p.v_ss + int64_t(hkv) * p.v_sh,
                                       p.v_ss, kv_rows, p.D, p.v, tid);
  };

  // warp roles
  const bool sdp_warp = warp < Tr::kSdpWM * Tr::kSdpWN;
  const int sdp_r = (warp / Tr::kSdpWN) * 16 * SMT, sdp_c = (warp % Tr::kSdpWN) * 8 * SNT;
  const bool kv_warp = warp < Tr::kKvWN * Tr::kKvWD;
  const int kv_r = (warp / Tr::kKvWD) * 16 * KMT, kv_c = (warp % Tr::kKvWD) * 8 * KNT;
  const bool dq_warp = warp < Tr::kDqWM * Tr::kDqWD;
  const int dq_r = (warp / Tr::kDqWD) * 16 * QMT, dq_c = (warp % Tr::kDqWD) * 8 * QNT;

  float acc_dk[KMT][KNT][4], acc_dv[KMT][KNT][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);

  if (nsteps == 0) {
    // no query reaches this key block: dK = dV = 0
    for (int t = 0; t < w.nitems; ++t) {
      const int b = w.batch(p, t);
      for (int idx = tid; idx < kv_rows * p.D; idx += NTH) {
        const int r = idx / p.D, d = idx % p.D;
        const int64_t off = int64_t(b) * dk_sb + int64_t(j0 + r) * dk_ss + int64_t(hkv) * p.D + d;
        dk[off] = Elem(0.f);
        dv[off] = Elem(0.f);
      }
    }
  } else {
    load_kv(0, 0);
    load_q_do(0, 0);
    cp_async_commit();
  }

  for (int s = 0; s < nsteps; ++s) {
    int t, g, m;
    step_coords(s, t, g, m);
    const int b = w.batch(p, t), h = hkv * p.hgroup + g, i0 = m * BM;
    const int qs = QS == 2 ? (s & 1) : 0, ks = KS == 2 ? (t & 1) : 0;
    const bool item_end = (s + 1) % per_item == 0;
    const bool next_new_item = item_end && s + 1 < nsteps;
    cp_async_wait_all();
    __syncthreads();
    if constexpr (QS == 2) {
      if (bias_sync) {
        load_bias_tile<BM, BN, NTH>(sBias, p, b, h, i0, j0, tid);
        cp_async_commit();
      }
      if (s + 1 < nsteps) {
        load_q_do(s + 1, (s + 1) & 1);
        if constexpr (KS == 2)
          if (next_new_item) load_kv(t + 1, (t + 1) & 1);
      }
      cp_async_commit();
      if (bias_sync) {
        cp_async_wait_group<1>();
        __syncthreads();
      }
    }
    const Elem* cQ = sQ + qs * Tr::kQElems;
    const Elem* cdO = sdO + qs * Tr::kQElems;
    const Elem* cK = sK + ks * Tr::kKVElems;
    const Elem* cV = sV + ks * Tr::kKVElems;
    const float* cLse = sLse + qs * BM;
    const float* cDelta = sDelta + qs * BM;

    // ---- S, P, dP, dS (S/dP warp grid) ----
    float acc_s[SMT][SNT][4], acc_dp[SMT][SNT][4];
    zero_acc(acc_s);
    zero_acc(acc_dp);
    if (sdp_warp) {
      gemm_ss<Elem, SMT, SNT, DK / 16, false, false>(acc_s, cQ + sdp_r * LD, LD, cK + sdp_c * LD, LD, lane);
      gemm_ss<Elem, SMT, SNT, DK / 16, false, false>(acc_dp, cdO + sdp_r * LD, LD, cV + sdp_c * LD, LD, lane);
      const bool need_mask = tile_needs_mask(p, m, n_block, BM, BN);
      if ((has_terms && !(kp_only && kp_block_all_kept<BN>(p, b, j0, lane))) || need_mask) {
        const unsigned char* sB = bias_prefetch ? sBias + qs * bias_tile : bias_sync ? sBias : nullptr;
        apply_terms<SMT, SNT>(acc_s, p, sB, b, h, i0, sdp_r, j0, sdp_c, lane, need_mask);
      } else {
#pragma unroll
        for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] *= p.scale_log2;
      }
#pragma unroll
      for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = sdp_r + mt * 16 + qr + hf * 8;
          const float lse = cLse[r];
          const float base = lse == -INFINITY ? 0.f : lse * kLog2e;
          const float delta = cDelta[r];
          const bool row_ok = i0 + r < p.Sq;
#pragma unroll
          for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int x = 2 * hf + e;
              const float pv = row_ok ? fast_exp2(acc_s[mt][nt][x] - base) : 0.f;
              acc_s[mt][nt][x] = pv;
              acc_dp[mt][nt][x] = pv * (acc_dp[mt][nt][x] - delta);  // dS
            }
        }
      acc_to_smem<Elem, SMT, SNT>(sP + sdp_r * LDS + sdp_c, LDS, acc_s, lane);
      acc_to_smem<Elem, SMT, SNT>(sdS + sdp_r * LDS + sdp_c, LDS, acc_dp, lane);
    }

    // ---- dS -> dbias / dtb targets (fp32, before rounding) ----
    if (window_mode && sdp_warp) {  // summed over the CTA's items; flushed to partials at the end
#pragma unroll
      for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = i0 + sdp_r + mt * 16 + qr + hf * 8;
          if (i >= p.Sq) continue;
          float* row = sAcc + i * Tr::kLdAcc + sdp_c + qc;
#pragma unroll
          for (int nt = 0; nt < SNT; ++nt) {
            float2 a = *reinterpret_cast<float2*>(row + nt * 8);
            a.x += acc_dp[mt][nt][2 * hf];
            a.y += acc_dp[mt][nt][2 * hf + 1];
            *reinterpret_cast<float2*>(row + nt * 8) = a;
          }
        }
    }
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const Target& T = which == 0 ? p.t_bias : p.t_tb;
      if (T.mode == TargetMode::kNone || T.mode == TargetMode::kAccum) continue;
      const int hT = T.heads == 1 ? 0 : h;
      float* base = T.ptr + (int64_t(b % T.period) * T.heads + hT) * int64_t(T.rows) * T.cols;
      if (T.mode == TargetMode::kAtomic) {
        if (sdp_warp) target_atomic<SMT, SNT>(base, T.rows, T.cols, acc_dp, p.Sq, p.Sk, i0 + sdp_r, j0 + sdp_c, lane);
        continue;
      }
      const bool ordered = T.mode == TargetMode::kOrdered;
      int* sem = nullptr;
      int rank = 0;
      bool first = true, last = true;
      if (ordered) {
        // contributors of a slot tile, in launch order: (hkv if the target is head-broadcast) major, b / period
        // minor; q-heads of one GQA group contribute inside this CTA between its first and last touch.
        sem = T.sems + ((int64_t(b % T.period) * T.heads + hT) * mblocks + m) * nblocks + n_block;
        rank = (T.heads == 1 ? hkv : 0) * (p.B / T.period) + b / T.period;
        if (T.heads == 1) {
          first = g == 0;
          last = g == p.hgroup - 1;
        }
        if (first) sem_wait(sem, rank);
      }
      if (sdp_warp) {
#pragma unroll
        for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int i = i0 + sdp_r + mt * 16 + qr + hf * 8;
            if (i >= p.Sq) continue;
#pragma unroll
            for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = j0 + sdp_c + nt * 8 + qc + e;
                if (j >= p.Sk) continue;
                float* ptr = base + int64_t(i) * p.Sk + j;
                const float val = acc_dp[mt][nt][2 * hf + e];
                if (ordered)
                  st_cg(ptr, ld_cg(ptr) + val);
                else
                  *ptr = val;
              }
          }
      }
      if (ordered && last) sem_signal(sem, rank);
    }
    __syncthreads();  // sP, sdS complete

    // ---- dV += P^T dO, dK += dS^T Q (dK/dV warp grid) ----
    if (kv_warp) {
      gemm_ss<Elem, KMT, KNT, BM / 16, true, true>(acc_dv, sP + kv_r, LDS, cdO + kv_c, LD, lane);
      gemm_ss<Elem, KMT, KNT, BM / 16, true, true>(acc_dk, sdS + kv_r, LDS, cQ + kv_c, LD, lane);
    }

    // ---- dQ = dS K (dQ warp grid) ----
    {
      float acc_dq[QMT][QNT][4];
      zero_acc(acc_dq);
      if (dq_warp)
        gemm_ss<Elem, QMT, QNT, BN / 16, false, true>(acc_dq, sdS + dq_r * LDS, LDS, cK + dq_c, LD, lane);
      const int rows_valid = p.Sq - (i0 + dq_r), cols_valid = p.D - dq_c;
      if (p.dq_mode == DqMode::kDirect) {
        if (dq_warp)
          store_acc_rows<Elem, QMT, QNT>(dq + int64_t(b) * dq_sb + int64_t(i0 + dq_r) * dq_ss + int64_t(h) * p.D + dq_c,
                                         dq_ss, acc_dq, p.scale, rows_valid, cols_valid, lane);
      } else {
        const bool ordered = p.dq_mode == DqMode::kOrdered;
        int* sem = nullptr;
        int rank = 0;
        if (ordered) {
          int nlo, nhi;
          n_block_range(p, m, BM, BN, nlo, nhi);
          rank = n_block - nlo;
          sem = p.dq_sems + (int64_t(b) * p.H + h) * mblocks + m;
          sem_wait(sem, rank);
        }
        if (dq_warp) {
          float* base = p.dq_accum + int64_t(b) * dq_sb + int64_t(i0 + dq_r) * dq_ss + int64_t(h) * p.D + dq_c;
#pragma unroll
          for (int mt = 0; mt < QMT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int r = mt * 16 + qr + hf * 8;
              if (r >= rows_valid) continue;
#pragma unroll
              for (int nt = 0; nt < QNT; ++nt) {
                const int c = nt * 8 + qc;  // D is even: (c, c + 1) are both valid or both not
                if (c >= cols_valid) continue;
                float* ptr = base + int64_t(r) * dq_ss + c;
                const float v0 = acc_dq[mt][nt][2 * hf] * p.scale, v1 = acc_dq[mt][nt][2 * hf + 1] * p.scale;
                if (ordered) {
                  st_cg(ptr, ld_cg(ptr) + v0);
                  st_cg(ptr + 1, ld_cg(ptr + 1) + v1);
                } else {
                  atomic_add2(ptr, v0, v1);
                }
              }
            }
        }
        if (ordered) sem_signal(sem, rank);
      }
    }

    // ---- item end: write dK (scaled), dV ----
    if (item_end) {
      if (kv_warp) {
        const int64_t off = int64_t(b) * dk_sb + int64_t(j0 + kv_r) * dk_ss + int64_t(hkv) * p.D + kv_c;
        store_acc_rows<Elem, KMT, KNT>(dk + off, dk_ss, acc_dk, p.scale, kv_rows - kv_r, p.D - kv_c, lane);
        store_acc_rows<Elem, KMT, KNT>(dv + off, dk_ss, acc_dv, 1.f, kv_rows - kv_r, p.D - kv_c, lane);
      }
      zero_acc(acc_dk);
      zero_acc(acc_dv);
    }

    // ---- single-buffered pipelines: issue the next loads once every warp is done with the buffers ----
    if constexpr (QS == 1) {
      __syncthreads();
      if (s + 1 < nsteps) {
        load_q_do(s + 1, 0);
        if (next_new_item) load_kv(t + 1, 0);
      }
      cp_async_commit();
    } else if constexpr (KS == 1) {
      if (next_new_item) {
        __syncthreads();
        load_kv(t + 1, 0);
        cp_async_commit();
      }
    }
  }

  // ---- window mode: flush this CTA's summed dS tile to its partial slot ----
  if (window_mode) {
    __syncthreads();
    float* dst = p.partials + int64_t(blockIdx.x) * p.Sq * BN;
    const int total = p.Sq * BN;
    for (int idx = tid; idx < total; idx += NTH) {
      const int r = idx / BN, c = idx % BN;
      dst[idx] = sAcc[r * Tr::kLdAcc + c];
    }
  }
}

}  // namespace cuda
}  // namespace winattn
