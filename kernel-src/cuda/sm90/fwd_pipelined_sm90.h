// Hopper forward v3 (sm_90a): the pipelined, warp-specialized kernel that runs every non-window forward on Hopper.
//
// Design (FlashAttention-3's, written for this project's score terms):
//   * one CTA per (batch, head, 128-query tile): 3 warpgroups (4 with the 192-row tile: FwdPipeRows192TraitsSm90).
//     Warpgroup 0 is the producer: one thread issues TMA
//     bulk tensor loads of Q (once) and of K / V (per key block) into a kStages-deep ring of shared-memory stages,
//     each guarded by a "full" mbarrier (TMA transaction bytes) and an "empty" one (consumer warps' arrivals).
//     setmaxnreg gives its registers to the consumers (kProducerRegs / kConsumerRegs).
//   * the others are consumers, 64 query rows each: S = Q K^T and O += P V on wgmma (Q, K, V by descriptor,
//     P from registers, or from shared memory in the 192-row tile past head dim 64: Tr::kPInSmem), the score terms
//     (score_mod.h) and the online softmax in registers.
//   * intra-warpgroup overlap: the QK^T of key block n+1 is issued before the P V of block n, so the softmax of
//     block n+1 runs while the tensor cores do P V (two wgmma groups in flight; wgmma_wait<1>); not in the two-CTA
//     tiles, whose 104 registers cannot hold S and P at once (Tr::kOverlapQkPv).
//   * exp2 with the softmax scale folded into one FMA where the scores are still raw (no additive term).
//   * the epilogue (fwd_epilogue_sm90.h): O through shared memory and one TMA store per warp and 32-column block
//     where the tile has room for it (fwd_v3_o_via_smem), else each thread's fragment stores.
//   * key blocks are visited from the last visible one down, so the tiles that need the sequence-end / causal
//     mask come first; tiles are ordered by (batch, head) and, within a head, longest query tile first (causal).
//   * the schedule (kernel_choice.h): one CTA per tile, or a persistent grid whose CTAs walk the tiles strided or
//     take each next one from a counter (the dynamic schedule of band calls; post_tile / take_tile).
// Tile layout: the swizzled column blocks of tile_sm90.h, which TMA writes directly (one box per column block):
// [rows x 64] with SWIZZLE_128B at head dims that are multiples of 64, [rows x 32] with SWIZZLE_64B at the other
// multiples of 32 and at 80 (three blocks, the GEMMs over 80 columns: Tr::kTileCols), [rows x 16] with SWIZZLE_32B
// at 48 (Tr::kRowBytes); rows past S and columns past D arrive as zeros.
#pragma once
#include <cuda.h>

#include <type_traits>

#include "../block_info.h"
#include "../gemm.h"
#include "../kernel_params.h"
#include "../score_mod.h"
#include "../softmax.h"
#include "../tile_io.h"
#include "fwd_epilogue_sm90.h"
#include "kernel_traits_sm90.h"
#include "pipeline_sm90.h"
#include "score_terms_sm90.h"
#include "tile_sm90.h"
#include "wgmma_ops.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// Kernel parameters: the common KParams plus the tensor maps (built by the host, passed by value as a
// __grid_constant__ so TMA reads them from the parameter space). bias_stage_bytes > 0: the additive term is a
// full-rows / full-columns 16-bit tile of the input dtype, staged through TMA with each K block (tb); else it is
// read from global memory by apply_terms.
struct FwdPipeParams {
  KParams p;
  CUtensorMap tq, tk, tv, tb;
  CUtensorMap to;  // O in 16-row boxes, where the epilogue stores through shared memory (fwd_v3_o_via_smem)
  int bias_stage_bytes = 0;
  // The dynamic schedule (kernel_choice.h FwdChoice::v3_dynamic): a zeroed counter in the workspace; CTA c's first
  // tile is c, each later one gridDim.x + the count its producer takes (nullptr: the static schedule)
  int* tile_counter = nullptr;
  // K / V resident across a head's query tiles (kernel_choice.h kv_resident_pays: the no-term streamed tile whose key
  // blocks fill its stages exactly, no band, the strided persistent grid): each CTA walks the query tiles of one
  // (batch, head) in turn (walk_tile) and its producer loads K / V once per head, not once per query tile (produce's
  // reuse_kv)
  int kv_reuse = 0;
};

// Rows [i0, i0 + rows) of a tile that sees no key: out = 0, lse = -inf.
template <typename Elem>
__device__ __forceinline__ void write_empty_tile(const KParams& p, int b, int h, int i0, int rows, int tid,
                                                 int nthreads) {
  Elem* o = static_cast<Elem*>(p.o);
  for (int idx = tid; idx < rows * p.D; idx += nthreads) {
    const int r = idx / p.D, d = idx % p.D;
    o[int64_t(b) * p.o_sb + int64_t(i0 + r) * p.o_ss + int64_t(h) * p.o_sh + d] = Elem(0.f);
  }
  for (int r = tid; r < rows; r += nthreads) p.lse[(int64_t(b) * p.H + h) * p.Sq + i0 + r] = -INFINITY;
}

