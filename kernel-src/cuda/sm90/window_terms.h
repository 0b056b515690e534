// Score terms of the window-mode kernels (fwd_windows_sm90.h, bwd_windows_sm90.h, bwd_windows_wide_sm90.h). Every
// window of a CTA shares the additive term (the planner groups windows by its period), so when it is the only term
// ("fast path": no bool mask, key padding or band) it is converted once per CTA into a table in accumulator-fragment
// order ([NT][128 threads]), with -inf in the columns past Sk: one FMA per score after that (see build_term_table).
// The wide tiles add key padding on top, per window (fetch_key_padding / vote_key_padding / hide_padded_keys),
// and a bool mask per window as bits (hide_masked_keys; the backward reads them in bwd_windows_wide_sm90.h).
#pragma once
#include "../kernel_params.h"
#include "../utils.h"
#include "tile_sm90.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// What the wide window kernels hide per window beyond the table, as a template argument: each case is its own
// instance, so a call pays only for its own terms (with key padding as a runtime branch, the W12 backward without it
// ran 8% slower than before, and with mask bits as a runtime branch 11% more: RESULTS v3.5).
enum WindowHiding : int {
  kHideNothing = 0,     // the table alone
  kHidePaddedKeys = 1,  // + key padding (p.kp)
  kHideMaskBits = 2,    // + a bool mask per window as bits (p.mbits; the forward still votes p.kp, the backward has
                        // it folded into the words it reads)
  kHideFoldedMask = 3,  // + a bool mask folded into the term as -inf (p.term_hides: a -inf entry hides its key
                        // whatever the score; key padding as kHidePaddedKeys). Its own instance: a runtime branch
                        // around the table cost the W12 forward without a mask 2% (RESULTS v3.8)
};
inline WindowHiding window_hiding(const KParams& p) {
  return p.mbits != nullptr     ? kHideMaskBits
         : p.term_hides         ? kHideFoldedMask
         : p.kp != nullptr      ? kHidePaddedKeys
                                : kHideNothing;
}

__device__ __forceinline__ bool window_fast_terms(const KParams& p) {
  return p.mask.ptr == nullptr && p.kp == nullptr && !p.has_band;
}

// Element (r, c) of the staged additive tile (raw dtype, row pitch p.bias_pitch).
__device__ __forceinline__ float staged_term(const unsigned char* s, const KParams& p, int r, int c) {
  const unsigned char* at = s + r * p.bias_pitch;
  if (p.bias.dtype == 2) return reinterpret_cast<const float*>(at)[c];
  if (p.bias.dtype == 1) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(at)[c]);
  return __half2float(reinterpret_cast<const __half*>(at)[c]);
}

// Fill this thread's column of the table from the staged tile sBias (nullptr: no additive term). The warp's
// first row is wr, `rows` rows of the tile are real; the caller has waited for the tile.
//   kHalf = false: float4 entries, term * log2(e), -inf past Sk;
//   kHalf = true:  uint2 entries (two half2), the staged fp16 term itself (exact: the planner takes this table only
//                  for fp16 tiles), -inf past Sk; log2(e) is applied in apply_term_table.
template <int NT, bool kHalf>
__device__ __forceinline__ void build_term_table(void* sTerm, const unsigned char* sBias, const KParams& p, int wr,
                                                 int rows, int tid) {
  const int lane = tid & 31, qr = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = wr + qr + (i >> 1) * 8, c = nt * 8 + qc + (i & 1);
      e[i] = c >= p.Sk ? -INFINITY : (sBias != nullptr && r < rows) ? staged_term(sBias, p, r, c) : 0.f;
    }
    if constexpr (kHalf) {
      const __half2 lo = __floats2half2_rn(e[0], e[1]), hi = __floats2half2_rn(e[2], e[3]);
      static_cast<uint2*>(sTerm)[nt * 128 + tid] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    } else {
      static_cast<float4*>(sTerm)[nt * 128 + tid] =
          make_float4(e[0] * kLog2e, e[1] * kLog2e, e[2] * kLog2e, e[3] * kLog2e);
    }
  }
}

