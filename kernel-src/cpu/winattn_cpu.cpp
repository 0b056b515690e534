// CPU backend of window-attention: tiled flash-attention (online softmax forward, recompute-from-lse backward)
// with fp32 accumulation for fp16/bf16/fp32 inputs. See winattn_params.h for the meaning of every field.
//
// Layout of kernel-src/cpu (flash-attention style):
//   cpu_common.h   ISA-independent: scalar dtype conversion, broadcast addressing, causal/window band, tile sizes,
//                  backward work plan + workspace layout
//   simd_avx2.h    8-lane fp32 vector on AVX2/FMA/F16C     } one of them is `Vec` in each ISA namespace
//   simd_generic.h the same in plain C++ (any CPU)         }
//   tile_io.h      tile loads to fp32 (natural / transposed), row stores to the output dtype
//   gemm_tile.h    register-blocked fp32 tile products
//   gemm_bf16.h    bf16-pair tile products (AVX512-BF16), pack_bf16.h: their operand packing
//   score_mod.h    bias / rel-pos table / masks / band applied to a score tile
//   softmax.h      online softmax (fwd), P recomputation and dS (bwd)
//   reductions.h   dS reduced into dbias / the rel-pos table accumulator
//   fwd_kernel.h, bwd_kernel.h  tile loops + parallelization (the why is at the top of each)
//
// ISA dispatch: the shipped binary targets baseline x86-64 (no -march). The kernel headers are compiled up to
// three times, each copy in its own namespace: `generic` (baseline), `avx2` (under #pragma GCC target
// "avx2,fma,f16c": every x86 server since ~2013) and `avx512bf16` (bf16 inputs only: the tile products use
// vdpbf16ps, about twice the fp32 FMA rate; Zen 4+, Cooper Lake, Sapphire Rapids+). The best copy the running
// CPU supports is picked per call (pick_isa); WINATTN_CPU_ISA=avx2|generic caps it. Non-x86 hosts and clang
// builds get the generic copy. Threads come from torch (torch::stable::parallel_for), not OpenMP.
//
// Numerics: fp32 accumulation everywhere; the avx512bf16 copy rounds P and dS to bf16 before their tile products
// (as GPU flash-attention does). Results are bit-reproducible for a given thread count and code path (see
// bwd_kernel.h), so `deterministic` needs no special handling on CPU.
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu/cpu_common.h"
#include "winattn_backend.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WINATTN_HAVE_AVX2 1
#include <immintrin.h>
#else
#define WINATTN_HAVE_AVX2 0
#endif

