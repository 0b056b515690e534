// CUDA backend of window-attention: the four entry points of winattn_backend.h.
//
// Plans the launch (tile config per head dim, window-mode batching, where each gradient goes), carves the workspace
// the binding allocated, and runs: [table-term expansion] -> forward kernel, or
// [memset of accumulators] -> [table-term expansion] -> [delta] -> backward kernel -> [dQ conversion] ->
// [fixed-order reductions to dbias / dtb] -> [dtable scatter].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "aux_kernels.h"
#include "block_info.h"
#include "host_env.h"
#include "bwd_kernel.h"
#include "kernel_params.h"
#include "kernel_traits.h"
#include "launch.h"
#include "sm90/bwd_v3_api.h"
#include "sm90/kernel_traits_sm90.h"
#include "winattn_backend.h"

namespace winattn {
namespace cuda {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace cuda

namespace {
using namespace cuda;

void require(bool cond, const std::string& msg) {
  if (!cond) throw std::runtime_error("window_attention (cuda): " + msg);
}

struct DeviceInfo {
  int sms = 132, smem_optin = 101376, smem_per_sm = 102400, cc_major = 8;
};
DeviceInfo device_info() {
  static DeviceInfo cache[64];
  static bool have[64] = {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev >= 0 && dev < 64 && have[dev]) return cache[dev];
  DeviceInfo d;
  check_cuda(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev), "device attribute");
  check_cuda(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev), "device attribute");
  check_cuda(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "device attribute");
  check_cuda(cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
             "device attribute");
  if (dev >= 0 && dev < 64) {
    cache[dev] = d;
    have[dev] = true;
  }
  return d;
}

// env_int(name, fallback): host_env.h (cached per thread while the environment is unchanged; read per call before).

struct TileConfig {
  int fwd_bm, fwd_bn, fwd_smem, bwd_bm, bwd_bn, bwd_smem, bwd_ld_acc, bwd_qs;
};
template <int D>
TileConfig tile_config_for() {
  return {FwdTraits<D>::kBlockM, FwdTraits<D>::kBlockN, FwdTraits<D>::kSmemBytes, BwdTraits<D>::kBlockM,
          BwdTraits<D>::kBlockN, BwdTraits<D>::kSmemBytes, BwdTraits<D>::kLdAcc, BwdTraits<D>::kQStages};
}
TileConfig tile_config(int dk) {
  switch (dk) {
    case 32: return tile_config_for<32>();
    case 64: return tile_config_for<64>();
    case 96: return tile_config_for<96>();
    case 128: return tile_config_for<128>();
    case 160: return tile_config_for<160>();
    case 192: return tile_config_for<192>();
    default: return tile_config_for<256>();
  }
}

int dtype_code(DType t) { return t == DType::kFloat16 ? 0 : t == DType::kBFloat16 ? 1 : 2; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
void check_rows(const void* p, int64_t sb, int64_t ss, int64_t sh, const char* name) {
  require(aligned16(p) && sb % 8 == 0 && ss % 8 == 0 && sh % 8 == 0,
          std::string(name) + " must be 16-byte aligned with strides (batch, seq, head) that are multiples of 8 "
                              "elements (call .contiguous() first)");
}

Operand4d operand(const Broadcast4d& b, int Sk, bool is_mask) {
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

void fill_common(const FwdParams& fp, KParams& p) {
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
  p.scale_log2 = fp.scale * kLog2e;
  int64_t right = fp.window_right;
  if (fp.causal) right = right >= 0 ? std::min<int64_t>(right, 0) : 0;
  p.has_band = fp.window_left >= 0 || right >= 0;
  const int64_t off = int64_t(p.Sk) - p.Sq, inf = int64_t(1) << 40;
  p.band_lo = fp.window_left >= 0 ? off - fp.window_left : -inf;
  p.band_hi = right >= 0 ? off + right : inf;
}

// ---- workspace carving -----------------------------------------------------------------------------------------
struct Carver {
  int64_t size = 0;
  int64_t take(int64_t bytes) {
    const int64_t off = size;
    size += (bytes + 255) / 256 * 256;
    return off;
  }
};

// With a relative-position table the additive operand the kernels read is the combined fp16 tensor
// comb[P, H, Sq, Skp] = table term (+ bias); see combine_terms_kernel.
struct CombPlan {
  int P = 1, Skp = 0;
  int64_t bytes = 0;
  bool mask = false;  // the bool mask folded in (fold_window_mask)
};
// The fp16 [P, H, Sq, Skp] term of P periods.
CombPlan comb_plan_of(const FwdParams& fp, int P) {
  CombPlan c;
  c.P = P;
  c.Skp = int((fp.seqlen_k + 7) / 8 * 8);
  c.bytes = int64_t(c.P) * fp.heads * fp.seqlen_q * c.Skp * 2;
  return c;
}
CombPlan comb_plan(const FwdParams& fp) {
  return fp.rel_table ? comb_plan_of(fp, fp.bias.ptr ? int(fp.bias.period) : 1) : CombPlan{};
}
// A bf16 additive term recast to fp16 for the wide window kernels, whose term tables are fp16 (the forward past 160
// keys, the wide-window backward): the combine kernel without a table. Exact for the values a term takes (bf16's 8
// mantissa bits fit fp16's 10; magnitudes past 65504 saturate, -inf stays -inf, as for the table term), and small,
// since only a term broadcast over the windows (period < B) is recast. Without it such calls ran v3: H200 W12
// backward with a [1, H, N, N] bf16 bias 6.74 ms, recast 1.55 ms (benchmarks/bench_window_terms.py).
bool recast_bf16_term(const FwdParams& fp, const KParams& p) {
  return fp.rel_table == nullptr && p.bias.ptr != nullptr && p.bias.dtype == 1 && p.bias.period < p.B;
}
void use_comb(KParams& p, const CombPlan& c, const void* comb) {
  Operand4d o;
  o.ptr = comb;
  o.dtype = 0;
  o.period = c.P;
  o.heads = p.H;
  o.rows = p.Sq;
  o.cols = p.Sk;
  o.sq = c.Skp;
  o.sh = int64_t(p.Sq) * c.Skp;
  o.sb = p.H * o.sh;
  o.sk = 1;
  o.vec2 = true;
  p.bias = o;
}
// A bool mask broadcast over the windows folded into the fp16 term as -inf where it hides, so a window-shaped call
// with one takes the window kernels' term table (the wide tiles have no per-score mask read; elsewhere it is read
// per score). The term's period P is kept (the mask's must divide it; without a bias or table it is the mask's) and
// must be < B: a per-window mask would make an fp16 copy the size of the scores, so it stays a mask (the wide
// kernels read it as bits: use_mask_bits). Exact: only for 16-bit biases (recast_bf16_term's rule) or the table
// term, which is fp16 already. Returns P, 0 if not.
int mask_fold_period(const FwdParams& fp, const KParams& p) {
  if (fp.mask.ptr == nullptr || p.has_band || (fp.bias.ptr && fp.bias.dtype == DType::kFloat32 && !fp.rel_table))
    return 0;
  const int pm = int(fp.mask.period);
  const int P = fp.bias.ptr ? int(fp.bias.period) : fp.rel_table ? 1 : pm;
  return P % pm == 0 && P < p.B && p.B % P == 0 ? P : 0;
}
bool fold_window_mask(const FwdParams& fp, KParams& p, CombPlan& comb) {
  const int P = mask_fold_period(fp, p);
  if (P == 0) return false;
  comb = comb_plan_of(fp, P);
  comb.mask = true;
  use_comb(p, comb, reinterpret_cast<const void*>(uintptr_t(256)));  // (stand-in: fwd() / bwd() set the real one)
  p.mask = Operand4d{};
  return true;
}
// A bool mask per window (one fold_window_mask does not take) read by the wide window kernels as bits, in the
// order of their tiles: rows = queries for the forward, keys for the backward (mask_bits_kernel). words: per row,
// what the kernel reads (the forward's TMA box: a multiple of 4; the backward's: its window's queries / 32).
struct MaskBitsPlan {  // (the layout itself is in KParams: mb_period .. mb_words)
  bool transposed = false;
  int64_t bytes = 0;
};
void use_mask_bits(KParams& p, MaskBitsPlan& mb, bool transposed, int words) {
  mb.transposed = transposed;
  p.mb_period = p.mask.period;
  p.mb_heads = p.mask.heads;
  p.mb_rows = transposed ? p.Sk : p.Sq;
  p.mb_words = words;
  mb.bytes = int64_t(p.mb_period) * p.mb_heads * p.mb_rows * words * 4;
  p.mbits = reinterpret_cast<const uint32_t*>(uintptr_t(256));  // (stand-in: fwd() / bwd() set the real one)
  p.mask = Operand4d{};
}
void launch_mask_bits(const FwdParams& fp, KParams& p, const MaskBitsPlan& mb, uint32_t* out, cudaStream_t stream) {
  const int64_t words = mb.bytes / 4;
  const unsigned blocks = unsigned(std::min<int64_t>((words + 255) / 256, 8 * 65535));
  const Operand4d mask = operand(fp.mask, p.Sk, true);
  if (mb.transposed)
    mask_bits_kernel<true><<<blocks, 256, 0, stream>>>(out, mask, p.mb_rows, p.Sq, p.mb_words);
  else
    mask_bits_kernel<false><<<blocks, 256, 0, stream>>>(out, mask, p.mb_rows, p.Sk, p.mb_words);
  check_cuda(cudaGetLastError(), "window_attention mask bits");
  p.mbits = out;
}

void launch_combine(const FwdParams& fp, const KParams& p, const CombPlan& c, __half* comb, cudaStream_t stream) {
  const int64_t n = int64_t(p.H) * p.Sq * c.Skp;  // one period
  const dim3 grid(unsigned(std::min<int64_t>((n + 255) / 256, 65535)),
                  unsigned(std::min(ceil_div(c.P, kCombinePeriods), 65535)));
  auto launch = [&](auto idx) {
    combine_terms_kernel<decltype(idx)><<<grid, 256, 0, stream>>>(
        comb, c.P, p.H, p.Sq, p.Sk, c.Skp, fp.rel_table, fp.table_stride_r, fp.table_stride_h, fp.rel_index,
        fp.index_stride_q, fp.index_stride_k, operand(fp.bias, p.Sk, false),
        c.mask ? operand(fp.mask, p.Sk, true) : Operand4d{});
  };
  if (n + int64_t(grid.x) * 256 < (int64_t(1) << 31))  // 32-bit indices when every index and stride step fit
    launch(int32_t());
  else
    launch(int64_t());
  check_cuda(cudaGetLastError(), "window_attention table term");
}

// How the additive tile is staged (see KParams::bias_mode); returns the tile row pitch in bytes.
void choose_bias_mode(KParams& p, int block_n) {
  const Operand4d& b = p.bias;
  if (!b.ptr) return;
  const int es = b.dtype == 2 ? 4 : 2;
  auto aligned = [&](int a) {
    return reinterpret_cast<uintptr_t>(b.ptr) % a == 0 && (b.sb * es) % a == 0 && (b.sh * es) % a == 0 &&
           (b.sq * es) % a == 0;
  };
  p.bias_mode = 3;
  if (b.sk == 1 && b.cols == p.Sk) p.bias_mode = aligned(16) ? 1 : aligned(4) ? 2 : 3;
  p.bias_pitch = bias_pitch_bytes(block_n, es);
}

// Hopper (sm_90a) kernels, chosen per call when the device is compute capability 9.x, this binary holds their
// sm_90a code (built with 9.0a) and WINATTN_SM90 is not 0 (tests and benchmarks set it to 0 to run v1 on Hopper):
//   * sm90/fwd_pipelined_sm90.h: forward v3, every head dim and score term outside window mode (plan_fwd);
//   * sm90/fwd_kernel_sm90.h: the v2 forward, head dims 32..128, without an additive term, only with
//     WINATTN_FWD_V2=1 (A/B benchmarks);
//   * sm90/fwd_windows_sm90.h: window-mode forward, D = 32 windows of <= 256 keys, D = 64 of <= 64
//     (plan_fwd_windows_sm90);
//   * sm90/bwd_windows_sm90.h: window-mode backward, D = 32, <= 64 tokens (plan_bwd_windows_sm90);
//   * sm90/bwd_windows_wide_sm90.h: the same for 65 .. 256 tokens (plan_bwd_wide_sm90);
//     WINATTN_SM90_WINDOWS=0 turns the window kernels off.
// Elsewhere the v1 kernels run; both pass the same tests, so each choice is a speed decision (benchmarks/RESULTS.md).
bool has_sm90_fwd(int dk) { return dk == 32 || dk == 64 || dk == 96 || dk == 128; }
template <typename F>
void dispatch_sm90_hdim(int dk, F&& f) {
  switch (dk) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 96: f(std::integral_constant<int, 96>{}); break;
    default: f(std::integral_constant<int, 128>{}); break;
  }
}
bool hopper_kernels_ready(int dk, int dtype, const DeviceInfo& dev) {
  if (dev.cc_major != 9 || !has_sm90_fwd(dk) || env_int("WINATTN_SM90", 1) == 0) return false;
  static int ready[2][4] = {};  // 0 unknown, 1 yes, 2 no; per (dtype, head dim)
  int& r = ready[dtype == 0 ? 0 : 1][dk == 32 ? 0 : dk == 64 ? 1 : dk == 96 ? 2 : 3];
  if (r == 0) dispatch_sm90_hdim(dk, [&](auto d) { r = fwd_sm90_ready<decltype(d)::value>(dtype) ? 1 : 2; });
  return r == 1;
}
template <int D>
TileConfig sm90_fwd_tiles(TileConfig tc) {
  using Tr = typename sm90::FwdTraitsSm90For<D>::type;
  tc.fwd_bm = Tr::kBlockM;
  tc.fwd_bn = Tr::kBlockN;
  tc.fwd_smem = Tr::kSmemBytes;
  return tc;
}

template <typename F>
void dispatch_hdim(int dk, F&& f) {
  switch (dk) {
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 96: f(std::integral_constant<int, 96>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 160: f(std::integral_constant<int, 160>{}); break;
    case 192: f(std::integral_constant<int, 192>{}); break;
    default: f(std::integral_constant<int, 256>{}); break;
  }
}

// Items per CTA so that ceil(units / G) CTAs fill whole waves of `slots` resident CTAs (G <= gmax).
int waves_g(int64_t units, int64_t slots, int gmax) {
  const int64_t waves = std::max<int64_t>(1, (units + slots * gmax - 1) / (slots * gmax));
  return int(std::max<int64_t>(1, (units + slots * waves - 1) / (slots * waves)));
}

// Windows per CTA for the Hopper window kernels: `groups` = heads x Pg CTA columns, each splitting its `per_r` windows
// into NC = ceil(per_r / G) CTAs; a CTA takes ~G + kCtaSetup window times (kCtaSetup: its prologue, fitted to the
// sweep below), so the kernel takes ~ceil(groups * NC / slots) * (G + kCtaSetup); pick the NC that minimizes that
// (ties: fewer CTAs). waves_g() ignores the per-column rounding and gave Swin W7 two forward waves of G = 63 instead
// of one of G = 128 (H200 sweep: 0.361 vs 0.345 ms; backward 0.977 ms vs 0.968 at G = 86, 1.228 at G = 128).
int windows_per_cta(int per_r, int64_t groups, int64_t slots) {
  constexpr int kCtaSetup = 8;
  int best_g = per_r;
  int64_t best_cost = -1;
  for (int nc = 1; nc <= per_r; ++nc) {
    const int g = ceil_div(per_r, nc);
    if (nc > 1 && ceil_div(per_r, nc - 1) == g) continue;  // same G as a smaller NC
    const int64_t cost = (groups * nc + slots - 1) / slots * (g + kCtaSetup);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_g = g;
    }
  }
  return best_g;
}

// Grid of the Hopper window kernels: mtiles x H x Pg CTA columns (query tiles, heads, windows grouped by the term's
// period) of NC CTAs with G windows each (WINATTN_FWD_G / WINATTN_BWD_G override G). Returns the grid size. (The
// kernels order it: the window forward puts a work item's query tiles next to each other, the split wide-window
// backward its four quarters.)
int64_t window_grid(KParams& p, int period, int mtiles, int occupancy, const DeviceInfo& dev, const char* g_env) {
  const int per_r = p.B / period;
  int G = windows_per_cta(per_r, int64_t(mtiles) * p.H * period, int64_t(dev.sms) * std::max(occupancy, 1));
  G = std::max(1, std::min(env_int(g_env, G), per_r));
  p.G = G;
  p.Pg = period;
  p.NC = ceil_div(per_r, G);
  p.NR = p.NC * period;
  return int64_t(mtiles) * p.H * p.NR;
}

// Forward v3 (sm90/fwd_pipelined_sm90.h) on this device for this head dim and dtype: compute capability 9.x, the
// binary holds its sm_90a code, WINATTN_SM90 is not 0 and WINATTN_FWD_V2 (the v2 general kernel, kept for A/B
// benchmarks) is not 1.
bool fwd_v3_ready(int dk, int dtype, const DeviceInfo& dev) {
  if (dev.cc_major != 9 || env_int("WINATTN_SM90", 1) == 0 || env_int("WINATTN_FWD_V2", 0) == 1) return false;
  static int ready[2][7] = {};  // 0 unknown, 1 yes, 2 no; per (dtype, head dim)
  const int di = dk == 32 ? 0 : dk == 64 ? 1 : dk == 96 ? 2 : dk == 128 ? 3 : dk == 160 ? 4 : dk == 192 ? 5 : 6;
  int& r = ready[dtype == 0 ? 0 : 1][di];
  if (r == 0) dispatch_hdim(dk, [&](auto d) { r = fwd_pipelined_sm90_ready<decltype(d)::value>(dtype) ? 1 : 2; });
  return r == 1;
}

// ---- forward plan ----------------------------------------------------------------------------------------------
struct FwdPlan {
  KParams p;
  int dk = 32, smem = 0;
  bool v3 = false;            // Hopper forward v3 (fwd_v3_ready)
  bool sm90 = false;          // Hopper kernel (use_sm90_fwd)
  bool sm90_windows = false;  // Hopper window-mode kernel (plan_fwd_windows_sm90)
  int window_bn = 64;         // its key block
  int64_t grid = 0;
  CombPlan comb;
  MaskBitsPlan mbits;  // a bool mask per window as bits (the wide window tiles)
  int64_t ws_bytes = 0, off_comb = -1, off_mbits = -1;
};

// Window mode on Hopper (sm90/fwd_windows_sm90.h): every window's keys fit one key block (D = 32: up to 256 keys,
// D = 64: up to 64), its queries are split in 64-row tiles, and the additive term, if any, repeats with a period that
// divides B, so grouping windows by b % period (Pg) gives each CTA one tile of it. Key blocks past 160 keep the term
// table in fp16, which holds only an fp16 term exactly: a bf16 term broadcast over the windows is recast to fp16
// first (recast_bf16_term), other dtypes take v3 there.
int window_key_block(int dk, int sk) {
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
bool plan_fwd_window_tiles(FwdPlan& pl, const FwdParams& fp, const DeviceInfo& dev, int dt) {
  KParams& p = pl.p;
  const int bn = window_key_block(pl.dk, p.Sk);
  if (!pl.sm90 || (pl.dk != 32 && pl.dk != 64) || bn == 0 || p.Sq > 256 || p.Sk == 0 ||
      env_int("WINATTN_SM90_WINDOWS", 1) == 0)
    return false;
  const int period = p.bias.ptr ? p.bias.period : 1;
  if (p.B % period != 0) return false;
  if (p.bias.ptr) choose_bias_mode(p, bn);
  // a mask per window (not folded): bits staged with each window, whole 16-byte rows for its TMA box
  if (p.mask.ptr && bn > 64 && !p.has_band) use_mask_bits(p, pl.mbits, false, (ceil_div(p.Sk, 32) + 3) / 4 * 4);
  const int bits_smem = p.mbits ? 128 + 2 * 64 * p.mb_words * 4 : 0;  // (alignment, two stages' boxes)
  int smem = 0, occ = 1;
  bool ok = true;
  dispatch_window_tiles(pl.dk, bn, [&](auto d, auto n) {
    using Tr = typename sm90::FwdWindowTraitsSm90For<decltype(d)::value, decltype(n)::value>::type;
    const bool aliased = sm90::window_term_aliased<Tr>(p);
    // the wide tiles' terms: the table and key padding (hide_padded_keys); the 64-key tile takes every term
    const bool table_terms = p.mask.ptr == nullptr && !p.has_band;
    if (!Tr::kGeneralTerms && !table_terms) ok = false;
    if (Tr::kHalfTerms && p.bias.ptr && p.bias.dtype != 0 && !recast_bf16_term(fp, p)) ok = false;
    smem = Tr::kSmemBytes + (p.bias.ptr && !aliased ? Tr::kBlockM * p.bias_pitch : 0) + bits_smem;
    if (ok && smem <= dev.smem_optin)
      occ = fwd_windows_sm90_blocks_per_sm<decltype(d)::value, decltype(n)::value>(dt, smem, p);
  });
  if (!ok || smem > dev.smem_optin) return false;
  pl.grid = window_grid(p, period, ceil_div(p.Sq, 64), occ, dev, "WINATTN_FWD_G");
  pl.smem = smem;
  pl.window_bn = bn;
  pl.sm90_windows = true;
  if (bn > 160 && p.bias.ptr && p.bias.dtype != 0) {  // (recast_bf16_term: the fp16 table past 160 keys)
    pl.comb = comb_plan_of(fp, int(fp.bias.period));
    use_comb(p, pl.comb, reinterpret_cast<const void*>(uintptr_t(256)));
    choose_bias_mode(p, bn);  // (the same 16-bit pitch: the shared memory above still holds)
  }
  return true;
}

// The window forward, with a bool mask broadcast over the windows folded into the term where it can be
// (fold_window_mask); the plan as it was when the window kernels cannot take the call.
bool plan_fwd_windows_sm90(FwdPlan& pl, const FwdParams& fp, const DeviceInfo& dev, int dt) {
  const FwdPlan before = pl;
  if (pl.p.mask.ptr) fold_window_mask(fp, pl.p, pl.comb);
  if (plan_fwd_window_tiles(pl, fp, dev, dt)) return true;
  pl = before;
  return false;
}

FwdPlan plan_fwd(const FwdParams& fp) {
  FwdPlan pl;
  KParams& p = pl.p;
  fill_common(fp, p);
  pl.dk = kernel_head_dim(p.D);
  const DeviceInfo dev = device_info();
  const int dt = dtype_code(fp.dtype);
  pl.sm90 = hopper_kernels_ready(pl.dk, dt, dev);
  pl.comb = comb_plan(fp);
  // the workspace is 256-byte aligned: a stand-in pointer decides the staging mode; fwd() sets the real one
  if (fp.rel_table) use_comb(p, pl.comb, reinterpret_cast<const void*>(uintptr_t(256)));
  Carver cv;
  if (fp.rel_table) pl.off_comb = cv.take(pl.comb.bytes);
  pl.ws_bytes = cv.size;
  if (plan_fwd_windows_sm90(pl, fp, dev, dt)) {
    if (!fp.rel_table && pl.comb.bytes > 0) pl.off_comb = cv.take(pl.comb.bytes);  // (a recast term, a folded mask)
    if (pl.mbits.bytes > 0) pl.off_mbits = cv.take(pl.mbits.bytes);
    pl.ws_bytes = cv.size;
    return pl;
  }
  // Every other forward on Hopper: v3, with every score term (an empty key set is left to v1: a tensor map needs
  // a nonzero extent).
  if (p.Sk > 0 && fwd_v3_ready(pl.dk, dt, dev)) {
    pl.v3 = true;
    return pl;
  }
  // Outside window mode the general sm90 kernel is faster only without an additive term (H200, bf16: no-bias
  // D=128 S=16k 7.09 vs 9.79 ms; with one it lost, dense bias D=64 2.12 vs 1.71 ms, Swin W12 3.57 vs 3.23 ms:
  // its 128 x 128 tile pays the term per score without overlap). benchmarks/RESULTS.md "v2".
  if (p.bias.ptr) pl.sm90 = false;
  TileConfig tc = tile_config(pl.dk);
  if (pl.sm90) dispatch_sm90_hdim(pl.dk, [&](auto d) { tc = sm90_fwd_tiles<decltype(d)::value>(tc); });
  const int mblocks = ceil_div(p.Sq, tc.fwd_bm), nblocks = ceil_div(p.Sk, tc.fwd_bn);
  pl.smem = tc.fwd_smem;
  if (p.bias.ptr) {
    choose_bias_mode(p, tc.fwd_bn);
    const int tile = tc.fwd_bm * p.bias_pitch;
    p.bias_stages = tc.fwd_smem + 2 * tile <= dev.smem_optin ? 2 : tc.fwd_smem + tile <= dev.smem_optin ? 1 : 0;
    p.bias_stages = std::min(p.bias_stages, env_int("WINATTN_BIAS_STAGES", 2));
    pl.smem += p.bias_stages * tile;
  }
  // window mode: G items (windows) per CTA, sized so the grid is a whole number of resident waves
  int G = 1;
  if (mblocks == 1 && nblocks == 1 && p.B > 1) {
    int occ = 1;
    if (pl.sm90)
      dispatch_sm90_hdim(pl.dk, [&](auto d) { occ = fwd_sm90_blocks_per_sm<decltype(d)::value>(dt, pl.smem); });
    else
      dispatch_hdim(pl.dk, [&](auto d) { occ = fwd_blocks_per_sm<decltype(d)::value>(dt, pl.smem); });
    G = waves_g(int64_t(p.B) * p.H, int64_t(dev.sms) * std::max(occ, 1), 32);
    G = env_int("WINATTN_FWD_G", G);
    G = std::max(1, std::min(G, p.B));
  }
  p.G = G;
  p.Pg = 1;
  p.NC = ceil_div(p.B, G);
  p.NR = p.NC;
  pl.grid = int64_t(mblocks) * p.H * p.NR;
  return pl;
}

// ---- backward plan ---------------------------------------------------------------------------------------------
struct BwdPlan {
  KParams p;
  int dk = 32, smem = 0, bm = 64, bn = 64, mblocks = 0, nblocks = 0;
  int cfg = 0;  // backward configuration BwdTraits<dk, cfg> (kernel_traits.h)
  bool sm90_windows = false;  // Hopper window-mode kernel (plan_bwd_windows_sm90)
  int sm90_wide = 0;          // Hopper wide-window kernel for windows of up to this many tokens (plan_bwd_wide_sm90)
  bool v3 = false;            // Hopper backward v3 (plan_bwd_v3)
  BwdV3Buffers v3buf;         // its padded row count and dbias mode (run_bwd_v3 adds the workspace pointers)
  int64_t off_lse2 = -1;
  int64_t grid = 0;
  bool window = false, expand = false, dtable = false, dbias_accum = false;
  CombPlan comb;
  MaskBitsPlan mbits;  // a bool mask per window as bits (the wide-window kernel)
  int64_t ws_bytes = 0, zero_bytes = 0, off_mbits = -1;
  int64_t off_dqacc = -1, off_dqsem = -1, off_sem_bias = -1, off_sem_tb = -1, off_dtb = -1, off_inter = -1;
  int64_t off_comb = -1, off_delta = -1, off_partials = -1;
};

// Window mode on Hopper (sm90/bwd_windows_sm90.h): head dim 32, every window one 64 x 64 tile, no GQA, the
// additive term's period dividing B (windows grouped by it: Pg), and no per-item dbias (that one is stored per
// window by v1). The dS sums go to the partials of v1's window mode (same layout, [grid][Sq][bn]).
bool plan_bwd_windows_sm90(BwdPlan& pl, const DeviceInfo& dev, int dt, bool dbias_per_item, bool wants_accum) {
  KParams& p = pl.p;
  if (pl.dk != 32 || pl.bn != 64 || p.Sq > 64 || p.Sk > 64 || p.H != p.Hkv || dbias_per_item ||
      env_int("WINATTN_SM90_WINDOWS", 1) == 0 || !hopper_kernels_ready(32, dt, dev))
    return false;
  const int period = p.bias.ptr ? p.bias.period : 1;
  if (p.B % period != 0) return false;
  using Tr = sm90::BwdWindowTraitsSm90For<32>::type;
  if (p.bias.ptr) choose_bias_mode(p, 64);
  const int smem = Tr::kSmemBytes + (p.bias.ptr && !sm90::window_term_aliased<Tr>(p) ? 64 * p.bias_pitch : 0);
  if (smem > dev.smem_optin) return false;
  const int occ = bwd_windows_sm90_blocks_per_sm<32>(dt, smem);
  pl.grid = window_grid(p, period, 1, occ, dev, "WINATTN_BWD_G");
  pl.smem = smem;
  pl.window = wants_accum;
  pl.sm90_windows = true;
  return true;
}

// Wide windows on Hopper (sm90/bwd_windows_wide_sm90.h): head dim 32, 64 < max(Sq, Sk) <= 256, no GQA, an fp16
// additive term (the combined table term, or a bf16 one recast: recast_bf16_term) with its period dividing B and
// key padding as the only score terms (a bool mask only folded into the term: fold_window_mask), and a gradient
// summed over windows (the table's, or a dbias broadcast over them): the calls that otherwise take v1's window mode
// (v3 would sum them with unordered L2 reduce-adds). dQ is stored directly; the dS sums go to partials
// [grid][Sq][Sk] (bn = Sk, one key block), reduced like v1's; lse2 comes from lse2_rows_kernel, delta from the
// kernel itself.
// Windows of more than 144 tokens take the split instance: four CTAs (a cluster) per work item, so its G is chosen
// for four times the work items' CTAs, and pl.grid counts work items (the slots of the partials).
bool plan_bwd_wide_tiles(BwdPlan& pl, const BwdParams& bp, const DeviceInfo& dev, int dt, bool dbias_per_item,
                         bool wants_accum) {
  KParams& p = pl.p;
  const int n = std::max(p.Sq, p.Sk);
  if (pl.dk != 32 || n <= 64 || n > 256 || p.H != p.Hkv || dbias_per_item || !wants_accum ||
      p.bias.ptr == nullptr || (p.bias.dtype != 0 && !recast_bf16_term(bp, p)) || p.has_band ||
      dev.cc_major != 9 || env_int("WINATTN_SM90", 1) == 0 ||
      env_int("WINATTN_SM90_WINDOWS", 1) == 0)
    return false;
  const int period = p.bias.period;
  if (p.B % period != 0) return false;
  const int wide = n <= 128 ? 128 : n <= 144 ? 144 : 256;
  if (p.mask.ptr) use_mask_bits(p, pl.mbits, true, ceil_div(wide, 32));  // (a mask per window: not folded)
  static int smem_of[2][3] = {};  // per (dtype, instance): 0 unknown, -1 no sm_90a code, else its shared memory
  int& smem = smem_of[dt == 0 ? 0 : 1][wide == 128 ? 0 : wide == 144 ? 1 : 2];
  if (smem == 0)
    smem = wide == 128   ? bwd_windows_wide_sm90_smem<128>(dt)
           : wide == 144 ? bwd_windows_wide_sm90_smem<144>(dt)
                         : bwd_windows_wide_sm90_smem<256>(dt);
  if (smem == 0) smem = -1;
  if (smem < 0 || smem > dev.smem_optin) return false;
  const int ctas_per_item = wide == 256 ? 4 : 1;
  DeviceInfo resident = dev;  // (the split instance: only whole clusters of four are resident)
  if (wide == 256) {
    static int cluster_slots[2] = {-1, -1};  // per dtype
    int& slots = cluster_slots[dt == 0 ? 0 : 1];
    if (slots < 0) slots = bwd_windows_wide_sm90_cluster_slots<256>(dt);
    if (slots == 0) return false;  // no cluster of four fits
    resident.sms = slots;
  }
  pl.grid = window_grid(p, period, ctas_per_item, 1, resident, "WINATTN_BWD_G") / ctas_per_item;
  pl.smem = smem;
  pl.sm90_wide = wide;
  pl.window = true;
  pl.bn = p.Sk;
  pl.nblocks = 1;
  pl.v3buf.sq_pad = wide;  // the kernel loads one whole preprocess row per window
  p.dq_mode = DqMode::kDirect;
  if (p.bias.dtype != 0) {  // a bf16 term (recast_bf16_term)
    pl.comb = comb_plan_of(bp, int(bp.bias.period));
    use_comb(p, pl.comb, reinterpret_cast<const void*>(uintptr_t(256)));
  }
  return true;
}

// The same with a bool mask broadcast over the windows folded into the term (fold_window_mask).
bool plan_bwd_wide_sm90(BwdPlan& pl, const BwdParams& bp, const DeviceInfo& dev, int dt, bool dbias_per_item,
                        bool wants_accum) {
  const BwdPlan before = pl;
  if (pl.p.mask.ptr) fold_window_mask(bp, pl.p, pl.comb);
  if (plan_bwd_wide_tiles(pl, bp, dev, dt, dbias_per_item, wants_accum)) return true;
  pl = before;
  return false;
}

template <typename F>
void dispatch_bwd_v3_hdim(int dk, F&& f) {
  if (dk == 64)
    f(std::integral_constant<int, 64>{});
  else if (dk == 128)
    f(std::integral_constant<int, 128>{});
  else
    f(std::integral_constant<int, 256>{});
}

// Backward v3 (sm90/bwd_pipelined_sm90.h) runs a non-window backward on Hopper when:
//   * the binary has its sm_90a code for the head dim (bwd_v3_head_dim: 64, 128 or 256, the columns past D
//     zero-filled by TMA), WINATTN_SM90 and WINATTN_BWD_V3 are not 0;
//   * every score term but the relative-position table's gradient (dtable: window mode, v1): key padding, bands,
//     bool masks, additive terms of any dtype and broadcast (staged by TMA where it can, else read from global);
//   * with deterministic=True, dbias has at most two contributors per element and full rows with Sk % 4 == 0 (a
//     two-term fp32 reduce-add by TMA is order-independent; more, or the atomics of broadcast rows / columns, would
//     need ordering: v1 orders them).
bool plan_bwd_v3(BwdPlan& pl, const BwdParams& bp, const DeviceInfo& dev, int dt) {
  KParams& p = pl.p;
  const int dk = bwd_v3_head_dim(p.D);
  if (dev.cc_major != 9 || env_int("WINATTN_SM90", 1) == 0 || env_int("WINATTN_BWD_V3", 1) == 0 ||
      bp.dtable != nullptr)
    return false;
  static int ready[2][3] = {};  // 0 unknown, 1 yes, 2 no; per (dtype, head dim)
  int& r = ready[dt == 0 ? 0 : 1][dk == 64 ? 0 : dk == 128 ? 1 : 2];
  if (r == 0) dispatch_bwd_v3_hdim(dk, [&](auto d) { r = bwd_pipelined_sm90_ready<decltype(d)::value>(dt) ? 1 : 2; });
  if (r != 1) return false;
  const bool dbias = bp.dbias != nullptr;
  BwdV3Buffers& vb = pl.v3buf;
  if (dbias) {
    const Broadcast4d& b = bp.bias;
    const bool tma = b.rows == p.Sq && b.cols == p.Sk && p.Sk % 4 == 0;  // whole 16-byte fp32 rows
    const int64_t contributors = int64_t(ceil_div(p.B, int(b.period))) * (p.H / int(b.heads)) *
                                 (b.rows == p.Sq ? 1 : p.Sq) * (b.cols == p.Sk ? 1 : p.Sk);
    if (bp.deterministic && (contributors > 2 || !tma)) return false;  // atomics: v1's ordered reduction instead
    vb.dbias_mode = !tma ? kDbiasAtomic : contributors > 1 ? kDbiasReduce : kDbiasStore;
    vb.dbias_period = int(b.period);
    vb.dbias_heads = int(b.heads);
    vb.dbias_rows = int(b.rows);
    vb.dbias_cols = int(b.cols);
  }
  // the 16-bit dbias store: dbias allocated in the bias dtype (bwd_dbias_layout), which is the input dtype, with
  // rows of whole 16-byte units (TMA)
  const bool dbias16_ok = dbias && bp.dbias_in_bias_dtype && bp.bias.dtype == bp.dtype && p.Sk % 8 == 0;
  int smem = 0;  // (the launch sizes it again: three stages without a term)
  dispatch_bwd_v3_hdim(dk, [&](auto d) {
    smem = bwd_pipelined_sm90_configure<decltype(d)::value>(p, dt, dbias16_ok, vb, dev.smem_optin);
  });
  if (smem == 0) return false;

  pl.v3 = true;
  pl.dk = dk;
  const int mblocks = ceil_div(p.Sq, kBwdV3BlockM);
  vb.sq_pad = mblocks * kBwdV3BlockM;
  Carver cv;  // zero-filled: the dQ accumulator and the tickets
  pl.off_dqacc = cv.take(int64_t(p.B) * p.H * vb.sq_pad * pl.dk * 4);
  if (bp.deterministic) pl.off_dqsem = cv.take(int64_t(p.B) * p.H * mblocks * 4);
  pl.zero_bytes = cv.size;
  pl.off_lse2 = cv.take(int64_t(p.B) * p.H * vb.sq_pad * 4);
  pl.off_delta = cv.take(int64_t(p.B) * p.H * vb.sq_pad * 4);
  if (bp.rel_table) pl.off_comb = cv.take(pl.comb.bytes);  // the combined fp16 term, written by bwd()
  pl.ws_bytes = cv.size;
  return true;
}

BwdPlan plan_bwd(const BwdParams& bp) {
  BwdPlan pl;
  KParams& p = pl.p;
  fill_common(bp, p);
  p.dout = bp.dout;
  p.do_sb = bp.do_stride_b;
  p.do_ss = bp.do_stride_s;
  p.do_sh = bp.do_stride_h;
  check_rows(bp.dout, p.do_sb, p.do_ss, p.do_sh, "grad_out");
  pl.dk = kernel_head_dim(p.D);
  const TileConfig tc = tile_config(pl.dk);
  const DeviceInfo dev = device_info();
  pl.bm = tc.bwd_bm;
  pl.bn = tc.bwd_bn;
  pl.mblocks = ceil_div(p.Sq, pl.bm);
  pl.nblocks = ceil_div(p.Sk, pl.bn);
  pl.dtable = bp.dtable != nullptr;
  pl.cfg = std::max(0, env_int("WINATTN_BWD_CFG", 0));  // tuning / testing override (out of range: default)
  const int dt = dtype_code(bp.dtype);
  const bool det = bp.deterministic;
  p.dq_mode = pl.nblocks <= 1 ? DqMode::kDirect : det ? DqMode::kOrdered : DqMode::kAtomic;

  // the additive operand the kernel reads, staged with Q / dO (one tile per pipeline stage)
  pl.comb = comb_plan(bp);
  if (bp.rel_table) use_comb(p, pl.comb, reinterpret_cast<const void*>(uintptr_t(256)));
  const bool dbias = bp.dbias != nullptr;
  const Broadcast4d& bias = bp.bias;
  const bool full_rc = bias.rows == p.Sq && bias.cols == p.Sk;
  const bool dbias_store = dbias && full_rc && bias.period == p.B && bias.heads == p.H;

  // window mode (many items per CTA, dS summed in a shared [Sq][BN] fp32 tile, one partial per CTA) and the
  // staging depth of the additive tile (QS stages: prefetched with Q / dO; 1: loaded at the top of its step;
  // 0: read from global) are chosen together for the most CTAs per SM (ties: deeper staging). The CTA count is the
  // runtime's occupancy (registers and shared memory): v1 counted shared memory only and, with the register-bound
  // D = 32 kernel, gave up the staged tile for a third CTA per SM that never became resident.
  const int acc_bytes = p.Sq * tc.bwd_ld_acc * 4;
  const bool wants_accum = pl.dtable || (dbias && !dbias_store);
  // (the Hopper window kernels set G, Pg, the grid and the shared memory themselves; v3 its own workspace)
  const bool sm90_windows = plan_bwd_windows_sm90(pl, dev, dt, dbias && dbias_store, wants_accum) ||
                            plan_bwd_wide_sm90(pl, bp, dev, dt, dbias && dbias_store, wants_accum);
  if (!sm90_windows && plan_bwd_v3(pl, bp, dev, dt)) return pl;
  if (!sm90_windows) {
    const bool window_ok = wants_accum && p.H == p.Hkv && p.B >= 2;
    int tile = 0;
    if (p.bias.ptr) {
      choose_bias_mode(p, pl.bn);
      tile = pl.bm * p.bias_pitch;
    }
    const int max_stages = std::min(p.bias.ptr ? tc.bwd_qs : 0, env_int("WINATTN_BIAS_STAGES", 2));
    int best_stages = 0, best_occ = -1;
    bool best_window = false;
    for (int win = window_ok ? 1 : 0; win >= 0; --win) {
      for (int st = max_stages; st >= 0; --st) {
        const int smem = tc.bwd_smem + st * tile + (win ? acc_bytes : 0);
        if (smem > dev.smem_optin) continue;
        int occ = 0;
        dispatch_hdim(pl.dk, [&](auto d) { occ = bwd_blocks_per_sm<decltype(d)::value>(dt, smem, pl.cfg); });
        if (occ > best_occ) {
          best_occ = occ;
          best_stages = st;
          best_window = win;
        }
      }
      if (best_occ >= 0 && win) break;  // window mode when it fits at all
    }
    p.bias_stages = best_stages;
    pl.smem = tc.bwd_smem + best_stages * tile;

    int G = 1, Pg = 1;
    if (best_window) {
      Pg = (dbias && !dbias_store) ? int(bias.period) : 1;
      const int per_r = p.B / Pg;
      const int64_t items = int64_t(p.B) * p.Hkv * pl.nblocks;
      const int smem = pl.smem + acc_bytes;
      int occ = 1;
      dispatch_hdim(pl.dk, [&](auto d) { occ = bwd_blocks_per_sm<decltype(d)::value>(dt, smem, pl.cfg); });
      G = waves_g(items, int64_t(dev.sms) * std::max(occ, 1), 64);
      G = env_int("WINATTN_BWD_G", G);
      G = std::max(1, std::min(G, per_r));
    }
    pl.window = G > 1;
    if (!pl.window) Pg = 1;
    p.G = G;
    p.Pg = Pg;
    p.NC = ceil_div(p.B / Pg, G);
    p.NR = p.NC * Pg;
    pl.grid = int64_t(pl.nblocks) * p.Hkv * p.NR;
    if (pl.window) pl.smem += acc_bytes;
  }

  // where dS goes
  auto full = [&](Target& t) {
    t.rows = p.Sq;
    t.cols = p.Sk;
  };
  if (dbias) {
    Target& t = p.t_bias;
    t.period = int(bias.period);
    t.heads = int(bias.heads);
    full(t);
    if (dbias_store) {
      t.mode = TargetMode::kStore;
    } else if (pl.window) {
      t.mode = TargetMode::kAccum;
      pl.dbias_accum = true;
    } else if (!det) {
      t.mode = TargetMode::kAtomic;
      t.rows = int(bias.rows);
      t.cols = int(bias.cols);
    } else {
      // deterministic: fixed-order read-add-write; broadcast rows / cols go through an expanded intermediate
      pl.expand = !full_rc;
      t.mode = (bias.period == p.B && bias.heads == p.H) ? TargetMode::kStore : TargetMode::kOrdered;
    }
  }
  if (pl.dtable) {
    Target& t = p.t_tb;
    t.period = 1;
    t.heads = p.H;
    full(t);
    // the table gradient is always deterministic (window_attention has no flag): partials in window mode,
    // fixed-order read-add-write otherwise
    t.mode = pl.window ? TargetMode::kAccum : p.B == 1 ? TargetMode::kStore : TargetMode::kOrdered;
  }

  // workspace: zero-filled regions first (one memset), then the rest
  Carver cv;
  const int64_t sqsk = int64_t(p.Sq) * p.Sk;
  if (p.dq_mode != DqMode::kDirect) pl.off_dqacc = cv.take(int64_t(p.B) * p.Sq * p.H * p.D * 4);
  if (p.dq_mode == DqMode::kOrdered) pl.off_dqsem = cv.take(int64_t(p.B) * p.H * pl.mblocks * 4);
  if (p.t_bias.mode == TargetMode::kOrdered)
    pl.off_sem_bias = cv.take(int64_t(bias.period) * bias.heads * pl.mblocks * pl.nblocks * 4);
  if (p.t_tb.mode == TargetMode::kOrdered) pl.off_sem_tb = cv.take(int64_t(p.H) * pl.mblocks * pl.nblocks * 4);
  if (pl.dtable && !pl.window) pl.off_dtb = cv.take(int64_t(p.H) * sqsk * 4);
  if (pl.expand) pl.off_inter = cv.take(int64_t(bias.period) * bias.heads * sqsk * 4);
  pl.zero_bytes = cv.size;
  if (pl.comb.bytes > 0) pl.off_comb = cv.take(pl.comb.bytes);
  if (pl.mbits.bytes > 0) pl.off_mbits = cv.take(pl.mbits.bytes);
  if (pl.sm90_wide) {  // lse2 rows (aux_kernels.h lse2_rows_kernel)
    pl.off_lse2 = cv.take(int64_t(p.B) * p.H * pl.v3buf.sq_pad * 4);
  } else if (!pl.sm90_windows) {  // (the 64-token windows kernel makes its own)
    pl.off_delta = cv.take(int64_t(p.B) * p.H * p.Sq * 4);
  }
  if (pl.window) pl.off_partials = cv.take(pl.grid * p.Sq * pl.bn * 4);
  if (pl.dtable && pl.window) pl.off_dtb = cv.take(int64_t(p.H) * sqsk * 4);
  pl.ws_bytes = cv.size;
  return pl;
}

}  // namespace

namespace {

// ---- one forward plan per call ------------------------------------------------------------------------------------
// The binding asks fwd_workspace_bytes(p), allocates, then calls fwd(p, ...) with the same params object
// (torch_binding.cpp winattn_fwd), and both used to plan: tile choice, window grouping, occupancy lookups, the
// environment knobs, twice per call on the host path of a ~0.35 ms Swin forward. The plan made for the size query
// is kept per thread and taken by the next fwd() when that one comes with byte-identical params (the same object:
// padding bytes included) on the same device under the same environment (env_generation); anything else plans
// afresh. A plan is a pure function of those three (the readiness / occupancy caches it reads never change for a
// device), so reuse launches exactly what planning again would. One-shot: fwd() always drops it, so a query whose
// call never launched (an allocation failure) cannot be picked up later.
struct FwdPlanMemo {
  bool valid = false;
  int device = -1;
  uint64_t env_gen = 0;
  FwdParams params;
  FwdPlan plan;
};
FwdPlanMemo& fwd_plan_memo() {
  thread_local FwdPlanMemo m;
  return m;
}
int current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

}  // namespace

int64_t fwd_workspace_bytes(const FwdParams& params) {
  FwdPlanMemo& m = fwd_plan_memo();
  m.valid = false;
  if (params.batch == 0 || params.seqlen_q == 0 || params.heads == 0) return 0;
  m.plan = plan_fwd(params);
  std::memcpy(static_cast<void*>(&m.params), &params, sizeof(FwdParams));
  m.device = current_device();
  m.env_gen = env_generation();
  m.valid = true;
  return m.plan.ws_bytes;
}

void fwd(const FwdParams& params, void* workspace, void* stream_ptr) {
  FwdPlanMemo& m = fwd_plan_memo();
  const bool reuse = m.valid && std::memcmp(&m.params, &params, sizeof(FwdParams)) == 0 &&
                     m.device == current_device() && m.env_gen == env_generation();
  m.valid = false;
  if (params.batch == 0 || params.seqlen_q == 0 || params.heads == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  FwdPlan pl = reuse ? m.plan : plan_fwd(params);
  KParams& p = pl.p;
  char* ws = static_cast<char*>(workspace);
  if (pl.comb.bytes > 0) {  // the table term (+ bias), or a recast bf16 bias
    __half* comb = reinterpret_cast<__half*>(ws + pl.off_comb);
    if (p.Sk > 0) launch_combine(params, p, pl.comb, comb, stream);
    p.bias.ptr = comb;
  }
  if (pl.mbits.bytes > 0) launch_mask_bits(params, p, pl.mbits, reinterpret_cast<uint32_t*>(ws + pl.off_mbits), stream);
  const int dt = dtype_code(params.dtype);
  if (pl.v3)
    dispatch_hdim(pl.dk, [&](auto d) { run_fwd_pipelined_sm90<decltype(d)::value>(p, dt, device_info().smem_optin, device_info().sms, stream);
    });
  else if (pl.sm90_windows)
    dispatch_window_tiles(pl.dk, pl.window_bn, [&](auto d, auto n) {
      run_fwd_windows_sm90<decltype(d)::value, decltype(n)::value>(p, dt, pl.grid, pl.smem, stream);
    });
  else if (pl.sm90)
    dispatch_sm90_hdim(pl.dk, [&](auto d) { run_fwd_sm90<decltype(d)::value>(p, dt, pl.grid, pl.smem, stream); });
  else
    dispatch_hdim(pl.dk, [&](auto d) { run_fwd<decltype(d)::value>(p, dt, pl.grid, pl.smem, stream); });
}

// Backward v3: preprocess (delta, lse * log2 e into padded rows), the pipelined kernel (dK, dV, dbias written by it),
// dQ from its fp32 fragment-order accumulator. The workspace's zero-filled part is cleared by the caller.
static void run_bwd_v3(const BwdParams& params, BwdPlan& pl, char* ws, cudaStream_t stream) {
  KParams& p = pl.p;
  BwdV3Buffers vb = pl.v3buf;
  vb.dq_acc = reinterpret_cast<float*>(ws + pl.off_dqacc);
  vb.dq_sems = pl.off_dqsem >= 0 ? reinterpret_cast<int*>(ws + pl.off_dqsem) : nullptr;
  vb.lse2 = reinterpret_cast<float*>(ws + pl.off_lse2);
  vb.delta = reinterpret_cast<float*>(ws + pl.off_delta);
  vb.dbias = params.dbias;
  const int dt = dtype_code(params.dtype);
  const int64_t threads = int64_t(p.B) * p.H * vb.sq_pad * 4;
  const int blocks = int((threads + 255) / 256);
  auto prep = [&](auto elem) {
    using E = decltype(elem);
    bwd_prep_v3_kernel<E><<<blocks, 256, 0, stream>>>(vb.lse2, vb.delta, vb.sq_pad, static_cast<const E*>(p.dout),
                                                     p.do_sb, p.do_ss, p.do_sh, static_cast<const E*>(p.o), p.o_sb,
                                                     p.o_ss, p.o_sh, p.lse, params.dlse, p.B, p.Sq, p.H, p.D);
    check_cuda(cudaGetLastError(), "window_attention bwd v3 preprocess");
  };
  if (dt == 0) prep(__half());
  else prep(__nv_bfloat16());
  dispatch_bwd_v3_hdim(pl.dk, [&](auto d) {
    run_bwd_pipelined_sm90<decltype(d)::value>(p, vb, dt, device_info().smem_optin, stream);
  });
  const int mblocks = vb.sq_pad / kBwdV3BlockM;
  const int64_t n4 = int64_t(p.B) * p.H * vb.sq_pad * pl.dk / 4;
  const int cblocks = int(std::min<int64_t>((n4 + 255) / 256, 65535 * 4));
  auto convert = [&](auto elem) {
    using E = decltype(elem);
    dq_frag_convert_kernel<E><<<cblocks, 256, 0, stream>>>(static_cast<E*>(params.dq), vb.dq_acc, p.B, p.Sq, p.H,
                                                          p.D, pl.dk, mblocks, p.scale);
    check_cuda(cudaGetLastError(), "window_attention bwd v3 dq conversion");
  };
  if (dt == 0) convert(__half());
  else convert(__nv_bfloat16());
}

// The 16-bit dbias layout where v3 stores each element once (pair mode or one contributor) in the bias's dtype; it
// skips the zero-fill too unless tiles can go unvisited (a band, key padding).
DbiasLayout bwd_dbias_layout(const BwdParams& params) {
  DbiasLayout layout;
  if (params.batch == 0 || params.seqlen_q == 0 || params.heads == 0 || params.seqlen_k == 0 ||
      params.bias.ptr == nullptr)
    return layout;
  BwdParams probe = params;  // "if dbias were in the bias dtype": planning only, the pointer is never dereferenced
  probe.dbias = reinterpret_cast<void*>(uintptr_t(256));
  probe.dbias_in_bias_dtype = true;
  const BwdPlan pl = plan_bwd(probe);
  if (pl.v3 && pl.v3buf.dbias_mode == kDbiasStore16) {
    layout.in_bias_dtype = true;
    layout.zero_fill = pl.p.has_band || pl.p.kp != nullptr;
  }
  return layout;
}

int64_t bwd_workspace_bytes(const BwdParams& params) {
  if (params.batch == 0 || params.seqlen_q == 0 || params.heads == 0 || params.seqlen_k == 0) return 0;
  return plan_bwd(params).ws_bytes;
}

void bwd(const BwdParams& params, void* workspace, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t B = params.batch, Sq = params.seqlen_q, Sk = params.seqlen_k, H = params.heads;
  if (B == 0 || H == 0) return;
  const int64_t esz = 2;
  if (Sq == 0 || Sk == 0) {  // nothing attends: all gradients are zero (dbias / dtable arrive zero-filled)
    check_cuda(cudaMemsetAsync(params.dq, 0, B * Sq * H * params.head_dim * esz, stream), "memset");
    check_cuda(cudaMemsetAsync(params.dk, 0, B * Sk * params.heads_kv * params.head_dim * esz, stream), "memset");
    check_cuda(cudaMemsetAsync(params.dv, 0, B * Sk * params.heads_kv * params.head_dim * esz, stream), "memset");
    return;
  }
  BwdPlan pl = plan_bwd(params);
  KParams& p = pl.p;
  if (params.dbias_in_bias_dtype && !(pl.v3 && pl.v3buf.dbias_mode == kDbiasStore16))
    throw std::logic_error("window_attention (cuda): dbias came in the bias dtype, but this call adds it in fp32 "
                           "(allocate it as bwd_dbias_layout says)");
  char* ws = static_cast<char*>(workspace);
  auto at = [&](int64_t off) -> void* { return off >= 0 ? ws + off : nullptr; };
  if (pl.zero_bytes > 0) check_cuda(cudaMemsetAsync(ws, 0, pl.zero_bytes, stream), "workspace memset");

  p.dq = params.dq;
  p.dk = params.dk;
  p.dv = params.dv;
  p.dq_accum = static_cast<float*>(at(pl.off_dqacc));
  p.dq_sems = static_cast<int*>(at(pl.off_dqsem));
  float* delta = static_cast<float*>(at(pl.off_delta));
  p.delta = delta;
  p.dlse = pl.sm90_windows || pl.sm90_wide ? params.dlse : nullptr;  // (kernels that compute delta themselves)
  p.partials = static_cast<float*>(at(pl.off_partials));
  float* dtb = static_cast<float*>(at(pl.off_dtb));
  float* dbias32 = static_cast<float*>(params.dbias);  // v1 paths: float32 (bwd_dbias_layout's default)
  if (p.t_bias.mode != TargetMode::kNone) {
    p.t_bias.ptr = pl.expand ? static_cast<float*>(at(pl.off_inter)) : dbias32;
    p.t_bias.sems = static_cast<int*>(at(pl.off_sem_bias));
  }
  if (p.t_tb.mode != TargetMode::kNone) {
    p.t_tb.ptr = dtb;
    p.t_tb.sems = static_cast<int*>(at(pl.off_sem_tb));
  }
  if (pl.comb.bytes > 0) {  // the table term (+ bias), or a recast bf16 bias
    __half* comb = static_cast<__half*>(at(pl.off_comb));
    launch_combine(params, p, pl.comb, comb, stream);
    p.bias.ptr = comb;
  }
  if (pl.mbits.bytes > 0) launch_mask_bits(params, p, pl.mbits, static_cast<uint32_t*>(at(pl.off_mbits)), stream);

  const int dt = dtype_code(params.dtype);
  if (pl.v3) {
    run_bwd_v3(params, pl, ws, stream);
    return;
  }
  if (pl.sm90_wide) {
    const int64_t n = int64_t(p.B) * p.H * pl.v3buf.sq_pad;
    lse2_rows_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(static_cast<float*>(at(pl.off_lse2)),
                                                                    pl.v3buf.sq_pad, p.lse, int64_t(p.B) * p.H, p.Sq);
    check_cuda(cudaGetLastError(), "window_attention bwd lse2");
  } else if (!pl.sm90_windows) {  // delta = rowsum(dO * O) - dlse
    const int64_t threads = B * Sq * H * 4;
    const int blocks = int((threads + 255) / 256);
    if (dt == 0)
      bwd_delta_kernel<__half><<<blocks, 256, 0, stream>>>(
          delta, static_cast<const __half*>(p.dout), p.do_sb, p.do_ss, p.do_sh, static_cast<const __half*>(p.o),
          p.o_sb, p.o_ss, p.o_sh, params.dlse, p.B, p.Sq, p.H, p.D);
    else
      bwd_delta_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
          delta, static_cast<const __nv_bfloat16*>(p.dout), p.do_sb, p.do_ss, p.do_sh,
          static_cast<const __nv_bfloat16*>(p.o), p.o_sb, p.o_ss, p.o_sh, params.dlse, p.B, p.Sq, p.H, p.D);
    check_cuda(cudaGetLastError(), "window_attention bwd preprocess");
  }

  if (pl.sm90_wide == 128)
    run_bwd_windows_wide_sm90<128>(p, static_cast<float*>(at(pl.off_lse2)), pl.v3buf.sq_pad, dt, pl.grid, stream);
  else if (pl.sm90_wide == 144)
    run_bwd_windows_wide_sm90<144>(p, static_cast<float*>(at(pl.off_lse2)), pl.v3buf.sq_pad, dt, pl.grid, stream);
  else if (pl.sm90_wide == 256)
    run_bwd_windows_wide_sm90<256>(p, static_cast<float*>(at(pl.off_lse2)), pl.v3buf.sq_pad, dt, pl.grid, stream);
  else if (pl.sm90_windows)
    run_bwd_windows_sm90<32>(p, dt, pl.grid, pl.smem, stream);
  else
    dispatch_hdim(pl.dk, [&](auto d) { run_bwd<decltype(d)::value>(p, dt, pl.grid, pl.smem, pl.cfg, stream); });

  if (p.dq_mode != DqMode::kDirect) {
    const int64_t n2 = B * Sq * H * p.D / 2;
    const int blocks = int(std::min<int64_t>((n2 + 255) / 256, 65535));
    if (dt == 0)
      dq_convert_kernel<__half><<<blocks, 256, 0, stream>>>(static_cast<__half*>(p.dq), p.dq_accum, n2);
    else
      dq_convert_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p.dq), p.dq_accum, n2);
    check_cuda(cudaGetLastError(), "window_attention dq conversion");
  }

