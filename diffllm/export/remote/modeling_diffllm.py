"""DiffLLMForCausalLM: diffllm's decoder-only LM for transformers (trust_remote_code), self-contained (torch and
transformers only). Parameter names are diffllm's own, so the exported weights are the checkpoint's, unchanged.

    block:      Y = X + Attn(Norm(X));  X' = Y + SwiGLU(Norm(Y))            (Norm: RMSNorm | LayerNorm with bias)
    transformer softmax(Q K^T / sqrt d + causal) V, GQA
    diff        lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init;  head_i = (A1 - lambda A2) V  (V 2d wide);
                out = W_O concat_i[(1 - lambda_init) RMSNorm_w(head_i)]; sub-heads 2i, 2i+1 form diff head i
    diff2       O = softmax(Q K^T / sqrt d + causal) V with 2h query heads; head_i = O_2i - sigmoid(X W_l)_i O_2i+1

Rotary: the first rotary_pct of each head, interleaved (pairs 2i, 2i+1) or rotate-half (pairs i, i + r/2), as trained.
Generation keeps a transformers Cache (keys after rotary), and padding masks come from `attention_mask`.
"""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_diffllm import DiffLLMConfig

_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).type_as(x)


def build_norm(config, dim):
    return RMSNorm(dim, config.norm_eps) if config.norm == "rmsnorm" else nn.LayerNorm(dim, eps=config.norm_eps)


def rotary_cos_sin(positions, rotary_dim, theta):
    """positions (B, T) -> cos, sin (B, T, r/2) in fp32."""
    dims = torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / theta ** (dims / rotary_dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, r/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin, interleaved):
    """Rotate the first 2*cos.shape[-1] dims of each head. x: (B, T, H, d); cos, sin: (B, T, r/2)."""
    r = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :r].float(), x[..., r:]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B, T, 1, r/2)
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2:]
        rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return torch.cat((rotated.type_as(x), x_pass), dim=-1)


