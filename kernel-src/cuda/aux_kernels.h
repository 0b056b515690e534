// Small kernels around the attention kernels: table-term expansion, the backward preprocess (delta = rowsum(dO*O)),
// dQ accumulator conversion, and the fixed-order reductions that turn per-CTA partials / expanded intermediates
// into dbias and dtable. All are deterministic (fixed summation order) except scatter_dtable_atomic.
#pragma once
#include "kernel_params.h"
#include "utils.h"

namespace winattn {
namespace cuda {

// The prepared additive term (kernel_choice.h CombPlan): comb[p, h, i, j] = table[index[i, j], h] (+ bias[p, h, i, j])
// (-inf where a folded bool mask hides) as Out (fp16 or bf16) [P, H, Sq, Skp] (Sq = 1: a term broadcast over the
// queries, the mask's row 0), rows padded to Skp (a multiple of 8) so the kernels stage it with 16-byte copies or TMA.
// P is the bias period (1 without a bias); H the term's heads (the table's H, or 1 for a bias broadcast over heads: a
// recast term keeps its broadcast). Without a table it is the bias alone, recast: fp16 for the wide window kernels'
// fp16 term tables, the input dtype for v3's staged tile. Finite magnitudes past Out's range saturate to its largest
// finite value (still exp() == 0), while an infinite term stays infinite: a row hidden by -inf terms must stay fully
// hidden (output 0, lse -inf), which a clamped value would turn into a uniform average. A NaN term stays NaN (the row
// policy, softmax.h: its rows give NaN out and lse); the clamp alone would make it -max (fmaxf drops NaN), a key hidden
// without a trace. fp16 keeps 11 bits of the term (|error| <= 2^-11 |term|), bf16 8 (the same rounding as the PyTorch
// same-dtype computation, score + bias.to(dtype)).
// Grid: x over (h, i, 8-column group) of one period, y over chunks of kCombinePeriods periods. A thread gathers the
// table term once and adds it to the bias of each period of its chunk (the gather's dependent loads and the index arithmetic
// were most of the time when every (p, h, i, j) did both: 178 us for the Swin W16 bench's 64 periods, now one
// streaming pass). Index arithmetic in Idx: 32-bit whenever the sizes allow it.
constexpr int kCombinePeriods = 8;
template <typename Out>
__device__ __forceinline__ Out saturate_term(float x);
template <>
__device__ __forceinline__ __half saturate_term<__half>(float x) {
  return __float2half_rn(isinf(x) || isnan(x) ? x : fminf(fmaxf(x, -65504.f), 65504.f));
}
template <>
__device__ __forceinline__ __nv_bfloat16 saturate_term<__nv_bfloat16>(float x) {
  constexpr float kMax = 3.38953139e38f;  // bf16's largest finite value (fp32's maximum rounds up to inf)
  return __float2bfloat16_rn(isinf(x) || isnan(x) ? x : fminf(fmaxf(x, -kMax), kMax));
}
template <typename Idx, typename Out>
__global__ void combine_terms_kernel(Out* comb, int P, int H, int Sq, int Sk, int Skp, const float* table,
                                     int64_t t_sr, int64_t t_sh, const int64_t* index, int64_t i_sq, int64_t i_sk,
                                     Operand4d bias, Operand4d mask) {
  constexpr int V = 8;  // columns per thread: one 16-byte store, the index arithmetic once per 8 elements
  const int groups = Skp / V;
  const Idx n = Idx(H) * Sq * groups;  // column groups of one period
  // An fp32 term alone with 16-byte aligned rows (T5's position bias under autocast: [1, H, S, S]) is read with two
  // 16-byte loads per thread instead of eight 4-byte ones; the recast is a pure stream, and eight dependent-free scalar
  // loads per thread left it at ~1.4 TB/s (T5-base, 12.6 MB in + 6.3 MB out in 0.014 ms of a 0.137 ms forward).
  const bool vec_f32 = table == nullptr && mask.ptr == nullptr && bias.ptr != nullptr && bias.dtype == 2 &&
                       bias.sk == 1 && reinterpret_cast<uintptr_t>(bias.ptr) % 16 == 0 && bias.sq % 4 == 0 &&
                       bias.sh % 4 == 0 && bias.sb % 4 == 0;
  for (Idx e = blockIdx.x * Idx(blockDim.x) + threadIdx.x; e < n; e += Idx(gridDim.x) * blockDim.x) {
    const Idx row = e / groups;  // (h, i)
    const int j0 = int(e - row * groups) * V, i = int(row % Sq), h = int(row / Sq);
    float term[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int j = j0 + v;
      term[v] = j < Sk && table != nullptr ? table[index[i * i_sq + j * i_sk] * t_sr + h * t_sh] : 0.f;
    }
    const int64_t boff = int64_t(h) * bias.sh + int64_t(i) * bias.sq + int64_t(j0) * bias.sk;
    const int64_t moff = int64_t(h) * mask.sh + int64_t(i) * mask.sq + int64_t(j0) * mask.sk;
    for (int p0 = blockIdx.y * kCombinePeriods; p0 < P; p0 += gridDim.y * kCombinePeriods) {
      const int p1 = min(P, p0 + kCombinePeriods);
#pragma unroll 2
      for (int pp = p0; pp < p1; ++pp) {
        const int64_t bo = int64_t(pp % bias.period) * bias.sb + boff;
        const int64_t mo = int64_t(pp % mask.period) * mask.sb + moff;
        alignas(16) Out out[V];
        if (vec_f32 && j0 + V <= Sk) {
          const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(bias.ptr) + bo);
          const float4 lo = __ldg(src), hi = __ldg(src + 1);
          const float x[V] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int v = 0; v < V; ++v) out[v] = saturate_term<Out>(x[v]);
          *reinterpret_cast<uint4*>(comb + (int64_t(pp) * n + e) * V) = *reinterpret_cast<const uint4*>(out);
          continue;
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float x = term[v];
          if (j0 + v < Sk && bias.ptr != nullptr) {
            const int64_t off = bo + int64_t(v) * bias.sk;
            x += bias.dtype == 2   ? static_cast<const float*>(bias.ptr)[off]
                 : bias.dtype == 1 ? __bfloat162float(static_cast<const __nv_bfloat16*>(bias.ptr)[off])
                                   : __half2float(static_cast<const __half*>(bias.ptr)[off]);
          }
          if (j0 + v < Sk && mask.ptr != nullptr &&
              static_cast<const unsigned char*>(mask.ptr)[mo + int64_t(v) * mask.sk] == 0)
            x = -INFINITY;
          out[v] = saturate_term<Out>(x);
        }
        *reinterpret_cast<uint4*>(comb + (int64_t(pp) * n + e) * V) = *reinterpret_cast<const uint4*>(out);
      }
    }
  }
}

