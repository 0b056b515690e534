// Property-based fuzz of the kernel choice (kernel-src/cuda/kernel_choice.h). Random calls drawn from what the binding
// accepts (torch_binding.cpp: any B, Sq, Sk, H, Hkv | H, D; bias and bool mask in any broadcast, dtype, stride and
// offset; key padding; causal and sliding bands; scale <= 0; the Swin table; deterministic; gradients), biased toward
// the edges of the rules and kept within one device's memory, are planned on an H200-like device, a MIG slice of it and
// an A100-like device, unforced and under WINATTN_FORCE_KERNEL names (all of them for a named reproduction, three
// random ones per device for a random call). Each choice is checked against what the kernels, their launchers
// (sm90/launch_sm90.h, launch_bwd_sm90.h, instantiations/fwd_decode*.cu) and the planner (winattn_cuda.cu) rely on:
// each invariant below names the assumption it guards. tests/unit/test_kernel_choice_fuzz.py builds this with the
// sanitizers (a signed overflow or a bad shift in the choice aborts the run) and runs a fixed seed.
//
//   kernel_choice_fuzz [--seed S] [--calls N] [--only I]   random calls (--only: call I of the seed, described)
//   kernel_choice_fuzz --repro NAME                        a named reproduction (kRepros, the bugs this found)
//
// Output, one line each: "check NAME PASSED FAILED" per invariant, "fail NAME | CALL" (its first failing call),
// "cover PATH N" (how often each kernel / path was chosen), "calls N choices M".
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda/kernel_choice.h"

using namespace winattn;
using namespace winattn::cuda;

namespace {

// ---- the device and the memory a call may use -----------------------------------------------------------------------
DeviceCaps h200_caps() {  // (as kernel_choice_table.cpp: what device_caps() reads on an H200 with sm_90a code)
  DeviceCaps d;
  d.cc_major = 9, d.sms = 132, d.smem_optin = 232448, d.sm90a = true, d.wide_cluster_slots = 120;
  return d;
}
DeviceCaps h200_slice_caps() {  // a MIG slice (1g: 16 SMs): the split and tile rules that count SMs
  DeviceCaps d = h200_caps();
  d.sms = 16, d.wide_cluster_slots = 16;
  return d;
}
DeviceCaps a100_caps() {
  DeviceCaps d;
  d.cc_major = 8, d.sms = 108, d.smem_optin = 166912;
  return d;
}
// A call is one a user can pass when its tensors fit one device (an H200: 139 GiB). Sizes past that are not calls.
constexpr double kDeviceBytes = 139.0 * (1ull << 30);

// ---- random numbers -------------------------------------------------------------------------------------------------
struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
  bool chance(int percent) { return below(100) < percent; }
  template <typename T, size_t N>
  T pick(const T (&a)[N]) {
    return a[below(int64_t(N))];
  }
  int64_t log_uniform(int64_t hi) {  // 1 .. hi, every power of two as likely
    int bits = 0;
    while (bits < 62 && (int64_t(1) << (bits + 1)) <= hi) ++bits;
    const int64_t lo = int64_t(1) << below(bits + 1);
    return std::min(hi, lo + below(lo));
  }
};

// Sequence lengths at the rules' edges: 16 decode rows, 64 / 128 / 144 / 160 / 256-key window blocks, 80 / 128 / 208
// short key blocks, 320 / 1088 two-CTA keys, 8192 wide keys, 32-key mask words, 8-element term rows.
constexpr int64_t kSeqEdges[] = {1,   2,   7,   8,   9,   16,  17,   31,   32,   33,   48,   49,   63,   64,   65,
                                 77,  80,  81,  96,  97,  120, 127,  128,  129,  144,  145,  160,  161,  192,  193,
                                 197, 208, 209, 255, 256, 257, 320,  321,  577,  1023, 1024, 1025, 1088, 1089, 4096,
                                 4352, 8191, 8192, 8193, 16384, 32760};
constexpr int64_t kHeadDims[] = {8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 128, 136, 160, 168, 192, 200, 256};

int64_t seq_len(Rng& r) {
  if (r.chance(75)) return r.pick(kSeqEdges);
  if (r.chance(60)) return 1 + r.below(4096);
  return r.log_uniform((int64_t(1) << 30) - 1);  // (fill_common: < 2^30)
}
int64_t head_dim(Rng& r) { return r.chance(70) ? r.pick(kHeadDims) : 8 * (1 + r.below(32)); }

// ---- the call -------------------------------------------------------------------------------------------------------
struct Call {
  BwdParams p;
  int64_t nW = 1;  // the window count: B = nW x n, so periods 1, nW, n and B all divide B
  bool grad_bias = false, grad_table = false;
};

// Fake, never dereferenced addresses: 4 KB apart and 256-byte aligned, as the caching allocator's are.
const void* addr(int i) { return reinterpret_cast<const void*>(uintptr_t(0x100000) + uintptr_t(i) * 4096); }
enum Slot { kQ = 1, kK, kV, kOut, kDout, kBias, kMask, kKp, kTable, kIndex, kDbias, kDtable, kLse };

int esize(DType t) { return t == DType::kFloat32 ? 4 : 2; }
int64_t offset_of(const void* p, int slot, int es) {
  return int64_t(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(addr(slot))) / es;
}

// A call of shape [B, S, H, D] for q / k / v with contiguous rows (the strides fill_common accepts: multiples of 8).
Call make_call(int64_t B, int64_t nW, int64_t Sq, int64_t Sk, int64_t H, int64_t Hkv, int64_t D, DType dt) {
  Call c;
  c.nW = nW;
  BwdParams& p = c.p;
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.heads = H, p.heads_kv = Hkv, p.head_dim = D, p.dtype = dt;
  p.q = addr(kQ), p.k = addr(kK), p.v = addr(kV), p.out = const_cast<void*>(addr(kOut)), p.dout = addr(kDout);
  p.lse = static_cast<float*>(const_cast<void*>(addr(kLse)));
  p.q_stride_b = Sq * H * D, p.q_stride_s = H * D, p.q_stride_h = D;
  p.k_stride_b = Sk * Hkv * D, p.k_stride_s = Hkv * D, p.k_stride_h = D;
  p.v_stride_b = p.k_stride_b, p.v_stride_s = p.k_stride_s, p.v_stride_h = p.k_stride_h;
  p.o_stride_b = p.q_stride_b, p.o_stride_s = p.q_stride_s, p.o_stride_h = p.q_stride_h;
  p.do_stride_b = p.q_stride_b, p.do_stride_s = p.q_stride_s, p.do_stride_h = p.q_stride_h;
  p.scale = 0.125f;
  return c;
}

// A [P, Hb, R, C] operand broadcast against [B, H, Sq, Sk] as broadcast4d() makes it: size-1 dims have stride 0;
// the others row-major with padded rows, transposed (keys outermost), or expanded (a stride 0 on a full dim); an
// element offset off a 256-byte allocation (a misaligned view). es: the element size (1: the bool mask).
Broadcast4d random_operand(Rng& r, const Call& c, DType dt, int slot, int es) {
  const BwdParams& p = c.p;
  const int64_t n = p.batch / c.nW;
  const int64_t periods[] = {1, c.nW, n, p.batch};
  Broadcast4d b;
  b.dtype = dt;
  b.period = r.chance(50) ? 1 : r.pick(periods);
  b.heads = r.chance(50) ? p.heads : 1;
  b.rows = r.chance(60) ? p.seqlen_q : 1;
  b.cols = r.chance(85) ? p.seqlen_k : 1;
  const int64_t pad = r.chance(20) ? r.pick({1, 2, 3, 8, 13}) : 0;
  if (r.chance(85)) {  // row-major
    b.stride_k = 1, b.stride_q = b.cols + pad, b.stride_h = b.rows * b.stride_q;
  } else {  // transposed: a key's column of queries
    b.stride_q = 1, b.stride_k = b.rows + pad, b.stride_h = b.cols * b.stride_k;
  }
  b.stride_b = b.heads * b.stride_h;
  if (r.chance(10)) {  // expanded along one full dim (torch .expand: stride 0)
    int64_t* strides[] = {&b.stride_b, &b.stride_h, &b.stride_q, &b.stride_k};
    *strides[r.below(4)] = 0;
  }
  if (b.period == 1) b.stride_b = 0;
  if (b.heads == 1) b.stride_h = 0;
  if (b.rows == 1) b.stride_q = 0;
  if (b.cols == 1) b.stride_k = 0;
  const int64_t offset = r.chance(70) ? 0 : r.pick({1, 2, 3, 4, 5, 7, 8, 9, 16});
  b.ptr = static_cast<const char*>(addr(slot)) + offset * es;
  return b;
}
int64_t pick_window(Rng& r, const BwdParams& p) {
  if (r.chance(70)) return -1;
  const int64_t w = r.pick({0, 1, 7, 63, 64, 127, 128, 1000, 4096});
  return std::min(w, p.seqlen_q + p.seqlen_k);  // (the binding clamps a side to Sq + Sk)
}

// The score terms and options of a call, each present with its own probability.
void add_terms(Rng& r, Call& c, bool swin) {
  BwdParams& p = c.p;
  if (r.chance(swin ? 50 : 35)) {
    const DType dt = r.pick({DType::kFloat16, DType::kBFloat16, DType::kFloat32});
    p.bias = random_operand(r, c, dt, kBias, esize(dt));
    c.grad_bias = r.chance(50);
  }
  if (r.chance(swin ? 40 : 25)) p.mask = random_operand(r, c, DType::kFloat32, kMask, 1);  // (dtype: unread)
  if (r.chance(swin ? 60 : 8)) {  // the Swin table: [T, H] fp32 gathered through an [Sq, Sk] index
    p.rel_table = static_cast<const float*>(addr(kTable));
    p.table_rows = r.chance(80) ? 4 * p.seqlen_q : 1 + r.below(1000);
    p.table_stride_r = p.heads, p.table_stride_h = 1;
    p.rel_index = static_cast<const int64_t*>(addr(kIndex));
    p.index_stride_q = p.seqlen_k, p.index_stride_k = 1;
    c.grad_table = r.chance(70);
  }
  if (r.chance(15)) {
    const int64_t offset = r.chance(60) ? 0 : r.pick({1, 2, 3, 5});
    p.key_padding = reinterpret_cast<const bool*>(addr(kKp)) + offset;
    p.kp_stride_b = p.seqlen_k + (r.chance(20) ? r.pick({1, 3, 8}) : 0);
    p.kp_stride_k = r.chance(90) ? 1 : 2;
  }
  p.causal = r.chance(15);
  p.window_left = pick_window(r, p);
  p.window_right = pick_window(r, p);
  p.scale = r.chance(85) ? r.pick({0.125f, 1.f, 0.088f, 1e-3f}) : r.pick({0.f, -0.5f, -1.f});
  p.deterministic = r.chance(20);
  p.dlse = r.chance(10) ? static_cast<const float*>(addr(kLse)) : nullptr;
}

