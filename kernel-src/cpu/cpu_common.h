// ISA-independent pieces of the CPU backend: scalar dtype conversion, broadcast-operand addressing, the
// causal/window band, tile sizes and the backward work plan (shared by bwd_workspace_bytes and bwd so both see
// the same buffer layout).
#pragma once
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

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
constexpr int64_t kPrivateBudgetBytes = int64_t{1} << 30;  // see make_bwd_plan

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

// Work plan of the backward pass (see bwd_kernel.h for the why).
//   tasks = (b, kv head, split of the k-tiles), numbered in mixed radix with the dims along which two tasks can
//   hit the same dbias / dtable slot innermost, so that such tasks are consecutive ("conflict group": e.g. all
//   batches of one head for a bias broadcast over the batch). Consecutive tasks then also reuse the same slots
//   from cache. The units of parallel work are `nchunks` contiguous chunks of tasks, each run sequentially by
//   whichever thread takes it. When there are enough groups, chunks are cut at group boundaries and every slot
//   has a single writer (`grouped`); otherwise chunks that may collide accumulate into per-chunk buffers
//   (`*_private`), summed in chunk order at the end. Results never depend on which thread ran which chunk.
struct BwdPlan {
  int64_t ktiles = 0, nsplit = 1, ntasks = 0, nchunks = 1;
  int64_t unit = 1;  // tasks per indivisible piece of a chunk: the conflict-group size when grouped, else 1
  bool grouped = false;
  bool dbias_private = false, dtable_private = false;  // per-chunk buffers (else write in place)
  int order[3] = {0, 1, 2};                            // dims (0 = b, 1 = kv head, 2 = split), outer to inner
  int64_t extent[3] = {1, 1, 1};
  // workspace layout, in floats from the (64-byte aligned) start
  int64_t off_delta = 0, off_dq = 0, off_dbias = 0, off_dtable = 0, total_floats = 0;
  // bf16 dot-product path only: q and dO of every (b, h) as transposed bf16 row pairs [D][ceil(Sq / 2)] (32-bit
  // words), the A operands of q^T.dS and dO^T.P (gemm_bf16.h), built once instead of per tile.
  bool bf16_dot = false;
  int64_t off_qt = 0, off_dot = 0;

  void decode(int64_t task, int64_t& b, int64_t& hk, int64_t& sp) const {
    int64_t v[3] = {0, 0, 0};
    for (int x = 2; x >= 0; --x) {
      v[order[x]] = task % extent[order[x]];
      task /= extent[order[x]];
    }
    b = v[0];
    hk = v[1];
    sp = v[2];
  }
};

inline int64_t align16(int64_t n) { return round_up(n, 16); }

// Per-thread scratch memory of the forward's tile buffers, kept from one call to the next.
// Why: on one 7x7 window the kernel works ~10 us, and allocating + zero-filling its ~50 KB of tile scratch on every
// call (malloc, page faults after glibc trims the freed top chunk, the fill) cost ~1.5 us of it. The memory comes
// back *uninitialized*: every region of FwdScratch is written before it is read (the CPU suite passes with the
// scratch poisoned with NaN instead of zeros; tests/test_host_path.py keeps a NaN-leaving call followed by calls
// of other shapes as the regression check). A thread keeps at most kScratchKeepBytes; a larger request (wide GQA
// groups at D = 256: several MB) is allocated for that call only and freed after, as before, so a big call does
// not pin memory in every pool thread for the life of the process. Not thread-shared (thread_local) and guarded
// against re-entry on one thread (a second live lease gets its own allocation), so no two live scratch objects
// ever share memory. One arena serves every ISA copy of the kernels (this header is compiled once).
constexpr int64_t kScratchKeepBytes = int64_t{1} << 20;

