// Shared-memory tiles in the layout the Hopper tensor cores read (wgmma), and the warpgroup MMA plumbing.
//
// Tile layout ("64-byte swizzle"): a [ROWS x DK] tile of 16-bit elements is stored as DK/32 column blocks of
// [ROWS x 32] (64 bytes per row, blocks ROWS * 64 bytes apart). Within a block, 8 consecutive rows form a
// 512-byte atom and the four 16-byte chunks of row r sit at chunk index c ^ ((r >> 1) & 3) (PTX "64B swizzle": bits
// [4,6) of the address XOR bits [7,9)), so the chunk columns a warp reads are spread over all banks.
// One physical layout serves every operand:
//   * Q and K as K-major operands of S = Q K^T (K dimension = head dim, contiguous): SBO = 512 (next 8 rows);
//   * V as the N-major operand of O += P V (N = head dim contiguous, K = keys): SBO = 512 (next 8 keys),
//     LBO = ROWS * 64 (next 32-column block).
// Column blocks of 32 keep every head dim that is a multiple of 32 in one layout (the backward's, and the forward's
// where 64 does not divide the head dim; the forward's 128-byte rows below).
// Tiles are 1024-byte aligned (the swizzle is a function of address bits).
// Forward v3's instance for head dim 48 (33-48, which the 32-column blocks pad to 64: SD 1.5's 40) uses column
// blocks of 16 instead: 32-byte rows, the PTX "32B swizzle" (bit 4 of the address XOR bit 7, atoms of 8 rows = 256
// bytes), the same descriptors with SBO = 256 and, for V, LBO = ROWS * 32 (FwdPipeShapeSm90::kRowBytes,
// make_rows_map's box_cols). Its instance at 80 keeps 96's three 32-column blocks and runs its GEMMs over 80
// columns only (FwdPipeShapeSm90::kTileCols): an N-major operand may end inside a block.
// Forward v3 at head dims that are multiples of 64 uses column blocks of 64: 128-byte rows, the PTX "128B swizzle"
// (bits [4,7) XOR bits [7,10), atoms of 8 rows = 1024 bytes), SBO = 1024 and, for V, LBO = ROWS * 128: FA3 / FA4's
// layout, half the TMA boxes of the 32-column blocks and whole 128-byte lines from L2 (dense S = 16k forward
// -2 to -3% at 64 / 128 / 256, Flux -2%, no row slower: H100 kernel time, RESULTS v5.2). The step descriptors below
// take any of the three.
#pragma once
#include "../utils.h"

