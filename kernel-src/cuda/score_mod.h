// Score terms added inside the softmax, applied in the mma accumulator layout (no [B,H,Sq,Sk] tensor is formed):
// the strided/broadcast additive term (user bias, or the host-combined bias + relative-position table term), the
// bool mask, the key-padding mask, the causal / sliding-window band and the sequence-end columns.
//
// The additive term of a (query block, key block) tile is staged in shared memory by load_bias_tile() (cp.async
// in 16- or 4-byte chunks, or strided element copies for arbitrary strides / broadcast columns) and read back in
// fragment order. Scores leave apply_terms() in log2 units (s * scale * log2e + term * log2e), -inf = hidden key.
#pragma once
#include <type_traits>

#include "kernel_params.h"
#include "utils.h"

namespace winattn {
namespace cuda {

__device__ __forceinline__ float ld_scalar(const void* base, int dtype, int64_t off) {
  if (dtype == 2) return __ldg(static_cast<const float*>(base) + off);
  if (dtype == 1) return __bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(base) + off));
  return __half2float(__ldg(static_cast<const __half*>(base) + off));
}
__device__ __forceinline__ float2 ld_pair(const void* base, int dtype, int64_t off) {  // off even, aligned
  if (dtype == 2) return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + off));
  if (dtype == 1)
    return __bfloat1622float2(
        __ldg(reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(base) + off)));
  return __half22float2(__ldg(reinterpret_cast<const __half2*>(static_cast<const __half*>(base) + off)));
}

// score + term * k, where a term folded from a bool mask (kHides: p.term_hides) hides its key when it is -inf
// whatever the score (masked_fill's semantics: the plain sum would let a NaN score of a hidden key reach its row).
// A template flag: the kernels take a folded mask in instances of their own, so the paths without one compile to the
// plain FMA they had (a runtime branch around the term cost the unmasked BEiT / Swin W12 forwards 2%, RESULTS v3.8).
template <bool kHides>
__device__ __forceinline__ float add_term(float s, float term, float k) {
  const float x = fmaf(term, k, s);
  return kHides && term == -INFINITY ? -INFINITY : x;
}

// Global-memory fallback: bias values at columns (j, j + 1) of the row at element offset row_off (0 past Sk).
__device__ __forceinline__ float2 bias_pair(const Operand4d& op, int64_t row_off, int j, int Sk) {
  if (op.cols == 1) {
    const float x = ld_scalar(op.ptr, op.dtype, row_off);
    return make_float2(x, x);
  }
  if (op.vec2 && j + 1 < Sk) return ld_pair(op.ptr, op.dtype, row_off + j);
  float2 r;
  r.x = j < Sk ? ld_scalar(op.ptr, op.dtype, row_off + j * op.sk) : 0.f;
  r.y = j + 1 < Sk ? ld_scalar(op.ptr, op.dtype, row_off + (j + 1) * op.sk) : 0.f;
  return r;
}

// Bool mask at (j, j + 1): true = attend (false past Sk).
__device__ __forceinline__ void mask_pair(const Operand4d& op, int64_t row_off, int j, int Sk, bool& m0, bool& m1) {
  const unsigned char* base = static_cast<const unsigned char*>(op.ptr);
  if (op.cols == 1) {
    m0 = m1 = __ldg(base + row_off) != 0;
    return;
  }
  if (op.vec2 && j + 1 < Sk) {
    const unsigned short x = __ldg(reinterpret_cast<const unsigned short*>(base + row_off + j));
    m0 = (x & 0xff) != 0;
    m1 = (x >> 8) != 0;
    return;
  }
  m0 = j < Sk ? __ldg(base + row_off + j * op.sk) != 0 : false;
  m1 = j + 1 < Sk ? __ldg(base + row_off + (j + 1) * op.sk) != 0 : false;
}

// Key padding that hides nothing in a key block: BN mask bytes (bytes: the block's first, 4-byte aligned, in shared
// or global memory; 0 = padded) all nonzero, by a warp vote over one 4-byte word per lane. The whole warp must call
// it. Tiles where it holds take the plain scaling path, so a key-padding mask costs one load per tile where it
// pads nothing (it made the masked forward 1.18x the unmasked one when every tile went through apply_terms).
template <int BN>
__device__ __forceinline__ bool kp_block_all_kept(const unsigned char* bytes, int lane) {
  static_assert(BN % 4 == 0 && BN <= 128, "one 4-byte word of the mask per lane");
  const uint32_t w = lane * 4 < BN ? *reinterpret_cast<const uint32_t*>(bytes + lane * 4) : 0x01010101u;
  return __all_sync(0xffffffffu, ((w - 0x01010101u) & ~w & 0x80808080u) == 0);  // "w has no zero byte"
}

