// Hopper backward for wide windows (sm_90a): Swin windows of 65 .. 256 tokens (W9 .. W16), head dim 32, with the
// gradient of the additive term (the relative-position table's) summed on chip. The counterpart of the wide tiles
// of fwd_windows_sm90.h; windows of <= 64 tokens take bwd_windows_sm90.h.
//
// One CTA per (head, term period residue Pg, G windows), the whole window resident and double buffered (windows of
// more than 144 tokens: a cluster of four CTAs, one per 128 x 128 quarter, see "Split windows" below). Each of the
// kKeyBlocks warpgroups owns 64 of the window's keys and works in the transposed layout (rows = keys), walking the
// queries in chunks of kQChunk:
//   S^T = K_j Q_m^T, dP^T = V_j dO_m^T                 (SS, both K-major)
//   P^T = exp2(S^T * scale * log2e + term * log2e - lse2), dS^T = P^T (dP^T - delta)
//       (registers; delta = rowsum(dO * O) - dlse from the window's O tile (window_delta): a warpgroup sees 64 keys
//       of a row, so rowsum(P dP) is not at hand, and reading dO and O in a preprocess took 0.24 ms of 1.74 at W12)
//   dV_j += P^T dO_m, dK_j += dS^T Q_m                 (RS: the accumulators are the A fragments as they stand)
//   dQ_m = dS_m K                                      (SS, from the dS^T tiles all warpgroups stage in shared memory;
//                                                       warpgroup m computes chunk m's, behind a named barrier)
// Key padding zeroes P^T on the padded key rows (two flags per thread and window), a bool mask per window where its
// bits (KParams::mbits, transposed to rows = keys) are 0.
// Why not the v3 backward: the table gradient must stay deterministic, and v3 sums dbias with L2 reduce-adds over
// thousands of windows. Here dS^T summed over the CTA's windows stays in registers ([chunk][kQChunk / 8][4] per
// thread: the window's N x N spread over the CTA's register file, which bounds N, see the traits) until one flush to
// the CTA's partial slot [Sq][Sk], reduced in a fixed order afterwards like every window mode.
//
// Split windows (Tr::kSplit, 145 .. 256 tokens): the sums of a 256-token window (256 KB fp32) do not fit one SM, so
// CTA (qh, kh) of a four-CTA cluster runs the kernel above on query half qh and key half kh of every window of the
// work item (its quarter of the sums stays on chip, the four quarters share one partial slot). A query half's dQ is
// then the sum of two CTAs' parts, and so are a key half's dK and dV: the "home" CTA of each adds its peer's part,
// which the peer writes into the home's receive tile with st.async (completing on the home's `xfull` mbarrier; the
// home frees the tile by arriving on the peer's `xfree`). The diagonal CTAs (h, h) are the homes of query half h's
// dQ and key half h's dK / dV; the other two only send. So the waits run one way (senders -> homes) and a sender can
// run up to a window ahead. (Homes that each received one part and sent one formed a ring of waits that held all
// four CTAs in lock-step: 4.45 ms at W16, the waits a third of the samples.) Two fp32 terms sum the same in either
// order: deterministic.
#pragma once
#include "../block_info.h"
#include "../gemm.h"
#include "../kernel_params.h"
#include "../softmax.h"
#include "../tile_io.h"
#include "kernel_traits_sm90.h"
#include "pipeline_sm90.h"
#include "tensor_map_sm90.h"
#include "tile_sm90.h"
#include "window_terms.h"
#include "wgmma_ops.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// The kernel's arguments: the common ones, the TMA maps of Q, dO, O (boxes of kQueries rows) and K, V (kKeys
// rows), and lse2 from the v3 preprocess, padded per (b, h) to sq_pad = kQueries (one bulk copy).
struct BwdWideWindowParams {
  CUtensorMap tq, tdo, to, tk, tv;
  KParams p;
  const float* lse2 = nullptr;  // [B, H, sq_pad] lse * log2(e) (0 where lse = -inf), +inf past Sq
  int sq_pad = 0;
};

