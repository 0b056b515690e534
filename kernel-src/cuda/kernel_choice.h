// The kernel choice: which kernel runs a call and how (tile, score-term path, persistence, dbias route, the term
// preparation before it), decided in one place, top to bottom. FA3's tile_size.h / heuristics.h are the model.
// Every kernel passes the same tests, so each rule is a speed decision; each says what was measured
// (benchmarks/RESULTS.md has the runs).
//
// Plan, then run: the planner (winattn_cuda.cu) asks choose_fwd / choose_bwd once per call, sizes the grid and
// the workspace for the chosen kernel (occupancy, windows per CTA) and launches exactly that; the launchers
// (sm90/launch_sm90.h, sm90/launch_bwd_sm90.h) decide nothing.
//
// Plain C++ on purpose (no CUDA runtime): tests/unit/test_kernel_choice.py compiles this header with g++ and
// prints the choice for a table of shapes against tests/unit/kernel_choice_golden.txt, a golden file reviewed like
// code. WINATTN_FORCE_KERNEL (docs/knobs.md) forces a kernel for A/B runs and tests; a forced kernel that cannot
// take the call is an error, never a silent fallback.
#pragma once
#ifndef __CUDACC__  // (g++: the traits' host / device markers)
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#endif
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include "call_params.h"
#include "kernel_modes.h"
#include "sm90/kernel_traits_sm90.h"

