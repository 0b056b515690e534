// Tile shapes of the Hopper (sm_90a) kernels. Host code (the planner) includes this without the kernels.
#pragma once
#include "../kernel_modes.h"
#include "../kernel_params.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// Pipelined forward v3 (fwd_pipelined_sm90.h): a producer warpgroup and kConsumerWGs consumer warpgroups of 64 query
// rows each (kBlockM = 64 kConsumerWGs), Q resident, K / V in kStages-deep TMA stages. Shared memory: Q + 2 x kStages
// key blocks + 1 KB of mbarriers (+ the bias stages, sized at launch).
// Registers: a CTA starts with kLaunchRegs per thread (65536 / (kNThreads kMinBlocks), down to a multiple of 8) and
// setmaxnreg moves the producer's spare ones to the consumers, which must not ask for more than the CTA holds
// (setmaxnreg.inc would wait forever): two consumer warpgroups, one CTA per SM: 24 / 240 (FA3's); two CTAs: 104;
// three consumer warpgroups: 24 / 160 (FA3 / FA4 give their producer 32 of the same 160).
// kStream: the consumers run one loop over the CTA's key blocks, pipelined across tile boundaries too
// (consume_stream), which needs the next tile's Q in a second slot (kQSlots).
// kMinBlocks: CTAs per SM (launch bounds).
// The tiles are named by two types with this one shape: FwdPipeTraitsSm90 (two consumer warpgroups, every tile but
// one) and FwdPipeRows192TraitsSm90 (three), so that the kernels' names stay what the tests and the benchmark
// records match.
template <int kHeadDim_, int kBlockN_, int kStages_, bool kStream_, int kMinBlocks_, int kConsumerWGs_>
struct FwdPipeShapeSm90 {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kStages = kStages_, kMinBlocks = kMinBlocks_;
  static constexpr bool kStream = kStream_;
  static constexpr int kConsumerWGs = kConsumerWGs_, kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kConsumerThreads = 128 * kConsumerWGs, kNThreads = 128 + kConsumerThreads;
  static constexpr int kBlockM = 64 * kConsumerWGs, kQSlots = kStream ? 2 : 1;
  static constexpr int kProducerRegs = 24, kLaunchRegs = 65536 / (kNThreads * kMinBlocks) / 8 * 8;
  static constexpr int kConsumerRegs = (kNThreads * kLaunchRegs - 128 * kProducerRegs) / kConsumerThreads / 8 * 8;
  static_assert(kMinBlocks > 1 || kConsumerRegs == (kConsumerWGs == 2 ? 240 : 160),
                "one CTA per SM: FA3's 24 / 240 (two consumer warpgroups) or 160 (three)");
  static_assert(!kStream || kConsumerWGs == 2, "consume_stream's turns are two warpgroups'");
  static constexpr int kNT = kBlockN / 8, kDT = kHeadDim / 8;
  // Intra-warpgroup overlap (consume): the next block's Q K^T in flight beside this one's P V, so S and P live at
  // once. The two-CTA tile's 104 consumer registers cannot hold both beside O: ptxas serialized its 16 wgmma around
  // a 48-byte spill (SASS, RESULTS v4.2), so that tile issues P V, then Q K^T, one after the other.
  static constexpr bool kOverlapQkPv = kMinBlocks == 1;
  // P through shared memory (O += P V with A from a [64 x kBlockN] tile per consumer warpgroup, written by stmatrix)
  // where S (64) + P (32) + O (48 at head dim 96) and the rest pass the 192-row tile's 160 registers: FA3 / FA4's
  // choice there (FA4's notes: P from registers at 192 rows and head dim 96 "catastrophic", ~300 vs ~600 TFLOPS on
  // the H100). P dies into shared memory before the next Q K^T writes S, so the overlap stays.
  static constexpr bool kPInSmem = kConsumerWGs == 3 && kHeadDim > 64;
  // The first key block a tile visits (its last visible one) computed over the 16-key steps that reach the sequence
  // end only (FwdPipeRaggedTraitsSm90)
  static constexpr bool kRaggedFirst = false;
  static constexpr int kPBytes = kPInSmem ? kBlockM * kBlockN * 2 : 0;
  // column blocks (tile_sm90.h): 64 columns (128-byte rows, the 128-byte swizzle: FA3 / FA4's, half the TMA boxes
  // and whole 128-byte lines from L2) for head dims that are multiples of 64; 32 (64-byte rows, the 64-byte swizzle)
  // for the others, but 16 (32-byte rows, the 32-byte swizzle) for the instance at 48: 64's tiles with its GEMMs over
  // 48 columns measured slower there (SD 1.5's 40 at 4096 tokens 0.531 -> 0.561 ms, RESULTS v5.7).
  // kTileCols: the columns a tile holds, kHeadDim rounded up to whole column blocks (96 for the instance at 80, whose
  // last block is half used, zero-filled by TMA past D). Its GEMMs run over kHeadDim only: Q K^T in 5 k16 steps, not
  // 6, and P V with N = 80, not 96 (wgmma reads V's third 32-column block up to column 80; the GPU suite checks it).
  // What that gained: kernel_choice.h v3_head_dim. (The 80 instance on 16-column blocks was no faster than 96, v4.3.)
  static constexpr int kRowBytes = kHeadDim % 64 == 0 ? 128 : kHeadDim == 48 ? 32 : 64;
  static constexpr int kBlockCols = kRowBytes / 2;
  static constexpr int kTileCols = (kHeadDim + kBlockCols - 1) / kBlockCols * kBlockCols;
  static constexpr int kQBytes = kBlockM * kTileCols * 2, kKVBytes = kBlockN * kTileCols * 2;
  static constexpr int kOBytes = kQBytes;  // the output tile (a Q slot's shape), where it goes through shared memory
  // Q slots | K stages | V stages | P tiles, then (from a 1024-byte boundary: the staged bias tile's 128-byte
  // swizzle) the mbarriers' kilobyte
  static constexpr int kTilesBytes = (kQSlots * kQBytes + 2 * kStages * kKVBytes + kPBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = 1024 + kTilesBytes + 1024;  // slack, .., mbarriers
  static_assert(kHeadDim % 16 == 0 && kBlockN % 16 == 0 && kBlockN <= 256, "k16 steps");
  // every tile and column block starts on a swizzle atom (8 rows: 1024 bytes at the 128-byte swizzle, 512 at the
  // 64-byte one, 256 at the 32-byte one); the 64-byte tiles keep the 1024-byte stages they were measured with
  static_assert(kKVBytes % (kRowBytes >= 64 ? 1024 : 256) == 0 && kQBytes % 1024 == 0, "swizzle atoms stay aligned");
};
template <int kHeadDim_, int kBlockN_, int kStages_, bool kStream_ = false, int kMinBlocks_ = 1>
struct FwdPipeTraitsSm90 : FwdPipeShapeSm90<kHeadDim_, kBlockN_, kStages_, kStream_, kMinBlocks_, 2> {};
template <int kHeadDim_, int kBlockN_, int kStages_>
struct FwdPipeRows192TraitsSm90 : FwdPipeShapeSm90<kHeadDim_, kBlockN_, kStages_, false, 1, 3> {};
template <int kHeadDim_, int kBlockN_, int kStages_, int kMinBlocks_>
struct FwdPipeRaggedTraitsSm90 : FwdPipeShapeSm90<kHeadDim_, kBlockN_, kStages_, false, kMinBlocks_, 2> {
  static constexpr bool kRaggedFirst = true;
};
// Shared memory of a forward v3 CTA past Tr::kSmemBytes (PipeSmem, fwd_pipelined_sm90.h): from the end of the
// mbarriers' kilobyte, kStages term slots of term_bytes each (the staged 16-bit tile, whose size the launch picks; or
// the row slots of the stages_row modes), then, from the next 1024-byte boundary, the output tile where the
// epilogue stages it (fwd_v3_o_via_smem). The launcher sizes its launch with fwd_v3_smem and the planner its choice
// of staging, so the two agree.
constexpr int kSm90SmemPerSm = 233472;  // 228 KB per SM, of which each resident CTA's 1 KB is reserved
constexpr int round_up_1024(int bytes) { return (bytes + 1023) / 1024 * 1024; }
// The largest term slot mode kMode stages (the planner stages kBlockM x kBlockN 16-bit tiles; a row slot is
// kBlockN fp32 values and at most 64 bytes of padding bits: PipeSmem::row_bytes, checked there).
template <typename Tr>
constexpr int fwd_v3_term_slot_bound(int mode) {
  return mode == kTermsRawBias || mode == kTermsRawBiasMasked || mode == kTermsRawBiasPadded
             ? Tr::kBlockM * Tr::kBlockN * 2
         : stages_row(mode) ? Tr::kBlockN * 4 + 64
                            : 0;
}
// The epilogue writes O through shared memory and one TMA store per warp and 32-column block (fwd_epilogue_sm90.h)
// where the output tile fits beside everything else at the tile's CTAs per SM with the largest term it stages, at
// head dims that are multiples of 32 (the 64- or 128-byte-swizzled column blocks); elsewhere (head dims 192 and 256,
// the wide 176-key tile at 128, the staged tile at 128, the 16-column instance at 48) each thread stores its
// fragment. At 80 the last 32-column block is half written; the map clips the columns past D.
template <typename Tr>
constexpr bool fwd_v3_o_via_smem(int mode) {
  return Tr::kRowBytes >= 64 &&
         Tr::kSmemBytes + round_up_1024(Tr::kStages * fwd_v3_term_slot_bound<Tr>(mode)) + Tr::kOBytes <=
             kSm90SmemPerSm / Tr::kMinBlocks - 1024;
}
template <typename Tr>
constexpr int fwd_v3_smem(int mode, int term_bytes) {
  return Tr::kSmemBytes + (fwd_v3_o_via_smem<Tr>(mode) ? round_up_1024(Tr::kStages * term_bytes) + Tr::kOBytes
                                                        : Tr::kStages * term_bytes);
}

// Tiles per head dim (FA3's choices, hopper/tile_size.h, one size down where our terms need room): `narrow` for the
// staged additive tile (whole 64-column boxes, kStages tiles of it next to Q / K / V) and the general path,
// `wide` for the raw path (no term, key padding, causal / sliding window): fewer, longer key blocks.
template <int D> struct FwdPipeTraitsSm90For {
  using narrow = FwdPipeTraitsSm90<D, 128, 2>;
  using wide = narrow;
};
template <> struct FwdPipeTraitsSm90For<32> {
  using narrow = FwdPipeTraitsSm90<32, 128, 4>;
  using wide = narrow;
};
template <> struct FwdPipeTraitsSm90For<64> {
  using narrow = FwdPipeTraitsSm90<64, 128, 3>;
  using wide = FwdPipeTraitsSm90<64, 192, 3>;
};
// The instances at 48 (16-column blocks, 64's tiles) and 80 (96's tiles, kTileCols): the table's for 33-48 and 65-80
// (kernel_choice.h v3_head_dim).
template <> struct FwdPipeTraitsSm90For<48> {
  using narrow = FwdPipeTraitsSm90<48, 128, 3>;
  using wide = FwdPipeTraitsSm90<48, 192, 3>;
};
template <> struct FwdPipeTraitsSm90For<128> {
  using narrow = FwdPipeTraitsSm90<128, 128, 2>;
  using wide = FwdPipeTraitsSm90<128, 176, 2>;
};
template <> struct FwdPipeTraitsSm90For<160> {
  using narrow = FwdPipeTraitsSm90<160, 96, 2>;
  using wide = narrow;
};
template <> struct FwdPipeTraitsSm90For<192> {
  using narrow = FwdPipeTraitsSm90<192, 96, 2>;
  using wide = narrow;
};
// D = 256: 64-key blocks only (staged terms need whole 64-key boxes, mask bits whole 32-key words). FA3 / FA4's
// 80-key tile was built as the raw path's wide tile and deleted: 40 bytes of spills at 240 registers, slower with O
// rescaled before or after Q K^T (H200 kernel time, D = 256 S = 16k forward: 6.97 vs 7.07 ms, RESULTS v4.3; 7.257
// vs 7.458, "Twenty-first session").
template <> struct FwdPipeTraitsSm90For<256> {
  using narrow = FwdPipeTraitsSm90<256, 64, 2>;
  using wide = narrow;
};

// Head dims whose staged-tile kernel takes key padding staged as bits beside the tile (kTermsRawBiasPadded): its row
// warp takes 8 registers from the consumers (40 / 232), which spill 20 bytes at D = 128 (ptxas); past 64 the
// padding stays a per-block vote (kTermsRawBias).
constexpr bool fwd_v3_stages_padding(int D) { return D <= 64; }
// Head dims whose two-CTA tile also takes the staged 16-bit term (kTermsRawBias alone: BEiT / T5-shaped bias
// [1, H, S, S] over a large batch at 197-512 tokens; the table's where two_ctas_pay holds): one 64-column box per key block,
// two stages, 82 KB of shared memory per CTA.
constexpr bool fwd_v3_two_ctas_stage_term(int D) { return D == 64; }

// The two-CTA tile (the raw path, D = 48 / 64; 96 forced only: no faster, RESULTS "Twenty-first session"): 64-key blocks in 104 consumer registers, so that two
// CTAs share an SM (short sequences: one CTA of the narrow tile leaves 2.2 warps per scheduler and stalls on its
// wgmma / barrier chain, ncu of ViT-B/16, RESULTS v3.9). A head dim without one names its narrow tile (no instance of
// its own).
template <int D> struct FwdPipeTwoCtasTileSm90 {
  using type = typename FwdPipeTraitsSm90For<D>::narrow;
};
template <> struct FwdPipeTwoCtasTileSm90<64> {
  using type = FwdPipeTraitsSm90<64, 64, 2, false, 2>;
};
template <> struct FwdPipeTwoCtasTileSm90<48> {
  using type = FwdPipeTraitsSm90<48, 64, 2, false, 2>;
};
// Head dims 65-96 (DiT's and PixArt's 72 at 256-1024 tokens, ViT's shape at a wider head; forced only: DiT-XL/2-256
// 0.107 -> 0.105 ms, slower on longer rows): 32-key blocks, so that O (48 registers) and S fit beside each other in 104: 0 spills, 16 wgmma on 4
// waits (ptxas, sass_check.py). 64-key blocks spilled and serialized at 96 (572 bytes) and at 80 (32 bytes, on
// 16-column blocks).
template <> struct FwdPipeTwoCtasTileSm90<96> {
  using type = FwdPipeTraitsSm90<96, 32, 2, false, 2>;
};
template <> struct FwdPipeTwoCtasTileSm90<80> {  // (65-80: the same tile on the instance at 80, forced only too)
  using type = FwdPipeTraitsSm90<80, 32, 2, false, 2>;
};
// The two-CTA tile with a ragged last key block (head dim 64, fwd_v3_ragged; the table's where it takes the two-CTA
// tile on keys ending inside a block, without key padding): a short
// sequence ends inside its last 64-key block (ViT's 197 keys: 5 of 64; EVA-02's 257 and CLIP-L/336's 577: 1), which
// the tile visits first; its Q K^T, score terms and softmax cover the 16-key steps up to the sequence end only
// (wgmma N = 16 / 32 / 48), its P past them is zero. ViT-B/16: a quarter of a tile's Q K^T and softmax work is that
// block. A head dim without one names its narrow tile (no instance of its own).
template <int D> struct FwdPipeRaggedTileSm90 {
  using type = typename FwdPipeTraitsSm90For<D>::narrow;
};
template <> struct FwdPipeRaggedTileSm90<64> {
  using type = FwdPipeRaggedTraitsSm90<64, 64, 2, 2>;
};

// The 192-row tile (the raw path, head dims 33-96; the table's for long calls: kernel_choice.h rows192_pays): three consumer warpgroups taking turns round robin, as FA3 and FA4 do at head dims <= 64 (192 x 128,
// P from registers, 160 registers: S 64 + P 32 + O 32 of them). At D = 64 the softmax (exp2 on the MUFU unit) takes
// about half as long as the tile's GEMMs; with three warpgroups two softmaxes run while the third one's GEMMs do
// (docs/hopper-forward-vs-fa3-fa4.md, suggestion 1: D = 64, S = 16k forward 0.82x FA4). Three stages: the slowest
// warpgroup holds a stage up to two turns after the first took it (124 KB of shared memory, one CTA per SM either way).
// A head dim without one names its narrow tile (no instance of its own).
template <int D> struct FwdPipeRows192TileSm90 {
  using type = typename FwdPipeTraitsSm90For<D>::narrow;
};
template <> struct FwdPipeRows192TileSm90<64> {
  using type = FwdPipeRows192TraitsSm90<64, 128, 3>;
};
// Head dims 33-48 (SD 1.5's 40 at 4096 tokens): the same tile on 16-column blocks, where
// the softmax weighs more against the smaller GEMMs than at 64 (92 KB of shared memory).
template <> struct FwdPipeRows192TileSm90<48> {
  using type = FwdPipeRows192TraitsSm90<48, 128, 3>;
};
// Head dims 65-96 (DiT's and PixArt's 72 at 1024-4096 tokens): the same tile with P
// through shared memory (kPInSmem above) and two stages, as FA3 / FA4 (their 192 x 144 / 128): Q 36 KB, K / V 96,
// P 48: 182 KB of shared memory. The instance at 80 has the same tiles (kTileCols) and smaller GEMMs.
template <> struct FwdPipeRows192TileSm90<96> {
  using type = FwdPipeRows192TraitsSm90<96, 128, 2>;
};
template <> struct FwdPipeRows192TileSm90<80> {
  using type = FwdPipeRows192TraitsSm90<80, 128, 2>;
};

// Streamed tiles (kStream: consume_stream pipelines across tile boundaries). `keys80` / `keys128` / `keys208`: one
// key block sized to a short key set (v3.6's ncu: ViT-B/16's S = 197 in 128 x 128 tiles is 59% useful work, Sk = 77
// in a 128-key block 60%): Sk <= 80 (CLIP's 77 text tokens), <= 128 (PixArt's 120 T5 tokens), <= 208 (ViT's 197).
// `any`: 128-key blocks for any key set (DiT, SD 1.5 self-attention: tiles of a few key blocks). Two stages (a tile
// of one key block only has the next tile's to prefetch). A head dim without a tile names its narrow tile (no
// instance of its own). D = 80 / 96 (DiT's and PixArt's 72, SD 1.5's 80 on the 80 one) have no 208: no model of
// the shape matrix has 129-208 keys at those head dims.
template <int D> struct FwdPipeStreamTilesSm90 {
  using keys80 = typename FwdPipeTraitsSm90For<D>::narrow;
  using keys128 = keys80;
  using keys208 = keys80;
  using any = keys80;
};
template <> struct FwdPipeStreamTilesSm90<64> {
  using keys80 = FwdPipeTraitsSm90<64, 80, 2, true>;
  using keys128 = FwdPipeTraitsSm90<64, 128, 2, true>;
  using keys208 = FwdPipeTraitsSm90<64, 208, 2, true>;
  using any = keys128;
};
template <> struct FwdPipeStreamTilesSm90<48> {
  using keys80 = FwdPipeTraitsSm90<48, 80, 2, true>;
  using keys128 = FwdPipeTraitsSm90<48, 128, 2, true>;
  using keys208 = FwdPipeTraitsSm90<48, 208, 2, true>;
  using any = keys128;
};
template <> struct FwdPipeStreamTilesSm90<80> {
  using keys80 = FwdPipeTraitsSm90<80, 80, 2, true>;
  using keys128 = FwdPipeTraitsSm90<80, 128, 2, true>;
  using keys208 = FwdPipeTraitsSm90For<80>::narrow;
  using any = keys128;
};
template <> struct FwdPipeStreamTilesSm90<96> {
  using keys80 = FwdPipeTraitsSm90<96, 80, 2, true>;
  using keys128 = FwdPipeTraitsSm90<96, 128, 2, true>;
  using keys208 = FwdPipeTraitsSm90For<96>::narrow;
  using any = keys128;
};
template <> struct FwdPipeStreamTilesSm90<128> {
  using keys80 = FwdPipeTraitsSm90For<128>::narrow;
  using keys128 = keys80;
  using keys208 = keys80;
  using any = FwdPipeTraitsSm90<128, 128, 2, true>;
};

// Forward v3's tiles at head-dim instance D by name, and the traits of a planned tile (V3Tile): one list for the
// planner (kernel_choice.h, which reads the tile's shape and epilogue from them) and the launcher (launch_sm90.h,
// which instantiates the kernel of each tile and term mode), so the two cannot disagree on what a tile is.
template <int D>
struct FwdV3Tiles {
  using Narrow = typename FwdPipeTraitsSm90For<D>::narrow;
  using Wide = typename FwdPipeTraitsSm90For<D>::wide;
  using Keys80 = typename FwdPipeStreamTilesSm90<D>::keys80;
  using Keys128 = typename FwdPipeStreamTilesSm90<D>::keys128;
  using Keys208 = typename FwdPipeStreamTilesSm90<D>::keys208;
  using Stream = typename FwdPipeStreamTilesSm90<D>::any;
  using TwoCtas = typename FwdPipeTwoCtasTileSm90<D>::type;
  using Rows192 = typename FwdPipeRows192TileSm90<D>::type;
  using Ragged = typename FwdPipeRaggedTileSm90<D>::type;
  // f(Traits{}) for the traits of `tile`
  template <typename F>
  static auto visit(int tile, F f) {
    switch (tile) {
      case kV3Wide: return f(Wide{});
      case kV3Keys80: return f(Keys80{});
      case kV3Keys128: return f(Keys128{});
      case kV3Keys208: return f(Keys208{});
      case kV3Stream: return f(Stream{});
      case kV3TwoCtas: return f(TwoCtas{});
      case kV3TwoCtasRagged: return f(Ragged{});
      case kV3Rows192: return f(Rows192{});
      default: return f(Narrow{});
    }
  }
};

// Pipelined backward v3 (bwd_pipelined_sm90.h): a producer warpgroup and two consumer warpgroups of 64 keys each
// (kBlockN = 128 keys resident per CTA), query blocks of kBlockM streaming through kStages TMA stages. Shared memory:
// K, V | stages of Q, dO (+ lse, delta) | dS^T double buffer | mbarriers; the staged bias tiles and the fp32 dBias
// staging tile are added at launch when the call has them (kBiasBytes, kDbiasBytes).
// Registers: dK and dV of 64 keys x D stay in the consumers (2 x D / 2 per thread), so head dims past 128 do not fit.
// kBlockM = 128 (head dim 64 only; BwdPipeTraitsSm90For<64>::q128): FA3 / FA4's 128 x 128 step there. S^T and dP^T
// are 64 keys x 128 queries per warpgroup (64 + 64 accumulator registers beside dK's and dV's 16 + 16), and each
// warpgroup's dQ is its half of the queries over the whole head dim (not a head-dim half over all queries): the fixed
// cost of a step (barrier waits, commits, the stage release, lse / delta) is paid once per 128 queries.
template <int kHeadDim_, int kStages_, int kBlockM_ = 64>
struct BwdPipeTraitsSm90 {
  static constexpr bool kSplitD = false;
  static constexpr int kHeadDim = kHeadDim_, kStages = kStages_;
  static constexpr int kBlockM = kBlockM_, kBlockN = 128, kNThreads = 384, kConsumerWarps = 8;
  static constexpr bool kDqByQueryHalves = kBlockM == 128;  // dQ split between the warpgroups by query halves
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  // the head-dim tiles' column blocks (tile_sm90.h): each consumer warpgroup's dQ takes whole blocks of one half,
  // so 32 columns where D / 2 is a multiple of 32, 16 at head dim 96 (bwd_v3_fine_dims)
  static constexpr int kRowBytes = kHeadDim % 64 == 0 ? 64 : 32, kBlockCols = kRowBytes / 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;  // one dS^T buffer (bf16 / fp16)
  static constexpr int kVecBytes = 2 * kBlockM * 4;       // lse and delta of one stage
  static constexpr int kBiasBytes = kBlockM * kBlockN * 2, kDbiasBytes = kBlockM * kBlockN * 4;
  // K | V | Q stages | dO stages | dS^T x 2 | lse / delta stages (padded to 1 KB) | 1 KB of mbarriers
  static constexpr int kBarsOffset =
      2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDSBytes + (kStages * kVecBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = 1024 + kBarsOffset + 1024;  // + 1 KB of slack to align the base to 1024 bytes
  static_assert(kHeadDim % (2 * kBlockCols) == 0 && kHeadDim <= 128, "dQ splits the head dim into whole column blocks");
  static_assert(kBlockM == 64 || (kBlockM == 128 && kHeadDim == 64), "128 queries per step: registers for D = 64 only");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep 1024-byte alignment");
};
// `type`: two stages (room for the staged bias tiles and the dbias staging next to them); `deep`: three, for calls
// without an additive term (a query block's loads get two steps of lead instead of one). Head dim 96 (16-column
// blocks) runs 65-96, which padded to 128 before v4.3 (kernel_modes.h bwd_v3_head_dim).
template <int D> struct BwdPipeTraitsSm90For {
  using type = BwdPipeTraitsSm90<D, 2>;
  using deep = BwdPipeTraitsSm90<D, 3>;
};
// 128 queries per step, no term, deferred dQ: two stages (K / V 32 KB, Q / dO 2 x 32 KB, three dS^T tiles of 32 KB:
// 196 KB; three stages would need 228)
template <> struct BwdPipeTraitsSm90For<64> {
  using type = BwdPipeTraitsSm90<64, 2>;
  using deep = BwdPipeTraitsSm90<64, 3>;
  using q128 = BwdPipeTraitsSm90<64, 2, 128>;
};

// Head dims past 128 (bwd_split_d_sm90.h): 64 keys per CTA shared by both consumer warpgroups, which split dK / dV /
// dQ by head-dim halves; P^T and dS^T pass through shared memory (ds(0), ds(1)). Two stages of 32 KB Q / dO tiles
// fill the shared memory (211 KB before the dbias staging), so there is no staged bias tile and no deep variant.
template <int kHeadDim_>
struct BwdSplitTraitsSm90 {
  static constexpr bool kSplitD = true;
  static constexpr int kHeadDim = kHeadDim_, kStages = 2;
  static constexpr int kBlockM = 64, kBlockN = 64, kNThreads = 384, kConsumerWarps = 8;
  static constexpr int kRowBytes = 64, kBlockCols = 32;  // (the loads shared with the unsplit kernel read these)
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;  // the P^T tile, then the dS^T tile
  static constexpr int kVecBytes = 2 * kBlockM * 4;
  static constexpr int kBiasBytes = kBlockM * kBlockN * 2, kDbiasBytes = kBlockM * kBlockN * 4;
  static constexpr int kBarsOffset =
      2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDSBytes + (kStages * kVecBytes + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = 1024 + kBarsOffset + 1024;
  static_assert(kHeadDim % 128 == 0, "two head-dim halves of whole 64-column dQ pieces");
};
template <> struct BwdPipeTraitsSm90For<256> {
  using type = BwdSplitTraitsSm90<256>;
  using deep = type;
};

// Window mode (fwd_windows_sm90.h): one warpgroup per 64-query tile of a window, windows of <= kBlockN keys, Q/K/V
// double buffered (TMA, an mbarrier per stage), plus the score-term table [kBlockN / 8][128 threads] in fragment
// order: float4 entries, or for wide windows (kHalfTerms) two half2 holding the staged fp16 term exactly, which
// halves the table (32 KB at kBlockN = 256) so two CTAs fit an SM. The raw additive tile is added by the planner
// when it cannot borrow the second window buffer (window_term_aliased). kMinBlocks CTAs per SM caps the registers
// (65536 / (128 * kMinBlocks)).
template <int kHeadDim_, int kBlockN_, int kMinBlocks_>
struct FwdWindowTraitsSm90 {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kMinBlocks = kMinBlocks_;
  static constexpr int kBlockM = 64, kNThreads = 128;
  static constexpr bool kHalfTerms = kBlockN > 160;
  // Only key block 64 also takes bool masks, key padding and bands (apply_terms); the wide tiles run the fast path
  // alone (an additive term at most) so its registers are not shared with the general one (ptxas: 244-255
  // registers and spills at key blocks 160 / 256 with both).
  static constexpr bool kGeneralTerms = kBlockN == 64;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kStageBytes = kQBytes + 2 * kKVBytes;  // one window: Q, K, V
  static constexpr int kTermBytes = (kBlockN / 8) * 128 * (kHalfTerms ? 8 : 16);
  static constexpr int kBarsBytes = 64;  // the two stages' mbarriers (and 16-byte alignment for the table)
  static constexpr int kSmemBytes = 1024 + 2 * kStageBytes + kBarsBytes + kTermBytes;
  static_assert(kHeadDim % 32 == 0 && kBlockN % 16 == 0, "whole 32-column blocks, k16 steps");
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles keep 1024-byte alignment");
};
// Window-mode tiles by head dim and key block: Swin (D = 32) windows of up to 64 / 128 / 160 / 256 keys (W8, W11,
// W12, W16) and D = 64 windows of up to 64. Wider key blocks hold more accumulator registers: fewer CTAs per SM.
template <int D, int BN> struct FwdWindowTraitsSm90For;
template <> struct FwdWindowTraitsSm90For<32, 64> { using type = FwdWindowTraitsSm90<32, 64, 4>; };
template <> struct FwdWindowTraitsSm90For<32, 128> { using type = FwdWindowTraitsSm90<32, 128, 3>; };
template <> struct FwdWindowTraitsSm90For<32, 160> { using type = FwdWindowTraitsSm90<32, 160, 2>; };
template <> struct FwdWindowTraitsSm90For<32, 256> { using type = FwdWindowTraitsSm90<32, 256, 2>; };
template <> struct FwdWindowTraitsSm90For<64, 64> { using type = FwdWindowTraitsSm90<64, 64, 3>; };

// Window-mode backward (bwd_windows_sm90.h): one warpgroup, windows of <= 64 queries and keys; per window buffer
// Q, dO, K, V (swizzled) and lse; then P and dS [64 x kBlockN] bf16 and the fp32 term table.
template <int kHeadDim_, int kBlockN_, int kMinBlocks_>
struct BwdWindowTraitsSm90 {
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kMinBlocks = kMinBlocks_;
  static constexpr int kBlockM = 64, kNThreads = 128;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2, kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kStageBytes = (2 * kQBytes + 2 * kKVBytes + kBlockM * 4 + 1023) / 1024 * 1024;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static constexpr int kSmemBytes = 1024 + 2 * kStageBytes + 2 * kPBytes + (kBlockN / 8) * 128 * 16;
  static constexpr bool kGeneralTerms = true;  // every term but the table alone takes apply_terms
  static_assert(kHeadDim % 32 == 0 && kBlockN % 32 == 0, "whole 32-column blocks");
};
template <int D> struct BwdWindowTraitsSm90For;
template <> struct BwdWindowTraitsSm90For<32> { using type = BwdWindowTraitsSm90<32, 64, 3>; };

// Wide-window backward (bwd_windows_wide_sm90.h): head dim 32, windows of 65 .. kWindow tokens. kKeyBlocks
// warpgroups own 64 keys each (kKeys rows of K / V, zero past Sk); the queries go by in kQChunks chunks of kQChunk,
// chunk m's dQ computed by warpgroup m. Warps whose 16 keys all lie past kDqKeys (the most keys a CTA can have) hold
// padding only: kWarpSlots warps are real, and only they have term-table and dS-sum slots. Per stage: Q, dO
// [kQueries x 32], K, V [kKeys x 32], lse2 and delta [kQueries] fp32; then one dS^T staging tile [kDqKeys x 64] per
// warpgroup (the one its chunk's dQ reads), the fp16 term table [real warp][chunk][kQChunk / 8][32 lanes] (uint2)
// and the dS sums of the chunks past kRegChunks [chunk][kQChunk / 8][real warp][32 lanes] (float4), one O tile
// [kQueries x 32], the receive tile of the split mode and the mbarriers. One CTA per SM: the N x N dS sums take
// kQueries / 2 fp32 per thread; at three warpgroups (168 registers a thread) all three chunks in registers spilled
// 256 bytes.
// kSplit (windows of 145 .. 256 tokens): a whole window's sums (256 KB at N = 256) do not fit one SM, so a cluster
// of four CTAs takes each window, CTA (qh, kh) its 128 x 128 quarter (query half qh, key half kh). dQ of a query
// half and dK / dV of a key half are then sums of two CTAs' parts: the receive tile (6 x [4][128 threads] float4,
// 48 KB: the two dQ chunks, then dK and dV per warpgroup) takes the peers' parts by st.async
// (bwd_windows_wide_sm90.h).
template <int kKeyBlocks_, int kQChunk_, int kRegChunks_, bool kSplit_ = false>
struct BwdWideWindowTraitsSm90 {
  static constexpr int kHeadDim = 32, kKeyBlocks = kKeyBlocks_, kQChunk = kQChunk_, kQChunks = kKeyBlocks_;
  static constexpr int kRegChunks = kRegChunks_, kNThreads = 128 * kKeyBlocks;
  static constexpr bool kSplit = kSplit_;
  static constexpr int kKeys = 64 * kKeyBlocks, kQueries = kQChunk * kQChunks, kDqKeys = kQueries;
  static constexpr int kWindow = kSplit ? 2 * kQueries : kQueries;  // tokens per window (the lse2 row padding)
  static constexpr int kWarpSlots = (kDqKeys + 15) / 16;
  static constexpr int kQBytes = kQueries * 64, kKVBytes = kKeys * 64;
  static constexpr int kStageBytes = (2 * kQBytes + 2 * kKVBytes + 2 * kQueries * 4 + 1023) / 1024 * 1024;
  static constexpr int kDSBytes = kDqKeys * 64 * 2;  // [kDqKeys keys][64 query columns] 16-bit
  static constexpr int kTermBytes = kWarpSlots * 32 * (kQueries / 8) * 8;
  static constexpr int kDbiasBytes = (kQChunks - kRegChunks) * (kQChunk / 8) * kWarpSlots * 32 * 16;
  static constexpr int kOOffset = 2 * kStageBytes + kKeyBlocks * kDSBytes + kTermBytes + kDbiasBytes;
  static constexpr int kPartBytes = 128 * 16 * 4;  // one warpgroup's 64 x 32 fp32 accumulator
  static constexpr int kRecvOffset = kOOffset + kQBytes;
  static constexpr int kBarsOffset = kRecvOffset + (kSplit ? 3 * kKeyBlocks * kPartBytes : 0);
  static constexpr int kSmemBytes = 1024 + kBarsOffset + 64;  // + the stage and exchange mbarriers
  static_assert(kQChunk % 16 == 0 && kQChunk <= 64, "k16 steps over a chunk; its dQ rows fit one 64-row tile");
  static_assert(kQBytes % 512 == 0 && kDSBytes % 1024 == 0, "swizzle atoms stay aligned");
  static_assert(!kSplit || (kKeys == kQueries && kKeys == 128), "the split mode's quarters are 128 x 128");
};
// N <= 128 (W9 .. W11): two warpgroups, 64-query chunks; N <= 144 (W12): three, 48-query chunks (3 x 48 = 144, so
// the 64-row key blocks carry the padding, not the chunks); N <= 256 (W13 .. W16): the N <= 128 CTA per quarter.
template <int N> struct BwdWideWindowTraitsSm90For;
template <> struct BwdWideWindowTraitsSm90For<128> { using type = BwdWideWindowTraitsSm90<2, 64, 2>; };
template <> struct BwdWideWindowTraitsSm90For<144> { using type = BwdWideWindowTraitsSm90<3, 48, 2>; };
template <> struct BwdWideWindowTraitsSm90For<256> { using type = BwdWideWindowTraitsSm90<2, 64, 2, true>; };

// Fast path (the term table; on the wide forward tiles also key padding, which hide_padded_keys applies without the
// tile) with the raw term tile small enough to borrow the second window buffer (it is read once, into the table,
// before the first window's compute: fwd/bwd_windows_sm90.h). apply_terms reads the tile per window: not aliased.
// (With key padding counted as a reason not to alias, the W16 forward's extra 32 KB tile left one CTA per SM: 1.48
// ms against 0.85 without padding, H200, RESULTS v3.4.)
template <typename Tr>
__host__ __device__ inline bool window_term_aliased(const KParams& p) {
  const bool table_only = p.mask.ptr == nullptr && !p.has_band && (p.kp == nullptr || !Tr::kGeneralTerms);
  return table_only && Tr::kBlockM * p.bias_pitch <= Tr::kStageBytes;
}

// Shared-memory offset (from the aligned base) of the window forward's two mask-bit buffers: after the term table
// and, unless aliased, the raw term tile; the planner adds 2 * 64 * mb_words * 4 bytes for them.
template <typename Tr>
__host__ __device__ inline int fwd_windows_bits_offset(const KParams& p) {
  const int tile = p.bias.ptr != nullptr && !window_term_aliased<Tr>(p) ? Tr::kBlockM * p.bias_pitch : 0;
  return (Tr::kSmemBytes - 1024 + tile + 127) / 128 * 128;
}

// The tile order of band calls (forward: query blocks of (batch, head) pairs; backward: key blocks of (batch, KV
// head) pairs): CTA index idx -> (pair, block) with the blocks of `sec` consecutive pairs interleaved, block-major
// within each section of pairs (the last section may hold fewer), so block 0 (the longest) of every pair in a section
// comes first. A permutation of [0, pairs) x [0, blocks), and a pair's blocks rise with idx (the deterministic
// backward's tickets rely on it); tests/unit/kernel_choice_fuzz.cpp checks both.
struct PairBlock {
  int pair, block;
};
__host__ __device__ inline PairBlock interleaved_tile(int idx, int blocks, int pairs, int sec) {
  const int first = idx / (blocks * sec) * sec, in_sec = pairs - first < sec ? pairs - first : sec;
  const int r = idx - first * blocks;
  return {first + r % in_sec, r / in_sec};
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