// 1-D bulk copy global -> shared (bytes and both addresses multiples of 16), completing on bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// kHide: what is hidden per window beyond the table (window_terms.h: WindowHiding; with mask bits, key padding is
// folded into the words read).
template <typename Tr, typename Elem, int kHide>
__global__ void __launch_bounds__(Tr::kNThreads, 1)
    bwd_windows_wide_kernel_sm90(const __grid_constant__ BwdWideWindowParams args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const KParams& p = args.p;
  constexpr bool kBits = kHide == kHideMaskBits, kPadding = kHide != kHideNothing;
  constexpr int NKB = Tr::kKeyBlocks, QC = Tr::kQChunk, NQC = Tr::kQChunks, NT = QC / 8;
  constexpr int KEYS = Tr::kKeys, QROWS = Tr::kQueries, DQK = Tr::kDqKeys, NTH = Tr::kNThreads;
  constexpr int SLOTS = Tr::kWarpSlots, RC = Tr::kRegChunks, RB = kSwizzleRowBytes;
  static_assert(NQC == NKB, "chunk m's dQ belongs to warpgroup m");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  // two window stages [Q | dO | K | V | lse2 | delta], one dS^T staging tile per warpgroup, the term table, the
  // dS sums of the chunks past RC, the O tile (one buffer: read into delta before the barrier after which the next
  // window's loads are issued)
  auto sQ = [&](int st) { return smem + st * Tr::kStageBytes; };
  auto sdO = [&](int st) { return sQ(st) + Tr::kQBytes; };
  auto sK = [&](int st) { return sdO(st) + Tr::kQBytes; };
  auto sV = [&](int st) { return sK(st) + Tr::kKVBytes; };
  auto sLse = [&](int st) { return reinterpret_cast<float*>(sV(st) + Tr::kKVBytes); };
  auto sDelta = [&](int st) { return sLse(st) + QROWS; };
  unsigned char* sDS = smem + 2 * Tr::kStageBytes;
  uint2* sTerm = reinterpret_cast<uint2*>(sDS + NKB * Tr::kDSBytes);
  const uint32_t db_a = smem_u32(sDS + NKB * Tr::kDSBytes + Tr::kTermBytes);
  unsigned char* sO = smem + Tr::kOOffset;

  constexpr bool kSplit = Tr::kSplit;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int qr = lane >> 2, qc = (lane & 3) * 2;
  const int slot = wg * 4 + warp, key0 = slot * 16;  // this warp's first key row
  const bool real = slot < SLOTS;                    // (else: padding keys only, nothing to compute or keep)
  // this CTA's quarter of a split window (rank = qh * 2 + kh; else the whole window), and its two peers
  const int rank = kSplit ? int(cluster_ctarank()) : 0, qh = rank >> 1, kh = rank & 1;
  const int q0 = qh * QROWS, k0 = kh * KEYS, work = kSplit ? blockIdx.x >> 2 : blockIdx.x;
  const bool home = !kSplit || qh == kh;
  const uint32_t dq_peer = qh * 2 + (kh ^ 1), kv_peer = (qh ^ 1) * 2 + kh;
  const Work w = decode_work(p, p.H, work);  // H == Hkv on this path
  const int h = w.hx;
  Elem* dq = static_cast<Elem*>(p.dq);
  Elem* dk = static_cast<Elem*>(p.dk);
  Elem* dv = static_cast<Elem*>(p.dv);
  const int64_t dq_ss = int64_t(p.H) * p.D, dq_sb = int64_t(p.Sq) * dq_ss;
  const int64_t dk_ss = int64_t(p.H) * p.D, dk_sb = int64_t(p.Sk) * dk_ss;

  // A window's tiles arrive by TMA on the stage's mbarrier, issued by one thread (cp.async by every thread took a
  // fifth of the kernel's instructions in address arithmetic, and its wait was the top stall). Rows past Sq / Sk
  // and columns past D read as zero.
  const uint32_t full_a = smem_u32(smem + Tr::kBarsOffset);  // two mbarriers, one per stage
  // split windows: xfull(i) / xfree(i) for part i of the exchange (0, 1: dQ chunks; 2: dK and dV), and the home's
  // receive tile ([4][128 threads] float4 per warpgroup part: dQ chunk m at recv + m * kPartBytes, then dK and dV
  // [tensor][warpgroup] at kv_recv). Waits are CTA-scope: the parts are transaction bytes of the mbarrier, as TMA's
  // are, and a home has read a part into registers before it frees the tile (at cluster scope each wait also
  // invalidated L1: CCTL.IVALL).
  auto xfull = [&](int i) { return full_a + 16 + i * 8; };
  auto xfree = [&](int i) { return full_a + 40 + i * 8; };
  const uint32_t recv = smem_u32(smem + Tr::kRecvOffset), kv_recv = recv + NQC * Tr::kPartBytes;
  const int wtid = tid & 127;
  auto send_part = [&](uint32_t dst, const float (&acc)[4][4], int part, uint32_t peer) {
    const uint32_t to = peer_addr(dst, peer), bar = peer_addr(xfull(part), peer);
#pragma unroll
    for (int j = 0; j < 4; ++j) st_async_f32x4(to + (j * 128 + wtid) * 16, acc[j], bar);
  };
  auto add_part = [&](uint32_t src, float (&acc)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = lds_f32x4(src + (j * 128 + wtid) * 16);
      acc[j][0] += v.x, acc[j][1] += v.y, acc[j][2] += v.z, acc[j][3] += v.w;
    }
  };
  auto issue_window = [&](int b, int st) {
    const uint32_t bar = full_a + st * 8;
    mbar_arrive_expect_tx(bar, 3 * Tr::kQBytes + 2 * Tr::kKVBytes + QROWS * 4);
    tma_load_4d(smem_u32(sQ(st)), &args.tq, bar, 0, q0, h, b);
    tma_load_4d(smem_u32(sdO(st)), &args.tdo, bar, 0, q0, h, b);
    tma_load_4d(smem_u32(sO), &args.to, bar, 0, q0, h, b);
    tma_load_4d(smem_u32(sK(st)), &args.tk, bar, 0, k0, h, b);
    tma_load_4d(smem_u32(sV(st)), &args.tv, bar, 0, k0, h, b);
    const int64_t row0 = (int64_t(b) * p.H + h) * Tr::kWindow + q0;
    bulk_load(smem_u32(sLse(st)), args.lse2 + row0, QROWS * 4, bar);
  };
  if (tid == 0) {
    mbar_init(full_a, 1);
    mbar_init(full_a + 8, 1);
    if (kSplit) {
      for (int i = 0; i < 3; ++i) {
        mbar_init(xfull(i), 1);                  // the home's expect_tx; the peer's bytes
        mbar_init(xfree(i), i < 2 ? 4 : 4 * NKB);  // one arrival per home warp that read the part
      }
    }
    mbar_fence_init();
  }
  if constexpr (kSplit)
    cluster_sync();  // the peers' barriers are initialized before anyone signals them
  else
    __syncthreads();
  if (tid == 0) issue_window(w.batch(p, 0), 0);

  // delta = rowsum(dO * O) - dlse of the window in stage st, from its landed dO and O tiles: four threads per row,
  // one 16-byte chunk each (rows past Sq read zeros), `n` threads from thread 0 (a multiple of 32: whole quads).
  // Window 0's is computed here by all; window t + 1's at the end of window t by the warpgroups that do not own the
  // last chunk's dQ (they finish first), so it stays off the critical path.
  auto window_delta = [&](int b, int st, int n) {
    for (int task = tid; task < QROWS * 4; task += n) {
      const int r = task >> 2, off = tile_chunk_offset<QROWS>(r, task & 3);
      const float4 x = lds_f32x4(smem_u32(sdO(st)) + off), y = lds_f32x4(smem_u32(sO) + off);  // (raw 16-bit pairs)
      const uint32_t xs[4] = {__float_as_uint(x.x), __float_as_uint(x.y), __float_as_uint(x.z), __float_as_uint(x.w)};
      const uint32_t ys[4] = {__float_as_uint(y.x), __float_as_uint(y.y), __float_as_uint(y.z), __float_as_uint(y.w)};
      float acc = 0.f;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float2 fx = ElemTraits<Elem>::unpack(xs[u]), fy = ElemTraits<Elem>::unpack(ys[u]);
        acc = fmaf(fx.x, fy.x, fmaf(fx.y, fy.y, acc));
      }
      acc = quad_sum(acc);
      if ((task & 3) == 0) {
        if (p.dlse != nullptr && q0 + r < p.Sq) acc -= p.dlse[(int64_t(b) * p.H + h) * p.Sq + q0 + r];
        sts_f32(smem_u32(sDelta(st) + r), acc);
      }
    }
  };
  mbar_wait(full_a, 0);
  window_delta(w.batch(p, 0), 0, NTH);

  // the term is the same for every window of the CTA; each thread builds (and later reads) only its own entries
  const uint32_t term = smem_u32(sTerm + slot * NQC * NT * 32);
  if (real) build_term_table_keys<NQC, QC>(sTerm + slot * NQC * NT * 32, p, w.batch(p, 0), h, k0 + key0, q0, lane);

  // dS^T summed over this CTA's windows (fp32, before rounding): chunk m < RC in registers, the rest in shared
  // memory at db_at(m, nt) (m, nt are compile-time in the unrolled loops, so each branch below resolves statically)
  float acc_db[RC][NT][4];
  auto db_at = [&](int m, int nt) { return db_a + ((((m - RC) * NT + nt) * SLOTS + slot) * 32 + lane) * 16; };