namespace winattn {
namespace cuda {

// (a + b - 1 in int64: it passes 2^31 for a batch past 2^30 in try_bwd_v3's div_up(B, period))
inline int div_up(int a, int b) { return int((int64_t(a) + b - 1) / b); }
// Counts the kernels keep in int (grid indices, a mask-bits plane's words): a kernel whose count would pass this
// does not take the call (kernel_choice_fuzz.cpp reached each with calls that fit an H200's memory).
constexpr int64_t kIntCountMax = INT32_MAX;

// The head-dim instance a call's D runs on (the kernels are instantiated for these; the columns past D are zero).
__host__ __device__ constexpr int kernel_head_dim(int d) {
  return d <= 32 ? 32 : d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 160 ? 160 : d <= 192 ? 192 : 256;
}
// Forward v3 also has instances at 48 and 80 (kernel_traits_sm90.h kTileCols), so that 33-48 and 65-80 (SD 1.5's
// 40, DiT's and PixArt's 72, SD 1.5's 80) are not padded to 64 / 96: a quarter and a sixth less of each GEMM. Both
// are the table's: 48 since v4.3 (16-column blocks; H200 kernel time, SD 1.5 64x64 self-attention at D 40: 0.712 ->
// 0.664 ms), 80 since v5.7 (96's tiles, GEMMs over 80; H100 kernel time against 96, two builds: 0-2%, SD 1.5's 80
// at 1024 tokens 0.058 -> 0.057 ms, PixArt's 72 at 4096 0.811 -> 0.809, DiT-XL/2's 72 unchanged at 0.116 / 0.263; on
// 16-column blocks, v4.3, it was no faster). fwd_v3_fine_dims forces them.
__host__ __device__ constexpr int v3_head_dim(int d) {
  return d > 32 && d <= 48 ? 48 : d > 64 && d <= 80 ? 80 : kernel_head_dim(d);
}

// ---- the kernels ---------------------------------------------------------------------------------------------
enum class FwdKernel : int {
  kAuto = 0,
  kV1,       // fwd_kernel.h: mma.sync, every architecture, every call
  kV3,       // sm90/fwd_pipelined_sm90.h: Hopper, TMA + warp specialization, every head dim and term
  kWindows,  // sm90/fwd_windows_sm90.h: Hopper, many short windows per CTA (D = 32: <= 256 keys, D = 64: <= 64)
  kDecode,   // fwd_decode.h: every architecture, <= 16 query rows per KV head (decode), keys split over CTAs
};
enum class BwdKernel : int {
  kAuto = 0,
  kV1,           // bwd_kernel.h: mma.sync, every call (window mode: many items per CTA, dS summed on chip)
  kV3,           // sm90/bwd_pipelined_sm90.h: Hopper, KV-outer, TMA + warp specialization
  kWindows,      // sm90/bwd_windows_sm90.h: Hopper, D = 32 windows of <= 64 tokens
  kWideWindows,  // sm90/bwd_windows_wide_sm90.h: Hopper, D = 32 windows of 65 .. 256 tokens
};
inline const char* name_of(FwdKernel k) {
  switch (k) {
    case FwdKernel::kV1: return "fwd_v1";
    case FwdKernel::kV3: return "fwd_v3";
    case FwdKernel::kWindows: return "fwd_windows";
    case FwdKernel::kDecode: return "fwd_decode";
    default: return "auto";
  }
}
inline const char* name_of(BwdKernel k) {
  switch (k) {
    case BwdKernel::kV1: return "bwd_v1";
    case BwdKernel::kV3: return "bwd_v3";
    case BwdKernel::kWindows: return "bwd_windows";
    case BwdKernel::kWideWindows: return "bwd_windows_wide";
    default: return "auto";
  }
}

// A forced kernel that cannot take the call is an error naming why, never a silent fallback.
inline void require_forced(const char* kernel, const std::string& why_not) {
  if (!why_not.empty())
    throw std::runtime_error(std::string("WINATTN_FORCE_KERNEL=") + kernel + ": this call cannot run it (" + why_not +
                             ")");
}

// ---- what the choice reads besides the call -------------------------------------------------------------------
struct DeviceCaps {
  int cc_major = 0, sms = 0, smem_optin = 0;
  bool sm90a = false;          // compute capability 9.x and this binary holds the sm_90a kernels (built with 9.0a)
  int wide_cluster_slots = 0;  // CTAs of the split wide-window backward resident in whole clusters of four
};

// WINATTN_FORCE_KERNEL: comma-separated names (docs/knobs.md). Variants of v3 name the tile / schedule.
struct Forced {
  FwdKernel fwd = FwdKernel::kAuto;
  BwdKernel bwd = BwdKernel::kAuto;
  int v3_tile = 0;  // 1: fwd_v3_narrow, 2: fwd_v3_wide, 3: fwd_v3_short, 4: fwd_v3_stream, 5: fwd_v3_two_ctas,
                    // 6: fwd_v3_rows192, 7: fwd_v3_ragged
  int v3_persistent = -1;  // 0: fwd_v3_per_tile, 1: fwd_v3_persistent (strided), 2: fwd_v3_dynamic
  bool v3_fine_dims = false;  // fwd_v3_fine_dims: the 48 / 80 instances (v3_head_dim; the table's)
  bool bwd_two_stages = false, bwd_no_pair = false;
  bool bwd_fine_dims = false;  // bwd_v3_fine_dims: the 96 instance (bwd_v3_head_dim)
  int bwd_dq = -1;  // bwd_v3_dq_accumulate / _direct / _resident: BwdV3Buffers::dq_mode (-1: the table decides)
  int bwd_mask_bits = -1;  // 1: bwd_v3_bits, 0: bwd_v3_fold (-1: the table decides)
  int bwd_q128 = -1;  // 1: bwd_v3_q128, 0: bwd_v3_q64 (queries per backward step; -1: the table decides)
  bool decode_tma = false;  // fwd_decode_tma: the decode forward with K / V by TMA (the table's on Hopper)
};
constexpr const char* kForceNames =
    "v1, fwd_v1, fwd_v3, fwd_v3_narrow, fwd_v3_wide, fwd_v3_short, fwd_v3_stream, fwd_v3_two_ctas, fwd_v3_rows192, "
    "fwd_v3_ragged, fwd_v3_fine_dims, fwd_v3_persistent, fwd_v3_dynamic, fwd_v3_per_tile, "
    "fwd_windows, fwd_decode, fwd_decode_tma, "
    "bwd_v1, bwd_v3, bwd_v3_two_stages, bwd_v3_no_pair, bwd_v3_fine_dims, bwd_v3_dq_accumulate, bwd_v3_dq_direct, "
    "bwd_v3_dq_resident, bwd_v3_q128, bwd_v3_q64, "
    "bwd_v3_bits, bwd_v3_fold, bwd_windows, bwd_windows_wide";
inline Forced parse_forced(const std::string& spec) {
  Forced f;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t end = spec.find(',', at);
    if (end == std::string::npos) end = spec.size();
    std::string n = spec.substr(at, end - at);
    n.erase(0, n.find_first_not_of(" \t"));
    n.erase(n.find_last_not_of(" \t") + 1);
    at = end + 1;
    if (n.empty()) continue;
    if (n == "v1") f.fwd = FwdKernel::kV1, f.bwd = BwdKernel::kV1;
    else if (n == "fwd_v1") f.fwd = FwdKernel::kV1;
    else if (n == "fwd_v2")  // (the v2 forward ran only empty key sets without a term; v1 runs them now)
      throw std::invalid_argument("WINATTN_FORCE_KERNEL: fwd_v2 was retired with the v2 forward; fwd_v1 runs what "
                                  "it ran (docs/knobs.md)");
    else if (n == "fwd_v3") f.fwd = FwdKernel::kV3;
    else if (n == "fwd_v3_narrow") f.fwd = FwdKernel::kV3, f.v3_tile = 1;
    else if (n == "fwd_v3_wide") f.fwd = FwdKernel::kV3, f.v3_tile = 2;
    else if (n == "fwd_v3_short") f.fwd = FwdKernel::kV3, f.v3_tile = 3;
    else if (n == "fwd_v3_stream") f.fwd = FwdKernel::kV3, f.v3_tile = 4;
    else if (n == "fwd_v3_two_ctas") f.fwd = FwdKernel::kV3, f.v3_tile = 5;
    else if (n == "fwd_v3_rows192") f.fwd = FwdKernel::kV3, f.v3_tile = 6;
    else if (n == "fwd_v3_ragged") f.fwd = FwdKernel::kV3, f.v3_tile = 7;
    else if (n == "fwd_v3_fine_dims") f.fwd = FwdKernel::kV3, f.v3_fine_dims = true;
    else if (n == "fwd_v3_persistent") f.fwd = FwdKernel::kV3, f.v3_persistent = 1;
    else if (n == "fwd_v3_dynamic") f.fwd = FwdKernel::kV3, f.v3_persistent = 2;
    else if (n == "fwd_v3_per_tile") f.fwd = FwdKernel::kV3, f.v3_persistent = 0;
    else if (n == "fwd_windows") f.fwd = FwdKernel::kWindows;
    else if (n == "fwd_decode") f.fwd = FwdKernel::kDecode;
    else if (n == "fwd_decode_tma") f.fwd = FwdKernel::kDecode, f.decode_tma = true;
    else if (n == "bwd_v1") f.bwd = BwdKernel::kV1;
    else if (n == "bwd_v3") f.bwd = BwdKernel::kV3;
    else if (n == "bwd_v3_two_stages") f.bwd = BwdKernel::kV3, f.bwd_two_stages = true;
    else if (n == "bwd_v3_no_pair") f.bwd = BwdKernel::kV3, f.bwd_no_pair = true;
    else if (n == "bwd_v3_fine_dims") f.bwd = BwdKernel::kV3, f.bwd_fine_dims = true;
    else if (n == "bwd_v3_dq_accumulate") f.bwd = BwdKernel::kV3, f.bwd_dq = kBwdDqAccumulate;
    else if (n == "bwd_v3_dq_direct") f.bwd = BwdKernel::kV3, f.bwd_dq = kBwdDqDirect;
    else if (n == "bwd_v3_dq_resident") f.bwd = BwdKernel::kV3, f.bwd_dq = kBwdDqResident;
    else if (n == "bwd_v3_q128") f.bwd = BwdKernel::kV3, f.bwd_q128 = 1;
    else if (n == "bwd_v3_q64") f.bwd = BwdKernel::kV3, f.bwd_q128 = 0;
    else if (n == "bwd_v3_bits") f.bwd = BwdKernel::kV3, f.bwd_mask_bits = 1;
    else if (n == "bwd_v3_fold") f.bwd = BwdKernel::kV3, f.bwd_mask_bits = 0;
    else if (n == "bwd_windows") f.bwd = BwdKernel::kWindows;
    else if (n == "bwd_windows_wide") f.bwd = BwdKernel::kWideWindows;
    else
      throw std::invalid_argument("WINATTN_FORCE_KERNEL: unknown kernel '" + n + "' (known: " + kForceNames + ")");
  }
  return f;
}

// ---- term preparation ---------------------------------------------------------------------------------------
// An additive term the kernel cannot read as given is prepared on the device first, into the workspace (256-byte
// aligned, rows padded to Skp = a multiple of 8 elements, so TMA and 16-byte copies address every row):
//   comb[P, heads, Sq, Skp] = table[index] (+ bias) (+ -inf where a folded bool mask hides), in `dtype`.
// fp16 for the window kernels (their term tables are fp16; exact for 16-bit terms, |err| <= 2^-11 |term| for the
// table); the input dtype for v3, whose staged tile is the input dtype: the rounding of the term is then exactly the
// PyTorch same-dtype computation's (score + bias.to(dtype)), finite magnitudes past the dtype's range saturate and
// -inf stays -inf (aux_kernels.h combine_terms_kernel).
struct CombPlan {
  int P = 1, heads = 1, rows = 0, Skp = 0;  // rows: Sq, or 1 for a term broadcast over the queries
  int dtype = 0;      // 0 fp16, 1 bf16
  bool mask = false;  // a bool mask broadcast over the windows folded in (fold_window_mask)
  int64_t bytes = 0;
};
inline CombPlan comb_plan_of(const FwdParams& fp, int P, int heads, int dtype, int rows = -1) {
  CombPlan c;
  c.P = P;
  c.heads = heads;
  c.rows = rows < 0 ? int(fp.seqlen_q) : rows;
  c.dtype = dtype;
  c.Skp = int((fp.seqlen_k + 7) / 8 * 8);
  c.bytes = int64_t(c.P) * heads * c.rows * c.Skp * 2;
  return c;
}
// The relative-position table term (+ the bias, when there is one) gathered per head into one tile of `dtype`.
inline CombPlan table_plan_of(const FwdParams& fp, int heads, int dtype) {
  return comb_plan_of(fp, fp.bias.ptr ? int(fp.bias.period) : 1, heads, dtype);
}
// The kernel's view of a prepared term. Its address is the workspace's, known when the plan runs: until then the
// view holds kWorkspaceTerm (never dereferenced; 256, the workspace alignment, so alignment rules hold for it).
inline const void* const kWorkspaceTerm = reinterpret_cast<const void*>(uintptr_t(256));
inline void use_comb(KParams& p, const CombPlan& c) {
  Operand4d o;
  o.ptr = kWorkspaceTerm;
  o.dtype = c.dtype;
  o.period = c.P;
  o.heads = c.heads;
  o.rows = c.rows;
  o.cols = p.Sk;
  o.sq = c.rows > 1 ? c.Skp : 0;
  o.sh = c.heads > 1 ? int64_t(c.rows) * c.Skp : 0;
  o.sb = c.heads * int64_t(c.rows) * c.Skp;
  o.sk = 1;
  o.vec2 = true;
  p.bias = o;
}

// How v1 / the window kernels stage the additive tile (KParams::bias_mode / bias_pitch).
inline int bias_pitch_of(int block_n, int esize) { return block_n * esize + (esize == 4 ? 32 : 16); }
inline void choose_bias_mode(KParams& p, int block_n) {
  const Operand4d& b = p.bias;
  if (!b.ptr) return;
  const int es = b.dtype == 2 ? 4 : 2;
  auto aligned = [&](int a) {
    return reinterpret_cast<uintptr_t>(b.ptr) % a == 0 && (b.sb * es) % a == 0 && (b.sh * es) % a == 0 &&
           (b.sq * es) % a == 0;
  };
  p.bias_mode = 3;
  if (b.sk == 1 && b.cols == p.Sk) p.bias_mode = aligned(16) ? 1 : aligned(4) ? 2 : 3;
  p.bias_pitch = bias_pitch_of(block_n, es);
}

// A bf16 term broadcast over the windows recast to fp16 for the wide window kernels, whose term tables are fp16
// (exact: bf16's 8 mantissa bits fit fp16's 10). Without it such calls ran v3: H200 W12 backward with a [1, H, N, N]
// bf16 bias 6.74 ms, recast 1.55 ms.
inline bool recast_bf16_term(const FwdParams& fp, const KParams& p) {
  return fp.rel_table == nullptr && p.bias.ptr != nullptr && p.bias.dtype == 1 && p.bias.period < p.B;
}
// A bool mask broadcast over the windows folded into the fp16 term as -inf where it hides (the wide tiles read no
// mask per score). Only for 16-bit biases or the table term; the mask's period must divide the term's, which must
// be < B (a per-window mask would make an fp16 copy the size of the scores: it goes as bits). Returns P, 0 if not.
inline int mask_fold_period(const FwdParams& fp, const KParams& p) {
  if (fp.mask.ptr == nullptr || p.has_band || (fp.bias.ptr && fp.bias.dtype == DType::kFloat32 && !fp.rel_table))
    return 0;
  const int pm = int(fp.mask.period);
  const int P = fp.bias.ptr ? int(fp.bias.period) : fp.rel_table ? 1 : pm;
  return P % pm == 0 && P < p.B && p.B % P == 0 ? P : 0;
}

// A term v3 can stage as given: the input dtype, full rows and contiguous full columns, 16-byte aligned rows.
inline bool v3_stageable(const Operand4d& t, const KParams& p, int dtype) {
  return t.ptr != nullptr && t.dtype == dtype && t.rows == p.Sq && t.cols == p.Sk && t.sk == 1 &&
         reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && (t.sq * 2) % 16 == 0 &&
         (t.heads == 1 || (t.sh * 2) % 16 == 0) && (t.period == 1 || (t.sb * 2) % 16 == 0);
}
// v3 takes any other full-rows / full-columns term recast to the input dtype (keeping its own period and heads):
// an fp32 bias (a learnable relative-position bias under autocast, T5's), a term of the other 16-bit dtype, rows
// that are not 16-byte aligned (BEiT's N = 197). Without it those calls read the term per score from global
// memory (the general path: BEiT-shaped forward 0.13x FlexAttention, issue 29).
inline bool v3_recast_term(const FwdParams& fp, const KParams& p, int dtype) {
  const Operand4d& t = p.bias;
  return fp.rel_table == nullptr && t.ptr != nullptr && t.rows == p.Sq && t.cols == p.Sk && !v3_stageable(t, p, dtype);
}

// A term broadcast over the queries ([B or 1, H or 1, 1, Sk], any float dtype): a float key-padding mask (what
// diffusers pipelines pass: 0 / -inf / finfo.min / -10000), a per-key bias. v3 reads it one value per key (the
// general path read it per score: Flux-shaped [B, 1, 1, S] forward 0.23x cuDNN, issue 29).
inline bool row_term(const Operand4d& t, const KParams& p) {
  return t.ptr != nullptr && t.rows == 1 && t.cols == p.Sk && p.Sq > 1;
}

// A bool mask [B or 1, 1, 1, Sk] is key padding (same semantics: False hides the key for every query and head), which
// every kernel reads as one byte per key; the call's own key padding, if any, keeps the mask a mask.
inline void mask_as_key_padding(KParams& p) {
  const Operand4d& m = p.mask;
  if (m.ptr == nullptr || p.kp != nullptr || m.heads != 1 || m.rows != 1 || m.cols != p.Sk ||
      (m.period != 1 && m.period != p.B))
    return;
  p.kp = static_cast<const bool*>(m.ptr);
  p.kp_sb = m.period == 1 ? 0 : m.sb;
  p.kp_sk = m.sk;
  p.kp_vec4 = p.kp_sk == 1 && reinterpret_cast<uintptr_t>(p.kp) % 4 == 0 && p.kp_sb % 4 == 0;
  p.mask = Operand4d{};
}

// The term v3 reads, prepared when it cannot read the call's own (comb_plan_of's layout, the input dtype, rows
// padded to 16 bytes, so TMA stages it): the table term, a bias v3 cannot stage as given (v3_recast_term), and a
// bool mask folded in as -inf where it hides, with p.term_hides set so that a -inf hides its key whatever the score
// (masked_fill's semantics, kernel_params.h). Folded, a mask with an additive term rides the staged path
// (kTermsRawBiasMasked) at 2 bytes per score; read per score by the general path, masks ran 0.17-0.25x cuDNN
// (RESULTS v3.6). A mask without a term takes bits in the forward (try_fwd_v3_for) and folds here in the backward,
// where a mask broadcast over the queries becomes a row term, one value per key. Not folded:
// scale <= 0 (the general path, which reads the mask itself), periods whose product does not divide B, and a
// prepared copy past kMaskFoldMaxBytes (the general path then reads the mask per score: slow, no extra memory).
constexpr int64_t kMaskFoldMaxBytes = int64_t(2) << 30;
inline void prepare_v3_term(KParams& p, CombPlan& comb, const FwdParams& fp, int dt) {
  const Operand4d& b = p.bias;
  const Operand4d& m = p.mask;
  const bool table = fp.rel_table != nullptr;
  int P = b.ptr ? b.period : 1;
  int heads = table ? p.H : b.ptr ? b.heads : 1;
  int rows = table || (b.ptr && b.rows == p.Sq) ? p.Sq : 1;
  bool fold = false;
  if (m.ptr != nullptr && p.scale > 0.f) {
    const int Pm = P / std::gcd(P, m.period) * m.period;
    const int hm = std::max(heads, m.heads), rm = m.rows == p.Sq ? p.Sq : rows;
    fold = p.B % Pm == 0 && comb_plan_of(fp, Pm, hm, dt, rm).bytes <= kMaskFoldMaxBytes;
    if (fold) P = Pm, heads = hm, rows = rm;
  }
  if (!table && !fold && !v3_recast_term(fp, p, dt)) return;
  comb = comb_plan_of(fp, P, heads, dt, rows);
  comb.mask = fold;
  use_comb(p, comb);
  if (fold) {
    p.mask = Operand4d{};
    p.term_hides = true;
  }
}

// ---- forward --------------------------------------------------------------------------------------------------
struct FwdChoice {
  FwdKernel kernel = FwdKernel::kV1;
  int dk = 32;                   // head-dim instance
  KParams p;                     // the kernels' view (a prepared term at kWorkspaceTerm)
  CombPlan comb;                 // the prepared term (bytes == 0: none)
  // window kernels
  int window_bn = 0;             // key block
  int window_smem = 0;
  int mb_words = 0;              // a bool mask per window as bits (0: none), words per query row
  // v3
  int v3_terms = sm90::kTermsRaw;
  int v3_tile = sm90::kV3Narrow;  // the raw path's tile (sm90::V3Tile)
  bool v3_persistent = false;
  bool v3_dynamic = false;       // ... and its CTAs take their tiles from a counter (fwd_pipelined_sm90.h)
  bool v3_kv_resident = false;   // ... and each CTA loads a head's K / V once for its query tiles (kv_resident_pays)
  int v3_stage_bytes = 0;        // the staged additive tile (kTermsRawBias)
  bool v3_o_tma = false;         // the epilogue stores O through shared memory and TMA (fwd_v3_o_via_smem)
  // decode: the keys' split and the partial rows' workspace
  int decode_splits = 1, decode_chunk = 0;
  int64_t decode_part_bytes = 0;
  bool decode_tma = false;       // sm90/fwd_decode_sm90.h (Hopper) instead of fwd_decode.h
  int block_m = 0, block_n = 0;  // the sm90 kernels' tile (0: v1's per-head-dim tile, kernel_traits.h)
  std::string why;
};

// Window-mode key block: every window's keys in one block.
inline int window_key_block(int dk, int sk) {
  if (dk == 64) return sk <= 64 ? 64 : 0;
  return sk <= 64 ? 64 : sk <= 128 ? 128 : sk <= 160 ? 160 : sk <= 256 ? 256 : 0;
}
template <typename F>
void dispatch_window_tiles(int dk, int bn, F&& f) {
  if (dk == 64) {
    f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{});
    return;
  }
  switch (bn) {
    case 64: f(std::integral_constant<int, 32>{}, std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 32>{}, std::integral_constant<int, 128>{}); break;
    case 160: f(std::integral_constant<int, 32>{}, std::integral_constant<int, 160>{}); break;
    default: f(std::integral_constant<int, 32>{}, std::integral_constant<int, 256>{}); break;
  }
}