// dbias reduced by v3 into rows padded to `pitch` fp32 elements (kernel_choice.h BwdV3Buffers::dbias_padded), copied
// into the contiguous [rows, cols] the caller allocated.
__global__ void unpad_rows_kernel(float* out, const float* in, int64_t rows, int cols, int pitch) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols;
    out[e] = in[r * pitch + (e - r * cols)];
  }
}

// A bool mask [period, heads, Sq, Sk] (any strides, broadcast dims stride 0) as bits for the wide window kernels:
// out[((pp * heads + h) * rows + r) * words + w], bit j = mask[pp, h, r, 32 w + j] (kTransposed: mask[pp, h, 32 w + j,
// r], rows = keys), 1 past the mask's columns (the kernels' term tables hide those keys / queries). The kernels then
// read an eighth of the bytes, in the order their fragments need (a bool mask per window otherwise sent such calls
// to v3: W12, H200, 23.6 ms forward against 0.86 without it, RESULTS v3.4).
// A thread per word. Forward order (w fastest): a warp reads adjacent 32-byte runs, 4 bytes per load where the rows
// allow it. Transposed (r fastest): a warp's loads of one j are 32 adjacent bytes. 32-bit index arithmetic within a
// plane: with 64-bit divisions per word and a byte load per bit, this pass took 0.20 / 0.30 ms at W12 (8192
// windows; issue-bound, DRAM 14-20% busy: RESULTS v3.5).
template <bool kTransposed>
__global__ void mask_bits_kernel(uint32_t* out, Operand4d mask, int rows, int cols, int words) {
  const int per_plane = rows * words;
  const int64_t n = int64_t(mask.period) * mask.heads * per_plane;
  const unsigned char* m = static_cast<const unsigned char*>(mask.ptr);
  const int64_t step = kTransposed ? mask.sq : mask.sk;  // from bit j to bit j + 1
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int plane = n <= INT32_MAX ? int(uint32_t(e) / uint32_t(per_plane)) : int(e / per_plane);  // pp * heads + h
    const int in_plane = int(e - int64_t(plane) * per_plane);
    const int r = kTransposed ? in_plane % rows : in_plane / words;
    const int w = kTransposed ? in_plane / rows : in_plane % words;
    const int h = plane % mask.heads, pp = plane / mask.heads;
    const int valid = min(32, cols - 32 * w);  // bits of this word inside the mask (<= 0: none)
    uint32_t bits = valid >= 32 ? 0u : ~0u << max(valid, 0);
    const unsigned char* at = m + int64_t(pp) * mask.sb + int64_t(h) * mask.sh +
                              (kTransposed ? int64_t(r) * mask.sk : int64_t(r) * mask.sq) + int64_t(32 * w) * step;
    int j = 0;
    if (!kTransposed && step == 1 && (reinterpret_cast<uintptr_t>(at) & 3) == 0) {
      for (; j + 4 <= valid; j += 4) {  // 4 bytes -> 4 bits: 0xff per nonzero byte, then bits 0 / 8 / 16 / 24
        const uint32_t y = __vcmpne4(__ldg(reinterpret_cast<const uint32_t*>(at + j)), 0u) & 0x01010101u;
        bits |= ((y | y >> 7 | y >> 14 | y >> 21) & 0xfu) << j;
      }
    }
    at += int64_t(j) * step;
    for (; j < valid; ++j, at += step) bits |= uint32_t(*at != 0) << j;
    out[(int64_t(plane) * rows + r) * words + w] = bits;
  }
}