#pragma unroll
  for (int m = 0; m < NQC; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float z[4] = {0.f, 0.f, 0.f, 0.f};
      if (m < RC) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_db[m < RC ? m : 0][nt][e] = 0.f;
      } else if (real) {
        sts_f32x4(db_at(m, nt), z);
      }
    }

  // The dS^T exchange, without a CTA-wide barrier per chunk: every warpgroup writes its 64 rows of the staging
  // tile of chunk m, then arrives at staged(m); warpgroup m waits there, computes dQ_m and arrives at freed(m);
  // the others wait at freed(m) before writing that tile again, one window later. So the warpgroups drift apart
  // (one's softmax overlaps another's MMAs) instead of moving in lock-step.
  auto staged = [](int m) { return 1 + m; };
  auto freed = [](int m) { return 1 + NKB + m; };

  // key padding of this thread's two key rows (qr, qr + 8 of the warp's 16; rows past Sk are hidden by the term
  // table), fetched a window ahead
  bool kept_next[2] = {true, true};
  auto fetch_kept_rows = [&](int b) {
    const unsigned char* row = reinterpret_cast<const unsigned char*>(p.kp) + int64_t(b) * p.kp_sb;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int key = k0 + key0 + qr + x * 8;
      kept_next[x] = key >= p.Sk || __ldg(row + int64_t(key) * p.kp_sk) != 0;
    }
  };
  if (kPadding && p.kp != nullptr && real) fetch_kept_rows(w.batch(p, 0));

  for (int t = 0; t < w.nitems; ++t) {
    const int b = w.batch(p, t), st = t & 1;
    mbar_wait(full_a + st * 8, (t >> 1) & 1);  // window t landed (its delta is in: see window_delta)
    __syncthreads();  // every warpgroup is done with window t - 1 (stage st ^ 1) and with O
    if (tid == 0 && t + 1 < w.nitems) issue_window(w.batch(p, t + 1), st ^ 1);
    const uint32_t q_a = smem_u32(sQ(st)), do_a = smem_u32(sdO(st)), k_all = smem_u32(sK(st));
    const uint32_t k_a = k_all + wg * 64 * RB, v_a = smem_u32(sV(st)) + wg * 64 * RB;
    const uint32_t lse_a = smem_u32(sLse(st)), delta_a = smem_u32(sDelta(st));

    // key padding: window t's flags of this thread's rows, then window t + 1's fetch (without mask bits: off the
    // padded rows a per-thread flag skips the zeroing)
    const bool kept[2] = {kept_next[0], kept_next[1]};
    const bool pad_rows = !(kept[0] && kept[1]);
    if (kPadding && p.kp != nullptr && real && t + 1 < w.nitems) fetch_kept_rows(w.batch(p, t + 1));

    float acc_dk[1][4][4], acc_dv[1][4][4];
#pragma unroll
    for (int m = 0; m < NQC; ++m) {
      // kBits: chunk m's mask words (loaded now, used after the MMAs; transposed bits, a row's words run over the
      // queries; 0 on a padded key), shifted by qc: query column nt * 8 + qc + e of the chunk is then bit
      // (m QC + nt * 8) % 32 + e of word (m QC + nt * 8) / 32 - m QC / 32 (the row address is recomputed per chunk:
      // kept live across the chunks it spilled the 144-token instance)
      uint32_t mw[2][2] = {{~0u, ~0u}, {~0u, ~0u}};
      if constexpr (kBits) {
        const int key = k0 + key0 + qr;  // row x = 0 (x = 1: 8 rows on); rows past Sk have no bits
        const uint32_t* row0 = p.mbits + ((int64_t(b % p.mb_period) * p.mb_heads + (p.mb_heads > 1 ? h : 0)) *
                                              p.mb_rows + key) * p.mb_words + (q0 + m * QC) / 32;
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int i = 0; i < 2; ++i)  // (in this CTA's queries; the rows hold Tr::kWindow / 32 words)
            mw[x][i] = !kept[x] ? 0u : key + 8 * x < p.Sk ? __ldg(row0 + 8 * x * p.mb_words + i) >> qc : ~0u;
      }

      // S^T = K_j Q_m^T and dP^T = V_j dO_m^T (head dim 32: two k16 steps within the 64-byte rows)
      float acc_s[1][NT][4], acc_dp[1][NT][4];
      const uint32_t qm = m * QC * RB;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        wgmma_ss<0, 0>(Int<QC>(), Elem(), acc_s[0], make_desc(k_a + ks * 32, 16, 512),
                       make_desc(q_a + qm + ks * 32, 16, 512), ks > 0);
        wgmma_ss<0, 0>(Int<QC>(), Elem(), acc_dp[0], make_desc(v_a + ks * 32, 16, 512),
                       make_desc(do_a + qm + ks * 32, 16, 512), ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(acc_s[0]);
      fence_acc(acc_dp[0]);

      // P^T and dS^T in place (columns = queries: lse2 / delta per column pair), dS^T into the window sums
      if (real) {
        apply_term_table<NT, true, 32, kHide == kHideFoldedMask>(acc_s[0], term + m * NT * 32 * 8, p.scale_log2,
                                                                  lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int c = m * QC + nt * 8 + qc;
          const float2 l2 = lds_f32x2(lse_a + c * 4), dl = lds_f32x2(delta_a + c * 4);
          const int cc = m * QC + nt * 8;  // (compile-time in the unrolled loops)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float pv = fast_exp2(acc_s[0][nt][e] - ((e & 1) ? l2.y : l2.x));
            if constexpr (kBits)
              if (!((mw[e >> 1][(cc >> 5) - ((m * QC) >> 5)] >> ((cc & 31) + (e & 1))) & 1u)) pv = 0.f;
            acc_s[0][nt][e] = pv;
            acc_dp[0][nt][e] = pv * (acc_dp[0][nt][e] - ((e & 1) ? dl.y : dl.x));
          }
          if constexpr (kHide == kHidePaddedKeys || kHide == kHideFoldedMask) {
            if (pad_rows) {
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (!kept[e >> 1]) acc_s[0][nt][e] = acc_dp[0][nt][e] = 0.f;
            }
          }
          if (m < RC) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_db[m < RC ? m : 0][nt][e] += acc_dp[0][nt][e];
          } else {
            const float4 o = lds_f32x4(db_at(m, nt));
            const float sum[4] = {o.x + acc_dp[0][nt][0], o.y + acc_dp[0][nt][1], o.z + acc_dp[0][nt][2],
                                  o.w + acc_dp[0][nt][3]};
            sts_f32x4(db_at(m, nt), sum);
          }
        }
      }
      uint32_t pf[1][NT / 2][4], dsf[1][NT / 2][4];
      acc_to_afrag<Elem, 1, NT>(pf, acc_s);
      acc_to_afrag<Elem, 1, NT>(dsf, acc_dp);

      // dV_j += P^T dO_m, dK_j += dS^T Q_m (B: the chunk's rows of dO / Q, N-major)
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < QC / 16; ++ks) {
        const uint32_t off = qm + ks * 16 * RB;
        wgmma_rs<1>(Int<32>(), Elem(), acc_dv[0], pf[0][ks], make_desc(do_a + off, QROWS * RB, 512), m + ks > 0);
        wgmma_rs<1>(Int<32>(), Elem(), acc_dk[0], dsf[0][ks], make_desc(q_a + off, QROWS * RB, 512), m + ks > 0);
      }
      wgmma_commit();

      // dS^T -> chunk m's staging tile (rows = keys, 64 query columns), from the packed A fragments: register x
      // of pair kk holds row qr + 8 (x & 1) of column tile 2 kk + (x >> 1)
      const uint32_t ds_a = smem_u32(sDS) + m * Tr::kDSBytes;
      const bool owner = wg == m;
      if (!owner && t > 0) named_sync(freed(m), NTH);  // warpgroup m has read the tile (previous window)
      if (real) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int r = key0 + qr + (x & 1) * 8;
