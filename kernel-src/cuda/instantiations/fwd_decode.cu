// The split-KV decode forward (fwd_decode.h): head dims 64 / 128 / 256 x rows 1 / 4 / 8, fp16 and bf16, and its
// combine step. Every architecture (no tensor cores).
#include "../fwd_decode.h"
#include "../launch.h"

namespace winattn {
namespace cuda {
namespace {

template <int DK, int R>
void launch_decode(const DecodeParams& P, int dtype, cudaStream_t stream) {
  using Tr = DecodeTraits<DK, R>;
  const int64_t ctas = int64_t(P.splits) * P.p.Hkv * P.p.B;
  if (dtype == 1)
    fwd_decode_kernel<Tr, __nv_bfloat16><<<unsigned(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(P);
  else
    fwd_decode_kernel<Tr, __half><<<unsigned(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(P);
  check_cuda(cudaGetLastError(), "fwd_decode_kernel");
  if (P.splits == 1) return;
  const int64_t rows = int64_t(P.p.B) * P.p.H * P.p.Sq;
  const unsigned blocks = unsigned((rows + 3) / 4);
  if (dtype == 1)
    decode_combine_kernel<__nv_bfloat16><<<blocks, 128, 0, stream>>>(P);
  else
    decode_combine_kernel<__half><<<blocks, 128, 0, stream>>>(P);
  check_cuda(cudaGetLastError(), "decode_combine_kernel");
}

template <int DK>
void launch_rows(const DecodeParams& P, int rows, int dtype, cudaStream_t stream) {
  if (rows <= 1) launch_decode<DK, 1>(P, dtype, stream);
  else if (rows <= 4) launch_decode<DK, 4>(P, dtype, stream);
  else launch_decode<DK, 8>(P, dtype, stream);
}

}  // namespace

void run_fwd_decode(const KParams& p, int dtype, int dk, int rows, int splits, int chunk, float* o_part,
                    float* lse_part, cudaStream_t stream) {
  DecodeParams P;
  P.p = p;
  P.splits = splits;
  P.chunk = chunk;
  P.o_part = o_part;
  P.lse_part = lse_part;
  if (dk <= 64) launch_rows<64>(P, rows, dtype, stream);
  else if (dk <= 128) launch_rows<128>(P, rows, dtype, stream);
  else launch_rows<256>(P, rows, dtype, stream);
}

}  // namespace cuda
}  // namespace winattn
