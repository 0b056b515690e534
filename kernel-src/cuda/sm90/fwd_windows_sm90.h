// Hopper forward for window mode (sm_90a): many short sequences (Swin windows, N <= BN <= 256 keys), one head and
// one 64-query tile per CTA, G windows per CTA, one warpgroup.
//
// The general sm90 forward of the time (v2, retired since) spent most of a Swin step on integer work (Nsight, Swin
// W7: 452 M instructions for 65 536 window-heads, ALU the busiest pipe, 49% issue slots at 3 warps per scheduler),
// not on the MMA. This kernel removes the per-step overhead that window mode does not need:
//   * the additive term is the same for every window of the CTA (the planner groups windows by b % period, Pg =
//     period), so it is staged once and converted once into a table in accumulator-fragment order (fp32, scaled by
//     log2(e); past 160 keys the fp16 term), with -inf in the columns past Sk: applying bias + sequence-end mask is
//     one FMA per score (window_terms.h);
//   * one key block per window (BN = 64 / 128 / 160 / 256 by the window's keys): a plain softmax, no running-max
//     rescale of O;
//   * O goes out through shared memory in 16-byte row chunks (coalesced) instead of 4-byte fragment stores;
//   * Q, K and V arrive by TMA (one thread issues a window's boxes on the stage's mbarrier; rows past Sq / Sk and
//     columns past D read as zero): per-thread cp.async took ~15% of the instructions in 64-bit address arithmetic;
//   * on that fast path the raw term tile is staged in the second window buffer, free until the first window
//     has been read (window_term_aliased): 41 KB per CTA, so registers (four CTAs per SM), not shared memory,
//     bound the occupancy.
// Key padding on the wider tiles is a per-window bit vote on top of the table (window_terms.h: hide_padded_keys), and
// a bool mask per window arrives with the window's boxes as bits (KParams::mbits, hide_masked_keys).
// Score terms the fast path does not cover (causal / sliding band; bool masks and key padding in the 64-key tile) take
// apply_terms(), in the 64-key tile only (Tr::kGeneralTerms; with wider windows the planner folds a bool mask
// broadcast over the windows into the fp16 term, fold_window_mask, and sends a band to v3).
#pragma once
#include <cuda.h>

#include "../block_info.h"
#include "../gemm.h"
#include "../kernel_params.h"
#include "../score_mod.h"
#include "../softmax.h"
#include "kernel_traits_sm90.h"
#include "pipeline_sm90.h"
#include "tile_sm90.h"
#include "window_terms.h"
#include "wgmma_ops.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// The kernel's arguments: the common ones and the TMA maps of Q (boxes of 64 rows) and K, V (kBlockN rows), 32
// columns each.
struct FwdWindowParams {
  CUtensorMap tq, tk, tv;
  CUtensorMap tbits;  // a bool mask per window as bits (p.mbits): boxes of [64 rows][p.mb_words]
  KParams p;
};

