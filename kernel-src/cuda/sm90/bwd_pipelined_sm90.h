// Hopper backward v3 (sm_90a): the pipelined, warp-specialized kernel for non-window backwards on Hopper.
//
// Design (FlashAttention-3's backward, written for this project's score terms):
//   * KV-outer: one CTA per (batch, KV head, 128-key block). K and V stay in shared memory; for every query head of
//     the KV head's group and every query block of 64 rows that sees the key block, the producer warpgroup (one
//     thread, setmaxnreg 24) streams Q, dO, lse and delta (and the bias tile) through kStages TMA stages guarded by
//     full / empty mbarriers (pipeline_sm90.h).
//   * two consumer warpgroups own 64 keys each and compute, all on wgmma:
//       S^T = K Q^T, dP^T = V dO^T            (M = keys, so P^T and dS^T come out in registers in the A-operand
//                                               layout of the next two GEMMs: no shared-memory transpose)
//       P^T = exp2(S^T * scale * log2e + bias * log2e - lse * log2e), dS^T = P^T (dP^T - delta)
//       dV += P^T dO, dK += dS^T Q            (register A operand; accumulated over the whole group: GQA needs no
//                                               atomics for dK / dV)
//       dQ[:, half] = dS K[:, half]           (dS^T through shared tiles; each warpgroup takes one half of the
//                                               head dim over all 128 keys)
//   * two schedules for the dS^T exchange: where no dbias tile is staged (kDefer, the common case), each step's dQ
//     GEMM runs one step later from a 3-tile dS^T ring and the warpgroups signal each other with bar.arrive /
//     bar.sync, so they drift apart and one's softmax overlaps the other's GEMMs (H200: D = 128 backward 12.3 ->
//     10.7 ms); with a dbias tile to stage they meet at one barrier per step (double-buffered dS^T) and the dQ
//     GEMM follows at once.
//   * dQ: fp32 adds (red.global.add.v4) into an accumulator in the consumers' fragment order, so every warp adds
//     512 contiguous bytes per instruction; dq_frag_convert_kernel (aux_kernels.h) turns it into dQ. Where they
//     can run, the table takes the other modes (kernel_modes.h BwdDq): with one key block and no band each dQ tile
//     has one contributor, which stores it from the fragments (bwd_dq_direct_kernel_sm90); short calls sum dQ in
//     shared memory (bwd_dq_resident_kernel_sm90).
//     deterministic=True adds in ascending key-block order behind one ticket counter per (batch, head, query block).
//   * head dim 64 with 128 queries per step (Tr::kDqByQueryHalves, BwdPipeTraitsSm90For<64>::q128; FA3 / FA4's tile
//     there): S^T, dP^T are 64 keys x 128 queries per warpgroup, and dQ is split by query halves (warpgroup cw: queries
//     64 cw .. 64 cw + 63 over the whole head dim), added into the 64-row accumulator tiles 2 m + cw.
//   * head dims past 128: bwd_split_d_sm90.h (64 keys per CTA, the head dim split between the warpgroups).
//   * dBias = dS, made exactly once per (b, h, query block, key block): the tile goes through a shared staging
//     tile (two, alternating, where they fit) and leaves with TMA: a plain tensor store where the element has one
//     writer ([B, H, Sq, Sk] bias, or pair mode below), in the bias's own 16-bit dtype when it is the input dtype
//     (no zero-fill of dbias, no fp32 -> bf16 pass after: 0.55 ms of the dense-bias backward before), and an fp32
//     reduce-add (cp.reduce.async.bulk.tensor, at L2) where the bias is broadcast over batch and / or heads.
//     That is O(bias size) memory and no per-element atomics in the SMs. The CTA order puts the batches that share
//     a bias tile side by side, so their adds meet in L2. With exactly two contributors the reduce-add is bitwise
//     deterministic (0 + a + b = 0 + b + a); the planner sends deterministic calls with more to v1.
//   * pair mode (kPair, head dim 64): when exactly two batches share each dbias element (a [B / 2, H, S, S] bias,
//     e.g. [1, H, S, S] with B = 2), one CTA owns both: K / V of both batches resident, dK / dV of both in registers
//     (2 x 2 x 32 per thread), the two dS tiles summed in fp32 on chip and stored once with a plain TMA store.
//     The reduce-add's read of the zero-filled dbias and its second pass go away (H200, dense bias [1, 16, 4096,
//     4096] with B = 2: backward 2.23 -> 2.06 ms with fp32 dbias; 1.38 ms with the 16-bit store, RESULTS.md).
//   * the preprocess (bwd_prep_v3_kernel) writes delta = rowsum(dO * O) - dlse and lse * log2(e) into rows padded
//     to whole query blocks (+inf past Sq: P = 0 there), loaded per stage by TMA like the tiles.
//   * score terms (kTerms, BwdTerms in bwd_v3_api.h): a 16-bit full-size additive term rides the stage ring as one
//     more TMA box; any other term (fp32, broadcast rows / columns, odd strides) and the bool mask are read per
//     element from global memory (L1 / L2 gathers: the general path, not the fast one). dbias broadcast over rows /
//     columns is reduced in registers and shuffles and added with fp32 atomics (kDbiasAtomic).
// Key blocks whose keys are all padding (key padding) skip their work; causal / sliding-window bands visit only the
// query blocks that see the key block (m_block_range).
#pragma once
#include <type_traits>