// The same for key block j0 of item b read from the mask in global memory (needs p.kp_vec4): false when the block
// runs past Sk.
template <int BN>
__device__ __forceinline__ bool kp_block_all_kept(const KParams& p, int b, int j0, int lane) {
  if (j0 + BN > p.Sk) return false;
  return kp_block_all_kept<BN>(reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb + j0, lane);
}

__device__ __forceinline__ void cp_async_bytes(void* smem, const void* gmem, int bytes, int cp_size) {
  if (cp_size == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes));
}

// Stage the additive term of tile rows [i0, i0 + ROWS) x cols [j0, j0 + BN) for (b, h) into shared memory
// (raw dtype, row pitch p.bias_pitch bytes, zero past Sq / Sk). Modes 1/2 are asynchronous (commit with the
// caller's group); mode 3 copies synchronously.
template <int ROWS, int BN, int NTH>
__device__ __forceinline__ void load_bias_tile(unsigned char* s, const KParams& p, int b, int h, int i0, int j0,
                                               int tid) {
  const Operand4d& op = p.bias;
  const int es = op.dtype == 2 ? 4 : 2;
  const int pitch = p.bias_pitch;
  const unsigned char* g = static_cast<const unsigned char*>(op.ptr);
  const int64_t base = int64_t(b % op.period) * op.sb + int64_t(h) * op.sh + int64_t(j0) * op.sk;  // elements
  const int rows = min(ROWS, p.Sq - i0), cols = min(BN, p.Sk - j0);
  if (p.bias_mode == 1 || p.bias_mode == 2) {
    const int cs = p.bias_mode == 1 ? 16 : 4;  // chunk bytes
    const int cpr = BN * es / cs;
    for (int idx = tid; idx < ROWS * cpr; idx += NTH) {
      const int r = idx / cpr, c = idx % cpr;
      int bytes = r < rows ? cols * es - c * cs : 0;
      bytes = bytes < 0 ? 0 : bytes > cs ? cs : bytes;
      const unsigned char* src = bytes > 0 ? g + (base + int64_t(i0 + r) * op.sq) * es + c * cs : g;
      cp_async_bytes(s + r * pitch + c * cs, src, bytes, cs);
    }
  } else {
    for (int idx = tid; idx < ROWS * BN; idx += NTH) {
      const int r = idx / BN, c = idx % BN;
      const bool ok = r < rows && c < cols;
      const int64_t off = base + int64_t(i0 + r) * op.sq + int64_t(c) * op.sk;
      if (es == 4) {
        *reinterpret_cast<float*>(s + r * pitch + c * 4) = ok ? __ldg(static_cast<const float*>(op.ptr) + off) : 0.f;
      } else {
        *reinterpret_cast<unsigned short*>(s + r * pitch + c * 2) =
            ok ? __ldg(static_cast<const unsigned short*>(op.ptr) + off) : (unsigned short)0;
      }
    }
  }
}

template <typename BT>
__device__ __forceinline__ float2 smem_pair_t(const unsigned char* s, int pitch, int r, int c);
template <>
__device__ __forceinline__ float2 smem_pair_t<float>(const unsigned char* s, int pitch, int r, int c) {
  return *reinterpret_cast<const float2*>(s + r * pitch + c * 4);
}
template <>
__device__ __forceinline__ float2 smem_pair_t<__nv_bfloat16>(const unsigned char* s, int pitch, int r, int c) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(s + r * pitch + c * 2));
}
template <>
__device__ __forceinline__ float2 smem_pair_t<__half>(const unsigned char* s, int pitch, int r, int c) {
  return __half22float2(*reinterpret_cast<const __half2*>(s + r * pitch + c * 2));
}

