"""`diffllm study <name> key=value ...`: the studies that turn collected sweeps into the tables and figures of
docs/micro-*.md, written beside their runs in results/micro-*/; one module per study (each a typed `Config`, a
`run(config)` and a `main()`; each is a registry entry of its own, diffllm/cli/registry.py, as the eval commands are),
what they share in common.py."""
