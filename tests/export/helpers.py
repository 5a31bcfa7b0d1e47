"""Shared by the export tests: the tiny layouts they train, and the reference they compare HF against."""

from __future__ import annotations

import torch

from tests.train.helpers import ENV, SESSION  # noqa: F401 - the session folder and offline environment we share

# 6 steps of 4 x 64 tokens, single process, ZeRO-0: weights (norms, subln, lambda) move off their init.
TRAIN = [
    "model.d_model=64",
    "model.n_layers=2",
    "data.seq_len=64",
    "data.tokenizer.vocab_size=1024",
    "trainer.micro_batch_size=4",
    "trainer.global_batch_tokens=256",
    "trainer.tokens=1536",
    "trainer.log_every=1",
    "trainer.val_batches=2",
    "trainer.val_tokens=4096",  # the final validation: 4096 tokens of the held-out plays (all of them: ~12 s a run)
    "trainer.save_every_steps=6",
    "trainer.zero_stage=0",
    "optim.warmup_steps=2",
    "optim.lr=3e-3",
    "optim.min_lr=3e-4",
]
# layout -> (overrides, the format auto must pick)
LAYOUTS = {
    "llama-interleaved-gqa": (
        [
            "model=transformer-tiny",
            "model.rope_interleaved=true",
            "model.n_heads=8",
            "model.n_kv_heads=4",
            "model.qkv_bias=true",
        ],
        "llama",
    ),
    "stablelm": (
        ["model=transformer-tiny", "model.norm=layernorm", "model.rotary_pct=0.25", "model.qkv_bias=true"],
        "stablelm",
    ),
    "diff-interleaved-gqa": (
        ["model=diff-tiny", "model.rope_interleaved=true", "model.n_heads=8", "model.n_kv_heads=4"],
        "diffllama",
    ),
    "diff-rotate-half-const-lambda": (
        [
            "model=diff-tiny",
            "model.rope_interleaved=false",
            "+model.lambda_init=0.5",
            "model.tie_embeddings=true",
            "model.qkv_bias=true",
        ],
        "diffllama",
    ),
    "diff-layernorm-partial": (["model=diff-tiny", "model.norm=layernorm", "model.rotary_pct=0.5"], "remote"),
    "diff2": (["model=diff-tiny", "model.arch=diff2", "model.n_kv_heads=2"], "remote"),
    "mla-low-rank-q": (["model=mla-tiny", "model.q_lora_rank=48", "model.kv_lora_rank=40"], "deepseek_v3"),
}
TEXT = (
    "ROMEO: But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"
    "JULIET: O Romeo, Romeo! wherefore art thou Romeo?"
)


def greedy(model, prompt: list[int], n: int, eos: int) -> list[int]:
    """Greedy decoding with our model: argmax of a full forward per token, stopping after EOS. (One place, so the
    comparison can switch to diffllm.eval's `generate` when it lands.)"""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(nxt)
            if nxt == eos:
                break
    return ids
