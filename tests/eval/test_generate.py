"""generate: greedy decoding equals an independent float64 argmax loop; sampling draws from exactly the distribution
that temperature / top-k / top-p define; stop strings, EOS and the context limit end it; bad input is one line."""

from __future__ import annotations

import pytest
import torch

from diffllm.eval.generate import Sampling, cached_forward, decode, full_forward, generate, main, next_token
from diffllm.model import DecoderLM, ModelConfig, variants

PROMPT = "KING HENRY:\nOnce more unto the breach"


@pytest.mark.parametrize("arch", ["transformer", "diff"])
def test_greedy_equals_a_float64_argmax_loop(loaded, arch):
    cfg, model, tok = loaded(arch)
    got = generate(model, tok, PROMPT, max_new_tokens=12)
    ids = tok.encode(PROMPT)
    ref = model.double()
    try:
        for _ in range(len(got["tokens"])):
            with torch.no_grad():
                ids.append(int(ref(torch.tensor([ids]))[0, -1].argmax()))
    finally:
        model.float()
    assert got["tokens"] == ids[len(tok.encode(PROMPT)) :] and got["stopped"] in ("length", "eos")


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", list(variants()))
def test_greedy_with_the_kv_cache_equals_greedy_over_the_full_forward(arch, backend):
    """Every registered architecture (diff2 included), MHA and GQA in one model each: the cached decode (prompt once,
    then one token per step) picks the same 40 tokens as re-running the whole sequence every step."""
    torch.manual_seed(0)
    model = DecoderLM(
        ModelConfig(
            arch=arch,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            vocab_size=300,
            max_seq_len=64,
            attn_backend=backend,
        )
    ).eval()
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    full, _ = decode(full_forward(model), prompt, 40, Sampling())
    cached, _ = decode(cached_forward(model), prompt, 40, Sampling())
    assert cached == full and len(full) == 40


def test_the_cache_is_bounded_by_the_context(loaded):
    cfg, model, tok = loaded("diff")
    with pytest.raises(ValueError, match=f"sequence length {cfg.max_seq_len + 1} exceeds model.max_seq_len"):
        decode(cached_forward(model), [1] * (cfg.max_seq_len - 2), 5, Sampling())


def frequencies(logits: torch.Tensor, s: Sampling, n: int = 6000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(s.seed)
    counts = torch.zeros(len(logits))
    for _ in range(n):
        counts[next_token(logits, s, gen)] += 1
    return counts / n


LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


@pytest.mark.parametrize(
    "s, expected",
    [
        (Sampling(temperature=1.0), [0.5, 0.3, 0.15, 0.05]),
        (
            Sampling(temperature=2.0),
            (
                torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 0.5 / (torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 0.5).sum()
            ).tolist(),
        ),
        (Sampling(temperature=1.0, top_k=2), [0.625, 0.375, 0.0, 0.0]),
        (Sampling(temperature=1.0, top_p=0.7), [0.625, 0.375, 0.0, 0.0]),  # 0.5 < 0.7 <= 0.8: the first two
        (Sampling(temperature=1.0, top_p=0.85), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
        (Sampling(temperature=1.0, top_k=3, top_p=0.5), [1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_sampling_draws_from_the_defined_distribution(s, expected):
    got = frequencies(LOGITS, s)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float32), atol=0.025), got


def test_seed_reproduces_and_top_k_1_is_greedy(loaded):
    _, model, tok = loaded("diff")
    a = generate(model, tok, PROMPT, 10, Sampling(temperature=1.0, seed=3))
    b = generate(model, tok, PROMPT, 10, Sampling(temperature=1.0, seed=3))
    c = generate(model, tok, PROMPT, 10, Sampling(temperature=1.0, seed=4))
    assert a == b and a["tokens"] != c["tokens"]
    assert (
        generate(model, tok, PROMPT, 10, Sampling(temperature=0.7, top_k=1))["tokens"]
        == generate(model, tok, PROMPT, 10)["tokens"]
    )


def test_stop_strings_and_eos_end_generation(loaded):
    _, model, tok = loaded("transformer")
    full = generate(model, tok, PROMPT, 20, Sampling(temperature=1.0, seed=1))
    stop = full["text"][5:7]
    cut = generate(model, tok, PROMPT, 20, Sampling(temperature=1.0, seed=1), stop=(stop,))
    assert cut["stopped"] == "stop" and cut["text"] == full["text"][: full["text"].index(stop)]
    eos_first = lambda tokens: torch.nn.functional.one_hot(torch.tensor(tok.eos_id), 1024).float()  # noqa: E731
    assert decode(eos_first, [1, 2], 5, Sampling(), tok.eos_id) == ([], "eos")


def test_prompt_and_context_limits_are_one_line_errors(runs, capsys):
    run = runs("diff")
    long_prompt = "word " * 200  # > 128 tokens: the tiny runs' context
    for argv, message in [
        ([f"prompt={long_prompt}"], "the model's context is 128 tokens"),
        (["prompt=Hello", "max_new_tokens=500"], "use max_new_tokens <="),
        (["prompt="], "prompt: empty"),
        (["prompt=Hi", "top_p=0"], "top_p=0"),
        (["prompt=Hi", "temprature=1"], "did you mean temperature?"),
    ]:
        with pytest.raises(SystemExit):
            main([f"run={run}", *argv])
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_command_prints_the_continuation(runs, capsys):
    main([f"run={runs('diff')}", f"prompt={PROMPT}", "max_new_tokens=8", "stop=XYZ"])
    out = capsys.readouterr()
    assert out.out.startswith(PROMPT) and "new tokens, stopped at" in out.err


@pytest.mark.parametrize("quoted", ["'KING HENRY:'", '"KING HENRY:"'])
def test_one_pair_of_quotes_around_a_value_is_hydra_quoting(runs, capsys, quoted):
    """`diffllm generate run=... "prompt='KING HENRY:'"`: the shell passes the quotes; the prompt is what they hold."""
    main([f"run={runs('transformer')}", f"prompt={quoted}", "max_new_tokens=3"])
    assert capsys.readouterr().out.startswith("KING HENRY:")
