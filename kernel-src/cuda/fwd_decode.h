// Split-KV forward for calls with a few query rows per KV head ("decode": Sq x (H / Hkv) <= 8), every architecture.
//
// Why a kernel of its own: the tiled forwards give each (batch, head) a 128-row query tile, so a decode step
// (Sq = 1) uses one row in 128 and one CTA per head walks the whole key set (H200 bf16, Llama-3-8B decode with
// batch 32: 0.755 ms against 0.244 ms for FlashAttention-4, RESULTS v3.6). Decode is memory-bound: what counts is
// reading K and V once, at full bandwidth, with enough CTAs to cover the machine. So here:
//   * the rows of one KV head's query group (its H / Hkv heads x Sq queries) are computed together, K and V read
//     once for all of them (GQA);
//   * the key set is split over CTAs (one CTA per (split, KV head, batch)); each writes its normalized partial
//     output and its log2-sum-exp, and decode_combine_kernel merges them (no combine when there is one split);
//   * no tensor cores: the score phase gives each lane one key (the dot product over D in its registers, q read
//     from shared memory as a broadcast), the P V phase gives each lane 8 head dims of one key; 4 warps per CTA,
//     each with its own online softmax over its keys, merged at the end of the chunk.
//   * every score term is read per element (bias, bool mask, key padding, band): there are few rows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_params.h"
#include "score_mod.h"
#include "softmax.h"
#include "utils.h"

namespace winattn {
namespace cuda {

struct DecodeParams {
  KParams p;
  int splits = 1, chunk = 0;  // keys [split * chunk, (split + 1) * chunk)
  float* o_part = nullptr;    // splits > 1: fp32 [splits, B, H, Sq, D], normalized by each split's sum
  float* lse_part = nullptr;  // splits > 1: fp32 [splits, B, H, Sq], log2 units (-inf: the split saw no key)
};

template <int DK_, int R_>
struct DecodeTraits {
  static constexpr int kHeadDim = DK_;  // instance head dim (the call's D <= it)
  static constexpr int kRows = R_;      // query rows per CTA (the call's H / Hkv x Sq <= it)
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kKeysPerStep = 32 * kWarps;  // one key per lane in the score phase
  // P V phase: 8 head dims (16 bytes) per lane, kLanesPerKey lanes per key, kKeysAtOnce keys per warp step
  static constexpr int kLanesPerKey = DK_ <= 32 ? 4 : DK_ <= 64 ? 8 : DK_ <= 128 ? 16 : 32;
  static constexpr int kKeysAtOnce = 32 / kLanesPerKey;
  // shared memory: q (scaled) | P per warp | the warps' partial outputs for the merge
  static constexpr int kQFloats = kRows * kHeadDim, kPFloats = kWarps * 32 * kRows;
  static constexpr int kOFloats = kWarps * kRows * kHeadDim;
  static constexpr int kSmemBytes = (kQFloats + kPFloats + kOFloats + 2 * kWarps * kRows) * 4;
  static_assert(kHeadDim % 8 == 0 && kHeadDim <= 8 * 32, "8 dims per lane");
};

template <typename Elem>
__device__ __forceinline__ void load8(float (&x)[8], const Elem* src) {  // 16 bytes -> 8 floats
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src));
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = ElemTraits<Elem>::unpack(w[e]);
    x[2 * e] = f.x;
    x[2 * e + 1] = f.y;
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

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

// One CTA: keys [split * chunk, ...) of KV head hkv of batch b, for the rows r = (h - hkv * G) * Sq + i.
template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kThreads) fwd_decode_kernel(const __grid_constant__ DecodeParams P) {
  constexpr int DK = Tr::kHeadDim, R = Tr::kRows, W = Tr::kWarps, LK = Tr::kLanesPerKey, KA = Tr::kKeysAtOnce;
  const KParams& p = P.p;
  extern __shared__ float4 smem_f4[];
  float* sQ = reinterpret_cast<float*>(smem_f4);  // [R][DK], q * scale * log2(e), 0 past D / the rows
  float* sP = sQ + Tr::kQFloats;                  // [W][32 keys][R]
  float* sO = sP + Tr::kPFloats;                  // [W][R][DK]
  float* sML = sO + Tr::kOFloats;                 // [W][R] maxima, then [W][R] sums
  const int split = int(blockIdx.x % P.splits), hkv = int(blockIdx.x / P.splits % p.Hkv);
  const int b = int(blockIdx.x / P.splits / p.Hkv);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = p.hgroup, rows = G * p.Sq;
  const int key_lo = split * P.chunk, key_hi = min(p.Sk, key_lo + P.chunk);

  for (int x = tid; x < R * DK; x += Tr::kThreads) {
    const int r = x / DK, d = x % DK;
    float v = 0.f;
    if (r < rows && d < p.D) {
      const int h = hkv * G + r / p.Sq, i = r % p.Sq;
      const Elem* q = static_cast<const Elem*>(p.q) + int64_t(b) * p.q_sb + int64_t(i) * p.q_ss + int64_t(h) * p.q_sh;
      v = to_float(q[d]) * p.scale_log2;
    }
    sQ[x] = v;
  }
  __syncthreads();

  const Elem* kbase = static_cast<const Elem*>(p.k) + int64_t(b) * p.k_sb + int64_t(hkv) * p.k_sh;
  const Elem* vbase = static_cast<const Elem*>(p.v) + int64_t(b) * p.v_sb + int64_t(hkv) * p.v_sh;
  const int dlane = (lane % LK) * 8;  // P V phase: this lane's 8 dims
  float m[R], l[R], o[R][8];          // m: the warp's running max (log2), l: this lane's share of the sum
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.f;
  }

  for (int j0 = key_lo + warp * 32; j0 < key_hi; j0 += Tr::kKeysPerStep) {
    // scores: this lane's key against every row
    const int j = j0 + lane;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.f;
    if (j < key_hi) {
      const Elem* krow = kbase + int64_t(j) * p.k_ss;
#pragma unroll 4
      for (int d0 = 0; d0 < DK; d0 += 8) {
        if (d0 >= p.D) break;
        float kx[8];
        load8(kx, krow + d0);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float4 qa = *reinterpret_cast<const float4*>(sQ + r * DK + d0);
          const float4 qb = *reinterpret_cast<const float4*>(sQ + r * DK + d0 + 4);
          s[r] = fmaf(qa.x, kx[0], fmaf(qa.y, kx[1], fmaf(qa.z, kx[2], fmaf(qa.w, kx[3], s[r]))));
          s[r] = fmaf(qb.x, kx[4], fmaf(qb.y, kx[5], fmaf(qb.z, kx[6], fmaf(qb.w, kx[7], s[r]))));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int h = hkv * G + r / p.Sq, i = r % p.Sq;
      s[r] = j < key_hi && r < rows ? decode_score(p, s[r], b, h, i, j) : -INFINITY;
      // online softmax, per warp: a row that has seen no key keeps max -inf and uses 0 as the exponent base
      const float mx = fmaxf(m[r], warp_max(s[r]));
      const float base = mx == -INFINITY ? 0.f : mx;
      const float corr = fast_exp2(m[r] - base);
      m[r] = mx;
      const float pr = fast_exp2(s[r] - base);
      l[r] = l[r] * corr + pr;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] *= corr;
      sP[(warp * 32 + lane) * R + r] = pr;
    }
    __syncwarp();
    // P V: kKeysAtOnce keys per step, 8 dims per lane
    if (dlane < p.D) {
#pragma unroll 2
      for (int kk = lane / LK; kk < 32; kk += KA) {
        if (j0 + kk >= key_hi) break;
        float vx[8];
        load8(vx, vbase + int64_t(j0 + kk) * p.v_ss + dlane);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float pr = sP[(warp * 32 + kk) * R + r];
#pragma unroll
          for (int e = 0; e < 8; ++e) o[r][e] = fmaf(pr, vx[e], o[r][e]);
        }
      }
    }
    __syncwarp();
  }

  // merge: the lanes that share dims (one per key slot), then the warps (each with its own max)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    l[r] = warp_sum(l[r]);
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int x = LK; x < 32; x <<= 1) o[r][e] += __shfl_xor_sync(0xffffffffu, o[r][e], x);
    if (lane < LK)
