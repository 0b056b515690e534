// Score terms of the Hopper forward v3 (fwd_pipelined_sm90.h), applied to one warp's 16 x BN block of raw Q K^T in
// the wgmma accumulator layout (per thread rows qr and qr + 8, column pairs nt * 8 + qc).
//
// Modes (a kernel template parameter, chosen per call by the launcher in launch_sm90.h):
//   * kTermsRaw / kTermsRawBias: the scores stay raw (s), the terms enter as s += bias / scale (the staged tile)
//     and s = -inf for hidden keys, and the softmax folds scale * log2(e) into its exponent FMA. Covers no term, the
//     staged additive tile, key padding, the causal / sliding-window band and the sequence end; needs scale > 0
//     (the row max commutes with the scaling).
//   * kTermsRawRow: a term broadcast over the queries ([B or 1, H or 1, 1, Sk]) enters as s += term / scale, one
//     value per column: a producer warp stages the block's BN values, divided by the scale, in shared memory with
//     its K (fwd_pipelined_sm90.h produce_row_terms) and each thread reads its 2 x NT columns as float pairs.
//   * kTermsRawRowPadded / kTermsRawBiasPadded: kTermsRawRow (the term optional: key padding alone) / kTermsRawBias
//     with key padding staged by that warp as bits (PadBits), which hide their keys as masked_fill does, whatever the
//     score (a -inf added to a NaN score would let the NaN through). The raw path's per-block warp vote read the mask
//     from global memory after every Q K^T (T5-shaped bias + padding 0.173 ms, 0.135 staged: RESULTS v4.2).
//     History: loaded per thread after the Q K^T wait, their latency sat on every block's critical path (Flux-shaped
//     float key mask 2.06 ms against 0.81 ms as key padding, RESULTS v3.6); loaded by the consumer warps one block
//     ahead and spread by shuffles (v3.6-v4.0), a one-block tile still waited on them (ncu of LTX's [B, H, 1, Sk]
//     mask: 13% of the consumers' stall samples) and each thread paid 2 x NT shuffles per block.
//   * kTermsRawBits: a bool mask per score without an additive term, as bits (aux_kernels.h mask_bits_kernel: bit j
//     of word w of a row = column 32 w + j; 1/8 of the mask's bytes, 1/16 of a -inf term's): each thread loads the
//     block's words of its two rows one key block ahead (load_mask_bits) and hides the columns whose bit is 0, as
//     masked_fill does (the mask folded into a bf16 term cost T5-shaped [B, H, S, S] a pass of 3 bytes per score).
//   * kTermsGeneral: apply_terms() (score_mod.h), reading the term and the bool mask from global memory, scores leave
//     in log2 units. A bool mask, an additive term that is not staged, or scale <= 0 take it. It is a kernel of its
//     own because its registers (ptxas: 280+ bytes of spills at D = 128 when it shared the loop) would otherwise
//     cap the fast paths.
#pragma once
#include "../block_info.h"
#include "../kernel_modes.h"
#include "../kernel_params.h"
#include "../score_mod.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// Staged additive tile [BM rows x BN cols] of 16-bit elements: BN / 64 boxes of [BM x 128 bytes], 128-byte swizzle
// (the 16-byte chunk c of row r sits at chunk c ^ (r & 7)). Returns columns (col, col + 1) of tile row r.
// kLds: read by 32-bit shared-window address (ld.shared) instead of the generic pointer: half the address
// registers (the two-CTA tile's 104 registers spilled 116 bytes of precomputed generic addresses otherwise).
template <typename Elem, int BM, bool kLds = false>
__device__ __forceinline__ float2 bias_pair_smem(const unsigned char* sB, int r, int col) {
  const int byte = col * 2;
  const int off = (byte >> 7) * (BM * 128) + r * 128 + ((((byte >> 4) & 7) ^ (r & 7)) << 4) + (byte & 15);
  if constexpr (kLds) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_u32(sB) + off));
    return ElemTraits<Elem>::unpack(v);
  }
  return ElemTraits<Elem>::unpack(*reinterpret_cast<const uint32_t*>(sB + off));
}

// Key padding that hides nothing in key block j0 of item b (needs p.kp_vec4; false past Sk): a warp vote over one
// 4-byte word of the mask per lane and step (score_mod.h's kp_block_all_kept, for key blocks past 128 too).
template <int BN>
__device__ __forceinline__ bool kp_all_kept(const KParams& p, int b, int j0, int lane) {
  if (j0 + BN > p.Sk) return false;
  const unsigned char* row = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb + j0;
  bool kept = true;
#pragma unroll
  for (int w = lane; w < BN / 4; w += 32) {
    const uint32_t x = *reinterpret_cast<const uint32_t*>(row + w * 4);
    kept = kept && ((x - 0x01010101u) & ~x & 0x80808080u) == 0;  // "x has no zero byte"
  }
  return __all_sync(0xffffffffu, kept);
}

