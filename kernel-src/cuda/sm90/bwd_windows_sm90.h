// Hopper backward for window mode (sm_90a): many short sequences (<= 64 queries and keys each), one head per CTA,
// G windows per CTA, one warpgroup; the counterpart of fwd_windows_sm90.h.
//
// Per window, five warpgroup MMAs on one 64 x 64 tile, no online softmax and no dQ accumulator:
//   S = Q K^T, dP = dO V^T                  (A and B from shared memory, K-major)
//   P = exp2(S * scale * log2e + term - lse * log2e), delta = rowsum(P * dP) - dlse, dS = P * (dP - delta)
//   (registers; rowsum(P * dP) = dO . (P V) = rowsum(dO * O) in exact arithmetic, so no preprocess kernel reads
//   dO and O again: that pass took 127 us of the Swin W7 backward)
//   dQ = scale * dS K                       (dS from registers, K N-major)
//   dV = P^T dO, dK = scale * dS^T Q        (P, dS staged in shared memory and read M-major: the transpose is free)
// The additive term is the same for every window of the CTA (windows grouped by its period, Pg), so it is applied
// from the fp32 fragment-order table of the forward (fast path) and its gradient, dS summed over the CTA's
// windows, stays in registers until one flush to the CTA's partial slot (reduced in a fixed order afterwards, as
// the v1 window mode: deterministic).
#pragma once
#include "../block_info.h"
#include "../gemm.h"
#include "../kernel_params.h"
#include "../score_mod.h"
#include "../softmax.h"
#include "../tile_io.h"
#include "kernel_traits_sm90.h"
#include "tile_sm90.h"
#include "window_terms.h"
#include "wgmma_ops.h"

namespace winattn {
namespace cuda {
namespace sm90 {

template <typename Tr, typename Elem>
__global__ void __launch_bounds__(128, Tr::kMinBlocks) bwd_windows_kernel_sm90(const __grid_constant__ KParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = 64, BN = Tr::kBlockN, DK = Tr::kHeadDim, NT = BN / 8, DT = DK / 8;
  constexpr int RB = kSwizzleRowBytes;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  // two window buffers [Q | dO | K | V | lse], then P and dS (bf16, rows = queries), the fp32 term table,
  // and (unless aliased with the second window buffer) the raw term tile
  auto sQ = [&](int st) { return smem + st * Tr::kStageBytes; };
  auto sdO = [&](int st) { return sQ(st) + Tr::kQBytes; };
  auto sK = [&](int st) { return sdO(st) + Tr::kQBytes; };
  auto sV = [&](int st) { return sK(st) + Tr::kKVBytes; };
  auto sLse = [&](int st) { return reinterpret_cast<float*>(sV(st) + Tr::kKVBytes); };
  unsigned char* sP = smem + 2 * Tr::kStageBytes;
  unsigned char* sdS = sP + Tr::kPBytes;
  float4* sTerm = reinterpret_cast<float4*>(sdS + Tr::kPBytes);
  unsigned char* sBias = window_term_aliased<Tr>(p) ? sQ(1) : reinterpret_cast<unsigned char*>(sTerm + NT * 128);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qr = lane >> 2, qc = (lane & 3) * 2, wr = warp * 16;
  const Work w = decode_work(p, p.Hkv);  // H == Hkv on this path
  const int h = w.hx;
  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  const Elem* dout = static_cast<const Elem*>(p.dout);
  Elem* dq = static_cast<Elem*>(p.dq);
  Elem* dk = static_cast<Elem*>(p.dk);
  Elem* dv = static_cast<Elem*>(p.dv);
  const int64_t dq_ss = int64_t(p.H) * p.D, dq_sb = int64_t(p.Sq) * dq_ss;
  const int64_t dk_ss = int64_t(p.Hkv) * p.D, dk_sb = int64_t(p.Sk) * dk_ss;
  const bool fast = window_fast_terms(p);
  const bool has_bias = p.bias.ptr != nullptr;

  auto load_window = [&](int b, int st) {
    load_tile_async<Elem, BM, DK, 128>(sQ(st), q + int64_t(b) * p.q_sb + int64_t(h) * p.q_sh, p.q_ss, p.Sq, p.D, p.q,
                                       tid);
    load_tile_async<Elem, BM, DK, 128>(sdO(st), dout + int64_t(b) * p.do_sb + int64_t(h) * p.do_sh, p.do_ss, p.Sq, p.D,
                                       p.dout, tid);
    load_tile_async<Elem, BN, DK, 128>(sK(st), k + int64_t(b) * p.k_sb + int64_t(h) * p.k_sh, p.k_ss, p.Sk, p.D, p.k,
                                       tid);
    load_tile_async<Elem, BN, DK, 128>(sV(st), v + int64_t(b) * p.v_sb + int64_t(h) * p.v_sh, p.v_ss, p.Sk, p.D, p.v,
                                       tid);
    const int64_t row0 = (int64_t(b) * p.H + h) * p.Sq;
    load_vec_async<BM, 128>(sLse(st), p.lse + row0, p.Sq, tid);
  };

  if (has_bias) load_bias_tile<BM, BN, 128>(sBias, p, w.batch(p, 0), h, 0, 0, tid);
  load_window(w.batch(p, 0), 0);
  cp_async_commit();
  if (fast) {
    cp_async_wait_all();
    __syncthreads();
    build_term_table<NT, false>(sTerm, has_bias ? sBias : nullptr, p, wr, p.Sq, tid);
  }

  float acc_db[NT][4];  // dS summed over this CTA's windows (fp32, before rounding)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_db[nt][e] = 0.f;

  for (int t = 0; t < w.nitems; ++t) {
    const int b = w.batch(p, t), st = t & 1;
    cp_async_wait_all();
    fence_view_async_shared();
    __syncthreads();
    if (t + 1 < w.nitems) load_window(w.batch(p, t + 1), st ^ 1);
    cp_async_commit();
    const uint32_t q_a = smem_u32(sQ(st)), do_a = smem_u32(sdO(st)), k_a = smem_u32(sK(st)), v_a = smem_u32(sV(st));

    // S = Q K^T and dP = dO V^T
    float acc_s[1][NT][4], acc_dp[1][NT][4];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
      const uint32_t off_m = (ks >> 1) * (BM * RB) + (ks & 1) * 32, off_n = (ks >> 1) * (BN * RB) + (ks & 1) * 32;
      wgmma_ss<0, 0>(Int<BN>(), Elem(), acc_s[0], make_desc(q_a + off_m, 16, 512), make_desc(k_a + off_n, 16, 512),
                     ks > 0);
      wgmma_ss<0, 0>(Int<BN>(), Elem(), acc_dp[0], make_desc(do_a + off_m, 16, 512), make_desc(v_a + off_n, 16, 512),
                     ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(acc_s[0]);
    fence_acc(acc_dp[0]);

    if (fast) {
      apply_term_table<NT, false>(acc_s[0], smem_u32(sTerm), p.scale_log2, tid);  // (no folded mask: kernel_choice.h)
    } else {
      apply_terms<1, NT>(acc_s, p, has_bias ? sBias : nullptr, b, h, 0, wr, 0, 0, lane, true);
    }

    // P, delta and dS (registers)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = wr + qr + hf * 8;
      const float lse = sLse(st)[r];
      const float base = lse == -INFINITY ? 0.f : lse * kLog2e;
      const bool row_ok = r < p.Sq;
      float delta = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x = 2 * hf + e;
          const float pv = row_ok ? fast_exp2(acc_s[0][nt][x] - base) : 0.f;
          acc_s[0][nt][x] = pv;
          delta = fmaf(pv, acc_dp[0][nt][x], delta);
        }
      delta = quad_sum(delta);
      if (p.dlse != nullptr && row_ok) delta -= p.dlse[(int64_t(b) * p.H + h) * p.Sq + r];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int x = 2 * hf + e;
          acc_dp[0][nt][x] = acc_s[0][nt][x] * (acc_dp[0][nt][x] - delta);
          acc_db[nt][x] += acc_dp[0][nt][x];
        }
      }
    }

