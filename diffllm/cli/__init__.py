"""`diffllm <command>`, the package's top: main.py dispatches over registry.py (one entry per command, each naming the
function it runs) and help.py answers --help. Nothing else in diffllm imports this package."""
from .main import main

__all__ = ["main"]
