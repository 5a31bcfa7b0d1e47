"""Configs, the one path every command, preset and test loads them by: loading.py (the search path, composing a
command's config or a group file, typed dataclasses in Hydra's ConfigStore), app.py (how a `key=value` command runs:
`@hydra_app` over a config file, `run_key_values` over a dataclass alone) and help.py (their --help). At the bottom of
the package: it imports no other part of diffllm and names none; each command declares its own typed configs."""

from .app import hydra_app, one_line_errors, run_key_values
from .loading import (
    CONFIG_DIR,
    CONFIG_PATH_ENV,
    build,
    check_group_options,
    check_typed,
    compose,
    config_groups,
    declare,
    fail,
    find_config,
    from_key_values,
    group_defaults,
    group_options,
    load_group,
    register_schema,
    schema_for,
    schema_node,
    search_path,
    take_config_dirs,
)

__all__ = [
    "hydra_app",
    "one_line_errors",
    "run_key_values",
    "CONFIG_DIR",
    "CONFIG_PATH_ENV",
    "build",
    "check_group_options",
    "check_typed",
    "compose",
    "config_groups",
    "declare",
    "fail",
    "find_config",
    "from_key_values",
    "group_defaults",
    "group_options",
    "load_group",
    "register_schema",
    "schema_for",
    "schema_node",
    "search_path",
    "take_config_dirs",
]
