"""diffllm/counts.py: the one parser of token and parameter counts."""

import pytest

from diffllm.counts import parse_count


@pytest.mark.parametrize(
    "value,n",
    [
        ("20M", 20_000_000),
        ("1.5B", 1_500_000_000),
        ("2T", 2 * 10**12),
        ("5b", 5 * 10**9),
        ("524288", 524288),
        (" 4096 ", 4096),
        ("1e9", 10**9),
        ("2e9", 2 * 10**9),
        ("1.5K", 1500),
        ("1_000", 1000),
        (7, 7),
        (2.0e9, 2 * 10**9),
        ("0.5M", 500_000),
    ],
)
def test_counts(value, n):
    assert parse_count(value, "trainer.tokens") == n


@pytest.mark.parametrize(
    "value,match",
    [
        ("lots", r"^tokens: expected a count like 20M, 1.5B or 4096, got 'lots'$"),
        ("5X", "expected a count"),
        ("", "expected a count"),
        ("1..5M", "expected a count"),
        (True, "expected a count"),
        ("nan", "expected a count"),
        ("inf", "expected a count"),
        ("1.5", r"^tokens: '1.5' is not a whole number \(1.5\)$"),
        ("1.0000005M", "not a whole number"),
        (2.5, "not a whole number"),
        ("-5B", r"^tokens: must be positive, got '-5B'$"),
        (0, "must be positive"),
        ("0", "must be positive"),
    ],
)
def test_bad_counts_are_one_line_errors_naming_the_key(value, match):
    with pytest.raises(ValueError, match=match):
        parse_count(value, "tokens")


def test_zero_where_it_means_something():
    assert parse_count("0", "eval_tokens", minimum=0) == 0
    with pytest.raises(ValueError, match="eval_tokens: must be at least 0, got '-1'"):
        parse_count("-1", "eval_tokens", minimum=0)


def test_the_two_parsers_that_disagreed_are_one():
    """Issue 19: `1_000` (refused by the trainer's old parser) is 1000; `1.0000005M` (which it rounded to a million)
    is half a token too many: refused, naming the key and the value."""
    from diffllm.train.config import TrainerConfig, plan_budget

    assert parse_count("1_000", "trainer.tokens") == 1000
    with pytest.raises(ValueError, match=r"^trainer\.tokens: '1\.0000005M' is not a whole number \(1000000\.5\)$"):
        parse_count("1.0000005M", "trainer.tokens")
    assert (
        plan_budget(TrainerConfig(tokens="1_000", global_batch_tokens=1000, micro_batch_size=1), 1000, 1).tokens == 1000
    )
    with pytest.raises(ValueError, match=r"^trainer\.tokens: '1\.0000005M' is not a whole number"):
        plan_budget(TrainerConfig(tokens="1.0000005M", global_batch_tokens=1000, micro_batch_size=1), 1000, 1)
