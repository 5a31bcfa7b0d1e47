"""Config loading, the one path for every command: the config search path, composing a command's config or one group
file, typed dataclasses from config nodes, the dataclass defaults under the YAML (every field settable by its plain
name), and one-line messages for bad overrides (exit code 2). The Hydra app wrapper that uses them is app.py.

Search path, first match wins: each directory of $DIFFLLM_CONFIG_PATH (colon-separated; `--config-dir DIR` on any
command prepends to it, so the processes a command starts see it too), then ./configs of the current directory, then
the packaged configs (CONFIG_DIR).

Typed configs: a command declares its own ({group ("" = root keys): dataclass}, with its `@hydra_app` or `declare`);
their defaults go into Hydra's ConfigStore as `<config>_schema`, the first entry of configs/<config>.yaml's defaults
list, so the YAML merges over them."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Iterator, List, NoReturn, Optional, TypeVar, Union

import yaml
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import UserError

_PACKAGED = Path(__file__).resolve().parents[1] / "configs"  # a wheel install; a checkout keeps them in <repo>/configs
CONFIG_DIR = Path(
    os.environ.get("DIFFLLM_CONFIGS") or (_PACKAGED if _PACKAGED.is_dir() else _PACKAGED.parents[1] / "configs")
)
CONFIG_PATH_ENV = "DIFFLLM_CONFIG_PATH"
EXIT_BAD_INPUT = 2
T = TypeVar("T")
Schema = dict  # {group ("" = root keys): dataclass}
_SCHEMAS: dict[str, Union[Schema, Callable[[], Schema]]] = {}  # by config or command name: declared, or how to load


# ---------------------------------------------------------------------------------------------------- search path
def search_path() -> list[Path]:
    """$DIFFLLM_CONFIG_PATH entries, ./configs, the packaged configs: existing directories, first match wins."""
    dirs = [Path(p) for p in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if p]
    out: list[Path] = []
    for d in dirs + [Path("configs"), CONFIG_DIR]:
        d = d.resolve()
        if d.is_dir() and d not in out:
            out.append(d)
    return out


def find_config(group: str, name: str) -> Optional[Path]:
    """configs/<group>/<name>.yaml along the search path, None if absent (group "": configs/<name>.yaml)."""
    return next((d / group / f"{name}.yaml" for d in search_path() if (d / group / f"{name}.yaml").is_file()), None)


def group_options(group: str) -> list[str]:
    """Every <option> of configs/<group>/<option>.yaml along the search path."""
    return sorted({p.stem for d in search_path() for p in (d / group).glob("*.yaml")})


def config_groups(config_name: str) -> dict[str, str]:
    """{group: default option} from the defaults list of configs/<config>.yaml (Hydra's own groups left out)."""
    path = find_config("", config_name)
    entries = OmegaConf.load(path).get("defaults", []) if path else []
    return {
        k: str(v) for e in entries if isinstance(e, DictConfig) for k, v in e.items() if not k.startswith("override")
    }


def group_defaults(group: str, name: str) -> dict[str, str]:
    """{base group: option} of the defaults list of configs/<group>/<name>.yaml along the search path, e.g.
    {"arch": "<arch>", "size": "micro-2"} for a model preset (`- size/micro-2@_here_`); {} when there is none."""
    path = find_config(group, name)
    out: dict[str, str] = {}
    for entry in (OmegaConf.to_container(OmegaConf.load(path)).get("defaults") or []) if path else []:
        if isinstance(entry, str) and "/" in entry:
            base, option = entry.split("@")[0].rsplit("/", 1)
            out[base] = option
    return out


_NON_STRING = re.compile(r"[+-]?(\d[\d_]*\.?\d*|\.\d+)([eE][+-]?\d+)?|true|false|null|[+-]?inf|nan", re.I)


def to_overrides(config_name: str, argv: list[str]) -> list[str]:
    """A command's arguments as Hydra overrides, rewritten in one place: `--config-dir DIR` into $DIFFLLM_CONFIG_PATH,
    the deepspeed launcher's `--local_rank N` into $LOCAL_RANK, `+key=v` on a declared field as `++key=v` (the form
    documented before every field existed), `sweep=2024` as `sweep='2024'` (an option named like a number, true, false
    or null stays the option's name; Hydra's grammar would type it and fail on it with a traceback). Rewriting its own
    output changes nothing."""
    rest, i = [], 0
    while i < len(argv):
        key, eq, value = argv[i].partition("=")
        if key == "--local_rank" and (eq or i + 1 < len(argv)):
            os.environ["LOCAL_RANK"] = value if eq else argv[i + 1]
            i += 1 if eq else 2
            continue
        rest.append(argv[i])
        i += 1
    rest = take_config_dirs(rest)
    schema = register_schema(config_name)
    fields = {f"{g}.{f.name}" if g else f.name for g, cls in schema.items() for f in dataclasses.fields(cls)}
    dirs, out = search_path(), []
    for a in rest:
        if re.match(r"\+[^+]", a) and a[1:].split("=", 1)[0] in fields:
            a = "+" + a
        m = re.fullmatch(r"(\+{0,2})([A-Za-z_][\w.]*)=(.*)", a)
        if m and _NON_STRING.fullmatch(m.group(3)) and any((d / m.group(2).replace(".", "/")).is_dir() for d in dirs):
            a = f"{m.group(1)}{m.group(2)}='{m.group(3)}'"
        out.append(a)
    return out


def first_job(overrides: list[str]) -> list[str]:
    """A multirun's overrides as its first job composes them (each sweep at its first value), without Hydra's own
    flags and `hydra` keys: what to compose once before Hydra's app runs, so a bad key is our one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    ours = [a for a in overrides if ("=" in a or a.startswith("~")) and not a.lstrip("+~").startswith(("-", "hydra"))]
    return [
        f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
        for o in OverridesParser.create().parse_overrides(ours)
    ]


def take_config_dirs(argv: list[str]) -> list[str]:
    """Remove `--config-dir DIR` / `--config-dir=DIR` / `-cd DIR` and prepend DIR to $DIFFLLM_CONFIG_PATH (in this
    process's environment, so sweep jobs and other child processes inherit it)."""
    rest, dirs, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("--config-dir="):
            dirs.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    if dirs:
        old = [p for p in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if p]
        os.environ[CONFIG_PATH_ENV] = os.pathsep.join([str(Path(d).resolve()) for d in dirs] + old)
    return rest


class _UserConfigs(SearchPathPlugin):
    """Puts the user's config directories ahead of the packaged configs in the search path of every diffllm app."""

    def manipulate_search_path(self, path: ConfigSearchPath) -> None:
        main = [e for e in path.get_path() if e.provider == "main"]
        if not main or Path(str(main[0].path).replace("file://", "")).resolve() != CONFIG_DIR.resolve():
            return  # another Hydra app in this environment
        for d in search_path()[:-1]:  # in order, each before the packaged configs
            path.prepend(provider="diffllm", path=f"file://{d}", anchor="main")


def use_search_path() -> None:
    Plugins.instance().register(_UserConfigs)  # Hydra's documented hook for a plugin outside hydra_plugins/


def load_group(group: str, name: str) -> DictConfig:
    """configs/<group>/<name>.yaml as Hydra composes it (its defaults list merged, the user's directories first), the
    node under its package: what `<group>=<name>` puts into a command's config. A missing option is a ValueError
    naming the nearest options."""
    if find_config(group, name) is None:
        raise UserError(unknown_option(group, name, group_options(group)))
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # inside a running Hydra app: its instance reads the same search path
        node = hydra_compose(config_name=f"{group}/{name}")
    else:
        use_search_path()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            node = hydra_compose(config_name=f"{group}/{name}")
    for part in group.split("/"):
        node = node[part]
    return node


# ---------------------------------------------------------------------------------------------- typed dataclasses
def build(cls: type[T], node: Any, prefix: str) -> T:
    """A typed dataclass from a config node, checked against the dataclass's fields and types and by its validate():
    an unknown key or a bad value is a one-line ValueError naming it (`model.d_modle: unknown key (did you mean
    model.d_model?)`). An empty prefix names root keys bare."""
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    fields = [f.name for f in dataclasses.fields(cls)]
    dot = f"{prefix}." if prefix else ""
    unknown = sorted(set(values) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], fields, n=1, cutoff=0.6)
        hint = f" (did you mean {dot}{close[0]}?)" if close else ""
        raise UserError(f"{dot}{unknown[0]}: unknown key{hint} (valid keys: {', '.join(sorted(fields))})")
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(cls), values), resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise UserError(f"{dot}{key}: {str(e).splitlines()[0]}") from None
    obj = cls(**typed)
    if hasattr(obj, "validate"):
        obj.validate(prefix) if inspect.signature(obj.validate).parameters else obj.validate()  # SourceConfig's: where
    return obj