#include "bwd_split_d_sm90.h"  // head dims past 128: the consumer that splits dK / dV / dQ by halves
#include "bwd_v3_common_sm90.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// A whole dQ tile's fragments of this warp (query block m of head h in batch b: rows 16 wi.., head-dim half cw; with
// 128 queries per step, kQH: rows 64 cw + 16 wi.. of the 128-row block, every column) into dQ (contiguous
// [B, Sq, H, D]), scaled, as dq_frag_convert_kernel would write it: the direct and resident dQ modes.
template <typename Elem, int DK, bool kQH = false>
__device__ __forceinline__ void store_dq_tile(const KParams& p, int b, int h, int m, int cw, int wi,
                                              const float (&acc)[1][kQH ? DK / 8 : DK / 16][4], int lane) {
  const int r0 = kQH ? m * 128 + cw * 64 + wi * 16 : m * kBwdV3BlockM + wi * 16, c0 = kQH ? 0 : cw * (DK / 2);
  const int64_t row = int64_t(p.H) * p.D;
  store_acc_rows<Elem, 1, kQH ? DK / 8 : DK / 16>(
      static_cast<Elem*>(p.dq) + (int64_t(b) * p.Sq + r0) * row + int64_t(h) * p.D + c0, row, acc, p.scale,
      p.Sq - r0, p.D - c0, lane);
}

// Head dims whose two consumer warpgroups take turns issuing their GEMM phases (Turns, pipeline_sm90.h), as the
// forward's do: WG0 S^T / dP^T, WG1 S^T / dP^T, WG0 dV / dK / dQ, WG1 dV / dK / dQ, ... so that one's P / dS work
// runs while the other's wgmma do, instead of both bursting at once. Deferred dQ, one batch, dQ not resident (one
// tile per CTA: the first hand-over and the skipped last one are the tile's); why it cannot deadlock:
// docs/hopper-backward-vs-fa3-fa4.md section 3. H100 backward kernel time (RESULTS v4.9): at 128 with the uniform
// descriptors (below) causal 16k -10%, dense 16k -1 to -3%, Flux-shaped within noise; without them +6 to +11% (so
// both or neither); at 64 -1 to -5% (SDXL 4096 tokens -5%); at 96 (DiT / PixArt, D = 72) 0 to +1.5% alone, -5% with
// the uniform descriptors (RESULTS v5.0).
constexpr bool bwd_turns(int head_dim) { return head_dim == 64 || head_dim == 96 || head_dim == 128; }
// Head dims whose backward builds its wgmma descriptors from one base per tile in uniform registers (tile_sm90.h
// kFromBase, with the warp-uniform warpgroup_index): ptxas's D = 64 step ~20% fewer instructions, the kernel 10-12%
// faster on the H100 (dense S = 16k, SDXL 4096 tokens), its 24 bytes of spills at 128 queries per step gone; the split
// head dim at 256 3% faster (the uniform index alone: it builds its own descriptors). At 128 it was 5-13% slower
// alone (both warpgroups then issued their wgmma bursts together, RESULTS v4.7's profile) and pays only with the
// turns above, and so at 96 (each alone 0 to +3%, both -5%): wherever the turns are, and at 256. RESULTS
// "Twenty-fourth session", v4.9, v5.0.
constexpr bool bwd_uniform_desc(int head_dim) { return bwd_turns(head_dim) || head_dim == 256; }
// The consumer warpgroup's index, 0 or 1 (wg - 1 from threadIdx.x, or read from lane 0 where bwd_uniform_desc).
template <typename Tr>
__device__ __forceinline__ int bwd_consumer_index(int wg) {
  if constexpr (bwd_uniform_desc(Tr::kHeadDim)) return warpgroup_index() - 1;
  return wg - 1;
}