// kHide: what the wide tiles hide per window beyond the table (window_terms.h: WindowHiding); the 64-key tile
// (Tr::kGeneralTerms) has the kHideNothing instance, which takes every term it cannot table in apply_terms, and the
// kHideFoldedMask one (a bool mask folded into its term table).
template <typename Tr, typename Elem, int kHide>
__global__ void __launch_bounds__(128, Tr::kMinBlocks)
    fwd_windows_kernel_sm90(const __grid_constant__ FwdWindowParams args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const KParams& p = args.p;
  constexpr int BM = 64, BN = Tr::kBlockN, DK = Tr::kHeadDim, NT = BN / 8, DT = DK / 8;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  // two window buffers [Q | K | V] (BM x DK, BN x DK, BN x DK swizzled; Q doubles as the O staging tile), their
  // two mbarriers, then the score-term table [NT][128 threads] in fragment order, then (unless aliased) the raw
  // term tile
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + Tr::kQBytes;
  unsigned char* sV = sK + Tr::kKVBytes;
  const uint32_t full_a = smem_u32(smem + 2 * Tr::kStageBytes);
  unsigned char* sTerm = smem + 2 * Tr::kStageBytes + Tr::kBarsBytes;
  unsigned char* sBias = window_term_aliased<Tr>(p) ? smem + Tr::kStageBytes : sTerm + Tr::kTermBytes;
  // the mask bits of the two stages' windows (after the raw term tile when that is not aliased): fwd_windows_bits_offset
  constexpr bool kBits = kHide == kHideMaskBits;
  const int bits_bytes = kBits ? BM * p.mb_words * 4 : 0;
  const uint32_t bits_a = smem_u32(smem) + fwd_windows_bits_offset<Tr>(p);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qr = lane >> 2, qc = (lane & 3) * 2, wr = warp * 16;
  // The query tiles of a work item are adjacent CTAs (blockIdx.x = item * mtiles + tile), so they run together and
  // read each window's K / V while it is in L2. In decode_work's order (the tile slowest) they ran whole waves
  // apart, and every tile re-read K / V from DRAM (W16, H200, with the cp.async loads of the time: DRAM 54% -> 23%
  // busy, 1.05 ms unchanged, as that kernel was issue-bound; RESULTS v3.3).
  const int mtiles = ceil_div(p.Sq, BM), tile = blockIdx.x % mtiles;
  const Work w = decode_work(p, p.H, blockIdx.x / mtiles);
  const int h = w.hx, hkv = h / p.hgroup;
  const int i0 = tile * BM, rows = min(BM, p.Sq - i0);  // this CTA's query tile of every window
  Elem* o = static_cast<Elem*>(p.o);
  const bool fast = !Tr::kGeneralTerms || window_fast_terms(p);  // the planner checks the wide tiles' terms
  const bool has_bias = p.bias.ptr != nullptr;

  // window b's boxes into stage st (thread 0 only): one 32-column block of each tile per box
  auto issue_window = [&](int b, int st) {
    const uint32_t bar = full_a + st * 8, base = smem_u32(sQ) + st * Tr::kStageBytes;
    mbar_arrive_expect_tx(bar, Tr::kStageBytes + bits_bytes);
#pragma unroll
    for (int cb = 0; cb < DK / 32; ++cb) {
      tma_load_4d(base + cb * BM * kSwizzleRowBytes, &args.tq, bar, cb * 32, i0, h, b);
      tma_load_4d(base + Tr::kQBytes + cb * BN * kSwizzleRowBytes, &args.tk, bar, cb * 32, 0, hkv, b);
      tma_load_4d(base + Tr::kQBytes + Tr::kKVBytes + cb * BN * kSwizzleRowBytes, &args.tv, bar, cb * 32, 0, hkv, b);
    }
    if constexpr (kBits)
      tma_load_4d(bits_a + st * bits_bytes, &args.tbits, bar, 0, i0, p.mb_heads > 1 ? h : 0, b % p.mb_period);
  };
  if (tid == 0) {
    mbar_init(full_a, 1);
    mbar_init(full_a + 8, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0) issue_window(w.batch(p, 0), 0);

  // the additive tile (the same for every window of this CTA; cp.async: a tile in the term's own dtype and pitch)
  if (has_bias) {
    load_bias_tile<BM, BN, 128>(sBias, p, w.batch(p, 0), h, i0, 0, tid);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
  }
  if (fast) build_term_table<NT, Tr::kHalfTerms>(sTerm, has_bias ? sBias : nullptr, p, wr, rows, tid);

  const uint32_t sQ_addr = smem_u32(sQ), sK_addr = smem_u32(sK), sV_addr = smem_u32(sV), term_a = smem_u32(sTerm);
  constexpr int NB = (BN + 127) / 128;
  const bool kp_bits = !Tr::kGeneralTerms && kHide != kHideNothing && p.kp != nullptr;
  uint32_t kp_raw[NB];
  if (kp_bits) fetch_key_padding<NB>(kp_raw, p, w.batch(p, 0), lane);
  for (int t = 0; t < w.nitems; ++t) {
    const int b = w.batch(p, t), st = t & 1;
    mbar_wait(full_a + st * 8, (t >> 1) & 1);  // window t landed
    fence_view_async_shared();  // (this thread's generic accesses of window t - 1's stage before TMA rewrites it)
    __syncthreads();            // everyone is done with window t - 1 (stage st ^ 1) and, aliased, the raw term tile
    if (tid == 0 && t + 1 < w.nitems) issue_window(w.batch(p, t + 1), st ^ 1);

    // key padding (wide tiles; the 64-key one takes apply_terms): window t's votes, then window t + 1's fetch
    uint32_t col0[NB], col1[NB];
    const bool padded = kp_bits && vote_key_padding<NB>(col0, col1, kp_raw, qc);
    if (kp_bits && t + 1 < w.nitems) fetch_key_padding<NB>(kp_raw, p, w.batch(p, t + 1), lane);

    // S = Q K^T
    float acc_s[1][NT][4];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
      // k16 step ks: column block ks / 2, byte offset (ks % 2) * 32 within its 64-byte rows
      const uint64_t da =
          make_desc(sQ_addr + st * Tr::kStageBytes + (ks >> 1) * (BM * kSwizzleRowBytes) + (ks & 1) * 32, 16, 512);
      const uint64_t db =
          make_desc(sK_addr + st * Tr::kStageBytes + (ks >> 1) * (BN * kSwizzleRowBytes) + (ks & 1) * 32, 16, 512);
      wgmma_ss<0, 0>(Int<BN>(), Elem(), acc_s[0], da, db, ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(acc_s[0]);

    if (fast) {
      apply_term_table<NT, Tr::kHalfTerms, 128, kHide == kHideFoldedMask>(acc_s[0], term_a, p.scale_log2, tid);
      if (padded) hide_padded_keys<NT, NB>(acc_s[0], col0, col1);
      if constexpr (kBits) hide_masked_keys<NT>(acc_s[0], bits_a + st * bits_bytes, p.mb_words, wr + qr, qc);
    } else if constexpr (Tr::kGeneralTerms) {
      apply_terms<1, NT, true>(acc_s, p, has_bias ? sBias : nullptr, b, h, i0, wr, 0, 0, lane, true);
    }

    // softmax over the one key block (softmax.h; scores already in log2 units; corr = 1: nothing to rescale)
    float row_max[2], row_sum[2], corr[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      softmax_step</*kOnly=*/true>(acc_s[0], hf, Log2Units(), row_max[hf], row_sum[hf], corr[hf]);

    // O = P V (scale_d = 0 on the first k step: no zeroing of acc_o)
    float acc_o[DT][4];
    {
      uint32_t pf[1][NT / 2][4];
      acc_to_afrag<Elem, 1, NT>(pf, acc_s);
      const uint32_t va = sV_addr + st * Tr::kStageBytes;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < NT / 2; ++ks)
        wgmma_rs<1>(Int<DK>(), Elem(), acc_o, pf[0][ks],
                    make_desc(va + ks * 16 * kSwizzleRowBytes, BN * kSwizzleRowBytes, 512),
                    ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(acc_o);
    }

    // epilogue: normalized O into this window's (consumed) Q stage, then 16-byte row chunks to global; lse
    // (st.shared / ld.shared by address rather than through generic pointers; empty and NaN rows: finalize_row)
    const uint32_t sO_a = sQ_addr + st * Tr::kStageBytes;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const RowFinal f = finalize_row(row_max[hf], row_sum[hf]);
      const float inv = f.scale();
      const int r = wr + qr + hf * 8;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        sts_u32(sO_a + tile_chunk_offset<BM>(r, dt) + qc * 2,
                ElemTraits<Elem>::pack(acc_o[dt][2 * hf] * inv, acc_o[dt][2 * hf + 1] * inv));
      if ((lane & 3) == 0 && r < rows) p.lse[(int64_t(b) * p.H + h) * p.Sq + i0 + r] = f.lse();
    }
    __syncthreads();
    Elem* ob = o + int64_t(b) * p.o_sb + int64_t(i0) * p.o_ss + int64_t(h) * p.o_sh;
#pragma unroll
    for (int it = 0; it < BM * DT / 128; ++it) {
      const int idx = it * 128 + tid, r = idx / DT, c = idx % DT;
      if (r < rows && c * 8 < p.D) {
        const float4 x = lds_f32x4(sO_a + tile_chunk_offset<BM>(r, c));  // (8 raw 16-bit values)
        *reinterpret_cast<float4*>(ob + int64_t(r) * p.o_ss + c * 8) = x;
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
