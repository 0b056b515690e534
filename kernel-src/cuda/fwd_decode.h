// Split-KV forward for calls with a few query rows per KV head ("decode": Sq x (H / Hkv) <= 16), every
// architecture (mma.sync, sm_80 and up).
//
// Why a kernel of its own: the tiled forwards give each (batch, head) a 128-row query tile, so a decode step
// (Sq = 1) uses one row in 128 and one CTA per head walks the whole key set (H200 bf16, Llama-3-8B decode with
// batch 32: 0.755 ms against 0.244 ms for FlashAttention-4, RESULTS v3.6). Decode is memory-bound: what counts is
// reading K and V once, at full bandwidth, with enough CTAs to cover the machine. So here:
//   * the rows of one KV head's query group (its H / Hkv heads x Sq queries) are one 16-row tile, K and V read
//     once for all of them (GQA);
//   * the key set is split over CTAs (one CTA per (split, KV head, batch)); each writes its normalized partial
//     output and its log2-sum-exp, and decode_combine_kernel merges them (no combine when there is one split);
//   * K and V stream through shared memory in 64-key tiles, kStages deep (cp.async, coalesced 16-byte rows: a
//     first version gave each lane its own key row straight from global memory and reached ~40% of the H200's
//     bandwidth, 0.57 ms for the batch-32 row above); each of the 4 warps takes 16 keys of a tile with tensor
//     cores (S = Q K^T, then P V with P in registers), its own online softmax, the warps merged at the end;
//   * score terms are read per element (bias, bool mask, band: there are few rows), key padding alone once per
//     key, and a call without terms checks none (both fast paths measured: RESULTS v3.7).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm.h"
#include "kernel_params.h"
#include "score_mod.h"
#include "softmax.h"
#include "tile_io.h"
#include "utils.h"

