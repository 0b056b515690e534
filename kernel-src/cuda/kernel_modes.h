// The modes the kernel choice (kernel_choice.h) hands to the kernels and their launchers: the score-term paths, the
// dbias routes and the backward v3 plan. Kept apart from the choice so that a change of the choice rules recompiles
// the planner alone, not every kernel.
#pragma once

namespace winattn {
namespace cuda {

namespace sm90 {
// Forward v3's score-term paths (score_terms_sm90.h): kTermsRaw (no additive term: scores stay raw, the scale folds
// into the exponent), kTermsRawBias (a 16-bit additive tile of the input dtype staged by TMA with each key block),
// kTermsRawRow (a term broadcast over the queries, [B or 1, H or 1, 1, Sk]: one value per key, staged per key block
// in shared memory by a producer warp), kTermsGeneral (the term and the bool mask read from global memory per
// score), kTermsRawBits (a bool mask per score, no additive term: the mask as bits, KParams::mbits, one bit per score
// read one key block ahead),
// kTermsRawBiasMasked (kTermsRawBias with a bool mask folded into the tile: KParams::term_hides; its own instance, so
// that the plain staged path compiles as before), kTermsRawBiasPadded and kTermsRawRowPadded (kTermsRawBias /
// kTermsRawRow with key padding staged beside the term as bits; the row term optional in kTermsRawRowPadded).
// Instances of their own too: the unpadded row kernel stays as it was (a run-time test of the padding cost PixArt's
// and EVA-02's row terms 2-7%, H200 kernel time).
enum TermsMode : int {
  kTermsRaw = 0,
  kTermsRawBias = 1,
  kTermsGeneral = 2,
  kTermsRawRow = 3,
  kTermsRawBits = 4,
  kTermsRawBiasMasked = 5,
  kTermsRawBiasPadded = 6,
  kTermsRawRowPadded = 7,
};
// What producer warp 1 stages beside each K block (produce_row_terms): the row term, the key padding bits, either.
constexpr bool stages_row_term(int mode) { return mode == kTermsRawRow || mode == kTermsRawRowPadded; }
constexpr bool stages_padding(int mode) { return mode == kTermsRawBiasPadded || mode == kTermsRawRowPadded; }
constexpr bool stages_row(int mode) { return stages_row_term(mode) || stages_padding(mode); }
// Forward v3's tile (kernel_traits_sm90.h FwdPipeTraitsSm90For / FwdPipeStreamTilesSm90): the narrow default, the
// wide key blocks of long key sets (the raw path), one key block sized to a short key set (<= 80 keys: CLIP's 77
// text tokens; <= 128: PixArt's 120; <= 208: ViT's 197), where 128-key blocks are 40-60% padding, or 128-key blocks
// streamed for any key set (the last three pipelined across tiles: consume_stream), or 64-key blocks in half the
// registers so that two CTAs share an SM (kV3TwoCtas, head dim 64; kV3TwoCtasRagged: its last key block cut to the
// sequence end), or 192-row tiles of three consumer warpgroups (kV3Rows192, head dim 64).
enum V3Tile : int {
  kV3Narrow = 0,
  kV3Wide = 1,
  kV3Keys80 = 2,
  kV3Keys128 = 3,
  kV3Keys208 = 4,
  kV3Stream = 5,
  kV3TwoCtas = 6,
  kV3Rows192 = 7,
  kV3TwoCtasRagged = 8,
};
}  // namespace sm90

// Backward v3: how dS leaves as dbias. kDbiasStore: fp32, one contributor per element; kDbiasReduce: an fp32
// reduce-add by TMA (elements shared by several (batch, head)); kDbiasStore16: a store in the input dtype (one
// writer per element, a bias of the input dtype: the caller allocates dbias so, bwd_dbias_layout); kDbiasAtomic: dbias
// broadcast over rows / columns or rows TMA cannot address: summed in registers, then fp32 atomics.
enum BwdDbias : int { kDbiasNone = 0, kDbiasStore = 1, kDbiasReduce = 2, kDbiasStore16 = 3, kDbiasAtomic = 4 };
// Backward v3: how the score terms are read: none (key padding and bands only), the additive term staged by TMA
// with Q / dO, the term and the bool mask read from global memory per element, a term broadcast over the queries
// (one value per key: two per thread and step, the keys of a CTA fixed), or a bool mask per score without a term
// as transposed bits (KParams::mbits: a key's row of query bits, two words per thread, key and query block).
enum BwdTerms : int {
  kBwdTermsNone = 0,
  kBwdTermsStaged = 1,
  kBwdTermsGlobal = 2,
  kBwdTermsRow = 3,
  kBwdTermsBits = 4,
  // kernel instances of the staged and the row term that came with a folded bool mask (BwdV3Buffers::hides): a -inf
  // entry hides its key whatever the score. Instances of their own, so the plain staged and row backward check
  // nothing: a run-time predicate in the shared loop cost them 1.5-3% (RESULTS v3.8).
  kBwdTermsStagedHiding = 5,
  kBwdTermsRowHiding = 6,
  // the row term with its gradient per key ([B or 1, H or 1, 1, Sk] with kDbiasAtomic): each thread sums the dS of
  // its two keys over the CTA's query blocks in registers and adds the sums once per (batch, head) with fp32
  // atomics. That went through the global-terms kernel (the term read per score, an atomic per key per query block):
  // EVA-02-shaped [1, H, 1, S] key bias, backward kernel 1.23 ms against 0.45 without the bias (RESULTS v3.9).
  kBwdTermsRowKeyGrad = 7,
};
// How an instance reads its term (its BwdTerms without the hiding or the key gradient).
constexpr int bwd_terms_read(int terms) {
  if (terms == kBwdTermsStagedHiding) return kBwdTermsStaged;
  return terms == kBwdTermsRowHiding || terms == kBwdTermsRowKeyGrad ? kBwdTermsRow : terms;
}

constexpr int kBwdV3BlockM = 64;  // query rows per pipeline stage (BwdPipeTraitsSm90::kBlockM; 128: block_m below)
// The v3 backward's head-dim instance: 64, 128 (dK / dV of 64 keys x D in each consumer's registers) and 256 (split
// by head-dim halves); the dims between run on the next one up with TMA's zero fill as padding.
// 65-96 run on the 16-column instance at 96 (each warpgroup's dQ half is whole 16-column blocks), not padded to
// 128: H200 f+b kernel time (RESULTS v4.3) DiT-XL/2-256 0.494 -> 0.462 ms, DiT-XL/2-512 1.088 -> 1.006, PixArt
// 1024 px 3.50 -> 3.22, SD 1.5's 80 0.279 -> 0.255. (bwd_v3_fine_dims forces it: an error outside 65-96.)
inline int bwd_v3_head_dim(int D) { return D <= 64 ? 64 : D <= 96 ? 96 : D <= 128 ? 128 : 256; }

// Backward v3's dQ, summed over the key blocks that see a query:
//   kBwdDqAccumulate  fp32 adds into a zero-filled accumulator in global memory, then a conversion pass (the table's
//                     where neither mode below runs; bwd_v3_dq_accumulate forces it);
//   kBwdDqDirect      one key block, no band: each dQ tile has one contributor, stored from the fragments (no
//                     accumulator, no memset, no conversion pass; bwd_v3_dq_direct; the table's wherever it runs);
//   kBwdDqResident    one CTA per (batch, KV head) walks every key block, dQ of its queries summed in shared memory
//                     and stored once (short sequences: ViT's 197; bwd_v3_dq_resident; the table's from 8 such CTAs
//                     per SM).
enum BwdDq : int { kBwdDqAccumulate = 0, kBwdDqDirect = 1, kBwdDqResident = 2 };

// The v3 backward's plan: the dbias route and the pipeline shape (workspace pointers are added by the run).
struct BwdV3Buffers {
  float* lse2 = nullptr;    // [B, H, sq_pad] lse * log2(e), written by the preprocess
  float* delta = nullptr;   // [B, H, sq_pad] rowsum(dO * O) - dlse, written by the preprocess
  float* dq_acc = nullptr;  // [B, H, sq_pad / 64, 64 * D] fp32 fragment order, zero-filled
  int* dq_sems = nullptr;   // deterministic only: [B, H, sq_pad / 64], zero-filled
  int sq_pad = 0;
  void* dbias = nullptr;    // [period, heads, Sq, Sk]: fp32 zero-filled by the caller, or the input dtype (Store16)
  int dbias_period = 1, dbias_heads = 1;  // the user bias's broadcast (the kernel's term may be a prepared one)
  int dbias_rows = 1, dbias_cols = 1;     // Sq / Sk, or 1 where broadcast (kDbiasAtomic)
  int dbias_pitch = 0;                    // fp32 elements per dbias row as the kernel writes them (TMA modes)
  bool dbias_padded = false;              // into a padded workspace copy (rows TMA cannot address), then unpadded
  int dbias_mode = kDbiasNone;
  int dbias_bufs = 1;  // staging tiles (two where they fit)
  bool pair = false;   // pair mode: one CTA owns the two batches that share a dbias tile
  int terms = kBwdTermsNone;
  bool hides = false;  // the staged or row term was folded with a bool mask (its kernel instance: *Hiding)
  bool deep = false;   // no additive term: three stages (two with block_m 128)
  bool defer = false;  // deferred dQ (no dbias tile staged)
  int dq_mode = kBwdDqAccumulate;  // where dQ is summed over the key blocks (BwdDq)
  int block_m = kBwdV3BlockM;      // queries per step: 64, or 128 (head dim 64, no term: traits' q128)
  int smem = 0;
};

}  // namespace cuda
}  // namespace winattn
