// Backward v3 consumer for head dims past 128 (BwdSplitTraitsSm90: 64 keys per CTA, head dim 256; 160 and 192 run
// on it padded by TMA's zero fill). What it shares with the other consumer (the producer, the tile decode, the
// shared-memory map, the dbias offsets and atomics) is in bwd_v3_common_sm90.h.
//
// Why another consumer: dK and dV of 64 keys x 256 columns are 256 fp32 registers per thread in one warpgroup, past
// the 240 a consumer gets. So (as FlashAttention-3 does for its head dim 256) the two warpgroups share the CTA's 64
// keys and split the work differently:
//   * S^T = K Q^T and dP^T = V dO^T by query halves: warpgroup cw computes the 64 keys x 32 queries [32 cw, 32 cw + 32)
//     (M = keys, N = 32, K = the whole head dim: no duplicated work);
//   * P^T and dS^T go to shared memory (rows = keys, columns = queries; each warpgroup writes its 32 columns), where
//     both warpgroups read all 64 queries of them:
//       dV[:, half cw] += P^T dO[:, half cw], dK[:, half cw] += dS^T Q[:, half cw]   (M = keys, N = 128, K = queries)
//       dQ[:, half cw] = dS K[:, half cw]                                             (two N = 64 pieces)
//     so each thread keeps dK and dV of 64 keys x 128 columns (2 x 64 registers) and 32 registers of dQ.
//   * two barriers per step: the tiles are written (3), and both warpgroups are done reading the previous ones
//     before they are overwritten (6); the two warpgroups run in lock step.
//   * the additive term is read from global memory (kBwdTermsGlobal: the stage ring has no room for a bias tile next
//     to the 32 KB Q / dO tiles and the dbias staging); dbias leaves as in the other consumer.
#pragma once
#include "bwd_v3_common_sm90.h"

namespace winattn {
namespace cuda {
namespace sm90 {

template <typename Tr, typename Elem, int kTerms>
__device__ __forceinline__ void bwd_consume_split_d(const BwdPipeParams& P, const BwdSmem<Tr, 1> sm, int cw,
                                                    const BwdTile& t, bool deterministic, int warp, int lane) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, DK = Tr::kHeadDim, ST = Tr::kStages, RB = kSwizzleRowBytes;
  constexpr int QH = BM / 2, NTQ = QH / 8;  // this warpgroup's queries of S^T / dP^T and their 8-column tiles
  constexpr int DH = DK / 2, DT = DH / 8;   // this warpgroup's head-dim half of dK / dV / dQ
  constexpr int DQN = 64, DQT = DQN / 8;    // dQ in pieces of 64 columns
  static_assert(BN == 64 && BM == 64 && DH % DQN == 0, "64 keys, 64 queries, whole dQ pieces");
  static_assert(kTerms != kBwdTermsStaged, "the split consumer reads the additive term from global memory");
  const KParams& p = P.p;
  const int wi = warp & 3, qr = lane >> 2, qc = (lane & 3) * 2, ctid = threadIdx.x - 128;
  const int key_row = wi * 16 + qr;  // tile row of this thread's first key (the second is 8 further)
  const int j0 = t.n * BN + key_row;
  const int q0 = cw * QH;            // this warpgroup's first query column of the block
  const int mblocks = ceil_div(p.Sq, BM);
  const bool dbias = P.dbias_mode != kDbiasNone && P.dbias_mode != kDbiasAtomic, db16 = P.dbias_mode == kDbiasStore16;