// BT: the staged tile's element type (void: no staged tile; the term, if any, is read from global memory).
template <int MT, int NT, typename BT, bool kHides>
__device__ __forceinline__ void apply_terms_t(float (&acc)[MT][NT][4], const KParams& p, const unsigned char* sB,
                                              int b, int h, int i0, int rw, int j0, int cw, int lane,
                                              bool need_mask) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  constexpr bool kStaged = !std::is_same<BT, void>::value;
  const bool glob_bias = !kStaged && p.bias.ptr != nullptr;
  const bool has_mask = p.mask.ptr != nullptr, has_kp = p.kp != nullptr;
  const bool any_vis = need_mask || has_mask || has_kp;
  bool kp[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int j = j0 + cw + nt * 8 + qc;
    kp[nt][0] = j < p.Sk;
    kp[nt][1] = j + 1 < p.Sk;
    if (has_kp) {
      const unsigned char* row = reinterpret_cast<const unsigned char*>(p.kp + int64_t(b) * p.kp_sb);
      kp[nt][0] = kp[nt][0] && __ldg(row + int64_t(j) * p.kp_sk) != 0;
      kp[nt][1] = kp[nt][1] && __ldg(row + int64_t(j + 1) * p.kp_sk) != 0;
    }
  }
  const int64_t bias_bh = glob_bias ? int64_t(b % p.bias.period) * p.bias.sb + int64_t(h) * p.bias.sh : 0;
  const int64_t mask_bh = has_mask ? int64_t(b % p.mask.period) * p.mask.sb + int64_t(h) * p.mask.sh : 0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = rw + mt * 16 + qr + hf * 8;
      const int i = i0 + r;
      const bool row_ok = i < p.Sq;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int c = cw + nt * 8 + qc;
        const int j = j0 + c;
        float x0 = acc[mt][nt][2 * hf] * p.scale_log2, x1 = acc[mt][nt][2 * hf + 1] * p.scale_log2;
        if constexpr (kStaged) {
          const float2 bv = smem_pair_t<BT>(sB, p.bias_pitch, r, c);
          x0 = add_term<kHides>(x0, bv.x, kLog2e);
          x1 = add_term<kHides>(x1, bv.y, kLog2e);
        } else if (glob_bias) {
          const float2 bv =
              row_ok ? bias_pair(p.bias, bias_bh + int64_t(i) * p.bias.sq, j, p.Sk) : make_float2(0.f, 0.f);
          x0 = add_term<kHides>(x0, bv.x, kLog2e);
          x1 = add_term<kHides>(x1, bv.y, kLog2e);
        }
        if (any_vis) {
          bool v0 = kp[nt][0], v1 = kp[nt][1];
          if (p.has_band) {
            const int64_t d = int64_t(j) - i;
            v0 = v0 && d >= p.band_lo && d <= p.band_hi;
            v1 = v1 && d + 1 >= p.band_lo && d + 1 <= p.band_hi;
          }
          if (has_mask && row_ok) {
            bool m0, m1;
            mask_pair(p.mask, mask_bh + int64_t(i) * p.mask.sq, j, p.Sk, m0, m1);
            v0 = v0 && m0;
            v1 = v1 && m1;
          }
          x0 = v0 ? x0 : -INFINITY;
          x1 = v1 ? x1 : -INFINITY;
        }
        acc[mt][nt][2 * hf] = x0;
        acc[mt][nt][2 * hf + 1] = x1;
      }
    }
}

// acc (raw Q K^T of the warp tile at tile row rw, tile col cw) -> scores in log2 units with every term applied.
// sB: the staged additive tile (tile coordinates), or nullptr to read the term from global memory.
// need_mask: the tile crosses the band edge or the sequence end. The staged tile's dtype is dispatched once here,
// so the unrolled element loop is branch-free. kMayHide: the caller can get a term with a folded mask
// (p.term_hides: v3's general path, the window forward); the other callers (v1, the 64-token window backward) never
// do, and compile only the plain sums.
template <int MT, int NT, bool kMayHide = false>
__device__ __forceinline__ void apply_terms(float (&acc)[MT][NT][4], const KParams& p, const unsigned char* sB, int b,
                                            int h, int i0, int rw, int j0, int cw, int lane, bool need_mask) {
  auto run = [&](auto hides) {
    constexpr bool kH = decltype(hides)::value;
    if (sB == nullptr || p.bias.ptr == nullptr)
      apply_terms_t<MT, NT, void, kH>(acc, p, sB, b, h, i0, rw, j0, cw, lane, need_mask);
    else if (p.bias.dtype == 2)
      apply_terms_t<MT, NT, float, kH>(acc, p, sB, b, h, i0, rw, j0, cw, lane, need_mask);
    else if (p.bias.dtype == 1)
      apply_terms_t<MT, NT, __nv_bfloat16, kH>(acc, p, sB, b, h, i0, rw, j0, cw, lane, need_mask);
    else
      apply_terms_t<MT, NT, __half, kH>(acc, p, sB, b, h, i0, rw, j0, cw, lane, need_mask);
  };
  if constexpr (kMayHide)
    if (p.term_hides) return run(std::true_type{});  // (the general paths: a branch per tile is noise there)
  run(std::false_type{});
}

}  // namespace cuda
}  // namespace winattn