    uint32_t dsf[1][NT / 2][4];
    acc_to_afrag<Elem, 1, NT>(dsf, acc_dp);

    // P, dS -> shared memory (rows = queries) for the transposed GEMMs
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = wr + qr + hf * 8;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int off = tile_chunk_offset<BM>(r, nt) + qc * 2;
        *reinterpret_cast<uint32_t*>(sP + off) = ElemTraits<Elem>::pack(acc_s[0][nt][2 * hf], acc_s[0][nt][2 * hf + 1]);
        *reinterpret_cast<uint32_t*>(sdS + off) =
            ElemTraits<Elem>::pack(acc_dp[0][nt][2 * hf], acc_dp[0][nt][2 * hf + 1]);
      }
    }
    fence_view_async_shared();
    __syncthreads();

    // dQ = dS K (rows = queries), then dV = P^T dO and dK = dS^T Q (rows = keys); dQ is stored while they run
    float acc_dq[1][DT][4], acc_dk[1][DT][4], acc_dv[1][DT][4];
    const uint32_t p_a = smem_u32(sP), ds_a = smem_u32(sdS);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks)
      wgmma_rs<1>(Int<DK>(), Elem(), acc_dq[0], dsf[0][ks], make_desc(k_a + ks * 16 * RB, BN * RB, 512), ks > 0);
    wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < BM / 16; ++ks) {
      const uint32_t off = ks * 16 * RB;
      wgmma_ss<1, 1>(Int<DK>(), Elem(), acc_dv[0], make_desc(p_a + off, BM * RB, 512),
                     make_desc(do_a + off, BM * RB, 512), ks > 0);
      wgmma_ss<1, 1>(Int<DK>(), Elem(), acc_dk[0], make_desc(ds_a + off, BM * RB, 512),
                     make_desc(q_a + off, BM * RB, 512), ks > 0);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_acc(acc_dq[0]);
    store_acc_rows<Elem, 1, DT>(dq + int64_t(b) * dq_sb + int64_t(wr) * dq_ss + int64_t(h) * p.D, dq_ss, acc_dq,
                                p.scale, p.Sq - wr, p.D, lane);
    wgmma_wait<0>();
    fence_acc(acc_dk[0]);
    fence_acc(acc_dv[0]);

    const int64_t kv_off = int64_t(b) * dk_sb + int64_t(wr) * dk_ss + int64_t(h) * p.D;
    store_acc_rows<Elem, 1, DT>(dk + kv_off, dk_ss, acc_dk, p.scale, p.Sk - wr, p.D, lane);
    store_acc_rows<Elem, 1, DT>(dv + kv_off, dk_ss, acc_dv, 1.f, p.Sk - wr, p.D, lane);
  }

  // this CTA's summed dS -> its partial slot [Sq][BN] (every column: past Sk the sums are 0)
  if (p.partials != nullptr) {
    float* dst = p.partials + int64_t(blockIdx.x) * p.Sq * BN;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = wr + qr + hf * 8;
      if (r < p.Sq) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          *reinterpret_cast<float2*>(dst + r * BN + nt * 8 + qc) =
              make_float2(acc_db[nt][2 * hf], acc_db[nt][2 * hf + 1]);
      }
    }
  }
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (fwd_sm90_ready)
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