namespace winattn {
namespace cuda {
namespace sm90 {

constexpr int kSwizzleRowBytes = 64;

// The dynamic shared memory base rounded up to 1024 bytes (the kernels request 1 KB of slack for it).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}

// Byte offset of the 16-byte chunk c (head-dim columns 8c .. 8c + 7) of row r in a ROWS-row tile.
template <int ROWS>
__device__ __forceinline__ int tile_chunk_offset(int r, int c) {
  return (c >> 2) * (ROWS * kSwizzleRowBytes) + r * kSwizzleRowBytes + (((c & 3) ^ ((r >> 1) & 3)) << 4);
}

// Matrix descriptor (PTX "matrix-descriptor-format"): start address, leading / stride byte offsets (16-byte units),
// layout type 1 = 128-byte swizzle, 2 = 64-byte swizzle, 3 = 32-byte swizzle (swizzle_of(row bytes)).
__host__ __device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes,
                                                       uint32_t sbo_bytes, uint32_t layout_type = 2) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t(layout_type) << 62;
  return d;
}
// The descriptor of the address `off` bytes (a multiple of 16) past d's: the start address field is the low 14 bits
// (address / 16) and a shared-window address stays below 2^18 (228 KB), so adding off / 16 never carries into the
// leading byte offset above it. Two forms of the same value:
//   * kAdd64: one 64-bit add, which ptxas makes one UIADD3.64 into the wgmma's descriptor registers. The backward's
//     (bwd_pipelined_sm90.h bwd_consume): its D = 128 step loop 992 -> 923 SASS instructions; H100 backward kernel
//     time against the element loop alone (RESULTS v5.5): Llama-3 document mask -3.6%, causal -2.7%, sliding window
//     -1.4%, the dense and joint rows within the spread (-0.3% to +2.3%);
//   * otherwise the low word alone, which ptxas makes a UIADD3 plus a UMOV of the constant high word per descriptor
//     (4 instructions per HGMMA instead of 2) but one uniform register per tile base instead of two. The forward keeps
//     it (its loop differs by 5 instructions in 1464 and was not measured apart) and so does the one backward
//     instance that spilled with the 64-bit form.
template <bool kAdd64>
__host__ __device__ __forceinline__ uint64_t desc_plus(uint64_t d, uint32_t off) {
  if constexpr (kAdd64) return d + (off >> 4);
  return (d & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(d) + (off >> 4));
}
// The descriptor layout type of a tile with `row_bytes`-byte rows (128, 64, 32: the swizzle of that many bytes).
constexpr uint32_t swizzle_of(int row_bytes) { return row_bytes == 128 ? 1u : row_bytes == 64 ? 2u : 3u; }

// The descriptors of k16 step ks over a [rows x D] tile of column blocks with kRowBytes-byte rows.
// K-major (D is the GEMM's K: Q and K in S = Q K^T; the backward's K, V, Q, dO in S^T and dP^T): each row's 32 bytes
// at columns 16 ks .. 16 ks + 15, half a 64-byte block or a whole 32-byte one; SBO = the next 8 rows.
// N-major (D is the GEMM's N, the tile's rows its K: V in O += P V; the backward's dO, Q, K in dV, dK, dQ): rows
// 16 ks on; LBO = the next column block (rows further), SBO = the next 8 rows.
// kFromBase: the tile's descriptor plus the step's offset (desc_plus), so the k-steps share one descriptor and each
// adds an immediate; with a warp-uniform tile address (pipeline_sm90.h warpgroup_index) ptxas keeps them in uniform
// registers. Otherwise each step's descriptor is built whole (mask, shift, or) in each thread's registers and moved
// by 4 R2UR before its wgmma: ~20% of the backward step's instructions at head dims 64 / 128. Taken where it was
// measured faster (bwd_pipelined_sm90.h bwd_uniform_desc); the D = 128 backward was slower with it and the forward
// mixed (RESULTS "Twenty-fourth session"). kAdd64: desc_plus's form.
template <int kRowBytes, bool kFromBase, bool kAdd64 = false>
__host__ __device__ __forceinline__ uint64_t step_desc(uint32_t tile, uint32_t off, uint32_t lbo_bytes) {
  if constexpr (kFromBase)
    return desc_plus<kAdd64>(make_desc(tile, lbo_bytes, 8 * kRowBytes, swizzle_of(kRowBytes)), off);
  return make_desc(tile + off, lbo_bytes, 8 * kRowBytes, swizzle_of(kRowBytes));
}
template <int kRowBytes, bool kFromBase = false, bool kAdd64 = false>
__host__ __device__ __forceinline__ uint64_t kmajor_step_desc(uint32_t tile, int ks, int rows) {
  return step_desc<kRowBytes, kFromBase, kAdd64>(tile, (ks * 32 / kRowBytes) * (rows * kRowBytes) + ks * 32 % kRowBytes,
                                                 16);
}
template <int kRowBytes, bool kFromBase = false, bool kAdd64 = false>
__host__ __device__ __forceinline__ uint64_t nmajor_step_desc(uint32_t tile, int ks, int rows) {
  return step_desc<kRowBytes, kFromBase, kAdd64>(tile, ks * 16 * kRowBytes, rows * kRowBytes);
}

// Copy rows [0, ROWS) of a [rows_valid, d_valid] strided matrix into a swizzled tile, zero-filling rows past
// rows_valid and columns past d_valid (cp.async, 16-byte chunks; the caller commits and waits).
template <typename Elem, int ROWS, int DK, int NTHREADS>
__device__ __forceinline__ void load_tile_async(unsigned char* s, const Elem* g, int64_t row_stride, int rows_valid,
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
      cp_async16(s + tile_chunk_offset<ROWS>(r, c), src, pred);
    }
  }
}

// Shared-memory accesses by 32-bit shared-window address (smem_u32): the kernels address their tiles from one
// aligned base, which the compiler no longer knows to be shared memory, and generic loads of it wait on the long
// scoreboard (ncu: the backward's top stall before these).
__device__ __forceinline__ float2 lds_f32x2(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ float lds_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds_u32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint16_t lds_u16(uint32_t a) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts_f32(uint32_t a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ float4 lds_f32x4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts_f32x4(uint32_t a, const float (&v)[4]) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
               : "memory");
}
// Four 8 x 8 16-bit blocks in the mma fragment layout (lane 8 k + c: address of row c of block k).
__device__ __forceinline__ void stmatrix_x4(uint32_t a, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// The same, stored transposed.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t a, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void sts_u32(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}

// Shared memory written through the generic proxy (cp.async, st.shared) becomes visible to wgmma (async proxy)
// after this fence in the writing threads, followed by a barrier.
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across the asynchronous MMA (issue .. wait).
template <int NT>
__device__ __forceinline__ void fence_acc(float (&d)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}

// The same for A fragments read from registers by an asynchronous MMA (P in O += P V): kept alive until the wait.
template <int NT>
__device__ __forceinline__ void fence_frag(uint32_t (&f)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(f[i][e])::"memory");
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
