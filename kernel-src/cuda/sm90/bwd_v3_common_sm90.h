// The pieces both backward v3 consumers share (bwd_pipelined_sm90.h's and bwd_split_d_sm90.h's): the kernel
// parameters, the shared-memory map, the tile decode, the producer, the score terms into P, dS from dP, and the dbias
// staging and atomics. Kept apart so that each consumer's header compiles on its own.
#pragma once
#include <cuda.h>

#include "../block_info.h"
#include "../gemm.h"
#include "../kernel_params.h"
#include "../score_mod.h"
#include "../tile_io.h"
#include "bwd_v3_api.h"
#include "kernel_traits_sm90.h"
#include "pipeline_sm90.h"
#include "tile_sm90.h"
#include "wgmma_ops.h"

namespace winattn {
namespace cuda {
namespace sm90 {

struct BwdPipeParams {
  KParams p;
  CUtensorMap tq, tdo, tk, tv, tb, tdb;  // tb: the staged bias tile (bias_stage_bytes > 0); tdb: dbias
  CUtensorMap tlse, tdelta;              // lse2 / delta rows in boxes of BM (TMA like the tiles: one mbarrier protocol)
  const float* lse2 = nullptr;           // [B, H, sq_pad]: lse * log2(e), 0 where lse = -inf, +inf past Sq
  const float* delta = nullptr;          // [B, H, sq_pad]: rowsum(dO * O) - dlse, 0 past Sq
  float* dq_acc = nullptr;               // [B, H, m-blocks, BM * D] fp32, fragment order (zero-filled)
  int* dq_sems = nullptr;                // deterministic: [B, H, m-blocks] ticket counters (zero-filled)
  int sq_pad = 0, bias_stage_bytes = 0, dbias_mode = kDbiasNone;
  int db_period = 1, db_heads = 1;  // dbias's broadcast dims (batch b -> b % db_period, heads 1 or H)
  int dbias_bufs = 1;               // staging tiles (2 where the shared memory allows: no barrier per step)
  int dbias_tile_bytes = 0;         // one staging tile: BM x BN fp32, or 16-bit (kDbiasStore16)
  float* dbias_f32 = nullptr;       // kDbiasAtomic: fp32 [db_period, db_heads, db_rows, db_cols], zero-filled
  int db_rows = 1, db_cols = 1;
};

// Shared memory at compile-time offsets from one base address (KV sets of K / V: 2 in pair mode); the bias stages
// and the dbias staging tiles follow at launch-time sizes.
template <typename Tr, int KV>
struct BwdSmem {
  static constexpr int kQ = 2 * KV * Tr::kKVBytes, kDO = kQ + Tr::kStages * Tr::kQBytes;
  static constexpr int kDS = kDO + Tr::kStages * Tr::kQBytes, kVec = kDS + 2 * Tr::kDSBytes;
  static constexpr int kBars = Tr::kBarsOffset + 2 * (KV - 1) * Tr::kKVBytes, kBias = kBars + 1024;
  uint32_t base;
  __device__ __forceinline__ uint32_t k(int set) const { return base + 2 * set * Tr::kKVBytes; }
  __device__ __forceinline__ uint32_t v(int set) const { return k(set) + Tr::kKVBytes; }
  __device__ __forceinline__ uint32_t q(int s) const { return base + kQ + s * Tr::kQBytes; }
  __device__ __forceinline__ uint32_t dout(int s) const { return base + kDO + s * Tr::kQBytes; }
  __device__ __forceinline__ uint32_t ds(int buf) const { return base + kDS + buf * Tr::kDSBytes; }
  __device__ __forceinline__ uint32_t lse(int s) const { return base + kVec + s * Tr::kVecBytes; }
  __device__ __forceinline__ uint32_t delta(int s) const { return lse(s) + Tr::kBlockM * 4; }
  __device__ __forceinline__ uint32_t kv_full() const { return base + kBars; }
  __device__ __forceinline__ uint32_t full(int s) const { return base + kBars + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t empty(int s) const { return base + kBars + 8 * (1 + Tr::kStages + s); }
  // dQ resident: the consumers are done with this key block's K / V (the producer may load the next)
  __device__ __forceinline__ uint32_t kv_empty() const { return base + kBars + 8 * (1 + 2 * Tr::kStages); }
  __device__ __forceinline__ uint32_t bias(int s, int bias_bytes) const { return base + kBias + s * bias_bytes; }
  // staging tile buf; buf = dbias_bufs is pair mode's fp32 sum of the first batch's dS (kDbiasStore16)
  __device__ __forceinline__ uint32_t dbias(int bias_bytes, int buf, int tile_bytes) const {
    return base + kBias + Tr::kStages * bias_bytes + buf * tile_bytes;
  }
  // dQ resident: fp32 [group heads][m-blocks][BM * D] in the consumers' fragment order, after the third dS^T tile
  // of deferred dQ (which sits where dbias staging would: no staged term then, bias_bytes 0)
  __device__ __forceinline__ uint32_t dq() const { return dbias(0, 0, 0) + Tr::kDSBytes; }
};

// One CTA's work: key block n of KV head hkv in batch b (and b + pair_stride in pair mode), and the query blocks
// [m_lo, m_hi) that see it.
struct BwdTile {
  int b, b2, hkv, n, m_lo, m_hi, m_start;
  // k-th query block visited: from m_start round the range (ascending from m_lo when m_start = 0)
  __device__ __forceinline__ int m_at(int k) const {
    const int c = m_hi - m_lo, x = m_start + k;
    return m_lo + (x >= c ? x - c : x);
  }
  __device__ __forceinline__ int batch(int bi) const { return bi ? b2 : b; }
};
// CTA order: the key blocks of one (batch, head) side by side (their Q / dO reads share L2; with causal bands the
// longest key blocks, n = 0.., come first); with a bias broadcast over the batch, the batches sharing a bias tile are
// innermost, so their bias reads and dbias adds meet in L2. Pair mode: batches r and r + db_period (r < db_period).
// Without a band and without determinism, each key block starts at a different query block (m_start), so the 128
// CTAs of a head do not add their dQ into the same tile at the same time.
// Band calls interleave the key blocks of p.bwd_band_pairs (batch, KV head) pairs, longest first across them: pair
// by pair, the last pair's longest tiles started near the end (Llama-3 prefill's backward, 16 pairs of 64 key
// blocks: ~11% past the balanced end by a list-scheduling model of the in-order block dispatch, ~0.05% interleaved
// by two). A pair's key blocks still rise with the CTA index, so the deterministic mode's tickets (lower key blocks
// first) only wait on CTAs dispatched before them.
template <typename Tr, bool kPair>
__device__ __forceinline__ BwdTile decode_bwd_tile(const BwdPipeParams& P, bool deterministic) {
  const KParams& p = P.p;
  const int nblocks = ceil_div(p.Sk, Tr::kBlockN);
  int idx = blockIdx.x;
  BwdTile t;
  if (kPair) {
    t.n = idx % nblocks;
    idx /= nblocks;
    t.hkv = idx % p.Hkv;
    t.b = idx / p.Hkv;
    t.b2 = t.b + P.db_period;
  } else if (p.bias.ptr != nullptr && p.bias.period == 1 && p.B > 1) {
    t.b = idx % p.B;
    idx /= p.B;
    t.n = idx % nblocks;
    t.hkv = idx / nblocks;
  } else if (p.bwd_band_pairs > 1) {
    const PairBlock pb = interleaved_tile(idx, nblocks, p.B * p.Hkv, p.bwd_band_pairs);
    t.n = pb.block;
    t.hkv = pb.pair % p.Hkv;
    t.b = pb.pair / p.Hkv;
  } else {
    t.n = idx % nblocks;
    idx /= nblocks;
    t.hkv = idx % p.Hkv;
    t.b = idx / p.Hkv;
  }
  if (!kPair) t.b2 = t.b;
  m_block_range(p, t.n, Tr::kBlockM, Tr::kBlockN, t.m_lo, t.m_hi);
  const int cnt = t.m_hi - t.m_lo;
  t.m_start = (deterministic || p.has_band || cnt <= 0) ? 0 : t.n % cnt;
  return t;
}

// Producer (one thread): K and V once (both batches in pair mode), then per (query head of the group, query block,
// batch of the pair) Q, dO, lse, delta and the bias tile into the stage ring. `it`: the stages filled before this
// tile; returns the count after it. kKvAfter > 0 (dQ resident: one CTA walks the key blocks through one ring): K / V
// only after this tile's first kKvAfter stages, once the consumers release the last block's (kv_empty, phase
// kv_parity; < 0: the first block), so that those stages load while the consumers finish the last block.
template <typename Tr, int KV, int kKvAfter = 0>
__device__ __forceinline__ int bwd_produce(const BwdPipeParams& P, const BwdSmem<Tr, KV> sm, const BwdTile& t,
                                           int it = 0, int kv_parity = -1) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, ST = Tr::kStages, CB = Tr::kHeadDim / Tr::kBlockCols;
  constexpr int W = Tr::kRowBytes, WC = Tr::kBlockCols;
  const KParams& p = P.p;
  const int bb = P.bias_stage_bytes, bias_b = t.b % p.bias.period;
  auto load_kv = [&] {
    if (kKvAfter > 0 && kv_parity >= 0) mbar_wait(sm.kv_empty(), uint32_t(kv_parity));
    mbar_arrive_expect_tx(sm.kv_full(), 2 * KV * Tr::kKVBytes);
#pragma unroll
    for (int bi = 0; bi < KV; ++bi)
#pragma unroll
      for (int c = 0; c < CB; ++c) {
        tma_load_4d(sm.k(bi) + c * BN * W, &P.tk, sm.kv_full(), c * WC, t.n * BN, t.hkv, t.batch(bi));
        tma_load_4d(sm.v(bi) + c * BN * W, &P.tv, sm.kv_full(), c * WC, t.n * BN, t.hkv, t.batch(bi));
      }
  };
  if constexpr (kKvAfter == 0) load_kv();
  const int it0 = it;
  const int cnt = t.m_hi - t.m_lo;
  for (int g = 0; g < p.hgroup; ++g) {
    const int h = t.hkv * p.hgroup + g, bias_h = p.bias.heads > 1 ? h : 0;
    for (int k = 0; k < cnt; ++k) {
      const int m = t.m_at(k);
      for (int bi = 0; bi < KV; ++bi, ++it) {
        const int s = it % ST, use = it / ST, b = t.batch(bi);
        if (use > 0) mbar_wait(sm.empty(s), (use - 1) & 1);
        mbar_arrive_expect_tx(sm.full(s), 2 * Tr::kQBytes + Tr::kVecBytes + bb);
#pragma unroll
        for (int c = 0; c < CB; ++c) {
          tma_load_4d(sm.q(s) + c * BM * W, &P.tq, sm.full(s), c * WC, m * BM, h, b);
          tma_load_4d(sm.dout(s) + c * BM * W, &P.tdo, sm.full(s), c * WC, m * BM, h, b);
        }
        tma_load_4d(sm.lse(s), &P.tlse, sm.full(s), m * BM, h, b, 0);
        tma_load_4d(sm.delta(s), &P.tdelta, sm.full(s), m * BM, h, b, 0);
        if (bb > 0)
#pragma unroll
          for (int c = 0; c < BN / 64; ++c)
            tma_load_4d(sm.bias(s, bb) + c * BM * 128, &P.tb, sm.full(s), t.n * BN + c * 64, m * BM, bias_h, bias_b);
        if (kKvAfter > 0 && it + 1 - it0 == kKvAfter) load_kv();
      }
    }
  }
  if (kKvAfter > 0 && it - it0 < kKvAfter) load_kv();  // (fewer stages than that)
  return it;
}

// The tile of key block n of (batch b, KV head hkv), no pair: what decode_bwd_tile gives the CTA of that key block
// (query blocks from the first: dQ resident has no atomics to spread).
template <typename Tr>
__device__ __forceinline__ BwdTile bwd_tile_at(const KParams& p, int b, int hkv, int n) {
  BwdTile t;
  t.b = t.b2 = b;
  t.hkv = hkv;
  t.n = n;
  m_block_range(p, n, Tr::kBlockM, Tr::kBlockN, t.m_lo, t.m_hi);
  t.m_start = 0;
  return t;
}

// Byte offset of element (row i, column j) of a staged [BM x BN] 16-bit bias tile: BN / 64 boxes of
// [BM x 128 bytes], 128-byte swizzle (chunk c of row r at c ^ (r & 7)), as the forward stages it.
template <int BM>
__device__ __forceinline__ int bias_elem_offset(int i, int j) {
  const int byte = j * 2;
  return (byte >> 7) * (BM * 128) + i * 128 + ((((byte >> 4) & 7) ^ (i & 7)) << 4) + (byte & 15);
}
// Byte offset of element (row i, column j) in the fp32 [BM x BN] dbias staging tile: BN / 32 boxes of
// [BM x 128 bytes], 128-byte swizzle (the tensor map's); a warp's writes of one fragment register are conflict-free.
template <int BM>
__device__ __forceinline__ int dbias_stage_offset(int i, int j) {
  return (j >> 5) * (BM * 128) + i * 128 + ((((j & 31) >> 2) ^ (i & 7)) << 4) + (j & 3) * 4;
}

template <typename Elem>
__device__ __forceinline__ float half_to_float(uint16_t x) {
  return static_cast<float>(*reinterpret_cast<const Elem*>(&x));
}

// This thread's lse (or delta) entries of a stage, the queries q0 + nt * 8 + qc + (0, 1) (the columns of its
// accumulator fragments), as p_from_scores / ds_from_dp read them ([nt]): from shared memory where used, or read
// into registers by load() (the pipelined consumer's kStatsEarly says where and why).
struct RowPairsInSmem {
  uint32_t a = 0;
  __device__ __forceinline__ void load(uint32_t vec, int q0, int qc) { a = vec + (q0 + qc) * 4; }
  __device__ __forceinline__ float2 operator[](int nt) const { return lds_f32x2(a + nt * 32); }
};
template <int NTQ>
struct RowPairsInRegs {
  float2 v[NTQ];
  __device__ __forceinline__ void load(uint32_t vec, int q0, int qc) {
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) v[nt] = lds_f32x2(vec + (q0 + nt * 8 + qc) * 4);
  }
  __device__ __forceinline__ float2 operator[](int nt) const { return v[nt]; }
};

// kBwdTermsBits: whether query column nt * 8 + qc + e of the block (word nt / 4 of the pair) sees key j0 + 8 hf.
__device__ __forceinline__ bool key_bit(const uint2 (&key_bits)[2], int hf, int nt, int qc, int e) {
  const uint32_t w = nt < 4 ? key_bits[hf].x : key_bits[hf].y;
  return (w >> ((nt % 4) * 8 + qc + e)) & 1u;
}

// The thread's P^T fragment, in place of its raw S^T (rows: keys j0 and j0 + 8; columns: queries
// m * BM + q0 + nt * 8 + qc + e): the score terms (the staged 16-bit tile at sB + bias_off, or the additive term
// and bool mask read from global memory), key visibility (key_ok), the band, and exp2 against lse (lse: this
// thread's lse * log2(e) entries, RowPairsIn*). Shared by both consumers.
// kBwdTermsBits: key_bits[hf], the query bits of key j0 + 8 hf in this query block (load_key_bits).
// A -inf term folded from a bool mask hides its key (P = 0) whatever the score (score_mod.h add_term): the *Hiding
// instances and the global-terms one check it (p.term_hides), the plain staged and row ones do not.
template <typename Elem, int kTerms, int BM, int BN, int NTQ, typename Lse>
__device__ __forceinline__ void p_from_scores(float (&acc)[NTQ][4], const KParams& p, const Lse& lse, uint32_t sB,
                                              const int (&bias_off)[2][2], const bool (&key_ok)[2],
                                              const uint2 (&key_bits)[2], int b, int h, int m, int n, int j0, int q0,
                                              int qc) {
  constexpr int kRead = bwd_terms_read(kTerms);
  constexpr bool kHides = kRead != kTerms;
  int lo = -(1 << 30), hi = 1 << 30;  // j - i = 8 hf - 8 nt - e + base must lie in [band_lo, band_hi]
  const bool band_edge = p.has_band && tile_needs_mask(p, m, n, BM, BN);
  if constexpr (kRead == kBwdTermsNone || kRead == kBwdTermsBits) {
    // No term read and every score of the thread's two keys inside the band: an unchecked copy of the loop below
    // (the bool bits still apply), so the tiles that make up most of an unbanded backward skip the key and band
    // compares (ncu, Flux backward: 35 M ISETP against FA4's 1.4 M). H100 backward kernel time, RESULTS v5.5: -2 to -3%
    // on six of seven unbanded rows (Flux even), band rows (causal, sliding window) +2% alone, even with the 64-bit
    // descriptor adds (tile_sm90.h desc_plus) beside it.
    if (!band_edge && key_ok[0] && key_ok[1]) {
#pragma unroll
      for (int nt = 0; nt < NTQ; ++nt) {
        const float2 l2 = lse[nt];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int x = 2 * hf + e;
            const float s = fast_exp2(fmaf(acc[nt][x], p.scale_log2, -(e ? l2.y : l2.x)));
            if constexpr (kTerms == kBwdTermsBits) {
              acc[nt][x] = key_bit(key_bits, hf, nt, qc, e) ? s : 0.f;
            } else {
              acc[nt][x] = s;
            }
          }
      }
      return;
    }
  }
  if (band_edge) {
    const int64_t base = int64_t(j0) - (int64_t(m) * BM + q0 + qc);
    lo = int(max(min(p.band_lo - base, int64_t(1) << 30), -(int64_t(1) << 30)));
    hi = int(max(min(p.band_hi - base, int64_t(1) << 30), -(int64_t(1) << 30)));
  }
  // kBwdTermsRow: the term of this thread's two keys (broadcast over the queries), in log2 units
  float row_z[2] = {0.f, 0.f};
  if constexpr (kRead == kBwdTermsRow) {
    const int64_t g = int64_t(b % p.bias.period) * p.bias.sb + int64_t(p.bias.heads > 1 ? h : 0) * p.bias.sh;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      row_z[hf] = ld_scalar(p.bias.ptr, p.bias.dtype, g + int64_t(min(j0 + 8 * hf, p.Sk - 1)) * p.bias.sk) * kLog2e;
  }
  // kBwdTermsGlobal: this (b, h)'s planes of the additive term and the bool mask (broadcast dims: stride 0)
  int64_t gb = 0, gm = 0;
  if constexpr (kRead == kBwdTermsGlobal) {
    gb = int64_t(b % p.bias.period) * p.bias.sb + int64_t(h) * p.bias.sh;
    gm = int64_t(b % p.mask.period) * p.mask.sb + int64_t(h) * p.mask.sh;
  }
  const bool hides = p.term_hides;
#pragma unroll
  for (int nt = 0; nt < NTQ; ++nt) {
    const float2 l2 = lse[nt];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int x = 2 * hf + e, d = 8 * hf - 8 * nt - e;
        float z = -(e ? l2.y : l2.x), t = 0.f;
        bool vis = key_ok[hf] && d >= lo && d <= hi;
        if constexpr (kRead == kBwdTermsStaged) {
          t = half_to_float<Elem>(lds_u16(sB + bias_off[hf][e] + nt * 1024));
          z = fmaf(t, kLog2e, z);
        }
        if constexpr (kRead == kBwdTermsRow) {
          t = row_z[hf];
          z += t;
        }
        if constexpr (kRead == kBwdTermsGlobal) {  // (clamped into range: P is 0 past Sq / Sk anyway)
          const int64_t i = min(m * BM + q0 + nt * 8 + qc + e, p.Sq - 1), j = min(j0 + 8 * hf, p.Sk - 1);
          if (p.bias.ptr != nullptr) {
            t = ld_scalar(p.bias.ptr, p.bias.dtype, gb + i * p.bias.sq + j * p.bias.sk);
            z = fmaf(t, kLog2e, z);
          }
          if (p.mask.ptr != nullptr)
            vis = vis && __ldg(static_cast<const unsigned char*>(p.mask.ptr) + gm + i * p.mask.sq + j * p.mask.sk) != 0;
        }
        if constexpr (kTerms == kBwdTermsBits) vis = vis && key_bit(key_bits, hf, nt, qc, e);
        // (the hiding instances check at run time too: so their code is what every staged / row instance had
        // before; with a compile-time check, ptxas spilled 36 bytes in the D = 128 lock-step staged instance)
        if constexpr (kHides || kRead == kBwdTermsGlobal) vis = vis && !(hides && t == -INFINITY);
        acc[nt][x] = vis ? fast_exp2(fmaf(acc[nt][x], p.scale_log2, z)) : 0.f;
      }
  }
}

