// Op schemas, argument checks and the torch -> winattn::*Params translation (torch stable ABI: one binary serves
// every torch >= 2.10). The Python layer (window_attention/interface.py) already normalizes shapes and raises
// friendly ValueErrors; the checks here keep the op safe when it is called directly through torch.ops.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#ifdef CUDA_KERNEL
#include <torch/csrc/stable/accelerator.h>
#endif

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "registration.h"
#include "torch_binding.h"
#include "winattn_backend.h"

using torch::headeronly::ScalarType;

namespace {

#define WINATTN_CHECK(cond, ...) STD_TORCH_CHECK(cond, "window_attention: ", __VA_ARGS__)

winattn::DType to_dtype(ScalarType t, const char* name) {
  switch (t) {
    case ScalarType::Half: return winattn::DType::kFloat16;
    case ScalarType::BFloat16: return winattn::DType::kBFloat16;
    case ScalarType::Float: return winattn::DType::kFloat32;
    default: WINATTN_CHECK(false, name, " must be float16, bfloat16 or float32");
  }
  return winattn::DType::kFloat32;
}

bool on_kernel_device(const Tensor& t) {
#ifdef CUDA_KERNEL
  return t.is_cuda();
#else
  return t.is_cpu();
#endif
}

constexpr const char* kDeviceName =
#ifdef CUDA_KERNEL
    "cuda";
#else
    "cpu";
#endif

void check_qkv_like(const Tensor& t, const char* name) {
  WINATTN_CHECK(on_kernel_device(t), name, " must be a ", kDeviceName, " tensor for this build");
  WINATTN_CHECK(t.dim() == 4, name, " must be 4-D [B, S, H, D], got ", t.dim(), "-D");
  // Empty tensors are never read, and autograd may hand them over with any strides.
  WINATTN_CHECK(t.numel() == 0 || t.stride(3) == 1, name, " must have a contiguous last dim (stride(-1) == 1)");
}

// [P, Hb, Rq, Rk] broadcast against [B, H, Sq, Sk]; see winattn_params.h.
winattn::Broadcast4d broadcast4d(const std::optional<Tensor>& t, const char* name, int64_t B, int64_t H,
                                 int64_t Sq, int64_t Sk, bool is_mask) {
  winattn::Broadcast4d b;
  if (!t.has_value()) return b;
  const Tensor& x = *t;
  WINATTN_CHECK(on_kernel_device(x), name, " must be on the same device as q");
  WINATTN_CHECK(x.dim() == 4, name, " must be 4-D at the op level, got ", x.dim(), "-D");
  if (is_mask) {
    WINATTN_CHECK(x.scalar_type() == ScalarType::Bool, name, " must be a bool tensor (true = attend)");
  } else {
    b.dtype = to_dtype(x.scalar_type(), name);
  }
  auto s = x.sizes();
  WINATTN_CHECK(s[0] >= 1 && B % s[0] == 0, name, " dim 0 (", s[0], ") must divide the batch size ", B);
  WINATTN_CHECK(s[1] == 1 || s[1] == H, name, " dim 1 (", s[1], ") must be 1 or num_heads ", H);
  WINATTN_CHECK(s[2] == 1 || s[2] == Sq, name, " dim 2 (", s[2], ") must be 1 or seqlen_q ", Sq);
  WINATTN_CHECK(s[3] == 1 || s[3] == Sk, name, " dim 3 (", s[3], ") must be 1 or seqlen_k ", Sk);
  b.ptr = x.const_data_ptr();
  b.period = s[0]; b.heads = s[1]; b.rows = s[2]; b.cols = s[3];
  // A size-1 dim is read at index 0 only, so its stride never matters; make it 0 for the kernels.
  b.stride_b = s[0] == 1 ? 0 : x.stride(0);
  b.stride_h = s[1] == 1 ? 0 : x.stride(1);
  b.stride_q = s[2] == 1 ? 0 : x.stride(2);
  b.stride_k = s[3] == 1 ? 0 : x.stride(3);
  return b;
}

#ifndef CUDA_KERNEL
// Every rel_index entry must be a row of the table: the forward gathers and the backward scatters (dtable)
// through it without bounds checks. On CPU the index is host memory, so this runs on every call (Sq * Sk reads,
// ~0.4 us for a 7x7 window, no sync) and also guards direct torch.ops calls and compiled graphs. On CUDA reading
// it would cost a device -> host sync per call; the Python layer checks it once per index tensor instead
// (window_attention/_index_bounds.py).
void check_index_range(const winattn::FwdParams& p) {
  // x lies in [0, rows) iff neither x nor (rows - 1 - x) has its sign bit set, so OR-ing both over all entries
  // (in uint64: no signed overflow for x = INT64_MIN) leaves the sign bit clear iff every entry is in range. OR and
  // subtract vectorize on 64-bit lanes with baseline SSE2, unlike the unsigned max this replaced (1.3 -> 0.4 us for
  // a 7x7 window). The offending entry is located only on the error path.
  const auto rows = static_cast<uint64_t>(p.table_rows);
  const uint64_t top = rows - 1;  // rows = 0: wraps to the largest value, every entry fails
  uint64_t acc = 0;
  for (int64_t i = 0; i < p.seqlen_q; ++i) {
    const int64_t* row = p.rel_index + i * p.index_stride_q;
    if (p.index_stride_k == 1) {
      for (int64_t j = 0; j < p.seqlen_k; ++j) {
        const auto x = static_cast<uint64_t>(row[j]);
        acc |= x | (top - x);
      }
    } else {
      for (int64_t j = 0; j < p.seqlen_k; ++j) {
        const auto x = static_cast<uint64_t>(row[j * p.index_stride_k]);
        acc |= x | (top - x);
      }
    }
  }
  if ((acc >> 63) == 0) return;
  for (int64_t i = 0; i < p.seqlen_q; ++i)
    for (int64_t j = 0; j < p.seqlen_k; ++j) {
      const int64_t x = p.rel_index[i * p.index_stride_q + j * p.index_stride_k];
      WINATTN_CHECK(static_cast<uint64_t>(x) < rows, "rel_pos_index[", i, ", ", j, "] = ", x,
                    " is out of range for a rel_pos_table of ", p.table_rows, " rows (entries must lie in [0, ",
                    p.table_rows - 1, "])");
    }
}
#endif

void fill_common(winattn::FwdParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                 const std::optional<Tensor>& bias, const std::optional<Tensor>& mask,
                 const std::optional<Tensor>& key_padding_mask, const std::optional<Tensor>& rel_pos_table,
                 const std::optional<Tensor>& rel_pos_index, double scale, bool causal, int64_t window_left,
                 int64_t window_right) {
  check_qkv_like(q, "q");
  check_qkv_like(k, "k");
  check_qkv_like(v, "v");
  WINATTN_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
                "q, k and v must have the same dtype");
  p.dtype = to_dtype(q.scalar_type(), "q");
#ifdef CUDA_KERNEL
  WINATTN_CHECK(p.dtype != winattn::DType::kFloat32, "the CUDA kernels take float16 or bfloat16 q/k/v");
  WINATTN_CHECK(q.get_device_index() == k.get_device_index() && q.get_device_index() == v.get_device_index(),
                "q, k and v must be on the same CUDA device");
#endif
  p.batch = q.size(0);
  p.seqlen_q = q.size(1);
  p.heads = q.size(2);
  p.head_dim = q.size(3);
  p.seqlen_k = k.size(1);
  p.heads_kv = k.size(2);
  WINATTN_CHECK(k.size(0) == p.batch && v.size(0) == p.batch, "q, k, v batch sizes differ");
  WINATTN_CHECK(v.size(1) == p.seqlen_k, "k and v sequence lengths differ");
  WINATTN_CHECK(v.size(2) == p.heads_kv, "k and v head counts differ");
  WINATTN_CHECK(k.size(3) == p.head_dim && v.size(3) == p.head_dim, "q, k, v head dims differ");
  WINATTN_CHECK(p.heads_kv >= 1 && p.heads % p.heads_kv == 0, "num_heads (", p.heads,
                ") must be a multiple of the k/v head count (", p.heads_kv, ")");
  WINATTN_CHECK(p.head_dim % 8 == 0 && p.head_dim >= 8 && p.head_dim <= 256,
                "head dim must be a multiple of 8 in [8, 256], got ", p.head_dim);
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.q_stride_b = q.stride(0); p.q_stride_s = q.stride(1); p.q_stride_h = q.stride(2);
  p.k_stride_b = k.stride(0); p.k_stride_s = k.stride(1); p.k_stride_h = k.stride(2);
  p.v_stride_b = v.stride(0); p.v_stride_s = v.stride(1); p.v_stride_h = v.stride(2);

