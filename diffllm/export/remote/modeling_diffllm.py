"""DiffLLMForCausalLM: diffllm's decoder-only LM for transformers (trust_remote_code), self-contained (torch and
transformers only). Parameter names are diffllm's own, so the exported weights are the checkpoint's, unchanged.

    block:      Y = X + Attn(Norm(X));  X' = Y + SwiGLU(Norm(Y))            (Norm: RMSNorm | LayerNorm with bias)
    Attn        the model's attention variant: its own equations class (diffllm/model/layers.py AttentionEquations),
                which the export writes to diffllm_attention_<h>.py beside this file; diffllm_layers_<h>.py and
                diffllm_documents_<h>.py are diffllm/model/layers.py and documents.py, verbatim

Rotary: the first rotary_pct of each head, interleaved (pairs 2i, 2i+1) or rotate-half (pairs i, i + r/2), as trained.
Generation keeps a transformers Cache (keys after rotary), and padding masks come from `attention_mask`.
This file is a template of the export bundle (diffllm/export/remote/__init__.py): its relative imports resolve there.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_diffllm import DiffLLMConfig
from .diffllm_attention import ATTENTION
from .diffllm_documents import padded_causal_mask
from .diffllm_layers import RMSNorm, SwiGLU, build_norm, rotary_cos_sin

_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn_norm = build_norm(config.norm, config.d_model, config.norm_eps)
        self.attn = ATTENTION(config, layer_idx)
        self.mlp_norm = build_norm(config.norm, config.d_model, config.norm_eps)
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
        self.norm = build_norm(config.norm, config.d_model, config.norm_eps)
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
        # the variant's own vectors (Diff's lambdas) stay as its constructor made them

    def get_input_embeddings(self):
        return self.tok_embeddings

    def set_input_embeddings(self, value):
        self.tok_embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep=0,
        past_key_values=None,
        **kwargs,
    ):
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
        mask = padded_causal_mask(keys_ok, T)  # (B, 1, T, S); a token always sees itself
        d = self.config.d_model // self.config.n_heads
        # the width the variant rotates (MLA: its RoPE part); bundles written before the key: rotary_pct of d
        rotary_dim = getattr(self.config, "rotary_dim", None) or int(d * self.config.rotary_pct)
        cos, sin = rotary_cos_sin(position_ids.expand(B, T), rotary_dim, self.config.rope_theta)
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
