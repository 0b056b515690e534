// Which tiles a CTA touches: the causal / sliding-window band in tile units, and the CTA -> work decomposition.
// The band predicate is the single source of truth; the range helpers are closed forms corrected against it, so
// the forward (keys per query tile), the backward (queries per key tile) and the deterministic contributor ranks
// agree exactly.
#pragma once
#include "kernel_params.h"
#include "utils.h"

namespace winattn {
namespace cuda {

__host__ __device__ __forceinline__ bool tile_visible(const KParams& p, int m, int n, int BM, int BN) {
  if (!p.has_band) return true;
  const int64_t i0 = int64_t(m) * BM, i1 = int64_t(min((m + 1) * BM, p.Sq)) - 1;
  const int64_t j0 = int64_t(n) * BN, j1 = int64_t(min((n + 1) * BN, p.Sk)) - 1;
  return (j1 - i0 >= p.band_lo) && (j0 - i1 <= p.band_hi);
}

// Key blocks [lo, hi) visible from query block m.
__host__ __device__ __forceinline__ void n_block_range(const KParams& p, int m, int BM, int BN, int& lo, int& hi) {
  const int nblocks = ceil_div(p.Sk, BN);
  lo = 0;
  hi = nblocks;
  if (!p.has_band) return;
  const int64_t i0 = int64_t(m) * BM, i1 = int64_t(min((m + 1) * BM, p.Sq)) - 1;
  int64_t l = floor_div64(i0 + p.band_lo, BN), h = floor_div64(i1 + p.band_hi, BN) + 1;
  l = l < 0 ? 0 : l;
  h = h > nblocks ? nblocks : h;
  lo = int(l);
  hi = int(h);
  while (lo < hi && !tile_visible(p, m, lo, BM, BN)) ++lo;
  while (hi > lo && !tile_visible(p, m, hi - 1, BM, BN)) --hi;
}

// Query blocks [lo, hi) that see key block n.
__host__ __device__ __forceinline__ void m_block_range(const KParams& p, int n, int BM, int BN, int& lo, int& hi) {
  const int mblocks = ceil_div(p.Sq, BM);
  lo = 0;
  hi = mblocks;
  if (!p.has_band) return;
  const int64_t j0 = int64_t(n) * BN, j1 = int64_t(min((n + 1) * BN, p.Sk)) - 1;
  int64_t l = floor_div64(j0 - p.band_hi, BM), h = floor_div64(j1 - p.band_lo, BM) + 1;
  l = l < 0 ? 0 : l;
  h = h > mblocks ? mblocks : h;
  lo = int(l);
  hi = int(h);
  while (lo < hi && !tile_visible(p, lo, n, BM, BN)) ++lo;
  while (hi > lo && !tile_visible(p, hi - 1, n, BM, BN)) --hi;
}

// Does any element of tile (m, n) need the band / column-end check?
__device__ __forceinline__ bool tile_needs_mask(const KParams& p, int m, int n, int BM, int BN) {
  const int64_t j1_full = int64_t(n + 1) * BN - 1;
  if (j1_full >= p.Sk) return true;
  if (!p.has_band) return false;
  const int64_t i0 = int64_t(m) * BM, i1 = i0 + BM - 1, j0 = int64_t(n) * BN;
  // fully inside the band: every (i, j) has band_lo <= j - i <= band_hi
  return !((j0 - i1 >= p.band_lo) && (j1_full - i0 <= p.band_hi));
}

// CTA decomposition (see KParams): cta = ((blk * Hx + hx) * NR + rc), cta = blockIdx.x unless several CTAs share
// one work item (the split wide-window backward's clusters).
struct Work {
  int blk, hx, r, c, nitems;
  __device__ __forceinline__ int batch(const KParams& p, int t) const { return r + p.Pg * (c * p.G + t); }
};
__device__ __forceinline__ Work decode_work(const KParams& p, int Hx, int cta = blockIdx.x) {
  Work w;
  const int rc = cta % p.NR;
  const int rest = cta / p.NR;
  w.hx = rest % Hx;
  w.blk = rest / Hx;
  w.r = rc % p.Pg;
  w.c = rc / p.Pg;
  const int per_r = p.B / p.Pg;
  w.nitems = min(p.G, per_r - w.c * p.G);
  return w;
}

}  // namespace cuda
}  // namespace winattn