// Consumer warpgroup cw (0 or 1): keys [64 cw, 64 cw + 64) of the block; KV batches (2: pair mode); kDefer: the
// deferred-dQ schedule (below; a template parameter: sharing one kernel with the lock-step schedule cost both
// schedules registers and 4-9% of their speed on the H200); kDq: where dQ goes (BwdDq: a template parameter too, as
// a run-time branch the direct store cost the D = 128 term instances 4-12 bytes of spills). it0: the stages this CTA
// consumed before this tile, kv_parity: the phase of this tile's K / V (both nonzero only when dQ is resident, one
// CTA walking the key blocks); returns the stages consumed after it.
template <typename Tr, typename Elem, int kTerms, int KV, bool kDefer, int kDq>
__device__ __forceinline__ int bwd_consume(const BwdPipeParams& P, const BwdSmem<Tr, KV> sm, int cw, const BwdTile& t,
                                           bool deterministic, int warp, int lane, int it0 = 0,
                                           uint32_t kv_parity = 0) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, ST = Tr::kStages;
  // W: the row bytes of the head-dim tiles (K, V, Q, dO: 32 at head dim 96, Tr::kRowBytes); the dS^T tile's column
  // blocks are queries, always 32 (kSwizzleRowBytes)
  constexpr int NTQ = BM / 8, DT = DK / 8, DTQ = DK / 16, RB = kSwizzleRowBytes, W = Tr::kRowBytes;
  constexpr bool kBaseDesc = bwd_uniform_desc(DK);
  // the steps' descriptors by 64-bit adds (tile_sm90.h desc_plus), but in the head-dim-96 resident-dQ instance, which
  // spilled with them (ptxas: 8 registers, 4 reloads per step) and does not with the low-word adds
  constexpr bool kAdd64 = !(DK == 96 && kDq == kBwdDqResident);
  // dQ per warpgroup: a head-dim half over all BM queries (DTQ n-tiles), or with 128 queries per step its own 64
  // queries over the whole head dim (DT n-tiles; Tr::kDqByQueryHalves)
  constexpr bool kQH = Tr::kDqByQueryHalves;
  constexpr int DQT = kQH ? DT : DTQ;
  // lse read into registers before the S^T / dP^T GEMMs and delta before P (RowPairsInRegs), so that the softmax
  // does not wait for shared memory (ncu, v4.9 D = 128: 10% of the samples stalled on those reads in it). H100
  // backward kernel time, RESULTS v5.0: dense D = 128 16k -6%, causal -4%, Flux -6%, Wan cross -8%, DiT / PixArt
  // (72 on the 96 instance) -5 to -8%. Only without a term and with 64 queries per step: with 128 per step and with
  // the staged / global / row terms the 16-32 more live registers spilled (ptxas: 12-83 bytes), and with mask bits
  // (no spill) the Llama-3 document-mask backward was 6% slower; those read them where used (RowPairsInSmem).
  constexpr bool kStatsEarly = !kQH && kTerms == kBwdTermsNone;
  static_assert(!kQH || ((kDq == kBwdDqAccumulate || kDq == kBwdDqDirect) && KV == 1 && kTerms == kBwdTermsNone),
                "128 queries: no term, dQ accumulated or stored directly");
  const KParams& p = P.p;
  const int wi = warp & 3, qr = lane >> 2, qc = (lane & 3) * 2, ctid = threadIdx.x - 128;
  const int key_row = cw * 64 + wi * 16 + qr;  // tile row of this thread's first key (the second is 8 further)
  const int j0 = t.n * BN + key_row;
  const int mblocks = ceil_div(p.Sq, BM);
  // (dbias: the TMA modes; kDbiasAtomic goes its own way)
  // (128 queries per step: never a dbias tile, known at compile time there: its registers are tight)
  const bool dbias = !kQH && P.dbias_mode != kDbiasNone && P.dbias_mode != kDbiasAtomic;
  const bool db16 = P.dbias_mode == kDbiasStore16;
  const uint32_t pair_sum = sm.dbias(P.bias_stage_bytes, P.dbias_bufs, P.dbias_tile_bytes);  // (db16, KV = 2)

  // this thread's two keys per batch: past the sequence end or hidden by key padding -> P = 0 for every query
  bool key_ok[KV][2];
#pragma unroll
  for (int bi = 0; bi < KV; ++bi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int j = j0 + 8 * hf;
      key_ok[bi][hf] = j < p.Sk && (p.kp == nullptr || __ldg(reinterpret_cast<const unsigned char*>(p.kp) +
                                                                 int64_t(t.batch(bi)) * p.kp_sb +
                                                                 int64_t(j) * p.kp_sk) != 0);
    }

  float acc_dk[KV][DT][4], acc_dv[KV][DT][4];