// mask_bits_kernel<true> for four keys per thread, where each mask row is contiguous along the keys and every row
// starts 4-byte aligned (rows = Sk a multiple of 4; launch_mask_bits checks): a warp's load of one query j is then
// 128 adjacent bytes, and a thread issues a quarter of the loads. H200, a T5-shaped [32, 12, 512, 512] mask:
// 0.067 ms, against 0.117 (0.86 TB/s of mask) in mask_bits_kernel<true>.
__global__ void mask_bits_transposed4_kernel(uint32_t* out, Operand4d mask, int rows, int cols, int words) {
  const int quads = rows / 4;
  const int per_plane = quads * words;
  const int64_t n = int64_t(mask.period) * mask.heads * per_plane;
  const unsigned char* m = static_cast<const unsigned char*>(mask.ptr);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int plane = n <= INT32_MAX ? int(uint32_t(e) / uint32_t(per_plane)) : int(e / per_plane);  // pp * heads + h
    const int in_plane = int(e - int64_t(plane) * per_plane);
    const int r4 = in_plane % quads, w = in_plane / quads;
    const int h = plane % mask.heads, pp = plane / mask.heads;
    const int valid = min(32, cols - 32 * w);  // query bits of this word inside the mask (<= 0: none)
    const uint32_t pad = valid >= 32 ? 0u : ~0u << max(valid, 0);
    uint32_t bits[4] = {pad, pad, pad, pad};
    const unsigned char* at = m + int64_t(pp) * mask.sb + int64_t(h) * mask.sh + 4 * r4 + int64_t(32 * w) * mask.sq;
#pragma unroll 8
    for (int j = 0; j < valid; ++j) {
      const uint32_t v = __vcmpne4(__ldg(reinterpret_cast<const uint32_t*>(at + int64_t(j) * mask.sq)), 0u);
#pragma unroll
      for (int k = 0; k < 4; ++k) bits[k] |= ((v >> (8 * k)) & 1u) << j;  // (0xff per nonzero byte)
    }
    uint32_t* o = out + (int64_t(plane) * rows + 4 * r4) * words + w;
#pragma unroll
    for (int k = 0; k < 4; ++k) o[int64_t(k) * words] = bits[k];
  }
}

