// Prints the kernel choice (kernel-src/cuda/kernel_choice.h) for a table of call shapes on an H200-like device, one
// line per call: what tests/unit/test_kernel_choice.py compares with kernel_choice_golden.txt. The shapes are the
// classes of benchmarks/bench_shapes.py (model layers) plus the edges of each rule.
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/kernel_choice.h"

using namespace winattn;
using namespace winattn::cuda;

namespace {

// Fake, never dereferenced operand addresses: 4 KB apart and 256-byte aligned, as the caching allocator's are.
const void* addr(int i) { return reinterpret_cast<const void*>(uintptr_t(0x100000) + uintptr_t(i) * 4096); }

struct Call {
  std::string name;
  BwdParams p;
  bool grad_bias = false, grad_table = false;
};

Call make(const std::string& name, int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t Hkv, int64_t D,
          DType dt = DType::kBFloat16) {
  Call c;
  c.name = name;
  BwdParams& p = c.p;
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.heads = H, p.heads_kv = Hkv, p.head_dim = D, p.dtype = dt;
  p.q = addr(1), p.k = addr(2), p.v = addr(3), p.out = const_cast<void*>(addr(4)), p.dout = addr(5);
  p.q_stride_b = Sq * H * D, p.q_stride_s = H * D, p.q_stride_h = D;
  p.k_stride_b = Sk * Hkv * D, p.k_stride_s = Hkv * D, p.k_stride_h = D;
  p.v_stride_b = p.k_stride_b, p.v_stride_s = p.k_stride_s, p.v_stride_h = p.k_stride_h;
  p.o_stride_b = p.q_stride_b, p.o_stride_s = p.q_stride_s, p.o_stride_h = p.q_stride_h;
  p.do_stride_b = p.q_stride_b, p.do_stride_s = p.q_stride_s, p.do_stride_h = p.q_stride_h;
  p.scale = 1.f / 8.f;
  return c;
}
// A contiguous term of shape [period, heads, rows, cols] (rows / cols 1 = broadcast); `offset` elements off the
// allocation's start (a misaligned view).
Broadcast4d term(DType dt, int64_t period, int64_t heads, int64_t rows, int64_t cols, int64_t offset = 0) {
  Broadcast4d b;
  const int es = dt == DType::kFloat32 ? 4 : 2;
  b.ptr = static_cast<const char*>(addr(6)) + offset * es;
  b.dtype = dt;
  b.period = period, b.heads = heads, b.rows = rows, b.cols = cols;
  b.stride_k = cols > 1 ? 1 : 0;
  b.stride_q = rows > 1 ? cols : 0;
  b.stride_h = heads > 1 ? rows * cols : 0;
  b.stride_b = period > 1 ? heads * rows * cols : 0;
  return b;
}
Call& bias(Call& c, DType dt, int64_t period, int64_t heads, int64_t rows, int64_t cols, bool grad = false) {
  c.p.bias = term(dt, period, heads, rows, cols);
  c.grad_bias = grad;
  return c;
}
Call& mask(Call& c, int64_t period, int64_t heads, int64_t rows, int64_t cols) {
  c.p.mask = term(DType::kFloat16, period, heads, rows, cols);  // (bytes: the element size does not matter here)
  c.p.mask.stride_k = cols > 1 ? 1 : 0;
  c.p.mask.stride_q = rows > 1 ? cols : 0;
  c.p.mask.stride_h = heads > 1 ? rows * cols : 0;
  c.p.mask.stride_b = period > 1 ? heads * rows * cols : 0;
  c.p.mask.ptr = addr(7);
  return c;
}
Call& table(Call& c, int64_t W, bool grad = true) {
  c.p.rel_table = static_cast<const float*>(addr(8));
  c.p.table_rows = (2 * W - 1) * (2 * W - 1);
  c.p.table_stride_r = c.p.heads, c.p.table_stride_h = 1;
  c.p.rel_index = static_cast<const int64_t*>(addr(9));
  c.p.index_stride_q = c.p.seqlen_k, c.p.index_stride_k = 1;
  c.grad_table = grad;
  return c;
}
Call& padding(Call& c) {
  c.p.key_padding = static_cast<const bool*>(addr(10));
  c.p.kp_stride_b = c.p.seqlen_k, c.p.kp_stride_k = 1;
  return c;
}

std::string terms_name(int t) {
  return t == sm90::kTermsRawBias         ? "staged"
         : t == sm90::kTermsRawBiasMasked ? "staged+mask"
         : t == sm90::kTermsRawBiasPadded ? "staged+padding"
         : t == sm90::kTermsGeneral       ? "general"
         : t == sm90::kTermsRawRow        ? "row"
         : t == sm90::kTermsRawRowPadded  ? "row+padding"
         : t == sm90::kTermsRawBits       ? "mask-bits"
                                          : "raw";
}
std::string prep(const CombPlan& c) {
  if (c.bytes == 0) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, " prep=%s[%d,%d,%s,%d]%s", c.dtype ? "bf16" : "fp16", c.P, c.heads,
                c.rows == 1 ? "1" : "Sq", c.Skp, c.mask ? "+mask" : "");
  return buf;
}

