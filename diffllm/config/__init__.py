"""Configs, the one path every command, preset and test loads them by: loading.py (the search path, composing a
command's config or a group file, typed dataclasses), app.py (`@hydra_app`: how a Hydra command runs) and help.py
(its --help). At the bottom of the package: it imports no other part of diffllm."""
from .app import hydra_app
from .loading import (CONFIG_DIR, CONFIG_PATH_ENV, EXIT_BAD_INPUT, SCHEMAS, build, check_group_options, check_typed,
                      compose, config_groups, explain, fail, field_defaults, find_config,
                      from_key_values, group_defaults, group_options, load_group,
                      plus_to_force, register_schema, schema_for, schema_node, search_path, set_env, take_config_dirs,
                      use_search_path)

__all__ = ["hydra_app", "CONFIG_DIR", "CONFIG_PATH_ENV", "EXIT_BAD_INPUT", "SCHEMAS", "build", "check_group_options",
           "check_typed", "compose", "config_groups", "explain", "fail", "field_defaults", "find_config", "from_key_values", "group_defaults",
           "group_options", "load_group", "plus_to_force", "register_schema", "schema_for", "schema_node",
           "search_path", "set_env", "take_config_dirs", "use_search_path"]