// Bytes a call's tensors take (the span of each strided view), forward and backward.
double span_bytes(const Broadcast4d& b, int es) {
  if (!b.ptr) return 0;
  const double elems = 1.0 + double(b.period - 1) * b.stride_b + double(b.heads - 1) * b.stride_h +
                       double(b.rows - 1) * b.stride_q + double(b.cols - 1) * b.stride_k;
  return elems * es;
}
double fwd_bytes(const Call& c) {
  const BwdParams& p = c.p;
  const double q = double(p.batch) * p.seqlen_q * p.heads * p.head_dim * 2;
  const double kv = double(p.batch) * p.seqlen_k * p.heads_kv * p.head_dim * 2;
  double t = 2 * q + 2 * kv + double(p.batch) * p.heads * p.seqlen_q * 4;  // q, out, k, v, lse
  t += span_bytes(p.bias, esize(p.bias.dtype)) + span_bytes(p.mask, 1);
  if (p.key_padding) t += double(p.batch) * p.kp_stride_b + double(p.seqlen_k) * p.kp_stride_k;
  if (p.rel_table) t += double(p.table_rows) * p.heads * 4 + double(p.seqlen_q) * p.seqlen_k * 8;
  return t;
}
double bwd_bytes(const Call& c) {  // + dout, dq, dk, dv, dbias (fp32), dtable
  const BwdParams& p = c.p;
  double t = fwd_bytes(c) + 2 * (double(p.batch) * p.seqlen_q * p.heads * p.head_dim * 2) +
             2 * (double(p.batch) * p.seqlen_k * p.heads_kv * p.head_dim * 2);
  if (c.grad_bias) t += double(p.bias.period) * p.bias.heads * p.bias.rows * p.bias.cols * 4;
  if (c.grad_table) t += double(p.table_rows) * p.heads * 4;
  return t;
}

// Shapes, one family per call: any (edges of every size), Swin windows, decode (a few query rows per KV head), and
// huge (one size at fill_common's limit, the others shrunk until the call fits the device).
Call random_shape(Rng& r, int family) {
  const DType dt = r.chance(50) ? DType::kFloat16 : DType::kBFloat16;
  int64_t nW = 1, n = 1, Sq = 1, Sk = 1, Hkv = 1, group = 1, D = head_dim(r);
  if (family == 1) {  // Swin: nW windows of N tokens per image, head dim 32 mostly
    nW = r.pick({1, 4, 16, 64, 256});
    n = r.pick({1, 2, 3, 8, 32});
    Sq = Sk = r.pick({16, 25, 49, 64, 65, 100, 128, 129, 144, 145, 160, 161, 196, 256, 257});
    if (r.chance(10)) Sk = Sq + r.pick({-1, 1});
    D = r.chance(60) ? 32 : r.pick({16, 24, 40, 64});
    Hkv = r.pick({1, 2, 3, 4, 6, 8, 12, 16, 32});
    group = r.chance(90) ? 1 : 2;
  } else if (family == 2) {  // decode: <= 16 query rows per KV head, or just past it
    n = r.pick({1, 2, 4, 8, 32, 128, 129});
    Sq = r.pick({1, 1, 1, 2, 3, 4, 5, 8, 16, 17});
    Sk = r.chance(5) ? 0 : seq_len(r);
    Hkv = r.pick({1, 2, 4, 8, 32});
    group = r.pick({1, 2, 4, 5, 8, 16, 17, 32});
    D = r.pick({64, 128, 256, 8, 72, 96, 200});
  } else {
    nW = r.chance(20) ? r.pick({2, 4, 16, 64}) : 1;
    n = r.chance(70) ? r.pick(kSeqEdges) % 64 + 1 : seq_len(r);
    Sq = seq_len(r);
    Sk = r.chance(3) ? 0 : r.chance(50) ? Sq : seq_len(r);
    Hkv = r.chance(70) ? r.pick({1, 2, 4, 8, 12, 16, 24, 32}) : r.pick(kSeqEdges);
    group = r.chance(70) ? 1 : r.pick({2, 4, 5, 8, 16, 17, 32, 64});
  }
  if (family == 3) {  // huge: one size at its limit
    switch (r.below(5)) {
      case 0: nW = 1, n = r.pick({(int64_t(1) << 31) - 1, (int64_t(1) << 30) + 2, int64_t(1) << 30}); break;
      case 1: Sq = (int64_t(1) << 30) - r.pick({1, 64, 1000}); break;
      case 2: Sk = (int64_t(1) << 30) - r.pick({1, 64, 1000}); break;
      case 3: Hkv = 1, group = (int64_t(1) << 30) - r.pick({1, 64}); break;
      default: Hkv = (int64_t(1) << 29) - r.pick({1, 2}), group = r.pick({1, 2}); break;
    }
    D = r.chance(70) ? 8 : D;
  }
  // within fill_common's limits (B < 2^31, Sq, Sk, H < 2^30), then the largest size shrunk until q, k, v and out fit
  // (a huge call stays at the device's edge)
  n = std::min(n, ((int64_t(1) << 31) - 1) / nW);
  for (int64_t* s : {&Sq, &Sk}) *s = std::min(*s, (int64_t(1) << 30) - 1);
  Hkv = std::min(Hkv, (int64_t(1) << 30) - 1);
  while (Hkv * group >= (int64_t(1) << 30)) group = std::max<int64_t>(1, group / 2);
  auto bytes = [&] { return (2.0 * nW * n * Sq * Hkv * group + 2.0 * nW * n * Sk * Hkv) * D * 2; };
  while (bytes() > kDeviceBytes) {
    int64_t* sizes[] = {&n, &Sq, &Sk, &group, &Hkv};
    int64_t** big = &sizes[0];
    for (auto& s : sizes)
      if (*s > **big) big = &s;
    **big = std::max<int64_t>(1, **big / 2);
  }
  return make_call(nW * n, nW, Sq, Sk, Hkv * group, Hkv, D, dt);
}

Call random_call(Rng& r) {
  const int family = r.chance(45) ? 0 : r.chance(45) ? 1 : r.chance(60) ? 2 : 3;
  for (;;) {
    Call c = random_shape(r, family);
    add_terms(r, c, family == 1);
    if (fwd_bytes(c) <= kDeviceBytes) return c;  // (terms can outgrow the device: draw again)
  }
}

// ---- describing a call (a failure's reproduction) -------------------------------------------------------------------
const char* dtype_name(DType t) { return t == DType::kFloat16 ? "f16" : t == DType::kBFloat16 ? "bf16" : "f32"; }
std::string operand_str(const char* what, const Broadcast4d& b, int slot, int es) {
  if (!b.ptr) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf, " %s=%s[%lld,%lld,%lld,%lld] strides(%lld,%lld,%lld,%lld) offset %lld", what,
                es == 1 ? "bool" : dtype_name(b.dtype), (long long)b.period, (long long)b.heads, (long long)b.rows,
                (long long)b.cols, (long long)b.stride_b, (long long)b.stride_h, (long long)b.stride_q,
                (long long)b.stride_k, (long long)offset_of(b.ptr, slot, es));
  return buf;
}
std::string describe(const Call& c) {
  const BwdParams& p = c.p;
  char buf[512];
  std::snprintf(buf, sizeof buf, "B=%lld Sq=%lld Sk=%lld H=%lld Hkv=%lld D=%lld %s", (long long)p.batch,
                (long long)p.seqlen_q, (long long)p.seqlen_k, (long long)p.heads, (long long)p.heads_kv,
                (long long)p.head_dim, dtype_name(p.dtype));
  std::string s = buf;
  s += operand_str("bias", p.bias, kBias, esize(p.bias.dtype)) + operand_str("mask", p.mask, kMask, 1);
  if (p.key_padding)
    s += " key_padding strides(" + std::to_string(p.kp_stride_b) + "," + std::to_string(p.kp_stride_k) +
         ") offset " + std::to_string(offset_of(p.key_padding, kKp, 1));
  if (p.rel_table) s += " table T=" + std::to_string(p.table_rows);
  if (p.causal) s += " causal";
  if (p.window_left >= 0 || p.window_right >= 0)
    s += " window=(" + std::to_string(p.window_left) + "," + std::to_string(p.window_right) + ")";
  std::snprintf(buf, sizeof buf, " scale=%g", double(p.scale));
  s += buf;
  if (p.deterministic) s += " deterministic";
  if (c.grad_bias) s += " grad_bias";
  if (c.grad_table) s += " grad_table";
  return s;
}

// A choice in one line (--only, --repro; and compared whole where two choices must be the same).
std::string view_str(const KParams& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "bias=%s/%d[%d,%d,%d,%d] mode %d pitch %d%s mask=%s bits=[%d,%d,%d,%d]",
                p.bias.ptr == kWorkspaceTerm ? "prepared" : p.bias.ptr ? "given" : "-", p.bias.dtype, p.bias.period,
                p.bias.heads, p.bias.rows, p.bias.cols, p.bias_mode, p.bias_pitch, p.term_hides ? " hides" : "",
                p.mask.ptr ? "given" : "-", p.mb_period, p.mb_heads, p.mb_rows, p.mb_words);
  return buf;
}
std::string choice_str(const FwdChoice& c) {
  char buf[352];
  std::snprintf(buf, sizeof buf, "%s (%s) dk=%d block=%dx%d terms=%d tile=%d persistent=%d dynamic=%d kv_resident=%d "
                "stage=%d window_smem=%d comb=[%d,%d,%d,%d]%s dtype %d %lld bytes splits=%d chunk=%d part=%lld%s | ",
                name_of(c.kernel), c.why.c_str(), c.dk, c.block_m, c.block_n, c.v3_terms, c.v3_tile, c.v3_persistent,
                c.v3_dynamic, c.v3_kv_resident, c.v3_stage_bytes, c.window_smem, c.comb.P, c.comb.heads, c.comb.rows,
                c.comb.Skp, c.comb.mask ? "+mask" : "",
                c.comb.dtype, (long long)c.comb.bytes, c.decode_splits, c.decode_chunk,
                (long long)c.decode_part_bytes, c.decode_tma ? " tma" : "");
  return buf + view_str(c.p);
}
std::string choice_str(const BwdChoice& c) {
  const BwdV3Buffers& v = c.v3;
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (%s) dk=%d block=%dx%d terms=%d hides=%d dbias=%d [%d,%d,%d,%d] pitch %d%s "
                "pair=%d deep=%d defer=%d dq_mode=%d bufs=%d smem=%d window_smem=%d wide=%d comb=[%d,%d,%d,%d]%s "
                "dtype %d | ",
                name_of(c.kernel), c.why.c_str(), c.dk, c.block_m, c.block_n, v.terms, v.hides, v.dbias_mode,
                v.dbias_period, v.dbias_heads, v.dbias_rows, v.dbias_cols, v.dbias_pitch,
                v.dbias_padded ? " padded" : "", v.pair, v.deep, v.defer, v.dq_mode, v.dbias_bufs, v.smem,
                c.window_smem, c.wide,
                c.comb.P, c.comb.heads, c.comb.rows, c.comb.Skp, c.comb.mask ? "+mask" : "", c.comb.dtype);
  return buf + view_str(c.p);
}