// Shared memory of one CTA at compile-time offsets from one base address (registers are what the consumers are
// short of): Q slots | K stages | V stages | P tiles (Tr::kPInSmem) | mbarriers (1 KB) | bias stages (their size is a
// run-time choice) or row slots. One Q slot, but for the single-block tiles (Tr::kQSlots: the next tile's Q loads
// while this one computes; slot 1's barriers follow the others, so the one-slot layout is as it was).
template <typename Tr>
struct PipeSmem {
  static constexpr int kK = Tr::kQSlots * Tr::kQBytes, kV = kK + Tr::kStages * Tr::kKVBytes;
  static constexpr int kP = kV + Tr::kStages * Tr::kKVBytes;
  static constexpr int kBars = Tr::kTilesBytes, kBias = kBars + 1024;
  uint32_t base;
  __device__ __forceinline__ uint32_t q(int slot = 0) const { return base + slot * Tr::kQBytes; }
  __device__ __forceinline__ uint32_t k(int s) const { return base + kK + s * Tr::kKVBytes; }
  __device__ __forceinline__ uint32_t v(int s) const { return base + kV + s * Tr::kKVBytes; }
  // consumer warpgroup cw's [64 x kBlockN] P tile (Tr::kPInSmem)
  __device__ __forceinline__ uint32_t p(int cw) const { return base + kP + cw * 64 * Tr::kBlockN * 2; }
  __device__ __forceinline__ uint32_t q_full(int slot = 0) const {
    return base + kBars + (slot ? 8 * (2 + 4 * Tr::kStages) : 0);
  }
  __device__ __forceinline__ uint32_t k_full(int s) const { return base + kBars + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return base + kBars + 8 * (1 + Tr::kStages + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return base + kBars + 8 * (1 + 2 * Tr::kStages + s); }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return base + kBars + 8 * (1 + 3 * Tr::kStages + s); }
  __device__ __forceinline__ uint32_t q_empty(int slot = 0) const {
    return base + kBars + 8 * (1 + 4 * Tr::kStages) + (slot ? 16 : 0);
  }
  __device__ __forceinline__ uint32_t bias(int s, int stage_bytes) const { return base + kBias + s * stage_bytes; }
  // stages_row modes: the row term of stage s (BN floats) where the bias stages would be, its key padding bits
  // (PadBits) after it (row_bytes each, added at launch); kTermsRawBiasPadded's bits in the mbarriers' kilobyte, past
  // the barriers, so that its launch size is the staged tile's.
  using Pad = PadBits<Tr::kBlockN>;
  static constexpr int kSched = 192, kBarsUsed = 256;
  static_assert(8 * (3 + 4 * Tr::kStages) + 16 <= kSched && kBarsUsed + Tr::kStages * Pad::kBytes <= 1024,
                "the mbarriers, the schedule's mailbox, then the padding bits, fit the kilobyte");
  // The dynamic schedule's mailbox (post_tile / take_tile): two slots of a tile index, each with a full and an empty
  // barrier
  __device__ __forceinline__ uint32_t sched_full(int e) const { return base + kBars + kSched + 8 * e; }
  __device__ __forceinline__ uint32_t sched_empty(int e) const { return base + kBars + kSched + 16 + 8 * e; }
  __device__ __forceinline__ uint32_t sched_slot(int e) const { return base + kBars + kSched + 32 + 4 * e; }
  template <int kMode>
  static constexpr int row_bytes() {
    return (stages_row_term(kMode) ? Tr::kBlockN * 4 : 0) + (kMode == kTermsRawRowPadded ? Pad::kBytes : 0);
  }
  template <int kMode>
  __device__ __forceinline__ uint32_t row_term(int s) const {
    return base + kBias + s * row_bytes<kMode>();
  }
  template <int kMode>
  __device__ __forceinline__ uint32_t pad_bits(int s) const {
    if (kMode == kTermsRawBiasPadded) return base + kBars + kBarsUsed + s * Pad::kBytes;
    return row_term<kMode>(s) + Tr::kBlockN * 4;
  }
  // One stage's term slot past the mbarriers' kilobyte: the row slot, or the staged tile's launch size (0: none).
  // The launch sizes its shared memory from it (fwd_v3_smem), so the kernel's layout and the launch agree.
  template <int kMode>
  __host__ __device__ static constexpr int term_slot_bytes(int bias_stage_bytes) {
    static_assert(!stages_row_term(kMode) || row_bytes<kMode>() <= fwd_v3_term_slot_bound<Tr>(kMode),
                  "the row slots fit the bound of the shared-memory budget (kernel_traits_sm90.h)");
    return stages_row_term(kMode) ? row_bytes<kMode>() : bias_stage_bytes;
  }
  // consumer warpgroup cw's [64 x D] output tile (fwd_v3_o_via_smem), past the term slots
  template <int kMode>
  __device__ __forceinline__ uint32_t o_tile(int cw, int bias_stage_bytes) const {
    return base + kBias + round_up_1024(Tr::kStages * term_slot_bytes<kMode>(bias_stage_bytes)) +
           cw * 64 * Tr::kTileCols * 2;
  }
  // stage s's terms as generic pointers (smem: the address `base` names)
  template <int kMode>
  __device__ __forceinline__ StageTerms terms(const unsigned char* smem, int s, int bias_stage_bytes) const {
    return {smem + (bias(s, bias_stage_bytes) - base),
            reinterpret_cast<const float*>(smem + (row_term<kMode>(s) - base)),
            reinterpret_cast<const uint32_t*>(smem + (pad_bits<kMode>(s) - base))};
  }
};

// One work tile: (batch, head, 128-query block) and its visible key blocks [n_lo, n_hi).
struct PipeTile {
  int b, h, m_block, n_lo, n_hi;
  __device__ __forceinline__ bool empty() const { return n_lo >= n_hi; }
};
// Tile order: the tiles that share K / V run together (L2), longest query tile first (causal); with an additive
// term broadcast over the batch, the items sharing a term tile run side by side too, so it is read from HBM once
// (dense bias [1, H, S, S], B = 2: 0.497 ms with (batch, head)-major order).
// Band calls (causal, windows) interleave the tiles of p.band_pairs (batch, head) pairs, longest first across them:
// pair by pair, a pair's longest tile started about when the pair before it was done, so the last pair's longest tile
// set the end of the call (~5% past the balanced end with 64 tiles per pair, Llama-3 prefill, by a list-scheduling
// model of the hardware's in-order block dispatch; ~0.5% at 128 tiles per pair). Measured (H100 kernel time, two
// calls, RESULTS v5.3): Mistral's window and Llama-3 prefill ~-3%, inside the spread; causal 16k unchanged.
template <int BM, int BN>
__device__ __forceinline__ PipeTile decode_tile(const KParams& p, int idx) {
  const int mblocks = ceil_div(p.Sq, BM);
  PipeTile t;
  int mi;
  if (p.bias.ptr != nullptr && p.bias.period == 1 && p.B > 1) {
    t.b = idx % p.B;
    idx /= p.B;
    mi = idx % mblocks;
    t.h = idx / mblocks;
  } else if (p.band_pairs > 1) {
    const PairBlock pb = interleaved_tile(idx, mblocks, p.B * p.H, p.band_pairs);
    mi = pb.block;
    t.h = pb.pair % p.H;
    t.b = pb.pair / p.H;
  } else {
    mi = idx % mblocks;
    idx /= mblocks;
    t.h = idx % p.H;
    t.b = idx / p.H;
  }
  t.m_block = mblocks - 1 - mi;
  n_block_range(p, t.m_block, BM, BN, t.n_lo, t.n_hi);
  return t;
}

