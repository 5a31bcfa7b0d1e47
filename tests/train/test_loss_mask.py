"""The loss of a Batch with a loss mask (data.loss_on=marked) against a hand computation in float64: the mean
(or sum) of -log p(target) over the marked targets only, gradients included; none marked: zero loss, zero
gradients (a finite step, not a skipped one)."""

from __future__ import annotations

import pytest
import torch

from diffllm.data.batch import Batch
from diffllm.model import DecoderLM, ModelConfig
from diffllm.train.loss import lm_loss


def _setup():
    torch.manual_seed(0)
    # float64 throughout (lm_loss keeps float64 logits): the two sides differ by summation order only, not by fp32
    # roundings that cancellation magnifies differently on each CPU (rtol 1e-4 in fp32 failed on CI's CPU).
    model = DecoderLM(ModelConfig(arch="diff", d_model=32, n_layers=2, n_heads=4, vocab_size=53, attn_backend="eager"))
    model = model.double()
    tokens = torch.randint(0, 53, (3, 17))  # (B, T+1)
    marks = torch.rand(3, 17) < 0.3
    return model, tokens, marks


def _by_hand(model, tokens: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
    """sum over b, t with marks[b, t+1] of -log softmax(logits[b, t])[tokens[b, t+1]], in float64."""
    logp = model(tokens[:, :-1]).log_softmax(-1)  # (B, T, V)
    total = torch.zeros((), dtype=torch.float64)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1] - 1):
            if marks[b, t + 1]:
                total = total - logp[b, t, tokens[b, t + 1]]
    return total


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_masked_loss_is_the_hand_computation(reduction):
    model, tokens, marks = _setup()
    loss = lm_loss(model, Batch(tokens, loss_mask=marks), reduction=reduction)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = _by_hand(model, tokens, marks)
    ref = ref / marks[:, 1:].sum() if reduction == "mean" else ref
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-12)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-9, atol=1e-12, msg=name)


def test_a_batch_without_a_marked_target_adds_nothing():
    model, tokens, _ = _setup()
    loss = lm_loss(model, Batch(tokens, loss_mask=torch.zeros_like(tokens, dtype=torch.bool)))
    loss.backward()
    assert float(loss.detach()) == 0.0 and all(float(p.grad.abs().max()) == 0.0 for p in model.parameters())


def test_every_target_marked_is_the_plain_loss_bit_for_bit():
    model, tokens, _ = _setup()
    plain = lm_loss(model, Batch(tokens))
    marked = lm_loss(model, Batch(tokens, loss_mask=torch.ones_like(tokens, dtype=torch.bool)))
    assert torch.equal(plain, marked)
