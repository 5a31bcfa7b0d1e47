"""A synthetic sweep directory as the trainer and the grid write it: <sweep>/<model>/<tokens>/<axis labels>/seed<s>/
with config.yaml (a real data config over a tiny corpus written here, so the baselines are real), tokenizer.json,
summary.json (losses chosen by the test) and metrics.jsonl; plus an independent float64 computation of the bigram
and unigram baselines from the trainer's own TrainLoader and validation batches.

`write_law_sweep` writes a size x budget grid whose losses come from known laws L(N, D) instead (no data config: no
baselines). `python -m tests.scaling.synthetic <dir>` writes the one docs/scaling.md fits."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from diffllm.config import build
from diffllm.data import DataConfig, Tokenizer, TokenizerConfig, build_train_loader
from diffllm.data.loader import held_out_windows
from diffllm.data.tokenizer import train_bpe
from diffllm.model.accounting import model_stats
from diffllm.model.presets import load_preset
from diffllm.results import kaplan_n

WORDS = "the king of love and death my lord good sir what is thy name speak now o cruel fate".split()
SEQ, MICRO, BATCH_TOKENS, TOKENS, VAL_BATCHES = 16, 4, 64, 640, 4  # 10 steps of one 4 x 16 micro-batch


def write_corpus(root: Path) -> tuple[Path, Path]:
    rng = random.Random(0)
    for split, n in (("train", 3), ("val", 1)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for f in range(n):
            docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(40)]
            (root / split / f"part-{f}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return root / "train", root / "val"


def tokenizer(corpus: Path) -> Tokenizer:
    texts = [p.read_text() for p in sorted((corpus / "train").glob("*.jsonl"))]
    return Tokenizer(train_bpe(iter(texts), TokenizerConfig(vocab_size=300, min_frequency=1)), "<|endoftext|>", "t")


def data_node(corpus: Path, seed: int, tok_path: str, num_streams=None) -> dict:
    return {
        "name": "tiny",
        "seq_len": SEQ,
        "seed": seed,
        "num_workers": 0,
        "num_streams": num_streams,
        "sources": [{"name": "train", "path": str(corpus / "train" / "*.jsonl")}],
        "val": [{"name": "val", "path": str(corpus / "val" / "*.jsonl")}],
        "tokenizer": {"path": tok_path, "vocab_size": 300},
    }


def write_run(
    root: Path,
    model: str,
    seed: int,
    loss: float,
    tok: Tokenizer,
    corpus: Path,
    lr: float,
    lambda_init=None,
    labels: str = "",
) -> Path:
    run = root / model / str(TOKENS) / (labels or f"lr={lr:g}") / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "tokenizer.json").write_text(tok.tk.to_str())
    preset = load_preset(model)
    config = {
        "model": {**dataclasses.asdict(preset), "lambda_init": lambda_init},
        "data": data_node(corpus, seed, str(run / "tokenizer.json")),
        "trainer": {
            "tokens": TOKENS,
            "global_batch_tokens": BATCH_TOKENS,
            "micro_batch_size": MICRO,
            "val_batches": VAL_BATCHES,
            "resume": "auto",
        },
        "optim": {"lr": lr, "warmup_steps": 2},
        "logging": {"wandb": "disabled"},
        "seed": seed,
        "run_dir": str(run),
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    s = model_stats(preset)
    (run / "summary.json").write_text(
        json.dumps(
            {
                "model": model,
                "arch": preset.arch,
                "total_params": s.total_params,
                "nonembedding_params": s.nonembedding_params,
                "tokens": TOKENS,
                "flops": 1.0,
                "final_train_loss": loss,
                "final_val_loss": loss,
                "wall_time_s": 1.0,
                "world_size": 1,
                "status": "finished",
                "seed": seed,
            }
        )
    )
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "tokens": TOKENS, "val_loss": loss}) + "\n")
    return run


def expected_baselines(corpus: Path, seed: int, tok: Tokenizer, k: float) -> tuple[float, float]:
    """(unigram, bigram) by plain Python counting over the windows the trainer's own loader yields (10 steps of one
    micro-batch) and the validation batches it scores, float64 throughout."""
    data = build(DataConfig, data_node(corpus, seed, "unused"), "data")
    loader = build_train_loader(data, tok, 0, 1, MICRO)
    train = [w.tolist() for _ in range(TOKENS // BATCH_TOKENS) for w in next(loader).tokens]
    val = [w[0].tolist() for ws in held_out_windows(data, tok).values() for w in ws]  # the whole held-out set
    loader.close()
    return hand_baselines(train, val, tok.vocab_size, k)


def hand_baselines(train: list[list[int]], val: list[list[int]], vocab: int, k: float) -> tuple[float, float]:
    uni, pair, ctx = Counter(), Counter(), Counter()
    for w in train:
        for a, b in zip(w[:-1], w[1:]):
            uni[b] += 1
            pair[a, b] += 1
            ctx[a] += 1
    n = sum(uni.values())
    p_uni = {b: (uni[b] + 1) / (n + vocab) for b in range(vocab)}
    scored = [(a, b) for w in val for a, b in zip(w[:-1], w[1:])]
    unigram = -sum(math.log(p_uni[b]) for _, b in scored) / len(scored)
    bigram = -sum(math.log((pair[a, b] + k * p_uni[b]) / (ctx[a] + k)) for a, b in scored) / len(scored)
    return unigram, bigram


def write_law_sweep(
    root: Path,
    laws: dict,
    budgets=(524288,),
    seeds=lambda size: (1234,),
    noise: float = 0.0,
    curve_points: int = 8,
    seq_len: int = 128,
    sizes=(1, 2, 3, 4),
    rng_seed: int = 0,
) -> None:
    """<root>/<arch>-micro-<size>/<budget>/seed<s> for each arch of `laws` (arch -> JointLaw in Kaplan's N), size,
    budget and seed: config.yaml (the preset's model, data.seq_len), summary.json (flops = model_stats' FLOPs per
    token at seq_len x tokens, as the trainer writes it) and metrics.jsonl (step 0, then `curve_points` evaluations up
    to the budget); every loss is law(N, D) x exp(normal(0, noise))."""
    rng = np.random.default_rng(rng_seed)
    for arch, law in laws.items():
        for size in sizes:
            model = f"{arch}-micro-{size}"
            preset = load_preset(model)
            s = model_stats(preset, seq_len)
            n = kaplan_n(s, preset.tie_embeddings)
            for budget in budgets:
                for seed in seeds(size):
                    run = root / model / str(budget) / f"seed{seed}"
                    run.mkdir(parents=True)
                    tokens = np.linspace(budget / curve_points, budget, curve_points).astype(int)
                    losses = law(n, tokens) * np.exp(rng.normal(0, noise, len(tokens)))
                    lines = [{"step": 0, "tokens": 0, "val_loss": 7.0}] + [
                        {"step": int(t // 2048), "tokens": int(t), "val_loss": float(v)} for t, v in zip(tokens, losses)
                    ]
                    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
                    (run / "config.yaml").write_text(
                        yaml.safe_dump(
                            {"model": dataclasses.asdict(preset), "data": {"seq_len": seq_len}, "seed": seed}
                        )
                    )
                    (run / "summary.json").write_text(
                        json.dumps(
                            {
                                "model": model,
                                "arch": arch,
                                "total_params": s.total_params,
                                "nonembedding_params": s.nonembedding_params,
                                "tokens": budget,
                                "flops": s.flops_per_token * budget,
                                "final_train_loss": float(losses[-1]),
                                "final_val_loss": float(losses[-1]),
                                "wall_time_s": 1.0,
                                "world_size": 1,
                                "status": "finished",
                                "seed": seed,
                            }
                        )
                    )


# E, A, alpha, B, beta; Diff's law reaches the Transformer's loss with 70% of its N and 80% of its D (test_fit's)
DOC_LAWS = {"transformer": (1.5, 60.0, 0.35, 900.0, 0.4), "diff": (1.5, 60.0 * 0.7**0.35, 0.35, 900.0 * 0.8**0.4, 0.4)}

if __name__ == "__main__":  # the sweep of docs/scaling.md's compute-optimal example
    import sys

    from diffllm.scaling.fit import JointLaw

    write_law_sweep(
        Path(sys.argv[1]),
        {a: JointLaw(*p) for a, p in DOC_LAWS.items()},
        budgets=(524288, 1048576, 2097152, 4194304),
        seeds=lambda size: (1, 2),
        noise=0.003,
    )