// FwdPipeParams::kv_reuse: the tile index (decode_tile's) at walk position idx, where CTA c's k-th tile is position
// c + k gridDim.x as in the strided walk: within each round of gridDim.x heads, CTA c's positions are the query
// tiles of head (round's first + c) one after the other (the last round's R heads: head r % R, query tile r / R,
// a bijection of the positions too). Otherwise idx itself.
template <int BM>
__device__ __forceinline__ int walk_tile(const FwdPipeParams& P, int idx) {
  if (!P.kv_reuse) return idx;
  const int mblocks = ceil_div(P.p.Sq, BM), g = int(gridDim.x), round = g * mblocks;
  const int q = idx / round, r = idx % round, rh = min(g, P.p.B * P.p.H - q * g);
  return (q * g + r % rh) * mblocks + r / rh;
}

// Producer (one thread): Q once (into slot t % kQSlots), then per key block (last visible first) K with its bias
// tile, then V. kb: key blocks this CTA loaded before this tile (the stage ring runs on across tiles); t: tiles
// before it.
// reuse_kv: the previous tile was this head's too and its K / V blocks are still in the stages they go to (kv_reuse:
// every tile's key blocks fill the stages exactly), so each stage is handed over again once the consumers free it.
template <typename Tr>
__device__ __forceinline__ void produce(const FwdPipeParams& P, const PipeSmem<Tr> sm, const PipeTile& tile, int kb,
                                        int t, bool reuse_kv = false) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, ST = Tr::kStages, CB = Tr::kTileCols / Tr::kBlockCols;
  constexpr int W = Tr::kRowBytes, WC = Tr::kBlockCols;
  const KParams& p = P.p;
  const int b = tile.b, h = tile.h, hkv = h / p.hgroup, i0 = tile.m_block * BM, n_hi = tile.n_hi;
  const int nblk = tile.n_hi - tile.n_lo;
  const int bb = P.bias_stage_bytes;
  const int bias_h = p.bias.heads > 1 ? h : 0, bias_b = b % p.bias.period;
  const int qslot = t % Tr::kQSlots, quse = t / Tr::kQSlots;
  if (quse > 0) mbar_wait(sm.q_empty(qslot), (quse - 1) & 1);  // the last Q K^T of the slot's previous tile is done
  mbar_arrive_expect_tx(sm.q_full(qslot), Tr::kQBytes);
#pragma unroll
  for (int c = 0; c < CB; ++c)
    tma_load_4d(sm.q(qslot) + c * BM * W, &P.tq, sm.q_full(qslot), c * WC, i0, h, b);
  for (int it = 0; it < nblk; ++it) {
    const int n = n_hi - 1 - it, s = (kb + it) % ST, use = (kb + it) / ST;
    if (use > 0) mbar_wait(sm.k_empty(s), (use - 1) & 1);
    if (reuse_kv) {
      mbar_arrive(sm.k_full(s));
      mbar_wait(sm.v_empty(s), (use - 1) & 1);
      mbar_arrive(sm.v_full(s));
      continue;
    }
    mbar_arrive_expect_tx(sm.k_full(s), Tr::kKVBytes + bb);
#pragma unroll
    for (int c = 0; c < CB; ++c)
      tma_load_4d(sm.k(s) + c * BN * W, &P.tk, sm.k_full(s), c * WC, n * BN, hkv, b);
    if (bb > 0)
#pragma unroll
      for (int c = 0; c < BN / 64; ++c)
        tma_load_4d(sm.bias(s, bb) + c * BM * 128, &P.tb, sm.k_full(s), n * BN + c * 64, i0, bias_h, bias_b);
    if (use > 0) mbar_wait(sm.v_empty(s), (use - 1) & 1);
    mbar_arrive_expect_tx(sm.v_full(s), Tr::kKVBytes);
#pragma unroll
    for (int c = 0; c < CB; ++c)
      tma_load_4d(sm.v(s) + c * BN * W, &P.tv, sm.v_full(s), c * WC, n * BN, hkv, b);
  }
}

// A consumer warp is done with K stage s (its wgmma reads, the terms it read from the stage): one arrival per warp
// after __syncwarp, but one per thread in the stages_row modes, whose row slots a producer warp overwrites with plain
// stores (not TMA): each reader's own arrival orders its reads before them in a way compute-sanitizer's racecheck
// follows (it flagged the per-warp form: a write-after-read hazard per slot byte).
template <typename Tr, int kMode>
__host__ __device__ constexpr int k_empty_arrivals() {
  return stages_row(kMode) ? Tr::kConsumerWarps * 32 : Tr::kConsumerWarps;
}
__device__ __forceinline__ void release_warp(uint32_t bar, int lane) {  // this warp is done with a stage or slot
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}
template <int kMode>
__device__ __forceinline__ void release_k(uint32_t bar, int lane) {
  if constexpr (stages_row(kMode))
    mbar_arrive(bar);
  else
    release_warp(bar, lane);
}

// The dynamic schedule's mailbox (FwdPipeParams::tile_counter): the producer thread posts each tile index it takes,
// then one past the last tile, in the order it loads them; both consumer warpgroups take them in that order. Post m
// of the CTA uses slot m % 2, once every consumer warp took post m - 2.
template <typename Tr>
__device__ __forceinline__ void post_tile(const PipeSmem<Tr> sm, int m, int idx) {
  if (m >= 2) mbar_wait(sm.sched_empty(m & 1), uint32_t((m >> 1) - 1) & 1u);
  sts_u32(sm.sched_slot(m & 1), uint32_t(idx));
  mbar_arrive(sm.sched_full(m & 1));  // (release: the index is visible to whoever sees the phase complete)
}
template <typename Tr>
__device__ __forceinline__ int take_tile(const PipeSmem<Tr> sm, int m, int lane) {
  mbar_wait(sm.sched_full(m & 1), uint32_t(m >> 1) & 1u);
  const int idx = int(lds_u32(sm.sched_slot(m & 1)));
  release_warp(sm.sched_empty(m & 1), lane);
  return idx;
}