def from_key_values(cls: type[T], argv: list[str], prefix: str) -> T:
    """`key=value ...` (Hydra-style) into the dataclass `cls`. A value inside one pair of matching quotes is what is
    inside (`key='a b'`, as Hydra reads it). Strings are taken verbatim (a prompt may hold `:` or `#`); other fields
    are YAML values (`runs=[a,b]`, `n_needles=[1,2]`, `seed=3`). Errors name the key."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    for arg in argv:
        key, eq, raw = arg.partition("=")
        key = key.lstrip("+")
        if not eq:
            raise UserError(f"{arg!r}: expected key=value (keys: {', '.join(names)})")
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {near[0]}?" if near else f" (keys: {', '.join(names)})"
            raise UserError(f"{prefix}.{key}: unknown key{hint}")
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":  # Hydra quoting: "prompt='Anne Elliot was'"
            raw = raw[1:-1]
        try:
            value = raw if hints[key] in (str, Optional[str]) else yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError:
            raise UserError(f"{prefix}.{key}: cannot parse {raw!r}") from None
        if typing.get_origin(hints[key]) in (list, List) and not isinstance(value, list) and value is not None:
            value = [raw if typing.get_args(hints[key]) == (str,) else value]  # stop=. is stop=[.]
        values[key] = value
    return build(cls, values, prefix)


def schema_node(schema: Schema) -> dict[str, Any]:
    """{group: dataclass} ("" = root keys) -> one plain config of every field at its dataclass default."""
    node: dict[str, Any] = {}
    for group, cls in schema.items():
        (node.setdefault(group, {}) if group else node).update(OmegaConf.to_container(OmegaConf.structured(cls)))
    return node


def declare(name: str, schema: Union[Schema, Callable[[], Schema]]) -> None:
    """Name the typed configs of configs/<name>.yaml or of the command `name` ("eval ppl"): a schema, or a function
    that imports it when it is first needed (a dispatcher may name every command's so, and --help stays light)."""
    _SCHEMAS[name] = schema


def schema_for(name: str) -> Schema:
    """The declared typed configs of configs/<name>.yaml or of the command `name` ({} if none)."""
    schema = _SCHEMAS.get(name, {})
    if callable(schema):
        schema = _SCHEMAS[name] = schema()
    return schema


def register_schema(config_name: str) -> Schema:
    """Store the declared dataclasses' defaults as `<config>_schema`, the first entry of configs/<config>.yaml's
    defaults list, so the YAML merges over them and every field exists (settable without `+`). A plain node, not a
    structured one: Hydra's `~key` cannot delete a field of a typed node; check_typed types it after composing."""
    from hydra.core.config_store import ConfigStore

    schema = schema_for(config_name)
    ConfigStore.instance().store(name=f"{config_name}_schema", node=OmegaConf.create(schema_node(schema)))
    return schema


def check_typed(cfg: DictConfig, schema: Schema) -> dict[str, Any]:
    """Each typed config of a composed config, built and checked: {group ("" = root keys): its dataclass}. A wrong
    type or bad value is a one-line ValueError."""
    typed: dict[str, Any] = {}
    for group, cls in schema.items():
        node = cfg.get(group) if group else OmegaConf.to_container(cfg, resolve=True)
        if not group:  # the root keys among the whole config's
            node = {k: v for k, v in node.items() if k in {f.name for f in dataclasses.fields(cls)}}
        typed[group] = build(cls, node, group)
    return typed


# ------------------------------------------------------------------------------------------------ bad overrides
def flat_keys(node: dict, prefix: str = "") -> Iterator[str]:
    for k, v in node.items():
        yield from flat_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]


