"""Hugging Face export and import: `export_run` (a run -> an HF directory), `load_pretrained` and `import_hf` (an HF
directory -> our weights / a run at step 0). Nothing heavy is imported with the package (the export and import
commands' --help reads their configs here without torch): each name loads its module on first use, and transformers
is imported only when one of them runs."""

from importlib import import_module

_WHERE = {"choose_format": "hf", "export_run": "hf", "import_hf": "hf_import", "load_pretrained": "hf_import"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
