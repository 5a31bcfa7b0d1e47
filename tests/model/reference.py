"""Independent float64 reference of differential attention, written from the paper's equations (not the module)."""

from __future__ import annotations

import math

import torch


def rotate(x: torch.Tensor, rotary_dim: int, theta: float, interleaved: bool) -> torch.Tensor:
    """RoPE via complex multiplication. x: (T, d) float64. Pairs (2j, 2j+1) if interleaved else (j, j + r/2)."""
    T = x.shape[0]
    half = rotary_dim // 2
    freqs = torch.tensor([theta ** (-2.0 * j / rotary_dim) for j in range(half)], dtype=torch.float64)
    phase = torch.polar(torch.ones(T, half, dtype=torch.float64), torch.arange(T, dtype=torch.float64)[:, None] * freqs)
    if interleaved:
        z = torch.complex(x[:, 0:rotary_dim:2], x[:, 1:rotary_dim:2]) * phase
        rot = torch.stack([z.real, z.imag], dim=-1).reshape(T, rotary_dim)
    else:
        z = torch.complex(x[:, :half], x[:, half:rotary_dim]) * phase
        rot = torch.cat([z.real, z.imag], dim=-1)
    return torch.cat([rot, x[:, rotary_dim:]], dim=-1)


def diff_attention_reference(x, W, lam_vecs, lambda_init, h, h_kv, d, rotary_dim, theta, interleaved, eps=1e-5):
    """x: (T, E) float64; W: dict of q/k/v/out weights ((out, in), nn.Linear layout) and subln weight (2d,).
    Diff head i: Q1 = sub-head 2i, Q2 = sub-head 2i+1; its kv group g = i // (h / h_kv) gives K1 = 2g, K2 = 2g+1, V = g.
    """
    T = x.shape[0]
    q, k, v = x @ W["q"].T, x @ W["k"].T, x @ W["v"].T
    lq1, lk1, lq2, lk2 = lam_vecs
    lam = math.exp(float(lq1 @ lk1)) - math.exp(float(lq2 @ lk2)) + lambda_init
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def softmax_map(qs, ks):
        s = (rotate(qs, rotary_dim, theta, interleaved) @ rotate(ks, rotary_dim, theta, interleaved).T) / math.sqrt(d)
        return torch.softmax(s.masked_fill(~causal, -math.inf), dim=-1)

    heads = []
    for i in range(h):
        g = i // (h // h_kv)
        q1, q2 = q[:, (2 * i) * d : (2 * i + 1) * d], q[:, (2 * i + 1) * d : (2 * i + 2) * d]
        k1, k2 = k[:, (2 * g) * d : (2 * g + 1) * d], k[:, (2 * g + 1) * d : (2 * g + 2) * d]
        vg = v[:, g * 2 * d : (g + 1) * 2 * d]
        o = (softmax_map(q1, k1) - lam * softmax_map(q2, k2)) @ vg  # (T, 2d)
        o = o / torch.sqrt((o**2).mean(-1, keepdim=True) + eps) * W["subln"]
        heads.append(o * (1 - lambda_init))
    return torch.cat(heads, dim=-1) @ W["out"].T


def diff2_attention_reference(x, W, h, h_kv, d, rotary_dim, theta, interleaved):
    """Diff Transformer V2 from its equations. x: (T, E) float64; W: q (2h d, E), k/v (h_kv d, E), out (E, h d),
    lam (h, E). Query heads 2i and 2i+1 read kv head i // (h / h_kv); head_i = O_2i - sigmoid(x W_lam[i]) O_2i+1."""
    T = x.shape[0]
    q, k, v = x @ W["q"].T, x @ W["k"].T, x @ W["v"].T
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def attend(qs, ks, vs):
        s = (rotate(qs, rotary_dim, theta, interleaved) @ rotate(ks, rotary_dim, theta, interleaved).T) / math.sqrt(d)
        return torch.softmax(s.masked_fill(~causal, -math.inf), dim=-1) @ vs

    heads = []
    for i in range(h):
        g = i // (h // h_kv)
        kg, vg = k[:, g * d : (g + 1) * d], v[:, g * d : (g + 1) * d]
        o1 = attend(q[:, (2 * i) * d : (2 * i + 1) * d], kg, vg)  # (T, d)
        o2 = attend(q[:, (2 * i + 1) * d : (2 * i + 2) * d], kg, vg)
        lam = 1.0 / (1.0 + torch.exp(-(x @ W["lam"][i])))  # (T,)
        heads.append(o1 - lam[:, None] * o2)
    return torch.cat(heads, dim=-1) @ W["out"].T


def mla_attention_reference(x, W, h, dims, theta, interleaved, eps=1e-6):
    """Multi-head Latent Attention from DeepSeek-V2's equations (§2.1.2-2.1.3), one head at a time. x: (T, E) float64;
    dims = (d_c', d_c, d_n, d_r, d_v) with d_c' None for a full W_Q; W (nn.Linear layout (out, in)): "dq", "q_norm",
    "uq" (h (d_n + d_r), d_c') or "q" (h (d_n + d_r), E); "dkv" (d_c + d_r, E) = [W_DKV; W_KR], "kv_norm" (d_c,),
    "ukv" (h (d_n + d_v), d_c) = per head [W_UK_i; W_UV_i]; "out" (E, h d_v)."""
    dq, dc, dn, dr, dv = dims
    T = x.shape[0]

    def rms(t, w):
        return t / torch.sqrt((t**2).mean(-1, keepdim=True) + eps) * w

    q = (rms(x @ W["dq"].T, W["q_norm"]) @ W["uq"].T) if dq else x @ W["q"].T  # (T, h (d_n + d_r))
    ckv_kr = x @ W["dkv"].T
    c_kv, k_r = rms(ckv_kr[:, :dc], W["kv_norm"]), rotate(ckv_kr[:, dc:], dr, theta, interleaved)  # (T, d_c), (T, d_r)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    heads = []
    for i in range(h):
        qi = q[:, i * (dn + dr) : (i + 1) * (dn + dr)]
        q_c, q_r = qi[:, :dn], rotate(qi[:, dn:], dr, theta, interleaved)
        w_ukv = W["ukv"][i * (dn + dv) : (i + 1) * (dn + dv)]
        k_c, v = c_kv @ w_ukv[:dn].T, c_kv @ w_ukv[dn:].T  # (T, d_n), (T, d_v)
        s = (q_c @ k_c.T + q_r @ k_r.T) / math.sqrt(dn + dr)  # [q^C; q^R] . [k^C; k^R]
        heads.append(torch.softmax(s.masked_fill(~causal, -math.inf), dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ W["out"].T
