"""``run.attention.*``: the calls of ``scaled_dot_product_attention`` and whether the masks
they were given were just the causal pattern (``attention_readings.py``)."""

from __future__ import annotations

from pytest_gputrain.facts import FactGroup, fact
from pytest_gputrain.probe.run_record import AttentionReadings


class AttentionFacts(FactGroup):
    """``torch.nn.functional.scaled_dot_product_attention`` in the test's training."""

    calls: int = fact(doc="scaled_dot_product_attention calls", default=0, count=True)
    is_causal_calls: int = fact(doc="of those, with is_causal=True", default=0, count=True)
    masked_calls: int = fact(doc="of those, given an attn_mask", default=0, count=True)
    masked_percent: float | None = fact("%", "masked_calls / calls")
    max_query_len: int | None = fact(doc="the longest query sequence of a masked call")
    mask_dtype: str | None = fact(doc="dtype of the first attn_mask (bool, or a float bias)")
    site: str | None = fact(doc="the line that made the first masked call")
    checked_masks: int = fact(
        doc="masks compared with the causal pattern on their device (the first masked calls)",
        default=0, count=True)
    causal_masks: int | None = fact(
        doc="of those, masks that were exactly the causal pattern (lower-triangular, top-left "
            "aligned; a float mask: 0 on and below the diagonal, anything else above)")
    causal_percent: float | None = fact("%", "causal_masks / checked_masks")


def attention_facts(readings: AttentionReadings) -> AttentionFacts:
    facts = AttentionFacts(calls=readings.calls, is_causal_calls=readings.is_causal_calls,
                           masked_calls=readings.masked_calls, mask_dtype=readings.mask_dtype,
                           site=readings.site, checked_masks=len(readings.checks))
    if readings.calls:
        facts.masked_percent = round(100.0 * readings.masked_calls / readings.calls, 2)
    if readings.masked_calls:
        facts.max_query_len = readings.max_query_len
    if readings.causal is not None and readings.checks:
        facts.causal_masks = readings.causal
        facts.causal_percent = round(100.0 * readings.causal / len(readings.checks), 2)
    elif readings.unread:
        facts.mark_unknown("causal_masks", readings.unread)
    return facts