// stages_row modes, producer warp 1: the row term and / or padding bits of every key block the producer loads, in
// the same order (stage_row_term), then one more arrival on the stage's k_full (initialized for two: the TMA thread's
// and this warp's), so that the consumers find them beside K. It waits for the stage as the TMA thread does
// (k_empty: the consumers read the slot in score_terms, before they release K).
template <typename Tr, int kMode>
__device__ __forceinline__ void produce_row_terms(const KParams& p, const PipeSmem<Tr> sm, unsigned char* smem,
                                                  int lane) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, ST = Tr::kStages;
  const int ntiles = ceil_div(p.Sq, BM) * p.H * p.B;
  int kb = 0;
  for (int idx = blockIdx.x; idx < ntiles; idx += gridDim.x) {
    const PipeTile tile = decode_tile<BM, BN>(p, idx);
    for (int n = tile.n_hi - 1; n >= tile.n_lo; --n, ++kb) {
      const int s = kb % ST, use = kb / ST;
      if (use > 0) mbar_wait(sm.k_empty(s), (use - 1) & 1);
      float* term = reinterpret_cast<float*>(smem + (sm.template row_term<kMode>(s) - sm.base));
      uint32_t* pad = reinterpret_cast<uint32_t*>(smem + (sm.template pad_bits<kMode>(s) - sm.base));
      stage_row_term<BN, stages_row_term(kMode), stages_padding(kMode)>(term, pad, p, tile.b, tile.h, n, lane);
      __syncwarp();
      if (lane == 0) mbar_arrive(sm.k_full(s));
    }
  }
}

// O (one warpgroup's 64 x D accumulator fragment) to a new exponent base: corr[hf] scales rows qr + 8 hf
// (softmax_step's correction factors). kLazy: skipped, warp by warp, where no row moved its base (lazy rescaling:
// every corr is 1), which after a row's first blocks is most of them.
template <bool kLazy, int DT>
__device__ __forceinline__ void rescale_o(float (&acc_o)[1][DT][4], const float (&corr)[2]) {
  if (kLazy && !__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    acc_o[0][dt][0] *= corr[0];
    acc_o[0][dt][1] *= corr[0];
    acc_o[0][dt][2] *= corr[1];
    acc_o[0][dt][3] *= corr[1];
  }
}

// Consumer warpgroup cw (0 .. kConsumerWGs - 1): tile rows [64 cw, 64 cw + 64), GEMMs on its turns (Turns); within a
// warpgroup the QK^T of the next block is issued before the P V of the current (Tr::kOverlapQkPv; else after it).
// kb, t: as for produce(); is_last(), called once at the tile's last step: no later tile of this CTA (the final
// turn hand-over is skipped).
// Forward kernels that build their wgmma descriptors from one base per tile in uniform registers (tile_sm90.h
// kFromBase, pipeline_sm90.h warpgroup_index), as the backward does at 64 / 256 since v4.6: head dims 64 and 256, no
// term or mask bits, where it measured faster (RESULTS v4.7, H100 kernel time: ViT-B/16 with a [1,H,1,S] bool mask
// -11%, T5 with a [B,H,S,S] bool mask -3%, ViT-B/16-384 -4.5%, dense S = 16k D64 -2.7%, D256 -5.7%). Left out where
// it was slower: the row term (EVA-02's [1,H,1,S] key bias +5.5%), the staged bias (BEiT +2%, RESULTS "Twenty-fourth
// session"); at 128 it measured +4% (Wan cross-attention, twenty-fourth session) and -1 to -3% (v4.7's session): no
// clear gain. The general path was not measured with it. The streamed tiles take it at every head dim (v4.9,
// consume_stream).
// Head dim 128 (thirty-second session), no-term path only: ncu of the causal S = 16k forward (128 x 128 tile) found
// each of its 16 wgmma per block behind a descriptor built whole (R2UR of hoisted Q descriptors, mask / shift / or for
// V's): 36 M R2UR, 84 M ULOP3, 48 M USHF against FA4's 0.1, 11 and 3 M on the same call, with the math equal. With
// one base per tile those fell to 0.7, 25 and 16 M and the kernel's cycles did not move (H100 kernel time within the
// spread); the mask-bit path read +2 to +4% with it (Llama-3 document mask), so it stays off there.
constexpr bool fwd_uniform_desc(int head_dim, int mode) {
  return ((head_dim == 64 || head_dim == 256) && (mode == kTermsRaw || mode == kTermsRawBits)) ||
         (head_dim == 128 && mode == kTermsRaw);
}

// Lazy rescaling (softmax.h kLazySlackLog2) where it measured faster: head dim 256, whose O is the largest to
// rescale (dense S = 16k forward 7.06 -> 6.58 ms, H200 kernel time, RESULTS v5.1), and the streamed tiles
// (consume_stream: Wan 2.1 cross-attention 0.210 -> 0.200). Left out at 128 on the general path, where the same run
// read +2 to +3% (dense S = 16k 7.11 -> 7.31 ms) and Llama-3 prefill +1%.
template <typename Tr>
constexpr bool fwd_lazy_rescale() {
  return Tr::kStream || Tr::kHeadDim == 256;
}

