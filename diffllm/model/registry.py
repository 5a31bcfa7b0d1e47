"""The registry of attention variants: `model.arch` -> its class (diffllm/model/variant.py). Light: no torch until a
variant module is imported, so ModelConfig validates against it on import.

The built-in variants are diffllm/model/*attention.py; a user's are the modules named in the environment variable
`DIFFLLM_VARIANTS=pkg.mod,other_mod` (importable, e.g. on PYTHONPATH), imported by `variants()` in every process that
looks a variant up (a launcher's children inherit the variable). Nothing outside `diffllm/model/` compares `arch`
strings.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import pkgutil

from ..errors import UserError

_REGISTRY: dict[str, type] = {}
_LOADED = False
ENV = "DIFFLLM_VARIANTS"  # comma-separated modules that register more variants


def register(cls: type) -> type:
    """Class decorator: make `cls` (an AttentionVariant) the variant for `model.arch = cls.arch`. Its forward must
    take `docs` (document masks): a forward without it is refused here, in one line, not at the first masked step."""
    if "docs" not in inspect.signature(cls.forward).parameters:
        raise UserError(
            f"variant {cls.__name__} (arch {cls.arch!r}): its forward has no `docs` parameter, which "
            f"document masks (data.doc_mask) hand in; leave forward to AttentionVariant (declare project, "
            f"mix, finish) or take docs=None and pass it to causal_attention"
        )
    if cls.arch in _REGISTRY and _REGISTRY[cls.arch] is not cls:
        raise UserError(f"arch {cls.arch!r} registered twice ({_REGISTRY[cls.arch].__name__}, {cls.__name__})")
    _REGISTRY[cls.arch] = cls
    return cls


def variants() -> dict[str, type]:
    """Every registered variant by arch name: the baseline first, then by name (the built-in modules, then those
    named in $DIFFLLM_VARIANTS)."""
    global _LOADED
    if not _LOADED:  # import every diffllm/model/*attention.py once; their @register fills the table
        here = [os.path.dirname(__file__)]  # this package's folder (not the package: it imports this module)
        for mod in sorted(m.name for m in pkgutil.iter_modules(here) if m.name.endswith("attention")):
            importlib.import_module(f"{__package__}.{mod}")
        _LOADED = True
    for name in filter(None, (m.strip() for m in os.environ.get(ENV, "").split(","))):
        try:
            importlib.import_module(name)  # cached after the first time; its @register fills the table
        except ImportError as e:
            raise UserError(f"{ENV}: cannot import {name!r} ({e})") from None
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (not kv[1].baseline, kv[0])))


def variant(arch: str) -> type:
    """The class for `arch`; an unknown name is a one-line UserError with the nearest valid name."""
    table = variants()
    if arch not in table:
        near = difflib.get_close_matches(str(arch), table, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise UserError(f"model.arch: got {arch!r}, expected one of {tuple(table)}{hint}")
    return table[arch]


def baseline() -> type:
    return next(v for v in variants().values() if v.baseline)