// The window forward (sm90/fwd_windows_sm90.h): every window's keys fit one key block, queries in 64-row tiles,
// the additive term repeating with a period that divides B (windows grouped by it), the term table in shared
// memory. Returns "" when it takes the call (c filled), else why not.
inline std::string try_fwd_windows(FwdChoice& c, const FwdParams& fp, const KParams& user, const DeviceCaps& dev) {
  KParams p = user;
  CombPlan comb;
  if (fp.rel_table) {  // the table term gathered into an fp16 [P, H, Sq, Skp] tile
    comb = table_plan_of(fp, p.H, 0);
    use_comb(p, comb);
  }
  const int bn = window_key_block(c.dk, p.Sk);
  if (!dev.sm90a) return "not Hopper / no sm_90a code";
  if ((c.dk != 32 && c.dk != 64) || bn == 0 || p.Sq > 256 || p.Sk == 0)
    return "head dim > 64 or window past its key block";
  if (p.mask.ptr) {  // a bool mask broadcast over the windows folds into the fp16 term
    const int P = mask_fold_period(fp, p);
    if (P) {
      comb = comb_plan_of(fp, P, p.H, 0);
      comb.mask = true;
      use_comb(p, comb);
      p.mask = Operand4d{};
      p.term_hides = true;
    }
  }
  const int period = p.bias.ptr ? p.bias.period : 1;
  if (p.B % period != 0) return "the term's period does not divide the batch";
  if (p.bias.ptr) choose_bias_mode(p, bn);
  int mb_words = 0;
  if (p.mask.ptr && bn > 64 && !p.has_band) {  // a mask per window: bits, whole 16-byte rows for the TMA box
    mb_words = (div_up(p.Sk, 32) + 3) / 4 * 4;
    p.mb_period = p.mask.period;
    p.mb_heads = p.mask.heads;
    p.mb_rows = p.Sq;
    p.mask = Operand4d{};
    p.mbits = static_cast<const uint32_t*>(kWorkspaceTerm);
    p.mb_words = mb_words;
  }
  const int bits_smem = mb_words ? 128 + 2 * 64 * mb_words * 4 : 0;  // (alignment, two stages' boxes)
  std::string no;
  int smem = 0;
  dispatch_window_tiles(c.dk, bn, [&](auto d, auto n) {
    using Tr = typename sm90::FwdWindowTraitsSm90For<decltype(d)::value, decltype(n)::value>::type;
    const bool table_terms = p.mask.ptr == nullptr && !p.has_band;
    if (!Tr::kGeneralTerms && !table_terms) no = "a mask or band the wide tiles cannot read";
    if (Tr::kHalfTerms && p.bias.ptr && p.bias.dtype != 0 && !recast_bf16_term(fp, p))
      no = "a term the fp16 table cannot hold";
    smem = Tr::kSmemBytes + (p.bias.ptr && !sm90::window_term_aliased<Tr>(p) ? Tr::kBlockM * p.bias_pitch : 0) +
           bits_smem;
  });
  if (!no.empty()) return no;
  if (smem > dev.smem_optin) return "shared memory";
  if (bn > 160 && p.bias.ptr && p.bias.dtype != 0) {  // the fp16 table past 160 keys: a bf16 term recast
    comb = comb_plan_of(fp, int(fp.bias.period), p.H, 0);
    use_comb(p, comb);
    choose_bias_mode(p, bn);  // (the same 16-bit pitch: the shared memory above still holds)
  }
  c.kernel = FwdKernel::kWindows;
  c.p = p;
  c.comb = comb;
  c.window_bn = bn;
  c.window_smem = smem;
  c.mb_words = mb_words;
  c.block_m = 64;
  c.block_n = bn;
  return "";
}

