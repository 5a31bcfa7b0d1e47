"""A variant whose forward has no `docs` parameter is refused when it registers, in one line naming it and the fix
(before: it registered, and the first forward with document masks died in a TypeError inside Block)."""

from __future__ import annotations

import pytest

from diffllm.errors import UserError
from diffllm.model import variants
from diffllm.model.registry import register
from diffllm.model.standard_attention import StandardAttention


class NoDocs(StandardAttention):
    """The Transformer, with a forward written before document masks existed."""

    arch, label, color, baseline = "nodocs", "No docs", "tab:gray", False

    def forward(self, x, cos, sin, cache=None):
        return super().forward(x, cos, sin, cache)


def test_a_variant_whose_forward_lacks_docs_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"variant NoDocs \(arch 'nodocs'\): its forward has no `docs` parameter") as e:
        register(NoDocs)
    assert "\n" not in str(e.value) and "docs=None" in str(e.value)
    assert "nodocs" not in variants()