// ---- the invariants' bookkeeping ------------------------------------------------------------------------------------
struct Stats {
  int64_t passed = 0, failed = 0;
  std::string first;
};
struct Sink {
  std::map<const char*, Stats> stats;  // (by literal; merged by name when printed)
  std::map<std::string, int64_t> cover;
  std::function<std::string()> where;  // the current call, device and forcing, described on a failure
  bool verbose = false;
  bool expect(const char* name, bool ok) {
    Stats& s = stats[name];
    if (ok) {
      ++s.passed;
    } else {
      if (s.failed++ == 0) s.first = where();
      if (verbose) std::printf("FAIL %s | %s\n", name, where().c_str());
    }
    return ok;
  }
  void covered(const std::string& path) { ++cover[path]; }
};

bool fits_int(int64_t x) { return x >= 0 && x <= INT_MAX; }
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// a * b * ... in int64, or -1 on overflow
int64_t product(std::initializer_list<int64_t> xs) {
  int64_t r = 1;
  for (int64_t x : xs)
    if (x < 0 || __builtin_mul_overflow(r, x, &r)) return -1;
  return r;
}
bool same_view(const Operand4d& a, const Operand4d& b) {
  return a.ptr == b.ptr && a.dtype == b.dtype && a.period == b.period && a.heads == b.heads && a.rows == b.rows &&
         a.cols == b.cols && a.sb == b.sb && a.sh == b.sh && a.sq == b.sq && a.sk == b.sk && a.vec2 == b.vec2;
}

// What every check reads: the call, the kernels' view of it before the choice, and the device.
struct Ctx {
  const BwdParams& bp;  // the call as planned (dbias / dtable set where gradients are asked for)
  const KParams& user;  // fill_common + mask_as_key_padding: what choose_fwd / choose_bwd start from
  const DeviceCaps& dev;
  const Forced& force;
  Sink& s;
  double tensor_bytes;  // the call's tensors (fwd_bytes / bwd_bytes)
  int dt() const { return dtype_code(bp.dtype); }
  // A kernel's size limits matter for calls that run: tensors and the planned workspace on the device (past it,
  // the workspace allocation fails first: an error, not a misbehaving kernel).
  bool runs(double workspace) const { return tensor_bytes + workspace <= kDeviceBytes; }
};

// ---- invariants of every choice: the problem, the terms and their preparation ---------------------------------------
// The kernels compute the call the user made: the choice may change how terms reach a kernel, never the problem.
void check_problem(const Ctx& x, const KParams& p) {
  const KParams& u = x.user;
  x.s.expect("view.problem_unchanged", p.B == u.B && p.Sq == u.Sq && p.Sk == u.Sk && p.H == u.H && p.Hkv == u.Hkv &&
                                           p.D == u.D && p.hgroup == u.hgroup && p.q == u.q && p.k == u.k &&
                                           p.v == u.v && p.o == u.o && p.lse == u.lse);
  x.s.expect("view.band_and_scale_unchanged", p.has_band == u.has_band && p.band_lo == u.band_lo &&
                                                  p.band_hi == u.band_hi && p.scale == u.scale);
  // key padding is read by every kernel (score_mod.h, score_terms_sm90.h, window_terms.h): never dropped or moved
  x.s.expect("view.key_padding_kept",
             p.kp == u.kp && p.kp_sb == u.kp_sb && p.kp_sk == u.kp_sk && p.kp_vec4 == u.kp_vec4);
  // the band calls' tile order (sm90 interleaved_tile, read by decode_tile / decode_bwd_tile): 1, 2 or 4 pairs, 1
  // without a band; over the call's (pair, 128-row block) grid a permutation, each pair's blocks rising with the CTA
  // index (the deterministic backward's tickets wait only on CTAs dispatched before them)
  const auto pairs_ok = [](int n) { return n == 1 || n == 2 || n == 4; };
  x.s.expect("view.band_pairs", pairs_ok(p.band_pairs) && pairs_ok(p.bwd_band_pairs) &&
                                     (p.has_band || (p.band_pairs == 1 && p.bwd_band_pairs == 1)));
  using Grid = std::array<int64_t, 3>;  // blocks per pair, pairs, pairs per section
  for (const Grid& g : {Grid{(p.Sq + 127) / 128, int64_t(p.B) * p.H, p.band_pairs},
                        Grid{(p.Sk + 127) / 128, int64_t(p.B) * p.Hkv, p.bwd_band_pairs}}) {
    const int64_t blocks = g[0], pairs = g[1];
    if (g[2] == 1 || blocks * pairs > (1 << 16)) continue;
    std::vector<int> seen(blocks * pairs, 0), last(pairs, -1);
    bool ok = true;
    for (int idx = 0; idx < blocks * pairs && ok; ++idx) {
      const sm90::PairBlock t = sm90::interleaved_tile(idx, int(blocks), int(pairs), int(g[2]));
      ok = t.pair >= 0 && t.pair < pairs && t.block >= 0 && t.block < blocks &&
           !seen[t.pair * blocks + t.block]++ && t.block > last[t.pair];
      if (ok) last[t.pair] = t.block;
    }
    x.s.expect("view.band_order_is_a_rising_permutation", ok);
  }
}

// The comb plan (CombPlan): combine_terms_kernel (aux_kernels.h) writes comb[P, heads, rows, Skp] reading the
// user's bias at [pp % bias.period][h][i][j], the mask at [pp % mask.period][h][i][j] and the table for h < heads,
// i < rows; the planner carves comb.bytes of workspace (Carver, int64) and the kernel's view is use_comb's.
void check_comb(const Ctx& x, const KParams& p, const CombPlan& c, int want_dtype) {
  const BwdParams& fp = x.bp;
  const KParams& u = x.user;
  const bool prepared = c.bytes > 0;
  // an empty key set reads no term (fwd_kernel.h writes the empty rows first; fwd() prepares nothing for it)
  if (u.Sk == 0) return;
  // no kernel reads the table itself (fwd_kernel.h, the window and v3 kernels read p.bias): it is always gathered
  x.s.expect("comb.table_is_prepared", !fp.rel_table || prepared);
  // the kernels' term is at the workspace placeholder exactly when a term is prepared (launch_combine replaces it)
  x.s.expect("comb.view_at_workspace", prepared == (p.bias.ptr == kWorkspaceTerm));
  if (!prepared) return;
  x.s.expect("comb.has_a_source", fp.rel_table || fp.bias.ptr || c.mask);
  const int64_t bytes = product({c.P, c.heads, c.rows, c.Skp, 2});
  x.s.expect("comb.bytes_exact_no_overflow", bytes > 0 && bytes == c.bytes);
  x.s.expect("comb.skp_rows_of_16_bytes", c.Skp == round_up(u.Sk, 8) && c.Skp % 8 == 0);
  // the window kernels group windows by the term's period and v3 reads b % P: P divides B
  x.s.expect("comb.period_divides_batch", c.P >= 1 && u.B % c.P == 0);
  x.s.expect("comb.dims_are_broadcasts", (c.heads == 1 || c.heads == u.H) && (c.rows == 1 || c.rows == u.Sq));
  x.s.expect("comb.dtype", c.dtype == want_dtype);
  // the prepared copy keeps every variation of what it combines (its period a multiple of each source's)
  const Operand4d& m = u.mask;
  const bool need_heads = fp.rel_table || (fp.bias.ptr && fp.bias.heads == u.H && u.H > 1) ||
                          (c.mask && m.heads == u.H && u.H > 1);
  const bool need_rows = fp.rel_table || (fp.bias.ptr && fp.bias.rows == u.Sq && u.Sq > 1) ||
                         (c.mask && m.rows == u.Sq && u.Sq > 1);
  x.s.expect("comb.covers_bias_period", !fp.bias.ptr || c.P % fp.bias.period == 0);
  x.s.expect("comb.covers_mask_period", !c.mask || (m.ptr && c.P % m.period == 0));
  x.s.expect("comb.covers_heads", !need_heads || c.heads == u.H);
  x.s.expect("comb.covers_rows", !need_rows || c.rows == u.Sq);
  // the kernels' view of the prepared tile (use_comb): rows of Skp elements, stride 0 on broadcast dims
  const Operand4d& o = p.bias;
  x.s.expect("comb.view_layout", o.dtype == c.dtype && o.period == c.P && o.heads == c.heads && o.rows == c.rows &&
                                     o.cols == u.Sk && o.sk == 1 && o.sq == (c.rows > 1 ? c.Skp : 0) &&
                                     o.sh == (c.heads > 1 ? int64_t(c.rows) * c.Skp : 0));
  // a folded mask is gone from the view and hides through the term (KParams::term_hides)
  x.s.expect("comb.folded_mask_hides", !c.mask || (p.term_hides && !p.mask.ptr && !p.mbits));
}

// The score terms of the call all reach the kernel: the bias (as given or prepared), the mask (as given, as bits,
// as key padding or folded into the term); a view kept as given is the user's, unchanged.
void check_terms_kept(const Ctx& x, const KParams& p, const CombPlan& c) {
  const KParams& u = x.user;
  x.s.expect("view.bias_kept", !u.bias.ptr || p.bias.ptr);
  x.s.expect("view.bias_as_given", p.bias.ptr == kWorkspaceTerm || same_view(p.bias, u.bias));
  x.s.expect("view.mask_kept", !u.mask.ptr || p.mask.ptr || p.mbits || c.mask);
  x.s.expect("view.mask_as_given", !p.mask.ptr || same_view(p.mask, u.mask));
  // term_hides only with a term that holds the folded -inf
  x.s.expect("view.hides_with_a_term", !p.term_hides || p.bias.ptr);
  // mask bits replace the mask; a folded mask is not bits too (window_hiding picks one instance)
  x.s.expect("bits.replace_the_mask", !p.mbits || (!p.mask.ptr && !p.term_hides && u.mask.ptr));
}