namespace winattn {
namespace cuda {

struct DecodeParams {
  KParams p;
  int splits = 1, chunk = 0;  // keys [split * chunk, (split + 1) * chunk)
  float* o_part = nullptr;    // splits > 1: fp32 [splits, B, H, Sq, D], normalized by each split's sum
  float* lse_part = nullptr;  // splits > 1: fp32 [splits, B, H, Sq], log2 units (-inf: the split saw no key)
};

template <int DK_>
struct DecodeTraits {
  static constexpr int kHeadDim = DK_;  // instance head dim (the call's D <= it)
  static constexpr int kRows = 16;      // one m16 tile of query rows (the call's H / Hkv x Sq <= it)
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kKeysPerWarp = 16, kBlockN = kKeysPerWarp * kWarps;  // one 64-key tile per stage
  // three stages: two tiles in flight per CTA while one is computed, two CTAs per SM at D = 128 (H200: 2 x 104 KB);
  // two at D = 256, where a stage is 66 KB
  static constexpr int kStages = DK_ >= 256 ? 2 : 3;
  static constexpr int kPitch = DK_ + 8;  // elements per shared row: ldmatrix without bank conflicts
  static constexpr int kTileElems = kBlockN * kPitch;
  static constexpr int kQBytes = kRows * kPitch * 2, kStageBytes = 2 * kTileElems * 2;  // K and V
  // the warps' merge reuses the stages: partial outputs [W][16][DK] and maxima / sums [2][W][16], fp32
  static constexpr int kMergeBytes = (kWarps * kRows * kHeadDim + 2 * kWarps * kRows) * 4;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes;
  static_assert(kMergeBytes <= kStages * kStageBytes, "the merge fits in the stages");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "k16 steps");
};

// The score of row r (query i of head h) and key j in log2 units, -inf where the key is hidden. dot: the raw
// product q . k times scale * log2(e).
__device__ __forceinline__ float decode_score(const KParams& p, float dot, int b, int h, int i, int j) {
  if (p.kp != nullptr && __ldg(reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb +
                               int64_t(j) * p.kp_sk) == 0)
    return -INFINITY;
  const int64_t d = int64_t(j) - i;
  if (p.has_band && (d < p.band_lo || d > p.band_hi)) return -INFINITY;
  if (p.mask.ptr != nullptr) {
    const Operand4d& m = p.mask;
    const int64_t off = int64_t(b % m.period) * m.sb + (m.heads > 1 ? int64_t(h) * m.sh : 0) +
                        (m.rows > 1 ? int64_t(i) * m.sq : 0) + (m.cols > 1 ? int64_t(j) * m.sk : 0);
    if (__ldg(static_cast<const unsigned char*>(m.ptr) + off) == 0) return -INFINITY;
  }
  if (p.bias.ptr != nullptr) {
    const Operand4d& t = p.bias;
    const int64_t off = int64_t(b % t.period) * t.sb + (t.heads > 1 ? int64_t(h) * t.sh : 0) +
                        (t.rows > 1 ? int64_t(i) * t.sq : 0) + (t.cols > 1 ? int64_t(j) * t.sk : 0);
    dot = fmaf(ld_scalar(t.ptr, t.dtype, off), kLog2e, dot);
  }
  return dot;
}

// What both decode kernels (this one and sm90/fwd_decode_sm90.h) share around their GEMMs: the score terms of a
// warp's 16 keys, and the merge of the warps' parts into the rows they write.
struct DecodeRows {
  int b, hkv, split, G, rows;  // rows = G x Sq: r -> head hkv * G + r / Sq, query r % Sq
  bool plain, kp_only;          // no term at all; key padding alone (its row kp_row, one byte per key)
  const unsigned char* kp_row;
};
__device__ __forceinline__ DecodeRows decode_rows(const DecodeParams& P, int b, int hkv, int split) {
  const KParams& p = P.p;
  const bool plain = p.kp == nullptr && !p.has_band && p.mask.ptr == nullptr && p.bias.ptr == nullptr;
  const bool kp_only = p.kp != nullptr && !p.has_band && p.mask.ptr == nullptr && p.bias.ptr == nullptr;
  return {b, hkv, split, p.hgroup, p.hgroup * p.Sq, plain, kp_only,
          kp_only ? reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb : nullptr};
}

// s: the raw Q K^T of a warp's 16 keys (j0: this thread's first key) -> scores in log2 units, -inf where hidden. No
// term but key padding: a key hidden for every row (rows past the group are never read), one byte per key instead of
// score_mod's checks per score.
__device__ __forceinline__ void decode_scores(float (&s)[1][2][4], const KParams& p, const DecodeRows& d, int j0,
                                              int key_hi, int lane) {
  if (d.plain || d.kp_only) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int j = j0 + nt * 8 + c;
        const bool seen = j < key_hi && (d.plain || d.kp_row[int64_t(j) * p.kp_sk] != 0);
        s[0][nt][c] = seen ? s[0][nt][c] * p.scale_log2 : -INFINITY;
        s[0][nt][c + 2] = seen ? s[0][nt][c + 2] * p.scale_log2 : -INFINITY;
      }
  } else {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = (lane >> 2) + (e >> 1) * 8, j = j0 + nt * 8 + (e & 1);
        const float x = s[0][nt][e] * p.scale_log2;
        s[0][nt][e] = j < key_hi && r < d.rows ? decode_score(p, x, d.b, d.hkv * d.G + r / p.Sq, r % p.Sq, j)
                                               : -INFINITY;
      }
  }
}

// The 16 query rows of a KV head's group into a padded shared tile [16][LD] (cp.async, the caller commits): row r is
// head hkv * G + r / Sq, query r % Sq; rows past the group and dims past D are zero-filled. Both decode kernels.
template <typename Elem, int DK, int LD>
__device__ __forceinline__ void decode_load_q(Elem* sQ, const KParams& p, int b, int hkv, int tid, int nthreads) {
  constexpr int R = 16;
  const int G = p.hgroup, rows = G * p.Sq;
  for (int x = tid; x < R * (DK / 8); x += nthreads) {
    const int r = x / (DK / 8), c = x % (DK / 8);
    const bool pred = r < rows && c * 8 < p.D;
    const Elem* src = static_cast<const Elem*>(p.q);
    if (pred)
      src += int64_t(b) * p.q_sb + int64_t(r % p.Sq) * p.q_ss + int64_t(hkv * G + r / p.Sq) * p.q_sh + c * 8;
    cp_async16(sQ + r * LD + c * 8, src, pred);
  }
}

