"""DiffLLMConfig: a diffllm model's layout (any registered attention variant) for transformers.

Written by `diffllm export format=remote`; the field names are diffllm's ModelConfig's, vocab_size is the padded
embedding size; keys the variant's remote class reads besides (`AttentionVariant.remote_config`, e.g. Diff's
`lambda_inits`: each layer's lambda_init) are kept as attributes by PretrainedConfig. Imports only transformers.
"""

from transformers import PretrainedConfig


class DiffLLMConfig(PretrainedConfig):
    model_type = "diffllm"
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "max_position_embeddings": "max_seq_len",
    }

    def __init__(
        self,
        arch=None,
        preset="custom",
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=None,
        ffn_dim=None,
        vocab_size=8192,
        norm="rmsnorm",
        norm_eps=1e-5,
        rotary_pct=1.0,
        rope_theta=10000.0,
        rope_interleaved=False,
        qkv_bias=False,
        tie_embeddings=False,
        init_std=0.02,
        max_seq_len=2048,
        **kwargs,
    ):
        self.arch, self.preset = arch, preset
        self.d_model, self.n_layers, self.n_heads = d_model, n_layers, n_heads
        self.n_kv_heads = n_kv_heads or n_heads  # the Transformer's head counts; Diff runs n_heads/2 heads of 2d
        self.ffn_dim = ffn_dim if ffn_dim is not None else int(8 * d_model / 3)
        self.vocab_size, self.norm, self.norm_eps = vocab_size, norm, norm_eps
        self.rotary_pct, self.rope_theta, self.rope_interleaved = rotary_pct, rope_theta, rope_interleaved
        self.qkv_bias, self.tie_embeddings = qkv_bias, tie_embeddings
        self.init_std, self.max_seq_len = init_std, max_seq_len
        kwargs["tie_word_embeddings"] = tie_embeddings
        super().__init__(**kwargs)