// Mask bits (aux_kernels.h mask_bits_kernel: [mb_period][mb_heads][mb_rows][mb_words], per_plane = rows * words
// in int) and their workspace (winattn_cuda.cu mask_bits_bytes).
void check_bits(const Ctx& x, const KParams& p, int mb_words, bool transposed, double workspace) {
  x.s.expect("bits.words_in_view", (p.mbits != nullptr) == (mb_words > 0) && p.mb_words == mb_words);
  if (!p.mbits) return;
  const Operand4d& m = x.user.mask;
  x.s.expect("bits.at_workspace", p.mbits == kWorkspaceTerm);
  x.s.expect("bits.mask_broadcast", p.mb_period == m.period && p.mb_heads == m.heads);
  const int64_t cover = transposed ? x.user.Sq : x.user.Sk;  // (transposed: rows are keys, words cover queries)
  x.s.expect("bits.words_cover_the_row", int64_t(mb_words) * 32 >= cover);
  x.s.expect("bits.rows", transposed ? p.mb_rows == x.user.Sk
                                     : (p.mb_rows == x.user.Sq || (p.mb_rows == 1 && m.rows == 1)));
  if (x.runs(workspace)) x.s.expect("bits.kernel_plane_fits_int", fits_int(int64_t(p.mb_rows) * mb_words));
  x.s.expect("bits.bytes_no_overflow", product({p.mb_period, p.mb_heads, p.mb_rows, mb_words, 4}) > 0);
}

// ---- forward --------------------------------------------------------------------------------------------------------
// The planner's forward workspace (plan_fwd: the prepared term, the mask bits, the decode partials).
double fwd_workspace(const FwdChoice& c) {
  const double bits = double(c.p.mb_period) * c.p.mb_heads * c.p.mb_rows * c.mb_words * 4;
  return double(c.comb.bytes) + (c.mb_words ? bits : 0) + double(c.decode_part_bytes);
}

// v1 (fwd_kernel.h): every call, the user's view (+ the table gathered into fp16), nothing it does not read.
void check_fwd_v1(const Ctx& x, const FwdChoice& c) {
  x.s.expect("fwd_v1.dk", c.dk == kernel_head_dim(x.user.D));
  x.s.expect("fwd_v1.no_bits_no_hiding", !c.p.mbits && !c.p.term_hides && !c.comb.mask);  // (apply_terms kMayHide=0)
  x.s.expect("fwd_v1.comb_only_the_table", c.comb.bytes == 0 || x.bp.rel_table);
}

// Decode (fwd_decode.h, instantiations/fwd_decode*.cu): one CTA per (split, KV head, batch) of <= 16 rows; keys
// [split * chunk, ..) in whole 128-key steps (the TMA kernel's tiles must not straddle splits); the partial rows
// o_part [splits, B, H, Sq, D] + lse_part [splits, B, H, Sq] fp32 carved by the planner.
void check_fwd_decode(const Ctx& x, const FwdChoice& c) {
  const KParams& u = x.user;
  x.s.expect("decode.rows_at_most_16", int64_t(u.hgroup) * u.Sq <= kDecodeMaxRows);
  x.s.expect("decode.keys_no_table", u.Sk > 0 && !x.bp.rel_table);
  x.s.expect("decode.tma_on_hopper", !c.decode_tma || x.dev.sm90a);
  x.s.expect("decode.view_is_the_call", same_view(c.p.bias, u.bias) && same_view(c.p.mask, u.mask) &&
                                            !c.p.mbits && !c.p.term_hides && c.comb.bytes == 0 && c.mb_words == 0);
  const int64_t splits = c.decode_splits, chunk = c.decode_chunk;
  x.s.expect("decode.chunk_whole_steps", chunk > 0 && chunk % kDecodeStep == 0);
  x.s.expect("decode.splits_cover_keys", splits >= 1 && splits * chunk >= u.Sk);
  x.s.expect("decode.no_empty_split", (splits - 1) * chunk < u.Sk);
  x.s.expect("decode.key_range_fits_int", fits_int(splits * chunk));  // (key_lo = split * chunk in int)
  const int64_t rows = product({splits, u.B, u.H, u.Sq});
  const int64_t part = splits > 1 ? product({rows, u.D + 1, 4}) : 0;
  x.s.expect("decode.part_bytes", rows > 0 && part >= 0 && c.decode_part_bytes == part);
  // launch_decode: <<<unsigned(splits * Hkv * B)>>>, decode_combine_kernel <<<unsigned(B * H * Sq)>>> (gridDim.x
  // < 2^31)
  if (x.runs(fwd_workspace(c)))
    x.s.expect("decode.grid_fits", fits_int(product({splits, u.Hkv, u.B})) &&
                                       (splits == 1 || fits_int(product({u.B, u.H, u.Sq}))));
}

// The window forward (sm90/fwd_windows_sm90.h): instances D 32 / 64 x key blocks 64 .. 256, every window's keys in
// one block, <= 4 query tiles of 64, the term shared by the CTA's windows (grouped by its period), its table fp16
// past 160 keys, masks and bands only in the 64-key tile (apply_terms), mask bits by TMA boxes [64][mb_words].
void check_fwd_windows(const Ctx& x, const FwdChoice& c) {
  const KParams& p = c.p;
  const int bn = c.window_bn;
  x.s.expect("windows.hopper", x.dev.sm90a);
  x.s.expect("windows.instance", (c.dk == 32 || c.dk == 64) && c.dk == kernel_head_dim(p.D));
  x.s.expect("windows.key_block", bn > 0 && bn == window_key_block(c.dk, p.Sk) && p.Sk > 0 && p.Sk <= bn &&
                                      c.block_m == 64 && c.block_n == bn);
  x.s.expect("windows.query_tiles", p.Sq <= 256);
  x.s.expect("windows.period_divides_batch", p.B % (p.bias.ptr ? p.bias.period : 1) == 0);
  x.s.expect("windows.wide_tiles_no_mask_or_band", bn == 64 || (!p.mask.ptr && !p.has_band));
  x.s.expect("windows.half_table_fp16", bn <= 160 || !p.bias.ptr || p.bias.dtype == 0);
  x.s.expect("windows.comb_fp16", c.comb.bytes == 0 || c.comb.dtype == 0);
  int need = 0, bits_end = 0;
  dispatch_window_tiles(c.dk, bn, [&](auto d, auto n) {
    using Tr = typename sm90::FwdWindowTraitsSm90For<decltype(d)::value, decltype(n)::value>::type;
    need = Tr::kSmemBytes + (p.bias.ptr && !sm90::window_term_aliased<Tr>(p) ? Tr::kBlockM * p.bias_pitch : 0);
    bits_end = 1024 + sm90::fwd_windows_bits_offset<Tr>(p) + 2 * Tr::kBlockM * c.mb_words * 4;
  });
  // (the kernel aligns its base up to 1 KB, then the tiles, the table, the raw term tile, the two bits buffers)
  x.s.expect("windows.smem_covers_layout", c.window_smem >= need && (c.mb_words == 0 || c.window_smem >= bits_end));
  x.s.expect("windows.smem_fits", c.window_smem <= x.dev.smem_optin);
  if (p.bias.ptr) {  // the planner's staging mode of the raw tile at this key block (choose_bias_mode)
    KParams again = p;
    choose_bias_mode(again, bn);
    x.s.expect("windows.bias_mode", again.bias_mode == p.bias_mode && again.bias_pitch == p.bias_pitch);
  }
  check_bits(x, p, c.mb_words, false, fwd_workspace(c));
  x.s.expect("windows.bits_box", !p.mbits || (bn > 64 && c.mb_words % 4 == 0 && c.mb_words <= 256 &&
                                               p.mb_rows == p.Sq && !p.has_band));
}

// Forward v3 as launched (sm90/launch_sm90.h run_fwd_pipelined_sm90): the tile the launcher takes for a term mode and
// tile, and the shared memory it asks for (kSmemBytes + kStages x the staged tile, or the row slots of the row modes:
// PipeSmem::row_bytes in fwd_pipelined_sm90.h, PadBits in score_terms_sm90.h: (BN / 32 + 1) words in 16-byte units).
struct Launched {
  int bm = 0, bn = 0, smem = 0;
  bool stream = false;  // the streamed tiles' loop (consume_stream), not consume()'s
  int stages = 0;
};
template <typename Tr>
Launched launched(int mode, int stage_bytes) {
  const int pad = (Tr::kBlockN / 32 + 1 + 3) / 4 * 16;
  const int row = Tr::kBlockN * 4 + (mode == sm90::kTermsRawRowPadded ? pad : 0);
  return {Tr::kBlockM, Tr::kBlockN, Tr::kSmemBytes + Tr::kStages * (sm90::stages_row_term(mode) ? row : stage_bytes),
          Tr::kStream, Tr::kStages};
}
template <int D>
Launched fwd_v3_launched(int terms, int tile, int stage) {
  using Narrow = typename sm90::FwdPipeTraitsSm90For<D>::narrow;
  using Wide = typename sm90::FwdPipeTraitsSm90For<D>::wide;
  using S = sm90::FwdPipeStreamTilesSm90<D>;
  using TwoCtas = typename sm90::FwdPipeTwoCtasTileSm90<D>::type;
  using Rows192 = typename sm90::FwdPipeRows192TileSm90<D>::type;
  using Ragged = typename sm90::FwdPipeRaggedTileSm90<D>::type;
  const bool k128 = tile == sm90::kV3Keys128;
  switch (terms) {
    case sm90::kTermsRawBias:
      return tile == sm90::kV3TwoCtas          ? launched<TwoCtas>(terms, stage)
             : tile == sm90::kV3TwoCtasRagged ? launched<Ragged>(terms, stage)
                                               : launched<Narrow>(terms, stage);
    case sm90::kTermsRawBiasPadded:
    case sm90::kTermsRawBiasMasked:
    case sm90::kTermsGeneral: return launched<Narrow>(terms, stage);
    case sm90::kTermsRawRow:
    case sm90::kTermsRawRowPadded:
    case sm90::kTermsRawBits:
      return k128 ? launched<typename S::keys128>(terms, stage) : launched<Narrow>(terms, stage);
    default: break;
  }
  switch (tile) {
    case sm90::kV3Wide: return launched<Wide>(terms, stage);
    case sm90::kV3Keys80: return launched<typename S::keys80>(terms, stage);
    case sm90::kV3Keys128: return launched<typename S::keys128>(terms, stage);
    case sm90::kV3Keys208: return launched<typename S::keys208>(terms, stage);
    case sm90::kV3Stream: return launched<typename S::any>(terms, stage);
    case sm90::kV3TwoCtas: return launched<TwoCtas>(terms, stage);
    case sm90::kV3TwoCtasRagged: return launched<Ragged>(terms, stage);
    case sm90::kV3Rows192: return launched<Rows192>(terms, stage);
    default: return launched<Narrow>(terms, stage);
  }
}
Launched fwd_v3_launched_for(int dk, int terms, int tile, int stage) {
  switch (dk) {
    case 32: return fwd_v3_launched<32>(terms, tile, stage);
    case 48: return fwd_v3_launched<48>(terms, tile, stage);
    case 64: return fwd_v3_launched<64>(terms, tile, stage);
    case 80: return fwd_v3_launched<80>(terms, tile, stage);
    case 96: return fwd_v3_launched<96>(terms, tile, stage);
    case 128: return fwd_v3_launched<128>(terms, tile, stage);
    case 160: return fwd_v3_launched<160>(terms, tile, stage);
    case 192: return fwd_v3_launched<192>(terms, tile, stage);
    default: return fwd_v3_launched<256>(terms, tile, stage);
  }
}