// kBwdTermsBits: the query bits of query block m (BM = 64: two words) for this thread's keys j0 and j0 + 8 (rows
// past Sk read the last key's: P is 0 there anyway), from the transposed bits [period][heads][Sk][mb_words] that
// mask_bits_kernel<true> writes (mb_words a multiple of 4, so the word pair is 8-byte aligned). Loaded before the
// step's GEMMs are waited on, so their latency hides behind the tensor cores.
template <int BM>
__device__ __forceinline__ void load_key_bits(uint2 (&bits)[2], const KParams& p, int b, int h, int m, int j0) {
  static_assert(BM == 64, "two query words per key and block");
  const uint32_t* plane = p.mbits + (int64_t(b % p.mb_period) * p.mb_heads + (p.mb_heads > 1 ? h : 0)) *
                                        int64_t(p.mb_rows) * p.mb_words;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    bits[hf] = __ldg(reinterpret_cast<const uint2*>(plane + int64_t(min(j0 + 8 * hf, p.Sk - 1)) * p.mb_words + 2 * m));
}

// dS^T = P^T (dP^T - delta), in place of dP^T (delta: this thread's delta entries, RowPairsIn*).
template <int NTQ, typename Delta>
__device__ __forceinline__ void ds_from_dp(float (&dp)[NTQ][4], const float (&pt)[NTQ][4], const Delta& delta) {
#pragma unroll
  for (int nt = 0; nt < NTQ; ++nt) {
    const float2 d2 = delta[nt];
#pragma unroll
    for (int x = 0; x < 4; ++x) dp[nt][x] = pt[nt][x] * (dp[nt][x] - ((x & 1) ? d2.y : d2.x));
  }
}