// Forward v3's tile, term path and schedule.
constexpr int kShortMaxKeys = 128;  // one short key block per tile up to here (try_fwd_v3_for: fwd_v3_short)
// The two-CTA tile (head dim 64, no term) past kShortMaxKeys. H200 kernel time against the narrow tile (RESULTS
// v4.0, v4.1): ViT-B/16 (197 keys) 0.147 -> 0.113 ms, EVA-02-B (257) 0.244 -> 0.190: an SM does 1.3x the work with
// two CTAs, taken whatever the batch. Past kTwoCtasAnyBatchMaxKeys the gain per SM is 4-18% (ViT-B/16-384's 577 keys
// 0.276 -> 0.257, CLIP-L-336 0.702 -> 0.648, ViT-B/8's 785 0.245 -> 0.218, EVA-02-448's 1025 0.197 -> 0.190), which
// the coarser waves of the persistent grid (two CTAs per SM walk the tiles in step) lose on a call of few tiles:
// SDXL's 1024 keys, 640 tiles on 132 SMs, 0.060 -> 0.075. There the tile needs kTwoCtasMinTilesPerSm tiles per SM.
// SD 1.5's cross-attention to 77 keys stays on the short tile (0.056 vs 0.059).
constexpr int kTwoCtasAnyBatchMaxKeys = 320;
constexpr int kTwoCtasMaxKeys = 1088;  // measured to 1025 keys; 1088 has the same 17 key blocks of 64
constexpr int kTwoCtasMinTilesPerSm = 8;
inline bool two_ctas_pay(const KParams& p, const DeviceCaps& dev) {
  if (p.Sk <= kShortMaxKeys || p.Sk > kTwoCtasMaxKeys) return false;
  const long tiles = long(div_up(p.Sq, 128)) * p.H * p.B;
  return p.Sk <= kTwoCtasAnyBatchMaxKeys || tiles >= long(kTwoCtasMinTilesPerSm) * dev.sms;
}
// The 192-row tile (head dim 64, no term): three consumer warpgroups, two softmaxes beside the third one's GEMMs
// (FA3 / FA4's tile there). H200 kernel time against the table's tile before it (RESULTS v4.3): D = 64 S = 16k
// 4.83 -> 4.21 ms (the wide tile), CogVideoX-2B's 17776 tokens 5.11 -> 4.84, SDXL's 4096 0.396 -> 0.352 (narrow);
// ViT-B/16's 197 0.094 -> 0.137 and ViT-B/16-384's 577 0.225 -> 0.244 (the two-CTA tile) slower. Taken without a
// band or key padding (unmeasured) from kRows192MinLen queries and keys, the shortest measured.
// At head dims 33-48 (the 48 instance) and 65-96 (the 96 one, P through shared memory: kernel_traits_sm90.h; RESULTS
// "Twenty-first session": PixArt-alpha's 4096 tokens at 72 0.954 -> 0.750 ms,
// SD 1.5's at 40 0.668 -> 0.522, DiT-XL/2-512's 1024 at 72 0.278 -> 0.241) from kRows192OtherMinLen queries and keys
// with kRows192MinTilesPerSm tiles of 192 rows per SM: SD 1.5's 1024 tokens at 80 (2.9 per SM) 0.057 -> 0.060 and
// DiT-XL/2-256 (a third of the rows padding) 0.107 -> 0.130 were slower.
constexpr int kRows192MinLen = 4096;
constexpr int kRows192OtherMinLen = 1024;
constexpr int kRows192MinTilesPerSm = 8;
inline bool rows192_pays(const KParams& p, const DeviceCaps& dev) {
  if (p.has_band || p.kp != nullptr || p.D <= 32 || p.D > 96) return false;
  if (p.D > 48 && p.D <= 64) return p.Sq >= kRows192MinLen && p.Sk >= kRows192MinLen;
  const long tiles = long(div_up(p.Sq, 192)) * p.H * p.B;
  return p.Sq >= kRows192OtherMinLen && p.Sk >= kRows192OtherMinLen && tiles >= long(kRows192MinTilesPerSm) * dev.sms;
}
// The 192-row tile at the 48 and 80 instances (head dims 33-48, 65-80) runs one CTA per tile, not the strided
// persistent grid: H100 forward kernel time, WINATTN_FORCE_KERNEL=fwd_v3_per_tile beside the table's choice in one
// process (RESULTS v5.9, four to six runs each): DiT-XL/2-512 (72) 0.261 -> 0.249 ms, PixArt-alpha's 4096 tokens
// (72) 0.808 -> 0.767, SD 1.5's 4096 (40) 0.558 -> 0.548. At 64 (D = 64 S = 16k: 4.17 -> 4.15, within the spread)
// and at 96 (unmeasured) the tile keeps the grid it was measured with. Both grids run the same kernel: the per-tile
// one gives each CTA one turn of its tile loop.
inline bool rows192_per_tile_pays(int dk, int tile) { return tile == sm90::kV3Rows192 && (dk == 48 || dk == 80); }
// Streamed 128-key tiles (consume_stream: the next tile's first Q K^T beside this one's last P V) for a short key set
// at head dims 65-128 without a band or key padding: with the epilogue's O stored by TMA (v4.8) a tile of up to four
// key blocks spends a large share at its boundaries, which streaming overlaps. H100 kernel time against the narrow
// tile (RESULTS v4.8): Wan 2.1's cross-attention (512 keys, 128) 0.225 -> 0.207 ms forced in one process, 0.225 /
// 0.214 -> 0.218 / 0.212 as the table's choice in two rounds of another; DiT-XL/2-256 (256 keys, 72 on the 96
// instance) 0.117 -> 0.114, 0.118 / 0.117 -> 0.115 / 0.115; slower from eight blocks on (SD 1.5's 1024 tokens at 80
// 0.056 -> 0.061, SDXL's at 64 0.059 -> 0.064, Flux 0.400 -> 0.439). Head dim 64 keeps the two-CTA tile there.
constexpr int kStreamMaxKeys = 512;
inline bool stream_pays(const KParams& p) {
  return p.D > 64 && p.D <= 128 && p.Sk > kShortMaxKeys && p.Sk <= kStreamMaxKeys && !p.has_band && p.kp == nullptr;
}
// K / V resident across a head's query tiles (fwd_pipelined_sm90.h FwdPipeParams::kv_reuse): each CTA of the strided
// persistent grid walks one head's query tiles in turn, and its producer loads the head's K / V once and hands the
// stages over again for the next query tile. It needs every tile's key blocks to fill the stages exactly, in the
// same order (the streamed no-term tile, no band, ceil(Sk / BN) = stages: 129-256 keys), and it pays where a head
// has several query tiles whose K / V would otherwise come from L2 once per tile. H100 kernel time (RESULTS v5.8):
// DiT-XL/2-256 (256 keys, 2 query tiles per head) forward 0.116 -> 0.089 ms (cuDNN 0.086), f+b 0.475 -> 0.454;
// the other rows of its call unchanged (DiT-XL/2-512, PixArt's cross-attention, SD 1.5's at 1024 tokens).
inline bool kv_resident_pays(const KParams& p, int terms, int tile, bool strided, int bm, int bn, int stages) {
  return terms == sm90::kTermsRaw && tile == sm90::kV3Stream && strided && !p.has_band &&
         div_up(p.Sk, bn) == stages && div_up(p.Sq, bm) > 1;
}
// Whether every query tile of bm rows sees a key (block_info.h n_block_range non-empty). Row i sees keys
// [i + band_lo, i + band_hi] within [0, Sk); the rows that see one form one run, so checking the first tile's last
// row and the last tile's first row covers the tiles between.
inline bool no_empty_tiles(const KParams& p, int bm) {
  if (!p.has_band) return true;
  const int64_t first_last_row = std::min<int64_t>(bm, p.Sq) - 1, last_first_row = int64_t(div_up(p.Sq, bm) - 1) * bm;
  return p.band_lo <= p.band_hi && first_last_row + p.band_hi >= 0 && last_first_row + p.band_lo <= p.Sk - 1;
}
constexpr int kWideMinKeys = 8192;  // wide key blocks pay off on long key sequences only (H200 bf16: D=128 S=16k
// 3.48 vs 3.61 ms, D=64 2.44 vs 2.53, Wan S=32760 10.76 vs 10.90; but Flux S=4608 0.429 vs 0.414 and Qwen S=4352
// 0.790 vs 0.778, where the last 176-key block is mostly padding); not with a causal / sliding-window band, where
// 128 x 128 measured faster (forward kernel time, RESULTS v5.1: Llama-3 prefill -7% and Mistral's window -6% on the
// H200, Mistral -6% on the H100; causal D = 128 16k within the spread)
template <int D>
std::string try_fwd_v3_for(FwdChoice& c, const FwdParams& fp, const KParams& user, const DeviceCaps& dev,
                           const Forced& force) {
  using Tiles = sm90::FwdV3Tiles<D>;
  using Narrow = typename Tiles::Narrow;
  using Wide = typename Tiles::Wide;
  using Keys80 = typename Tiles::Keys80;
  using Keys128 = typename Tiles::Keys128;
  using Keys208 = typename Tiles::Keys208;
  using Stream = typename Tiles::Stream;
  using TwoCtas = typename Tiles::TwoCtas;
  using Rows192 = typename Tiles::Rows192;
  using Ragged = typename Tiles::Ragged;
  const int dt = dtype_code(fp.dtype);
  KParams p = user;
  CombPlan comb;
  // A bool mask per score and no additive term (document masks, per-head masks): the mask as bits, 1/16 of the
  // bytes of it folded into a -inf term (T5-shaped [B, H, S, S] forward: the fold 0.34 ms, cuDNN 0.15 with the mask
  // given as its additive tensor: RESULTS v3.8). With an additive term the mask folds into it (one staged tile). A
  // mask broadcast over the queries ([B or 1, H, 1, Sk]: per-head token dropping) is one row of bits.
  const Operand4d& m = p.mask;
  // whole key blocks (load_mask_bits reads BN / 32 words per block: 96-key blocks at head dims 160 / 192 pass
  // ceil(Sk / 32) words) in whole 16-byte rows (it reads 16 bytes at a time where BN is a multiple of 128)
  const int bits_words = (div_up(p.Sk, Narrow::kBlockN) * (Narrow::kBlockN / 32) + 3) / 4 * 4;
  const int bits_rows = m.rows == 1 ? 1 : p.Sq;
  if (m.ptr != nullptr && p.Sq > 1 && p.bias.ptr == nullptr && fp.rel_table == nullptr && p.scale > 0.f &&
      Narrow::kBlockN % 32 == 0 && int64_t(bits_rows) * bits_words <= kIntCountMax) {  // (mask_bits_kernel's plane)
    c.mb_words = bits_words;
    p.mb_period = m.period;
    p.mb_heads = m.heads;
    p.mb_rows = bits_rows;
    p.mb_words = c.mb_words;
    p.mbits = static_cast<const uint32_t*>(kWorkspaceTerm);
    p.mask = Operand4d{};
  } else {
    prepare_v3_term(p, comb, fp, dt);
  }
  // Staging: a term of the input dtype with full, 16-byte aligned rows, no bool mask (the general path reads the
  // term itself), scale > 0 (the raw-score path) and room for kStages tiles next to Q / K / V.
  int stage = 0;
  if (v3_stageable(p.bias, p, dt) && p.mask.ptr == nullptr && p.scale > 0.f && Narrow::kBlockN % 64 == 0) {
    const int bytes = Narrow::kBlockM * Narrow::kBlockN * 2;
    if (sm90::fwd_v3_smem<Narrow>(sm90::kTermsRawBias, bytes) <= dev.smem_optin) stage = bytes;
  }
  // Streamed tiles (FwdPipeStreamTilesSm90, consume_stream: one loop over a CTA's key blocks across its tiles).
  // fwd_v3_short: one key block sized to a short key set (the raw path takes every short tile; the row term and the
  // mask bits the 128-key one: whole 32-key words, Sk <= 128). The table takes it up to 128 keys (H200 kernel time,
  // benchmarks/kernel_time.py: SD 1.5 cross-attention to 77 tokens 0.057 vs 0.079 ms, SDXL 0.038 vs 0.055; PixArt's
  // 120 and the row / bits rows at or above the narrow tile, RESULTS v3.9). The 208-key tile stays forced only:
  // ViT-B/16 (197 keys) 0.140 ms against the narrow tile's 0.148 and the two-CTA tile's 0.114 (RESULTS v4.0).
  // fwd_v3_stream (128-key blocks for any key set): the table's for 129-512 keys at head dims 65-128 (stream_pays);
  // slower on longer key sets: Flux 0.442 vs 0.416 ms, SD 1.5 32x32 0.061 vs 0.057 (v3.9).
  const bool keys128 = !std::is_same<Keys128, Narrow>::value && p.Sk <= Keys128::kBlockN;
  const int short_tile = !std::is_same<Keys80, Narrow>::value && p.Sk <= Keys80::kBlockN     ? sm90::kV3Keys80
                         : keys128                                                           ? sm90::kV3Keys128
                         : !std::is_same<Keys208, Narrow>::value && p.Sk <= Keys208::kBlockN ? sm90::kV3Keys208
                                                                                             : sm90::kV3Narrow;
  const bool want_short = force.v3_tile == 3 || (force.v3_tile == 0 && p.Sk <= kShortMaxKeys);
  // (the table's up to head dim 64, where it was measured; the 96 instance's 32-key tile is forced only)
  const bool raw_two_ctas = !std::is_same<TwoCtas, Narrow>::value &&
                            (force.v3_tile == 5 || force.v3_tile == 7 ||
                             (force.v3_tile == 0 && D <= 64 && two_ctas_pay(p, dev)));
  // The ragged tile where the table takes the two-CTA one and the key set ends inside a block (RESULTS "Twenty-first
  // session": ViT-B/16 0.094 -> 0.090 ms, EVA-02-B 0.157 -> 0.152; BEiT-B/16 with its bias 0.150 -> 0.115); not with
  // key padding (unmeasured there)
  const bool ragged = !std::is_same<Ragged, Narrow>::value &&
                      (force.v3_tile == 7 || (force.v3_tile == 0 && p.Sk % Ragged::kBlockN != 0 && p.kp == nullptr));
  // (fwd_v3_two_ctas forced keeps the plain tile: force 5 is neither 7 nor 0)
  const int two_ctas_tile = ragged ? sm90::kV3TwoCtasRagged : sm90::kV3TwoCtas;
  const bool padding_alone = p.kp != nullptr && p.bias.ptr == nullptr && p.mask.ptr == nullptr && p.scale > 0.f;
  int tile = sm90::kV3Narrow;
  if (c.mb_words > 0) {
    c.v3_terms = sm90::kTermsRawBits;
    if (want_short && keys128) tile = sm90::kV3Keys128;
  } else if (stage > 0) {
    // key padding beside the tile: staged as bits by the row warp (T5-shaped bias + padding: RESULTS v4.2), not
    // voted on per block from global memory (kept so with a folded mask: that instance has no row warp)
    c.v3_terms = p.term_hides                                        ? sm90::kTermsRawBiasMasked
                 : p.kp != nullptr && sm90::fwd_v3_stages_padding(D) ? sm90::kTermsRawBiasPadded
                                                                     : sm90::kTermsRawBias;
    // the two-CTA tile with the term staged beside its 64-key blocks where two_ctas_pay holds, so that a short
    // call with a bias shared over a large batch gets what the no-term path got from two CTAs per SM (RESULTS
    // "Twenty-first session": BEiT-L inference 0.360 -> 0.298 ms, T5-base 0.133 -> 0.115; ragged for BEiT's 197
    // keys, 0.150 -> 0.115)
    const int two_ctas_stage = TwoCtas::kBlockM * TwoCtas::kBlockN * 2;
    const bool staged_two_ctas =
        force.v3_tile == 5 || force.v3_tile == 7 || (force.v3_tile == 0 && two_ctas_pay(p, dev));
    if (staged_two_ctas && c.v3_terms == sm90::kTermsRawBias &&
        sm90::fwd_v3_two_ctas_stage_term(D) &&
        sm90::fwd_v3_smem<TwoCtas>(sm90::kTermsRawBias, two_ctas_stage) <= dev.smem_optin / TwoCtas::kMinBlocks) {
      tile = two_ctas_tile;
      stage = two_ctas_stage;
    }
  } else if (row_term(p.bias, p) && p.mask.ptr == nullptr && p.scale > 0.f && !p.term_hides) {
    c.v3_terms = p.kp != nullptr ? sm90::kTermsRawRowPadded : sm90::kTermsRawRow;
    if (want_short && keys128) tile = sm90::kV3Keys128;
  } else if (padding_alone && (want_short ? short_tile == sm90::kV3Keys128
                                          : force.v3_tile == 0 && p.Sk < kWideMinKeys && !raw_two_ctas && D <= 128)) {
    // key padding alone, staged as bits by the row warp where the raw path would take the narrow or the 128-key
    // tile, instead of a warp vote per block (a global load after every Q K^T) and a per-column test where padding
    // is: PixArt's 120 T5 tokens, every tile one block holding padding, 0.093 -> 0.074 ms (RESULTS v4.1); Qwen-Image
    // 0.826 -> 0.785 (RESULTS v4.2). Up to 80 keys the 80-key tile has no row path (whole 32-key words); the wide
    // and the two-CTA tiles keep the vote (the row warp's registers come from the consumers'), and so do head dims
    // past 128, where it is unmeasured (at 256 the row warp spills 128 bytes).
    c.v3_terms = sm90::kTermsRawRowPadded;
    if (want_short) tile = sm90::kV3Keys128;
  } else if (p.bias.ptr != nullptr || p.mask.ptr != nullptr || !(p.scale > 0.f)) {
    c.v3_terms = sm90::kTermsGeneral;
  } else {
    c.v3_terms = sm90::kTermsRaw;
    if (want_short)
      tile = short_tile;
    else if (!std::is_same<Stream, Narrow>::value && (force.v3_tile == 4 || (force.v3_tile == 0 && stream_pays(p))))
      tile = sm90::kV3Stream;
    else if (raw_two_ctas)
      tile = two_ctas_tile;
    else if (!std::is_same<Rows192, Narrow>::value && (force.v3_tile ? force.v3_tile == 6 : rows192_pays(p, dev)))
      tile = sm90::kV3Rows192;
    else if (!std::is_same<Wide, Narrow>::value &&
             (force.v3_tile ? force.v3_tile == 2 : p.Sk >= kWideMinKeys && !p.has_band))
      tile = sm90::kV3Wide;
  }
  if (force.v3_tile == 2 && tile != sm90::kV3Wide)
    return "fwd_v3_wide: wide key blocks take the no-term path at head dims 33-64 and 97-128";
  if (force.v3_tile == 4 && tile != sm90::kV3Stream)
    return "fwd_v3_stream: streamed tiles take the no-term path at head dims 64, 96 and 128";
  if (force.v3_tile == 5 && tile != sm90::kV3TwoCtas)
    return "fwd_v3_two_ctas: the two-CTA tile takes the no-term path at head dims 33-64 and 65-96, and a staged "
           "16-bit term without padding or mask at 64";
  if (force.v3_tile == 7 && tile != sm90::kV3TwoCtasRagged)
    return "fwd_v3_ragged: the two-CTA tile with a ragged last key block takes the no-term path and a staged 16-bit "
           "term without padding or mask at head dims 49-64";
  if (force.v3_tile == 6 && tile != sm90::kV3Rows192)
    return "fwd_v3_rows192: the 192-row tile takes the no-term path at head dims 33-64 and 65-96";
  if (force.v3_tile == 3 && tile != sm90::kV3Keys80 && tile != sm90::kV3Keys128 && tile != sm90::kV3Keys208)
    return "fwd_v3_short: short key blocks take no term, a row term or mask bits (Sk <= 128; no term: Sk <= 208) at "
           "head dim 64, and Sk <= 128 at 96";
  // Persistent (one CTA per SM walks the tiles, its epilogue overlapping the next tile's loads): strided where every
  // tile has the same work (H200 bf16 Qwen key padding 0.790 vs 0.852 ms, D=128 S=16k 3.48 vs 3.55 ms, against one
  // CTA per tile). With a causal / sliding-window band the strided assignment is unbalanced (causal D=128 S=16k 2.50
  // vs 1.65 ms), and one CTA per tile, longest first, dispatched by the hardware, pays each CTA's start and its
  // epilogue once per tile (~2% of a 128-block tile: the dense row's gain above; band tiles are shorter): so band
  // calls take the dynamic schedule, each CTA's producer taking the next tile from a counter as its loads run out
  // (H100 forward kernel time, RESULTS v5.6: Llama-3 prefill -3.7% alone, +0.3% inside the forward + backward, -1.3%
  // in the matrix; Mistral's window -0.9 to -1.7%; causal D = 128 16k unchanged; the strided grid read 1-5% slower
  // than one CTA per tile): a small gain, kept for its balance at any tile count and as the backward's next step.
  // It has its own instances, of the no-term path's narrow tile (launch_sm90.h has_dynamic), and needs every tile
  // to see a key (the next index tells the consumers whether a later tile follows: no_empty_tiles).
  // what the launch will run (launch_sm90.h run_fwd_pipelined_sm90 takes the tile's traits from the same list)
  c.block_m = Tiles::visit(tile, [](auto tr) { return decltype(tr)::kBlockM; });
  c.block_n = Tiles::visit(tile, [](auto tr) { return decltype(tr)::kBlockN; });
  const bool dynamic_runs = c.v3_terms == sm90::kTermsRaw && tile == sm90::kV3Narrow && no_empty_tiles(p, c.block_m);
  if (force.v3_persistent == 2 && !dynamic_runs)
    return "fwd_v3_dynamic: the dynamic schedule takes the no-term path's narrow tile (no bias, mask or key "
           "padding), where every query tile sees a key";
  c.v3_persistent = force.v3_persistent >= 0 ? force.v3_persistent >= 1
                                             : (!p.has_band && !rows192_per_tile_pays(D, tile)) || dynamic_runs;
  c.v3_dynamic = force.v3_persistent >= 0 ? force.v3_persistent == 2 : p.has_band && dynamic_runs;
  c.v3_kv_resident = kv_resident_pays(p, c.v3_terms, tile, c.v3_persistent && !c.v3_dynamic, c.block_m, c.block_n,
                                      Tiles::visit(tile, [](auto tr) { return decltype(tr)::kStages; }));
  c.v3_tile = tile;
  c.v3_stage_bytes = stage;
  c.v3_o_tma = Tiles::visit(tile, [&](auto tr) { return sm90::fwd_v3_o_via_smem<decltype(tr)>(c.v3_terms); });
  c.kernel = FwdKernel::kV3;
  c.p = p;
  c.comb = comb;
  return "";
}
inline std::string try_fwd_v3(FwdChoice& c, const FwdParams& fp, const KParams& p, const DeviceCaps& dev,
                              const Forced& force) {
  if (!dev.sm90a) return "not Hopper / no sm_90a code";
  if (p.Sk == 0) return "an empty key set (a tensor map needs a nonzero extent)";
  // fwd_pipelined_sm90.h walks tiles by an int index that steps by the grid (at most the tile count) past the last
  // tile: 2^30 tiles of the smallest, 128-row, tile keep it in range
  if (int64_t(div_up(p.Sq, 128)) * p.H * p.B > kIntCountMax / 2) return "more than 2^30 query tiles";
  if (force.v3_fine_dims && v3_head_dim(p.D) == kernel_head_dim(p.D))
    return "fwd_v3_fine_dims: the 48 / 80 instances take head dims 33-48 and 65-80";
  c.dk = v3_head_dim(p.D);
  switch (c.dk) {
    case 32: return try_fwd_v3_for<32>(c, fp, p, dev, force);
    case 48: return try_fwd_v3_for<48>(c, fp, p, dev, force);
    case 64: return try_fwd_v3_for<64>(c, fp, p, dev, force);
    case 80: return try_fwd_v3_for<80>(c, fp, p, dev, force);
    case 96: return try_fwd_v3_for<96>(c, fp, p, dev, force);
    case 128: return try_fwd_v3_for<128>(c, fp, p, dev, force);
    case 160: return try_fwd_v3_for<160>(c, fp, p, dev, force);
    case 192: return try_fwd_v3_for<192>(c, fp, p, dev, force);
    default: return try_fwd_v3_for<256>(c, fp, p, dev, force);
  }
}

