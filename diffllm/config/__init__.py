"""Configs, the one path every command, preset and test loads them by: loading.py (the search path, composing a
command's config or a group file, typed dataclasses), app.py (how a `key=value` command runs: `@hydra_app` over a
config file, `run_key_values` over a schema alone) and help.py (their --help). At the bottom of the package: it imports
no other part of diffllm; the typed configs a command holds are named in its registry entry (diffllm/cli/registry.py)
and read from there by name, as strings."""

from .app import hydra_app, one_line_errors, run_key_values
from .loading import (
    CONFIG_DIR,
    CONFIG_PATH_ENV,
    EXIT_BAD_INPUT,
    build,
    check_group_options,
    check_typed,
    compose,
    config_groups,
    explain,
    fail,
    field_defaults,
    find_config,
    from_key_values,
    group_defaults,
    group_options,
    load_group,
    plus_to_force,
    register_schema,
    schema_for,
    schema_node,
    search_path,
    set_env,
    take_config_dirs,
    use_search_path,
)

__all__ = [
    "hydra_app",
    "one_line_errors",
    "run_key_values",
    "CONFIG_DIR",
    "CONFIG_PATH_ENV",
    "EXIT_BAD_INPUT",
    "build",
    "check_group_options",
    "check_typed",
    "compose",
    "config_groups",
    "explain",
    "fail",
    "field_defaults",
    "find_config",
    "from_key_values",
    "group_defaults",
    "group_options",
    "load_group",
    "plus_to_force",
    "register_schema",
    "schema_for",
    "schema_node",
    "search_path",
    "set_env",
    "take_config_dirs",
    "use_search_path",
]
