// Hopper forward kernel (sm_90a): the v1 forward (fwd_kernel.h) with both GEMMs on warpgroup MMA.
//
// Same work decomposition, cp.async double-buffered K/V pipeline, score terms (score_mod.h), online softmax
// (softmax.h) and epilogue as v1; what changes is the MMA: each warpgroup (4 warps, 128 threads)
// owns 64 query rows and issues
//   S[64 x BN]  = Q K^T  as wgmma m64nBNk16 with Q and K read from shared memory by descriptor, and
//   O[64 x D]  += P V    as wgmma m64nDk16 with P in registers (the S accumulator, rounded) and V by descriptor,
// so no warp spends registers or issue slots on ldmatrix B fragments. The wgmma accumulator layout per warp is the
// mma.sync m16n8 C layout repeated along N (PTX "wgmma-64N16-D"), so every v1 helper that works on
// acc[MT = 1][NT][4] fragments applies unchanged, with the warp's first row at warp * 16.
// The planner runs this kernel only without an additive term (it lost to v1 with one, see winattn_cuda.cu), so the
// term is not staged in shared memory: if one is passed anyway, apply_terms() reads it from global memory.
#pragma once
#include "../block_info.h"
#include "../gemm.h"
#include "../kernel_params.h"
#include "../score_mod.h"
#include "../softmax.h"
#include "kernel_traits_sm90.h"
#include "tile_sm90.h"
#include "wgmma_ops.h"

namespace winattn {
namespace cuda {
namespace sm90 {

template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kNThreads) fwd_kernel_sm90(const __grid_constant__ KParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim;
  constexpr int NT = Tr::kNT, DT = Tr::kDT, NTH = Tr::kNThreads, QS = Tr::kQStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  unsigned char* sQ = smem;                       // [QS][BM x DK] swizzled
  unsigned char* sK = sQ + QS * Tr::kQBytes;      // [2][BN x DK]
  unsigned char* sV = sK + 2 * Tr::kKVBytes;      // [2][BN x DK]
  unsigned char* sKp = sV + 2 * Tr::kKVBytes;     // [2][BN] key-padding bytes of the K/V stage (kp_vec4)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const Work w = decode_work(p, p.H);
  const int h = w.hx, m_block = w.blk, hkv = h / p.hgroup;
  const int i0 = m_block * BM;
  const int rows_valid = min(BM, p.Sq - i0);
  const int wr = warp * 16;  // warp's first row in the block
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
  const bool has_row_terms = p.bias.ptr != nullptr || p.mask.ptr != nullptr;  // terms that vary along a column

  auto load_q = [&](int b, int stage) {
    load_tile_async<Elem, BM, DK, NTH>(sQ + stage * Tr::kQBytes,
                                       q + int64_t(b) * p.q_sb + int64_t(i0) * p.q_ss + int64_t(h) * p.q_sh,
                                       p.q_ss, rows_valid, p.D, p.q, tid);
  };
  auto load_step = [&](int s, int stage) {  // K and V of step s
    const int b = w.batch(p, s / nper), n = n_lo + s % nper;
    const int j0 = n * BN, kv_rows = min(BN, p.Sk - j0);
    load_tile_async<Elem, BN, DK, NTH>(sK + stage * Tr::kKVBytes,
                                       k + int64_t(b) * p.k_sb + int64_t(j0) * p.k_ss + int64_t(hkv) * p.k_sh,
                                       p.k_ss, kv_rows, p.D, p.k, tid);
    load_tile_async<Elem, BN, DK, NTH>(sV + stage * Tr::kKVBytes,
                                       v + int64_t(b) * p.v_sb + int64_t(j0) * p.v_ss + int64_t(hkv) * p.v_sh,
                                       p.v_ss, kv_rows, p.D, p.v, tid);
    if (p.kp_vec4 && tid < BN / 4) {  // key-padding bytes of the block, with K / V (0 = masked past Sk)
      const unsigned char* src = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb + j0 + tid * 4;
      int bytes = kv_rows - tid * 4;
      bytes = bytes < 0 ? 0 : bytes > 4 ? 4 : bytes;
      cp_async_bytes(sKp + stage * BN + tid * 4, bytes > 0 ? static_cast<const void*>(src) : p.kp, bytes, 4);
    }
  };

  float acc_o[1][DT][4];
  zero_acc(acc_o);
  OnlineSoftmax<1> sm;
  sm.reset();

  load_q(w.batch(p, 0), 0);
  load_step(0, 0);
  cp_async_commit();

  const uint32_t sQ_addr = smem_u32(sQ) + wg * 64 * kSwizzleRowBytes, sK_addr = smem_u32(sK), sV_addr = smem_u32(sV);
  for (int s = 0; s < nsteps; ++s) {
    const int t = s / nper, n = n_lo + s % nper;
    const int b = w.batch(p, t);
    const int qs = QS == 2 ? (t & 1) : 0;
    const bool item_end = (n == n_hi - 1);
    cp_async_wait_all();
    fence_view_async_shared();
    __syncthreads();
    if (s + 1 < nsteps) {
      load_step(s + 1, (s + 1) & 1);
      if constexpr (QS == 2)
        if (item_end) load_q(w.batch(p, t + 1), (t + 1) & 1);
    }
    cp_async_commit();

    // Key padding of this key block's columns as bits (bit 2 * nt + e: column nt * 8 + qc + e is kept): from the
    // bytes staged with K / V (kp_vec4), else from global memory.
    const bool need_mask = tile_needs_mask(p, m_block, n, BM, BN);
    const bool col_terms = !has_row_terms && !(p.has_band && need_mask) && (need_mask || p.kp != nullptr);
    unsigned kp_bits = 0xffffffffu;
    // staged bytes are 0 past Sk, so "all kept" also means "block inside the sequence"
    const bool all_kept = col_terms && p.kp_vec4 && kp_block_all_kept<BN>(sKp + (s & 1) * BN, lane);
    if (col_terms && p.kp != nullptr && !all_kept) {
      kp_bits = 0;
      if (p.kp_vec4) {
        const unsigned char* row = sKp + (s & 1) * BN;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const unsigned short pair = *reinterpret_cast<const unsigned short*>(row + nt * 8 + qc);
          kp_bits |= (unsigned((pair & 0xff) != 0) | (unsigned((pair >> 8) != 0) << 1)) << (2 * nt);
        }
      } else {
        const unsigned char* kp_row = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = n * BN + nt * 8 + qc + e;
            if (j < p.Sk && __ldg(kp_row + int64_t(j) * p.kp_sk) != 0) kp_bits |= 1u << (2 * nt + e);
          }
      }
    }