// kDbiasStore16: a warp's dS^T fragments (16 keys from tile column key0 x NTQ * 8 queries from q_off), packed in
// the A-fragment order (afrag[ks][2 u + hf] = 8 x 8 block (queries 16 ks + 8 u, keys + 8 hf)), into the 16-bit
// [BM queries x BN keys] staging tile (bias_elem_offset's layout) by stmatrix.trans: each block leaves transposed,
// one 16-byte row of 8 keys per query, four blocks per instruction (lane 8 k + c gives the row c of block k).
template <int BM, int NTQ>
__device__ __forceinline__ void stage_dbias16(uint32_t st, const uint32_t (&afrag)[NTQ / 2][4], int q_off, int key0,
                                              int lane) {
  const int k = lane >> 3, c = lane & 7;  // block (u = k >> 1, hf = k & 1) of each instruction, its row c
#pragma unroll
  for (int ks = 0; ks < NTQ / 2; ++ks) {
    const uint32_t a = st + bias_elem_offset<BM>(q_off + ks * 16 + (k >> 1) * 8 + c, key0 + (k & 1) * 8);
    stmatrix_x4_trans(a, afrag[ks][0], afrag[ks][1], afrag[ks][2], afrag[ks][3]);
  }
}

// kDbiasAtomic: this warp's dS^T tile (keys = rows key_row, key_row + 8; queries = columns) summed over dbias's
// broadcast dims in registers and shuffles, then fp32 atomics: one per key ([.., 1, Sk]), per query ([.., Sq, 1]),
// per warp ([.., 1, 1]), or per element (full rows and columns that TMA cannot address).
// q_off: the tile's first query column within the query block (split head-dim consumer: 32 per warpgroup).
template <int BM, int NTQ>
__device__ __forceinline__ void dbias_atomic_add(const BwdPipeParams& P, const float (&ds)[NTQ][4], int b, int h,
                                                 int m, int j0, int lane, int q_off = 0) {
  const KParams& p = P.p;
  const int qc = (lane & 3) * 2, i0 = m * BM + q_off + qc;
  float* db = P.dbias_f32 + (int64_t(b % P.db_period) * P.db_heads + (P.db_heads > 1 ? h : 0)) *
                                int64_t(P.db_rows) * P.db_cols;
  if (P.db_rows > 1 && P.db_cols > 1) {
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int i = i0 + nt * 8 + (x & 1), j = j0 + 8 * (x >> 1);
        if (i < p.Sq && j < p.Sk) atomicAdd(db + int64_t(i) * P.db_cols + j, ds[nt][x]);
      }
  } else if (P.db_rows == 1 && P.db_cols > 1) {  // per key: the thread's queries, then the quad
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float s = 0.f;
#pragma unroll
      for (int nt = 0; nt < NTQ; ++nt) s += ds[nt][2 * hf] + ds[nt][2 * hf + 1];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (qc == 0 && j0 + 8 * hf < p.Sk) atomicAdd(db + j0 + 8 * hf, s);
    }
  } else {  // per query (the thread's two keys, then the 8 key lanes), or everything ([.., 1, 1])
    float total = 0.f;
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float s = ds[nt][e] + ds[nt][2 + e];
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 16);
        total += s;
        if (P.db_rows > 1 && lane < 4 && i0 + nt * 8 + e < p.Sq) atomicAdd(db + i0 + nt * 8 + e, s);
      }
    if (P.db_rows == 1) {
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      if (lane == 0) atomicAdd(db, total);
    }
  }
}