def unknown_key(key: str, keys: list[str]) -> str:
    """`unknown key trainer.zero_stag (did you mean trainer.zero_stage?)`: the closest full key, or the closest key
    with the same last part (`zero_stage` -> trainer.zero_stage); never the key itself."""
    keys = [k for k in keys if k != key]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close:
        last = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == last][:1] or [
            k for k in keys if difflib.get_close_matches(last, [k.rsplit(".", 1)[-1]], cutoff=0.8)
        ][:1]
    return f"unknown key {key}" + (f" (did you mean {close[0]}?)" if close else "")


def unknown_option(group: str, option: str, options: list[str]) -> str:
    close = difflib.get_close_matches(option, options, n=3, cutoff=0.5)
    listing = f"closest: {', '.join(close)}" if close else f"options: {', '.join(options) or 'none'}"
    return f"unknown {group}={option} ({listing}; search path: {', '.join(map(str, search_path()))})"


def check_group_options(argv: list[str], groups: list[str]) -> None:
    """`group=option` arguments (or a multirun's `group=a,b`) naming no configs/<group>/<option>.yaml: ValueError
    (before anything is imported, and before Hydra writes a multirun folder)."""
    for arg in argv:
        m = re.fullmatch(r"([\w/]+)=([\w.\-]+(?:,[\w.\-]+)*)", arg)
        for option in m.group(2).split(",") if m and m.group(1) in groups else ():
            if find_config(m.group(1), option) is None:
                raise UserError(unknown_option(m.group(1), option, group_options(m.group(1))))


