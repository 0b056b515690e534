// Global <-> shared tile movement: cp.async row tiles with zero fill (rows past the sequence end and head-dim
// columns past the real head dim read as 0), and fragment stores of output tiles (the backward's store_acc_rows, the
// forward's O + lse epilogue write_out_rows).
#pragma once
#include "block_info.h"
#include "kernel_params.h"
#include "softmax.h"
#include "utils.h"

namespace winattn {
namespace cuda {

// Copy rows [0, ROWS) of a [rows_valid, d_valid] strided matrix (row stride in elements, contiguous columns) into a
// shared tile [ROWS][DK + 8]. `g` points at row 0; `g_safe` is any valid address (used for zero-filled chunks).
template <typename Elem, int ROWS, int DK, int NTHREADS>
__device__ __forceinline__ void load_rows_async(Elem* s, const Elem* g, int64_t row_stride, int rows_valid,
                                                int d_valid, const void* g_safe, int tid) {
  constexpr int kChunksPerRow = DK / 8;
  constexpr int kTotal = ROWS * kChunksPerRow;
#pragma unroll
  for (int it = 0; it < ceil_div(kTotal, NTHREADS); ++it) {
    const int idx = it * NTHREADS + tid;
    if (kTotal % NTHREADS == 0 || idx < kTotal) {
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
      const bool pred = r < rows_valid && c * 8 < d_valid;
      const void* src = pred ? static_cast<const void*>(g + r * row_stride + c * 8) : g_safe;
      cp_async16(s + r * (DK + 8) + c * 8, src, pred);
    }
  }
}

// Row-wise fp32 vector [rows_valid] -> shared [ROWS] (zero fill past the end), 4-byte cp.async.
template <int ROWS, int NTHREADS>
__device__ __forceinline__ void load_vec_async(float* s, const float* g, int rows_valid, int tid) {
#pragma unroll
  for (int it = 0; it < ceil_div(ROWS, NTHREADS); ++it) {
    const int r = it * NTHREADS + tid;
    if (ROWS % NTHREADS == 0 || r < ROWS) {
      const bool pred = r < rows_valid;
      cp_async4(s + r, pred ? g + r : g, pred);
    }
  }
}

// Forward rows [i0, i0 + rows) of head h that see no key at all (outside the causal / sliding band), for every
// item of the CTA: O = 0 and lse = -inf (the contract of fully masked rows).
template <typename Elem, int NTHREADS>
__device__ __forceinline__ void write_empty_rows(const KParams& p, const Work& w, int h, int i0, int rows, int tid) {
  Elem* o = static_cast<Elem*>(p.o);
  for (int t = 0; t < w.nitems; ++t) {
    const int b = w.batch(p, t);
    for (int idx = tid; idx < rows * p.D; idx += NTHREADS) {
      const int r = idx / p.D, d = idx % p.D;
      o[int64_t(b) * p.o_sb + int64_t(i0 + r) * p.o_ss + int64_t(h) * p.o_sh + d] = Elem(0.f);
    }
    for (int r = tid; r < rows; r += NTHREADS) p.lse[(int64_t(b) * p.H + h) * p.Sq + i0 + r] = -INFINITY;
  }
}

// Store an accumulator tile (rows r0.., cols 0..8*NT of the warp tile) scaled by `mul` to a strided global matrix,
// rows < rows_valid and columns < d_valid only. `g` points at the tile's row 0, column c0.
template <typename Elem, int MT, int NT>
__device__ __forceinline__ void store_acc_rows(Elem* g, int64_t row_stride, const float (&acc)[MT][NT][4], float mul,
                                               int rows_valid, int cols_valid, int lane) {
  const int qr = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + qr + hf * 8;
      if (r < rows_valid) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int c = nt * 8 + qc;
          if (c < cols_valid)
            *reinterpret_cast<uint32_t*>(g + r * row_stride + c) =
                ElemTraits<Elem>::pack(acc[mt][nt][2 * hf] * mul, acc[mt][nt][2 * hf + 1] * mul);
        }
      }
    }
}

// The forward epilogue that stores fragments straight to global memory (v1, v3; the window forward stages O through
// shared memory, decode merges warps there): the O accumulator's rows i0 + wr + 16 mt + qr + 8 hf (i0: the tile's
// first query row, wr: the warp's first row in it) of item b, head h, normalized by their RowFinal, to o (p.o),
// rows < Sq and columns < D only, and their lse from the quad's lane 0. qr = lane / 4, qc = (lane % 4) * 2: the
// thread's row and first column in each 16 x 8 tile. row_max / row_sum: the online softmax's state (row_sum per
// thread, reduced over the quad here). Empty and NaN rows: finalize_row (softmax.h). The shape is the one that left
// both kernels' PTX as it was: qr / qc, i0 + wr and o from the caller, p.D / p.Sq read in place (a row store built
// on store_acc_rows' inner loop, or D passed by value, reordered address adds and p.D loads).
template <typename Elem, int MT, int DT>
__device__ __forceinline__ void write_out_rows(Elem* o, const KParams& p, int b, int h, int i0, int wr,
                                               const float (&acc_o)[MT][DT][4], const float (&row_max)[MT][2],
                                               const float (&row_sum)[MT][2], int qr, int qc) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const RowFinal f = finalize_row(row_max[mt][hf], quad_sum(row_sum[mt][hf]));
      const float inv = f.scale();
      const int i = i0 + wr + mt * 16 + qr + hf * 8;
      if (i < p.Sq) {
        Elem* orow = o + int64_t(b) * p.o_sb + int64_t(i) * p.o_ss + int64_t(h) * p.o_sh;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int d = dt * 8 + qc;
          if (d < p.D)
            *reinterpret_cast<uint32_t*>(orow + d) =
                ElemTraits<Elem>::pack(acc_o[mt][dt][2 * hf] * inv, acc_o[mt][dt][2 * hf + 1] * inv);
        }
        if (qc == 0) p.lse[(int64_t(b) * p.H + h) * p.Sq + i] = f.lse();
      }
    }
}

}  // namespace cuda
}  // namespace winattn