  p.bias = broadcast4d(bias, "bias", p.batch, p.heads, p.seqlen_q, p.seqlen_k, false);
  p.mask = broadcast4d(mask, "mask", p.batch, p.heads, p.seqlen_q, p.seqlen_k, true);

  if (key_padding_mask.has_value()) {
    const Tensor& m = *key_padding_mask;
    WINATTN_CHECK(on_kernel_device(m), "key_padding_mask must be on the same device as q");
    WINATTN_CHECK(m.scalar_type() == ScalarType::Bool, "key_padding_mask must be bool (true = real token)");
    WINATTN_CHECK(m.dim() == 2 && m.size(0) == p.batch && m.size(1) == p.seqlen_k,
                  "key_padding_mask must be [B, Sk] = [", p.batch, ", ", p.seqlen_k, "]");
    p.key_padding = static_cast<const bool*>(m.const_data_ptr());
    p.kp_stride_b = m.stride(0);
    p.kp_stride_k = m.stride(1);
  }

  WINATTN_CHECK(rel_pos_table.has_value() == rel_pos_index.has_value(),
                "rel_pos_table and rel_pos_index must be given together");
  if (rel_pos_table.has_value()) {
    const Tensor& t = *rel_pos_table;
    const Tensor& idx = *rel_pos_index;
    WINATTN_CHECK(on_kernel_device(t) && on_kernel_device(idx), "rel_pos_table/index must be on q's device");
    WINATTN_CHECK(t.scalar_type() == ScalarType::Float, "rel_pos_table must be float32 at the op level");
    WINATTN_CHECK(t.dim() == 2 && t.size(1) == p.heads, "rel_pos_table must be [T, num_heads]");
    WINATTN_CHECK(idx.scalar_type() == ScalarType::Long, "rel_pos_index must be int64 at the op level");
    WINATTN_CHECK(idx.dim() == 2 && idx.size(0) == p.seqlen_q && idx.size(1) == p.seqlen_k,
                  "rel_pos_index must be [Sq, Sk]");
    p.rel_table = static_cast<const float*>(t.const_data_ptr());
    p.table_rows = t.size(0);
    p.table_stride_r = t.stride(0);
    p.table_stride_h = t.stride(1);
    p.rel_index = static_cast<const int64_t*>(idx.const_data_ptr());
    p.index_stride_q = idx.stride(0);
    p.index_stride_k = idx.stride(1);
#ifndef CUDA_KERNEL
    check_index_range(p);
#endif
  }

