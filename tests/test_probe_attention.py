"""The attention calls (``probe/attention_readings.py``, ``run.attention.*``, GT155): a causal
mask given as a tensor is told apart from other masks, on the mask's device, with no sync while
the test trains."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pytest_gputrain.probe import run
from pytest_gputrain.probe.facts import RunFacts
from pytest_gputrain.probe.torch_hooks import global_hook_counts

LENGTH = 16


def _trained(attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
             steps: int = 6) -> RunFacts:
    torch.manual_seed(0)
    qkv, head = torch.nn.Linear(8, 24), torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD([*qkv.parameters(), *head.parameters()], lr=0.01)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for _ in range(steps):
            q, k, v = qkv(torch.randn(2, LENGTH, 8)).view(2, LENGTH, 3, 2, 4).permute(
                2, 0, 3, 1, 4)
            out = attend(q, k, v).transpose(1, 2).reshape(2, LENGTH, 8)
            loss = head(out).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        probe.stop()
    assert global_hook_counts(torch) == dict.fromkeys(global_hook_counts(torch), 0)
    return probe.facts()


CAUSAL = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()


def test_a_boolean_causal_mask_is_found_with_the_line_that_passed_it() -> None:
    facts = _trained(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=CAUSAL))
    attention = facts.attention
    assert attention.calls == 6 and attention.masked_calls == 6 and attention.is_causal_calls == 0
    assert attention.checked_masks == 4 and attention.causal_masks == 4
    assert attention.causal_percent == 100.0 and attention.max_query_len == LENGTH
    assert attention.mask_dtype == "bool" and attention.site is not None
    assert attention.site.startswith("`facts = _trained(lambda q, k, v: F.scaled_dot_product")


def test_an_additive_causal_mask_is_found_too() -> None:
    additive = torch.zeros(LENGTH, LENGTH).masked_fill(~CAUSAL, float("-inf"))
    facts = _trained(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, additive))
    assert facts.attention.causal_masks == 4 and facts.attention.mask_dtype == "float32"


@pytest.mark.parametrize("mask", [
    CAUSAL & torch.tensor([True] * (LENGTH - 3) + [False] * 3),  # causal and padding
    torch.ones(LENGTH, LENGTH, dtype=torch.bool).triu(),  # not causal
    torch.zeros(LENGTH, LENGTH).masked_fill(~CAUSAL, float("-inf"))
    + torch.arange(LENGTH).float().neg().view(1, -1) * 0.1,  # an ALiBi-like bias
], ids=["causal-and-padding", "upper", "bias"])
def test_other_masks_are_not_called_causal(mask: torch.Tensor) -> None:
    facts = _trained(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert facts.attention.masked_calls == 6 and facts.attention.causal_masks == 0


def test_is_causal_is_counted_and_checks_nothing() -> None:
    facts = _trained(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    attention = facts.attention
    assert attention.calls == 6 and attention.is_causal_calls == 6 and attention.masked_calls == 0
    assert attention.checked_masks == 0 and attention.causal_masks is None


@pytest.mark.parametrize("hint", [True, False])
def test_a_transformer_encoder_is_seen_through_its_attention(hint: bool) -> None:
    """nn.MultiheadAttention calls scaled_dot_product_attention: a causal mask with the
    is_causal hint becomes is_causal=True there; without the hint it stays a mask tensor."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(LENGTH)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.01)
    probe = run.RunProbe(torch, "t::x", profile_steps=None, sampler=False)
    probe.start()
    try:
        for _ in range(4):
            loss = encoder(torch.randn(2, LENGTH, 8), mask=mask, is_causal=hint).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        probe.stop()
    attention = probe.facts().attention
    assert attention.calls == 4
    assert (attention.is_causal_calls, attention.masked_calls) == ((4, 0) if hint else (0, 4))
    assert attention.causal_masks == (None if hint else 4)