#pragma unroll
  for (int bi = 0; bi < KV; ++bi)
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[bi][d][e] = acc_dv[bi][d][e] = 0.f;

  // the bias element (query nt * 8 + qc + e, key key_row + 8 hf) sits at bias_off[hf][e] + nt * 1024 of its tile
  // (a box row is 128 bytes; nt moves 8 rows, which leaves the swizzle phase i & 7 unchanged); the same for the
  // fp32 staging tile (stage_off)
  int bias_off[2][2], stage_off[2][2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      bias_off[hf][e] = bias_elem_offset<BM>(qc + e, key_row + 8 * hf);
      stage_off[hf][e] = dbias_stage_offset<BM>(qc + e, key_row + 8 * hf);
    }
  const bool issuer = ctid == 0;
  mbar_wait(sm.kv_full(), kv_parity);

  // dQ = dS K of a step: the GEMM (A: dS^T tile dsa, M-major: all BM = 64 queries, or this warpgroup's 64 of 128,
  // its column blocks 2 cw and 2 cw + 1; B: kb, this warpgroup's head-dim half of K, or all of it), then the adds into
  // the fragment-order fp32 accumulator (ordered by key block when deterministic)
  auto issue_dq = [&](uint32_t dsa, uint32_t kb, float (&acc_dq)[DQT][4]) {
    const uint32_t a0 = kQH ? dsa + cw * 2 * (BN * RB) : dsa;
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
      wgmma_ss<1, 1>(Int<DQT * 8>(), Elem(), acc_dq, nmajor_step_desc<RB, kBaseDesc, kAdd64>(a0, ks, BN),
                     nmajor_step_desc<W, kBaseDesc, kAdd64>(kb, ks, BN), ks > 0);
    wgmma_commit();
  };
  auto add_dq = [&](int b, int h, int m, const float (&acc_dq)[DQT][4]) {
    if constexpr (kQH && kDq == kBwdDqDirect) {  // the only key block: this warpgroup's 64 rows, every column
      store_dq_tile<Elem, DK, true>(p, b, h, m, cw, wi, reinterpret_cast<const float (&)[1][DQT][4]>(acc_dq), lane);
      return;
    }
    if constexpr (kQH) {  // into the 64-row tiles dq_frag_convert_kernel reads: this warpgroup's queries are tile
      // 2 m + cw, its n-tile nt the entry nt % DTQ of head-dim half nt / DTQ (512 contiguous bytes per warp and add,
      // as below). Never deterministic (the table's rule: the tickets count 64-row tiles).
      const int64_t tile = (int64_t(b) * p.H + h) * (P.sq_pad / 64) + 2 * m + cw;
      float* dst = P.dq_acc + tile * (64 * DK) + int64_t(wi * DTQ) * 128 + lane * 4;
      add_dq_ntiles<kDqSkipsPadding<DK>, DQT>(p.D, acc_dq,
                                              [&](int nt) { return dst + ((nt / DTQ) * 4 * DTQ + nt % DTQ) * 128; });
      return;
    }
    if constexpr (kDq == kBwdDqResident) {  // this CTA's own sum in shared memory: this thread's fragment positions
      const int g = h - t.hkv * p.hgroup;
      const uint32_t a = sm.dq() + ((g * mblocks + m) * (BM * DK) + (cw * 4 + wi) * DTQ * 128 + lane * 4) * 4;
#pragma unroll
      for (int nt = 0; nt < DTQ; ++nt) {
        const float4 x = lds_f32x4(a + nt * 512);
        const float sum[4] = {x.x + acc_dq[nt][0], x.y + acc_dq[nt][1], x.z + acc_dq[nt][2], x.w + acc_dq[nt][3]};
        sts_f32x4(a + nt * 512, sum);
      }
      return;
    }
    if constexpr (kDq == kBwdDqDirect) {  // the only key block: the whole tile
      store_dq_tile<Elem, DK>(p, b, h, m, cw, wi, reinterpret_cast<const float (&)[1][DTQ][4]>(acc_dq), lane);
      return;
    }
    const int64_t tile = (int64_t(b) * p.H + h) * mblocks + m;
    float* dst = P.dq_acc + tile * (BM * DK) + int64_t((cw * 4 + wi) * DTQ) * 128 + lane * 4;
    int* sem = deterministic ? P.dq_sems + tile : nullptr;
    const int rank = deterministic ? dq_turn_wait<BM, BN>(p, sem, m, t.n, issuer) : 0;
    // (this warpgroup's head-dim half: its columns from cw DK / 2)
    add_dq_ntiles<kDqSkipsPadding<DK>, DTQ>(p.D - cw * (DK / 2), acc_dq, [&](int nt) { return dst + nt * 128; });
    if (deterministic) dq_turn_pass(sem, rank, issuer);
  };
  // Deferred dQ (kDefer: no dbias tile to stage, one batch per CTA). dQ needs both warpgroups' dS^T; waiting
  // for it in the step that wrote it held the warpgroups in lock step (their softmax phases coincided and the
  // tensor cores idled: ncu "barrier" stalls). Here the dQ GEMM of step it runs in step it + 1, behind its dV / dK
  // GEMMs, and each warpgroup announces its dS^T with bar.arrive (kBarBwdDsAnnounced + 2 cw + parity) and waits
  // only for the other's of the step before. dS^T then rotates through three tiles (the third in the dbias
  // staging's room): step it writes tile it % 3 after the other warpgroup's arrival for step it - 1, which follows
  // its dQ GEMM of step it - 3, the last reader of that tile. Barrier parity keeps a warpgroup that runs a step
  // ahead from arriving twice at one barrier before the other waited on it.
  constexpr bool defer = kDefer && KV == 1;
  const uint32_t ds_third = sm.dbias(P.bias_stage_bytes, 0, 0);
  auto ds_tile = [&](int i) { return i < 2 ? sm.ds(i) : ds_third; };
  const uint32_t kb_dq0 = kQH ? sm.k(0) : sm.k(0) + cw * (DK / 2 / Tr::kBlockCols) * (BN * W);
  int prev_b = 0, prev_h = 0, prev_m = 0;

  const int cnt = t.m_hi - t.m_lo;
  constexpr bool turns = bwd_turns(DK) && defer && kDq != kBwdDqResident;
  const Turns<2> turn{cw};
  if constexpr (turns)
    if (cnt > 0) turn.start(true);
  int it = it0, unit = 0;  // sub-steps (stages) and dbias tiles done
  for (int g = 0; g < p.hgroup; ++g) {
    const int h = t.hkv * p.hgroup + g;
    float key_grad[2] = {0.f, 0.f};  // kBwdTermsRowKeyGrad: this thread's share of dbias of its two keys for (b, h)
    for (int k = 0; k < cnt; ++k, ++unit) {
      const int m = t.m_at(k);
      const int sbuf = P.dbias_bufs == 2 ? (unit & 1) : 0;
      const uint32_t st = sm.dbias(P.bias_stage_bytes, sbuf, P.dbias_tile_bytes);
#pragma unroll
      for (int bi = 0; bi < KV; ++bi, ++it) {
        const int s = it % ST, buf = defer ? it % 3 : (it & 1), b = t.batch(bi);
        const uint32_t ka = sm.k(bi) + cw * 64 * W, va = sm.v(bi) + cw * 64 * W;  // M of S^T, dP^T: our keys
        // B of dQ: head-dim half cw of K (or all of it: kQH)
        const uint32_t kb_dq = kQH ? sm.k(bi) : sm.k(bi) + cw * (DK / 2 / Tr::kBlockCols) * (BN * W);
        uint2 key_bits[2] = {};
        if constexpr (kTerms == kBwdTermsBits) load_key_bits<BM>(key_bits, p, b, h, m, j0);
        mbar_wait(sm.full(s), uint32_t(it / ST) & 1u);
        std::conditional_t<kStatsEarly, RowPairsInRegs<NTQ>, RowPairsInSmem> lse, delta;
        lse.load(sm.lse(s), 0, qc);

        // S^T = K Q^T, then dP^T = V dO^T in a second group: P is computed while dP is on the tensor cores
        float acc_s[NTQ][4], acc_dp[NTQ][4];
        if constexpr (turns) turn.mine();
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < DK / 16; ++ks)
          wgmma_ss<0, 0>(Int<BM>(), Elem(), acc_s, kmajor_step_desc<W, kBaseDesc, kAdd64>(ka, ks, BN),
                         kmajor_step_desc<W, kBaseDesc, kAdd64>(sm.q(s), ks, BM), ks > 0);
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < DK / 16; ++ks)
          wgmma_ss<0, 0>(Int<BM>(), Elem(), acc_dp, kmajor_step_desc<W, kBaseDesc, kAdd64>(va, ks, BN),
                         kmajor_step_desc<W, kBaseDesc, kAdd64>(sm.dout(s), ks, BM), ks > 0);
        wgmma_commit();
        if constexpr (turns) turn.pass();
        wgmma_wait<1>();
        fence_acc(acc_s);

        // P^T (row = key j0 + 8 hf, column = query m * BM + nt * 8 + qc + e), then dS^T once dP^T is in
        delta.load(sm.delta(s), 0, qc);
        p_from_scores<Elem, kTerms, BM, BN, NTQ>(acc_s, p, lse, sm.bias(s, P.bias_stage_bytes), bias_off, key_ok[bi],
                                                 key_bits, b, h, m, t.n, j0, 0, qc);
        wgmma_wait<0>();
        fence_acc(acc_dp);
        ds_from_dp<NTQ>(acc_dp, acc_s, delta);
        if constexpr (kTerms == kBwdTermsGlobal)
          if (P.dbias_mode == kDbiasAtomic) dbias_atomic_add<BM, NTQ>(P, acc_dp, b, h, m, j0, lane);
        if constexpr (kTerms == kBwdTermsRowKeyGrad)
#pragma unroll
          for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) key_grad[hf] += acc_dp[nt][2 * hf] + acc_dp[nt][2 * hf + 1];

        uint32_t pf[NTQ / 2][4], dsf[NTQ / 2][4];
        {
          float (&s3)[1][NTQ][4] = reinterpret_cast<float (&)[1][NTQ][4]>(acc_s);
          float (&dp3)[1][NTQ][4] = reinterpret_cast<float (&)[1][NTQ][4]>(acc_dp);
          uint32_t (&pf3)[1][NTQ / 2][4] = reinterpret_cast<uint32_t (&)[1][NTQ / 2][4]>(pf);
          uint32_t (&dsf3)[1][NTQ / 2][4] = reinterpret_cast<uint32_t (&)[1][NTQ / 2][4]>(dsf);
          acc_to_afrag<Elem, 1, NTQ>(pf3, s3);
          acc_to_afrag<Elem, 1, NTQ>(dsf3, dp3);
        }
        // dBias: the dS tile -> staging buffer sbuf -> TMA after the last batch. fp32: element by element (pair
        // mode: the second batch adds to the first's). 16-bit: stmatrix.trans of the packed fragments (dsf, or in
        // pair mode the sum with the first batch's dS, parked in fp32 in a thread-private scratch). With one buffer
        // the previous tile's TMA read of it must be done first (one more barrier); with two, the issuer waited for
        // it before the first dS barrier of this tile.
        if (dbias) {
          if (bi == 0 && unit > 0 && P.dbias_bufs == 1) {
            if (issuer) bulk_wait_read<0>();
            named_sync(kBarBwdDbiasRead, 256);
          }
          if (db16 && KV == 2 && bi == 0) {
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt) sts_f32x4(pair_sum + (nt * 256 + ctid) * 16, acc_dp[nt]);
          } else if (db16) {
            uint32_t packed[NTQ / 2][4];  // the afrag order of dsf
#pragma unroll
            for (int ks = 0; ks < NTQ / 2; ++ks)
#pragma unroll
              for (int r = 0; r < 4; ++r) packed[ks][r] = dsf[ks][r];
            if constexpr (KV == 2) {
#pragma unroll
              for (int nt = 0; nt < NTQ; ++nt) {
                const float4 f = lds_f32x4(pair_sum + (nt * 256 + ctid) * 16);
                const int ks = nt >> 1, u = nt & 1;
                packed[ks][2 * u] = ElemTraits<Elem>::pack(f.x + acc_dp[nt][0], f.y + acc_dp[nt][1]);
                packed[ks][2 * u + 1] = ElemTraits<Elem>::pack(f.z + acc_dp[nt][2], f.w + acc_dp[nt][3]);
              }
            }
            stage_dbias16<BM, NTQ>(st, packed, 0, cw * 64 + wi * 16, lane);
          } else {
#pragma unroll
            for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
              for (int x = 0; x < 4; ++x) {
                const uint32_t a = st + stage_off[x >> 1][x & 1] + nt * 1024;
                sts_f32(a, bi == 0 ? acc_dp[nt][x] : lds_f32(a) + acc_dp[nt][x]);
              }
          }
        }

        // dS^T -> shared (rows = keys, columns = queries): the M-major A operand of dQ = dS K
        if (defer && it > it0)  // the other's dS^T of it - 1
          named_sync(kBarBwdDsAnnounced + 2 * (1 - cw) + ((it - 1) & 1), 256);
        // With mask bits, by stmatrix: afrag register 2 u + hf is the 8 x 8 block (keys + 8 hf, query chunk 2 ks + u),
        // in the layout stmatrix takes (thread t: row t / 4, columns 2 (t % 4) +0 / +1), and lane 8 k + r gives the
        // address of row r of block k; 4 instructions per step instead of 16 32-bit stores. Backward kernel time
        // (RESULTS v5.1): Llama-3 document mask -3%, DiT-XL/2-512 with a mask -2.5% on both the H100 and the H200;
        // without a term mixed (H100: dense D = 128 +1.7%, CogVideoX +2.6%), so those keep the stores. (Never in
        // pair mode: ptxas serialized that kernel's wgmma with it, 80 bytes of spills.)
        const uint32_t sds = ds_tile(buf);
        if constexpr (KV == 1 && kTerms == kBwdTermsBits) {
          const int blk = lane >> 3, ds_row = cw * 64 + wi * 16 + 8 * (blk & 1) + (lane & 7);
#pragma unroll
          for (int ks = 0; ks < NTQ / 2; ++ks)
            stmatrix_x4(sds + tile_chunk_offset<BN>(ds_row, 2 * ks + (blk >> 1)), dsf[ks][0], dsf[ks][1], dsf[ks][2],
                        dsf[ks][3]);
        } else {
#pragma unroll
          for (int ks = 0; ks < NTQ / 2; ++ks)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
#pragma unroll
              for (int u = 0; u < 2; ++u)  // afrag register (hf, u): rows + 8 hf, query chunk 2 ks + u
                sts_u32(sds + tile_chunk_offset<BN>(key_row + 8 * hf, 2 * ks + u) + qc * 2, dsf[ks][2 * u + hf]);
        }
        fence_view_async_shared();
        if constexpr (defer) {
          named_arrive(kBarBwdDsAnnounced + 2 * cw + (it & 1), 256);
        } else {
          // two staging buffers: the TMA issued for the previous tile has read the one the next tile writes
          if (dbias && bi == 0 && P.dbias_bufs == 2 && issuer) bulk_wait_read<0>();
          named_sync(kBarBwdDsWritten, 256);  // both warpgroups' dS^T (and dbias staging) are written
          if (dbias && bi == KV - 1 && issuer) {
            const int tb = b % P.db_period, th = P.db_heads > 1 ? h : 0;
            const int box_cols = db16 ? 64 : 32;  // one box row is 128 bytes
            for (int c = 0; c < BN / box_cols; ++c) {
              if (P.dbias_mode == kDbiasReduce)
                tma_reduce_add_4d(&P.tdb, st + c * BM * 128, t.n * BN + c * box_cols, m * BM, th, tb);
              else
                tma_store_4d(&P.tdb, st + c * BM * 128, t.n * BN + c * box_cols, m * BM, th, tb);
            }
            bulk_commit();
          }
        }

        // dV += P^T dO, dK += dS^T Q (k16 step ks: queries 16 ks .. 16 ks + 15), then dQ half cw = dS K: of this
        // step, or (deferred) of the step before. The deferred GEMM is issued in every step so the wgmma groups do
        // not depend on a branch, which made ptxas spill; in the first step it multiplies the unwritten third tile
        // and the result is dropped.
        if constexpr (turns) turn.mine();
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < NTQ / 2; ++ks) {
          wgmma_rs<1>(Int<DK>(), Elem(), acc_dv[bi], pf[ks],
                      nmajor_step_desc<W, kBaseDesc, kAdd64>(sm.dout(s), ks, BM), 1);
          wgmma_rs<1>(Int<DK>(), Elem(), acc_dk[bi], dsf[ks], nmajor_step_desc<W, kBaseDesc, kAdd64>(sm.q(s), ks, BM),
                      1);
        }
        wgmma_commit();
        float acc_dq[DQT][4];
        issue_dq(defer ? ds_tile((it + 2) % 3) : sm.ds(buf), kb_dq, acc_dq);
        if constexpr (turns) turn.pass_unless_last(g == p.hgroup - 1 && k == cnt - 1);
        wgmma_wait<1>();
        fence_acc(acc_dk[bi]);
        fence_acc(acc_dv[bi]);
        fence_frag(pf);
        fence_frag(dsf);
        __syncwarp();
        if (lane == 0) mbar_arrive(sm.empty(s));  // Q, dO, lse, delta and the bias tile of this stage are read
        wgmma_wait<0>();
        fence_acc(acc_dq);
        if constexpr (defer) {
          if (it > it0) add_dq(prev_b, prev_h, prev_m, acc_dq);
          prev_b = b;
          prev_h = h;
          prev_m = m;
        } else {
          add_dq(b, h, m, acc_dq);
        }
      }
    }
    if constexpr (kTerms == kBwdTermsRowKeyGrad) dbias_key_sums_add(P, key_grad, t.batch(0), h, j0, lane);
  }
  if (defer && it > it0) {  // the last step's dQ
    named_sync(kBarBwdDsAnnounced + 2 * (1 - cw) + ((it - 1) & 1), 256);
    float acc_dq[DQT][4];
    wgmma_fence();
    issue_dq(ds_tile((it - 1) % 3), kb_dq0, acc_dq);
    wgmma_wait<0>();
    fence_acc(acc_dq);
    add_dq(prev_b, prev_h, prev_m, acc_dq);
  }
  if constexpr (kDq == kBwdDqResident) {  // this warp's reads of the block's K / V are done (every wgmma waited on):
    __syncwarp();                          // the producer may load the next block's
    if (lane == 0) mbar_arrive(sm.kv_empty());
  }
  if (dbias && issuer) bulk_wait<0>();

  // dK = scale * dS^T Q, dV = P^T dO: rows = keys of this warp
  const int64_t kv_ss = int64_t(p.Hkv) * p.D, kv_sb = int64_t(p.Sk) * kv_ss;
  const int rows = p.Sk - (t.n * BN + cw * 64 + wi * 16);