  WINATTN_CHECK(window_left >= -1 && window_right >= -1, "window sizes must be >= 0, or -1 for unbounded");
  // Any side >= Sq + Sk is unbounded in effect (see _window in _args.py); clamping keeps the kernels' int64
  // band arithmetic from overflowing for sides near INT64_MAX.
  const int64_t window_cap = p.seqlen_q + p.seqlen_k;
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.window_left = std::min(window_left, window_cap);
  p.window_right = std::min(window_right, window_cap);
}

void* current_stream(const Tensor& q) {
#ifdef CUDA_KERNEL
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(q.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "window_attention: cannot get the current CUDA stream");
  return stream;
#else
  (void)q;
  return nullptr;
#endif
}

// A new contiguous tensor of `sizes` on `like`'s device, with `like`'s dtype or float32. Why not
// torch::stable::new_empty: under the 2.10 stable ABI that one calls aten::new_empty through the boxed dispatcher
// by name (operator lookup, a boxed argument stack), about 0.6 us each on the CPU host, where a one-window forward
// allocates two outputs in a ~15 us call. aoti_torch_empty_strided is the AOTInductor C shim that the stable ABI
// itself is built on (exported by every torch >= 2.10) and allocates through the same caching allocators.
// dtype: an aoti_torch_dtype_*() code, or -1 for like's dtype.
Tensor new_contiguous(const Tensor& like, std::initializer_list<int64_t> sizes, int32_t dtype = -1) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  int64_t strides[8];
  int64_t step = 1;
  for (int64_t d = ndim - 1; d >= 0; --d) {
    strides[d] = step;
    step *= std::max<int64_t>(sizes.begin()[d], 1);
  }
  int32_t device_type = 0, device_index = 0;
  if (dtype < 0) STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(like.get(), &dtype));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  AtenTensorHandle out = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(ndim, sizes.begin(), strides, dtype, device_type,
                                                         device_index, &out));
  return Tensor(out);
}