  const Broadcast4d& bias = params.bias;
  auto reduce_partials = [&](float* out, int P_T, int H_T, int R_T, int C_T) {
    ReduceParams rp;
    rp.partials = p.partials;
    rp.out = out;
    rp.P_T = P_T; rp.H_T = H_T; rp.R_T = R_T; rp.C_T = C_T;
    rp.Sq = p.Sq; rp.Sk = p.Sk; rp.BN = pl.bn; rp.nblocks = pl.nblocks;
    rp.Hx = p.Hkv; rp.NR = p.NR; rp.Pg = p.Pg; rp.NC = p.NC;
    const int64_t nout = int64_t(P_T) * H_T * R_T * C_T;
    reduce_partials_kernel<<<int((nout + 31) / 32), 256, 0, stream>>>(rp);
    check_cuda(cudaGetLastError(), "window_attention dbias reduction");
  };
  if (pl.window && pl.dbias_accum)
    reduce_partials(dbias32, int(bias.period), int(bias.heads), int(bias.rows), int(bias.cols));
  if (pl.window && pl.dtable) reduce_partials(dtb, 1, p.H, p.Sq, p.Sk);
  if (pl.expand) {
    const int64_t nout = bias.period * bias.heads * bias.rows * bias.cols;
    const int blocks = int(std::min<int64_t>((nout + 255) / 256, 65535));
    reduce_expanded_kernel<<<blocks, 256, 0, stream>>>(dbias32, static_cast<const float*>(at(pl.off_inter)),
                                                       int(bias.period), int(bias.heads), int(bias.rows),
                                                       int(bias.cols), p.Sq, p.Sk);
    check_cuda(cudaGetLastError(), "window_attention dbias reduction");
  }
  if (pl.dtable) {
    const int64_t T = params.table_rows;
    if (params.deterministic || Sq * Sk <= (int64_t(1) << 20)) {
      dim3 grid(unsigned((T + 31) / 32), unsigned(p.H));
      scatter_dtable_scan_kernel<<<grid, kScanWarps * 32, 0, stream>>>(params.dtable, T, p.H, dtb, params.rel_index,
                                                          params.index_stride_q, params.index_stride_k, p.Sq, p.Sk);
    } else {
      const int64_t n = Sq * Sk * H;
      const int blocks = int(std::min<int64_t>((n + 255) / 256, 65535));
      scatter_dtable_atomic_kernel<<<blocks, 256, 0, stream>>>(params.dtable, p.H, dtb, params.rel_index,
                                                              params.index_stride_q, params.index_stride_k, p.Sq, p.Sk);
    }
    check_cuda(cudaGetLastError(), "window_attention dtable scatter");
  }
}

}  // namespace winattn