// Decode (fwd_decode.h): the H / Hkv x Sq rows of a KV head's query group in one CTA, at most 16 of them (one
// m16 tile); no table term. The tiled kernels give such a call one useful row in 128 (Llama-3-8B decode with batch
// 32: v3 0.755 ms against FlashAttention-4's 0.244; this kernel 0.278, RESULTS v3.7). The keys are split so that
// about kDecodeCtasPerSm CTAs per SM are launched (B x Hkv x splits, a 1-D grid: a few waves of the 1-3 CTAs an SM
// holds, 104 KB of stages each at D = 128), in chunks of whole kDecodeStep keys; the partial rows cost 4 (D + 1)
// bytes per split and row, next to 4 D bytes per key and KV head read.
// tma (the table's on Hopper; WINATTN_FORCE_KERNEL=fwd_decode_tma / fwd_decode pick one): the same call with K / V
// by TMA (sm90/fwd_decode_sm90.h, head dims 64 / 128 / 256 as fwd_decode.h), its splits sized to one wave of the CTAs
// it keeps resident (decode_tma_ctas_per_sm: its stage ring fills two CTAs' shared memory, one at head dim 256),
// rounded down: each CTA keeps ~96-192 KB of K / V in flight, so one per SM already covers the memory latency, and one
// wave of equal CTAs needs no tail. H200 kernel time (RESULTS v5.4, with v5.4's combine): Llama-3-8B decode batch 32
// 0.273 -> 0.258 ms (cuDNN 0.237), batch 1 0.023 -> 0.013 (cuDNN 0.011). It was forced only until v5.4, for
// racecheck hazards in its merge (the producer warp now leaves before it).
constexpr int kDecodeMaxRows = 16, kDecodeStep = 128, kDecodeCtasPerSm = 8;
constexpr int decode_tma_ctas_per_sm(int dk) { return dk > 128 ? 1 : 2; }
inline std::string try_fwd_decode(FwdChoice& c, const FwdParams& fp, const KParams& user, const DeviceCaps& dev,
                                  bool tma) {
  const std::string who = tma ? "fwd_decode_tma: " : "";
  if (tma && !dev.sm90a) return who + "not Hopper / no sm_90a code";
  const int64_t rows = int64_t(user.hgroup) * user.Sq;  // (int64: H / Hkv x Sq can pass 2^31)
  if (rows > kDecodeMaxRows) return who + "more than 16 query rows per KV head";
  if (fp.rel_table) return who + "a table term";
  if (user.Sk == 0) return who + "an empty key set";
  const int64_t pairs = int64_t(user.B) * user.Hkv, sms = std::max(dev.sms, 1);
  const int steps = div_up(user.Sk, kDecodeStep);
  const int64_t want_ctas = tma ? decode_tma_ctas_per_sm(c.dk) * sms : kDecodeCtasPerSm * sms;
  const int64_t per_pair = tma ? want_ctas / pairs : (want_ctas + pairs - 1) / pairs;
  const int want = int(std::min<int64_t>(std::max<int64_t>(per_pair, 1), steps));
  const int chunk = div_up(steps, want) * kDecodeStep, splits = div_up(user.Sk, chunk);
  if (splits * pairs > kIntCountMax) return who + "more than 2^31 - 1 CTAs (one per split, KV head and item)";
  c.kernel = FwdKernel::kDecode;
  c.decode_tma = tma;
  c.p = user;
  c.decode_chunk = chunk;
  c.decode_splits = splits;
  const int64_t part_rows = int64_t(c.decode_splits) * user.B * user.H * user.Sq;  // fp32 o [D] + lse per row
  c.decode_part_bytes = c.decode_splits > 1 ? part_rows * (user.D + 1) * 4 : 0;
  c.block_m = c.block_n = 0;
  return "";
}