// A warp's running max / sum and O rows into the merge buffers (the stages' space, after a barrier): sO [W][16][DK],
// sM [W][16] maxima, then [W][16] sums.
template <int W, int DK>
__device__ __forceinline__ void decode_park_warp(float* sO, float* sM, const OnlineSoftmax<1>& softmax,
                                                 const float (&acc_o)[1][DK / 8][4], int warp, int lane) {
  constexpr int R = 16;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = (lane >> 2) + hf * 8;
    const float l = quad_sum(softmax.row_sum[0][hf]);
    if ((lane & 3) == 0) {
      sM[warp * R + r] = softmax.row_max[0][hf];
      sM[W * R + warp * R + r] = l;
    }
#pragma unroll
    for (int dt = 0; dt < DK / 8; ++dt)
      *reinterpret_cast<float2*>(sO + (warp * R + r) * DK + dt * 8 + (lane & 3) * 2) =
          make_float2(acc_o[0][dt][2 * hf], acc_o[0][dt][2 * hf + 1]);
  }
}

// The W warps' parts of each row merged (each with its own max), after a barrier, by threads tid, tid + nthreads, ..:
// out and lse (one split) or the split's partial row and its log2-sum-exp (several; decode_combine_kernel merges them).
template <typename Elem, int W, int DK>
__device__ __forceinline__ void decode_write_rows(const DecodeParams& P, const DecodeRows& d, const float* sO,
                                                  const float* sM, int tid, int nthreads) {
  constexpr int R = 16;
  const KParams& p = P.p;
  for (int x = tid; x < d.rows * p.D; x += nthreads) {
    const int r = x / p.D, dim = x % p.D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) M = fmaxf(M, sM[w * R + r]);
    const float base = softmax_base(M);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float f = fast_exp2(sM[w * R + r] - base);
      L = fmaf(sM[W * R + w * R + r], f, L);
      acc = fmaf(sO[(w * R + r) * DK + dim], f, acc);
    }
    // the row policy (softmax.h): no key of this split visible -> out 0, lse -inf; a NaN score -> out and lse NaN
    const RowFinal fin = finalize_row(M, L);
    const float out = acc * fin.scale();
    const int h = d.hkv * d.G + r / p.Sq, i = r % p.Sq;
    if (P.splits == 1) {
      Elem* orow = static_cast<Elem*>(p.o) + int64_t(d.b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
      orow[dim] = Elem(out);
      if (dim == 0) p.lse[(int64_t(d.b) * p.H + h) * p.Sq + i] = fin.lse();
    } else {
      const int64_t row = ((int64_t(d.split) * p.B + d.b) * p.H + h) * p.Sq + i;
      P.o_part[row * p.D + dim] = out;
      if (dim == 0) P.lse_part[row] = fin.lse2();
    }
  }
}

