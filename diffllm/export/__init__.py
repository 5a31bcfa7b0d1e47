"""Hugging Face export and import: `export_run` (a run -> an HF directory), `load_pretrained` and `import_hf` (an HF
directory -> our weights / a run at step 0). transformers is imported only when one of them runs."""

from .hf import choose_format, export_run
from .hf_import import import_hf, load_pretrained

__all__ = ["choose_format", "export_run", "import_hf", "load_pretrained"]