  bool key_ok[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int j = j0 + 8 * hf;
    key_ok[hf] = j < p.Sk && (p.kp == nullptr || __ldg(reinterpret_cast<const unsigned char*>(p.kp) +
                                                       int64_t(t.b) * p.kp_sb + int64_t(j) * p.kp_sk) != 0);
  }
  float acc_dk[DT][4], acc_dv[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[d][e] = acc_dv[d][e] = 0.f;

  // fp32 staging offsets of element (query q0 + qc + e, key key_row + 8 hf); + nt * 1024 moves 8 queries
  int stage_off[2][2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int e = 0; e < 2; ++e) stage_off[hf][e] = dbias_stage_offset<BM>(q0 + qc + e, key_row + 8 * hf);
  const bool issuer = ctid == 0;
  const uint32_t pt = sm.ds(0), dst_t = sm.ds(1);  // P^T and dS^T tiles [BN keys x BM queries]
  mbar_wait(sm.kv_full(), 0);

  const int cnt = t.m_hi - t.m_lo;
  int it = 0;
  for (int g = 0; g < p.hgroup; ++g) {
    const int h = t.hkv * p.hgroup + g, b = t.b;
    for (int k = 0; k < cnt; ++k, ++it) {
      const int m = t.m_at(k), s = it % ST;
      const int sbuf = P.dbias_bufs == 2 ? (it & 1) : 0;
      const uint32_t st = sm.dbias(0, sbuf, P.dbias_tile_bytes);
      mbar_wait(sm.full(s), uint32_t(it / ST) & 1u);

      // S^T = K Q^T, dP^T = V dO^T for this warpgroup's 32 queries (k16 step ks: column block ks / 2, half ks % 2)
      float acc_s[NTQ][4], acc_dp[NTQ][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < DK / 16; ++ks) {
        const uint32_t on = (ks >> 1) * (BN * RB) + (ks & 1) * 32, om = (ks >> 1) * (BM * RB) + (ks & 1) * 32 + q0 * RB;
        wgmma_ss<0, 0>(Int<QH>(), Elem(), acc_s, make_desc(sm.k(0) + on, 16, 512), make_desc(sm.q(s) + om, 16, 512),
                       ks > 0);
      }
      wgmma_commit();
#pragma unroll
      for (int ks = 0; ks < DK / 16; ++ks) {
        const uint32_t on = (ks >> 1) * (BN * RB) + (ks & 1) * 32, om = (ks >> 1) * (BM * RB) + (ks & 1) * 32 + q0 * RB;
        wgmma_ss<0, 0>(Int<QH>(), Elem(), acc_dp, make_desc(sm.v(0) + on, 16, 512),
                       make_desc(sm.dout(s) + om, 16, 512), ks > 0);
      }
      wgmma_commit();
      wgmma_wait<1>();
      fence_acc(acc_s);

      // P^T (row = key j0 + 8 hf, column = query m * BM + q0 + nt * 8 + qc + e), then dS^T once dP^T is in
      const int no_bias_off[2][2] = {};  // (no staged tile here, no mask bits)
      const uint2 no_bits[2] = {};
      RowPairsInSmem lse, delta;
      lse.load(sm.lse(s), q0, qc);
      delta.load(sm.delta(s), q0, qc);
      p_from_scores<Elem, kTerms, BM, BN, NTQ>(acc_s, p, lse, 0, no_bias_off, key_ok, no_bits, b, h, m, t.n, j0, q0,
                                               qc);
      wgmma_wait<0>();
      fence_acc(acc_dp);
      ds_from_dp<NTQ>(acc_dp, acc_s, delta);
      if constexpr (kTerms == kBwdTermsGlobal)
        if (P.dbias_mode == kDbiasAtomic) dbias_atomic_add<BM, NTQ>(P, acc_dp, b, h, m, j0, lane, q0);

      uint32_t pf[NTQ / 2][4], dsf[NTQ / 2][4];
      {
        float (&s3)[1][NTQ][4] = reinterpret_cast<float (&)[1][NTQ][4]>(acc_s);
        float (&dp3)[1][NTQ][4] = reinterpret_cast<float (&)[1][NTQ][4]>(acc_dp);
        uint32_t (&pf3)[1][NTQ / 2][4] = reinterpret_cast<uint32_t (&)[1][NTQ / 2][4]>(pf);
        uint32_t (&dsf3)[1][NTQ / 2][4] = reinterpret_cast<uint32_t (&)[1][NTQ / 2][4]>(dsf);
        acc_to_afrag<Elem, 1, NTQ>(pf3, s3);
        acc_to_afrag<Elem, 1, NTQ>(dsf3, dp3);
      }
      // both warpgroups are done with the previous step's tiles (their GEMMs were waited on) and staging buffer
      if (dbias && it > 0 && P.dbias_bufs == 1 && issuer) bulk_wait_read<0>();
      if (it > 0) named_sync(kBarBwdTilesRead, 256);
      if (dbias && db16) {
        stage_dbias16<BM, NTQ>(st, dsf, q0, wi * 16, lane);
      } else if (dbias) {
#pragma unroll
        for (int nt = 0; nt < NTQ; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) sts_f32(st + stage_off[x >> 1][x & 1] + nt * 1024, acc_dp[nt][x]);
      }
      // this warpgroup's 32 query columns of P^T and dS^T (afrag register (hf, u): rows + 8 hf, chunk 2 ks + u)
#pragma unroll
      for (int ks = 0; ks < NTQ / 2; ++ks)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const uint32_t off = tile_chunk_offset<BN>(key_row + 8 * hf, 4 * cw + 2 * ks + u) + qc * 2;
            sts_u32(pt + off, pf[ks][2 * u + hf]);
            sts_u32(dst_t + off, dsf[ks][2 * u + hf]);
          }
      fence_view_async_shared();
      // two staging buffers: the previous tile's TMA has read the other one, which the next step writes
      if (dbias && P.dbias_bufs == 2 && issuer) bulk_wait_read<0>();
      named_sync(kBarBwdDsWritten, 256);
      if (dbias && issuer) {
        const int tb = b % P.db_period, th = P.db_heads > 1 ? h : 0, box_cols = db16 ? 64 : 32;
        for (int c = 0; c < BN / box_cols; ++c) {
          if (P.dbias_mode == kDbiasReduce)
            tma_reduce_add_4d(&P.tdb, st + c * BM * 128, t.n * BN + c * box_cols, m * BM, th, tb);
          else
            tma_store_4d(&P.tdb, st + c * BM * 128, t.n * BN + c * box_cols, m * BM, th, tb);
        }
        bulk_commit();
      }

      // dV[:, half] += P^T dO[:, half], dK[:, half] += dS^T Q[:, half] (k16 step ks: queries 16 ks ..)
      const uint32_t half_q = cw * (DH / 32) * (BM * RB);  // column block of the head-dim half in Q / dO
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks) {
        const uint32_t ao = (ks >> 1) * (BN * RB) + (ks & 1) * 32;
        wgmma_ss<0, 1>(Int<DH>(), Elem(), acc_dv, make_desc(pt + ao, 16, 512),
                       make_desc(sm.dout(s) + half_q + ks * 16 * RB, BM * RB, 512), 1);
        wgmma_ss<0, 1>(Int<DH>(), Elem(), acc_dk, make_desc(dst_t + ao, 16, 512),
                       make_desc(sm.q(s) + half_q + ks * 16 * RB, BM * RB, 512), 1);
      }
      wgmma_commit();

      // dQ[:, half] = dS K[:, half] in 64-column pieces, added to the fragment-order accumulator (ordered by key
      // block when deterministic)
      const int64_t tile = (int64_t(b) * p.H + h) * mblocks + m;
      float* dst = P.dq_acc + tile * (BM * DK) + int64_t((cw * 4 + wi) * (DK / 16)) * 128 + lane * 4;
      int* sem = deterministic ? P.dq_sems + tile : nullptr;
      int rank = 0;
#pragma unroll
      for (int piece = 0; piece < DH / DQN; ++piece) {
        float acc_dq[DQT][4];
        const uint32_t kb = sm.k(0) + (cw * (DH / 32) + piece * (DQN / 32)) * (BN * RB);
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks)
          wgmma_ss<1, 1>(Int<DQN>(), Elem(), acc_dq, make_desc(dst_t + ks * 16 * RB, BN * RB, 512),
                         make_desc(kb + ks * 16 * RB, BN * RB, 512), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc(acc_dq);
        if (piece == 0) {
          fence_acc(acc_dk);
          fence_acc(acc_dv);
          __syncwarp();
          if (lane == 0) mbar_arrive(sm.empty(s));  // Q, dO, lse and delta of this stage are read
          if (deterministic) rank = dq_turn_wait<BM, BN>(p, sem, m, t.n, issuer);
        }
        add_dq_ntiles<kDqSkipsPadding<DK>, DQT>(p.D - cw * DH - piece * DQN, acc_dq,
                                                [&](int nt) { return dst + (piece * DQT + nt) * 128; });
      }
      if (deterministic) dq_turn_pass(sem, rank, issuer);
    }
  }
  if (dbias && issuer) bulk_wait<0>();

  // dK = scale * dS^T Q, dV = P^T dO: rows = keys of this warp, columns = this warpgroup's half
  const int64_t kv_ss = int64_t(p.Hkv) * p.D, kv_sb = int64_t(p.Sk) * kv_ss;
  const int rows = p.Sk - (t.n * BN + wi * 16);
  const int64_t off = int64_t(t.b) * kv_sb + int64_t(t.n * BN + wi * 16) * kv_ss + int64_t(t.hkv) * p.D + cw * DH;
  float (&dk3)[1][DT][4] = reinterpret_cast<float (&)[1][DT][4]>(acc_dk);
  float (&dv3)[1][DT][4] = reinterpret_cast<float (&)[1][DT][4]>(acc_dv);
  store_acc_rows<Elem, 1, DT>(static_cast<Elem*>(p.dk) + off, kv_ss, dk3, p.scale, rows, p.D - cw * DH, lane);
  store_acc_rows<Elem, 1, DT>(static_cast<Elem*>(p.dv) + off, kv_ss, dv3, 1.f, rows, p.D - cw * DH, lane);
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
