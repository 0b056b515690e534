// The call as the kernels see it: winattn::FwdParams / BwdParams (the backend API) translated into KParams, with
// the checks every kernel relies on (dtypes, head dim, 16-byte rows). Plain C++, so the kernel choice
// (kernel_choice.h) and its CPU test see exactly what the planner sees.
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../winattn_params.h"
#include "kernel_params.h"

namespace winattn {
namespace cuda {

inline void require(bool cond, const std::string& msg) {
  if (!cond) throw std::runtime_error("window_attention (cuda): " + msg);
}

// 0 fp16, 1 bf16, 2 fp32 (Operand4d::dtype, the kernels' dtype argument)
inline int dtype_code(DType t) { return t == DType::kFloat16 ? 0 : t == DType::kBFloat16 ? 1 : 2; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
inline void check_rows(const void* p, int64_t sb, int64_t ss, int64_t sh, const char* name) {
  require(aligned16(p) && sb % 8 == 0 && ss % 8 == 0 && sh % 8 == 0,
          std::string(name) + " must be 16-byte aligned with strides (batch, seq, head) that are multiples of 8 "
                              "elements (call .contiguous() first)");
}

inline Operand4d operand(const Broadcast4d& b, int Sk, bool is_mask) {
  Operand4d o;
  o.ptr = b.ptr;
  if (!b.ptr) return o;
  o.dtype = is_mask ? 0 : dtype_code(b.dtype);
  o.period = int(b.period);
  o.heads = int(b.heads);
  o.rows = int(b.rows);
  o.cols = int(b.cols);
  o.sb = b.stride_b;
  o.sh = b.stride_h;
  o.sq = b.stride_q;
  o.sk = b.stride_k;
  const int esize = is_mask ? 1 : (o.dtype == 2 ? 4 : 2);
  o.vec2 = b.cols == Sk && b.stride_k == 1 && (reinterpret_cast<uintptr_t>(b.ptr) % (2 * esize)) == 0 &&
           b.stride_b % 2 == 0 && b.stride_h % 2 == 0 && b.stride_q % 2 == 0;
  return o;
}

inline void fill_common(const FwdParams& fp, KParams& p) {
  require(fp.dtype != DType::kFloat32, "q/k/v must be float16 or bfloat16");
  require(fp.head_dim % 8 == 0 && fp.head_dim >= 8 && fp.head_dim <= 256, "head dim must be a multiple of 8 <= 256");
  require(fp.batch < (int64_t(1) << 31) && fp.seqlen_q < (int64_t(1) << 30) && fp.seqlen_k < (int64_t(1) << 30) &&
              fp.heads < (int64_t(1) << 30),
          "sizes out of range");
  p.B = int(fp.batch);
  p.Sq = int(fp.seqlen_q);
  p.Sk = int(fp.seqlen_k);
  p.H = int(fp.heads);
  p.Hkv = int(fp.heads_kv);
  p.D = int(fp.head_dim);
  p.hgroup = p.H / p.Hkv;
  p.q = fp.q;
  p.k = fp.k;
  p.v = fp.v;
  p.o = fp.out;
  p.lse = fp.lse;
  p.q_sb = fp.q_stride_b; p.q_ss = fp.q_stride_s; p.q_sh = fp.q_stride_h;
  p.k_sb = fp.k_stride_b; p.k_ss = fp.k_stride_s; p.k_sh = fp.k_stride_h;
  p.v_sb = fp.v_stride_b; p.v_ss = fp.v_stride_s; p.v_sh = fp.v_stride_h;
  p.o_sb = fp.o_stride_b; p.o_ss = fp.o_stride_s; p.o_sh = fp.o_stride_h;
  check_rows(fp.q, p.q_sb, p.q_ss, p.q_sh, "q");
  if (p.Sk > 0) {  // empty tensors are never read (and may come with any strides)
    check_rows(fp.k, p.k_sb, p.k_ss, p.k_sh, "k");
    check_rows(fp.v, p.v_sb, p.v_ss, p.v_sh, "v");
  }
  check_rows(fp.out, p.o_sb, p.o_ss, p.o_sh, "out");
  p.bias = operand(fp.bias, p.Sk, false);
  p.mask = operand(fp.mask, p.Sk, true);
  p.kp = fp.key_padding;
  p.kp_sb = fp.kp_stride_b;
  p.kp_sk = fp.kp_stride_k;
  p.kp_vec4 = p.kp != nullptr && p.kp_sk == 1 && reinterpret_cast<uintptr_t>(p.kp) % 4 == 0 && p.kp_sb % 4 == 0;
  p.scale = fp.scale;
  p.scale_log2 = fp.scale * 1.4426950408889634f;  // (kLog2e, utils.h)
  int64_t right = fp.window_right;
  if (fp.causal) right = right >= 0 ? std::min<int64_t>(right, 0) : 0;
  p.has_band = fp.window_left >= 0 || right >= 0;
  const int64_t off = int64_t(p.Sk) - p.Sq, inf = int64_t(1) << 40;
  p.band_lo = fp.window_left >= 0 ? off - fp.window_left : -inf;
  p.band_hi = right >= 0 ? off + right : inf;
  // Band calls interleave the tiles of a few pairs, longest first across them (sm90 decode_tile, decode_bwd_tile):
  // as many as FA4's causal scheduler takes (a power of two, its `swizzle`), here at most 4 and fewer where what
  // they stream would pass 32 MB of L2: K / V per query head in the forward, Q / dO of the group per KV head in the
  // backward.
  auto pairs_within_l2 = [](int64_t bytes_per_pair) {
    int n = 4;
    while (n > 1 && n * bytes_per_pair > (int64_t(32) << 20)) n /= 2;
    return n;
  };
  p.band_pairs = p.has_band ? pairs_within_l2(int64_t(p.Sk) * p.D * 4) : 1;
  // The backward's only up to 8192 keys (64 key blocks of 128 per pair): Llama-3 prefill's backward -4% in two calls
  // (H100 kernel time, RESULTS v5.3); at 16k keys (128 blocks per pair, already balanced by the
  // model: ~0.1% past the end) the causal D = 128 backward read +0.6% and +2% interleaved, so it keeps v5.2's order.
  p.bwd_band_pairs = p.has_band && p.Sk <= 8192 ? pairs_within_l2(int64_t(p.hgroup) * p.Sq * p.D * 4) : 1;
}

}  // namespace cuda
}  // namespace winattn
