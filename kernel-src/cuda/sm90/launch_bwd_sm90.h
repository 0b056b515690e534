// Definitions of the backward v3 entry point (bwd_v3_api.h): the tensor maps and the launch of what the plan chose;
// included only by instantiations/bwd_v3_sm90_hdim*.cu (sm_90a).
#pragma once
#include "../host_env.h"
#include "../launch_template.h"
#include "bwd_pipelined_sm90.h"
#include "bwd_v3_api.h"
#include "tensor_map_sm90.h"

namespace winattn {
namespace cuda {

template <int D>
struct BwdPipelinedSm90 {
  using Tr = typename sm90::BwdPipeTraitsSm90For<D>::type;
  using Deep = typename sm90::BwdPipeTraitsSm90For<D>::deep;
  using Fn = void (*)(sm90::BwdPipeParams);
  // deferred dQ (bwd_consume) wherever no dbias tile is staged: always without a term (no dbias then)
  template <typename T, typename Elem, int kTerms>
  static Fn pick_pair(bool pair, bool defer) {
    constexpr int kRead = bwd_terms_read(kTerms);
    if constexpr (D == 64 && kRead == kBwdTermsStaged)  // pair mode (the staged term): dK / dV of two batches fit
      if (pair) return sm90::bwd_pipelined_kernel_sm90<T, Elem, kTerms, true, false>;  // at D = 64 (dbias)
    // (the split consumer has its own schedule; no dbias, so deferred dQ, without a term, with a row term or bits)
    if constexpr (T::kSplitD || kRead == kBwdTermsNone || kRead == kBwdTermsRow || kRead == kBwdTermsBits)
      return sm90::bwd_pipelined_kernel_sm90<T, Elem, kTerms, false, !T::kSplitD>;
    else
      return defer ? sm90::bwd_pipelined_kernel_sm90<T, Elem, kTerms, false, true>
                   : sm90::bwd_pipelined_kernel_sm90<T, Elem, kTerms, false, false>;
  }
  template <typename Elem>
  static Fn pick_terms(int terms, bool hides, bool pair, bool defer) {
    if constexpr (!Tr::kSplitD) {  // (the split head-dim consumer reads every term from global memory)
      if (terms == kBwdTermsStaged)
        return hides ? pick_pair<Tr, Elem, kBwdTermsStagedHiding>(pair, defer)
                     : pick_pair<Tr, Elem, kBwdTermsStaged>(pair, defer);
      if (terms == kBwdTermsRow)
        return hides ? pick_pair<Tr, Elem, kBwdTermsRowHiding>(pair, defer)
                     : pick_pair<Tr, Elem, kBwdTermsRow>(pair, defer);
      if (terms == kBwdTermsBits) return pick_pair<Tr, Elem, kBwdTermsBits>(pair, defer);
      if (terms == kBwdTermsRowKeyGrad) return pick_pair<Tr, Elem, kBwdTermsRowKeyGrad>(pair, defer);
    }
    if (terms == kBwdTermsGlobal) return pick_pair<Tr, Elem, kBwdTermsGlobal>(pair, defer);
    return pick_pair<Tr, Elem, kBwdTermsNone>(pair, defer);
  }
  static Fn pick(int dtype, int terms, bool hides, bool pair, bool defer) {
    return dtype == 0 ? pick_terms<__half>(terms, hides, pair, defer)
                      : pick_terms<__nv_bfloat16>(terms, hides, pair, defer);
  }
  // no additive term, head dim 64: 128 queries per step (BwdV3Buffers::block_m; bwd_v3_q64 keeps 64), dQ
  // accumulated or stored directly
  template <typename Elem>
  static Fn pick_q128(bool direct) {
    if constexpr (D == 64) {
      using Q = typename sm90::BwdPipeTraitsSm90For<64>::q128;
      return direct ? sm90::bwd_dq_direct_kernel_sm90<Q, Elem, kBwdTermsNone>
                    : sm90::bwd_pipelined_kernel_sm90<Q, Elem, kBwdTermsNone, false, true>;
    }
    throw std::runtime_error("window_attention (cuda): bwd v3 planned 128 queries per step past head dim 64");
  }
  // no additive term: three stages (WINATTN_FORCE_KERNEL=bwd_v3_two_stages keeps two, for A/B runs)
  static Fn pick_deep(int dtype) {
    constexpr bool defer = !Deep::kSplitD;
    return dtype == 0 ? sm90::bwd_pipelined_kernel_sm90<Deep, __half, kBwdTermsNone, false, defer>
                      : sm90::bwd_pipelined_kernel_sm90<Deep, __nv_bfloat16, kBwdTermsNone, false, defer>;
  }
  // dQ stored by the kernel (BwdV3Buffers::dq_mode; kernel_choice.h allows each on these deferred kernels only):
  // direct on the deep kernel without a term, or with a row term / mask bits; resident on the deep kernel
  template <typename Elem>
  static Fn pick_dq_direct(int terms, bool hides) {
    if constexpr (!Tr::kSplitD) {
      if (terms == kBwdTermsRow)
        return hides ? sm90::bwd_dq_direct_kernel_sm90<Tr, Elem, kBwdTermsRowHiding>
                     : sm90::bwd_dq_direct_kernel_sm90<Tr, Elem, kBwdTermsRow>;
      if (terms == kBwdTermsBits) return sm90::bwd_dq_direct_kernel_sm90<Tr, Elem, kBwdTermsBits>;
      if (terms == kBwdTermsNone) return sm90::bwd_dq_direct_kernel_sm90<Deep, Elem, kBwdTermsNone>;
    }
    throw std::runtime_error("window_attention (cuda): bwd v3 planned dQ stored directly for a kernel without it");
  }
  // (not at 128: the deep kernel's 212 KB leave no room for even one 64-row dQ tile of 32 KB)
  template <typename Elem>
  static Fn pick_dq_resident() {
    if constexpr (D <= 96) return sm90::bwd_dq_resident_kernel_sm90<Deep, Elem>;
    throw std::runtime_error("window_attention (cuda): bwd v3 planned dQ in shared memory past head dim 96");
  }
  static constexpr const char* kName = "window_attention bwd (sm90 v3)";
};

// Map of a padded fp32 [B, H, sq_pad] row vector of the preprocess (lse2, delta), read in boxes of `box` entries.
inline CUtensorMap make_vec_map(const float* base, int B, int H, int sq_pad, int box, const char* what) {
  const cuuint64_t row = cuuint64_t(sq_pad) * 4;
  const cuuint64_t dims[4] = {cuuint64_t(sq_pad), cuuint64_t(H), cuuint64_t(B), 1};
  const cuuint64_t strides[3] = {row, row * H, row * H * B};
  return sm90::encode_4d(base, dims, strides, box, 1, CU_TENSOR_MAP_SWIZZLE_NONE, what,
                         CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
}

// Launches what the plan chose (kernel_choice.h configure_bwd_v3: terms, pair mode, deferred dQ, pipeline depth,
// shared memory).
template <int D>
void run_bwd_pipelined_sm90(const KParams& p, const BwdV3Buffers& buf, int dtype, cudaStream_t stream) {
  using K = BwdPipelinedSm90<D>;
  using Tr = typename K::Tr;
  sm90::BwdPipeParams P;
  P.p = p;
  P.lse2 = buf.lse2;
  P.delta = buf.delta;
  P.dq_acc = buf.dq_acc;
  P.dq_sems = buf.dq_sems;
  P.sq_pad = buf.sq_pad;
  // (boxes of the traits' column blocks: 16 columns with the 32-byte swizzle at head dim 96; rows: the step's queries)
  constexpr int C = Tr::kBlockCols;
  const int bm = buf.block_m;
  P.tq = sm90::cached_rows_map(p.q, p.B, p.Sq, p.H, p.D, p.q_sb, p.q_ss, p.q_sh, bm, C);
  P.tdo = sm90::cached_rows_map(p.dout, p.B, p.Sq, p.H, p.D, p.do_sb, p.do_ss, p.do_sh, bm, C);
  P.tk = sm90::cached_rows_map(p.k, p.B, p.Sk, p.Hkv, p.D, p.k_sb, p.k_ss, p.k_sh, Tr::kBlockN, C);
  P.tv = sm90::cached_rows_map(p.v, p.B, p.Sk, p.Hkv, p.D, p.v_sb, p.v_ss, p.v_sh, Tr::kBlockN, C);
  P.tlse = make_vec_map(buf.lse2, p.B, p.H, buf.sq_pad, bm, "the backward's lse rows");
  P.tdelta = make_vec_map(buf.delta, p.B, p.H, buf.sq_pad, bm, "the backward's delta rows");
  if (buf.terms == kBwdTermsStaged) {
    P.bias_stage_bytes = Tr::kBiasBytes;
    P.tb = sm90::make_bias_map(p.bias.ptr, p.bias.period, p.bias.heads, p.Sq, p.Sk, p.bias.sb, p.bias.sh, p.bias.sq,
                               Tr::kBlockM);
  }
  const bool pair = buf.pair;
  if (buf.dbias_mode != kDbiasNone) {
    if (buf.dbias == nullptr) throw std::runtime_error("window_attention (cuda): bwd v3 planned dbias without one");
    P.dbias_mode = buf.dbias_mode;
    P.dbias_bufs = buf.dbias_bufs;
    P.db_period = buf.dbias_period;
    P.db_heads = buf.dbias_heads;
    if (buf.dbias_mode == kDbiasAtomic) {
      P.dbias_f32 = static_cast<float*>(buf.dbias);
      P.db_rows = buf.dbias_rows;
      P.db_cols = buf.dbias_cols;
    } else if (buf.dbias_mode == kDbiasStore16) {  // the bias map's layout: 64-column boxes, as bias_elem_offset writes
      const int64_t plane = int64_t(p.Sq) * p.Sk;
      P.dbias_tile_bytes = Tr::kBiasBytes;
      P.tdb = sm90::make_bias_map(buf.dbias, P.db_period, P.db_heads, p.Sq, p.Sk, plane * P.db_heads, plane, p.Sk,
                                  Tr::kBlockM);
    } else {
      P.dbias_tile_bytes = Tr::kDbiasBytes;
      P.tdb = sm90::make_dbias_map(static_cast<float*>(buf.dbias), P.db_period, P.db_heads, p.Sq, p.Sk,
                                   buf.dbias_pitch, Tr::kBlockM);
    }
  }
  // a CTA per key block (and KV head and batch), or per (KV head, batch) walking the key blocks (dQ resident)
  const bool resident = buf.dq_mode == kBwdDqResident;
  const int64_t grid = int64_t(resident ? 1 : ceil_div(p.Sk, Tr::kBlockN)) * p.Hkv * (pair ? p.B / 2 : p.B);
  typename K::Fn kernel;
  if (resident)
    kernel = dtype == 0 ? K::template pick_dq_resident<__half>() : K::template pick_dq_resident<__nv_bfloat16>();
  else if (buf.block_m == 128)
    kernel = dtype == 0 ? K::template pick_q128<__half>(buf.dq_mode == kBwdDqDirect)
                        : K::template pick_q128<__nv_bfloat16>(buf.dq_mode == kBwdDqDirect);
  else if (buf.dq_mode == kBwdDqDirect)
    kernel = dtype == 0 ? K::template pick_dq_direct<__half>(buf.terms, buf.hides)
                        : K::template pick_dq_direct<__nv_bfloat16>(buf.terms, buf.hides);
  else
    kernel = buf.deep ? K::pick_deep(dtype) : K::pick(dtype, buf.terms, buf.hides, pair, buf.defer);
  raise_smem_limit(reinterpret_cast<const void*>(kernel), buf.smem, K::kName);
  kernel<<<dim3(unsigned(grid)), dim3(Tr::kNThreads), buf.smem, stream>>>(P);
  check_cuda(cudaGetLastError(), K::kName);
}

#define WINATTN_INSTANTIATE_BWD_PIPELINED_SM90(D) \
  template void run_bwd_pipelined_sm90<D>(const KParams&, const BwdV3Buffers&, int, cudaStream_t);

}  // namespace cuda
}  // namespace winattn