inline void fwd_v1(FwdChoice& c, const FwdParams& fp, const KParams& user) {
  c.kernel = FwdKernel::kV1;
  c.dk = kernel_head_dim(user.D);  // (v3 may have set its own instance before it declined)
  c.p = user;
  c.block_m = c.block_n = 0;
  if (fp.rel_table) {  // the table term (+ bias) gathered into an fp16 tile
    c.comb = table_plan_of(fp, user.H, 0);
    use_comb(c.p, c.comb);
  }
}

// The forward table, in order: the first kernel that takes the call runs it (or the forced one, which must).
inline FwdChoice choose_fwd(const FwdParams& fp, const KParams& call, const DeviceCaps& dev, const Forced& force) {
  KParams user = call;
  mask_as_key_padding(user);
  FwdChoice c;
  c.dk = kernel_head_dim(user.D);
  auto forced = [&](const std::string& why_not) { require_forced(name_of(force.fwd), why_not); };
  switch (force.fwd) {
    case FwdKernel::kV1: fwd_v1(c, fp, user); c.why = "forced"; return c;
    case FwdKernel::kV3: forced(try_fwd_v3(c, fp, user, dev, force)); c.why = "forced"; return c;
    case FwdKernel::kWindows: forced(try_fwd_windows(c, fp, user, dev)); c.why = "forced"; return c;
    case FwdKernel::kDecode: forced(try_fwd_decode(c, fp, user, dev, force.decode_tma)); c.why = "forced"; return c;
    default: break;
  }
  // 1. A few query rows per KV head (decode), every architecture: the keys split over CTAs. Before the window
  // kernels, which would give each such row a 64-row query tile of its own.
  if (try_fwd_decode(c, fp, user, dev, dev.sm90a).empty()) {  // (K / V by TMA on Hopper)
    c.why = "decode";
    return c;
  }
  // 2. Short windows, many per CTA (Swin): the window kernels (W7: 0.29 ms against v3's ~1 ms, RESULTS v3.x).
  if (try_fwd_windows(c, fp, user, dev).empty()) {
    c.why = "windows: every window in one key block";
    return c;
  }
  // 3. Everything else on Hopper: v3, with every score term.
  const std::string v3_no = try_fwd_v3(c, fp, user, dev, force);
  if (v3_no.empty()) {
    c.why = "v3";
    return c;
  }
  // 4. v1 everywhere else: other architectures, and on Hopper the empty key sets (v3 cannot map them; out = 0,
  // lse = -inf: nothing to be fast at, so the v2 forward that ran them without a term was retired, issue 31) and
  // calls past v3's tile count.
  fwd_v1(c, fp, user);
  c.why = dev.sm90a ? "v1 (v3: " + v3_no + ")" : "not Hopper";
  return c;
}

// ---- backward -------------------------------------------------------------------------------------------------
struct BwdChoice {
  BwdKernel kernel = BwdKernel::kV1;
  int dk = 32;
  KParams p;          // the kernels' view
  CombPlan comb;      // the prepared term
  BwdV3Buffers v3;    // bwd_v3: the dbias route, terms, pipeline
  int wide = 0;       // bwd_windows_wide: its window instance (128, 144, 256)
  int mb_words = 0;   // bwd_windows_wide, bwd_v3_bits: a bool mask as transposed bits (words per key row)
  int window_smem = 0;
  int block_m = 0, block_n = 0;
  std::string why;
};

// What the backward's gradients ask of the kernel.
struct BwdNeeds {
  bool dbias = false, dtable = false;
  bool dbias_store = false;  // dbias with one contributor per element: [B, H, Sq, Sk]
  bool wants_accum = false;  // a gradient summed over items: the table's, or a dbias broadcast over them
};
inline BwdNeeds bwd_needs(const BwdParams& bp, const KParams& p) {
  BwdNeeds n;
  n.dbias = bp.dbias != nullptr;
  n.dtable = bp.dtable != nullptr;
  const Broadcast4d& b = bp.bias;
  n.dbias_store = n.dbias && b.rows == p.Sq && b.cols == p.Sk && b.period == p.B && b.heads == p.H;
  n.wants_accum = n.dtable || (n.dbias && !n.dbias_store);
  return n;
}

// The 64-token window backward (sm90/bwd_windows_sm90.h): head dim 32, every window one 64 x 64 tile, no GQA, the
// term's period dividing B, no per-item dbias (that one is stored per window by v1).
inline std::string try_bwd_windows(BwdChoice& c, const BwdParams& bp, const KParams& user, const BwdNeeds& n,
                                   const DeviceCaps& dev) {
  KParams p = user;
  CombPlan comb;
  if (bp.rel_table) {
    comb = table_plan_of(bp, p.H, 0);
    use_comb(p, comb);
  }
  if (!dev.sm90a) return "not Hopper / no sm_90a code";
  if (c.dk != 32 || p.Sq > 64 || p.Sk > 64 || p.H != p.Hkv || n.dbias_store)
    return "head dim > 32, windows past 64 tokens, GQA or a dbias per item";
  const int period = p.bias.ptr ? p.bias.period : 1;
  if (p.B % period != 0) return "the term's period does not divide the batch";
  using Tr = sm90::BwdWindowTraitsSm90For<32>::type;
  if (p.bias.ptr) choose_bias_mode(p, 64);
  const int smem = Tr::kSmemBytes + (p.bias.ptr && !sm90::window_term_aliased<Tr>(p) ? 64 * p.bias_pitch : 0);
  if (smem > dev.smem_optin) return "shared memory";
  c.kernel = BwdKernel::kWindows;
  c.p = p;
  c.comb = comb;
  c.window_smem = smem;
  c.block_m = c.block_n = 64;
  return "";
}