// sum_d a[d] * c[d] of one row over its 4 lanes (sub = lane & 3 reads columns 8 sub + 32 k, 16-byte loads), summed
// across the quad with two xor-shuffles: all 4 lanes call it; a lane with valid = false adds 0 and reads nothing.
template <typename Elem>
__device__ __forceinline__ float quad_row_dot(const Elem* a, const Elem* c, int D, int sub, bool valid) {
  float acc = 0.f;
  for (int d = sub * 8; valid && d < D; d += 32) {
    const uint4 x = *reinterpret_cast<const uint4*>(a + d);
    const uint4 y = *reinterpret_cast<const uint4*>(c + d);
    const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float2 fx = ElemTraits<Elem>::unpack(xs[u]), fy = ElemTraits<Elem>::unpack(ys[u]);
      acc = fmaf(fx.x, fy.x, acc);
      acc = fmaf(fx.y, fy.y, acc);
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  return acc;
}

// delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d] - dlse[b, h, i]; 4 lanes per row, 16-byte loads.
// (d lse_i / d s_ij = P_ij, so a gradient flowing into lse enters dS = P * (dP - delta) through delta.)
template <typename Elem>
__global__ void bwd_delta_kernel(float* delta, const Elem* dout, int64_t do_sb, int64_t do_ss, int64_t do_sh,
                                 const Elem* out, int64_t o_sb, int64_t o_ss, int64_t o_sh, const float* dlse, int B,
                                 int Sq, int H, int D) {
  const int64_t rows = int64_t(B) * Sq * H;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 4;
  const int sub = threadIdx.x & 3;
  const int64_t r = row < rows ? row : 0;  // (past the end: row 0's address, not read)
  const int h = int(r % H), i = int((r / H) % Sq), b = int(r / (int64_t(H) * Sq));
  const float acc = quad_row_dot(dout + b * do_sb + i * do_ss + h * do_sh, out + b * o_sb + i * o_ss + h * o_sh, D,
                                 sub, row < rows);
  if (row < rows && sub == 0) {
    const int64_t idx = (int64_t(b) * H + h) * Sq + i;
    delta[idx] = dlse != nullptr ? acc - dlse[idx] : acc;
  }
}

// dq (Elem, contiguous [B, Sq, H, D]) <- dq_accum (fp32, same layout, already scaled)
template <typename Elem>
__global__ void dq_convert_kernel(Elem* dq, const float* acc, int64_t n2) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n2; e += int64_t(gridDim.x) * blockDim.x) {
    const float2 x = reinterpret_cast<const float2*>(acc)[e];
    reinterpret_cast<uint32_t*>(dq)[e] = ElemTraits<Elem>::pack(x.x, x.y);
  }
}

// The first head-dim column of the n-tile that float4 q of a 64-row dQ accumulator tile belongs to, in the
// consumers' fragment order (below, dq_frag_convert_kernel): n-tile (q / 32) % (DK / 16) of head-dim half
// q / (8 DK). Its lane's two columns are 2 (lane % 4) and 2 (lane % 4) + 1 past it.
template <int DK>
__host__ __device__ constexpr int dq_frag_ntile_col(int q) {
  return (q / (8 * DK)) * (DK / 2) + ((q / 32) % (DK / 16)) * 8;
}