// Scratch memory for the kernels. A zero-byte request (the CPU forward; a CUDA forward without a table) gets no
// allocation and a null pointer: on one small window the allocator call was ~1 us of a ~15 us call.
struct Workspace {
  std::optional<Tensor> tensor;  // keeps the memory alive until the kernels are queued
  void* ptr = nullptr;
};

Workspace workspace(const Tensor& like, int64_t bytes) {
  Workspace ws;
  if (bytes > 0) {
    ws.tensor = new_contiguous(like, {bytes}, aoti_torch_dtype_uint8());
    ws.ptr = ws.tensor->mutable_data_ptr();
  }
  return ws;
}

}  // namespace

std::tuple<Tensor, Tensor> winattn_fwd(Tensor q, Tensor k, Tensor v, std::optional<Tensor> bias,
                                       std::optional<Tensor> mask, std::optional<Tensor> key_padding_mask,
                                       std::optional<Tensor> rel_pos_table, std::optional<Tensor> rel_pos_index,
                                       double scale, bool causal, int64_t window_left, int64_t window_right,
                                       bool deterministic) {
  (void)deterministic;
#ifdef CUDA_KERNEL
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
#endif
  winattn::FwdParams p;
  fill_common(p, q, k, v, bias, mask, key_padding_mask, rel_pos_table, rel_pos_index, scale, causal, window_left,
              window_right);
  Tensor out = new_contiguous(q, {p.batch, p.seqlen_q, p.heads, p.head_dim});
  Tensor lse = new_contiguous(q, {p.batch, p.heads, p.seqlen_q}, aoti_torch_dtype_float32());
  p.out = out.mutable_data_ptr();
  p.lse = static_cast<float*>(lse.mutable_data_ptr());
  p.o_stride_b = out.stride(0); p.o_stride_s = out.stride(1); p.o_stride_h = out.stride(2);
  Workspace ws = workspace(q, winattn::fwd_workspace_bytes(p));
  winattn::fwd(p, ws.ptr, current_stream(q));
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> winattn_bwd(
    Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, std::optional<Tensor> bias,
    std::optional<Tensor> mask, std::optional<Tensor> key_padding_mask, std::optional<Tensor> rel_pos_table,
    std::optional<Tensor> rel_pos_index, double scale, bool causal, int64_t window_left, int64_t window_right,
    bool bias_requires_grad, bool table_requires_grad, bool deterministic, std::optional<Tensor> grad_lse) {
#ifdef CUDA_KERNEL
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
#endif
  winattn::BwdParams p;
  fill_common(p, q, k, v, bias, mask, key_padding_mask, rel_pos_table, rel_pos_index, scale, causal, window_left,
              window_right);
  check_qkv_like(grad_out, "grad_out");
  check_qkv_like(out, "out");
  WINATTN_CHECK(grad_out.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
                "grad_out and out must have q's dtype");
  WINATTN_CHECK(lse.scalar_type() == ScalarType::Float && lse.dim() == 3 && lse.is_contiguous(),
                "lse must be a contiguous float32 [B, H, Sq] tensor");
  p.out = out.mutable_data_ptr();
  p.lse = static_cast<float*>(lse.mutable_data_ptr());
  p.o_stride_b = out.stride(0); p.o_stride_s = out.stride(1); p.o_stride_h = out.stride(2);
  p.dout = grad_out.const_data_ptr();
  p.do_stride_b = grad_out.stride(0); p.do_stride_s = grad_out.stride(1); p.do_stride_h = grad_out.stride(2);
  p.deterministic = deterministic;
  if (grad_lse.has_value()) {
    const Tensor& g = *grad_lse;
    WINATTN_CHECK(on_kernel_device(g) && g.scalar_type() == ScalarType::Float && g.dim() == 3 && g.is_contiguous() &&
                      g.size(0) == p.batch && g.size(1) == p.heads && g.size(2) == p.seqlen_q,
                  "grad_lse must be a contiguous float32 [B, H, Sq] tensor on q's device");
    p.dlse = static_cast<const float*>(g.const_data_ptr());
  }

  // (new_contiguous, as the forward's outputs: with five boxed new_empty calls a forward + backward of one 7x7
  // window took 107 us on the CPU build, 98 without them; RESULTS v5.10)
  Tensor dq = new_contiguous(q, {p.batch, p.seqlen_q, p.heads, p.head_dim});
  Tensor dk = new_contiguous(q, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim});
  Tensor dv = new_contiguous(q, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim});
  p.dq = dq.mutable_data_ptr();
  p.dk = dk.mutable_data_ptr();
  p.dv = dv.mutable_data_ptr();

  // dbias leaves in the bias's dtype (the op's fake says so too). The kernel writes it either directly (a layout
  // the backend asks for where each element is written once) or into a zero-filled float32 buffer, cast here.
  Tensor dbias = new_contiguous(q, {0}, aoti_torch_dtype_float32());
  Tensor dbias32 = dbias;
  if (bias_requires_grad) {
    WINATTN_CHECK(bias.has_value(), "bias_requires_grad without a bias");
    const winattn::DbiasLayout layout = winattn::bwd_dbias_layout(p);
    const std::vector<int64_t> shape = {p.bias.period, p.bias.heads, p.bias.rows, p.bias.cols};
    const ScalarType dt = layout.in_bias_dtype ? bias->scalar_type() : ScalarType::Float;
    dbias32 = layout.zero_fill ? torch::stable::new_zeros(q, shape, dt) : torch::stable::new_empty(q, shape, dt);
    p.dbias = dbias32.mutable_data_ptr();
    p.dbias_in_bias_dtype = layout.in_bias_dtype;
    dbias = bias->scalar_type() == dt ? dbias32 : torch::stable::new_empty(q, shape, bias->scalar_type());
  }
  Tensor dtable = new_contiguous(q, {0}, aoti_torch_dtype_float32());
  if (table_requires_grad) {
    WINATTN_CHECK(rel_pos_table.has_value(), "table_requires_grad without a rel_pos_table");
    dtable = torch::stable::new_zeros(q, {p.table_rows, p.heads}, ScalarType::Float);
    p.dtable = static_cast<float*>(dtable.mutable_data_ptr());
  }

  Workspace ws = workspace(q, winattn::bwd_workspace_bytes(p));
  winattn::bwd(p, ws.ptr, current_stream(q));
  if (bias_requires_grad && dbias.scalar_type() != dbias32.scalar_type()) torch::stable::copy_(dbias, dbias32);

  return {dq, dk, dv, dbias, dtable};
}

STABLE_TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? mask, Tensor? key_padding_mask, "
      "Tensor? rel_pos_table, Tensor? rel_pos_index, float scale, bool causal, int window_left, "
      "int window_right, bool deterministic) -> (Tensor out, Tensor lse)");
  ops.def(
      "bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? bias, Tensor? mask, "
      "Tensor? key_padding_mask, Tensor? rel_pos_table, Tensor? rel_pos_index, float scale, bool causal, "
      "int window_left, int window_right, bool bias_requires_grad, bool table_requires_grad, "
      "bool deterministic, Tensor? grad_lse=None) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor grad_bias, "
      "Tensor grad_rel_pos_table)");
}

#ifdef CUDA_KERNEL
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
#else
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, ops) {
#endif
  ops.impl("fwd", TORCH_BOX(&winattn_fwd));
  ops.impl("bwd", TORCH_BOX(&winattn_bwd));
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