// Forward v3 (sm90/fwd_pipelined_sm90.h, score_terms_sm90.h): each term mode reads what its instance was built for.
void check_fwd_v3(const Ctx& x, const FwdChoice& c) {
  const KParams& p = c.p;
  const int t = c.v3_terms;
  const bool staged = t == sm90::kTermsRawBias || t == sm90::kTermsRawBiasMasked || t == sm90::kTermsRawBiasPadded;
  const bool row = sm90::stages_row_term(t);
  x.s.expect("v3.hopper_and_keys", x.dev.sm90a && p.Sk > 0);  // (a tensor map needs nonzero extents)
  x.s.expect("v3.instance", c.dk == v3_head_dim(p.D) && c.dk >= p.D);
  // the launcher takes the narrow tile for the staged and general modes (and the two-CTA one for the staged term
  // alone where it has one), the 128-key one or the narrow one for the row and bits modes: the chosen tile must be
  // the one that runs
  const bool two_ctas_staged = t == sm90::kTermsRawBias &&
                               (c.v3_tile == sm90::kV3TwoCtas || c.v3_tile == sm90::kV3TwoCtasRagged) &&
                               sm90::fwd_v3_two_ctas_stage_term(c.dk);
  x.s.expect("v3.tile_of_the_mode",
             (staged || t == sm90::kTermsGeneral) ? c.v3_tile == sm90::kV3Narrow || two_ctas_staged
             : (row || t == sm90::kTermsRawBits)  ? (c.v3_tile == sm90::kV3Narrow || c.v3_tile == sm90::kV3Keys128)
                                                  : true);
  if (two_ctas_staged) x.s.covered(c.v3_tile == sm90::kV3TwoCtas ? "fwd_v3 two-ctas staged" : "fwd_v3 ragged staged");
  const Launched l = fwd_v3_launched_for(c.dk, t, c.v3_tile, c.v3_stage_bytes);
  x.s.expect("v3.block_is_the_launched_tile", c.block_m == l.bm && c.block_n == l.bn);
  // the dynamic schedule (fwd_pipelined_sm90.h): persistent, consume()'s loop (no streamed tile, no row warp), and
  // every query tile sees a key, row by row here (the rows that see one: [max(0, i + lo), min(Sk, i + hi + 1)))
  if (c.v3_dynamic) {
    x.s.covered("fwd_v3 dynamic");
    x.s.expect("v3.dynamic_is_persistent", c.v3_persistent && !l.stream && !sm90::stages_row(t));
    x.s.expect("v3.dynamic_has_its_instance", t == sm90::kTermsRaw && c.v3_tile == sm90::kV3Narrow);
    const int64_t rows = std::min<int64_t>(p.Sq, int64_t(1) << 16);  // (the band's runs: the first 2^16 rows and
    auto sees = [&](int64_t i) {                                      //  the last tile suffice for these shapes)
      return std::max<int64_t>(0, i + p.band_lo) <= std::min<int64_t>(p.Sk - 1, i + p.band_hi);
    };
    bool all = true;
    for (int64_t m0 = 0; m0 < rows && all; m0 += c.block_m) {
      bool any = false;
      for (int64_t i = m0; i < std::min<int64_t>(m0 + c.block_m, p.Sq) && !any; ++i) any = sees(i);
      all = any;
    }
    const int64_t last0 = int64_t(div_up(p.Sq, c.block_m) - 1) * c.block_m;
    bool last_any = false;
    for (int64_t i = last0; i < p.Sq && !last_any; ++i) last_any = sees(i);
    x.s.expect("v3.dynamic_tiles_see_a_key", all && last_any);
  }
  // K / V resident across a head's query tiles (fwd_pipelined_sm90.h kv_reuse): the kernel computes each tile on the
  // K / V its stages hold, so every tile's key blocks must fill the stages exactly, in the same order, on the strided
  // persistent walk (walk_tile remaps its positions)
  if (c.v3_kv_resident) {
    x.s.covered("fwd_v3 kv-resident");
    x.s.expect("v3.kv_resident_tiles_fill_the_stages",
               t == sm90::kTermsRaw && l.stream && c.v3_persistent && !c.v3_dynamic && !p.has_band &&
                   div_up(p.Sk, l.bn) == l.stages);
  }
  x.s.expect("v3.band_calls_dynamic_where_they_can",
             x.force.v3_persistent >= 0 || !p.has_band || c.v3_dynamic || t != sm90::kTermsRaw ||
                 c.v3_tile != sm90::kV3Narrow || !no_empty_tiles(p, c.block_m));
  x.s.expect("v3.smem_fits", l.smem <= x.dev.smem_optin);
  // staged modes: a TMA box [BM x 64 columns] of the input dtype per stage (make_bias_map: 16-byte aligned rows)
  x.s.expect("v3.staged_iff_stage_bytes", staged == (c.v3_stage_bytes > 0));
  if (staged) {
    x.s.expect("v3.staged_term_is_stageable", v3_stageable(p.bias, p, x.dt()) && !p.mask.ptr && p.scale > 0.f);
    x.s.expect("v3.staged_box", c.v3_stage_bytes == l.bm * l.bn * 2 && l.bn % 64 == 0);
  }
  x.s.expect("v3.masked_instance_iff_hides", (t == sm90::kTermsRawBiasMasked) == (staged && p.term_hides));
  x.s.expect("v3.hides_only_where_read", !p.term_hides || t == sm90::kTermsRawBiasMasked || t == sm90::kTermsGeneral);
  x.s.expect("v3.padded_modes_have_padding",
             !sm90::stages_padding(t) ||
                 (p.kp && (t != sm90::kTermsRawBiasPadded || sm90::fwd_v3_stages_padding(c.dk))));
  // the row modes stage one value per key (stage_row_term: [.., 1, Sk] read at j * sk), whole 32-key words
  x.s.expect("v3.row_term", !row || ((p.bias.ptr ? row_term(p.bias, p) : t == sm90::kTermsRawRowPadded) &&
                                     !p.mask.ptr && !p.mbits && p.scale > 0.f && l.bn % 32 == 0));
  // raw modes scale in the exponent (scale > 0) and read no term
  x.s.expect("v3.raw_reads_nothing", t != sm90::kTermsRaw || (!p.bias.ptr && !p.mask.ptr && !p.mbits &&
                                                              !p.term_hides && p.scale > 0.f));
  x.s.expect("v3.general_for_the_rest", (p.scale > 0.f && !p.mask.ptr) || t == sm90::kTermsGeneral);
  x.s.expect("v3.bits_mode_iff_bits", (t == sm90::kTermsRawBits) == (p.mbits != nullptr));
  if (p.mbits) {
    x.s.expect("v3.bits_alone", !p.bias.ptr && p.scale > 0.f && c.mb_words % 4 == 0);
    // load_mask_bits reads BN / 32 words of key block n at word n * BN / 32, for every block up to ceil(Sk / BN)
    x.s.expect("v3.bits_cover_whole_key_blocks", int64_t(c.mb_words) * 32 >= cdiv(p.Sk, l.bn) * l.bn);
  }
  check_bits(x, p, c.mb_words, false, fwd_workspace(c));
  x.s.expect("v3.comb_input_dtype", c.comb.bytes == 0 || c.comb.dtype == x.dt());
  // the kernels count tiles in int (fwd_pipelined_sm90.h: ntiles = ceil(Sq / BM) * H * B; per tile one CTA)
  const int64_t tiles = product({cdiv(p.Sq, l.bm), p.H, p.B});
  if (x.runs(fwd_workspace(c))) x.s.expect("v3.tiles_fit_int", fits_int(tiles));
}

// The forced kernel is the one that runs, with the variant that was asked for.
void check_forced_fwd(const Ctx& x, const FwdChoice& c) {
  const Forced& f = x.force;
  if (f.fwd == FwdKernel::kAuto) return;
  x.s.expect("force.fwd_kernel_taken", c.kernel == f.fwd);
  if (c.kernel == FwdKernel::kV3) {
    const int want[] = {-1, sm90::kV3Narrow, sm90::kV3Wide, -1, sm90::kV3Stream, sm90::kV3TwoCtas, sm90::kV3Rows192,
                        sm90::kV3TwoCtasRagged};
    const bool shorts = c.v3_tile == sm90::kV3Keys80 || c.v3_tile == sm90::kV3Keys128 || c.v3_tile == sm90::kV3Keys208;
    x.s.expect("force.v3_tile_taken", f.v3_tile == 0 || (f.v3_tile == 3 ? shorts : c.v3_tile == want[f.v3_tile]));
    x.s.expect("force.v3_schedule_taken",
               f.v3_persistent < 0 || (c.v3_persistent == (f.v3_persistent >= 1) &&
                                       c.v3_dynamic == (f.v3_persistent == 2)));
  }
  if (c.kernel == FwdKernel::kDecode) x.s.expect("force.decode_tma_taken", c.decode_tma == f.decode_tma);
}

void check_fwd(const Ctx& x, const FwdChoice& c) {
  check_problem(x, c.p);
  check_terms_kept(x, c.p, c.comb);
  const int comb_dtype = c.kernel == FwdKernel::kV3 ? x.dt() : 0;
  check_comb(x, c.p, c.comb, comb_dtype);
  // the planner's forward workspace (plan_fwd: comb, mask bits, decode partials, 256-byte aligned, int64)
  const int64_t bits = c.mb_words ? product({c.p.mb_period, c.p.mb_heads, c.p.mb_rows, c.mb_words, 4}) : 0;
  x.s.expect("fwd.workspace_no_overflow", bits >= 0 && c.comb.bytes >= 0 && c.decode_part_bytes >= 0 &&
                                              double(c.comb.bytes) + bits + c.decode_part_bytes < 9.2e18);
  // an empty key set runs v1, which writes out = 0, lse = -inf before reading anything (v3 cannot map it, decode
  // and the window kernels refuse it)
  x.s.expect("fwd.empty_keys_on_v1", x.user.Sk > 0 || c.kernel == FwdKernel::kV1);
  check_forced_fwd(x, c);
  switch (c.kernel) {
    case FwdKernel::kV1: x.s.covered("fwd_v1"); check_fwd_v1(x, c); break;
    case FwdKernel::kDecode: x.s.covered(c.decode_tma ? "fwd_decode_tma" : "fwd_decode"); check_fwd_decode(x, c); break;
    case FwdKernel::kWindows:
      x.s.covered("fwd_windows bn=" + std::to_string(c.window_bn) + (c.mb_words ? " bits" : "") +
                  (c.comb.mask ? " folded" : ""));
      check_fwd_windows(x, c);
      break;
    case FwdKernel::kV3:
      x.s.covered("fwd_v3 terms=" + std::to_string(c.v3_terms) + " tile=" + std::to_string(c.v3_tile));
      if (c.v3_tile == sm90::kV3Rows192) x.s.covered("fwd_v3 rows192 d" + std::to_string(c.dk));
      check_fwd_v3(x, c);
      break;
    default: x.s.expect("fwd.known_kernel", false);
  }
}