def explain(e: BaseException, config_name: str) -> str:
    """One line for a Hydra composition error: an unknown key or option with the nearest names, else its first line."""
    from hydra.errors import MissingConfigException

    bad_yaml = next((c for c in _chain(e) if isinstance(c, yaml.YAMLError)), None)
    if bad_yaml is not None:  # an own config that does not parse: its file and line
        return yaml_error(bad_yaml)
    msg = str(e).strip()
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in str(e.missing_cfg_file):
        group, option = str(e.missing_cfg_file).rsplit("/", 1)
        return unknown_option(group, option, group_options(group))
    m = re.match(r"Could not override '([^']+)'", msg)
    if m:
        key = m.group(1)
        keys = list(flat_keys(schema_node(schema_for(config_name))))  # from the dataclasses: no second composition
        folders = [str(d / key) for d in search_path() if (d / key).is_dir()]
        if key in keys and folders:  # Hydra reads `key=value` as a choice of the config group that folder makes
            return (
                f"{key}: a key of `{config_name}`, but {folders[0]} on the config search path makes it a config "
                f"group, which hides the key; rename that folder"
            )
        return unknown_key(key, keys)
    cause = e.__cause__ or e.__context__
    lines = [ln for ln in (msg.splitlines() + (str(cause).splitlines() if cause else [])) if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _chain(e: Optional[BaseException]) -> Iterator[BaseException]:
    """An exception and its causes (__cause__, else __context__), each once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def yaml_error(e: BaseException) -> str:
    """One line for a YAML file that does not parse (a yaml.MarkedYAMLError): the file, the line and column, what the
    parser expected, and where the construct it was reading began (`configs/data/mine.yaml, line 3, column 4: not valid
    YAML: expected ',' or ']', but got ':' (while parsing a flow sequence that began at line 2, column 10)`)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).strip().splitlines()[0]
    if mark is None:
        return f"not valid YAML: {problem}"
    name = Path(str(mark.name))
    with contextlib.suppress(ValueError):
        name = name.resolve().relative_to(Path.cwd().resolve())
    began = getattr(e, "context_mark", None)
    context = getattr(e, "context", None)
    tail = (
        f" ({context} that began at line {began.line + 1}, column {began.column + 1})"
        if context and began is not None and began is not mark and getattr(e, "problem", None)
        else ""
    )
    return f"{name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}{tail}"


def fail(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def compose(config_name: str, overrides: list[str] | None = None, return_hydra_config: bool = False) -> DictConfig:
    """The config a command sees: its `@hydra_app` composes a run with it, and so do tests, scripts and help."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = to_overrides(config_name, list(overrides or []))
    use_search_path()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)