template <typename Tr, typename Elem, int kMode, typename IsLast>
__device__ __forceinline__ void consume(const FwdPipeParams& P, const PipeSmem<Tr> sm,
                                        const unsigned char* smem_base, int cw, const PipeTile& tile, int kb, int t,
                                        IsLast&& is_last, int warp, int lane) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, ST = Tr::kStages;
  constexpr int NT = Tr::kNT, DT = Tr::kDT, W = Tr::kRowBytes;
  constexpr bool kBaseDesc = fwd_uniform_desc(DK, kMode), kLazy = fwd_lazy_rescale<Tr>();
  const KParams& p = P.p;
  const int b = tile.b, h = tile.h, m_block = tile.m_block, n_hi = tile.n_hi, nblk = tile.n_hi - tile.n_lo;
  const int wr = cw * 64 + (warp & 3) * 16;  // the warp's first row in the tile
  const int i0 = m_block * BM;
  const uint32_t qa = sm.q() + cw * 64 * W;

  float acc_o[1][DT][4];
  zero_acc(acc_o);
  float acc_s[NT][4];
  uint32_t pf[NT / 2][4];
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, corr[2];

  auto issue_qk = [&](int s) {  // S = Q K^T of stage s
    const uint32_t ka = sm.k(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
      wgmma_ss<0, 0>(Int<BN>(), Elem(), acc_s, kmajor_step_desc<W, kBaseDesc>(qa, ks, BM),
                     kmajor_step_desc<W, kBaseDesc>(ka, ks, BN), ks > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int s) {  // O += P V of stage s (k16 step ks: keys 16 ks .. 16 ks + 15)
    const uint32_t va = sm.v(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks) {
      if constexpr (Tr::kPInSmem)
        wgmma_ss<0, 1>(Int<DK>(), Elem(), acc_o[0], kmajor_step_desc<kSwizzleRowBytes>(sm.p(cw), ks, 64),
                       nmajor_step_desc<W, kBaseDesc>(va, ks, BN), 1);
      else
        wgmma_rs<1>(Int<DK>(), Elem(), acc_o[0], pf[ks], nmajor_step_desc<W, kBaseDesc>(va, ks, BN), 1);
    }
    wgmma_commit();
  };
  // kTermsRawBits: the mask bits of the next key block, loaded while this one's GEMMs run (score_terms_sm90.h)
  uint32_t bits[2][BN / 32];
  if constexpr (kMode == kTermsRawBits) load_mask_bits<BN>(bits, p, b, h, i0, n_hi - 1, wr, lane);
  auto terms = [&](int s, int n) {
    // (the two-CTA tile reads a staged term by shared-window address: its registers, bias_pair_smem)
    const float sc = score_terms<Elem, kMode, BM, BN, NT, (Tr::kMinBlocks > 1)>(
        acc_s, p, sm.template terms<kMode>(smem_base, s, P.bias_stage_bytes), bits, b, h, m_block, n, wr, lane);
    if constexpr (kMode == kTermsRawBits)
      if (n > tile.n_lo) load_mask_bits<BN>(bits, p, b, h, i0, n - 1, wr, lane);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) softmax_step<false, kLazy>(acc_s, hf, sc, row_max[hf], row_sum[hf], corr[hf]);
  };
  // P of this block as the A operand of its P V: in registers, or (Tr::kPInSmem) stored into the warpgroup's P tile,
  // visible to its wgmma once every warp of the warpgroup has stored (called after the P V that last read the tile
  // is waited for)
  auto to_pfrag = [&]() {
    float (&s3)[1][NT][4] = reinterpret_cast<float (&)[1][NT][4]>(acc_s);
    uint32_t (&pf3)[1][NT / 2][4] = reinterpret_cast<uint32_t (&)[1][NT / 2][4]>(pf);
    acc_to_afrag<Elem, 1, NT>(pf3, s3);
    if constexpr (Tr::kPInSmem) {
      // stmatrix: lane 8 m + j gives row j of 8 x 8 block m (m = 0..3: rows 0-7 / 8-15 of the warp's 16, then the
      // same 8 columns on), the fragment order of pf
      const int row = (warp & 3) * 16 + (lane & 7) + (lane & 8), half = lane >> 4;
#pragma unroll
      for (int ks = 0; ks < NT / 2; ++ks)
        stmatrix_x4(sm.p(cw) + tile_chunk_offset<64>(row, 2 * ks + half), pf[ks][0], pf[ks][1], pf[ks][2],
                    pf[ks][3]);
      fence_view_async_shared();
      named_sync(kBarFwdPWritten + cw, 128);
    }
  };
  // P in registers is read by the P V until its wait (kept alive to here); a P tile is not
  auto fence_p = [&]() {
    if constexpr (!Tr::kPInSmem) fence_frag(pf);
  };
  const Turns<Tr::kConsumerWGs> turn{cw};

  auto stage = [&](int it) { return (kb + it) % ST; };
  auto phase = [&](int it) { return uint32_t((kb + it) / ST) & 1u; };
  turn.start(t == 0);
  mbar_wait(sm.q_full(), t & 1);
  // first key block: S, terms, softmax (O is still zero)
  mbar_wait(sm.k_full(stage(0)), phase(0));
  if constexpr (Tr::kRaggedFirst) {
    // Tr::kRaggedFirst: where the sequence ends inside this block, S, the terms and the softmax over the TN-key
    // prefix that reaches the end only (the columns past it are past Sk, hidden whatever their score), P past it zero
    auto ragged_first = [&](auto tn) {
      constexpr int TN = decltype(tn)::value, TNT = TN / 8;
      static_assert((kMode == kTermsRaw || kMode == kTermsRawBias) && TN % 16 == 0 && TN <= BN,
                    "the raw path or the staged term, whole k16 steps of P");
      static_assert(!Tr::kPInSmem, "P in registers");
      float (&s_t)[TNT][4] = reinterpret_cast<float (&)[TNT][4]>(acc_s);
      turn.mine();
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < DK / 16; ++ks)
        wgmma_ss<0, 0>(Int<TN>(), Elem(), s_t, kmajor_step_desc<W, kBaseDesc>(qa, ks, BM),
                       kmajor_step_desc<W, kBaseDesc>(sm.k(stage(0)), ks, BN), ks > 0);
      wgmma_commit();
      turn.pass();
      wgmma_wait<0>();
      fence_acc(s_t);
      const float sc = score_terms<Elem, kMode, BM, BN, TNT, (Tr::kMinBlocks > 1)>(
          s_t, p, sm.template terms<kMode>(smem_base, stage(0), P.bias_stage_bytes), bits, b, h, m_block, n_hi - 1,
          wr, lane);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) softmax_step<false, kLazy>(s_t, hf, sc, row_max[hf], row_sum[hf], corr[hf]);
      release_k<kMode>(sm.k_empty(stage(0)), lane);
      float (&s3)[1][TNT][4] = reinterpret_cast<float (&)[1][TNT][4]>(acc_s);
      uint32_t (&pf3)[1][TNT / 2][4] = reinterpret_cast<uint32_t (&)[1][TNT / 2][4]>(pf);
      acc_to_afrag<Elem, 1, TNT>(pf3, s3);
      // (its P V, the next step's, takes every k16 step: a branch around those wgmma made ptxas serialize all of
      // this kernel's, sass_check.py)
#pragma unroll
      for (int ks = TNT / 2; ks < NT / 2; ++ks) pf[ks][0] = pf[ks][1] = pf[ks][2] = pf[ks][3] = 0u;
    };
    const int steps = (min(BN, p.Sk - (n_hi - 1) * BN) + 15) / 16;  // (>= 1: the block is visible)
    static_assert(BN == 64, "the ragged prefixes of a 64-key block");
    if (steps == 1)
      ragged_first(std::integral_constant<int, 16>());
    else if (steps == 2)
      ragged_first(std::integral_constant<int, 32>());
    else if (steps == 3)
      ragged_first(std::integral_constant<int, 48>());
    else
      ragged_first(std::integral_constant<int, 64>());
  } else {
    turn.mine();
    issue_qk(stage(0));
    turn.pass();
    wgmma_wait<0>();
    fence_acc(acc_s);
    terms(stage(0), n_hi - 1);
    release_k<kMode>(sm.k_empty(stage(0)), lane);
    to_pfrag();
  }

  for (int it = 1; it < nblk; ++it) {
    const int n = n_hi - 1 - it, s = stage(it), sp = stage(it - 1);
    mbar_wait(sm.k_full(s), phase(it));
    mbar_wait(sm.v_full(sp), phase(it - 1));
    turn.mine();
    if constexpr (Tr::kOverlapQkPv) {
      issue_qk(s);
      issue_pv(sp);
      turn.pass();
      wgmma_wait<1>();  // S of block n is ready; P V of the block before still runs
      fence_acc(acc_s);
      terms(s, n);
      release_k<kMode>(sm.k_empty(s), lane);
      wgmma_wait<0>();
      fence_acc(acc_o[0]);
      fence_p();
      release_warp(sm.v_empty(sp), lane);
    } else {  // P V of the block before, then Q K^T: P is dead before S is written (the turn covers both)
      issue_pv(sp);
      wgmma_wait<0>();
      fence_acc(acc_o[0]);
      fence_p();
      issue_qk(s);
      turn.pass();
      release_warp(sm.v_empty(sp), lane);
      wgmma_wait<0>();
      fence_acc(acc_s);
      terms(s, n);
      release_k<kMode>(sm.k_empty(s), lane);
    }
    rescale_o<kLazy>(acc_o, corr);
    to_pfrag();
  }
  release_warp(sm.q_empty(), lane);  // every Q K^T of this tile is done: the producer may load the next tile's Q
  // whether a later tile follows (the dynamic schedule learns it here, the tile's last step, from the mailbox: its
  // producer posts the next index once this tile's loads are issued)
  const bool last = is_last();
  {
    const int sp = stage(nblk - 1);
    mbar_wait(sm.v_full(sp), phase(nblk - 1));
    turn.mine();
    issue_pv(sp);
    turn.pass_unless_last(last);
    wgmma_wait<0>();
    fence_acc(acc_o[0]);
    fence_p();
    release_warp(sm.v_empty(sp), lane);  // the next tile's loads reuse this stage
  }

  // epilogue: normalize, write O and lse (empty and NaN rows: finalize_row, softmax.h)
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  write_tile_out<Elem, DK, fwd_v3_o_via_smem<Tr>(kMode)>(&P.to, p, sm.template o_tile<kMode>(cw, P.bias_stage_bytes),
                                                         b, h, i0, wr, acc_o, row_max, row_sum, qr, qc, warp, lane);
}

