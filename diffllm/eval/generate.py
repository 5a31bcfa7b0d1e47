"""`diffllm generate`: text from a trained model: greedy / temperature / top-k / top-p sampling, stop strings, a seed.

The decode loop (`decode`) takes a `next_logits(tokens) -> (V,)` function: `cached_forward` runs the prompt once
and then one new token per call against the model's KV cache (diffllm.model.KVCache); `full_forward` re-runs the
whole sequence every time (the reference the cache is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from ..config import run_key_values
from .common import EvalError, inference_mode, load_run, say

if TYPE_CHECKING:  # torch is imported where it is used: `generate --help` imports this module
    import torch


@dataclass
class Sampling:
    """How the next token is chosen. temperature 0 = greedy (top_k/top_p then do nothing)."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int = 0

    def validate(self) -> None:
        if self.temperature < 0:
            raise EvalError(f"temperature={self.temperature}: must be >= 0 (0 is greedy)")
        if self.top_k < 0:
            raise EvalError(f"top_k={self.top_k}: must be >= 0 (0 is off)")
        if not 0.0 < self.top_p <= 1.0:
            raise EvalError(f"top_p={self.top_p}: must be in (0, 1]")


def next_token(logits: torch.Tensor, s: Sampling, gen: Optional[torch.Generator]) -> int:
    """One token from next-token logits (V,): argmax at temperature 0, else a draw from the temperature-scaled
    distribution restricted to the top_k most likely tokens and to the smallest set whose mass reaches top_p."""
    import torch

    if s.temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / s.temperature
    if s.top_k:
        kth = torch.topk(logits, min(s.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= s.top_p  # tokens once the mass before them already reaches top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return int(torch.multinomial(logits.softmax(-1), 1, generator=gen))


def full_forward(model: torch.nn.Module) -> Callable[[List[int]], torch.Tensor]:
    """next_logits for a model without a cache: the whole sequence again, the last position's logits."""
    import torch

    @inference_mode
    def next_logits(tokens: List[int]) -> torch.Tensor:
        return model(torch.tensor([tokens]))[0, -1].float()  # (V,)

    return next_logits


def cached_forward(model: torch.nn.Module) -> Callable[[List[int]], torch.Tensor]:
    """next_logits with a KV cache: the tokens not yet cached (the whole prompt first, then one per call)."""
    import torch

    from ..model import KVCache

    cache = KVCache(model.cfg.max_seq_len)

    @inference_mode
    def next_logits(tokens: List[int]) -> torch.Tensor:
        return model(torch.tensor([tokens[cache.pos :]]), cache)[0, -1].float()  # (V,)

    return next_logits


def check_lengths(n_prompt: int, max_new_tokens: int, max_seq_len: int) -> None:
    if n_prompt == 0:
        raise EvalError('prompt: empty; pass prompt="..."')
    if n_prompt >= max_seq_len:
        raise EvalError(
            f"prompt: {n_prompt} tokens, but the model's context is {max_seq_len} tokens (it must leave "
            f"room for at least one new token)"
        )
    if n_prompt + max_new_tokens > max_seq_len:
        raise EvalError(
            f"max_new_tokens={max_new_tokens}: the prompt's {n_prompt} tokens plus {max_new_tokens} new "
            f"ones exceed the model's context of {max_seq_len}; use max_new_tokens <= "
            f"{max_seq_len - n_prompt}"
        )


def decode(
    next_logits: Callable[[List[int]], torch.Tensor],
    prompt: List[int],
    max_new_tokens: int,
    sampling: Sampling,
    eos_id: Optional[int] = None,
    stop: tuple = (),
    detok: Optional[Callable[[List[int]], str]] = None,
) -> tuple[List[int], str]:
    """(new tokens, why it stopped: eos | stop | length). Stops after EOS (not returned), or once the decoded new
    text contains a stop string (`detok` decodes new tokens; the caller cuts the text at the stop string)."""
    import torch

    sampling.validate()
    gen = torch.Generator().manual_seed(sampling.seed) if sampling.temperature > 0 else None
    tokens, new = list(prompt), []
    for _ in range(max_new_tokens):
        t = next_token(next_logits(tokens), sampling, gen)
        if t == eos_id:
            return new, "eos"
        tokens.append(t)
        new.append(t)
        if stop and detok is not None and any(s in detok(new) for s in stop):
            return new, "stop"
    return new, "length"


def cut_at_stop(text: str, stop: tuple) -> str:
    cuts = [text.index(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def generate(
    model: torch.nn.Module,
    tok,
    prompt: str,
    max_new_tokens: Optional[int] = None,
    sampling: Optional[Sampling] = None,
    stop: tuple = (),
    use_cache: bool = True,
) -> dict:
    """{text, tokens, stopped} for one prompt; max_new_tokens None = up to the model's context."""
    ids = tok.encode(prompt)
    limit = model.cfg.max_seq_len
    max_new = limit - len(ids) if max_new_tokens is None else max_new_tokens
    check_lengths(len(ids), max(max_new, 1), limit)
    step = cached_forward(model) if use_cache else full_forward(model)
    new, why = decode(step, ids, max_new, sampling or Sampling(), tok.eos_id, tuple(stop), tok.decode)
    return {"text": cut_at_stop(tok.decode(new), tuple(stop)), "tokens": new, "stopped": why}


@dataclass
class GenerateConfig:
    """Continue a prompt with a trained model: greedy (temperature=0) or sampled, stopping at EOS, a stop string or
    max_new_tokens."""

    run: str = ""  # a run directory (or its checkpoints/step<N> folder)
    step: Any = "latest"  # latest, or a checkpoint's step number
    prompt: str = ""  # the text to continue (quote it)
    max_new_tokens: Optional[int] = 100  # null: up to the model's context
    temperature: float = 0.0  # 0: greedy; > 0: sample from softmax(logits / temperature)
    top_k: int = 0  # sample among the k most likely tokens only (0: off)
    top_p: float = 1.0  # sample among the smallest set of tokens whose probability reaches top_p (1.0: off)
    seed: int = 0  # of the sampling generator: the same seed gives the same text
    stop: List[str] = field(default_factory=list)  # stop once the new text contains one of these (cut there)


def run_generate(c: GenerateConfig) -> dict:
    if not c.prompt:
        raise EvalError('prompt: empty; pass prompt="..."')
    sampling = Sampling(c.temperature, c.top_k, c.top_p, c.seed)
    sampling.validate()  # before the run is loaded
    if c.max_new_tokens is not None and c.max_new_tokens < 1:
        raise EvalError(f"max_new_tokens={c.max_new_tokens}: must be >= 1 (null: up to the model's context)")
    _, _, model, tok = load_run(c.run, c.step)
    out = generate(model, tok, c.prompt, c.max_new_tokens, sampling, tuple(c.stop))
    print(c.prompt + out["text"])
    say(f"{len(out['tokens'])} new tokens, stopped at {out['stopped']}")
    return out


def main(argv: Optional[list[str]] = None) -> None:
    run_key_values("generate", GenerateConfig, run_generate, argv)


if __name__ == "__main__":
    main()
