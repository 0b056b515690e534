// Definitions of the backward v3 entry points (bwd_v3_api.h): readiness, the call's shared memory, tensor maps and
// the launch. Included only by instantiations/bwd_v3_sm90_hdim*.cu (sm_90a).
#pragma once
#include "../launch_template.h"
#include "bwd_pipelined_sm90.h"
#include "bwd_v3_api.h"
#include "tensor_map_sm90.h"

namespace winattn {
namespace cuda {

template <int D>
struct BwdPipelinedSm90 {
  using Tr = typename sm90::BwdPipeTraitsSm90For<D>::type;
  using Fn = void (*)(sm90::BwdPipeParams);
  static Fn pick(int dtype, bool bias) {
    if (dtype == 0)
      return bias ? sm90::bwd_pipelined_kernel_sm90<Tr, __half, true> : sm90::bwd_pipelined_kernel_sm90<Tr, __half, false>;
    return bias ? sm90::bwd_pipelined_kernel_sm90<Tr, __nv_bfloat16, true>
                : sm90::bwd_pipelined_kernel_sm90<Tr, __nv_bfloat16, false>;
  }
  static constexpr const char* kName = "window_attention bwd (sm90 v3)";
};

template <int D>
bool bwd_pipelined_sm90_ready(int dtype) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, BwdPipelinedSm90<D>::pick(dtype, false)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}

// The additive term is staged when it is a full-rows / full-columns tile of the input dtype with contiguous,
// 16-byte aligned rows (TMA); other terms (fp32, row / column broadcasts) are left to v1.
template <typename Tr>
bool bwd_bias_stageable(const KParams& p, int dtype) {
  const Operand4d& t = p.bias;
  if (t.ptr == nullptr) return true;
  if (t.dtype != dtype || t.rows != p.Sq || t.cols != p.Sk || t.sk != 1) return false;
  return reinterpret_cast<uintptr_t>(t.ptr) % 16 == 0 && (t.sq * 2) % 16 == 0 &&
         (t.heads == 1 || (t.sh * 2) % 16 == 0) && (t.period == 1 || (t.sb * 2) % 16 == 0);
}

template <int D>
int bwd_pipelined_sm90_smem(const KParams& p, int dtype, bool dbias, int smem_optin) {
  using Tr = typename BwdPipelinedSm90<D>::Tr;
  if (!bwd_bias_stageable<Tr>(p, dtype)) return 0;
  const int smem = Tr::kSmemBytes + (p.bias.ptr ? Tr::kStages * Tr::kBiasBytes : 0) + (dbias ? Tr::kDbiasBytes : 0);
  return smem <= smem_optin ? smem : 0;
}

template <int D>
void run_bwd_pipelined_sm90(const KParams& p, const BwdV3Buffers& buf, int dtype, int smem_optin,
                            cudaStream_t stream) {
  using K = BwdPipelinedSm90<D>;
  using Tr = typename K::Tr;
  sm90::BwdPipeParams P;
  P.p = p;
  P.lse2 = buf.lse2;
  P.delta = buf.delta;
  P.dq_acc = buf.dq_acc;
  P.dq_sems = buf.dq_sems;
  P.sq_pad = buf.sq_pad;
  P.tq = sm90::make_rows_map(p.q, p.B, p.Sq, p.H, p.D, p.q_sb, p.q_ss, p.q_sh, Tr::kBlockM);
  P.tdo = sm90::make_rows_map(p.dout, p.B, p.Sq, p.H, p.D, p.do_sb, p.do_ss, p.do_sh, Tr::kBlockM);
  P.tk = sm90::make_rows_map(p.k, p.B, p.Sk, p.Hkv, p.D, p.k_sb, p.k_ss, p.k_sh, Tr::kBlockN);
  P.tv = sm90::make_rows_map(p.v, p.B, p.Sk, p.Hkv, p.D, p.v_sb, p.v_ss, p.v_sh, Tr::kBlockN);
  if (p.bias.ptr != nullptr) {
    P.bias_stage_bytes = Tr::kBiasBytes;
    P.tb = sm90::make_bias_map(p.bias.ptr, p.bias.period, p.bias.heads, p.Sq, p.Sk, p.bias.sb, p.bias.sh, p.bias.sq,
                               Tr::kBlockM);
  }
  if (buf.dbias != nullptr) {
    P.dbias_mode = buf.dbias_shared ? sm90::kDbiasReduce : sm90::kDbiasStore;
    P.db_period = buf.dbias_period;
    P.db_heads = buf.dbias_heads;
    P.tdb = sm90::make_dbias_map(buf.dbias, P.db_period, P.db_heads, p.Sq, p.Sk, Tr::kBlockM);
  }
  const int smem = bwd_pipelined_sm90_smem<D>(p, dtype, buf.dbias != nullptr, smem_optin);
  if (smem == 0) throw std::runtime_error("window_attention (cuda): bwd v3 planned for a call it cannot stage");
  const int64_t grid = int64_t(ceil_div(p.Sk, Tr::kBlockN)) * p.Hkv * p.B;
  auto kernel = K::pick(dtype, p.bias.ptr != nullptr);
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem, K::kName);
  kernel<<<dim3(unsigned(grid)), dim3(Tr::kNThreads), smem, stream>>>(P);
  check_cuda(cudaGetLastError(), K::kName);
}

#define WINATTN_INSTANTIATE_BWD_PIPELINED_SM90(D)                                                    \
  template bool bwd_pipelined_sm90_ready<D>(int);                                                    \
  template int bwd_pipelined_sm90_smem<D>(const KParams&, int, bool, int);                           \
  template void run_bwd_pipelined_sm90<D>(const KParams&, const BwdV3Buffers&, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace winattn