// kBwdTermsRowKeyGrad: dbias [.., 1, Sk] of (b, h) from this thread's sums over its queries of its two keys (j0,
// j0 + 8): the quad's sums, then one fp32 atomic per key.
__device__ __forceinline__ void dbias_key_sums_add(const BwdPipeParams& P, float (&key_grad)[2], int b, int h, int j0,
                                                   int lane) {
  float* db = P.dbias_f32 + (int64_t(b % P.db_period) * P.db_heads + (P.db_heads > 1 ? h : 0)) * int64_t(P.db_cols);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float s = key_grad[hf];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if ((lane & 3) == 0 && j0 + 8 * hf < P.p.Sk) atomicAdd(db + j0 + 8 * hf, s);
  }
}

// Deterministic dQ: the adds of the key blocks into one query tile's accumulator run in key-block order, passed on
// by a ticket per tile. dq_turn_wait: the two consumer warpgroups wait until the ticket names key block n (its rank
// among the key blocks that see query tile m); dq_turn_pass: after their adds, the next key block's turn.
template <int BM, int BN>
__device__ __forceinline__ int dq_turn_wait(const KParams& p, const int* sem, int m, int n, bool issuer) {
  int lo_n, hi_n;
  n_block_range(p, m, BM, BN, lo_n, hi_n);
  const int rank = n - lo_n;
  if (issuer)
    while (ld_acquire(sem) != rank) __nanosleep(32);
  named_sync(kBarBwdDqTicket, 256);
  return rank;
}
__device__ __forceinline__ void dq_turn_pass(int* sem, int rank, bool issuer) {
  __threadfence();
  named_sync(kBarBwdDqTicket, 256);
  if (issuer) st_release(sem, rank + 1);
}