// The consumers of streamed tiles (Tr::kStream): one loop over this CTA's key blocks, tile after tile, pipelined
// across the tile boundaries too. Each step issues the Q K^T of the next block (the next tile's first block at a
// boundary) with the P V of this one, so the next block's softmax runs while the tensor cores do this one's P V; at a
// boundary this tile's epilogue follows. Tile by tile (consume), the first block's Q K^T and the last block's P V
// of each tile had nothing beside them, and a tile of one key block (short key sets) was one serial chain: Q K^T,
// wait, softmax, P V, wait, epilogue (v3.6's ncu of ViT-B/16: no eligible warp 55% of cycles, "wait" stalls on the
// wgmma / barrier chain). The next tile's Q is in its own slot (Tr::kQSlots), loaded while this tile computes. The
// ping-pong turns are consume's: one per Q K^T issue of the CTA's first block and one per P V issue, warpgroup 1's
// last one skipped. Terms: the raw path, the staged tile, and at whole 32-key words the row term (staged by
// produce_row_terms) and the mask bits (loaded for the next block after its Q K^T is issued).
template <typename Tr, typename Elem, int kMode>
__device__ __forceinline__ void consume_stream(const FwdPipeParams& P, const PipeSmem<Tr> sm,
                                               const unsigned char* smem_base, int cw, int warp, int lane) {
  static_assert(Tr::kStream && Tr::kQSlots == 2, "streamed tiles, two Q slots");
  static_assert(kMode == kTermsRaw || kMode == kTermsRawBias || kMode == kTermsRawBiasMasked ||
                    ((stages_row(kMode) || kMode == kTermsRawBits) && Tr::kBlockN % 32 == 0),
                "the general path has its own kernel");
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, ST = Tr::kStages;
  constexpr int NT = Tr::kNT, DT = Tr::kDT, W = Tr::kRowBytes;
  // descriptors from one base per tile in uniform registers (tile_sm90.h kFromBase; the caller's cw is
  // warpgroup_index()'s, warp-uniform) at every head dim the streamed tiles take: H100 kernel time Wan 2.1
  // cross-attention -1 to -2%, DiT-XL/2 0 to -1% (RESULTS v4.9)
  constexpr bool kBaseDesc = true;
  constexpr bool kLazy = fwd_lazy_rescale<Tr>();
  const KParams& p = P.p;
  const int ntiles = ceil_div(p.Sq, BM) * p.H * p.B;
  const int wr = cw * 64 + (warp & 3) * 16, qr = lane >> 2, qc = (lane & 3) * 2;
  const uint32_t o_tile = sm.template o_tile<kMode>(cw, P.bias_stage_bytes);

  // the first tile from index idx on (stride gridDim.x) that sees a key, the rows of those that see none written
  // on the way (by both consumer warpgroups, as consume's caller does); ntiles when there is none
  auto next_tile = [&](int idx, PipeTile& tile) {
    for (; idx < ntiles; idx += gridDim.x) {
      tile = decode_tile<BM, BN>(p, walk_tile<BM>(P, idx));
      if (!tile.empty()) break;
      const int i0 = tile.m_block * BM;
      write_empty_tile<Elem>(p, tile.b, tile.h, i0, min(BM, p.Sq - i0), threadIdx.x - 128,
                             Tr::kConsumerThreads);
    }
    return idx;
  };
  float acc_s[NT][4], acc_o[1][DT][4];
  uint32_t pf[NT / 2][4];
  float row_max[2], row_sum[2], corr[2];  // the running softmax of the tile whose latest block is in acc_s / pf
  float o_max[2], o_sum[2];               // a finished tile's, for its epilogue
  uint32_t bits[2][BN / 32];  // kTermsRawBits: the mask bits of the block whose S comes next
  auto load_terms = [&](const PipeTile& tile, int n) {
    if constexpr (kMode == kTermsRawBits) load_mask_bits<BN>(bits, p, tile.b, tile.h, tile.m_block * BM, n, wr, lane);
  };
  // g: this CTA's key blocks before this one (the producer's kb + it): stage g % ST; t: its tiles with a key before
  // this one (the producer's t): Q slot t % 2
  auto issue_qk = [&](int t, int g) {
    const uint32_t qa = sm.q(t % 2) + cw * 64 * W, ka = sm.k(g % ST);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
      wgmma_ss<0, 0>(Int<BN>(), Elem(), acc_s, kmajor_step_desc<W, kBaseDesc>(qa, ks, BM),
                     kmajor_step_desc<W, kBaseDesc>(ka, ks, BN), ks > 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int g, bool first) {  // (a tile's first P V overwrites acc_o: no zeroing)
    const uint32_t va = sm.v(g % ST);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < NT / 2; ++ks)
      wgmma_rs<1>(Int<DK>(), Elem(), acc_o[0], pf[ks], nmajor_step_desc<W, kBaseDesc>(va, ks, BN),
                  ks > 0 || !first);
    wgmma_commit();
  };
  // S of block n of `tile` (stage g % ST) -> its unnormalized P, the running row state and corr; a tile's first
  // block starts the state; its last one frees the tile's Q slot
  auto softmax = [&](const PipeTile& tile, int n, int t, int g) {
    fence_acc(acc_s);
    const int s = g % ST;
    const float sc = score_terms<Elem, kMode, BM, BN, NT>(acc_s, p, sm.template terms<kMode>(smem_base, s,
                                                          P.bias_stage_bytes), bits, tile.b, tile.h, tile.m_block,
                                                          n, wr, lane);
    release_k<kMode>(sm.k_empty(s), lane);
    if (n == tile.n_lo) release_warp(sm.q_empty(t % 2), lane);  // the producer may load the tile after next here
    if (n == tile.n_hi - 1)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) row_max[hf] = -INFINITY, row_sum[hf] = 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) softmax_step<false, kLazy>(acc_s, hf, sc, row_max[hf], row_sum[hf], corr[hf]);
  };
  auto to_pfrag = [&]() {
    float (&s3)[1][NT][4] = reinterpret_cast<float (&)[1][NT][4]>(acc_s);
    uint32_t (&pf3)[1][NT / 2][4] = reinterpret_cast<uint32_t (&)[1][NT / 2][4]>(pf);
    acc_to_afrag<Elem, 1, NT>(pf3, s3);
  };
  const Turns<Tr::kConsumerWGs> turn{cw};

  PipeTile cur;
  int idx = next_tile(blockIdx.x, cur);
  if (idx >= ntiles) return;
  turn.start(true);
  // the CTA's first block: S, terms, softmax (blocks go from the last visible one down, as the producer loads them)
  mbar_wait(sm.q_full(0), 0);
  mbar_wait(sm.k_full(0), 0);
  turn.mine();
  issue_qk(0, 0);
  turn.pass();
  load_terms(cur, cur.n_hi - 1);
  wgmma_wait<0>();
  softmax(cur, cur.n_hi - 1, 0, 0);
  to_pfrag();
  int n = cur.n_hi - 1, t = 0, g = 0;  // the block whose P is in pf: n of tile cur, its tile count and block count
  bool first = true;                   // ... and whether it is its tile's first (its P V starts acc_o)
  for (;;) {
    // the next block: this tile's next one down, or the next tile's first
    const bool same = n > cur.n_lo;
    PipeTile nxt = cur;
    int nidx = idx;
    if (!same) nidx = next_tile(idx + gridDim.x, nxt);
    const bool more = same || nidx < ntiles;
    const int tn = same ? t : t + 1, nn = same ? n - 1 : nxt.n_hi - 1;
    if (more) {
      if (!same) mbar_wait(sm.q_full(tn % 2), uint32_t(tn / 2) & 1u);
      mbar_wait(sm.k_full((g + 1) % ST), uint32_t((g + 1) / ST) & 1u);
    }
    mbar_wait(sm.v_full(g % ST), uint32_t(g / ST) & 1u);
    turn.mine();
    // The Q K^T is issued in every step, after the CTA's last block too (of whatever that stage and Q slot hold: the
    // loads are done, and the result is dropped), so that the wgmma groups and their waits do not depend on a
    // branch: with `if (more)` around them ptxas serialized every wgmma of these kernels (C7514, "non wgmma
    // instructions reading accumulator registers ... between start and end of the pipeline stage").
    issue_qk(tn, g + 1);
    issue_pv(g, first);
    turn.pass_unless_last(!more);
    if (!same)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) o_max[hf] = row_max[hf], o_sum[hf] = row_sum[hf];
    if (more) load_terms(nxt, nn);
    wgmma_wait<1>();  // S of the next block is in; this block's P V still runs
    if (more) softmax(nxt, nn, tn, g + 1);
    wgmma_wait<0>();
    fence_acc(acc_o[0]);
    fence_frag(pf);
    release_warp(sm.v_empty(g % ST), lane);
    if (same) {  // rescale this tile's O to the new running max, then the next block's P
      rescale_o<kLazy>(acc_o, corr);
    } else {
      write_tile_out<Elem, DK, fwd_v3_o_via_smem<Tr>(kMode)>(&P.to, p, o_tile, cur.b, cur.h, cur.m_block * BM, wr,
                                                             acc_o, o_max, o_sum, qr, qc, warp, lane);
      if (!more) break;
    }
    to_pfrag();
    first = !same;
    cur = nxt;
    idx = nidx;
    n = nn;
    t = tn;
    ++g;
  }
}

