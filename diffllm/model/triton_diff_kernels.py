"""Fused differential attention in Triton (attn_backend=triton): the forward and backward kernels (their launch and
autograd op: diffllm/model/triton_diff.py).

    out = (softmax(Q1 K1^T / sqrt d + causal) - lam softmax(Q2 K2^T / sqrt d + causal)) V     (B, h, T, 2d)

Forward: one pass over the K/V tiles of a query block keeps both online softmaxes (two running max/sum pairs and two
fp32 accumulators), loads each K1, K2 and V tile once and writes `out` directly, plus what the backward needs: the
two log-sum-exps and O1 = P1 V, O2 = P2 V. Exact single-pass output needs the two accumulators because each map's
normaliser is known only at the end of its row, so the forward's P.V work is that of two heads of width 2d.
Backward (FlashAttention-2 style): the maps are recomputed from the saved log-sum-exps, so the combined map
A = P1 - lam P2 is known exactly and dV = A^T dO and dA = dO V^T are one matmul each, the Transformer's P.V work:
    dS1 = P1 * (dA - D1),  dS2 = -lam P2 * (dA - D2),  Dc = rowsum(dO * Oc),  dlam = -sum(D2)
A small kernel gives D1, D2; one gives dK1, dK2, dV per kv block (looping over the diff heads of its GQA group, so no
atomics), one gives dQ1, dQ2 per query block.
The subln and (1 - lambda_init) epilogue stay in DiffAttention (PyTorch): the RMSNorm weight is shared by all heads,
so fusing it would need a cross-program reduction for its gradient, while the epilogue is one memory-bound pass.

Document masks (packed rows, `docs`): key j is valid for query i iff j <= i and j >= start[i], the first position of
i's document (docs.starts, (B, T) int32). Tiles outside the documents of a block are skipped: the forward and dQ
loops start at the tile holding the document start of the block's first query, the dK/dV loop stops at the document
end (docs.ends) of the block's last key. A row may then meet a tile it sees nothing of: while its running max is
still -inf, the exponentials subtract 0 instead (`_finite`; an identity otherwise), so its sums stay 0, not NaN.

Layouts (those DiffAttention holds before its backend branch): q (B, 2h, T, d) component-major [Q1 heads, Q2 heads],
k (B, 2g, T, d) likewise, v (B, g, T, 2d); diff head i reads kv group i // (h/g), as the official flash files.
Any T (the tail is masked), any d (padded to a power of two >= 16), fp32/bf16/fp16 inputs, fp32 accumulation.
Without CUDA, Triton can only run its CPU interpreter: importing this module then sets TRITON_INTERPRET=1 (slow; for
tests). On a GPU the block sizes are autotuned (configs sized for H100/H200).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # must precede the @triton.jit decorations below
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dev/GPU extra
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
INTERPRET_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 16}  # interpreter: fixed small tiles (unequal, to test both loops)
LOG2E = 1.4426950408889634


def _configs(pairs: list[tuple[int, int, int, int]]) -> list:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) -> triton.Config list."""
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in pairs]


# H100/H200 (sm_90, 228 KB shared memory, 64K registers per SM). The forward holds two (BLOCK_M, 2d) fp32
# accumulators (2 x 64 x 256 at d = 128: 128 registers a thread with 8 warps), so BLOCK_M is mostly 64; configs that do
# not fit are skipped by the autotuner.
# Few configs: each new (T, d, GQA ratio) key compiles and times all of them.
FWD_CONFIGS = [(64, 64, 8, 2), (64, 32, 8, 3), (64, 64, 4, 2), (128, 32, 8, 2)]
BWD_CONFIGS = [(64, 64, 8, 2), (32, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 3)]


def _tuned(configs: list[tuple[int, int, int, int]]):
    """Autotune on a GPU; in the interpreter the launch passes INTERPRET_BLOCKS instead."""
    if INTERPRET:
        return lambda kernel: kernel
    return triton.autotune(configs=_configs(configs), key=["T", "BLOCK_D", "REP", "DOCS"])