// The key padding bits of one stage (stages_padding modes), written by produce_row_terms: bit c % 32 of word c / 32
// says column c is kept (1 past Sk, which the sequence-end test hides), and word kFlag is nonzero when any of them
// hides a key.
template <int BN>
struct PadBits {
  static constexpr int kWords = BN / 32, kFlag = kWords;
  static constexpr int kBytes = (kWords + 1 + 3) / 4 * 16;  // (whole 16-byte units)
};

// What score_terms reads of one stage, each where its mode has it: the staged tile (kTermsRawBias*), the row term
// (stages_row_term) and the key padding bits (stages_padding).
struct StageTerms {
  const unsigned char* tile;
  const float* row;
  const uint32_t* pad;
};

// Stages key block n for (b, h) by one warp, lane l taking keys n * BN + l + 32 e: the row term divided by the scale
// into `term` (BN floats, 0 past Sk; kTerm, where the call has one) and the key padding into `pad` (kPad).
template <int BN, bool kTerm, bool kPad>
__device__ __forceinline__ void stage_row_term(float* term, uint32_t* pad, const KParams& p, int b, int h, int n,
                                               int lane) {
  static_assert(BN % 32 == 0, "whole 32-key words");
  const Operand4d& t = p.bias;
  const int64_t base = t.ptr ? int64_t(b % t.period) * t.sb + int64_t(t.heads > 1 ? h : 0) * t.sh : 0;
  const unsigned char* kp_row = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb;
  const float inv_scale = 1.f / p.scale;
  uint32_t hidden = 0;
#pragma unroll
  for (int e = 0; e < BN / 32; ++e) {
    const int j = n * BN + lane + 32 * e;
    if constexpr (kTerm) {
      float v = 0.f;
      if (j < p.Sk && t.ptr) v = ld_scalar(t.ptr, t.dtype, base + int64_t(j) * t.sk) * inv_scale;
      term[lane + 32 * e] = v;
    }
    if constexpr (kPad) {
      const uint32_t kept = __ballot_sync(0xffffffffu, j >= p.Sk || __ldg(kp_row + int64_t(j) * p.kp_sk) != 0);
      if (lane == 0) pad[e] = kept;
      hidden |= ~kept;
    }
  }
  if (kPad && lane == 0) pad[PadBits<BN>::kFlag] = hidden;
}

// kTermsRawBits: the mask words of key block n for this thread's rows i0 + wr + qr and + 8 (BN / 32 words each, 0
// past Sq: such rows are never written).
template <int BN>
__device__ __forceinline__ void load_mask_bits(uint32_t (&bits)[2][BN / 32], const KParams& p, int b, int h, int i0,
                                               int n, int wr, int lane) {
  const uint32_t* plane = p.mbits + (int64_t(b % p.mb_period) * p.mb_heads + (p.mb_heads > 1 ? h : 0)) *
                                        int64_t(p.mb_rows) * p.mb_words;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = i0 + wr + (lane >> 2) + 8 * hf;
    const uint32_t* src = plane + int64_t(p.mb_rows > 1 ? min(i, p.Sq - 1) : 0) * p.mb_words + n * (BN / 32);
    if constexpr (BN % 128 == 0) {  // (16-byte aligned: mb_words is a multiple of 4)
#pragma unroll
      for (int w = 0; w < BN / 32; w += 4) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(src + w));
        bits[hf][w] = v.x, bits[hf][w + 1] = v.y, bits[hf][w + 2] = v.z, bits[hf][w + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int w = 0; w < BN / 32; ++w) bits[hf][w] = __ldg(src + w);
    }
  }
}