// Backward v3 preprocess (sm90/bwd_pipelined_sm90.h): per (b, h) row padded to sq_pad (whole 64-row query blocks)
//   delta2[b, h, i] = rowsum(dO * O) - dlse, lse2[b, h, i] = lse * log2(e) (0 where lse = -inf: that row saw no key,
//   so its P is 0 through the masks anyway), and past Sq delta 0, lse2 +inf (P = 0 for padding rows).
// 4 lanes per row, 16-byte loads; rows in (b, h, i) order so the writes are contiguous.
// With dq_acc (dQ accumulated, BwdDq kBwdDqAccumulate) it also zeroes the accumulator, as FA3's preprocess does: row
// i's share of its 64-row tile (DK floats of the tile's 64 DK, in the fragment order dq_frag_convert_kernel reads),
// but not the n-tiles past D, an instance's head-dim padding (a quarter of the 96 instance at D = 72): the conversion
// never reads them, so the backward's adds there may land on whatever the workspace held (the 96 and 256 instances
// leave those adds out, sm90/bwd_v3_common_sm90.h add_dq_ntiles; in the others a test per n-tile cost the step loop,
// RESULTS v5.9). A separate memset wrote all of it in a pass of its own.
template <typename Elem, int DK>
__global__ void bwd_prep_v3_kernel(float* lse2, float* delta2, float* dq_acc, int sq_pad, const Elem* dout,
                                   int64_t do_sb, int64_t do_ss, int64_t do_sh, const Elem* out, int64_t o_sb,
                                   int64_t o_ss, int64_t o_sh, const float* lse, const float* dlse, int B, int Sq,
                                   int H, int D) {
  const int64_t rows = int64_t(B) * H * sq_pad;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 4;
  const int sub = threadIdx.x & 3;
  const int i = int(row % sq_pad);
  const int64_t bh = row / sq_pad;
  const int h = int(bh % H), b = int(bh / H);
  const bool valid = row < rows && i < Sq;
  const int ic = valid ? i : 0, bc = valid ? b : 0, hc = valid ? h : 0;  // (invalid: row 0's address, not read)
  const float acc = quad_row_dot(dout + bc * do_sb + ic * do_ss + hc * do_sh,
                                 out + bc * o_sb + ic * o_ss + hc * o_sh, D, sub, valid);
  if (dq_acc != nullptr && row < rows) {
    // row i's share of its tile: float4s (i % 64) DK / 4 .. + DK / 4, lane sub every fourth one, so four lanes
    // store 64 contiguous bytes and a warp's eight rows 8 DK contiguous floats
    float4* tile = reinterpret_cast<float4*>(dq_acc) + (bh * (sq_pad / 64) + i / 64) * (16 * DK);
#pragma unroll
    for (int j = 0; j < DK / 16; ++j) {
      const int q = (i % 64) * (DK / 4) + 4 * j + sub;
      if (dq_frag_ntile_col<DK>(q) < D) tile[q] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  if (row < rows && sub == 0) {
    if (i < Sq) {
      const int64_t idx = bh * Sq + i;
      const float l = lse[idx];
      delta2[row] = dlse != nullptr ? acc - dlse[idx] : acc;
      lse2[row] = l == -INFINITY ? 0.f : l * kLog2e;
    } else {
      delta2[row] = 0.f;
      lse2[row] = INFINITY;
    }
  }
}

// lse2 of the v3 preprocess alone (the wide-window backward computes delta itself): lse2[b, h, i] = lse * log2(e),
// 0 where lse = -inf, +inf for the padding rows Sq <= i < sq_pad. One thread per element, contiguous writes.
__global__ void lse2_rows_kernel(float* lse2, int sq_pad, const float* lse, int64_t rows, int Sq) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= rows * sq_pad) return;
  const int i = int(e % sq_pad);
  const float l = i < Sq ? lse[(e / sq_pad) * Sq + i] : INFINITY;
  lse2[e] = l == -INFINITY ? 0.f : i < Sq ? l * kLog2e : INFINITY;
}

// dq (Elem, contiguous [B, Sq, H, D]) <- scale * the v3 accumulator [B, H, m-blocks, 64 * DK] in the consumers'
// fragment order: within a 64-row tile, float4 number ((w * 4 + wi) * DK / 16 + nt) * 32 + lane holds rows
// 16 wi + lane / 4 (+ 8 for elements 2, 3) and columns w * DK / 2 + 8 nt + 2 (lane % 4) (+ 1) (bwd_pipelined_sm90.h).
// One CTA per 64-row tile: the fragments land in shared memory as rows, which then leave as whole 16-byte units
// (a fragment's own stores would be 4 bytes at 16 rows per warp). The tile's coordinates come from blockIdx, not
// from 64-bit divisions per element, and rows past Sq are not read. H200, ViT-B/16 backward (B 128, H 12, S 197,
// D 64): 0.031 ms, against 0.072 as one thread per fragment with 64-bit index math (1.9 TB/s).
template <typename Elem, int DK>
__global__ void __launch_bounds__(256) dq_frag_convert_kernel(Elem* dq, const float* acc, int Sq, int H, int D,
                                                              int mblocks, float scale) {
  constexpr int kPitch = DK + 8;  // (a row's 16-byte pad: the 8 rows one warp writes fall on distinct banks)
  constexpr int kDtq = DK / 16;
  __shared__ alignas(16) Elem rows_s[64 * kPitch];
  const int m = int(blockIdx.x % unsigned(mblocks)), bh = int(blockIdx.x / unsigned(mblocks));
  const int h = bh % H, b = bh / H;
  const int rows = min(64, Sq - 64 * m);
  const float4* src = reinterpret_cast<const float4*>(acc) + int64_t(blockIdx.x) * (16 * DK);
#pragma unroll 4
  for (int q = threadIdx.x; q < 16 * DK; q += 256) {
    const int lane = q % 32, wi = (q / (32 * kDtq)) % 4;
    const int col = dq_frag_ntile_col<DK>(q) + (lane & 3) * 2, r = wi * 16 + (lane >> 2);
    // (rows r + 8 too; the columns past D, an instance's padding, are never zeroed: 72 on the 96 instance reads a
    // quarter less)
    if (r >= rows || col >= D) continue;
    const float4 x = src[q];
    *reinterpret_cast<uint32_t*>(&rows_s[r * kPitch + col]) = ElemTraits<Elem>::pack(x.x * scale, x.y * scale);
    *reinterpret_cast<uint32_t*>(&rows_s[(r + 8) * kPitch + col]) = ElemTraits<Elem>::pack(x.z * scale, x.w * scale);
  }
  __syncthreads();
  const int chunks = D / 8;  // 16-byte units per row (head dims are multiples of 8)
  Elem* out = dq + ((int64_t(b) * Sq + 64 * m) * H + h) * D;
  for (int c = threadIdx.x; c < rows * chunks; c += 256) {
    const int r = c / chunks, k = c - r * chunks;
    *reinterpret_cast<uint4*>(out + int64_t(r) * H * D + 8 * k) =
        *reinterpret_cast<const uint4*>(&rows_s[r * kPitch + 8 * k]);
  }
}

