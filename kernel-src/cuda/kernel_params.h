// Kernel-side parameters: the host (winattn_cuda.cu) translates winattn::FwdParams / BwdParams into these plain
// structs, passed by value to every kernel. Extents are int (checked on the host); element offsets are int64.
#pragma once
#include <cstdint>

namespace winattn {
namespace cuda {

// A strided operand broadcast against [B, H, Sq, Sk] (see winattn::Broadcast4d): batch b reads b % period, a size-1
// dim reads index 0 (its stride is 0). dtype: 0 fp16, 1 bf16, 2 fp32 (ignored for the bool mask).
struct Operand4d {
  const void* ptr = nullptr;
  int dtype = 2;
  int period = 1, heads = 1, rows = 1, cols = 1;
  int64_t sb = 0, sh = 0, sq = 0, sk = 0;
  bool vec2 = false;  // cols == Sk, sk == 1 and 2-element aligned: column pairs load as one vector
};

// Where the gradient of an additive score term goes (dbias, or dtb = the batch-summed gradient of the table term).
// Target layout: fp32 contiguous [period, heads, rows, cols] (rows == Sq and cols == Sk on this path).
enum class TargetMode : int {
  kNone = 0,
  kStore = 1,    // every slot written by exactly one (b, h, i, j): plain store
  kOrdered = 2,  // slots shared over b and/or h: read-add-write in a fixed contributor order (semaphores)
  kAccum = 3,    // window mode: summed over the CTA's items in shared memory, flushed to per-CTA partials
  kAtomic = 4,   // non-deterministic: fp32 atomics (pre-reduced in the warp for broadcast rows / cols)
};
struct Target {
  TargetMode mode = TargetMode::kNone;
  float* ptr = nullptr;
  int period = 1, heads = 1, rows = 1, cols = 1;  // rows in {1, Sq}, cols in {1, Sk} (full for kStore/kOrdered)
  int* sems = nullptr;        // kOrdered: one counter per (period, heads, m-block, n-block) tile
};

enum class DqMode : int { kDirect = 0, kAtomic = 1, kOrdered = 2 };

struct KParams {
  // problem
  int B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0, hgroup = 1;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  int64_t q_sb = 0, q_ss = 0, q_sh = 0;
  int64_t k_sb = 0, k_ss = 0, k_sh = 0;
  int64_t v_sb = 0, v_ss = 0, v_sh = 0;
  int64_t o_sb = 0, o_ss = 0, o_sh = 0;

  // score terms
  Operand4d bias;  // additive term: the user bias, or (with a table) the host-combined fp32 bias + table term
  // How the additive term reaches the kernel, per (query block, key block) tile:
  //   bias_stages 2: staged in shared memory one step ahead (through the K/V pipeline); 1: loaded at the top of
  //   its own step; 0: read from global memory per element (only when the tile does not fit in shared memory).
  //   bias_mode 1: 16-byte cp.async chunks, 2: 4-byte cp.async chunks, 3: strided element copies.
  int bias_stages = 0, bias_mode = 3, bias_pitch = 0;  // pitch: bytes per shared tile row
  // The additive term holds a bool mask folded in as -inf (kernel_choice.h prepare_v3_term, the window kernels'
  // folds): a -inf term then hides its key whatever the score, as masked_fill does (an additive -inf lets a NaN score
  // through: NaN + -inf = NaN).
  bool term_hides = false;
  Operand4d mask;  // bool, true = attend
  // The mask as bits, for the wide window kernels and forward v3 (aux_kernels.h mask_bits_kernel; mask.ptr null):
  // [mb_period][mb_heads][mb_rows][mb_words] uint32, bit j of word w set = column 32 w + j attends. Rows are queries
  // for the forward, keys for the wide backward (the transposed mask: its tiles are S^T).
  const uint32_t* mbits = nullptr;
  int mb_period = 1, mb_heads = 1, mb_rows = 0, mb_words = 0;
  const bool* kp = nullptr;
  int64_t kp_sb = 0, kp_sk = 0;
  bool kp_vec4 = false;  // kp_sk == 1 and every row 4-byte aligned: key blocks load as 4-byte chunks
  float scale = 1.f;       // softmax scale
  float scale_log2 = 1.f;  // scale * log2(e)
  // band: key j visible to query i iff band_lo <= j - i <= band_hi (offsets already include Sk - Sq)
  int64_t band_lo = -(int64_t(1) << 40), band_hi = int64_t(1) << 40;
  bool has_band = false;
  // v3 tile order on band calls: the (batch, head) pairs whose query tiles interleave in the forward (sm90
  // decode_tile), the (batch, KV head) pairs whose key tiles interleave in the backward (decode_bwd_tile); 1 elsewhere
  int band_pairs = 1, bwd_band_pairs = 1;

  // work decomposition: CTA linear id = ((blk * Hx + hx) * NR + rc), rc = c * Pg + r, items b = r + Pg * (c * G + t)
  // (forward: blk = m-block, Hx = H; backward: blk = n-block, Hx = Hkv)
  int G = 1, Pg = 1, NC = 1, NR = 1;

  // backward
  const void* dout = nullptr;
  int64_t do_sb = 0, do_ss = 0, do_sh = 0;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dq_accum = nullptr;  // fp32 [B, Sq, H, D] (kAtomic / kOrdered)
  int* dq_sems = nullptr;     // kOrdered: [B, H, m-blocks]
  DqMode dq_mode = DqMode::kDirect;
  const float* delta = nullptr;  // fp32 [B, H, Sq]: rowsum(dO * O) - dlse (null: the kernel computes it)
  const float* dlse = nullptr;   // fp32 [B, H, Sq] gradient of lse, or null (kernels that compute delta)
  Target t_bias;                 // dbias (or its rows/cols-expanded intermediate)
  Target t_tb;                   // dtb
  float* partials = nullptr;     // window mode: per CTA [m_blocks * BM, BN] sums of dS
};

}  // namespace cuda
}  // namespace winattn