// ---- backward -------------------------------------------------------------------------------------------------------
// The shared memory backward v3's kernels use (bwd_v3_common_sm90.h BwdSmem, launch_bwd_sm90.h pick_pair): the
// tiles (a second K / V set in pair mode), the staged bias stages, then either the dbias staging tiles (16-bit or
// fp32; + the fp32 pair sum of kDbiasStore16) or the third dS^T tile of deferred dQ (the instances without a dbias
// tile: no term, row terms, bits always, the others where the plan says defer).
template <int D>
int bwd_v3_smem_used(const BwdV3Buffers& v, int hgroup) {
  using Tr = typename sm90::BwdPipeTraitsSm90For<D>::type;
  using Deep = typename sm90::BwdPipeTraitsSm90For<D>::deep;
  if constexpr (D == 64)  // 128 queries per step: its own tiles (two stages) and the third dS^T tile
    if (v.block_m == 128) {
      using Q128 = sm90::BwdPipeTraitsSm90For<64>::q128;
      return Q128::kSmemBytes + Q128::kDSBytes;
    }
  if (v.deep && v.dq_mode == kBwdDqResident)  // (+ the group's dQ, fp32, after the third dS^T tile: BwdSmem::dq)
    return Deep::kSmemBytes + Deep::kDSBytes + hgroup * v.sq_pad * D * 4;
  if (v.deep) return Deep::kSmemBytes + (Deep::kSplitD ? 0 : Deep::kDSBytes);
  const int read = bwd_terms_read(v.terms);
  const bool always_defer = read == kBwdTermsNone || read == kBwdTermsRow || read == kBwdTermsBits;
  const bool pair_kernel = D == 64 && v.pair && read == kBwdTermsStaged;
  const bool defer = !Tr::kSplitD && !pair_kernel && (always_defer || v.defer);
  const int staged = v.terms == kBwdTermsStaged ? Tr::kStages * Tr::kBiasBytes : 0;
  int dbias = 0;
  if (v.dbias_mode == kDbiasStore16) dbias = v.dbias_bufs * Tr::kBiasBytes + (v.pair ? Tr::kDbiasBytes : 0);
  if (v.dbias_mode == kDbiasStore || v.dbias_mode == kDbiasReduce) dbias = v.dbias_bufs * Tr::kDbiasBytes;
  return Tr::kSmemBytes + (pair_kernel ? 2 * Tr::kKVBytes : 0) + staged + std::max(dbias, defer ? Tr::kDSBytes : 0);
}
int bwd_v3_smem_used_for(int dk, const BwdV3Buffers& v, int hgroup) {
  switch (dk) {
    case 64: return bwd_v3_smem_used<64>(v, hgroup);
    case 96: return bwd_v3_smem_used<96>(v, hgroup);
    case 128: return bwd_v3_smem_used<128>(v, hgroup);
    default: return bwd_v3_smem_used<256>(v, hgroup);
  }
}

// The dbias route (configure_bwd_v3, launch_bwd_sm90.h): TMA store / reduce-add of full rows (fp32 rows of whole
// 16-byte units, else a padded copy), the 16-bit store where the caller allocated dbias in the bias dtype
// (bwd_dbias_layout; bwd() throws a logic_error otherwise), atomics for broadcast rows / columns; a store has one
// writer per element (or pair mode's two batches in one CTA); deterministic runs only order-independent routes.
void check_bwd_v3_dbias(const Ctx& x, const BwdChoice& c) {
  const BwdParams& bp = x.bp;
  const BwdV3Buffers& v = c.v3;
  const KParams& u = x.user;
  x.s.expect("bwd_v3.dbias_iff_requested", (bp.dbias != nullptr) == (v.dbias_mode != kDbiasNone));
  if (!bp.dbias) return;
  const Broadcast4d& b = bp.bias;
  const bool full = b.rows == u.Sq && b.cols == u.Sk;
  // writers per dbias element (-1: past int64, many)
  const int64_t writers =
      product({u.B / b.period, u.H / b.heads, b.rows == u.Sq ? 1 : u.Sq, b.cols == u.Sk ? 1 : u.Sk});
  const bool one = writers == 1, two = writers == 2, many = writers < 0 || writers > 2;
  const bool store = v.dbias_mode == kDbiasStore || v.dbias_mode == kDbiasStore16;
  x.s.expect("bwd_v3.dbias_broadcast", v.dbias_period == b.period && v.dbias_heads == b.heads &&
                                           v.dbias_rows == b.rows && v.dbias_cols == b.cols);
  x.s.expect("bwd_v3.dbias_atomic_iff_broadcast_rows", (v.dbias_mode == kDbiasAtomic) == !full);
  x.s.expect("bwd_v3.dbias_store_one_writer", !store || one || (v.pair && two));
  x.s.expect("bwd_v3.dbias_reduce_shared", v.dbias_mode != kDbiasReduce || two || many);
  x.s.expect("bwd_v3.dbias_deterministic", !bp.deterministic || (full && !many));
  x.s.expect("bwd_v3.dbias_store16_in_bias_dtype",
             v.dbias_mode != kDbiasStore16 || (bp.dbias_in_bias_dtype && b.dtype == bp.dtype && u.Sk % 8 == 0));
  x.s.expect("bwd_v3.dbias_store16_when_allocated", !bp.dbias_in_bias_dtype || v.dbias_mode == kDbiasStore16);
  x.s.expect("bwd_v3.dbias_pitch", v.dbias_padded == (full && u.Sk % 4 != 0) &&
                                       v.dbias_pitch == (v.dbias_padded ? round_up(u.Sk, 4) : u.Sk) &&
                                       (v.dbias_mode == kDbiasAtomic || v.dbias_mode == kDbiasStore16 ||
                                        v.dbias_pitch % 4 == 0));
  x.s.expect("bwd_v3.pair",
             !v.pair || (c.dk == 64 && store && u.B == 2 * int64_t(v.dbias_period) && v.dbias_heads == u.H));
}

// The planner's backward workspace (carve_bwd_v3; plan_bwd: dQ accumulation, delta, the prepared term, the bits).
double bwd_workspace(const BwdChoice& c) {
  const KParams& p = c.p;
  const double bits = c.mb_words ? double(p.mb_period) * p.mb_heads * p.mb_rows * c.mb_words * 4 : 0;
  const double rows = double(p.B) * p.H * (c.kernel == BwdKernel::kV3 ? c.v3.sq_pad : p.Sq);
  const double dq = c.kernel == BwdKernel::kV3 ? (c.v3.dq_mode != kBwdDqAccumulate ? 0 : rows * c.dk * 4)
                    : c.kernel == BwdKernel::kV1 ? rows * p.D * 4 : 0;
  return double(c.comb.bytes) + bits + dq + 2 * rows * 4;
}

// Backward v3 (sm90/bwd_pipelined_sm90.h, bwd_split_d_sm90.h past head dim 128): the term modes its instances read.
void check_bwd_v3(const Ctx& x, const BwdChoice& c) {
  const KParams& p = c.p;
  const BwdV3Buffers& v = c.v3;
  const int t = v.terms;
  x.s.expect("bwd_v3.hopper_no_table_grad", x.dev.sm90a && !x.bp.dtable && p.Sk > 0);
  x.s.expect("bwd_v3.instance", c.dk == bwd_v3_head_dim(p.D) && c.dk >= p.D);
  x.s.expect("bwd_v3.block", c.block_m == v.block_m && c.block_n == (c.dk == 256 ? 64 : 128));
  x.s.expect("bwd_v3.sq_pad", v.sq_pad == round_up(p.Sq, v.block_m));
  // 128 queries per step: head dim 64, the deep kernel's calls, dQ accumulated (not deterministic) or stored
  // directly; the table's from kQ128MinQueries queries wherever it can run
  const bool q128 = v.block_m == 128;
  const bool q128_ok = c.dk == 64 && v.deep && !v.pair &&
                       (v.dq_mode == kBwdDqDirect || (v.dq_mode == kBwdDqAccumulate && !x.bp.deterministic));
  x.s.expect("bwd_v3.q128_kernel", v.block_m == 64 || (q128 && q128_ok));
  x.s.expect("bwd_v3.q128_where_it_runs", x.force.bwd_q128 >= 0 || x.force.bwd_dq >= 0 ||
                                              q128 == (q128_ok && p.Sq >= kQ128MinQueries));
  // each dQ tile has one contributor (one key block, every query block visited), on a kernel that has the store
  // (launch_bwd_sm90.h pick_dq_direct: the deep one without a term, the deferred row-term and bits ones)
  const bool direct = v.dq_mode == kBwdDqDirect, resident = v.dq_mode == kBwdDqResident;
  // the table's own choice: direct wherever it can run, else resident from kDqResidentMinCtasPerSm CTAs per SM
  x.s.expect("bwd_v3.dq_mode_forced", x.force.bwd_dq < 0 || v.dq_mode == x.force.bwd_dq);
  x.s.expect("bwd_v3.dq_resident_enough_ctas", !resident || x.force.bwd_dq >= 0 ||
                                                   int64_t(p.B) * p.Hkv >= int64_t(kDqResidentMinCtasPerSm) * x.dev.sms);
  x.s.expect("bwd_v3.dq_direct_one_writer", !direct || (p.Sk <= c.block_n && !p.has_band && c.dk != 256));
  x.s.expect("bwd_v3.dq_direct_kernel", !direct || (!v.pair && v.defer && (v.deep || t == kBwdTermsRow ||
                                                                           t == kBwdTermsBits)));
  // one CTA per (batch, KV head) on the deep kernel, the group's dQ [heads][sq_pad][dk] fp32 in its shared memory
  x.s.expect("bwd_v3.dq_resident_kernel", !resident || (v.deep && !v.pair && c.dk <= 96 &&
                                                        int64_t(p.B) * p.Hkv <= kIntCountMax));
  x.s.expect("bwd_v3.smem_covers_layout", v.smem >= bwd_v3_smem_used_for(c.dk, v, p.hgroup));
  x.s.expect("bwd_v3.smem_fits", v.smem <= x.dev.smem_optin);
  x.s.expect("bwd_v3.deep_without_terms", !v.deep || t == kBwdTermsNone);
  // the split head-dim consumer reads every term from global memory (pick_terms has no other instance there)
  x.s.expect("bwd_v3.split_reads_global", c.dk != 256 || t == kBwdTermsNone || t == kBwdTermsGlobal);
  x.s.expect("bwd_v3.none_reads_nothing", t != kBwdTermsNone || (!p.bias.ptr && !p.mask.ptr && !p.mbits));
  x.s.expect("bwd_v3.mask_read_globally", !p.mask.ptr || t == kBwdTermsGlobal);
  x.s.expect("bwd_v3.staged_term", t != kBwdTermsStaged || (v3_stageable(p.bias, p, x.dt()) && c.dk != 256));
  x.s.expect("bwd_v3.row_term", (t != kBwdTermsRow && t != kBwdTermsRowKeyGrad) || row_term(p.bias, p));
  x.s.expect("bwd_v3.key_grad", t != kBwdTermsRowKeyGrad ||
                                    (v.dbias_mode == kDbiasAtomic && v.dbias_rows == 1 && v.dbias_cols == p.Sk));
  x.s.expect("bwd_v3.hides", v.hides == (p.term_hides && (t == kBwdTermsStaged || t == kBwdTermsRow)) &&
                                 (!p.term_hides || t == kBwdTermsGlobal || v.hides));
  x.s.expect("bwd_v3.bits_mode_iff_bits", (t == kBwdTermsBits) == (p.mbits != nullptr));
  // load_key_bits reads the word pair 2 m, 2 m + 1 of each key's row for query block m < sq_pad / 64 (uint2)
  x.s.expect("bwd_v3.bits_cover_query_blocks",
             !p.mbits || (c.mb_words % 4 == 0 && c.mb_words >= 2 * (v.sq_pad / kBwdV3BlockM) && !p.bias.ptr));
  check_bits(x, p, c.mb_words, true, bwd_workspace(c));
  x.s.expect("bwd_v3.comb_input_dtype", c.comb.bytes == 0 || c.comb.dtype == x.dt());
  x.s.expect("bwd_v3.pair_instance", !v.pair || bwd_terms_read(t) == kBwdTermsStaged);
  check_bwd_v3_dbias(x, c);
  // <<<unsigned(ceil(Sk / BN) * Hkv * B)>>> (B / 2 in pair mode); dq_frag_convert <<<unsigned(B * H * sq_pad / 64)>>>
  if (x.runs(bwd_workspace(c)))
    x.s.expect("bwd_v3.grids_fit", fits_int(product({cdiv(p.Sk, c.block_n), p.Hkv, v.pair ? p.B / 2 : p.B})) &&
                                       fits_int(product({p.B, p.H, v.sq_pad / kBwdV3BlockM})));
}