// One CTA: keys [split * chunk, ...) of KV head hkv of batch b, for the rows r = (h - hkv * G) * Sq + i.
template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kThreads) fwd_decode_kernel(const __grid_constant__ DecodeParams P) {
  constexpr int DK = Tr::kHeadDim, R = Tr::kRows, W = Tr::kWarps, BN = Tr::kBlockN, ST = Tr::kStages;
  constexpr int LD = Tr::kPitch, NTH = Tr::kThreads, DT = DK / 8;
  const KParams& p = P.p;
  extern __shared__ float4 smem_f4[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_f4);  // [16][LD], rows past the group and dims past D zero
  Elem* sKV = sQ + R * LD;                      // per stage: K [BN][LD], then V [BN][LD]
  // the KV heads of one key range are neighbours in the launch order, so the CTAs running together read whole
  // [Hkv, D] rows of K / V (k is [B, Sk, Hkv, D]) instead of one head's 2 D bytes of each
  const int hkv = int(blockIdx.x % p.Hkv), split = int(blockIdx.x / p.Hkv % P.splits);
  const int b = int(blockIdx.x / p.Hkv / P.splits);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int key_lo = split * P.chunk, key_hi = min(p.Sk, key_lo + P.chunk);
  const int tiles = (key_hi - key_lo + BN - 1) / BN;

  decode_load_q<Elem, DK, LD>(sQ, p, b, hkv, tid, NTH);
  const Elem* kbase = static_cast<const Elem*>(p.k) + int64_t(b) * p.k_sb + int64_t(hkv) * p.k_sh;
  const Elem* vbase = static_cast<const Elem*>(p.v) + int64_t(b) * p.v_sb + int64_t(hkv) * p.v_sh;
  // this thread's 16-byte chunks of a tile: column chunk tid % CPR (fixed), rows tid / CPR + k * RSTEP; keys past
  // key_hi and dims past D read as 0 (P V never meets garbage). Pointers advance instead of being recomputed: the
  // loads' address arithmetic was a large part of the kernel's instructions (ncu, H200: issue-bound at 8 warps / SM)
  constexpr int CPR = DK / 8, RSTEP = NTH / CPR, PER = BN / RSTEP;
  static_assert(NTH % CPR == 0 && BN % RSTEP == 0, "whole rows per pass");
  const int lr = tid / CPR, lc = tid % CPR;
  const bool col_ok = lc * 8 < p.D;
  const Elem* gk = kbase + int64_t(key_lo + lr) * p.k_ss + lc * 8;
  const Elem* gv = vbase + int64_t(key_lo + lr) * p.v_ss + lc * 8;
  const int64_t k_step = int64_t(RSTEP) * p.k_ss, v_step = int64_t(RSTEP) * p.v_ss;
  auto load_tile = [&](int t) {
    Elem* sK = sKV + (t % ST) * 2 * Tr::kTileElems + lr * LD + lc * 8;
    const int row0 = key_lo + t * BN + lr;
    const Elem* k = gk + int64_t(t) * BN * p.k_ss;
    const Elem* v = gv + int64_t(t) * BN * p.v_ss;
#pragma unroll
    for (int x = 0; x < PER; ++x) {
      const bool pred = col_ok && row0 + x * RSTEP < key_hi;
      cp_async16(sK + x * RSTEP * LD, pred ? k : p.k, pred);
      cp_async16(sK + Tr::kTileElems + x * RSTEP * LD, pred ? v : p.v, pred);
      k += k_step;
      v += v_step;
    }
  };
#pragma unroll
  for (int t = 0; t < ST - 1; ++t) {  // the prologue (q rides with the first tile's group)
    if (t < tiles) load_tile(t);
    cp_async_commit();
  }

  const DecodeRows dr = decode_rows(P, b, hkv, split);
  OnlineSoftmax<1> softmax;
  softmax.reset();
  float acc_o[1][DT][4];
  zero_acc(acc_o);
  for (int t = 0; t < tiles; ++t) {
    cp_async_wait_group<ST - 2>();
    __syncthreads();  // tile t landed for every warp; every warp is done with tile t - 1's stage
    if (t + ST - 1 < tiles) load_tile(t + ST - 1);
    cp_async_commit();

    const Elem* sK = sKV + (t % ST) * 2 * Tr::kTileElems + warp * Tr::kKeysPerWarp * LD;
    float s[1][2][4];
    zero_acc(s);
    gemm_ss<Elem, 1, 2, DK / 16, false, false>(s, sQ, LD, sK, LD, lane);
    decode_scores(s, p, dr, key_lo + t * BN + warp * Tr::kKeysPerWarp + (lane & 3) * 2, key_hi, lane);
    softmax.update(s, acc_o);
    uint32_t pa[1][1][4];
    acc_to_afrag<Elem, 1, 2>(pa, s);
    gemm_rs<Elem, 1, DT, 1, true>(acc_o, pa, sK + Tr::kTileElems, LD, lane);
  }

  // merge the warps (each with its own max) through shared memory, in the stages' space
  cp_async_wait_all();
  __syncthreads();
  float* sO = reinterpret_cast<float*>(sKV);  // [W][16][DK]
  float* sM = sO + W * R * DK;                // [W][16] maxima, then [W][16] sums
  decode_park_warp<W, DK>(sO, sM, softmax, acc_o, warp, lane);
  __syncthreads();
  decode_write_rows<Elem, W, DK>(P, dr, sO, sM, tid, NTH);
}