class ScratchLease {
 public:
  explicit ScratchLease(int64_t bytes) {
    Arena& a = arena();
    if (bytes <= kScratchKeepBytes && !a.in_use) {
      if (a.bytes < bytes) {
        a.data.reset(new unsigned char[static_cast<size_t>(bytes) + 64]);  // no value-initialization: no fill
        a.bytes = bytes;
      }
      a.in_use = true;
      shared_ = true;
      base_ = a.data.get();
    } else {
      owned_.reset(new unsigned char[static_cast<size_t>(bytes) + 64]);
      base_ = owned_.get();
    }
    // 64-byte aligned start: the tile buffers are carved at multiples of 64 bytes from here.
    const auto addr = reinterpret_cast<uintptr_t>(base_);
    base_ += ((addr + 63) & ~static_cast<uintptr_t>(63)) - addr;
  }
  ~ScratchLease() {
    if (shared_) arena().in_use = false;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  unsigned char* data() const { return base_; }

 private:
  struct Arena {
    std::unique_ptr<unsigned char[]> data;
    int64_t bytes = 0;
    bool in_use = false;
  };
  static Arena& arena() {
    thread_local Arena a;
    return a;
  }
  std::unique_ptr<unsigned char[]> owned_;
  unsigned char* base_ = nullptr;
  bool shared_ = false;
};

// Number of parallel_for workers to start for a self-scheduling loop (each worker pulls work from an atomic
// counter until none is left).
inline int64_t num_workers() { return std::max<int64_t>(1, static_cast<int64_t>(torch::stable::get_num_threads())); }

inline BwdPlan make_bwd_plan(const BwdParams& p, int64_t nthreads, bool bf16_dot) {
  BwdPlan pl;
  pl.bf16_dot = bf16_dot;
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
  // Which dims can make two tasks write the same dbias / dtable slot.
  const bool has_bias = p.dbias != nullptr, has_table = p.dtable != nullptr;
  const bool bias_b = has_bias && p.bias.period < B, bias_h = has_bias && p.bias.heads == 1 && Hkv > 1;
  const bool bias_s = has_bias && p.bias.cols == 1 && pl.nsplit > 1, table_b = has_table && B > 1;
  const bool conflict[3] = {bias_b || table_b, bias_h, bias_s};
  const int64_t ext[3] = {B, Hkv, pl.nsplit};
  int n = 0;
  int64_t group = 1;
  for (int d = 0; d < 3; ++d)
    if (!conflict[d]) pl.order[n++] = d;
  for (int d = 0; d < 3; ++d)
    if (conflict[d]) {
      pl.order[n++] = d;
      group *= ext[d];
    }
  for (int d = 0; d < 3; ++d) pl.extent[d] = ext[d];
  const int64_t ngroups = pl.ntasks / std::max<int64_t>(1, group);
  // Whole groups per chunk when they balance well enough; else per-chunk buffers. Chunks are handed out
  // dynamically (run_bwd), so without private buffers there are several per thread for load balance (causal
  // masks, a core taken by another process); with them, one per thread bounds the buffers' memory.
  pl.grouped = ngroups >= nthreads && (ngroups % nthreads == 0 || ngroups >= 2 * nthreads);
  pl.unit = pl.grouped ? std::max<int64_t>(1, group) : 1;
  const bool needs_private = !pl.grouped && (bias_b || bias_h || bias_s || table_b);
  pl.nchunks = std::max<int64_t>(1, std::min<int64_t>(pl.ntasks / pl.unit, (needs_private ? 1 : 4) * nthreads));
  if (pl.nchunks > 1 && needs_private) {
    pl.dbias_private = bias_b || bias_h || bias_s;
    pl.dtable_private = table_b;
    // Per-chunk buffers cost nchunks copies of dbias / the table accumulator: above kPrivateBudgetBytes, trade
    // threads for memory (e.g. a [1, 1, 8192, 8192] bias on a 64-thread machine).
    const int64_t per_chunk = 4 * ((pl.dbias_private ? align16(p.bias.period * p.bias.heads * p.bias.rows *
                                                               p.bias.cols) : 0) +
                                   (pl.dtable_private ? align16(H * Sq * Sk) : 0));
    if (per_chunk > 0) pl.nchunks = std::max<int64_t>(1, std::min(pl.nchunks, kPrivateBudgetBytes / per_chunk));
    if (pl.nchunks == 1) pl.dbias_private = pl.dtable_private = false;
  }
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
  if (bf16_dot) {
    const int64_t words = B * H * p.head_dim * ceil_div(Sq, 2);
    pl.off_qt = off;
    off += align16(words);
    pl.off_dot = off;
    off += align16(words);
  }
  pl.total_floats = off;
  return pl;
}

}  // namespace cpu
}  // namespace winattn