// The 64-token window backward (sm90/bwd_windows_sm90.h): head dim 32, one 64 x 64 tile per window, no GQA, the term
// shared by the CTA's windows; every term through apply_terms without hiding (score_mod.h kMayHide = false).
void check_bwd_windows(const Ctx& x, const BwdChoice& c) {
  const KParams& p = c.p;
  x.s.expect("bwd_windows.shape", x.dev.sm90a && c.dk == 32 && p.D <= 32 && p.Sq <= 64 && p.Sk <= 64 &&
                                      p.H == p.Hkv && c.block_m == 64 && c.block_n == 64);
  x.s.expect("bwd_windows.period_divides_batch", p.B % (p.bias.ptr ? p.bias.period : 1) == 0);
  x.s.expect("bwd_windows.no_bits_no_hiding", !p.mbits && !p.term_hides && c.mb_words == 0);
  using Tr = sm90::BwdWindowTraitsSm90For<32>::type;
  const int need = Tr::kSmemBytes + (p.bias.ptr && !sm90::window_term_aliased<Tr>(p) ? 64 * p.bias_pitch : 0);
  x.s.expect("bwd_windows.smem", c.window_smem >= need && c.window_smem <= x.dev.smem_optin);
  x.s.expect("bwd_windows.comb_fp16", c.comb.bytes == 0 || c.comb.dtype == 0);
}

// The wide-window backward (sm90/bwd_windows_wide_sm90.h): head dim 32, windows of 65 .. 256 tokens in the
// 128 / 144 / 256 instance (lse2 rows padded to its kWindow), an fp16 term table, no band, a mask as transposed bits
// or folded, a gradient summed over windows; the 256 instance runs clusters of four.
void check_bwd_wide(const Ctx& x, const BwdChoice& c) {
  const KParams& p = c.p;
  const int n = std::max(p.Sq, p.Sk);
  x.s.expect("bwd_wide.shape", x.dev.sm90a && c.dk == 32 && p.D <= 32 && p.H == p.Hkv && n > 64 && n <= c.wide &&
                                   (c.wide == 128 || c.wide == 144 || c.wide == 256) &&
                                   c.wide == (n <= 128 ? 128 : n <= 144 ? 144 : 256));
  x.s.expect("bwd_wide.fp16_term_no_band", p.bias.ptr && p.bias.dtype == 0 && !p.has_band && !p.mask.ptr);
  x.s.expect("bwd_wide.period_divides_batch", p.B % p.bias.period == 0);
  x.s.expect("bwd_wide.clusters", c.wide != 256 || x.dev.wide_cluster_slots > 0);
  int smem = 0, window = 0;
  auto traits = [&](auto tr) { smem = decltype(tr)::kSmemBytes, window = decltype(tr)::kWindow; };
  if (c.wide == 128) traits(sm90::BwdWideWindowTraitsSm90For<128>::type{});
  else if (c.wide == 144) traits(sm90::BwdWideWindowTraitsSm90For<144>::type{});
  else traits(sm90::BwdWideWindowTraitsSm90For<256>::type{});
  x.s.expect("bwd_wide.smem", c.window_smem == smem && smem <= x.dev.smem_optin);
  x.s.expect("bwd_wide.lse_rows", window == c.wide);  // (run_bwd_windows_wide_sm90 throws otherwise)
  check_bits(x, p, c.mb_words, true, bwd_workspace(c));
  x.s.expect("bwd_wide.bits_cover_window", !p.mbits || c.mb_words * 32 >= c.wide);
  x.s.expect("bwd_wide.comb_fp16", c.comb.bytes == 0 || c.comb.dtype == 0);
}

// The window kernels' dbias / dtable sums: partials per CTA of windows grouped by the term's period (window_grid:
// Pg), reduced into dbias [P_T, ..] by reduce_partials_kernel, which takes Pg / P_T groups per dbias period.
void check_window_sums(const Ctx& x, const BwdChoice& c) {
  if (!x.bp.dbias) return;
  const int pg = c.p.bias.ptr ? c.p.bias.period : 1;
  x.s.expect("bwd_windows.dbias_groups", pg % x.bp.bias.period == 0);
}

void check_bwd_v1(const Ctx& x, const BwdChoice& c) {
  x.s.expect("bwd_v1.dk", c.dk == kernel_head_dim(x.user.D));
  x.s.expect("bwd_v1.no_bits_no_hiding", !c.p.mbits && !c.p.term_hides && !c.comb.mask);  // (apply_terms kMayHide=0)
  x.s.expect("bwd_v1.comb_only_the_table", c.comb.bytes == 0 || x.bp.rel_table);
}

void check_forced_bwd(const Ctx& x, const BwdChoice& c) {
  const Forced& f = x.force;
  if (f.bwd == BwdKernel::kAuto) return;
  x.s.expect("force.bwd_kernel_taken", c.kernel == f.bwd);
  if (c.kernel != BwdKernel::kV3) return;
  x.s.expect("force.bwd_variant_taken", (!f.bwd_two_stages || !c.v3.deep) && (!f.bwd_no_pair || !c.v3.pair) &&
                                            (!f.bwd_fine_dims || c.dk == 96) &&
                                            (f.bwd_dq < 0 || c.v3.dq_mode == f.bwd_dq) &&
                                            (f.bwd_mask_bits != 1 || c.v3.terms == kBwdTermsBits) &&
                                            (f.bwd_mask_bits != 0 || c.v3.terms != kBwdTermsBits));
}

void check_bwd(const Ctx& x, const BwdChoice& c) {
  check_problem(x, c.p);
  check_terms_kept(x, c.p, c.comb);
  check_comb(x, c.p, c.comb, c.kernel == BwdKernel::kV3 ? x.dt() : 0);
  // v3 has no ordered reduction over windows for the table's gradient (v1's window mode and the window kernels do)
  x.s.expect("bwd.table_grad_ordered", !x.bp.dtable || c.kernel != BwdKernel::kV3);
  check_forced_bwd(x, c);
  switch (c.kernel) {
    case BwdKernel::kV1: x.s.covered("bwd_v1"); check_bwd_v1(x, c); break;
    case BwdKernel::kWindows:
      x.s.covered("bwd_windows");
      check_bwd_windows(x, c);
      check_window_sums(x, c);
      break;
    case BwdKernel::kWideWindows:
      x.s.covered("bwd_windows_wide N" + std::to_string(c.wide) + (c.mb_words ? " bits" : ""));
      check_bwd_wide(x, c);
      check_window_sums(x, c);
      break;
    case BwdKernel::kV3:
      x.s.covered("bwd_v3 terms=" + std::to_string(c.v3.terms) + " dbias=" + std::to_string(c.v3.dbias_mode) +
                  (c.v3.pair ? " pair" : ""));
      if (c.v3.dq_mode == kBwdDqDirect) x.s.covered("bwd_v3 dq-direct");
      if (c.v3.dq_mode == kBwdDqResident) x.s.covered("bwd_v3 dq-resident");
      check_bwd_v3(x, c);
      break;
    default: x.s.expect("bwd.known_kernel", false);
  }
}

// ---- running a call -------------------------------------------------------------------------------------------------
// A refusal of a forced kernel is a std::runtime_error naming the knob and why (require_forced); anything else that
// leaves the choice (another exception type, an empty reason) is a failure, and so is a throw of an unforced choice.
template <typename F>
void guarded(Sink& s, bool may_refuse, F&& f) {
  try {
    f();
    s.expect(may_refuse ? "choice.forced_taken_or_refused" : "choice.unforced_never_throws", true);
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    s.expect(may_refuse ? "choice.forced_taken_or_refused" : "choice.unforced_never_throws", may_refuse);
    if (may_refuse)
      s.expect("force.refusal_names_why", what.rfind("WINATTN_FORCE_KERNEL=", 0) == 0 &&
                                              what.find("cannot run it (") != std::string::npos &&
                                              what.find("cannot run it ()") == std::string::npos);
  } catch (...) {  // (std::logic_error, std::bad_alloc, anything else: not a refusal)
    s.expect(may_refuse ? "choice.forced_taken_or_refused" : "choice.unforced_never_throws", false);
  }
}

struct Runner {
  Sink sink;
  std::vector<std::string> forced_names, fwd_names, bwd_names;
  int64_t calls = 0, choices = 0;
  std::string origin;  // where the call came from: "--seed S --only I", or the reproduction's name