#pragma unroll
          for (int kk = 0; kk < NT / 2; ++kk)
            sts_u32(ds_a + tile_chunk_offset<DQK>(r, 2 * kk + (x >> 1)) + qc * 2, dsf[0][kk][x]);
        }
      }
      fence_view_async_shared();
      if (owner) {
        named_sync(staged(m), NTH);
        // dQ_m = dS_m K over the window's keys (A = the staging tile read transposed, B = K N-major)
        float acc_dq[1][4][4];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < DQK / 16; ++ks)
          wgmma_ss<1, 1>(Int<32>(), Elem(), acc_dq[0], make_desc(ds_a + ks * 16 * RB, DQK * RB, 512),
                         make_desc(k_all + ks * 16 * RB, KEYS * RB, 512), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc(acc_dq[0]);
        if (t + 1 < w.nitems) named_arrive(freed(m), NTH);
        if (kSplit && home) {  // + the peer's part (the other key half)
          if (wtid == 0) mbar_arrive_expect_tx(xfull(m), Tr::kPartBytes);
          mbar_wait(xfull(m), t & 1);
          add_part(recv + m * Tr::kPartBytes, acc_dq[0]);
          __syncwarp();
          if (lane == 0 && t + 1 < w.nitems) mbar_arrive_remote(peer_addr(xfree(m), dq_peer));
        } else if (kSplit) {  // -> the home, once it has read the previous window's
          if (t > 0) mbar_wait(xfree(m), (t - 1) & 1);
          send_part(recv + m * Tr::kPartBytes, acc_dq[0], m, dq_peer);
        }
        if (home)
          store_acc_rows<Elem, 1, 4>(
              dq + int64_t(b) * dq_sb + int64_t(q0 + m * QC + warp * 16) * dq_ss + int64_t(h) * p.D, dq_ss, acc_dq,
              p.scale, min(QC, p.Sq - q0 - m * QC) - warp * 16, p.D, lane);
      } else {
        named_arrive(staged(m), NTH);
        wgmma_wait<0>();
      }
      fence_frag(pf[0]);
      fence_frag(dsf[0]);
      fence_acc(acc_dk[0]);
      fence_acc(acc_dv[0]);
    }

    if (kSplit && home) {  // + the peer's parts (the other query half)
      if (tid == 0) mbar_arrive_expect_tx(xfull(2), 2 * NKB * Tr::kPartBytes);
      mbar_wait(xfull(2), t & 1);
      add_part(kv_recv + wg * Tr::kPartBytes, acc_dk[0]);
      add_part(kv_recv + (NKB + wg) * Tr::kPartBytes, acc_dv[0]);
      __syncwarp();
      if (lane == 0 && t + 1 < w.nitems) mbar_arrive_remote(peer_addr(xfree(2), kv_peer));
    } else if (kSplit) {
      if (t > 0) mbar_wait(xfree(2), (t - 1) & 1);
      send_part(kv_recv + wg * Tr::kPartBytes, acc_dk[0], 2, kv_peer);
      send_part(kv_recv + (NKB + wg) * Tr::kPartBytes, acc_dv[0], 2, kv_peer);
    }
    if (home) {
      const int64_t kv_off = int64_t(b) * dk_sb + int64_t(k0 + key0) * dk_ss + int64_t(h) * p.D;
      store_acc_rows<Elem, 1, 4>(dk + kv_off, dk_ss, acc_dk, p.scale, p.Sk - k0 - key0, p.D, lane);
      store_acc_rows<Elem, 1, 4>(dv + kv_off, dk_ss, acc_dv, 1.f, p.Sk - k0 - key0, p.D, lane);
    }
    if (wg < NKB - 1 && t + 1 < w.nitems) {
      mbar_wait(full_a + (st ^ 1) * 8, ((t + 1) >> 1) & 1);
      window_delta(w.batch(p, t + 1), st ^ 1, (NKB - 1) * 128);
    }
  }

  // this CTA's summed dS -> its partial slot [Sq][Sk]: the register chunks join the shared ones in the same
  // [chunk][nt][warp slot][lane] order (over the staging tiles and the term table, free now), then the slot is
  // written in coalesced rows (from the fragments, the transposed layout would scatter 4-byte stores).
  if (p.partials != nullptr) {
    const uint32_t reg_a = smem_u32(sDS);
    auto at = [&](int m, int nt, int s, int l) {
      return m < RC ? reg_a + (((m * NT + nt) * SLOTS + s) * 32 + l) * 16
                    : db_a + ((((m - RC) * NT + nt) * SLOTS + s) * 32 + l) * 16;
    };
    static_assert(RC * NT * SLOTS * 32 * 16 <= NKB * Tr::kDSBytes + Tr::kTermBytes, "register sums fit there");
    __syncthreads();  // the last dQ GEMMs have read their staging tiles
    if (real) {
#pragma unroll
      for (int m = 0; m < RC; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) sts_f32x4(at(m, nt, slot, lane), acc_db[m][nt]);
    }
    __syncthreads();
    // (a split window's CTA: its quarter of the work item's slot)
    const int rows = min(QROWS, p.Sq - q0), cols = min(KEYS, p.Sk - k0);
    float* dst = p.partials + int64_t(work) * p.Sq * p.Sk + int64_t(q0) * p.Sk + k0;
    for (int idx = tid; idx < rows * cols; idx += NTH) {
      const int qq = idx / cols, kk = idx % cols;
      // the warp slot, lane and element that held (key kk, query qq) in the S^T accumulator layout
      const int c8 = qq % 8, e = ((kk >> 3) & 1) * 2 + (c8 & 1);
      dst[int64_t(qq) * p.Sk + kk] = lds_f32(at(qq / QC, (qq % QC) / 8, kk >> 4, (kk & 7) * 4 + c8 / 2) + e * 4);
    }
  }
  if constexpr (kSplit) cluster_sync();  // no peer signals or writes this CTA's shared memory any more
#else
  __trap();  // built without sm_90a code: the planner never launches this kernel (bwd_windows_wide_sm90_smem)
#endif
}

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
