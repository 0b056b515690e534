// Asynchronous-copy plumbing of the pipelined Hopper kernels (sm_90): mbarriers, TMA bulk tensor loads, cluster
// peers' shared memory, named barriers between warpgroups and `setmaxnreg`.
//
// Why hand-written PTX and not CuTe's TMA / pipeline classes: the sm90 kernels already speak raw wgmma descriptors
// over their own 64-byte-swizzled tile layout (tile_sm90.h), and TMA's SWIZZLE_64B writes exactly that layout, so
// these dozen instructions are all the kernels need. CuTe would bring its own layouts, and a translation unit that
// includes cute/ takes minutes per head dim on the 2-core CI machine (nvcc 13.0 compile times of the CUTLASS FMHA
// examples, measured there), where the whole variant is built as a test.
//
// Protocol of one pipeline stage (a "full" and an "empty" mbarrier per stage):
//   producer: wait empty[s] (skipped on the stage's first use) -> arrive.expect_tx(full[s], bytes) -> TMA loads
//             that complete_tx on full[s];
//   consumer: wait full[s] with the parity of the stage's use count -> read (wgmma) -> wait for the reads ->
//             one arrival per warp on empty[s].
#pragma once
#include <cstdint>

#include "../utils.h"

namespace winattn {
namespace cuda {
namespace sm90 {

// Barriers and shared-memory destinations are 32-bit shared-window addresses (smem_u32), so a kernel can keep one
// base register and compile-time offsets instead of a pointer per barrier.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes initialized barriers visible to the async proxy (TMA) and to the other threads (after a __syncthreads).
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// 4-D tile load [c0 (elements, innermost), c1, c2, c3] of a tensor map into shared memory, completing on bar.
// Coordinates past the tensor's extent read as zero (and still count towards the transaction bytes).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// Shared -> global tile writes through a tensor map (the box of the map; parts past the tensor's extent are
// dropped): a plain store, or an fp32 add into what is there (performed at L2, atomically per element).
// They join the issuing thread's bulk group: bulk_commit(), then bulk_wait_read<0>() before the shared source is
// rewritten and bulk_wait<0>() before the CTA exits.
__device__ __forceinline__ void tma_store_4d(const void* tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(tmap),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tma_reduce_add_4d(const void* tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          tmap),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four adjacent fp32 adds at L2 (p 16-byte aligned), fire and forget (no return value, no ordering).
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

__device__ __forceinline__ void tma_prefetch_desc(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
}

// The calling thread's warpgroup, read from lane 0 (the warp converged) so that the compiler knows it is the same in
// the whole warp: the addresses built from it (the warpgroup's tiles, hence every wgmma descriptor) then live in
// uniform registers, computed once per warp by the uniform datapath, where from threadIdx.x / 128 they were computed in
// each thread's registers and moved to uniform ones by 2 R2UR per descriptor before every wgmma (with desc_plus,
// tile_sm90.h: ~20% fewer instructions per backward step; taken where measured faster, bwd_uniform_desc).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) >> 7, 0); }

// Register budget per warpgroup (takes effect with a register cap at entry: __launch_bounds__(threads, 1)).
template <int N>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Thread-block clusters: one CTA writes into a peer's shared memory and signals the peer's mbarriers. Peer
// addresses are shared::cluster addresses of the same offsets (mapa).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster: after it, the peers' barriers are initialized (before any remote
// access) or no more remote accesses are in flight (before exit).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t peer_addr(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}
// 16 bytes into a peer's shared memory, completing 16 transaction bytes on the peer's mbarrier (both peer_addr).
__device__ __forceinline__ void st_async_f32x4(uint32_t remote, const float (&v)[4], uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   remote),
               "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

// Named barriers (ids 1..15; 0 is __syncthreads) between the threads of some warpgroups. Their ids, per kernel (ids
// are per CTA, so kernels reuse them); the wide-window backward numbers its per-chunk barriers itself
// (bwd_windows_wide_sm90.h: staged / freed).
enum NamedBarrier : int {
  // forward v3 (fwd_pipelined_sm90.h) and the backward where bwd_turns: consumer warpgroup cw may issue its GEMMs
  // (ping-pong, Turns), at kBarTurn + cw (1, 2)
  kBarTurn = 1,
  // ... and with P through shared memory (kPInSmem), warpgroup cw's P tile is written, at kBarFwdPWritten + cw
  kBarFwdPWritten = 4,
  // backward v3 (bwd_pipelined_sm90.h, bwd_split_d_sm90.h), the two consumer warpgroups (256 threads):
  kBarBwdDsWritten = 3,     // both warpgroups' dS^T (and dbias staging) are written
  kBarBwdDbiasRead = 4,     // one dbias buffer: the previous tile's TMA read of it is done
  kBarBwdDqTicket = 5,      // deterministic dQ: the ticket is ours / our adds are done
  kBarBwdTilesRead = 6,     // split head dim: both warpgroups are done with the previous step's tiles
  kBarBwdDsAnnounced = 7,   // deferred dQ: warpgroup cw's dS^T of a step, at kBarBwdDsAnnounced + 2 cw + parity
};
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// FA3's ping-pong (forward v3, and the backward where bwd_turns): the consumer warpgroups take turns issuing their
// GEMMs, round robin (named barrier kBarTurn + cw: "cw may issue"; ids the backward leaves free), so that the
// others' softmaxes run while one's wgmmas use the tensor cores. A barrier counts the 128 threads that wait on it and
// the 128 of the warpgroup before that arrive.
template <int kWGs>
struct Turns {
  int cw;
  __device__ __forceinline__ void mine() const { named_sync(kBarTurn + cw, 256); }
  __device__ __forceinline__ void pass() const {
    named_arrive(kBarTurn + (kWGs == 2 ? 1 - cw : (cw + 1) % kWGs), 256);
  }
  // on the CTA's first tile the last warpgroup hands the first turn to warpgroup 0 before either issues
  __device__ __forceinline__ void start(bool first_tile) const {
    if (cw == kWGs - 1 && first_tile) pass();
  }
  // the CTA's last hand-over of the last warpgroup is skipped: warpgroup 0 has no turn left to wait for it
  __device__ __forceinline__ void pass_unless_last(bool last) const {
    if (cw != kWGs - 1 || !last) pass();
  }
};

}  // namespace sm90
}  // namespace cuda
}  // namespace winattn
