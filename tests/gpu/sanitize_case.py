"""Small fwd+bwd cases covering every kernel path, run under compute-sanitizer (memcheck, racecheck) by
scripts/gpu_check.sh. Not a pytest module: `python tests/gpu/sanitize_case.py <variant dir> [memcheck|racecheck]`
(the tool's name is informational: every case runs under both)."""

import os
import sys
from pathlib import Path

import torch


def main():
    from kernels import get_local_kernel

    kern = get_local_kernel(Path(sys.argv[1]))
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16

    def r(*s, grad=True):
        return torch.randn(*s, device=dev, dtype=dt).requires_grad_(grad)

    # 1. dense broadcast bias over batch (ordered dBias), several key blocks (dq accumulator), deterministic
    for det in (False, True):
        q, k, v = r(2, 100, 2, 64), r(2, 150, 2, 64), r(2, 150, 2, 64)
        b = r(1, 2, 100, 150)
        out = kern.attention(q, k, v, bias=b, causal=True, deterministic=det)
        out.sum().backward()
    # 1b. the v3 forward's dynamic schedule (band calls on Hopper): 144 causal tiles of 1-3 key blocks, so some CTAs
    #     take a second tile from the counter through the mailbox (fwd_pipelined_sm90.h post_tile / take_tile)
    q, k, v = r(2, 300, 24, 64, grad=False), r(2, 300, 8, 64, grad=False), r(2, 300, 8, 64, grad=False)
    kern.attention(q, k, v, causal=True)
    # 2. GQA + masks + key padding + row-broadcast bias (expanded intermediate) + window
    q, k, v = r(2, 70, 4, 40), r(2, 90, 2, 40), r(2, 90, 2, 40)
    b = r(2, 1, 70, 1)
    m = torch.rand(2, 1, 70, 90, device=dev) > 0.3
    kp = torch.rand(2, 90, device=dev) > 0.2
    out = kern.attention(q, k, v, bias=b, mask=m, key_padding_mask=kp, window=(30, 10), deterministic=True)
    out.sum().backward()
    # 3. Swin window mode (forced 3 windows per CTA) with table and shift mask, and the G = 1 path
    for g in ("3", "1"):
        os.environ["WINATTN_BWD_G"] = g
        os.environ["WINATTN_FWD_G"] = g
        N, H = 49, 2
        q, k, v = r(8, N, H, 32), r(8, N, H, 32), r(8, N, H, 32)
        table = torch.randn(169, H, device=dev).requires_grad_(True)
        index = torch.randint(0, 169, (N, N), device=dev)
        mask = torch.where(torch.rand(4, N, N, device=dev) > 0.5, 0.0, -100.0)
        out = kern.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask)
        out.sum().backward()
    # 4. wide windows (sm90 window forward, key blocks 128 / 160 / 256, several query tiles; the wide-window
    # backward at N = 81 / 100 / 144 / 196 / 256 with 3 windows per CTA: its named-barrier dS^T exchange, TMA stages
    # and, past 144, the cluster's st.async exchange), table + shift mask, then key padding and bool masks
    os.environ["WINATTN_BWD_G"] = "3"
    for N in (81, 100, 144, 196, 256):
        q, k, v = r(8, N, 2, 32), r(8, N, 2, 32), r(8, N, 2, 32)
        table = torch.randn(961, 2, device=dev).requires_grad_(True)
        index = torch.randint(0, 961, (N, N), device=dev)
        mask = torch.where(torch.rand(2, N, N, device=dev) > 0.5, 0.0, -100.0)
        out = kern.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask)
        out.sum().backward()
        # the same tiles with key padding (word / byte reads, the backward's row flags) and a shared bool mask
        # folded into the term
        kp = torch.rand(8, N, device=dev) > 0.2
        shared = torch.rand(1, 1, N, N, device=dev) > 0.2
        kern.attention(q, k, v, bias=r(1, 2, N, N), key_padding_mask=kp, mask=shared).sum().backward()
        # a bool mask per window (read as bits: the TMA-staged words, the backward's transposed ones), as a strided
        # view (the bits pass's byte loads) and with key padding
        per_window = (torch.rand(8, 1, N, 2 * N + 1, device=dev) > 0.2)[..., 1::2]
        kern.attention(q, k, v, bias=r(1, 2, N, N), key_padding_mask=kp, mask=per_window).sum().backward()
    os.environ.pop("WINATTN_BWD_G")
    os.environ.pop("WINATTN_FWD_G")
    # 5. large head dims
    for D in (128, 256):
        q, k, v = r(1, 80, 2, D), r(1, 80, 2, D), r(1, 80, 2, D)
        out = kern.attention(q, k, v, bias=r(1, 2, 80, 80))
        out.sum().backward()
    # 6. forward v3 (Hopper): key padding as bits (causal; with a row term too) and as the raw path's per-block vote
    #    (the wide tile, forced), the staged bias tile (with key padding too), and more tiles than SMs (the persistent
    #    loop reuses the stage ring and Q across tiles)
    with torch.no_grad():
        for D in (64, 128):
            q, k, v = r(2, 300, 2, D, grad=False), r(2, 420, 2, D, grad=False), r(2, 420, 2, D, grad=False)
            kp = torch.rand(2, 420, device=dev) > 0.2
            kern.attention(q, k, v, key_padding_mask=kp, causal=True)
            kern.attention(q, k, v, bias=torch.randn(2, 2, 1, 420, device=dev), key_padding_mask=kp)
            os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_wide"
            kern.attention(q, k, v, key_padding_mask=kp, causal=True)
            os.environ.pop("WINATTN_FORCE_KERNEL")
            kern.attention(q, k, v, bias=r(1, 2, 300, 420, grad=False))
            # the staged tile with key padding as bits beside it (its row warp's slot in the mbarriers' kilobyte)
            kern.attention(q, k, v, bias=r(1, 2, 300, 420, grad=False), key_padding_mask=kp)
            # terms broadcast over the queries (the row term, staged per key block by a producer warp): a 0 / -inf
            # bf16 key mask, an fp32 row per head
            keep = torch.rand(2, 1, 1, 420, device=dev) > 0.2
            kern.attention(q, k, v, bias=torch.zeros(keep.shape, device=dev, dtype=dt).masked_fill(~keep, -torch.inf))
            kern.attention(q, k, v, bias=torch.randn(2, 2, 1, 420, device=dev))
        q = r(1, 128 * 40, 8, 64, grad=False)  # 320 tiles
        kern.attention(q, q, q)
        kern.attention(q, q, q, bias=torch.randn(1, 8, 1, 128 * 40, device=dev))
    # 7. backward v3 (Hopper): 3-stage raw path with key padding + causal + GQA, the staged bias with dbias by TMA
    #    reduce-add (broadcast over heads), pair mode ([1, H, S, S] with B = 2: plain store), deterministic tickets
    for D in (64, 128):
        q, k, v = r(2, 300, 4, D), r(2, 424, 2, D), r(2, 424, 2, D)
        kp = torch.rand(2, 424, device=dev) > 0.2
        kern.attention(q, k, v, key_padding_mask=kp, causal=True).sum().backward()
        q, k, v = r(2, 300, 2, D), r(2, 424, 2, D), r(2, 424, 2, D)
        for bias, det in ((r(2, 1, 300, 424), False), (r(1, 2, 300, 424), False), (r(1, 2, 300, 424), True)):
            kern.attention(q, k, v, bias=bias, deterministic=det).sum().backward()
    #    the global-memory terms (bool mask, a row-broadcast fp32 bias with dbias by atomics), the 16-bit dbias store,
    #    and the split head-dim consumer (D = 256 with a mask, deterministic, dbias fp32 and 16-bit)
    for D in (64, 256):
        q, k, v = r(2, 300, 2, D), r(2, 424, 2, D), r(2, 424, 2, D)
        mask = torch.rand(2, 1, 300, 424, device=dev) > 0.3
        kern.attention(q, k, v, mask=mask, causal=True).sum().backward()
        row_bias = torch.randn(2, 2, 1, 424, device=dev, requires_grad=True)
        kern.attention(q, k, v, bias=row_bias).sum().backward()
        for bias, det in ((r(2, 2, 300, 424), False), (r(1, 2, 300, 424), True)):
            kern.attention(q, k, v, bias=bias, deterministic=det).sum().backward()
    # 8. split-KV decode (fwd_decode.h, <= 16 query rows per KV head; forced: on Hopper the table takes the TMA
    #    kernel of section 10): one split and several (the combine step), keys past the last tile, no terms / key
    #    padding alone / every term, D = 64 / 128 / 256, 16 rows
    os.environ["WINATTN_FORCE_KERNEL"] = "fwd_decode"
    for D, Sk in ((64, 100), (128, 3000), (256, 777)):
        q, k, v = r(3, 1, 8, D, grad=False), r(3, Sk, 2, D, grad=False), r(3, Sk, 2, D, grad=False)
        kern.attention(q, k, v)
        kp = torch.rand(3, Sk, device=dev) > 0.3
        kern.attention(q, k, v, key_padding_mask=kp)
        kern.attention(q, k, v, key_padding_mask=kp, bias=r(3, 8, 1, Sk, grad=False), causal=True)
    q, k, v = r(2, 4, 32, 128, grad=False), r(2, 2000, 8, 128, grad=False), r(2, 2000, 8, 128, grad=False)
    kern.attention(q, k, v, causal=True)
    os.environ.pop("WINATTN_FORCE_KERNEL")
    # 9. streamed tiles (WINATTN_FORCE_KERNEL): forward v3's key blocks sized to short key sets (80 / 128 keys at
    #    D = 64 / 96, the table's choice; 208 at D = 64, forced only; more tiles than SMs: the cross-tile pipeline;
    #    key padding, causal, a row term, mask bits), and the backward's mask bits (a bool mask per score as
    #    transposed bits, the table's choice; partial query words, GQA, a band)
    os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_short"
    with torch.no_grad():
        for D, Sq, Sk in ((64, 2000, 77), (72, 300, 80), (72, 1100, 120), (64, 197, 197)):
            q, k, v = r(4, Sq, 4, D, grad=False), r(4, Sk, 2, D, grad=False), r(4, Sk, 2, D, grad=False)
            kern.attention(q, k, v)
            kern.attention(q, k, v, key_padding_mask=torch.rand(4, Sk, device=dev) > 0.2)
            if Sq == Sk:
                kern.attention(q, k, v, causal=True)
        # the 128-key tile with a row term (staged by a producer warp, as the key padding at 120 keys above) and
        # with mask bits
        q, k, v = r(4, 1100, 4, 72, grad=False), r(4, 120, 2, 72, grad=False), r(4, 120, 2, 72, grad=False)
        kern.attention(q, k, v, bias=torch.randn(4, 1, 1, 120, device=dev, dtype=dt))
        kern.attention(q, k, v, mask=torch.rand(4, 4, 1100, 120, device=dev) > 0.3)
    #    streamed tiles of several key blocks (persistent: tiles of different lengths, empty ones between)
    os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_stream,fwd_v3_persistent"
    with torch.no_grad():
        for D in (64, 128):
            q, k, v = r(4, 1100, 4, D, grad=False), r(4, 700, 2, D, grad=False), r(4, 700, 2, D, grad=False)
            kern.attention(q, k, v, key_padding_mask=torch.rand(4, 700, device=dev) > 0.2)
            kern.attention(q, k, v, window=(60, 60))
    #    the two-CTA tile (64-key blocks, two CTAs per SM; persistent over more tiles than its grid, key padding, a
    #    band, GQA); at head dim 72 its 96 instance's 32-key blocks
    os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_two_ctas"
    with torch.no_grad():
        for D in (64, 72):
            q, k, v = r(8, 1100, 4, D, grad=False), r(8, 333, 2, D, grad=False), r(8, 333, 2, D, grad=False)
            kern.attention(q, k, v, key_padding_mask=torch.rand(8, 333, device=dev) > 0.2)
            kern.attention(q, k, v, window=(60, 60))
    #    the two-CTA tile with the staged term (a BEiT-shaped bias over the batch, fp32 recast first; a per-item one),
    #    and the same with its last key block cut to the sequence end
    for force in ("fwd_v3_two_ctas", "fwd_v3_ragged"):
        os.environ["WINATTN_FORCE_KERNEL"] = force
        with torch.no_grad():
            q, k, v = r(8, 197, 4, 64, grad=False), r(8, 197, 4, 64, grad=False), r(8, 197, 4, 64, grad=False)
            kern.attention(q, k, v, bias=torch.randn(1, 4, 197, 197, device=dev))
            kern.attention(q, k, v, bias=torch.randn(8, 4, 197, 197, device=dev, dtype=dt))
    #    the two-CTA tile with a ragged last key block (16 / 32 / 48 keys of 64; key padding, a band, GQA)
    os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_ragged"
    with torch.no_grad():
        for Sk in (197, 224, 176):
            q, k, v = r(8, 300, 4, 64, grad=False), r(8, Sk, 2, 64, grad=False), r(8, Sk, 2, 64, grad=False)
            kern.attention(q, k, v, key_padding_mask=torch.rand(8, Sk, device=dev) > 0.2)
            kern.attention(q, k, v, window=(60, 60))
    #    the 192-row tile (three consumer warpgroups; persistent over more tiles than its grid, key padding, a band,
    #    GQA, a last tile of 140 rows); at head dim 72 its 96 instance (P through shared memory), at 40 its 48 one
    for D in (64, 72, 40):
        os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_rows192"
        with torch.no_grad():
            q, k, v = r(8, 1100, 4, D, grad=False), r(8, 333, 2, D, grad=False), r(8, 333, 2, D, grad=False)
            kern.attention(q, k, v, key_padding_mask=torch.rand(8, 333, device=dev) > 0.2)
            kern.attention(q, k, v, window=(60, 60))
            #    persistent with a band: a CTA's first tiles see no key (the first hand-over on a later tile, the last
            #    one's look-ahead past empty tiles)
            os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_rows192,fwd_v3_persistent"
            kern.attention(q, k, v, window=(60, 60))
            #    a last tile whose second and third warpgroups have no row below Sq (577 = 3 x 192 + 1: they
            #    compute padding rows the epilogue does not store), a CTA's next tile after it
            kern.attention(r(8, 577, 8, D, grad=False), k, v)  # (GQA 8 / 2: 256 tiles on 132 CTAs)
    #    the 16-column instances (head dims 48 / 80): the raw path with a causal band, the short key block, the staged
    #    bias tile, a float row term, mask bits, the two-CTA tile at 48
    os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_fine_dims"
    with torch.no_grad():
        for D in (40, 72):
            q, k, v = r(3, 700, 4, D, grad=False), r(3, 333, 2, D, grad=False), r(3, 333, 2, D, grad=False)
            kern.attention(q, k, v, causal=True)
            kern.attention(q, k[:, :77], v[:, :77])
            kern.attention(q, k, v, bias=r(1, 4, 700, 333, grad=False))
            kern.attention(q, k, v, bias=torch.where(torch.rand(3, 1, 1, 333, device=dev) > 0.2, 0.0,
                                                     float("-inf")).to(dt))
            kern.attention(q, k, v, mask=torch.rand(3, 4, 700, 333, device=dev) > 0.3)
        q, k, v = r(8, 197, 4, 40, grad=False), r(8, 197, 4, 40, grad=False), r(8, 197, 4, 40, grad=False)
        kern.attention(q, k, v)
        os.environ["WINATTN_FORCE_KERNEL"] = "fwd_v3_fine_dims,fwd_v3_persistent"
        q, k, v = r(8, 1100, 4, 40, grad=False), r(8, 333, 2, 40, grad=False), r(8, 333, 2, 40, grad=False)
        kern.attention(q, k, v, window=(60, 60))
    #    the backward's 16-column instance (head dim 96) at 72: no term (three stages), GQA and key padding, a staged
    #    bias with its gradient, a float row term, mask bits with a band
    os.environ["WINATTN_FORCE_KERNEL"] = "bwd_v3_fine_dims"
    q, k, v = r(3, 300, 4, 72), r(3, 333, 2, 72), r(3, 333, 2, 72)
    kern.attention(q, k, v).sum().backward()
    kern.attention(q, k, v, key_padding_mask=torch.rand(3, 333, device=dev) > 0.2).sum().backward()
    kern.attention(q, k, v, bias=r(1, 4, 300, 336)[..., :333]).sum().backward()
    kern.attention(q, k, v, bias=torch.where(torch.rand(3, 1, 1, 333, device=dev) > 0.2, 0.0,
                                             float("-inf")).to(dt)).sum().backward()
    kern.attention(q, k, v, mask=torch.rand(3, 4, 300, 333, device=dev) > 0.3, window=(100, 30)).sum().backward()
    os.environ["WINATTN_FORCE_KERNEL"] = "bwd_v3_bits"
    for D in (64, 128):
        q, k, v = r(2, 250, 4, D), r(2, 333, 2, D), r(2, 333, 2, D)
        mask = torch.rand(2, 4, 250, 333, device=dev) > 0.3
        kern.attention(q, k, v, mask=mask).sum().backward()
        kern.attention(q, k, v, mask=mask[:1, :1], window=(100, 30)).sum().backward()
    q, k, v = r(2, 250, 4, 64), r(2, 336, 2, 64), r(2, 336, 2, 64)  # (four keys per thread: Sk % 4 == 0)
    kern.attention(q, k, v, mask=torch.rand(2, 4, 250, 336, device=dev) > 0.3).sum().backward()
    os.environ.pop("WINATTN_FORCE_KERNEL")
    # 10a. dQ stored by the backward kernel (bwd_v3_dq_direct, forced: one key block, no band): rows ending mid-tile,
    #      GQA, key padding with an item whose keys are all hidden, a head dim below its instance, a float row term
    os.environ["WINATTN_FORCE_KERNEL"] = "bwd_v3_dq_direct"
    q, k, v = r(3, 300, 4, 64), r(3, 120, 2, 64), r(3, 120, 2, 64)
    kp = torch.rand(3, 120, device=dev) > 0.3
    kp[0] = False
    kern.attention(q, k, v, key_padding_mask=kp).sum().backward()
    q, k, v = r(2, 129, 2, 40), r(2, 77, 2, 40), r(2, 77, 2, 40)
    kern.attention(q, k, v).sum().backward()
    q, k, v = r(2, 256, 4, 128), r(2, 128, 4, 128), r(2, 128, 4, 128)
    kern.attention(q, k, v, bias=r(2, 1, 1, 128, grad=False)).sum().backward()
    os.environ.pop("WINATTN_FORCE_KERNEL")
    # 10b. dQ resident in shared memory (bwd_v3_dq_resident, forced): several key blocks through one CTA (the K / V
    #      hand-over), a ragged last block, GQA, a causal band, key padding with an item whose keys are all hidden
    os.environ["WINATTN_FORCE_KERNEL"] = "bwd_v3_dq_resident"
    q, k, v = r(2, 197, 2, 64), r(2, 197, 2, 64), r(2, 197, 2, 64)
    kern.attention(q, k, v).sum().backward()
    q, k, v = r(3, 64, 4, 64), r(3, 300, 2, 64), r(3, 300, 2, 64)
    kp = torch.rand(3, 300, device=dev) > 0.3
    kp[0] = False
    kern.attention(q, k, v, key_padding_mask=kp).sum().backward()
    q, k, v = r(2, 200, 2, 64), r(2, 200, 2, 64), r(2, 200, 2, 64)
    kern.attention(q, k, v, causal=True).sum().backward()
    os.environ.pop("WINATTN_FORCE_KERNEL")
    # 10c. 128 queries per backward step (bwd_v3_q128, the table's at head dim 64 from 512 queries): queries ending
    #      mid-block, GQA, a causal band, key padding with an item whose keys are all hidden
    os.environ["WINATTN_FORCE_KERNEL"] = "bwd_v3_q128"
    q, k, v = r(2, 300, 4, 64), r(2, 400, 2, 64), r(2, 400, 2, 64)
    kern.attention(q, k, v).sum().backward()
    kern.attention(q, k[:, :300], v[:, :300], causal=True).sum().backward()
    kp = torch.rand(2, 400, device=dev) > 0.3
    kp[0] = False
    kern.attention(q, k, v, key_padding_mask=kp).sum().backward()
    q, k, v = r(2, 333, 4, 64), r(2, 77, 2, 64), r(2, 77, 2, 64)  # (one key block: dQ stored directly)
    kern.attention(q, k, v).sum().backward()
    os.environ.pop("WINATTN_FORCE_KERNEL")
    # 10. split-KV decode with K / V by TMA (sm90/fwd_decode_sm90.h, the table's decode on Hopper; forced here so
    #     that every case below takes it): the stage ring wrapping (one split of many tiles), several splits (the
    #     combine), the last tile past Sk, D below the instance (column blocks never loaded, zeroed), key padding
    #     alone and every term, 16 rows. (Through v5.3 racecheck reported 17 hazards in its merge and it stayed forced
    #     only; RESULTS v5.4 says what changed.)
    if torch.cuda.get_device_capability()[0] == 9:
        os.environ["WINATTN_FORCE_KERNEL"] = "fwd_decode_tma"
        with torch.no_grad():
            for D, Sk in ((64, 1000), (128, 3000), (256, 777), (96, 500)):
                q, k, v = r(3, 1, 8, D, grad=False), r(3, Sk, 2, D, grad=False), r(3, Sk, 2, D, grad=False)
                kern.attention(q, k, v)
                kp = torch.rand(3, Sk, device=dev) > 0.3
                kern.attention(q, k, v, key_padding_mask=kp)
                kern.attention(q, k, v, key_padding_mask=kp, bias=r(3, 8, 1, Sk, grad=False), causal=True)
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            B = 2 * sms // 8 + 1  # more (batch, KV head) pairs than one wave: one split per pair
            q, k, v = r(B, 1, 32, 128, grad=False), r(B, 1000, 8, 128, grad=False), r(B, 1000, 8, 128, grad=False)
            kern.attention(q, k, v)
            q, k, v = r(2, 4, 32, 128, grad=False), r(2, 2000, 8, 128, grad=False), r(2, 2000, 8, 128, grad=False)
            kern.attention(q, k, v, causal=True)
        os.environ.pop("WINATTN_FORCE_KERNEL")
    torch.cuda.synchronize()
    print("sanitize cases done")


if __name__ == "__main__":
    main()