    // S = Q K^T: k16 step ks reads column block ks / 2 at byte offset (ks % 2) * 32 of Q's and K's rows
    float acc_s[1][NT][4];
    {
      const uint32_t qa = sQ_addr + qs * Tr::kQBytes, ka = sK_addr + (s & 1) * Tr::kKVBytes;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < DK / 16; ++ks) {
        const uint64_t da = make_desc(qa + (ks >> 1) * (BM * kSwizzleRowBytes) + (ks & 1) * 32, 16, 512);
        const uint64_t db = make_desc(ka + (ks >> 1) * (BN * kSwizzleRowBytes) + (ks & 1) * 32, 16, 512);
        wgmma_ss<0, 0>(Int<BN>(), Elem(), acc_s[0], da, db, ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(acc_s[0]);
    }
    if constexpr (QS == 1) {
      if (item_end && t + 1 < w.nitems) {
        __syncthreads();  // every warpgroup is done with sQ
        load_q(w.batch(p, t + 1), 0);
        cp_async_commit();
      }
    }
    if ((!has_row_terms && !need_mask && p.kp == nullptr) || all_kept) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[0][nt][e] *= p.scale_log2;
    } else if (col_terms) {
      // What is left (key padding, the sequence end) depends on the column only: 0 or -inf per column, one FMA per
      // score. apply_terms() spends ~15 instructions per score on the general case, which tripled the forward
      // with a key-padding mask (bench: 5.79 vs 1.89 ms at S=4096, D=128).
      const int sk_left = p.Sk - n * BN;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool keep = ((kp_bits >> (2 * nt + (e & 1))) & 1u) && nt * 8 + qc + (e & 1) < sk_left;
          acc_s[0][nt][e] = keep ? acc_s[0][nt][e] * p.scale_log2 : -INFINITY;
        }
    } else {
      apply_terms<1, NT>(acc_s, p, nullptr, b, h, i0, wr, n * BN, 0, lane, need_mask);
    }

    sm.template update<NT, DT>(acc_s, acc_o);

    // O += P V: k16 step ks covers keys 16 ks .. 16 ks + 15 (1024 bytes into each column block)
    {
      uint32_t pf[1][NT / 2][4];
      acc_to_afrag<Elem, 1, NT>(pf, acc_s);
      const uint32_t va = sV_addr + (s & 1) * Tr::kKVBytes;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < NT / 2; ++ks)
        wgmma_rs<1>(Int<DK>(), Elem(), acc_o[0], pf[0][ks],
                    make_desc(va + ks * 16 * kSwizzleRowBytes, BN * kSwizzleRowBytes, 512), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(acc_o[0]);
    }

    if (item_end) {
      // epilogue: normalize, write O and lse
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float l = quad_sum(sm.row_sum[0][hf]);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int i = i0 + wr + qr + hf * 8;
        if (i < p.Sq) {
          Elem* orow = o + int64_t(b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            const int d = dt * 8 + qc;
            if (d < p.D)
              *reinterpret_cast<uint32_t*>(orow + d) =
                  ElemTraits<Elem>::pack(acc_o[0][dt][2 * hf] * inv, acc_o[0][dt][2 * hf + 1] * inv);
          }
          if ((lane & 3) == 0)
            p.lse[(int64_t(b) * p.H + h) * p.Sq + i] = l > 0.f ? (sm.row_max[0][hf] + log2f(l)) * kLn2 : -INFINITY;
        }
      }
      zero_acc(acc_o);
      sm.reset();
    }
  }
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (fwd_sm90_ready)
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