// Wide windows (sm90/bwd_windows_wide_sm90.h): head dim 32, 64 < max(Sq, Sk) <= 256, no GQA, an fp16 term (the
// table's, or a bf16 one recast) with its period dividing B, key padding and per-window masks as bits, and a
// gradient summed over windows (the calls that otherwise take v1's window mode: v3 would sum them with unordered
// L2 reduce-adds). Windows of more than 144 tokens take the split instance (a cluster of four CTAs per window).
inline std::string try_bwd_wide(BwdChoice& c, const BwdParams& bp, const KParams& user, const BwdNeeds& n,
                                const DeviceCaps& dev) {
  KParams p = user;
  CombPlan comb;
  if (bp.rel_table) {
    comb = table_plan_of(bp, p.H, 0);
    use_comb(p, comb);
  }
  if (p.mask.ptr) {
    const int P = mask_fold_period(bp, p);
    if (P) {
      comb = comb_plan_of(bp, P, p.H, 0);
      comb.mask = true;
      use_comb(p, comb);
      p.mask = Operand4d{};
      p.term_hides = true;
    }
  }
  const int nt = std::max(p.Sq, p.Sk);
  if (!dev.sm90a) return "not Hopper / no sm_90a code";
  if (c.dk != 32 || nt <= 64 || nt > 256 || p.H != p.Hkv || n.dbias_store || !n.wants_accum)
    return "head dim > 32, window size, GQA, or no gradient summed over windows";
  if (p.bias.ptr == nullptr || (p.bias.dtype != 0 && !recast_bf16_term(bp, p)) || p.has_band)
    return "no fp16 / bf16 term broadcast over the windows, or a band";
  if (p.B % p.bias.period != 0) return "the term's period does not divide the batch";
  const int wide = nt <= 128 ? 128 : nt <= 144 ? 144 : 256;
  int smem = wide == 128   ? sm90::BwdWideWindowTraitsSm90For<128>::type::kSmemBytes
             : wide == 144 ? sm90::BwdWideWindowTraitsSm90For<144>::type::kSmemBytes
                           : sm90::BwdWideWindowTraitsSm90For<256>::type::kSmemBytes;
  if (smem > dev.smem_optin) return "shared memory";
  if (wide == 256 && dev.wide_cluster_slots == 0) return "no cluster of four fits";
  if (p.mask.ptr) {  // a mask per window (not folded): transposed bits
    c.mb_words = div_up(wide, 32);
    p.mb_period = p.mask.period;
    p.mb_heads = p.mask.heads;
    p.mb_rows = p.Sk;  // (transposed: the backward's tiles are S^T)
    p.mask = Operand4d{};
    p.mbits = static_cast<const uint32_t*>(kWorkspaceTerm);
    p.mb_words = c.mb_words;
  }
  if (p.bias.dtype != 0) {  // a bf16 term recast to fp16
    comb = comb_plan_of(bp, int(bp.bias.period), p.H, 0);
    use_comb(p, comb);
  }
  c.kernel = BwdKernel::kWideWindows;
  c.p = p;
  c.comb = comb;
  c.wide = wide;
  c.window_smem = smem;
  c.block_m = c.block_n = wide;
  return "";
}

// Backward v3's shared memory with `bufs` dbias staging tiles and, in pair mode, a second K / V set.
template <typename Tr>
int bwd_v3_smem(const BwdV3Buffers& buf, int bufs) {
  int dbias = 0;
  if (buf.dbias_mode == kDbiasStore16)
    dbias = bufs * Tr::kBiasBytes + (buf.pair ? Tr::kDbiasBytes : 0);
  else if (buf.dbias_mode != kDbiasNone)
    dbias = bufs * Tr::kDbiasBytes;
  const int staged = buf.terms == kBwdTermsStaged ? Tr::kStages * Tr::kBiasBytes : 0;
  const int defer = buf.defer ? Tr::kDSBytes : 0;  // the third dS^T tile of deferred dQ
  return Tr::kSmemBytes + (buf.pair ? 2 * Tr::kKVBytes : 0) + staged + dbias + defer;
}

// v3's terms, dbias route, pair mode and pipeline depth for head-dim instance D.
template <int D>
std::string configure_bwd_v3(BwdV3Buffers& vb, const KParams& p, int dt, bool dbias16_ok, const DeviceCaps& dev,
                             const Forced& force) {
  using Tr = typename sm90::BwdPipeTraitsSm90For<D>::type;
  using Deep = typename sm90::BwdPipeTraitsSm90For<D>::deep;
  // the term: staged by TMA where it can be (the split head-dim consumer reads every term from global memory); the
  // dbias atomics live in the global-terms kernel (they cost the staged kernel registers otherwise), but for a row
  // term's gradient per key, summed in the registers of its own row instance (kBwdTermsRowKeyGrad)
  const bool key_grad = vb.dbias_mode == kDbiasAtomic && vb.dbias_rows == 1 && vb.dbias_cols == p.Sk &&
                        p.mask.ptr == nullptr && !p.term_hides && !Tr::kSplitD && row_term(p.bias, p);
  if (key_grad)
    vb.terms = kBwdTermsRowKeyGrad;
  else if (p.mask.ptr != nullptr || vb.dbias_mode == kDbiasAtomic || (p.bias.ptr != nullptr && Tr::kSplitD))
    vb.terms = kBwdTermsGlobal;
  else if (p.mbits != nullptr)
    vb.terms = kBwdTermsBits;
  else if (p.bias.ptr == nullptr)
    vb.terms = kBwdTermsNone;
  else if (v3_stageable(p.bias, p, dt))
    vb.terms = kBwdTermsStaged;
  else
    vb.terms = row_term(p.bias, p) && vb.dbias_mode == kDbiasNone ? kBwdTermsRow : kBwdTermsGlobal;
  // (the global-terms kernel checks p.term_hides itself: a branch per element is noise there)
  vb.hides = p.term_hides && (vb.terms == kBwdTermsStaged || vb.terms == kBwdTermsRow);
  // Pair mode when exactly two batches share each dbias element and no heads do, at head dim 64 (dK / dV of two
  // batches fit the registers there only): H200, dense bias [1, 16, 4096, 4096] with B = 2: 2.06 vs 2.23 ms. The
  // staged term only: the global-terms pair kernel spilled 80-89 bytes and ptxas serialized its 48 wgmma (one wait
  // each: scripts/sass_check.py), and a call whose mask stays global (the fuzz reaches it) took it.
  vb.pair = false;
  vb.dbias_bufs = 1;
  // deferred dQ wherever no dbias tile is staged (not the split head-dim consumer: it has its own schedule)
  vb.defer = !Tr::kSplitD && (vb.dbias_mode == kDbiasNone || vb.dbias_mode == kDbiasAtomic);
  if (vb.dbias_mode == kDbiasStore || vb.dbias_mode == kDbiasReduce) {
    const bool shared = vb.dbias_mode == kDbiasReduce;
    vb.pair = D == 64 && vb.terms == kBwdTermsStaged && p.B == 2 * int64_t(vb.dbias_period) &&
              vb.dbias_heads == p.H && !force.bwd_no_pair;
    if (vb.pair || !shared) vb.dbias_mode = dbias16_ok ? kDbiasStore16 : kDbiasStore;
    if (vb.pair && bwd_v3_smem<Tr>(vb, 1) > dev.smem_optin) {
      vb.pair = false;
      vb.dbias_mode = kDbiasReduce;
    }
    vb.dbias_bufs = bwd_v3_smem<Tr>(vb, 2) <= dev.smem_optin ? 2 : 1;
  }
  // no additive term: three stages (fwd_v3's data: RESULTS v3.1)
  const int deep_smem = Deep::kSmemBytes + (vb.defer && !Deep::kSplitD ? Deep::kDSBytes : 0);
  vb.deep = vb.terms == kBwdTermsNone && !force.bwd_two_stages && deep_smem <= dev.smem_optin;
  vb.smem = vb.deep ? deep_smem : bwd_v3_smem<Tr>(vb, vb.dbias_bufs);
  if (vb.smem > dev.smem_optin) return "shared memory";
  return "";
}