// Window mode: out[pp, hb, ii, jj] (fp32 [P_T, H_T, R_T, C_T], R_T in {1, Sq}, C_T in {1, Sk}) = sum of the
// per-CTA partial dS tiles of every CTA and element that maps to it. CTA id = ((n * Hx + h) * NR + c * Pg + r);
// partial tile [Sq][BN]. 32 outputs per block (one per lane), 8 warps split the contributor list in a
// fixed interleave and combine in warp order: deterministic.
struct ReduceParams {
  const float* partials;
  float* out;
  int P_T, H_T, R_T, C_T;
  int Sq, Sk, BN, nblocks, Hx, NR, Pg, NC;
};
__global__ void __launch_bounds__(256) reduce_partials_kernel(const ReduceParams rp) {
  __shared__ float red[8][33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nout = int64_t(rp.P_T) * rp.H_T * rp.R_T * rp.C_T;
  const int64_t e = int64_t(blockIdx.x) * 32 + lane;
  float sum = 0.f;
  if (e < nout) {
    const int jj = int(e % rp.C_T);
    const int ii = int((e / rp.C_T) % rp.R_T);
    const int hb = int((e / (int64_t(rp.C_T) * rp.R_T)) % rp.H_T);
    const int pp = int(e / (int64_t(rp.C_T) * rp.R_T * rp.H_T));
    const bool cols_full = rp.C_T == rp.Sk, rows_full = rp.R_T == rp.Sq, heads_full = rp.H_T == rp.Hx;
    const int n_lo = cols_full ? jj / rp.BN : 0, n_hi = cols_full ? n_lo + 1 : rp.nblocks;
    const int h_lo = heads_full ? hb : 0, h_hi = heads_full ? hb + 1 : rp.Hx;
    const int i_lo = rows_full ? ii : 0, i_hi = rows_full ? ii + 1 : rp.Sq;
    const int nR = rp.Pg / rp.P_T;
    const int64_t per_cta = int64_t(rp.Sq) * rp.BN;
    // contributors (rr, c) in a fixed order, flattened so the 8 warps share them evenly: warp w takes every 8th;
    // unrolled so a lane has several independent loads in flight (the reduction is latency-bound)
    const int ncontrib = nR * rp.NC;
    for (int n = n_lo; n < n_hi; ++n)
      for (int h = h_lo; h < h_hi; ++h) {
        const float* nh = rp.partials + (int64_t(n) * rp.Hx + h) * rp.NR * per_cta;
        if (rows_full && cols_full) {
          const float* at = nh + int64_t(ii) * rp.BN + jj % rp.BN;
#pragma unroll 8
          for (int x = warp; x < ncontrib; x += 8) {
            const int r = pp + (x / rp.NC) * rp.P_T, c = x % rp.NC;
            sum += at[(int64_t(c) * rp.Pg + r) * per_cta];
          }
        } else {
          for (int x = warp; x < ncontrib; x += 8) {
            const int r = pp + (x / rp.NC) * rp.P_T, c = x % rp.NC;
            const float* part = nh + (int64_t(c) * rp.Pg + r) * per_cta;
            for (int i = i_lo; i < i_hi; ++i) {
              const float* row = part + int64_t(i) * rp.BN;
              if (cols_full) {
                sum += row[jj % rp.BN];
              } else {
                for (int j = 0; j < rp.BN; ++j) sum += row[j];
              }
            }
          }
        }
      }
  }
  red[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && e < nout) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) s += red[w][lane];
    rp.out[e] = s;
  }
}