// Returns the factor that turns the block's scores into log2 units in softmax_step (scale_log2 on the raw paths,
// 1 after apply_terms). st: what this key block's stage holds.
template <typename Elem, int kMode, int BM, int BN, int NT, bool kLds = false>
__device__ __forceinline__ float score_terms(float (&acc)[NT][4], const KParams& p, const StageTerms& st,
                                             const uint32_t (&bits)[2][BN / 32], int b, int h, int m_block, int n,
                                             int wr, int lane) {
  const unsigned char* sB = st.tile;
  const float* row = st.row;
  const uint32_t* pad = st.pad;
  const bool need_mask = tile_needs_mask(p, m_block, n, BM, BN);
  const int j0 = n * BN;
  if constexpr (kMode == kTermsGeneral) {
    float (&acc3)[1][NT][4] = reinterpret_cast<float (&)[1][NT][4]>(acc);
    apply_terms<1, NT, true>(acc3, p, nullptr, b, h, m_block * BM, wr, j0, 0, lane, need_mask);
    return 1.f;
  }
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  if constexpr (kMode == kTermsRawBias || kMode == kTermsRawBiasMasked || kMode == kTermsRawBiasPadded) {
    constexpr bool kHides = kMode == kTermsRawBiasMasked;  // (a folded mask: -inf hides whatever the score)
    const float inv_scale = 1.f / p.scale;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float2 bv = bias_pair_smem<Elem, BM, kLds>(sB, wr + qr + hf * 8, nt * 8 + qc);
        acc[nt][2 * hf] = add_term<kHides>(acc[nt][2 * hf], bv.x, inv_scale);
        acc[nt][2 * hf + 1] = add_term<kHides>(acc[nt][2 * hf + 1], bv.y, inv_scale);
      }
  }
  if constexpr (stages_row_term(kMode)) {  // (never a folded mask: those take bits or the general path)
    if (kMode == kTermsRawRow || p.bias.ptr != nullptr) {  // (kTermsRawRowPadded: key padding alone has no term)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {  // columns nt * 8 + qc, + 1: one 8-byte read (a warp reads 32 bytes)
        const float2 v = *reinterpret_cast<const float2*>(row + nt * 8 + qc);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          acc[nt][2 * hf] += v.x;
          acc[nt][2 * hf + 1] += v.y;
        }
      }
    }
  }
  if constexpr (stages_padding(kMode)) {
    if (pad[PadBits<BN>::kFlag] != 0) {  // a padded key in this block: hidden whatever its score
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t w = pad[nt / 4] >> ((nt % 4) * 8 + qc);  // bit e: column nt * 8 + qc + e
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (!(w & 1u)) acc[nt][2 * hf] = -INFINITY;
          if (!(w & 2u)) acc[nt][2 * hf + 1] = -INFINITY;
        }
      }
    }
  }
  if constexpr (kMode == kTermsRawBits) {
    static_assert(BN % 32 == 0, "whole mask words per block");
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t w = bits[hf][nt / 4] >> ((nt % 4) * 8 + qc);  // bit e: column nt * 8 + qc + e
        if (!(w & 1u)) acc[nt][2 * hf] = -INFINITY;
        if (!(w & 2u)) acc[nt][2 * hf + 1] = -INFINITY;
      }
  }
  // key padding that hides nothing in this block costs one warp vote (kp_all_kept), unless staged as bits
  const bool kp = !stages_padding(kMode) && p.kp != nullptr && !(p.kp_vec4 && kp_all_kept<BN>(p, b, j0, lane));
  if (!need_mask && !kp) return p.scale_log2;
  if (!kp && !p.has_band) {  // only the sequence end: one compare per column pair (the general masking below was
    // about 23% of the consumers' stall samples on SDXL's 77 keys in an 80-key block, ncu, RESULTS v4.1)
    const int keys = p.Sk - j0 - qc;  // this thread's columns nt * 8 + e are keys while below this
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (nt * 8 + e >= keys) acc[nt][e] = acc[nt][2 + e] = -INFINITY;
    return p.scale_log2;
  }
  // visible columns of this thread as bits (bit 2 nt + e: column j0 + nt * 8 + qc + e), then the band per row in
  // 32-bit offsets relative to the thread's first element (kept compact: the consumers run at their register cap)
  static_assert(2 * NT <= 64, "one bit per column pair element");
  uint64_t cols = 0;
  const unsigned char* kp_row = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = j0 + nt * 8 + qc + e;
      const bool ok = j < p.Sk && (!kp || __ldg(kp_row + int64_t(j) * p.kp_sk) != 0);
      cols |= uint64_t(ok) << (2 * nt + e);
    }
  int lo = -(1 << 30), hi = 1 << 30;  // d = (nt * 8 + e) - 8 hf must lie in [lo, hi]
  if (p.has_band && need_mask) {
    const int64_t base = int64_t(j0 + qc) - (int64_t(m_block) * BM + wr + qr);  // j - i of the first element
    lo = int(max(min(p.band_lo - base, int64_t(1) << 30), -(int64_t(1) << 30)));
    hi = int(max(min(p.band_hi - base, int64_t(1) << 30), -(int64_t(1) << 30)));
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int d = nt * 8 + e - hf * 8;
        if (!((cols >> (2 * nt + e)) & 1u) || d < lo || d > hi) acc[nt][2 * hf + e] = -INFINITY;
      }
  return p.scale_log2;
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
