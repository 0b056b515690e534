// The split-KV decode forward with K / V loaded by TMA (sm90/fwd_decode_sm90.h): head dims 64 / 128 / 256, fp16 and
// bf16; compiled for 9.0a only (build.toml window_attention_sm90). Its combine step is fwd_decode.cu's.
#include <stdexcept>
#include <string>

#include "../kernel_choice.h"
#include "../launch.h"
#include "../launch_template.h"
#include "../sm90/fwd_decode_sm90.h"
#include "../sm90/tensor_map_sm90.h"

namespace winattn {
namespace cuda {
namespace {

// the planner sizes the splits to one wave of the CTAs each instance keeps resident
static_assert(sm90::DecodeTmaTraits<64>::kCtasPerSm == decode_tma_ctas_per_sm(64) &&
                  sm90::DecodeTmaTraits<128>::kCtasPerSm == decode_tma_ctas_per_sm(128) &&
                  sm90::DecodeTmaTraits<256>::kCtasPerSm == decode_tma_ctas_per_sm(256),
              "kernel_choice.h decode_tma_ctas_per_sm");
static_assert(kDecodeStep % sm90::DecodeTmaTraits<64>::kBlockN == 0, "no key tile straddles two splits");

constexpr const char* kName = "window_attention fwd (sm90 decode, TMA)";

template <int DK, typename Elem>
void launch_decode_tma(const sm90::DecodeTmaParams& P, cudaStream_t stream) {
  using Tr = sm90::DecodeTmaTraits<DK>;
  const int64_t ctas = int64_t(P.d.splits) * P.d.p.Hkv * P.d.p.B;
  auto kernel = sm90::fwd_decode_tma_kernel<Tr, Elem>;
  raise_smem_limit(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes, kName);
  kernel<<<unsigned(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(P);
  check_cuda(cudaGetLastError(), kName);
}

template <int DK>
void launch_dtype(const sm90::DecodeTmaParams& P, int dtype, cudaStream_t stream) {
  if (dtype == 1) launch_decode_tma<DK, __nv_bfloat16>(P, stream);
  else launch_decode_tma<DK, __half>(P, stream);
}

}  // namespace

void run_fwd_decode_tma(const KParams& p, int dtype, int dk, int splits, int chunk, float* o_part,
                        float* lse_part, cudaStream_t stream) {
  constexpr int BN = sm90::DecodeTmaTraits<64>::kBlockN;
  if (chunk % BN != 0 || p.Sk == 0)  // (the planner's chunks are whole kDecodeStep keys; an empty key set no map)
    throw std::logic_error("window_attention (cuda): fwd_decode_tma needs key chunks of whole " +
                           std::to_string(BN) + " keys and a key set, got chunk " + std::to_string(chunk));
  sm90::DecodeTmaParams P;
  P.d.p = p;
  P.d.splits = splits;
  P.d.chunk = chunk;
  P.d.o_part = o_part;
  P.d.lse_part = lse_part;
  P.tk = sm90::cached_rows_map(p.k, p.B, p.Sk, p.Hkv, p.D, p.k_sb, p.k_ss, p.k_sh, BN);
  P.tv = sm90::cached_rows_map(p.v, p.B, p.Sk, p.Hkv, p.D, p.v_sb, p.v_ss, p.v_sh, BN);
  if (dk <= 64) launch_dtype<64>(P, dtype, stream);
  else if (dk <= 128) launch_dtype<128>(P, dtype, stream);
  else launch_dtype<256>(P, dtype, stream);
  if (splits > 1) run_decode_combine(p, dtype, splits, o_part, lse_part, stream);
}

}  // namespace cuda
}  // namespace winattn