// out[p, hb, ii, jj] = sum over the broadcast rows / cols of the expanded intermediate [P, Hb, Sq, Sk].
__global__ void reduce_expanded_kernel(float* out, const float* inter, int P, int Hb, int R, int C, int Sq, int Sk) {
  const int64_t nout = int64_t(P) * Hb * R * C;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < nout; e += int64_t(gridDim.x) * blockDim.x) {
    const int jj = int(e % C), ii = int((e / C) % R);
    const int64_t ph = e / (int64_t(C) * R);
    const float* base = inter + ph * Sq * Sk;
    float s = 0.f;
    for (int i = (R == 1 ? 0 : ii); i < (R == 1 ? Sq : ii + 1); ++i)
      for (int j = (C == 1 ? 0 : jj); j < (C == 1 ? Sk : jj + 1); ++j) s += base[int64_t(i) * Sk + j];
    out[e] = s;
  }
}

// dtable[t, h] = sum of dtb[h, i, j] over index[i, j] == t, deterministic. A CTA owns 32 table rows t (one per
// lane) of one head. (index, value) pairs are staged in shared memory in chunks; each of the 16 warps scans its own
// slice of a chunk (every lane reads the same pair: a broadcast) and the 16 partial sums are added in warp order.
// (One thread per t scanning all Sq * Sk pairs took 28 us for Swin W7 and 0.7 ms for W16 on 20-30 CTAs.)
constexpr int kScanWarps = 16;
__global__ void __launch_bounds__(kScanWarps * 32) scatter_dtable_scan_kernel(float* dtable, int64_t T, int H,
                                                                              const float* dtb,
                                                                              const int64_t* index, int64_t i_sq,
                                                                              int64_t i_sk, int Sq, int Sk) {
  constexpr int kChunk = 2048;
  __shared__ int s_idx[kChunk];
  __shared__ float s_val[kChunk];
  __shared__ float s_sum[kScanWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = blockIdx.y;
  const int64_t t = int64_t(blockIdx.x) * 32 + lane;
  const int64_t n = int64_t(Sq) * Sk;
  float sum = 0.f;
  for (int64_t base = 0; base < n; base += kChunk) {
    const int len = int(n - base < kChunk ? n - base : kChunk);
    __syncthreads();
    for (int x = threadIdx.x; x < len; x += blockDim.x) {
      const int64_t e = base + x;
      const int i = int(e / Sk), j = int(e % Sk);
      s_idx[x] = int(index[i * i_sq + j * i_sk]);
      s_val[x] = dtb[int64_t(h) * n + e];
    }
    __syncthreads();
    const int per = (len + kScanWarps - 1) / kScanWarps, lo = warp * per, hi = min(len, lo + per);
    for (int x = lo; x < hi; ++x)
      if (s_idx[x] == t) sum += s_val[x];
  }
  s_sum[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && t < T) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kScanWarps; ++w) total += s_sum[w][lane];
    dtable[t * H + h] = total;
  }
}

__global__ void scatter_dtable_atomic_kernel(float* dtable, int H, const float* dtb, const int64_t* index, int64_t i_sq,
                                             int64_t i_sk, int Sq, int Sk) {
  const int64_t n = int64_t(Sq) * Sk;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * H; e += int64_t(gridDim.x) * blockDim.x) {
    const int h = int(e / n);
    const int64_t r = e % n;
    const int i = int(r / Sk), j = int(r % Sk);
    atomicAdd(dtable + index[i * i_sq + j * i_sk] * H + h, dtb[e]);
  }
}

}  // namespace cuda
}  // namespace winattn