#pragma unroll
      for (int e = 0; e < 8; ++e) sO[(warp * R + r) * DK + dlane + e] = o[r][e];
    if (lane == 0) {
      sML[warp * R + r] = m[r];
      sML[W * R + warp * R + r] = l[r];
    }
  }
  __syncthreads();
  for (int x = tid; x < rows * p.D; x += Tr::kThreads) {
    const int r = x / p.D, d = x % p.D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) M = fmaxf(M, sML[w * R + r]);
    const float base = M == -INFINITY ? 0.f : M;
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float f = fast_exp2(sML[w * R + r] - base);
      L = fmaf(sML[W * R + w * R + r], f, L);
      acc = fmaf(sO[(w * R + r) * DK + d], f, acc);
    }
    // L == 0: no key of this split was visible (out 0, lse -inf); a NaN score leaves L NaN (out and lse NaN)
    const float out = L == 0.f ? 0.f : acc / L, lse2 = L == 0.f ? -INFINITY : M + log2f(L);
    const int h = hkv * G + r / p.Sq, i = r % p.Sq;
    if (P.splits == 1) {
      Elem* orow = static_cast<Elem*>(p.o) + int64_t(b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
      orow[d] = Elem(out);
      if (d == 0) p.lse[(int64_t(b) * p.H + h) * p.Sq + i] = lse2 * kLn2;
    } else {
      const int64_t row = ((int64_t(split) * p.B + b) * p.H + h) * p.Sq + i;
      P.o_part[row * p.D + d] = out;
      if (d == 0) P.lse_part[row] = lse2;
    }
  }
}

// Merges the splits of each (b, h, i) row: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max). One warp per
// row, 8 dims per lane and step.
template <typename Elem>
__global__ void __launch_bounds__(128) decode_combine_kernel(const __grid_constant__ DecodeParams P) {
  const KParams& p = P.p;
  const int64_t rows = int64_t(p.B) * p.H * p.Sq;
  const int64_t row = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t stride = rows;  // between splits
  float M = -INFINITY;
  for (int s = 0; s < P.splits; ++s) M = fmaxf(M, P.lse_part[s * stride + row]);
  const float base = M == -INFINITY ? 0.f : M;
  float L = 0.f;
  for (int s = 0; s < P.splits; ++s) L += fast_exp2(P.lse_part[s * stride + row] - base);
  const int i = int(row % p.Sq), h = int((row / p.Sq) % p.H), b = int(row / (int64_t(p.Sq) * p.H));
  Elem* orow = static_cast<Elem*>(p.o) + int64_t(b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
  for (int d = lane; d < p.D; d += 32) {
    float acc = 0.f;
    for (int s = 0; s < P.splits; ++s)
      acc = fmaf(P.o_part[(s * stride + row) * p.D + d], fast_exp2(P.lse_part[s * stride + row] - base), acc);
    orow[d] = Elem(L == 0.f ? 0.f : acc / L);
  }
  if (lane == 0) p.lse[row] = L == 0.f ? -INFINITY : (M + log2f(L)) * kLn2;
}

}  // namespace cuda
}  // namespace winattn