std::string describe_fwd(const FwdChoice& c) {
  std::string s = name_of(c.kernel);
  char buf[160];
  if (c.kernel == FwdKernel::kV3) {
    std::snprintf(buf, sizeof buf, " %dx%d terms=%s%s%s", c.block_m, c.block_n, terms_name(c.v3_terms).c_str(),
                  c.v3_dynamic ? " dynamic" : c.v3_persistent ? " persistent" : " per-tile",
                  c.v3_tile == sm90::kV3Wide             ? " wide"
                  : c.v3_tile == sm90::kV3Stream         ? " streamed"
                  : c.v3_tile == sm90::kV3TwoCtas        ? " two-ctas"
                  : c.v3_tile == sm90::kV3TwoCtasRagged  ? " two-ctas ragged"
                  : c.v3_tile == sm90::kV3Rows192        ? " rows192"
                  : c.v3_tile != sm90::kV3Narrow         ? " one-block"
                                                         : "");
    s += buf;
    if (c.dk != kernel_head_dim(c.p.D)) s += " d" + std::to_string(c.dk);  // (the 16-column instances)
    if (c.v3_o_tma) s += " o-tma";  // (O through shared memory and TMA stores: fwd_epilogue_sm90.h)
    if (c.v3_kv_resident) s += " kv-resident";  // (K / V loaded once per head: kv_resident_pays)
    if (c.p.band_pairs > 1) s += " pairs=" + std::to_string(c.p.band_pairs);  // (interleaved tile order)
  } else if (c.kernel == FwdKernel::kWindows) {
    std::snprintf(buf, sizeof buf, " 64x%d smem=%d%s", c.window_bn, c.window_smem, c.mb_words ? " mask-bits" : "");
    s += buf;
  } else if (c.kernel == FwdKernel::kDecode) {
    std::snprintf(buf, sizeof buf, " d%d rows=%d splits=%d chunk=%d%s", c.dk, c.p.hgroup * c.p.Sq, c.decode_splits,
                  c.decode_chunk, c.decode_tma ? " tma" : "");
    s += buf;
  } else {
    s += " d" + std::to_string(c.dk);
  }
  return s + prep(c.comb);
}
std::string describe_bwd(const BwdChoice& c) {
  static const char* dbias[] = {"none", "store", "reduce", "store16", "atomic"};
  static const char* dq[] = {"", " dq-direct", " dq-resident"};
  static const char* terms[] = {"none", "staged", "global", "row", "bits", "staged", "row", "row+key-grad"};
  std::string s = name_of(c.kernel);
  char buf[200];
  if (c.kernel == BwdKernel::kV3) {
    const BwdV3Buffers& v = c.v3;
    std::snprintf(buf, sizeof buf, " d%d terms=%s%s dbias=%s%s%s%s%s%s bufs=%d smem=%d", c.dk, terms[v.terms],
                  v.hides ? "+hides" : "", dbias[v.dbias_mode], v.pair ? " pair" : "", v.deep ? " deep" : "",
                  v.defer ? " defer" : "", dq[v.dq_mode], v.block_m == 128 ? " q128" : "", v.dbias_bufs, v.smem);
    s += buf;
    if (c.p.bwd_band_pairs > 1) s += " pairs=" + std::to_string(c.p.bwd_band_pairs);  // (interleaved tile order)
  } else if (c.kernel == BwdKernel::kWideWindows) {
    std::snprintf(buf, sizeof buf, " N%d%s", c.wide, c.mb_words ? " mask-bits" : "");
    s += buf;
  } else if (c.kernel == BwdKernel::kWindows) {
    std::snprintf(buf, sizeof buf, " smem=%d", c.window_smem);
    s += buf;
  } else {
    s += " d" + std::to_string(c.dk);
  }
  return s + prep(c.comb);
}

}  // namespace