// Backward v3 (sm90/bwd_pipelined_sm90.h): every score term but the table's gradient (window mode, v1); with
// deterministic=True, dbias with at most two contributors per element and full rows with Sk % 4 == 0 (a two-term
// fp32 reduce-add by TMA is order-independent; more would need ordering: v1 orders them).
constexpr int kDqResidentMinCtasPerSm = 8;  // resident dQ: (batch x KV heads) CTAs per SM (measured at 11.6)
// 128 queries per backward step from this many queries (H100 backward kernel, forced: ViT-B/16-384's 577 -8%,
// ViT-B/8's 785 -5%; below, a 128-row block pads up to 64 more rows than two 64-row ones)
constexpr int kQ128MinQueries = 512;
inline std::string try_bwd_v3(BwdChoice& c, const BwdParams& bp, const KParams& user, const DeviceCaps& dev,
                              const Forced& force) {
  if (!dev.sm90a) return "not Hopper / no sm_90a code";
  if (bp.dtable != nullptr) return "the table's gradient (v3 has no ordered reduction over windows)";
  const int dt = dtype_code(bp.dtype);
  KParams p = user;
  CombPlan comb;
  // A bool mask per score without an additive term: transposed bits (a key's row of query bits: the backward's
  // tiles are S^T), 1/16 of the bytes of the mask folded into a -inf term, without the fold's pass. H200, T5-shaped
  // [B, H, S, S] mask, f+b kernel time: 0.585 ms against 0.689 folded (0.539 with the four-keys bits pass); the DiT /
  // SDXL / Llama-documents mask rows unchanged (RESULTS v3.9). bwd_v3_fold forces the fold (A/B).
  const Operand4d& m = p.mask;
  const int bits_words = (div_up(p.Sq, 32) + 3) / 4 * 4;  // (whole 16-byte rows as the forward's; 2 per query block)
  if (force.bwd_mask_bits != 0 && m.ptr != nullptr && m.rows == p.Sq && p.Sq > 1 && p.bias.ptr == nullptr &&
      bp.rel_table == nullptr && p.scale > 0.f && bwd_v3_head_dim(p.D) <= 128 &&
      int64_t(p.Sk) * bits_words <= kIntCountMax) {  // (mask_bits_kernel's plane: a key row of words per key)
    c.mb_words = bits_words;
    p.mb_period = m.period;
    p.mb_heads = m.heads;
    p.mb_rows = p.Sk;
    p.mb_words = c.mb_words;
    p.mbits = static_cast<const uint32_t*>(kWorkspaceTerm);
    p.mask = Operand4d{};
  } else {
    if (force.bwd_mask_bits == 1)
      return "bwd_v3_bits: a bool mask per score without an additive term, head dim <= 128, < 2^31 words of bits";
    prepare_v3_term(p, comb, bp, dt);
  }
  BwdV3Buffers vb;
  if (bp.dbias != nullptr) {
    const Broadcast4d& b = bp.bias;
    // Full rows go by TMA (store or reduce-add); rows of Sk % 4 != 0 fp32 elements are not 16-byte units, so those go
    // into a zero-filled copy with padded rows, unpadded after the kernel (BEiT's N = 197: per-element atomics over a
    // batch of 128 otherwise).
    const bool full = b.rows == p.Sq && b.cols == p.Sk;
    const int64_t contributors = int64_t(div_up(p.B, int(b.period))) * (p.H / int(b.heads)) *
                                 (b.rows == p.Sq ? 1 : p.Sq) * (b.cols == p.Sk ? 1 : p.Sk);
    if (bp.deterministic && (contributors > 2 || !full))
      return "deterministic dbias with more than two contributors per element";
    vb.dbias_mode = !full ? kDbiasAtomic : contributors > 1 ? kDbiasReduce : kDbiasStore;
    vb.dbias_period = int(b.period);
    vb.dbias_heads = int(b.heads);
    vb.dbias_rows = int(b.rows);
    vb.dbias_cols = int(b.cols);
    vb.dbias_padded = full && p.Sk % 4 != 0;
    vb.dbias_pitch = vb.dbias_padded ? (p.Sk + 3) / 4 * 4 : p.Sk;
  }
  // the 16-bit dbias store: dbias allocated in the bias dtype (bwd_dbias_layout), which is the input dtype, with rows
  // of whole 16-byte units (TMA)
  const bool dbias16_ok = bp.dbias != nullptr && bp.dbias_in_bias_dtype && bp.bias.dtype == bp.dtype && p.Sk % 8 == 0;
  c.dk = bwd_v3_head_dim(p.D);
  if (force.bwd_fine_dims && c.dk != 96) return "bwd_v3_fine_dims: the 96 instance takes head dims 65-96";
  std::string no;
  switch (c.dk) {
    case 64: no = configure_bwd_v3<64>(vb, p, dt, dbias16_ok, dev, force); break;
    case 96: no = configure_bwd_v3<96>(vb, p, dt, dbias16_ok, dev, force); break;
    case 128: no = configure_bwd_v3<128>(vb, p, dt, dbias16_ok, dev, force); break;
    default: no = configure_bwd_v3<256>(vb, p, dt, dbias16_ok, dev, force); break;
  }
  if (!no.empty()) return no;
  // dQ stored directly where each of its tiles has one contributor: one key block (the KV-outer CTAs are the key
  // blocks) and no band (every query block visited, none left for a zero-filled accumulator to answer): no
  // accumulator memset, no conversion pass. Cross-attention to a short text (RESULTS "Twenty-first session", f+b:
  // SD 1.5 0.221 -> 0.188 ms, SDXL 0.183 -> 0.173, SDXL with a mask 0.102 -> 0.082, PixArt's 120 padded keys 0.305
  // -> 0.274). Not the split head-dim consumer. Its kernels: the deferred ones without a term (three stages), with a
  // row term or mask bits (launch_bwd_sm90.h pick_dq_direct: the cross-attention forms, key padding included).
  const int key_blocks = div_up(p.Sk, c.dk == 256 ? 64 : 128);
  const bool direct_ok = key_blocks == 1 && !p.has_band && c.dk != 256 &&
                         (vb.deep || vb.terms == kBwdTermsRow || vb.terms == kBwdTermsBits);
  if (force.bwd_dq == kBwdDqDirect && !direct_ok)
    return "bwd_v3_dq_direct: one key block (128 keys, head dim <= 128), no causal / window band, no term but a "
           "row term or mask bits";
  // dQ resident in shared memory: a CTA per (batch, KV head) walks the key blocks in turn and sums the dQ of all its
  // group's queries on chip, fp32 [group heads][query rows][head dim] next to the deep kernel's tiles (ViT-B/16's 197
  // rows at head dim 64: 64 KB beside 132 KB): no accumulator, no memset, no adds at L2, no conversion pass;
  // deterministic by construction. The deep kernel only (no term), head dims up to 96 (at 128 its tiles take 212 KB).
  // RESULTS "Twenty-first session", f+b: ViT-B/16 0.452 -> 0.381 ms, EVA-02-B 0.710 -> 0.613, at 1536 CTAs; a CTA
  // per (batch, KV head) is few CTAs on a small call, so the table takes it from kDqResidentMinCtasPerSm per SM.
  const int64_t dq_bytes = int64_t(p.hgroup) * div_up(p.Sq, kBwdV3BlockM) * kBwdV3BlockM * c.dk * 4;
  const bool resident_ok = vb.deep && c.dk <= 96 && vb.smem + dq_bytes <= dev.smem_optin &&
                           int64_t(p.B) * p.Hkv <= kIntCountMax;
  if (force.bwd_dq == kBwdDqResident && !resident_ok)
    return "bwd_v3_dq_resident: no term, head dim <= 96, the group's dQ (heads x query rows x head dim, fp32) "
           "beside the tiles in shared memory";
  if (force.bwd_dq >= 0)
    vb.dq_mode = force.bwd_dq;
  else if (direct_ok)
    vb.dq_mode = kBwdDqDirect;
  else if (resident_ok && int64_t(p.B) * p.Hkv >= int64_t(kDqResidentMinCtasPerSm) * dev.sms)
    vb.dq_mode = kBwdDqResident;
  if (vb.dq_mode == kBwdDqResident) vb.smem += int(dq_bytes);
  // 128 queries per step at head dim 64 (FA3 / FA4's 128 x 128 there; BwdPipeTraitsSm90For<64>::q128): the step's
  // fixed cost (mbarrier and named-barrier waits, commits, the stage release, lse / delta) once per 128 queries, every
  // GEMM twice as long. The deep kernel's calls (no term) whose dQ is accumulated, not deterministic (the tickets count
  // 64-row tiles), or stored directly (one key block; the resident mode keeps 64); two stages (196 KB).
  using Q128 = sm90::BwdPipeTraitsSm90For<64>::q128;
  const int q128_smem = Q128::kSmemBytes + Q128::kDSBytes;  // (+ the third dS^T tile of deferred dQ)
  const bool q128_ok = c.dk == 64 && vb.deep && q128_smem <= dev.smem_optin &&
                       (vb.dq_mode == kBwdDqDirect || (vb.dq_mode == kBwdDqAccumulate && !bp.deterministic));
  if (force.bwd_q128 == 1 && !q128_ok)
    return "bwd_v3_q128: head dim <= 64, no term, dQ accumulated (not deterministic) or stored directly";
  if (q128_ok && force.bwd_q128 != 0 && (force.bwd_q128 == 1 || p.Sq >= kQ128MinQueries)) {
    vb.block_m = 128;
    vb.smem = q128_smem;
  }
  vb.sq_pad = div_up(p.Sq, vb.block_m) * vb.block_m;
  c.kernel = BwdKernel::kV3;
  c.p = p;
  c.comb = comb;
  c.v3 = vb;
  c.block_m = vb.block_m;
  c.block_n = c.dk == 256 ? 64 : 128;
  return "";
}

inline void bwd_v1(BwdChoice& c, const BwdParams& bp, const KParams& user) {
  c.kernel = BwdKernel::kV1;
  c.dk = kernel_head_dim(user.D);
  c.p = user;
  c.block_m = c.block_n = 0;
  if (bp.rel_table) {
    c.comb = table_plan_of(bp, user.H, 0);
    use_comb(c.p, c.comb);
  }
}

// The backward table, in order.
inline BwdChoice choose_bwd(const BwdParams& bp, const KParams& call, const DeviceCaps& dev, const Forced& force) {
  KParams user = call;
  mask_as_key_padding(user);
  BwdChoice c;
  c.dk = kernel_head_dim(user.D);
  const BwdNeeds n = bwd_needs(bp, user);
  auto forced = [&](const std::string& why_not) { require_forced(name_of(force.bwd), why_not); };
  switch (force.bwd) {
    case BwdKernel::kV1: bwd_v1(c, bp, user); c.why = "forced"; return c;
    case BwdKernel::kV3: forced(try_bwd_v3(c, bp, user, dev, force)); c.why = "forced"; return c;
    case BwdKernel::kWindows: forced(try_bwd_windows(c, bp, user, n, dev)); c.why = "forced"; return c;
    case BwdKernel::kWideWindows: forced(try_bwd_wide(c, bp, user, n, dev)); c.why = "forced"; return c;
    default: break;
  }
  // 1. Swin-shaped windows: the window kernels (W7 bwd 0.69 ms, W12 1.53 ms: RESULTS v3.5).
  if (try_bwd_windows(c, bp, user, n, dev).empty()) {
    c.why = "windows of <= 64 tokens";
    return c;
  }
  if (try_bwd_wide(c, bp, user, n, dev).empty()) {
    c.why = "windows of 65 .. 256 tokens";
    return c;
  }
  // 2. Everything else on Hopper that v3 takes.
  c = BwdChoice{};
  c.dk = kernel_head_dim(user.D);
  const std::string no = try_bwd_v3(c, bp, user, dev, force);
  if (no.empty()) {
    c.why = "v3";
    return c;
  }
  // 3. v1: other architectures, the table's gradient outside window shapes, ordered dbias reductions.
  c = BwdChoice{};
  bwd_v1(c, bp, user);
  c.why = dev.sm90a ? "v1: " + no : "not Hopper";
  return c;
}

}  // namespace cuda
}  // namespace winattn