#pragma unroll
  for (int bi = 0; bi < KV; ++bi) {
    const int64_t off =
        int64_t(t.batch(bi)) * kv_sb + int64_t(t.n * BN + cw * 64 + wi * 16) * kv_ss + int64_t(t.hkv) * p.D;
    float (&dk3)[1][DT][4] = reinterpret_cast<float (&)[1][DT][4]>(acc_dk[bi]);
    float (&dv3)[1][DT][4] = reinterpret_cast<float (&)[1][DT][4]>(acc_dv[bi]);
    store_acc_rows<Elem, 1, DT>(static_cast<Elem*>(p.dk) + off, kv_ss, dk3, p.scale, rows, p.D, lane);
    store_acc_rows<Elem, 1, DT>(static_cast<Elem*>(p.dv) + off, kv_ss, dv3, 1.f, rows, p.D, lane);
  }
  return it;
}

// The kernel's body: barriers, the tile, the producer / consumer split (the kernels below).
template <typename Tr, typename Elem, int kTerms, bool kPair, bool kDefer, int kDq>
__device__ __forceinline__ void bwd_pipelined_cta(const BwdPipeParams& P) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BN = Tr::kBlockN, ST = Tr::kStages, KV = kPair ? 2 : 1;
  const KParams& p = P.p;
  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<Tr, KV> sm{smem_u32(align_1024(smem_raw))};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const bool deterministic = P.dq_sems != nullptr;
  const BwdTile t = decode_bwd_tile<Tr, kPair>(P, deterministic);

  if (tid == 0) {
    mbar_init(sm.kv_full(), 1);
    for (int s = 0; s < ST; ++s) {
      mbar_init(sm.full(s), 1);
      mbar_init(sm.empty(s), Tr::kConsumerWarps);
    }
    mbar_fence_init();
  }
  // a key block hidden entirely by key padding has no work (its dK, dV are 0); deterministic calls still walk
  // it, so the dQ tickets of the key blocks after it advance, and so do direct-dQ ones, whose dQ (0) it stores
  bool any_key = true;
  if (p.kp != nullptr) {
    const int j = t.n * BN + (tid & (BN - 1)), bi = tid >= BN ? 1 : 0;
    const unsigned char* kp = reinterpret_cast<const unsigned char*>(p.kp);
    any_key = __syncthreads_or(tid < KV * BN && j < p.Sk &&
                               kp[int64_t(t.batch(bi)) * p.kp_sb + int64_t(j) * p.kp_sk] != 0);
  } else {
    __syncthreads();
  }
  // (the direct mode's test apart, under if constexpr: folded into one expression with the template constant, it
  // changed ptxas's schedule of every accumulate kernel, 800-3300 of ~3000 SASS instructions moved, and made the
  // row-term, bits and no-term backwards 9-13% slower on the H100: RESULTS v4.4)
  bool skip = t.m_hi <= t.m_lo || (!any_key && !deterministic);
  if constexpr (kDq == kBwdDqDirect) skip = t.m_hi <= t.m_lo;

  if (wg == 0) {
    regs_dealloc<Tr::kProducerRegs>();
    if (tid == 0 && !skip) {
      tma_prefetch_desc(&P.tq);
      tma_prefetch_desc(&P.tdo);
      bwd_produce<Tr, KV>(P, sm, t);
    }
  } else {
    regs_alloc<Tr::kConsumerRegs>();
    if (skip) {  // dK = dV = 0 (split head dim: both warpgroups own the same keys, the first writes)
      const int cw = wg - 1, wi = warp & 3;
      const int64_t kv_ss = int64_t(p.Hkv) * p.D;
      const int r0 = t.n * BN + (Tr::kSplitD ? 0 : cw * 64) + wi * 16;
      for (int bi = 0; bi < (Tr::kSplitD && cw == 1 ? 0 : KV); ++bi)
        for (int idx = lane; idx < 16 * p.D; idx += 32) {
          const int r = idx / p.D, d = idx % p.D;
          if (r0 + r < p.Sk) {
            const int64_t o =
                int64_t(t.batch(bi)) * p.Sk * kv_ss + int64_t(r0 + r) * kv_ss + int64_t(t.hkv) * p.D + d;
            static_cast<Elem*>(p.dk)[o] = Elem(0.f);
            static_cast<Elem*>(p.dv)[o] = Elem(0.f);
          }
        }
    } else if constexpr (Tr::kSplitD) {
      bwd_consume_split_d<Tr, Elem, kTerms>(P, sm, bwd_consumer_index<Tr>(wg), t, deterministic, warp, lane);
    } else {
      bwd_consume<Tr, Elem, kTerms, KV, kDefer, kDq>(P, sm, bwd_consumer_index<Tr>(wg), t, deterministic, warp,
                                                     lane);
    }
  }
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (bwd_pipelined_sm90_ready)
#endif
}

