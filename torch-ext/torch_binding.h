// Op implementations registered by torch_binding.cpp. Each variant is compiled for one backend
// (CPU_KERNEL or CUDA_KERNEL, set by the builder) and registers its kernels for that dispatch key only.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <tuple>

using torch::stable::Tensor;

// Forward. Returns (out [B, Sq, H, D] in q's dtype, lse [B, H, Sq] float32).
// `deterministic` is not used by the forward; it is recorded so the autograd formula can pass it to bwd.
std::tuple<Tensor, Tensor> winattn_fwd(
    Tensor q, Tensor k, Tensor v, std::optional<Tensor> bias, std::optional<Tensor> mask,
    std::optional<Tensor> key_padding_mask, std::optional<Tensor> rel_pos_table,
    std::optional<Tensor> rel_pos_index, double scale, bool causal, int64_t window_left,
    int64_t window_right, bool deterministic);

// Backward. Returns (dq, dk, dv, dbias, dtable); dbias/dtable are empty tensors when not requested, else
// tensors shaped like bias (4-D, as passed; in the bias's dtype) and rel_pos_table (float32: the Python layer casts
// it back).
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> winattn_bwd(
    Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, std::optional<Tensor> bias,
    std::optional<Tensor> mask, std::optional<Tensor> key_padding_mask, std::optional<Tensor> rel_pos_table,
    std::optional<Tensor> rel_pos_index, double scale, bool causal, int64_t window_left,
    int64_t window_right, bool bias_requires_grad, bool table_requires_grad, bool deterministic,
    std::optional<Tensor> grad_lse);
