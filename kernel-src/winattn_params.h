// Parameters shared by every backend of window-attention.
//
// torch-ext/torch_binding.cpp validates the tensors and fills these plain structs; the backends
// (kernel-src/cpu, kernel-src/cuda) only read them. Keeping torch types out of here lets the CUDA code compile
// without torch headers and keeps one meaning for every field.
//
// Conventions (all backends):
//   * q/k/v/out are [B, S, H, D] with a contiguous last dim; strides below are in elements.
//   * Scores: s[b,h,i,j] = scale * <q[b,i,h], k[b,j,h_kv]> + bias + rel_table[rel_index[i,j], h];
//     h_kv = h / (H / H_kv) (GQA/MQA).
//   * Key j is visible to query i iff every present mask allows it:
//       mask[b % Pm, h, i, j] (bool, true = attend), key_padding[b, j] (true = real token),
//       and, with d = j - i - (Sk - Sq) (bottom-right alignment, as flash-attention):
//       d <= 0 when causal, d <= window_right when window_right >= 0, d >= -window_left when window_left >= 0.
//   * A query row with no visible key gets out = 0, lse = -inf, and zero gradients.
//   * lse[b,h,i] (float32, contiguous [B, H, Sq]) is the natural-log log-sum-exp of the visible scores.
#pragma once
#include <cstdint>

namespace winattn {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

// A strided 4-D operand [P, Hb, Rq, Rk] broadcast against [B, H, Sq, Sk] without being expanded:
//   batch b reads index b % P (P = 1, B, or the Swin window count nW, which divides B),
//   head h reads h when Hb == H else 0, row i reads i when Rq == Sq else 0, column j likewise.
// Used for the additive bias (fp16/bf16/fp32) and the bool mask (dtype ignored).
struct Broadcast4d {
  const void* ptr = nullptr;  // nullptr: operand absent
  DType dtype = DType::kFloat32;
  int64_t period = 1, heads = 1, rows = 1, cols = 1;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0, stride_k = 0;
};

struct FwdParams {
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0, head_dim = 0;
  DType dtype = DType::kFloat16;  // of q, k, v, out

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // [B, H, Sq] contiguous

  int64_t q_stride_b = 0, q_stride_s = 0, q_stride_h = 0;
  int64_t k_stride_b = 0, k_stride_s = 0, k_stride_h = 0;
  int64_t v_stride_b = 0, v_stride_s = 0, v_stride_h = 0;
  int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;

  Broadcast4d bias;  // additive, any float dtype
  Broadcast4d mask;  // bool, true = attend

  const bool* key_padding = nullptr;  // [B, Sk], true = real token
  int64_t kp_stride_b = 0, kp_stride_k = 0;

  const float* rel_table = nullptr;  // [T, H] float32 (Swin relative-position bias table)
  int64_t table_rows = 0, table_stride_r = 0, table_stride_h = 0;
  const int64_t* rel_index = nullptr;  // [Sq, Sk] int64, values in [0, T)
  int64_t index_stride_q = 0, index_stride_k = 0;

  float scale = 1.f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;  // [B, Sq, H, D], dtype
  int64_t do_stride_b = 0, do_stride_s = 0, do_stride_h = 0;
  // Gradients are written (not accumulated) in dtype, contiguous [B, S, H, D]; dk/dv have H_kv heads.
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  // dbias: nullptr when not requested, else contiguous [bias.period, bias.heads, bias.rows, bias.cols] allocated as
  // the backend's bwd_dbias_layout() asked (winattn_backend.h): float32 and zero-filled (the default: the backend
  // adds every score gradient into its broadcast slot), or, with dbias_in_bias_dtype, in bias.dtype and written
  // whole by the backend (zero-filled only if the layout said so).
  void* dbias = nullptr;
  bool dbias_in_bias_dtype = false;
  // dtable: nullptr when not requested, else float32 contiguous [T, H], zero-filled by the caller.
  float* dtable = nullptr;
  bool deterministic = false;  // same inputs -> bit-identical gradients
  // Gradient of lse (float32 contiguous [B, H, Sq]) when the caller back-propagates through it (ring attention
  // merges partial results through lse); nullptr = zero. d lse_i / d s_ij = P_ij, so it enters as
  // dS_ij = P_ij * (dP_ij - (rowsum(dO_i * O_i) - dlse_i)): backends subtract it from delta.
  const float* dlse = nullptr;
};

}  // namespace winattn