// Merges the splits of each (b, h, i) row: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max). One CTA per
// row, 4 warps; warp w takes splits w, w + 4, ... in passes of kBatch splits whose lse and partial rows it loads at
// once (4 dims per lane), keeping its own running max, and the warps' parts meet in shared memory. The loads of a
// pass do not depend on each other, so a pass costs one memory round trip: the step is a chain of round trips, not
// of work. (v5.3 made three: the lse for the max, again for the sum, then the partial rows 4 splits per trip; 4-6 us
// for Llama-3-8B decode at batch 1 against 11-18 us for the split kernel, RESULTS v5.4. Before that a warp per row
// walking the splits one by one took 94 us.)
template <typename Elem>
__global__ void __launch_bounds__(128) decode_combine_kernel(const __grid_constant__ DecodeParams P) {
  constexpr int kWarps = 4, kBatch = 8;  // 32 splits per pass of the CTA (batch 1 on the H100 / H200: one pass)
  const KParams& p = P.p;
  __shared__ float4 part[kWarps][64];  // the warps' weighted sums, D / 4 <= 64 float4 each
  __shared__ float part_m[kWarps], part_l[kWarps];
  const int64_t row = blockIdx.x, stride = int64_t(p.B) * p.H * p.Sq;  // between splits
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int d4s = p.D / 4;  // (D is a multiple of 8)
  // this warp's running max m (-inf until a split saw a key), sum l and weighted sum acc, all relative to 2^m
  float m = -INFINITY, l = 0.f;
  float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  for (int s0 = warp; s0 < P.splits; s0 += kWarps * kBatch) {
    float lse[kBatch];
    float4 x[kBatch][2];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int s = s0 + k * kWarps;
      const bool in = s < P.splits;
      lse[k] = in ? P.lse_part[s * stride + row] : -INFINITY;
      const float4* o = reinterpret_cast<const float4*>(P.o_part + (s * stride + row) * p.D);
#pragma unroll
      for (int c = 0; c < 2; ++c)
        x[k][c] = in && lane + 32 * c < d4s ? o[lane + 32 * c] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m_new = m;
#pragma unroll
    for (int k = 0; k < kBatch; ++k) m_new = fmaxf(m_new, lse[k]);  // (fmaxf passes a NaN lse by: the sum keeps it)
    const float base = softmax_base(m_new), r = fast_exp2(m - base);  // (m = -inf: r = 0 and l, acc are 0)
    l *= r;
#pragma unroll
    for (int c = 0; c < 2; ++c) acc[c] = make_float4(acc[c].x * r, acc[c].y * r, acc[c].z * r, acc[c].w * r);
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const float w = fast_exp2(lse[k] - base);  // (a split past the end or without keys: 0)
      l += w;
#pragma unroll
      for (int c = 0; c < 2; ++c)
        acc[c] = make_float4(fmaf(w, x[k][c].x, acc[c].x), fmaf(w, x[k][c].y, acc[c].y),
                             fmaf(w, x[k][c].z, acc[c].z), fmaf(w, x[k][c].w, acc[c].w));
    }
    m = m_new;
  }
#pragma unroll
  for (int c = 0; c < 2; ++c)
    if (lane + 32 * c < d4s) part[warp][lane + 32 * c] = acc[c];
  if (lane == 0) part_m[warp] = m, part_l[warp] = l;
  __syncthreads();
  if (warp > 0) return;
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, part_m[w]);
  const float base = softmax_base(M);
  float f[kWarps], L = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) f[w] = fast_exp2(part_m[w] - base), L = fmaf(part_l[w], f[w], L);
  const int i = int(row % p.Sq), h = int((row / p.Sq) % p.H), b = int(row / (int64_t(p.Sq) * p.H));
  Elem* orow = static_cast<Elem*>(p.o) + int64_t(b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
  const RowFinal fin = finalize_row(M, L);  // the row policy (softmax.h): empty rows 0 / -inf, NaN rows NaN
  const float inv = fin.scale();
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int d4 = lane + 32 * c;
    if (d4 >= d4s) continue;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 y = part[w][d4];
      x = make_float4(fmaf(f[w], y.x, x.x), fmaf(f[w], y.y, x.y), fmaf(f[w], y.z, x.z), fmaf(f[w], y.w, x.w));
    }
    orow[4 * d4] = Elem(x.x * inv);
    orow[4 * d4 + 1] = Elem(x.y * inv);
    orow[4 * d4 + 2] = Elem(x.z * inv);
    orow[4 * d4 + 3] = Elem(x.w * inv);
  }
  if (lane == 0) p.lse[row] = fin.lse();
}

}  // namespace cuda
}  // namespace winattn