// The kHalf table for the wide-window backward's transposed tiles (bwd_windows_wide_sm90.h: rows = keys, columns =
// queries): one warp's [NQC chunks of QC queries][QC / 8][32 lanes] (warps holding only padding keys have none),
// read straight from the fp16 term in global memory (once per CTA: no staged tile needed); -inf past Sk and past
// Sq, so padding rows and columns get P = 0 whatever their scores. The warp's first key is key0, the CTA's first
// query q0 (a split window's quarter).
template <int NQC, int QC>
__device__ __forceinline__ void build_term_table_keys(uint2* table, const KParams& p, int b, int h, int key0, int q0,
                                                      int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  const Operand4d& op = p.bias;
  const __half* t = static_cast<const __half*>(op.ptr) + int64_t(b % op.period) * op.sb + int64_t(h) * op.sh;
#pragma unroll
  for (int m = 0; m < NQC; ++m)
#pragma unroll
    for (int nt = 0; nt < QC / 8; ++nt) {
      __half e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kk = key0 + qr + (i >> 1) * 8, qq = q0 + m * QC + nt * 8 + qc + (i & 1);
        e[i] = kk < p.Sk && qq < p.Sq ? t[int64_t(qq) * op.sq + int64_t(kk) * op.sk] : __float2half(-INFINITY);
      }
      const __half2 lo = __halves2half2(e[0], e[1]), hi = __halves2half2(e[2], e[3]);
      table[(m * (QC / 8) + nt) * 32 + lane] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
}

// Key padding on the wide tiles, whose term table is shared by the CTA's windows while the padding is per window.
// Per 128-key block a lane reads 4 keys' bytes as one word (4 byte loads without p.kp_vec4); keys past Sk count as
// kept (the table already hides them). The caller fetches a window ahead, so the loads' latency is off the chain
// (measured while a bug held that kernel to one CTA per SM, W16 forward with key padding: fetched right before the
// score MMA 1.68 ms, a window ahead 1.47; with two CTAs per SM 0.88 against 0.85 without padding, RESULTS v3.4).
// A vote then gives each thread the bits of its own columns (see vote_key_padding).
template <int NB>
__device__ __forceinline__ void fetch_key_padding(uint32_t (&raw)[NB], const KParams& p, int b, int lane) {
  const unsigned char* row = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb;
#pragma unroll
  for (int blk = 0; blk < NB; ++blk) {
    const int key = blk * 128 + lane * 4;
    uint32_t x = 0x01010101u;
    if (key < p.Sk) {
      if (p.kp_vec4 && key + 4 <= p.Sk) {  // (the last word, if partial, by bytes: nothing past Sk is read)
        x = __ldg(reinterpret_cast<const uint32_t*>(row + key));
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (key + j < p.Sk && __ldg(row + int64_t(key + j) * p.kp_sk) == 0) x &= ~(0xffu << (8 * j));
      }
    }
    raw[blk] = x;
  }
}
// Byte j of lane l's word is key 128 blk + 4 l + j, so vote j of a block gives bit l for those keys. A thread's
// columns nt * 8 + qc + e have j = (qc & 2) + e and bit 2 (nt % 16) + qc / 4: it keeps votes (qc & 2) + e shifted
// by qc / 4 (col[e]), and the bit of column tile nt is then at a compile-time position. Returns true when some key
// of the window is padded (the same in every lane).
template <int NB>
__device__ __forceinline__ bool vote_key_padding(uint32_t (&col0)[NB], uint32_t (&col1)[NB], const uint32_t (&raw)[NB],
                                                 int qc) {
  uint32_t any = 0;
#pragma unroll
  for (int blk = 0; blk < NB; ++blk) {
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __ballot_sync(0xffffffffu, ((raw[blk] >> (8 * j)) & 0xffu) == 0);
    any |= v[0] | v[1] | v[2] | v[3];
    col0[blk] = ((qc & 2) ? v[2] : v[0]) >> (qc >> 2);
    col1[blk] = ((qc & 2) ? v[3] : v[1]) >> (qc >> 2);
  }
  return any != 0;
}
// -inf for the padded columns of a row-major accumulator (rows = queries).
template <int NT, int NB>
__device__ __forceinline__ void hide_padded_keys(float (&acc)[NT][4], const uint32_t (&col0)[NB],
                                                 const uint32_t (&col1)[NB]) {
  static_assert(NB * 128 >= NT * 8, "a bit per column");
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if ((col0[nt >> 4] >> ((nt & 15) * 2)) & 1u) acc[nt][0] = acc[nt][2] = -INFINITY;
    if ((col1[nt >> 4] >> ((nt & 15) * 2)) & 1u) acc[nt][1] = acc[nt][3] = -INFINITY;
  }
}