// The first N n-tiles of a dQ fragment (8 columns each) added into the fp32 accumulator at dst(nt). Where kSkipPadding,
// those at or past `cols` are left out: they are an instance's head-dim padding, which the preprocess does not zero
// and dq_frag_convert_kernel never reads, and their adds at L2 are a quarter of the 96 instance's at D = 72. The
// test is in a copy of the loop of its own, entered only where the call pads, and compiled only into the instances
// whose head dims models pad (kDqSkipsPadding: 72 / 80 on 96, SD 1.5's 160 on 256): a test per n-tile in every
// instance cost Flux's backward (128, no padding) 2.4% (RESULTS v5.9). H100 forward + backward kernel time with the
// skip at 96 and 256 (RESULTS v5.10): SD 1.5's 256 tokens (160 on 256) 0.078 -> 0.071 ms, the rows at 128 unchanged.
template <int DK>
constexpr bool kDqSkipsPadding = DK == 96 || DK == 256;
template <bool kSkipPadding, int N, int NT, typename Dst>
__device__ __forceinline__ void add_dq_ntiles(int cols, const float (&acc)[NT][4], Dst&& dst) {
  static_assert(N <= NT, "n-tiles of the fragment");
  if (!kSkipPadding || cols >= N * 8) {
#pragma unroll
    for (int nt = 0; nt < N; ++nt) red_add_v4(dst(nt), acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  } else {
#pragma unroll
    for (int nt = 0; nt < N; ++nt)
      if (nt * 8 < cols) red_add_v4(dst(nt), acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  }
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