namespace winattn {
namespace cpu {

// The kernel headers below have no include guards on purpose: each ISA namespace gets its own copy.
namespace generic {
#include "cpu/simd_generic.h"
#include "cpu/tile_io.h"
#include "cpu/gemm_tile.h"
#include "cpu/score_mod.h"
#include "cpu/softmax.h"
#include "cpu/reductions.h"
#include "cpu/fwd_kernel.h"
#include "cpu/bwd_kernel.h"
}  // namespace generic

#if WINATTN_HAVE_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
#include "cpu/simd_avx2.h"
#include "cpu/tile_io.h"
#include "cpu/gemm_tile.h"
#include "cpu/score_mod.h"
#include "cpu/softmax.h"
#include "cpu/reductions.h"
#include "cpu/fwd_kernel.h"
#include "cpu/bwd_kernel.h"
}  // namespace avx2
#pragma GCC pop_options

// bf16 inputs on CPUs with AVX512-BF16: the tile products run on bf16 pairs (gemm_bf16.h); everything else is
// the AVX2 code above compiled once more for this target.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")
namespace avx512bf16 {
#define WINATTN_BF16_DOT 1
#include "cpu/simd_avx2.h"
#include "cpu/tile_io.h"
#include "cpu/gemm_tile.h"
#include "cpu/gemm_bf16.h"
#include "cpu/pack_bf16.h"
#include "cpu/score_mod.h"
#include "cpu/softmax.h"
#include "cpu/reductions.h"
#include "cpu/fwd_kernel.h"
#include "cpu/bwd_kernel.h"
#undef WINATTN_BF16_DOT
}  // namespace avx512bf16
#pragma GCC pop_options
#endif

namespace {

enum class Isa { kGeneric, kAvx2, kAvx512Bf16 };

// Best code path for this CPU and dtype. WINATTN_CPU_ISA=generic|avx2 caps it (read per call, so tests can
// cover every path in one process).
Isa pick_isa(DType dtype) {
#if WINATTN_HAVE_AVX2
  const char* cap = std::getenv("WINATTN_CPU_ISA");
  if (cap != nullptr && std::strcmp(cap, "generic") == 0) return Isa::kGeneric;
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  static const bool bf16 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  if (!avx2) return Isa::kGeneric;
  if (bf16 && dtype == DType::kBFloat16 && !(cap != nullptr && std::strcmp(cap, "avx2") == 0)) return Isa::kAvx512Bf16;
  return Isa::kAvx2;
#else
  (void)dtype;
  return Isa::kGeneric;
#endif
}

int64_t num_threads() { return static_cast<int64_t>(torch::stable::get_num_threads()); }

}  // namespace
}  // namespace cpu

// The forward needs only tile-sized scratch, kept in per-thread std::vectors (a few hundred KB at most): no
// workspace. The backward's buffers scale with the problem (fp32 dq accumulator, delta, dS reduction buffers),
// so they come from the binding's workspace tensor, i.e. torch's CPU allocator.
int64_t fwd_workspace_bytes(const FwdParams&) { return 0; }

void fwd(const FwdParams& params, void*, void*) {
  const int64_t nthreads = cpu::num_threads();
  switch (cpu::pick_isa(params.dtype)) {
#if WINATTN_HAVE_AVX2
    case cpu::Isa::kAvx512Bf16: return cpu::avx512bf16::run_fwd(params, nthreads);
    case cpu::Isa::kAvx2: return cpu::avx2::run_fwd(params, nthreads);
#endif
    default: return cpu::generic::run_fwd(params, nthreads);
  }
}

namespace {
cpu::BwdPlan bwd_plan(const BwdParams& params) {
  return cpu::make_bwd_plan(params, cpu::num_threads(), cpu::pick_isa(params.dtype) == cpu::Isa::kAvx512Bf16);
}
}  // namespace

// The CPU kernel adds dS tiles into dbias from several threads' chunks: the default float32, zero-filled layout.
DbiasLayout bwd_dbias_layout(const BwdParams&) { return {}; }

int64_t bwd_workspace_bytes(const BwdParams& params) {
  return bwd_plan(params).total_floats * static_cast<int64_t>(sizeof(float)) + 64;
}

void bwd(const BwdParams& params, void* workspace, void*) {
  // Same thread count and code path as in bwd_workspace_bytes (called just before on this thread), hence the
  // same plan and workspace layout.
  if (params.dbias_in_bias_dtype)
    throw std::invalid_argument("window_attention (cpu): dbias must be float32 (bwd_dbias_layout's default)");
  const cpu::BwdPlan plan = bwd_plan(params);
  auto addr = reinterpret_cast<uintptr_t>(workspace);
  float* ws = reinterpret_cast<float*>((addr + 63) & ~static_cast<uintptr_t>(63));
  switch (cpu::pick_isa(params.dtype)) {
#if WINATTN_HAVE_AVX2
    case cpu::Isa::kAvx512Bf16: return cpu::avx512bf16::run_bwd(params, plan, ws);
    case cpu::Isa::kAvx2: return cpu::avx2::run_bwd(params, plan, ws);
#endif
    default: return cpu::generic::run_bwd(params, plan, ws);
  }
}

}  // namespace winattn