def attend(q, k, v, mask):
    """softmax(q k^T / sqrt d + mask) v; query head j reads kv head j // (Hq / Hkv).
    q: (B, Hq, T, d), k: (B, Hkv, S, d), v: (B, Hkv, S, dv), mask: (B, 1, T, S) bool -> (B, Hq, T, dv)."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class _Attention(nn.Module):
    """Projections shared by the three variants; q has q_heads heads of d, k and v kv_heads heads of d and v_dim."""

    def __init__(self, config, layer_idx, q_heads, kv_heads, v_dim):
        super().__init__()
        self.layer_idx, self.d = layer_idx, config.d_model // config.n_heads
        self.interleaved = config.rope_interleaved
        self.q_proj = nn.Linear(config.d_model, q_heads * self.d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.d_model, kv_heads * self.d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.d_model, kv_heads * v_dim, bias=config.qkv_bias)
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def qkv(self, x, cos, sin):
        B, T, _ = x.shape
        q = apply_rotary(self.q_proj(x).view(B, T, -1, self.d), cos, sin, self.interleaved)  # (B, T, Hq, d)
        k = apply_rotary(self.k_proj(x).view(B, T, -1, self.d), cos, sin, self.interleaved)  # (B, T, Hkv, d)
        return q, k, self.v_proj(x)

    def cached(self, k, v, cache):
        return (k, v) if cache is None else cache.update(k, v, self.layer_idx)


class Attention(_Attention):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx, config.n_heads, config.n_kv_heads, config.d_model // config.n_heads)

    def forward(self, x, cos, sin, mask, cache):
        B, T, E = x.shape
        q, k, v = self.qkv(x, cos, sin)
        k, v = self.cached(k.transpose(1, 2), v.view(B, T, -1, self.d).transpose(1, 2), cache)  # (B, Hkv, S, d)
        y = attend(q.transpose(1, 2), k, v, mask)  # (B, H, T, d)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E))


class DiffAttention(_Attention):
    def __init__(self, config, layer_idx):
        d = config.d_model // config.n_heads
        super().__init__(config, layer_idx, config.n_heads, config.n_kv_heads, d)
        self.h, self.g = config.n_heads // 2, config.n_kv_heads // 2  # diff heads, kv groups
        self.lambda_init = float(config.lambda_inits[layer_idx])
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.zeros(d, dtype=torch.float32)) for _ in range(4))
        self.subln = RMSNorm(2 * d, eps=1e-5)

    def forward(self, x, cos, sin, mask, cache):
        B, T, E = x.shape
        h, g, d = self.h, self.g, self.d
        q, k, v = self.qkv(x, cos, sin)  # (B, T, 2h, d), (B, T, 2g, d), (B, T, 2g*d)
        # adjacent sub-head pairs -> component-major heads [map 1 heads..., map 2 heads...]
        q = q.view(B, T, h, 2, d).permute(0, 3, 2, 1, 4).reshape(B, 2 * h, T, d)
        k = k.view(B, T, g, 2, d).permute(0, 3, 2, 1, 4).reshape(B, 2 * g, T, d)
        k, v = self.cached(k, v.view(B, T, g, 2 * d).transpose(1, 2), cache)  # (B, 2g, S, d), (B, g, S, 2d)
        l1 = torch.exp(torch.sum(self.lambda_q1.float() * self.lambda_k1.float()))
        l2 = torch.exp(torch.sum(self.lambda_q2.float() * self.lambda_k2.float()))
        lam = (l1 - l2 + self.lambda_init).type_as(q)
        # query head c*h + i reads kv head c*g + i // (h/g): the component-c keys of its group; both read the same V
        out = attend(q, k, torch.cat([v, v], dim=1), mask).view(B, 2, h, T, 2 * d)
        attn = self.subln(out[:, 0] - lam * out[:, 1]) * (1.0 - self.lambda_init)  # (B, h, T, 2d)
        return self.out_proj(attn.transpose(1, 2).reshape(B, T, E))


class Diff2Attention(_Attention):
    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx, 2 * config.n_heads, config.n_kv_heads, config.d_model // config.n_heads)
        self.lambda_proj = nn.Linear(config.d_model, config.n_heads, bias=False)

    def forward(self, x, cos, sin, mask, cache):
        B, T, E = x.shape
        q, k, v = self.qkv(x, cos, sin)  # (B, T, 2h, d), (B, T, g, d), (B, T, g*d)
        k, v = self.cached(k.transpose(1, 2), v.view(B, T, -1, self.d).transpose(1, 2), cache)  # (B, g, S, d)
        o = attend(q.transpose(1, 2), k, v, mask).transpose(1, 2)  # (B, T, 2h, d): heads 2i, 2i+1 share a kv head
        lam = torch.sigmoid(self.lambda_proj(x)).unsqueeze(-1)  # (B, T, h, 1)
        return self.out_proj((o[:, :, 0::2] - lam * o[:, :, 1::2]).reshape(B, T, E))


ATTENTION = {"transformer": Attention, "diff": DiffAttention, "diff2": Diff2Attention}


class SwiGLU(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = build_norm(config, config.d_model)
        self.attn = ATTENTION[config.arch](config, layer_idx)
        self.mlp_norm = build_norm(config, config.d_model)
        self.mlp = SwiGLU(config.d_model, config.ffn_dim)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache)
        return x + self.mlp(self.mlp_norm(x))


class DiffLLMForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = DiffLLMConfig
    base_model_prefix = "diffllm"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "tok_embeddings.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = build_norm(config, config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, self.config.init_std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, (RMSNorm, nn.LayerNorm)):
            module.weight.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        if isinstance(module, DiffAttention):
            for p in (module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2):
                p.normal_(0.0, 0.1)

    def get_input_embeddings(self):
        return self.tok_embeddings

    def set_input_embeddings(self, value):
        self.tok_embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, past_key_values=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        x = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, E)
        B, T, _ = x.shape
        past = cache.get_seq_length() if cache is not None else 0
        S = past + T
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[-1] == S:
            keys_ok = attention_mask.bool()  # (B, S)
        else:
            keys_ok = torch.ones(B, S, dtype=torch.bool, device=x.device)
        if position_ids is None:
            position_ids = (keys_ok.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # left padding shifts positions
        t = torch.arange(T, device=x.device)[:, None] + past
        s = torch.arange(S, device=x.device)[None, :]
        mask = ((s <= t)[None] & keys_ok[:, None, :]) | (s == t)[None]  # (B, T, S); a token always sees itself
        mask = mask[:, None]  # (B, 1, T, S)
        d = self.config.d_model // self.config.n_heads
        cos, sin = rotary_cos_sin(position_ids.expand(B, T), int(d * self.config.rotary_pct), self.config.rope_theta)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache)
        x = self.norm(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})
