"""`@hydra_app("<config>")`: how every Hydra command runs: --help from diffllm/help.py, the config search path, the
typed configs built before the command body, and every bad input (a composition error or the command's own
ValueError) as one line on stderr with exit code 2. Above config.py and help.py, below the commands."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import hydra
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from .config import (CONFIG_DIR, check_typed, explain, fail, plus_to_force, register_schema, set_env, take_config_dirs,
                     use_search_path)


def program(config_name: str) -> str:
    """`diffllm train` for the messages: the dispatcher's argv[0], else the command registered on this config."""
    if sys.argv and sys.argv[0].startswith("diffllm "):
        return sys.argv[0]
    from .commands import command_for_config

    cmd = command_for_config(config_name)
    return f"diffllm {cmd.name}" if cmd else f"diffllm {config_name}"


def hydra_app(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """`@hydra_app("train")`: a Hydra app on configs/train.yaml along the search path. `-h/--help` prints the
    command's help; an unknown key or option, a wrong type or an invalid value is one line on stderr, exit code 2."""

    def decorate(task: Callable[[DictConfig], Any]) -> Callable[[], Any]:
        @functools.wraps(task)
        def run() -> Any:
            prog = program(config_name)
            argv = sys.argv[1:]
            if "-h" in argv or "--help" in argv:
                from .help import command_help

                print(command_help(config_name, prog))
                raise SystemExit(0)
            argv = take_config_dirs(argv)
            schema = register_schema(config_name)
            argv = plus_to_force(argv, schema)
            use_search_path()
            sys.argv = [sys.argv[0]] + argv
            user_full_error = os.environ.get("HYDRA_FULL_ERROR")

            def checked(cfg: DictConfig) -> Any:
                set_env("HYDRA_FULL_ERROR", user_full_error)  # the task's own errors as Hydra reports them
                try:
                    check_typed(cfg, schema)
                except ValueError as e:
                    fail(prog, str(e))
                try:
                    return task(cfg)
                except ValueError as e:  # the command's own bad-input errors: one line naming the culprit, exit 2
                    if user_full_error == "1":
                        raise
                    fail(prog, str(e))
                finally:
                    os.environ["HYDRA_FULL_ERROR"] = "1"

            app = hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base=None)(checked)
            os.environ["HYDRA_FULL_ERROR"] = "1"  # raise composition errors here rather than print 6-35 lines
            try:
                return app()
            except Exception as e:  # noqa: BLE001 - composition errors; a user asking for full errors gets them
                from hydra.errors import HydraException

                if user_full_error == "1" or not isinstance(e, (HydraException, OmegaConfBaseException)):
                    raise
                fail(prog, explain(e, config_name, argv))
            finally:
                set_env("HYDRA_FULL_ERROR", user_full_error)

        return run

    return decorate
