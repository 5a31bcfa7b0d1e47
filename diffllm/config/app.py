"""`@hydra_app("<config>")`: how every Hydra command runs: --help from help.py, the config search path, the typed
configs built before the command body, and every bad input (a composition error or the command's own ValueError) as
one line on stderr with exit code 2. Below the commands: `diffllm <command>` (diffllm/cli/) calls the apps, and so do
`python -m diffllm.train`, torchrun and a sweep's multirun jobs directly."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import hydra
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ..errors import UserError
from .loading import (CONFIG_DIR, check_typed, explain, fail, plus_to_force, register_schema, set_env,
                      take_config_dirs, use_search_path)


def hydra_app(config_name: str, prog: str = "") -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """`@hydra_app("train")`: a Hydra app on configs/train.yaml along the search path, named `prog` in its messages
    (default `diffllm <config_name>`; the dispatcher's argv[0] wins). `-h/--help` prints the config's keys; an unknown
    key or option, a wrong type or an invalid value is one line on stderr, exit code 2."""

    def decorate(task: Callable[[DictConfig], Any]) -> Callable[[], Any]:
        @functools.wraps(task)
        def run() -> Any:
            name = sys.argv[0] if sys.argv and sys.argv[0].startswith("diffllm ") else prog or f"diffllm {config_name}"
            argv = sys.argv[1:]
            if "-h" in argv or "--help" in argv:
                from .help import config_help

                print(config_help(config_name, name))
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
                except UserError as e:
                    fail(name, str(e))
                try:
                    return task(cfg)
                except UserError as e:  # the command's own bad-input errors: one line naming the culprit, exit 2
                    if user_full_error == "1":
                        raise
                    fail(name, str(e))
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
                fail(name, explain(e, config_name, argv))
            finally:
                set_env("HYDRA_FULL_ERROR", user_full_error)

        return run

    return decorate