// kDynamic: the dynamic schedule (FwdPipeParams::tile_counter), an instance of its own (launch_sm90.h has_dynamic)
// so that the strided and per-tile kernels keep their code: with a run-time switch the producer thread spilled in every
// instance (its 24 registers) and the forward read 8-20% slower on every row (H100 kernel time, RESULTS v5.6).
template <typename Tr, typename Elem, int kMode, bool kDynamic>
__global__ void __launch_bounds__(Tr::kNThreads, Tr::kMinBlocks)
    fwd_pipelined_kernel_sm90(const __grid_constant__ FwdPipeParams P) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, ST = Tr::kStages;
  // stages_row modes: produce_row_terms's warp needs more than the TMA thread's 24 registers (ptxas, head dim 64:
  // 52 bytes of spills at 24, for the row term and for the padding bits alike); below head dim 256 the consumers give
  // 8 of theirs (one CTA per SM: 40 / 232, the most the producer can take before the consumers' share drops to 224).
  // At 256 they have none to give (88 bytes of spills at 232): the producer warp spills instead, off the consumers'
  // path. (The staged tile with padding bits is taken up to head dim 64 only: fwd_v3_stages_padding.) The dynamic
  // schedule's producer thread takes 40 too: at 24 it spilled 17 values, reloaded in its key-block loop (head dim 128).
  constexpr bool kProducer40 = (stages_row(kMode) || kDynamic) && Tr::kHeadDim < 256;
  static_assert(!kProducer40 || Tr::kMinBlocks == 1, "the row term's register split assumes one CTA per SM");
  constexpr int kProducerRegs = kProducer40 ? 40 : Tr::kProducerRegs;
  constexpr int kConsumerRegs =  // (the traits' split, FwdPipeTraitsSm90, with this producer share)
      (Tr::kNThreads * Tr::kLaunchRegs - 128 * kProducerRegs) / Tr::kConsumerThreads / 8 * 8;
  static_assert(!kProducer40 || kConsumerRegs == 232, "one CTA per SM, a producer of 40: 232 per consumer");
  static_assert(Tr::kConsumerWGs == 2 || kMode == kTermsRaw, "the 192-row tile takes the no-term path only");
  static_assert(!kDynamic || (!Tr::kStream && !stages_row(kMode)), "the dynamic schedule runs consume()'s loop only");
  const KParams& p = P.p;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  const PipeSmem<Tr> sm{smem_u32(smem)};

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  // Persistent grid: CTA c takes tiles c, c + gridDim.x, ... (gridDim.x = the tile count when not persistent), or
  // with the dynamic schedule (band calls) c and then whichever tile is next when its producer asks.
  const int ntiles = ceil_div(p.Sq, BM) * p.H * p.B;

  if (tid == 0) {
    for (int slot = 0; slot < Tr::kQSlots; ++slot) {
      mbar_init(sm.q_full(slot), 1);
      mbar_init(sm.q_empty(slot), Tr::kConsumerWarps);
    }
    if constexpr (kDynamic)
      for (int e = 0; e < 2; ++e) {
        mbar_init(sm.sched_full(e), 1);
        mbar_init(sm.sched_empty(e), Tr::kConsumerWarps);
      }
    for (int s = 0; s < ST; ++s) {
      mbar_init(sm.k_full(s), stages_row(kMode) ? 2 : 1);  // (+ produce_row_terms's arrival)
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.k_empty(s), k_empty_arrivals<Tr, kMode>());
      mbar_init(sm.v_empty(s), Tr::kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    regs_dealloc<kProducerRegs>();
    if (tid == 0) {
      tma_prefetch_desc(&P.tq);
      tma_prefetch_desc(&P.tk);
      tma_prefetch_desc(&P.tv);
      int kb = 0, t = 0;
      if constexpr (kDynamic) {
        // each tile is posted to the consumers, then loaded, and the next one is taken once its loads are issued,
        // about a block before this CTA's consumers finish it (the stages hide the L2 atomic's latency)
        for (int m = 0, idx = blockIdx.x;; ++m) {
          post_tile(sm, m, idx);
          if (idx >= ntiles) break;
          const PipeTile tile = decode_tile<BM, BN>(p, idx);
          if (!tile.empty()) {
            produce<Tr>(P, sm, tile, kb, t);
            kb += tile.n_hi - tile.n_lo;
            ++t;
          }
          idx = int(gridDim.x) + atomicAdd(P.tile_counter, 1);
        }
      } else {
        int prev_head = -1;  // (kv_reuse: the batch and KV head of the previous tile)
        for (int idx = blockIdx.x; idx < ntiles; idx += gridDim.x) {
          const PipeTile tile = decode_tile<BM, BN>(p, walk_tile<BM>(P, idx));
          if (tile.empty()) continue;
          const int head = tile.b * p.Hkv + tile.h / p.hgroup;
          produce<Tr>(P, sm, tile, kb, t, P.kv_reuse && head == prev_head && kb % ST == 0);
          prev_head = head;
          kb += tile.n_hi - tile.n_lo;
          ++t;
        }
      }
    } else if constexpr (stages_row(kMode)) {
      if (warp == 1) produce_row_terms<Tr, kMode>(p, sm, smem, lane);
    }
  } else if constexpr (Tr::kStream) {
    regs_alloc<kConsumerRegs>();
    consume_stream<Tr, Elem, kMode>(P, sm, smem, warpgroup_index() - 1, warp, lane);
    o_stores_read<fwd_v3_o_via_smem<Tr>(kMode)>(lane);
  } else {
    regs_alloc<kConsumerRegs>();
    const int cw = fwd_uniform_desc(Tr::kHeadDim, kMode) ? warpgroup_index() - 1 : wg - 1;
    int kb = 0, t = 0;
    if constexpr (kDynamic) {  // the tiles in the order the mailbox gives them
      int m = 0, idx = take_tile(sm, m++, lane);
      while (idx < ntiles) {
        const PipeTile tile = decode_tile<BM, BN>(p, idx);
        if (tile.empty()) {  // (not taken: the planner's no_empty_tiles; written all the same)
          const int i0 = tile.m_block * BM;
          write_empty_tile<Elem>(p, tile.b, tile.h, i0, min(BM, p.Sq - i0), tid - 128, Tr::kConsumerThreads);
          idx = take_tile(sm, m++, lane);
          continue;
        }
        // the next index, taken at this tile's last step, past the tiles: no later tile (every tile sees a key)
        auto is_last = [&] { return (idx = take_tile(sm, m++, lane)) >= ntiles; };
        consume<Tr, Elem, kMode>(P, sm, smem, cw, tile, kb, t, is_last, warp, lane);
        kb += tile.n_hi - tile.n_lo;
        ++t;
      }
    } else {  // strided: CTA c takes c, c + gridDim.x, ...
      for (int idx = blockIdx.x; idx < ntiles; idx += gridDim.x) {
        const PipeTile tile = decode_tile<BM, BN>(p, idx);
        if (tile.empty()) {  // no key of any row is in the band
          const int i0 = tile.m_block * BM;
          write_empty_tile<Elem>(p, tile.b, tile.h, i0, min(BM, p.Sq - i0), tid - 128, Tr::kConsumerThreads);
          continue;
        }
        bool last = true;
        for (int j = idx + gridDim.x; j < ntiles && last; j += gridDim.x) last = decode_tile<BM, BN>(p, j).empty();
        consume<Tr, Elem, kMode>(P, sm, smem, cw, tile, kb, t, [last] { return last; }, warp, lane);
        kb += tile.n_hi - tile.n_lo;
        ++t;
      }
    }
    o_stores_read<fwd_v3_o_via_smem<Tr>(kMode)>(lane);
  }
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (fwd_sm90_ready)
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