  Runner() {
    std::string names = kForceNames;
    for (size_t at = 0; at < names.size();) {
      size_t end = names.find(", ", at);
      if (end == std::string::npos) end = names.size();
      const std::string n = names.substr(at, end - at);
      forced_names.push_back(n);
      (n.rfind("bwd_", 0) == 0 ? bwd_names : fwd_names).push_back(n);
      at = end + 2;
    }
  }

  // bwd_dbias_layout (winattn_cuda.cu): the caller asks with dbias in the bias dtype, then allocates it so exactly
  // when that plan stores 16 bits; the call then comes with dbias_in_bias_dtype set.
  static BwdParams as_allocated(const BwdParams& bp, const KParams& user, const DeviceCaps& dev, const Forced& f) {
    BwdParams real = bp;
    if (!bp.dbias || !bp.bias.ptr) return real;
    BwdParams probe = bp;
    probe.dbias = reinterpret_cast<void*>(uintptr_t(256));
    probe.dbias_in_bias_dtype = true;
    try {
      const BwdChoice c = choose_bwd(probe, user, dev, f);
      real.dbias_in_bias_dtype = c.kernel == BwdKernel::kV3 && c.v3.dbias_mode == kDbiasStore16;
    } catch (const std::exception&) {  // (the forced refusal shows on the real call too)
    }
    return real;
  }

  // One call on one device under one WINATTN_FORCE_KERNEL value: the forward and the backward choice, checked.
  void run_one(const Call& call, const DeviceCaps& dev, const char* dev_name, const std::string& force_name) {
    sink.where = [&] {
      return describe(call) + " | " + dev_name + " | force=" + (force_name.empty() ? "-" : force_name) + " | " + origin;
    };
    Forced f;
    KParams user;
    try {
      f = parse_forced(force_name);
    } catch (...) {
      sink.expect("force.every_known_name_parses", false);
      return;
    }
    sink.expect("force.every_known_name_parses", true);
    try {
      fill_common(call.p, user);
    } catch (...) {
      sink.expect("generator.calls_are_valid", false);  // (a bug of this fuzz: it makes only calls the binding passes)
      return;
    }
    sink.expect("generator.calls_are_valid", true);
    KParams start = user;  // (what the choice starts from)
    mask_as_key_padding(start);
    BwdParams bp = call.p;
    bp.dbias = call.grad_bias ? const_cast<void*>(addr(kDbias)) : nullptr;
    bp.dtable = call.grad_table ? static_cast<float*>(const_cast<void*>(addr(kDtable))) : nullptr;
    plan_fwd(Ctx{bp, start, dev, f, sink, fwd_bytes(call)}, user, dev_name, force_name);
    // the backward plans calls with keys only (bwd() zero-fills the gradients of an empty key set), within memory
    if (call.p.seqlen_k == 0 || bwd_bytes(call) > kDeviceBytes) return;
    const BwdParams real = as_allocated(bp, user, dev, f);
    plan_bwd(Ctx{real, start, dev, f, sink, bwd_bytes(call)}, user, dev_name, force_name);
  }
  // (v1 takes every call: forced, it never refuses)
  void plan_fwd(const Ctx& x, const KParams& user, const char* dev_name, const std::string& force_name) {
    ++choices;
    guarded(sink, x.force.fwd != FwdKernel::kAuto && x.force.fwd != FwdKernel::kV1, [&] {
      const FwdChoice c = choose_fwd(x.bp, user, x.dev, x.force);
      if (sink.verbose) std::printf("  %s %s fwd: %s\n", dev_name, force_name.c_str(), choice_str(c).c_str());
      check_fwd(x, c);
      if (x.force.fwd != FwdKernel::kAuto) return;
      // the plan memo (winattn_cuda.cu FwdPlanMemo) reuses a plan: it must be a pure function of the call
      const std::string plan = choice_str(c);
      sink.expect("choice.fwd_deterministic", choice_str(choose_fwd(x.bp, user, x.dev, x.force)) == plan);
      // WINATTN_FORCE_KERNEL=<the kernel the table chose> (an A/B run's baseline) plans exactly what the table did
      Forced same = x.force;
      same.fwd = c.kernel;
      same.decode_tma = c.decode_tma;
      sink.expect("force.table_choice_reproduces", [&] {
        try {
          FwdChoice forced = choose_fwd(x.bp, user, x.dev, same);
          forced.why = c.why;
          return choice_str(forced) == plan;
        } catch (...) {
          return false;
        }
      }());
    });
  }
  void plan_bwd(const Ctx& x, const KParams& user, const char* dev_name, const std::string& force_name) {
    ++choices;
    guarded(sink, x.force.bwd != BwdKernel::kAuto && x.force.bwd != BwdKernel::kV1, [&] {
      const BwdChoice c = choose_bwd(x.bp, user, x.dev, x.force);
      if (sink.verbose) std::printf("  %s %s bwd: %s\n", dev_name, force_name.c_str(), choice_str(c).c_str());
      check_bwd(x, c);
      if (x.force.bwd != BwdKernel::kAuto) return;
      Forced same = x.force;
      same.bwd = c.kernel;
      sink.expect("force.table_choice_reproduces", [&] {
        try {
          BwdChoice forced = choose_bwd(x.bp, user, x.dev, same);
          forced.why = c.why;
          return choice_str(forced) == choice_str(c);
        } catch (...) {
          return false;
        }
      }());
    });
  }

  void run(const Call& call, bool all_forced, Rng* r) {
    ++calls;
    const DeviceCaps h200 = h200_caps(), slice = h200_slice_caps(), a100 = a100_caps();
    const std::pair<const DeviceCaps*, const char*> devices[] = {{&h200, "H200"}, {&slice, "H200-MIG-1g"},
                                                                 {&a100, "A100"}};
    for (const auto& [dev, name] : devices) {
      run_one(call, *dev, name, "");
      if (all_forced) {
        for (const std::string& n : forced_names) run_one(call, *dev, name, n);
      } else if (r) {  // three forced names, one of them a forward and a backward kernel together
        for (int i = 0; i < 2; ++i) run_one(call, *dev, name, forced_names[r->below(int64_t(forced_names.size()))]);
        run_one(call, *dev, name, fwd_names[r->below(int64_t(fwd_names.size()))] + ", " +
                                      bwd_names[r->below(int64_t(bwd_names.size()))]);
      }
    }
  }

  void print() const {
    std::map<std::string, Stats> merged;
    for (const auto& [name, st] : sink.stats) {
      Stats& m = merged[name];
      if (m.failed == 0 && st.failed > 0) m.first = st.first;
      m.passed += st.passed, m.failed += st.failed;
    }
    for (const auto& [name, st] : merged) std::printf("check %s %lld %lld\n", name.c_str(), (long long)st.passed,
                                                      (long long)st.failed);
    for (const auto& [name, st] : merged)
      if (st.failed) std::printf("fail %s | %s\n", name.c_str(), st.first.c_str());
    for (const auto& [path, n] : sink.cover) std::printf("cover %s %lld\n", path.c_str(), (long long)n);
    std::printf("calls %lld choices %lld\n", (long long)calls, (long long)choices);
  }
};

// ---- named reproductions of what this fuzz found --------------------------------------------------------------------
// Each a call a user can pass on an H200 (its tensors fit 139 GiB); test_kernel_choice_fuzz.py runs each, and marks
// the ones still open xfail with the reason.
Call dense_mask(Call c) {  // a contiguous bool mask [1, 1, Sq, Sk]
  c.p.mask.ptr = addr(kMask);
  c.p.mask.rows = c.p.seqlen_q, c.p.mask.cols = c.p.seqlen_k;
  c.p.mask.stride_q = c.p.seqlen_k, c.p.mask.stride_k = 1;
  return c;
}
Call with_grad_bias(Call c, DType dt, int64_t period) {  // a bias [period, 1, 1, 1] and its gradient
  c.p.bias.ptr = addr(kBias), c.p.bias.dtype = dt, c.p.bias.period = period, c.p.bias.stride_b = 1;
  c.grad_bias = true;
  return c;
}
struct Repro {
  const char* name;
  Call (*make)();
};
const Repro kRepros[] = {
    // fixed: H / Hkv x Sq = 2^31 rows per KV head overflowed int in try_fwd_decode (UB; wrapped, decode took them)
    {"decode_rows_overflow", [] { return make_call(1, 1, 32768, 128, 65536, 1, 8, DType::kFloat16); }},
    // fixed: head dim 160, 96-key blocks: load_mask_bits read 6 words of 4-word mask rows (past the workspace)
    {"v3_bits_96_key_blocks", [] { return dense_mask(make_call(1, 1, 256, 97, 1, 1, 160, DType::kBFloat16)); }},
    // fixed: div_up(B, period) overflowed int in try_bwd_v3 for B > 2^30 with a per-item bias and its gradient
    {"bwd_dbias_writers_overflow",
     [] { return with_grad_bias(make_call((1 << 30) + 2, 1, 1, 1, 1, 1, 8, DType::kFloat16), DType::kFloat16,
                                (1 << 30) + 2); }},
    // open: a 256k-token document mask as bits: mask_bits_kernel's plane (rows x words = 2^18 x 2^13) overflows int
    {"mask_bits_plane_overflow",
     [] { return dense_mask(make_call(1, 1, 1 << 18, 1 << 18, 8, 8, 128, DType::kBFloat16)); }},
    // open: forward v3's int tile count ceil(Sq / 128) x H x B = 2^31 (fwd_pipelined_sm90.h ntiles) overflows
    {"v3_tiles_overflow", [] { return make_call(1 << 22, 1, 1, 257, 512, 1, 8, DType::kFloat16); }},
    // open: decode's grid splits x Hkv x B = 2^31 CTAs is past gridDim.x (the launch fails with an error)
    {"decode_grid_overflow", [] { return make_call(1 << 28, 1, 1, 1, 8, 8, 8, DType::kBFloat16); }},
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  int64_t calls = 1000, only = -1;
  std::string repro;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--calls") calls = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--only") only = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a == "--repro") repro = argv[i + 1];
    else return std::fprintf(stderr, "unknown argument %s\n", a.c_str()), 2;
  }
  Runner run;
  if (!repro.empty()) {
    for (const Repro& r : kRepros)
      if (repro == r.name) {
        run.sink.verbose = true;
        run.origin = std::string("--repro ") + r.name;
        run.run(r.make(), true, nullptr);
        run.print();
        return 0;
      }
    return std::fprintf(stderr, "unknown reproduction %s\n", repro.c_str()), 2;
  }
  Rng rng{seed};
  for (int64_t i = 0; i < calls; ++i) {
    Call call = random_call(rng);
    Rng forced_rng{rng.next()};
    if (only >= 0 && i != only) continue;
    run.origin = "--seed " + std::to_string(seed) + " --only " + std::to_string(i);
    if (only >= 0) {
      run.sink.verbose = true;
      std::printf("call %lld: %s\n", (long long)i, describe(call).c_str());
    }
    run.run(call, only >= 0, &forced_rng);
  }
  run.print();
  return 0;
}