if triton is not None:

    @triton.jit
    def _load_rows(base, rows, stride_t, cols, T, W):
        """Rows `rows` x columns `cols` of a (T, W) slab at `base` (row stride stride_t), zeros past T and W."""
        return tl.load(
            base + rows[:, None] * stride_t + cols[None, :], mask=(rows[:, None] < T) & (cols[None, :] < W), other=0.0
        )

    @triton.jit
    def _row_stats(LSE, DELTA, bh, rows, T):
        """Per-query log-sum-exps and Dc of both maps; LSE and DELTA are (B, h, 2, T) fp32."""
        stat, ok = bh * 2 * T + rows, rows < T
        lse1 = tl.load(LSE + stat, mask=ok, other=0.0)
        lse2 = tl.load(LSE + stat + T, mask=ok, other=0.0)
        d1 = tl.load(DELTA + stat, mask=ok, other=0.0)
        d2 = tl.load(DELTA + stat + T, mask=ok, other=0.0)
        return lse1, lse2, d1, d2

    @triton.jit
    def _finite(m):
        """The running max to subtract: 0 for rows that have seen no valid key yet (-inf - -inf would give NaN)."""
        return tl.where(m == float("-inf"), 0.0, m)

    @triton.jit
    def _in_document(valid, rows, cols, START, b, T, DOCS: tl.constexpr):
        """valid (BLOCK_M, BLOCK_N), and (DOCS) key `cols` not before the document start of query `rows`."""
        if DOCS:
            first = tl.load(START + b * T + rows, mask=rows < T, other=0)  # (BLOCK_M,) document start of each query
            valid = valid & (cols[None, :] >= first[:, None])
        return valid

    @triton.jit
    def _first_key(START, b, T, row, BLOCK_N: tl.constexpr, DOCS: tl.constexpr):
        """Where a query block's key loop starts: 0, or (DOCS) the tile holding its first query's document start."""
        lo = 0
        if DOCS:
            lo = (tl.load(START + b * T + row) // BLOCK_N) * BLOCK_N
        return lo

    @triton.jit
    def _log2_scores(qa, kb, valid, scale_log2, PREC: tl.constexpr):
        """Masked scores in log2 units: (BLOCK_M, BLOCK_D) x (BLOCK_N, BLOCK_D) -> (BLOCK_M, BLOCK_N) fp32."""
        s = tl.dot(qa, tl.trans(kb), input_precision=PREC) * scale_log2
        return tl.where(valid, s, float("-inf"))

    @triton.jit
    def _score_grads(q1, q2, k1, k2, v, do, lse1, lse2, d1, d2, lam, valid, scale_log2, PREC: tl.constexpr):
        """Recompute P1, P2 from their log-sum-exps; return A = P1 - lam P2 and dS1, dS2 (all (BLOCK_M, BLOCK_N))."""
        p1 = tl.exp2(_log2_scores(q1, k1, valid, scale_log2, PREC) - lse1[:, None])
        p2 = tl.exp2(_log2_scores(q2, k2, valid, scale_log2, PREC) - lse2[:, None])
        da = tl.dot(do, tl.trans(v), input_precision=PREC)  # dA = dO V^T
        ds1 = p1 * (da - d1[:, None])
        ds2 = -lam * p2 * (da - d2[:, None])
        return p1 - lam * p2, ds1, ds2

    @_tuned(FWD_CONFIGS)
    @triton.jit
    def _fwd_kernel(
        Q,
        K,
        V,
        Lam,
        O,  # noqa: E741 - the kernel's names
        O1,
        O2,
        LSE,
        START,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        H,
        G,
        T,
        D,
        DV,
        scale_log2,
        REP: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        SAVE: tl.constexpr,
        DOCS: tl.constexpr,
        PREC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        b, i = bh // H, bh % H
        j = i // REP  # kv group
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols0 = tl.arange(0, BLOCK_N)
        dd, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        q1 = _load_rows(Q + b * sqb + i * sqh, rows, sqt, dd, T, D)  # (BLOCK_M, BLOCK_D)
        q2 = _load_rows(Q + b * sqb + (H + i) * sqh, rows, sqt, dd, T, D)
        k1_ptr, k2_ptr = K + b * skb + j * skh, K + b * skb + (G + j) * skh
        v_ptr = V + b * svb + j * svh
        m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
        m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l1 = tl.zeros([BLOCK_M], tl.float32)
        l2 = tl.zeros([BLOCK_M], tl.float32)
        acc1 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        lo = _first_key(START, b, T, pid_m * BLOCK_M, BLOCK_N, DOCS)
        hi = tl.minimum((pid_m + 1) * BLOCK_M, T)  # causal: no key beyond the block's last query
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + cols0
            k1 = _load_rows(k1_ptr, cols, skt, dd, T, D)  # (BLOCK_N, BLOCK_D)
            k2 = _load_rows(k2_ptr, cols, skt, dd, T, D)
            vt = _load_rows(v_ptr, cols, svt, dv, T, DV)  # (BLOCK_N, BLOCK_DV)
            valid = (rows[:, None] >= cols[None, :]) & (cols[None, :] < T)  # causal
            valid = _in_document(valid, rows, cols, START, b, T, DOCS)
            s1 = _log2_scores(q1, k1, valid, scale_log2, PREC)
            s2 = _log2_scores(q2, k2, valid, scale_log2, PREC)
            m1n = tl.maximum(m1, tl.max(s1, 1))
            m2n = tl.maximum(m2, tl.max(s2, 1))
            m1s, m2s = _finite(m1n), _finite(m2n)  # = m1n, m2n but for rows that have seen no key yet
            p1 = tl.exp2(s1 - m1s[:, None])
            p2 = tl.exp2(s2 - m2s[:, None])
            a1, a2 = tl.exp2(m1 - m1s), tl.exp2(m2 - m2s)
            l1 = l1 * a1 + tl.sum(p1, 1)
            l2 = l2 * a2 + tl.sum(p2, 1)
            acc1 = acc1 * a1[:, None] + tl.dot(p1.to(vt.dtype), vt, input_precision=PREC)
            acc2 = acc2 * a2[:, None] + tl.dot(p2.to(vt.dtype), vt, input_precision=PREC)
            m1, m2 = m1n, m2n
        o1 = acc1 / l1[:, None]
        o2 = acc2 / l2[:, None]
        lam = tl.load(Lam)
        o_off = (bh * T + rows[:, None]) * DV + dv[None, :]  # outputs are contiguous (B, h, T, 2d)
        o_mask = (rows[:, None] < T) & (dv[None, :] < DV)
        tl.store(O + o_off, (o1 - lam * o2).to(O.dtype.element_ty), mask=o_mask)
        if SAVE:
            tl.store(O1 + o_off, o1.to(O1.dtype.element_ty), mask=o_mask)
            tl.store(O2 + o_off, o2.to(O2.dtype.element_ty), mask=o_mask)
            lse_off = bh * 2 * T + rows  # LSE: (B, h, 2, T) fp32, log2 units
            tl.store(LSE + lse_off, m1 + tl.log2(l1), mask=rows < T)
            tl.store(LSE + lse_off + T, m2 + tl.log2(l2), mask=rows < T)

    @triton.jit
    def _bwd_delta_kernel(DO, O1, O2, DELTA, T, DV, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
        """Dc = rowsum(dO * Oc) in fp32 for one query block of one diff head (dO, Oc: contiguous (B, h, T, 2d))."""
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dv = tl.arange(0, BLOCK_DV)
        do = _load_rows(DO + bh * T * DV, rows, DV, dv, T, DV).to(tl.float32)
        o1 = _load_rows(O1 + bh * T * DV, rows, DV, dv, T, DV).to(tl.float32)
        o2 = _load_rows(O2 + bh * T * DV, rows, DV, dv, T, DV).to(tl.float32)
        tl.store(DELTA + bh * 2 * T + rows, tl.sum(do * o1, 1), mask=rows < T)
        tl.store(DELTA + bh * 2 * T + T + rows, tl.sum(do * o2, 1), mask=rows < T)

    @_tuned(BWD_CONFIGS)
    @triton.jit
    def _bwd_dkdv_kernel(
        Q,
        K,
        V,
        Lam,
        DO,
        LSE,
        DELTA,
        DK,
        DVV,
        START,
        END,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        H,
        G,
        T,
        D,
        DV,
        scale_log2,
        sm_scale,
        REP: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        DOCS: tl.constexpr,
        PREC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        """One kv block of one group: dK1, dK2, dV summed over the REP diff heads that read it."""
        pid_n, bg = tl.program_id(0), tl.program_id(1)
        b, j = bg // G, bg % G
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows0 = tl.arange(0, BLOCK_M)
        dd, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        k1 = _load_rows(K + b * skb + j * skh, cols, skt, dd, T, D)  # (BLOCK_N, BLOCK_D)
        k2 = _load_rows(K + b * skb + (G + j) * skh, cols, skt, dd, T, D)
        vt = _load_rows(V + b * svb + j * svh, cols, svt, dv, T, DV)  # (BLOCK_N, BLOCK_DV)
        dk1 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dk2 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dvacc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
        lam = tl.load(Lam)
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # causal: queries before this block's first key see none of it
        hi = T
        if DOCS:  # queries after the document of the block's last key see none of it
            hi = tl.load(END + b * T + tl.minimum((pid_n + 1) * BLOCK_N, T) - 1)
        for r in range(0, REP):
            i = j * REP + r  # diff head
            bh = b * H + i
            for start_m in range(lo, hi, BLOCK_M):
                rows = start_m + rows0
                q1 = _load_rows(Q + b * sqb + i * sqh, rows, sqt, dd, T, D)  # (BLOCK_M, BLOCK_D)
                q2 = _load_rows(Q + b * sqb + (H + i) * sqh, rows, sqt, dd, T, D)
                do = _load_rows(DO + bh * T * DV, rows, DV, dv, T, DV)  # dO: contiguous (B, h, T, 2d)
                lse1, lse2, d1, d2 = _row_stats(LSE, DELTA, bh, rows, T)
                valid = (rows[:, None] >= cols[None, :]) & (rows[:, None] < T)
                valid = _in_document(valid, rows, cols, START, b, T, DOCS)
                a, ds1, ds2 = _score_grads(q1, q2, k1, k2, vt, do, lse1, lse2, d1, d2, lam, valid, scale_log2, PREC)
                dvacc += tl.dot(tl.trans(a).to(do.dtype), do, input_precision=PREC)
                dk1 += tl.dot(tl.trans(ds1).to(q1.dtype), q1, input_precision=PREC)
                dk2 += tl.dot(tl.trans(ds2).to(q2.dtype), q2, input_precision=PREC)
        dk_off = (b * 2 * G + j) * T * D + cols[:, None] * D + dd[None, :]  # DK: contiguous (B, 2g, T, d)
        k_mask = (cols[:, None] < T) & (dd[None, :] < D)
        v_mask = (cols[:, None] < T) & (dv[None, :] < DV)
        tl.store(DK + dk_off, (dk1 * sm_scale).to(DK.dtype.element_ty), mask=k_mask)
        tl.store(DK + dk_off + G * T * D, (dk2 * sm_scale).to(DK.dtype.element_ty), mask=k_mask)
        tl.store(DVV + (bg * T + cols[:, None]) * DV + dv[None, :], dvacc.to(DVV.dtype.element_ty), mask=v_mask)

    @_tuned(BWD_CONFIGS)
    @triton.jit
    def _bwd_dq_kernel(
        Q,
        K,
        V,
        Lam,
        DO,
        LSE,
        DELTA,
        DQ,
        START,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        H,
        G,
        T,
        D,
        DV,
        scale_log2,
        sm_scale,
        REP: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        DOCS: tl.constexpr,
        PREC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        """One query block of one diff head: dQ1, dQ2."""
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        b, i = bh // H, bh % H
        j = i // REP
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols0 = tl.arange(0, BLOCK_N)
        dd, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        q1 = _load_rows(Q + b * sqb + i * sqh, rows, sqt, dd, T, D)  # (BLOCK_M, BLOCK_D)
        q2 = _load_rows(Q + b * sqb + (H + i) * sqh, rows, sqt, dd, T, D)
        do = _load_rows(DO + bh * T * DV, rows, DV, dv, T, DV)
        lse1, lse2, d1, d2 = _row_stats(LSE, DELTA, bh, rows, T)
        lam = tl.load(Lam)
        dq1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        dq2 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo = _first_key(START, b, T, pid_m * BLOCK_M, BLOCK_N, DOCS)
        hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + cols0
            k1 = _load_rows(K + b * skb + j * skh, cols, skt, dd, T, D)
            k2 = _load_rows(K + b * skb + (G + j) * skh, cols, skt, dd, T, D)
            vt = _load_rows(V + b * svb + j * svh, cols, svt, dv, T, DV)
            valid = (rows[:, None] >= cols[None, :]) & (cols[None, :] < T)
            valid = _in_document(valid, rows, cols, START, b, T, DOCS)
            _, ds1, ds2 = _score_grads(q1, q2, k1, k2, vt, do, lse1, lse2, d1, d2, lam, valid, scale_log2, PREC)
            dq1 += tl.dot(ds1.to(k1.dtype), k1, input_precision=PREC)
            dq2 += tl.dot(ds2.to(k2.dtype), k2, input_precision=PREC)
        dq_off = (b * 2 * H + i) * T * D + rows[:, None] * D + dd[None, :]  # DQ: contiguous (B, 2h, T, d)
        q_mask = (rows[:, None] < T) & (dd[None, :] < D)
        tl.store(DQ + dq_off, (dq1 * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)
        tl.store(DQ + dq_off + H * T * D, (dq2 * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)
