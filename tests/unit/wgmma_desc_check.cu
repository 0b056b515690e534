// Host check of tile_sm90.h's ways to the descriptor of a k-step (test_wgmma_descriptors.py): built whole from the
// step's address, or the tile's descriptor plus the step's offset (kFromBase, desc_plus), added to the low word or as
// one 64-bit add (kAdd64). They must be the same 64-bit value for every tile address a kernel can use (16-byte
// aligned, the step inside the 227 KB an SM gives one CTA) and every step of the tiles the kernels build (the three
// row widths, K-major and N-major, up to 256 rows / columns).
// Prints the count of comparisons and of mismatches (the first few in full); exit status 1 on any mismatch.
#include <cstdio>

#include "cuda/sm90/tile_sm90.h"

using winattn::cuda::sm90::kmajor_step_desc;
using winattn::cuda::sm90::nmajor_step_desc;

constexpr uint32_t kSmemLimit = 232448;  // 227 KB: the largest dynamic shared memory of one CTA (kernel_traits_sm90.h)

template <int W>
void check(long& n, long& bad) {
  const int kRows[] = {16, 64, 80, 96, 128, 176, 192, 256};
  for (uint32_t tile = 0; tile < kSmemLimit; tile += 16)
    for (int rows : kRows)
      for (int ks = 0; ks < 16; ++ks) {
        const uint32_t k_end = tile + (ks * 32 / W) * (rows * W) + ks * 32 % W + 32;  // past the step's last byte
        if (k_end <= kSmemLimit) {
          ++n;
          const uint64_t a = kmajor_step_desc<W, false>(tile, ks, rows), b = kmajor_step_desc<W, true>(tile, ks, rows),
                         c = kmajor_step_desc<W, true, true>(tile, ks, rows);
          if ((a != b || a != c) && bad++ < 5)
            std::printf("K-major W=%d tile=%u rows=%d ks=%d: %016llx vs %016llx vs %016llx\n", W, tile, rows, ks,
                        (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
        }
        if (tile + (ks + 1) * 16 * W <= kSmemLimit) {
          ++n;
          const uint64_t a = nmajor_step_desc<W, false>(tile, ks, rows), b = nmajor_step_desc<W, true>(tile, ks, rows),
                         c = nmajor_step_desc<W, true, true>(tile, ks, rows);
          if ((a != b || a != c) && bad++ < 5)
            std::printf("N-major W=%d tile=%u rows=%d ks=%d: %016llx vs %016llx vs %016llx\n", W, tile, rows, ks,
                        (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
        }
      }
}

int main() {
  long n = 0, bad = 0;
  check<128>(n, bad);
  check<64>(n, bad);
  check<32>(n, bad);
  std::printf("compared %ld, mismatched %ld\n", n, bad);
  return bad == 0 ? 0 : 1;
}
