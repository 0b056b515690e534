// ISA-independent pieces of the CPU backend: scalar dtype conversion, broadcast-operand addressing, the
// causal/window band, tile sizes and the backward work plan (shared by bwd_workspace_bytes and bwd so both see
// the same buffer layout).
#pragma once
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "winattn_params.h"

namespace winattn {
namespace cpu {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes (rows of q x rows of k). 64 x 64 fp32 tiles of q/k/v/scores fit in L1+L2 for every head dim
// up to 256 and keep the per-tile bookkeeping (online-softmax rescale, dtype conversion) small next to the
// 2*64*64*D flops of each tile product.
constexpr int64_t kFwdBlockQ = 64;
constexpr int64_t kFwdBlockK = 64;
constexpr int64_t kBwdBlockQ = 64;
constexpr int64_t kBwdBlockK = 64;
constexpr int64_t kMaxHeadDim = 256;

inline float to_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat16: return static_cast<float>(static_cast<const c10::Half*>(p)[i]);
    case DType::kBFloat16: return static_cast<float>(static_cast<const c10::BFloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Rounds fp32 values to `t` (round-to-nearest-even, as torch does) and writes n contiguous elements.
inline void store_row(void* dst, DType t, int64_t offset, const float* src, int64_t n, float mul = 1.f) {
  switch (t) {
    case DType::kFloat16: {
      auto* d = static_cast<c10::Half*>(dst) + offset;
      for (int64_t x = 0; x < n; ++x) d[x] = c10::Half(src[x] * mul);
      break;
    }
    case DType::kBFloat16: {
      auto* d = static_cast<c10::BFloat16*>(dst) + offset;
      for (int64_t x = 0; x < n; ++x) d[x] = c10::BFloat16(src[x] * mul);
      break;
    }
    default: {
      float* d = static_cast<float*>(dst) + offset;
      for (int64_t x = 0; x < n; ++x) d[x] = src[x] * mul;
    }
  }
}

inline int64_t elem_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Element offset of operand o at (b, h, i, 0): size-1 dims are read at index 0 (their strides are 0 already,
// see broadcast4d() in torch_binding.cpp, but do not rely on it), the batch wraps with period P.
inline int64_t row_offset(const Broadcast4d& o, int64_t b, int64_t h, int64_t i) {
  return (b % o.period) * o.stride_b + (o.heads == 1 ? 0 : h * o.stride_h) + (o.rows == 1 ? 0 : i * o.stride_q);
}
inline int64_t col_stride(const Broadcast4d& o) { return o.cols == 1 ? 0 : o.stride_k; }

// Causal / sliding-window band, bottom-right aligned: key j is inside for query i iff
// lo(i) <= j <= hi(i) with d = j - i - (Sk - Sq).
struct Band {
  int64_t sq = 0, sk = 0, off = 0;
  bool has_hi = false, has_lo = false;
  int64_t hi_rel = 0, lo_rel = 0;  // j <= i + off + hi_rel ; j >= i + off - lo_rel

  explicit Band(const FwdParams& p) : sq(p.seqlen_q), sk(p.seqlen_k), off(p.seqlen_k - p.seqlen_q) {
    if (p.causal || p.window_right >= 0) {
      has_hi = true;
      hi_rel = p.causal ? (p.window_right >= 0 ? std::min<int64_t>(0, p.window_right) : 0) : p.window_right;
    }
    if (p.window_left >= 0) {
      has_lo = true;
      lo_rel = p.window_left;
    }
  }
  bool active() const { return has_hi || has_lo; }
  // First / last visible key of row i, clipped to [0, Sk - 1] (lo > hi: the row sees nothing).
  int64_t lo(int64_t i) const { return has_lo ? std::max<int64_t>(0, i + off - lo_rel) : 0; }
  int64_t hi(int64_t i) const { return has_hi ? std::min<int64_t>(sk - 1, i + off + hi_rel) : sk - 1; }
  // Rows whose band meets keys [j0, j1): [first_row, last_row], clipped to [0, Sq - 1].
  int64_t first_row(int64_t j0) const { return has_hi ? std::max<int64_t>(0, j0 - off - hi_rel) : 0; }
  int64_t last_row(int64_t j1) const { return has_lo ? std::min<int64_t>(sq - 1, j1 - 1 - off + lo_rel) : sq - 1; }
};

// Destination of score gradients dS reduced to a broadcast shape [P, Hb, Rq, Rk] (fp32, contiguous): the
// bias gradient (shape of the bias) or the per-head relative-position accumulator [1, H, Sq, Sk].
struct DsSink {
  float* base = nullptr;
  int64_t period = 1, heads = 1, rows = 1, cols = 1;
  int64_t size() const { return period * heads * rows * cols; }
};

// Work plan of the backward pass (see bwd_kernel.h for the why):
//   tasks = (b, kv head, split of the k-tiles); `nchunks` contiguous runs of tasks are the units handed to
//   parallel_for, each with its own dS accumulators when two tasks could write the same dbias/dtable slot.
struct BwdPlan {
  int64_t ktiles = 0, nsplit = 1, ntasks = 0, nchunks = 1;
  bool dbias_private = false, dtable_private = false;  // per-chunk buffers (else write in place)
  // workspace layout, in floats from the (64-byte aligned) start
  int64_t off_delta = 0, off_dq = 0, off_dbias = 0, off_dtable = 0, total_floats = 0;
};

inline int64_t align16(int64_t n) { return round_up(n, 16); }

inline BwdPlan make_bwd_plan(const BwdParams& p, int64_t nthreads) {
  BwdPlan pl;
  const int64_t B = p.batch, H = p.heads, Hkv = p.heads_kv, Sq = p.seqlen_q, Sk = p.seqlen_k;
  nthreads = std::max<int64_t>(1, nthreads);
  pl.ktiles = ceil_div(Sk, kBwdBlockK);
  const int64_t base = B * Hkv;
  // Split the k-tiles of one (b, kv head) only when there are too few (b, kv head) pairs to keep every thread
  // busy: each split needs its own fp32 copy of dq (reduced in split order at the end).
  if (base > 0 && base < 2 * nthreads && pl.ktiles > 1) {
    pl.nsplit = std::min<int64_t>(pl.ktiles, ceil_div(2 * nthreads, base));
  }
  pl.ntasks = base * pl.nsplit;
  pl.nchunks = std::max<int64_t>(1, std::min<int64_t>(pl.ntasks, nthreads));
  if (p.dbias != nullptr && pl.nchunks > 1) {
    const Broadcast4d& o = p.bias;
    pl.dbias_private = (o.period < B) || (o.heads == 1 && Hkv > 1) || (o.cols == 1 && pl.nsplit > 1);
  }
  if (p.dtable != nullptr && pl.nchunks > 1) pl.dtable_private = B > 1;
  int64_t off = 0;
  pl.off_delta = off;
  off += align16(B * H * Sq);
  pl.off_dq = off;
  off += align16(pl.nsplit * B * H * Sq * p.head_dim);
  pl.off_dbias = off;
  if (pl.dbias_private) off += pl.nchunks * align16(p.bias.period * p.bias.heads * p.bias.rows * p.bias.cols);
  pl.off_dtable = off;
  // dtable accumulates dS per head over [Sq, Sk] before the scatter through rel_index.
  if (p.dtable != nullptr) off += (pl.dtable_private ? pl.nchunks : 1) * align16(H * Sq * Sk);
  pl.total_floats = off;
  return pl;
}

}  // namespace cpu
}  // namespace winattn