int main(int argc, char** argv) {
  DeviceCaps h200;  // what device_caps() reads on an H200 with this binary's sm_90a code
  h200.cc_major = 9, h200.sms = 132, h200.smem_optin = 232448, h200.sm90a = true, h200.wide_cluster_slots = 120;
  DeviceCaps a100;
  a100.cc_major = 8, a100.sms = 108, a100.smem_optin = 166912;
  const DType f32 = DType::kFloat32, b16 = DType::kBFloat16, f16 = DType::kFloat16;

  std::vector<Call> calls;
  auto add = [&](Call c) { calls.push_back(c); };
  // long sequences, no term
  add(make("flux S4608 D128", 1, 4608, 4608, 24, 24, 128));
  add(make("wan S32760 D128", 1, 32760, 32760, 12, 12, 128));
  { Call c = make("flux S4608 D128 det", 1, 4608, 4608, 24, 24, 128); c.p.deterministic = true; add(c); }
  add(make("cogvideox S17776 D64", 1, 17776, 17776, 48, 48, 64));
  add(make("S16k D256", 1, 16384, 16384, 8, 8, 256));
  { Call c = make("llm causal GQA 32/8 S8192 D128", 1, 8192, 8192, 32, 8, 128); c.p.causal = true; add(c); }
  { Call c = make("causal S16384 D128 (bwd order as v5.2)", 2, 16384, 16384, 16, 16, 128); c.p.causal = true; add(c); }
  { Call c = make("mistral window (4096,0) S8192", 1, 8192, 8192, 32, 8, 128); c.p.window_left = 4096, c.p.window_right = 0; add(c); }
  add(make("decode Sq1 Sk8192 GQA", 8, 1, 8192, 32, 8, 128));
  add(make("decode Sq1 Sk8192 GQA B32", 32, 1, 8192, 32, 8, 128));
  { Call c = make("decode Sq1 Sk4096 B1 MHA kp", 1, 1, 4096, 32, 32, 128); add(padding(c)); }
  add(make("decode Sq2 Sk1000 GQA 8/2 D64", 4, 2, 1000, 8, 2, 64));
  add(make("speculative Sq4 GQA 32/8 (16 rows)", 4, 4, 8192, 32, 8, 128));
  add(make("dit-xl D72 S256", 32, 256, 256, 16, 16, 72));
  add(make("wan cross Sk512 D128", 1, 32760, 512, 12, 12, 128));
  add(make("sd15 D40 S4096", 4, 4096, 4096, 8, 8, 40));
  add(make("pixart self D72 S4096", 4, 4096, 4096, 16, 16, 72));
  // the 192-row tile at the 80 and 48 instances: one CTA per tile (rows192_per_tile_pays)
  add(make("dit-xl D72 S1024", 16, 1024, 1024, 16, 16, 72));
  add(make("sd15 B8 D40 S4096", 8, 4096, 4096, 8, 8, 40));
  // short sequences
  add(make("vit-b S197 D64", 256, 197, 197, 12, 12, 64));
  add(make("eva02 S257 D64", 128, 257, 257, 12, 12, 64));
  add(make("vit-b/16-384 S577 D64 B64", 64, 577, 577, 12, 12, 64));
  add(make("eva02-448 S1025 D64 B16", 16, 1025, 1025, 12, 12, 64));
  add(make("vit-b/8 S785 D64 B2 (few tiles)", 2, 785, 785, 12, 12, 64));
  add(make("sdxl self S1024 D64 B4", 4, 1024, 1024, 20, 20, 64));
  // the two-CTA rule's edges on 132 SMs: 1056 tiles (8 per SM) and 1050; 1088 keys and 1089
  add(make("S700 D64 1056 tiles", 176, 700, 700, 1, 1, 64));
  add(make("S700 D64 1050 tiles", 175, 700, 700, 1, 1, 64));
  add(make("S1088 D64 1134 tiles", 14, 1088, 1088, 9, 9, 64));
  add(make("S1089 D64 1134 tiles", 14, 1089, 1089, 9, 9, 64));
  // cross-attention
  add(make("sdxl cross Sk77 D64", 4, 4096, 77, 10, 10, 64));
  { Call c = make("pixart cross Sk120 kp", 4, 4096, 120, 16, 16, 72); add(padding(c)); }
  { Call c = make("pixart cross Sk120 float mask [B,1,1,S]", 4, 4096, 120, 16, 16, 72); add(bias(c, b16, 4, 1, 1, 120)); }
  { Call c = make("ltx cross Sk128 float mask [B,H,1,S]", 2, 6144, 128, 32, 32, 64); add(bias(c, b16, 2, 32, 1, 128)); }
  { Call c = make("sdxl cross Sk77 bool mask [1,1,Sq,Sk]", 4, 4096, 77, 10, 10, 64); add(mask(c, 1, 1, 4096, 77)); }
  { Call c = make("qwenimage key padding S4352", 2, 4352, 4352, 24, 24, 128); add(padding(c)); }
  { Call c = make("key padding S8192 D128 (wide: a vote)", 1, 8192, 8192, 16, 16, 128); add(padding(c)); }
  { Call c = make("key padding S577 D64 B64 (two CTAs: a vote)", 64, 577, 577, 12, 12, 64); add(padding(c)); }
  { Call c = make("key padding S4096 D256 (a vote)", 2, 4096, 4096, 8, 8, 256); add(padding(c)); }
  // additive terms
  { Call c = make("beit bias fp32 [1,H,N,N] N197 grad", 128, 197, 197, 12, 12, 64); add(bias(c, f32, 1, 12, 197, 197, true)); }
  { Call c = make("beit bias bf16 [1,H,N,N] N197 grad", 128, 197, 197, 12, 12, 64); add(bias(c, b16, 1, 12, 197, 197, true)); }
  { Call c = make("t5 bias fp32 [1,H,S,S] S512 grad", 16, 512, 512, 12, 12, 64); add(bias(c, f32, 1, 12, 512, 512, true)); }
  { Call c = make("t5 bias fp32 [1,H,S,S] S512 grad kp", 32, 512, 512, 12, 12, 64); add(padding(bias(c, f32, 1, 12, 512, 512, true))); }
  { Call c = make("bias bf16 [1,H,S,S] S1024 D128 kp", 4, 1024, 1024, 16, 16, 128); add(padding(bias(c, b16, 1, 16, 1024, 1024, false))); }
  { Call c = make("dense bias bf16 [1,H,S,S] S4096 grad", 2, 4096, 4096, 16, 16, 64); add(bias(c, b16, 1, 16, 4096, 4096, true)); }
  { Call c = make("bias bf16 [B,H,S,S] S1024 grad", 4, 1024, 1024, 16, 16, 64); add(bias(c, b16, 4, 16, 1024, 1024, true)); }
  { Call c = make("bias bf16 [B,H,S,S] S1024 grad det", 4, 1024, 1024, 16, 16, 64); c.p.deterministic = true; add(bias(c, b16, 4, 16, 1024, 1024, true)); }
  { Call c = make("float mask fp32 [B,1,1,S] S4608 D128", 2, 4608, 4608, 24, 24, 128); add(bias(c, f32, 2, 1, 1, 4608)); }
  { Call c = make("float mask bf16 [B,1,1,S] S4608 D128", 2, 4608, 4608, 24, 24, 128); add(bias(c, b16, 2, 1, 1, 4608)); }
  { Call c = make("float mask bf16 [B,1,S,S] S1024", 2, 1024, 1024, 16, 16, 64); add(bias(c, b16, 2, 1, 1024, 1024)); }
  { Call c = make("bias fp16 on bf16 [1,H,S,S] S1024", 2, 1024, 1024, 16, 16, 64); add(bias(c, f16, 1, 16, 1024, 1024)); }
  { Call c = make("bias [1,H,1,S] bf16 S2048", 2, 2048, 2048, 16, 16, 64); add(bias(c, b16, 1, 16, 1, 2048)); }
  { Call c = make("eva02 key bias [1,H,1,S] bf16 grad", 128, 257, 257, 12, 12, 64); add(bias(c, b16, 1, 12, 1, 257, true)); }
  { Call c = make("key bias fp32 [B,1,1,S] grad D128", 2, 4608, 4608, 24, 24, 128); add(bias(c, f32, 2, 1, 1, 4608, true)); }
  { Call c = make("query bias [1,H,S,1] grad", 2, 1024, 1024, 16, 16, 64); add(bias(c, b16, 1, 16, 1024, 1, true)); }
  { Call c = make("key bias [1,H,1,S] grad D256", 2, 2048, 2048, 8, 8, 256); add(bias(c, b16, 1, 8, 1, 2048, true)); }
  // bool masks
  { Call c = make("bool mask [B,1,S,S] S1024", 2, 1024, 1024, 16, 16, 64); add(mask(c, 2, 1, 1024, 1024)); }
  { Call c = make("bool mask [B,1,1,S] S4096", 2, 4096, 4096, 16, 16, 128); add(mask(c, 2, 1, 1, 4096)); }
  { Call c = make("bool mask [1,H,1,S] vit S197", 128, 197, 197, 12, 12, 64); add(mask(c, 1, 12, 1, 197)); }
  { Call c = make("bool mask [1,H,S,S] dit D72 S1024", 16, 1024, 1024, 16, 16, 72); add(mask(c, 1, 16, 1024, 1024)); }
  { Call c = make("bool mask [B,H,S,S] t5 S512", 32, 512, 512, 12, 12, 64); add(mask(c, 32, 12, 512, 512)); }
  { Call c = make("bool mask [B,1,S,S] docs GQA S4096", 4, 4096, 4096, 32, 8, 128); add(mask(c, 4, 1, 4096, 4096)); }
  { Call c = make("bool mask [B,H,S,1] + bias [1,H,S,S] grad", 2, 512, 512, 8, 8, 64); mask(c, 2, 8, 512, 1); add(bias(c, b16, 1, 8, 512, 512, true)); }
  { Call c = make("bool mask [B,1,1,S] + float row term", 2, 1024, 1024, 8, 8, 64); mask(c, 2, 1, 1, 1024); add(bias(c, b16, 2, 1, 1, 1024)); }
  { Call c = make("bool mask [1,1,S,S] S36864 (past the fold cap)", 1, 36864, 36864, 8, 8, 128); add(mask(c, 1, 1, 36864, 36864)); }
  { Call c = make("bool mask [B,1,S,S] scale 0", 2, 512, 512, 8, 8, 64); c.p.scale = 0.f; add(mask(c, 2, 1, 512, 512)); }
  // Swin windows (window_attention: table + shift mask)
  { Call c = make("swin W7 table+shift", 4096, 49, 49, 4, 4, 32); table(c, 7); bias(c, f32, 64, 1, 49, 49); add(c); }
  { Call c = make("swin W12 table", 8192, 144, 144, 4, 4, 32); add(table(c, 12)); }
  { Call c = make("swin W16 table", 4096, 256, 256, 4, 4, 32); add(table(c, 16)); }
  { Call c = make("swin W12 bias bf16 [1,H,N,N] grad", 8192, 144, 144, 4, 4, 32); add(bias(c, b16, 1, 4, 144, 144, true)); }
  { Call c = make("swin W12 table + window mask", 8192, 144, 144, 4, 4, 32); table(c, 12); add(mask(c, 8192, 1, 144, 144)); }
  { Call c = make("swinv2 W8 D64 table", 4096, 64, 64, 8, 8, 64); add(table(c, 8)); }
  { Call c = make("maxvit W7 D32 table grad", 4096, 49, 49, 8, 8, 32); add(table(c, 7)); }
  // edges
  add(make("empty key set", 2, 128, 0, 8, 8, 64));
  { Call c = make("scale 0", 2, 512, 512, 8, 8, 64); c.p.scale = 0.f; add(c); }
  add(make("fp16 S2048 D96", 2, 2048, 2048, 16, 16, 96, f16));

  // --force SPEC NAME: the H200 choice of the calls whose name contains NAME under WINATTN_FORCE_KERNEL=SPEC (or the
  // error it raises); --force-a100 the same on the A100; NAME alone: only those calls.
  if (argc == 4 && (std::string(argv[1]) == "--force" || std::string(argv[1]) == "--force-a100")) {
    const DeviceCaps& dev = std::string(argv[1]) == "--force" ? h200 : a100;
    for (const Call& c : calls) {
      if (c.name.find(argv[3]) == std::string::npos) continue;
      BwdParams bp = c.p;
      bp.dbias = c.grad_bias ? const_cast<void*>(addr(11)) : nullptr;
      bp.dtable = c.grad_table ? static_cast<float*>(const_cast<void*>(addr(12))) : nullptr;
      KParams user;
      fill_common(bp, user);
      try {
        const Forced f = parse_forced(argv[2]);
        std::printf("%s | %s | %s\n", c.name.c_str(), describe_fwd(choose_fwd(bp, user, dev, f)).c_str(),
                    describe_bwd(choose_bwd(bp, user, dev, f)).c_str());
      } catch (const std::exception& e) {
        std::printf("%s | error: %s\n", c.name.c_str(), e.what());
      }
    }
    return 0;
  }
  const char* only = argc > 1 ? argv[1] : nullptr;
  for (const DeviceCaps* dev : {&h200, &a100}) {
    std::printf("## %s\n", dev == &h200 ? "H200 (sm_90a code)" : "A100 (no sm_90a code)");
    for (const Call& c : calls) {
      if (only && c.name.find(only) == std::string::npos) continue;
      BwdParams bp = c.p;
      bp.dbias = c.grad_bias ? const_cast<void*>(addr(11)) : nullptr;
      bp.dtable = c.grad_table ? static_cast<float*>(const_cast<void*>(addr(12))) : nullptr;
      KParams user;
      fill_common(bp, user);
      const FwdChoice f = choose_fwd(bp, user, *dev, Forced{});
      const BwdChoice b = choose_bwd(bp, user, *dev, Forced{});
      std::printf("%-40s | %-58s | %s\n", c.name.c_str(), describe_fwd(f).c_str(), describe_bwd(b).c_str());
    }
  }
  return 0;
}