// -inf where a bool mask hides (the wide forward tiles, a mask per window): this thread's rows r0 and r0 + 8 of the
// window's staged bits [64 rows][words] at shared address `bits` (KParams::mbits). Word w of a row holds column
// tiles 4 w .. 4 w + 3; shifted by qc, column tile nt's two columns are bits 8 (nt % 4) and 8 (nt % 4) + 1.
template <int NT>
__device__ __forceinline__ void hide_masked_keys(float (&acc)[NT][4], uint32_t bits, int words, int r0, int qc) {
#pragma unroll
  for (int w = 0; w < (NT + 3) / 4; ++w) {
    const uint32_t a = lds_u32(bits + (r0 * words + w) * 4) >> qc;
    const uint32_t b = lds_u32(bits + ((r0 + 8) * words + w) * 4) >> qc;
#pragma unroll
    for (int i = 0; i < 4 && 4 * w + i < NT; ++i) {
      float(&x)[4] = acc[4 * w + i];
      if (!((a >> (8 * i)) & 1u)) x[0] = -INFINITY;
      if (!((a >> (8 * i + 1)) & 1u)) x[1] = -INFINITY;
      if (!((b >> (8 * i)) & 1u)) x[2] = -INFINITY;
      if (!((b >> (8 * i + 1)) & 1u)) x[3] = -INFINITY;
    }
  }
}

// Raw Q K^T accumulator -> log2-unit scores with the term applied (one FMA per score; two with kHalf). Entry nt of
// thread `tid` is at nt * kStride + tid (128: a warpgroup's table, 32: one warp's) of the table at shared address
// `table` (read with ld.shared: through a generic pointer the compiler no longer knows is shared, the reads were
// generic loads waiting on the long scoreboard). kHides: p.term_hides (a -inf entry hides whatever the score;
// score_mod.h add_term), a template flag so that the tables without a folded mask keep one FMA per score.
template <int NT, bool kHalf, int kStride = 128, bool kHides = false>
__device__ __forceinline__ void apply_term_table(float (&acc)[NT][4], uint32_t table, float scale_log2, int tid) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float e[4];
    if constexpr (kHalf) {
      const float2 u = lds_f32x2(table + (nt * kStride + tid) * 8);  // (two half2, moved as raw bits)
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
      e[0] = lo.x * kLog2e, e[1] = lo.y * kLog2e, e[2] = hi.x * kLog2e, e[3] = hi.y * kLog2e;
    } else {
      const float4 f = lds_f32x4(table + (nt * kStride + tid) * 16);
      e[0] = f.x, e[1] = f.y, e[2] = f.z, e[3] = f.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x = fmaf(acc[nt][i], scale_log2, e[i]);
      acc[nt][i] = kHides && e[i] == -INFINITY ? -INFINITY : x;
    }
  }
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