template <typename Tr, typename Elem, int kTerms, bool kPair, bool kDefer>
__global__ void __launch_bounds__(Tr::kNThreads, 1) bwd_pipelined_kernel_sm90(const __grid_constant__ BwdPipeParams P) {
  bwd_pipelined_cta<Tr, Elem, kTerms, kPair, kDefer, kBwdDqAccumulate>(P);
}

// One key block (BwdV3Buffers::dq_mode kBwdDqDirect): dQ stored from the fragments, no accumulator. A kernel of its own
// name, so that a profile tells it from the table's (whose code this leaves as it was).
template <typename Tr, typename Elem, int kTerms>
__global__ void __launch_bounds__(Tr::kNThreads, 1) bwd_dq_direct_kernel_sm90(const __grid_constant__ BwdPipeParams P) {
  bwd_pipelined_cta<Tr, Elem, kTerms, false, true, kBwdDqDirect>(P);
}

// dQ resident (BwdV3Buffers::dq_mode, kBwdDqResident): one CTA per (batch, KV head) walks every key block of the
// call in turn, K / V of the next loaded once the consumers release the last (kv_empty), Q / dO through one stage
// ring for all blocks. Each consumer thread sums its own fragment positions of every dQ tile of the group in shared
// memory (no other thread touches them: no barrier, no atomics), and at the end all of them store dQ as rows. What goes
// is the fp32 accumulator in global memory: its memset, the adds at L2 and the conversion pass. The deep kernel's
// tiles (no term).
template <typename Tr, typename Elem>
__global__ void __launch_bounds__(Tr::kNThreads, 1)
    bwd_dq_resident_kernel_sm90(const __grid_constant__ BwdPipeParams P) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, ST = Tr::kStages, DTQ = DK / 16;
  const KParams& p = P.p;
  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<Tr, 1> sm{smem_u32(align_1024(smem_raw))};
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int hkv = int(blockIdx.x % unsigned(p.Hkv)), b = int(blockIdx.x / unsigned(p.Hkv));
  const int nblocks = ceil_div(p.Sk, BN), mblocks = ceil_div(p.Sq, BM);
  if (tid == 0) {
    mbar_init(sm.kv_full(), 1);
    mbar_init(sm.kv_empty(), Tr::kConsumerWarps);
    for (int s = 0; s < ST; ++s) {
      mbar_init(sm.full(s), 1);
      mbar_init(sm.empty(s), Tr::kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (wg == 0) {
    regs_dealloc<Tr::kProducerRegs>();
    if (tid == 0) {
      tma_prefetch_desc(&P.tq);
      tma_prefetch_desc(&P.tdo);
      // (each block's first stages load while the consumers finish the last block; then its K / V, once every
      // consumer warp is done with the last block's: kv_empty)
      int it = 0;
      for (int n = 0; n < nblocks; ++n)
        it = bwd_produce<Tr, 1, ST>(P, sm, bwd_tile_at<Tr>(p, b, hkv, n), it, n > 0 ? (n - 1) & 1 : -1);
    }
    return;
  }
  regs_alloc<Tr::kConsumerRegs>();
  const int cw = bwd_consumer_index<Tr>(wg), wi = warp & 3;
  // this thread's fragment positions of every dQ tile (float4 (cw * 4 + wi) * DTQ + nt, lane of each tile's
  // 16 * DK): zero, then the key blocks' sums
  const uint32_t mine = sm.dq() + ((cw * 4 + wi) * DTQ * 128 + lane * 4) * 4;
  const float zero[4] = {0.f, 0.f, 0.f, 0.f};
  for (int tile = 0; tile < p.hgroup * mblocks; ++tile)
#pragma unroll
    for (int nt = 0; nt < DTQ; ++nt) sts_f32x4(mine + tile * (BM * DK * 4) + nt * 512, zero);
  int it = 0;
  for (int n = 0; n < nblocks; ++n)
    it = bwd_consume<Tr, Elem, kBwdTermsNone, 1, true, kBwdDqResident>(P, sm, cw, bwd_tile_at<Tr>(p, b, hkv, n),
                                                                        false, warp, lane, it, uint32_t(n) & 1u);
  // dQ of the group's heads: this thread's own positions
  for (int tile = 0; tile < p.hgroup * mblocks; ++tile) {
    float acc[1][DTQ][4];
#pragma unroll
    for (int nt = 0; nt < DTQ; ++nt) {
      const float4 x = lds_f32x4(mine + tile * (BM * DK * 4) + nt * 512);
      acc[0][nt][0] = x.x, acc[0][nt][1] = x.y, acc[0][nt][2] = x.z, acc[0][nt][3] = x.w;
    }
    store_dq_tile<Elem, DK>(p, b, hkv * p.hgroup + tile / mblocks, tile % mblocks, cw, wi, acc, lane);
  }
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (bwd_pipelined_sm90_ready)
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
