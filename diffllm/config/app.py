"""How every `key=value` command runs, on the typed configs it declares: `@hydra_app("<config>", schema)` composes
configs/<config>.yaml with Hydra (groups, multirun) over the dataclasses and checks them before the command body;
`run_key_values("<command>", Dataclass, body)` builds a config-less command's one root dataclass from its arguments.
Both answer --help from help.py and turn bad input (a composition error, a wrong type or value, the command's own
UserError) into one line on stderr with exit code 2; any other exception is a bug and keeps its traceback. The
commands call them, however they are run: `diffllm <command>`, `python -m diffllm.train`, torchrun, a sweep's
multirun jobs, `python -m diffllm.eval.<module>`."""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator, Optional

import hydra
import yaml
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ..errors import UserError
from .loading import (
    CONFIG_DIR,
    Schema,
    check_typed,
    compose,
    declare,
    explain,
    fail,
    first_job,
    from_key_values,
    to_overrides,
    yaml_error,
)


@contextlib.contextmanager
def one_line_errors(prog: str) -> Iterator[None]:
    """A UserError inside: its first line on stderr, exit code 2; a YAML file that does not parse (a config of the
    user's, a run's config.yaml): one line naming the file and line, exit code 2."""
    try:
        yield
    except yaml.YAMLError as e:
        fail(prog, yaml_error(e))
    except UserError as e:
        fail(prog, str(e).splitlines()[0] if str(e) else type(e).__name__)


def hydra_app(
    config_name: str, schema: Schema, prog: str = ""
) -> Callable[[Callable[[DictConfig, dict[str, Any]], Any]], Callable[[], Any]]:
    """`@hydra_app("train", SCHEMA)`: a Hydra app on configs/<config_name>.yaml over the typed configs `schema`
    ({group ("" = root keys): dataclass}), built and checked once: `task(cfg, {group: its dataclass})`. Messages name
    `prog` (default `diffllm <config_name>`; the dispatcher's argv[0] wins). A run is composed here (its errors are ours
    to word); a multirun, Hydra's flags (`--cfg job`) and `hydra.*` overrides go to Hydra's app once their first job
    has been composed here (first_job)."""

    declare(config_name, schema)

    def decorate(task: Callable[[DictConfig, dict[str, Any]], Any]) -> Callable[[], Any]:
        @functools.wraps(task)
        def run() -> Any:
            name = sys.argv[0] if sys.argv and sys.argv[0].startswith("diffllm ") else prog or f"diffllm {config_name}"
            if "-h" in sys.argv[1:] or "--help" in sys.argv[1:]:
                from .help import config_help

                print(config_help(config_name, name))
                raise SystemExit(0)
            argv = to_overrides(config_name, sys.argv[1:])

            def checked(cfg: DictConfig) -> Any:
                with one_line_errors(name):
                    return task(cfg, check_typed(cfg, schema))

            hydras = any(a.startswith(("-", "hydra.", "hydra/", "+hydra", "~hydra")) for a in argv)
            try:
                cfg = compose(config_name, first_job(argv) if hydras else argv)
            except (HydraException, OmegaConfBaseException, yaml.YAMLError) as e:
                fail(name, explain(e, config_name))
            if not hydras:
                return checked(cfg)
            sys.argv = [sys.argv[0]] + argv  # the one rewrite: Hydra's app reads sys.argv
            return hydra.main(config_path=str(CONFIG_DIR), config_name=config_name, version_base=None)(checked)()

        return run

    return decorate


def run_key_values(command: str, cls: type, body: Callable[[Any], Any], argv: Optional[list[str]] = None) -> Any:
    """`diffllm <command> key=value ...` for a command without a config file: the arguments (sys.argv[1:] unless
    given) build its root dataclass `cls`, then `body` runs on it. Values are taken verbatim, not through
    Hydra's grammar, so a prompt may hold `,`, `#`, `(` or `'` (from_key_values)."""
    declare(command, {"": cls})
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        from .help import key_value_help

        print(key_value_help(command))
        return None
    with one_line_errors(f"diffllm {command}"):
        return body(from_key_values(cls, argv, command.split()[-1]))
