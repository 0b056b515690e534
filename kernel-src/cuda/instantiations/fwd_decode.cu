// The split-KV decode forward (fwd_decode.h): head dims 64 / 128 / 256, fp16 and bf16, and its combine step. Every
// architecture (mma.sync).
#include "../fwd_decode.h"
#include "../launch.h"
#include "../launch_template.h"

namespace winattn {
namespace cuda {
namespace {

template <typename Elem>
void launch_combine(const DecodeParams& P, cudaStream_t stream) {
  const int64_t rows = int64_t(P.p.B) * P.p.H * P.p.Sq;
  decode_combine_kernel<Elem><<<unsigned(rows), 128, 0, stream>>>(P);
  check_cuda(cudaGetLastError(), "decode_combine_kernel");
}

template <int DK, typename Elem>
void launch_decode(const DecodeParams& P, cudaStream_t stream) {
  using Tr = DecodeTraits<DK>;
  const int64_t ctas = int64_t(P.splits) * P.p.Hkv * P.p.B;
  // (104 KB at D = 128: past the 48 KB default, raised once per device and kernel)
  raise_smem_limit(reinterpret_cast<const void*>(fwd_decode_kernel<Tr, Elem>), Tr::kSmemBytes, "fwd_decode_kernel");
  fwd_decode_kernel<Tr, Elem><<<unsigned(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(P);
  check_cuda(cudaGetLastError(), "fwd_decode_kernel");
  if (P.splits == 1) return;
  launch_combine<Elem>(P, stream);
}

template <int DK>
void launch_dtype(const DecodeParams& P, int dtype, cudaStream_t stream) {
  if (dtype == 1) launch_decode<DK, __nv_bfloat16>(P, stream);
  else launch_decode<DK, __half>(P, stream);
}

DecodeParams decode_params(const KParams& p, int splits, int chunk, float* o_part, float* lse_part) {
  DecodeParams P;
  P.p = p;
  P.splits = splits;
  P.chunk = chunk;
  P.o_part = o_part;
  P.lse_part = lse_part;
  return P;
}

}  // namespace

// (here, compiled for every architecture, also for the Hopper decode kernel's splits: a kernel template
// instantiated in two units would have one host stub for two device images of different architectures)
void run_decode_combine(const KParams& p, int dtype, int splits, float* o_part, float* lse_part,
                        cudaStream_t stream) {
  const DecodeParams P = decode_params(p, splits, 0, o_part, lse_part);
  if (dtype == 1) launch_combine<__nv_bfloat16>(P, stream);
  else launch_combine<__half>(P, stream);
}

void run_fwd_decode(const KParams& p, int dtype, int dk, int splits, int chunk, float* o_part,
                    float* lse_part, cudaStream_t stream) {
  const DecodeParams P = decode_params(p, splits, chunk, o_part, lse_part);
  if (dk <= 64) launch_dtype<64>(P, dtype, stream);
  else if (dk <= 128) launch_dtype<128>(P, dtype, stream);
  else launch_dtype<256>(P, dtype, stream);
}

}  // namespace cuda
}  // namespace winattn
