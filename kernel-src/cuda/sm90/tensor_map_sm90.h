// Host side of the TMA loads: tensor maps (CUtensorMap) for the [B, S, H, D] operands of the pipelined kernels.
//
// The driver's cuTensorMapEncodeTiled is reached through the runtime's entry-point query, so the extension does not
// link libcuda (torch's CUDA runtime already loaded it). A map encodes a 4-D view {D, S, H, B} (innermost first)
// with the operand's own strides, a box of {32 columns, rows} and the 64-byte swizzle, which writes a box as one
// [rows x 32] column block of the tile layout in tile_sm90.h. Columns past D and rows past S read as zero.
#pragma once
#include <algorithm>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace winattn {
namespace cuda {
namespace sm90 {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &status);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &status);
#endif
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw std::runtime_error("window_attention (cuda): the driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// A 4-D map of 16-bit (or `type`) elements (dims and byte strides innermost first), boxes of
// {box_cols, box_rows, 1, 1}; `what` names the operand in the error.
inline CUtensorMap encode_4d(const void* base, const cuuint64_t (&dims)[4], const cuuint64_t (&strides)[3],
                             int box_cols, int box_rows, CUtensorMapSwizzle swizzle, const std::string& what,
                             CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT16) {
  CUtensorMap map;
  const cuuint32_t box[4] = {cuuint32_t(box_cols), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled_fn()(&map, type, 4, const_cast<void*>(base), dims,
                                       strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("window_attention (cuda): cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) +
                             ") for " + what);
  return map;
}

// Map of a 16-bit [B, S, H, D] operand (strides in elements, each a multiple of 8: checked by the planner) read in
// boxes of box_cols columns x box_rows rows: 64 columns with the 128-byte swizzle (forward v3 at head dims that are
// multiples of 64), 32 with the 64-byte swizzle, or 16 with the 32-byte one (tile_sm90.h: forward v3's 48 and 80).
inline CUtensorMap make_rows_map(const void* base, int B, int S, int H, int D, int64_t s_b, int64_t s_s, int64_t s_h,
                                 int box_rows, int box_cols = 32) {
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(S), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t strides[3] = {cuuint64_t(s_s) * 2, cuuint64_t(s_h) * 2, cuuint64_t(s_b) * 2};  // bytes
  return encode_4d(base, dims, strides, box_cols, box_rows,
                   box_cols == 64   ? CU_TENSOR_MAP_SWIZZLE_128B
                   : box_cols == 32 ? CU_TENSOR_MAP_SWIZZLE_64B
                                    : CU_TENSOR_MAP_SWIZZLE_32B,
                   "a [" + std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(H) + ", " +
                       std::to_string(D) + "] operand");
}

// make_rows_map through a small per-thread cache: encoding a map costs the host a few microseconds (the window
// forward encodes three per call, against a W7 issue budget of 50 us), and a model calls its attention with the
// same (pointer, shape, strides) layer after layer. A map is a pure function of these arguments, so a hit is exact.
inline CUtensorMap cached_rows_map(const void* base, int B, int S, int H, int D, int64_t s_b, int64_t s_s, int64_t s_h,
                                   int box_rows, int box_cols = 32) {
  struct Entry {
    const void* base = nullptr;
    int64_t key[9] = {};
    CUtensorMap map;
  };
  constexpr int kEntries = 8;
  thread_local Entry cache[kEntries];
  thread_local int next = 0;
  const int64_t key[9] = {B, S, H, D, s_b, s_s, s_h, box_rows, box_cols};
  for (Entry& e : cache)
    if (e.base == base && std::equal(key, key + 9, e.key)) return e.map;
  Entry& e = cache[next];
  next = (next + 1) % kEntries;
  e.map = make_rows_map(base, B, S, H, D, s_b, s_s, s_h, box_rows, box_cols);  // (throws before the entry is filled)
  e.base = base;
  std::copy(key, key + 9, e.key);
  return e.map;
}

// Map of the additive term [period, heads, rows = Sq, cols = Sk] (16-bit, contiguous columns) read in boxes of
// 64 columns x box_rows rows with the 128-byte swizzle (bias_pair_smem in score_terms_sm90.h reads it back).
// Broadcast dims (period or heads 1) stay size-1 dims of the map: the kernel passes coordinate 0 for them, so no
// [B, H, Sq, Sk] tensor is ever formed. strides: elements; a size-1 dim's stride is ignored.
inline CUtensorMap make_bias_map(const void* base, int period, int heads, int rows, int cols, int64_t s_b,
                                 int64_t s_h, int64_t s_q, int box_rows) {
  const int64_t plane = s_q * rows;  // a valid stand-in stride for size-1 dims
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(period)};
  const cuuint64_t strides[3] = {cuuint64_t(s_q) * 2, cuuint64_t(heads > 1 ? s_h : plane) * 2,
                                 cuuint64_t(period > 1 ? s_b : plane * heads) * 2};
  return encode_4d(base, dims, strides, 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B, "the additive term");
}

// Map of a bool mask's bits [period][heads][rows][words] uint32 (KParams::mbits; words a multiple of 4: whole 16-byte
// rows) read in boxes of [box_rows rows][words], unswizzled; rows past the end read as 0.
inline CUtensorMap make_mask_bits_map(const uint32_t* base, int period, int heads, int rows, int words, int box_rows) {
  const cuuint64_t dims[4] = {cuuint64_t(words), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(period)};
  const cuuint64_t row = cuuint64_t(words) * 4, plane = row * rows;
  const cuuint64_t strides[3] = {row, plane, plane * heads};
  return encode_4d(base, dims, strides, words, box_rows, CU_TENSOR_MAP_SWIZZLE_NONE, "the mask bits",
                   CU_TENSOR_MAP_DATA_TYPE_UINT32);
}

// Map of the fp32 dbias [period, heads, rows, cols] (rows of `pitch` elements, a multiple of 4: TMA strides are whole
// 16-byte units; columns past `cols` are never written) written in boxes of 32 columns x box_rows rows with the 128-byte swizzle (dbias_stage_offset in
// bwd_pipelined_sm90.h writes the staging tile in that order).
inline CUtensorMap make_dbias_map(float* base, int period, int heads, int rows, int cols, int pitch, int box_rows) {
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(period)};
  const cuuint64_t row = cuuint64_t(pitch) * 4, plane = row * rows;
  const cuuint64_t strides[3] = {row, plane, plane * heads};
  return encode_4d(base, dims, strides, 32, box_rows, CU_TENSOR_MAP_SWIZZLE_128B, "the bias gradient",
                   CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
