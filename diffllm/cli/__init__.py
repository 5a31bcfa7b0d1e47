"""`diffllm <command>`, the package's top: main.py dispatches over registry.py (one entry per command, each naming the
function it runs and its typed configs) and help.py answers --help. Nothing else in diffllm imports this package;
diffllm.config reads a command's typed configs from registry.py by name, as data ("module:Dataclass" strings)."""

from .main import main

__all__ = ["main"]
