"""A command's --help: usage, the config groups and every key with its default and meaning, for a Hydra command
(config_help) and a config-less `key=value` command (key_value_help); the command's summary and examples come from the
command's registry entry (the CLI), which passes them in.
The meanings are the config files' own comments (`key: value  # meaning`), else the dataclass field's comment
(`name: type = default  # meaning`): the configs are the one source, nothing here repeats them."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
import textwrap
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from .loading import compose, config_groups, find_config, group_options, schema_for, search_path

_KEY = re.compile(r"^(\s*)([A-Za-z_][\w\-]*)\s*:(.*)$")
_FIELD = re.compile(r"^    ([A-Za-z_]\w*)\s*:[^#]*?#\s*(.+)$")  # a field with its comment after it
_FIELD_NAME = re.compile(r"^    ([A-Za-z_]\w*)\s*:")
_COMMENT_LINE = re.compile(r"^    #\s?(.*)$")
FULL_LINE = 100  # a field line this long whose comment goes on below was cut by the line limit (120)


def _comment(rest: str) -> str:
    """The `# comment` after a YAML value (a `#` inside quotes is part of the value)."""
    quote = None
    for i, ch in enumerate(rest):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1].isspace()):
            return rest[i + 1 :].strip()
    return ""


def yaml_comments(path: Path | None, prefix: str = "") -> dict[str, str]:
    """{dotted key: trailing comment} of a block-style YAML file."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in path.read_text().splitlines() if path else []:
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [m.group(2)])
        stack.append((indent, m.group(2)))
        if _comment(m.group(3)):
            out[prefix + key] = _comment(m.group(3))
    return out


def field_comments(cls: type, prefix: str = "") -> dict[str, str]:
    """{dotted field: its source comment} of a dataclass, nested dataclasses included: the comment after the field on
    its line (with the comment lines under it that carry it on, when the line was full), or
    else the comment lines right above it (where the formatter left no room on the line)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):  # a field inherited from a dataclass base keeps its comment there
        if dataclasses.is_dataclass(base):
            out.update(field_comments(base, prefix))
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return out
    above: list[str] = []  # the comment lines just above the current line
    last = None  # the last field line's field, when it had a comment on its line
    for line in source.splitlines() + [""]:
        m, name, comment = _FIELD.match(line), _FIELD_NAME.match(line), _COMMENT_LINE.match(line)
        if comment:
            above.append(comment.group(1).strip())
            continue
        if above and name and not m:  # a field whose comment did not fit on its line sits right above it
            out[prefix + name.group(1)] = " ".join(above)
        elif above and last:  # under a commented field, up to the next commented field or the end: carried on
            out[last] = " ".join([out[last]] + above)
        above = []
        if m:  # its comment goes on below only when it filled its line (a comment line below a short one is a note)
            last = prefix + m.group(1) if len(line) >= FULL_LINE else None
            out[prefix + m.group(1)] = m.group(2).strip()
        elif name or line.strip():
            last = None
    for f in dataclasses.fields(cls):
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if factory is not None and dataclasses.is_dataclass(factory):
            out.update(field_comments(factory, f"{prefix}{f.name}."))
    return out


def _show(value: Any) -> str:
    """A default as the command line writes it (YAML): null, false, [a, b]; a long list or a dict node in short."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_show, value)) + "]"
    if isinstance(value, ListConfig):
        items = [value._get_node(i) for i in range(len(value))]
        if all(not isinstance(v, (DictConfig, ListConfig)) for v in items):
            text = "[" + ", ".join(_show(v) for v in items) + "]"
            return text if len(text) <= 40 else f"[{len(items)} items]"
        return f"[{len(items)} entr{'y' if len(items) == 1 else 'ies'}]"
    if isinstance(value, DictConfig):
        return "{}" if not len(value) else "{...}"
    value = value._value() if hasattr(value, "_value") else value
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _rows(node: DictConfig, prefix: str, nested: set[str]) -> list[tuple[str, str]]:
    """(key, shown default) for every key; only groups and nested dataclasses open up (a plain dict shows {...})."""
    rows = []
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and len(child) and f"{prefix}{key}" in nested:
            rows += _rows(child, f"{prefix}{key}.", nested)
        else:
            rows.append((f"{prefix}{key}", _show(child)))
    return rows


def config_help(
    config_name: str, prog: str, summary: str = "", examples: tuple[str, ...] = (), subcommands: tuple[str, ...] = ()
) -> str:
    """The whole --help text of the command `prog` running configs/<config_name>.yaml; `subcommands` are lines
    `diffllm <name> (<summary>)`."""
    top = find_config("", config_name)
    cfg = compose(config_name)
    groups = config_groups(config_name)
    schema = schema_for(config_name)
    comments: dict[str, str] = {}
    for group, cls in schema.items():  # dataclass comments first, the YAML files' win
        comments.update(field_comments(cls, f"{group}." if group else ""))
    comments.update(yaml_comments(top))
    for group, option in groups.items():
        comments.update(yaml_comments(find_config(group, option), f"{group}."))

    lines = [f"usage: {prog} [--config-dir DIR] [group=option ...] [key=value ...]", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ".", ""]
    opening = itertools.takewhile(lambda ln: ln.startswith("#"), top.read_text().splitlines() if top else [])
    head = [ln.lstrip("# ").rstrip() for ln in opening]  # the comment lines the file opens with
    lines += head + [""] if head else []
    if subcommands:
        lines += ["subcommands: " + ", ".join(subcommands), ""]
    if groups:
        lines.append("config groups (group=option; configs/<group>/<option>.yaml):")
        for group, option in groups.items():
            options = group_options(group)
            listing = textwrap.fill(
                ", ".join(options), 110, initial_indent=" " * 4, subsequent_indent=" " * 4, break_on_hyphens=False
            )
            lines += [f"  {group}={option}   ({len(options)} option{'s' * (len(options) != 1)})", listing]
        lines.append("")
    nested = set(groups) | {
        f"{g}.{f.name}".lstrip(".")
        for g, cls in schema.items()
        for f in dataclasses.fields(cls)
        if dataclasses.is_dataclass(f.default_factory)
    }
    rows = [r for r in _rows(cfg, "", nested) if not r[0].startswith("hydra.")]
    rows.sort(key=lambda r: "." in r[0])  # the command's own keys first, then each group's
    width = min(max(len(f"{k}={v}") for k, v in rows) + 2, 48) if rows else 0
    lines.append("keys (key=default, then what it means):")
    lines += [_key_line(f"{key}={value}", comments.get(key, ""), width) for key, value in rows]
    lines += _examples(examples)
    lines += [
        "",
        "Config search path (first match wins): $DIFFLLM_CONFIG_PATH (colon-separated; --config-dir DIR "
        "prepends), ./configs, the packaged configs:",
        "  " + ", ".join(map(str, search_path())),
        "Hydra's grammar works too: +key=value adds a key, ~key deletes one, -m key=a,b sweeps, --cfg job prints "
        "the composed config.",
    ]
    return "\n".join(lines)


def key_value_help(command: str, examples: tuple[str, ...] = ()) -> str:
    """--help of a config-less command: what it does and each key=default of its root dataclass with the meaning its
    field's comment gives."""
    (cls,) = schema_for(command).values()
    meaning = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((f"{f.name}={_show(default)}", meaning.get(f.name, "")))
    width = max(len(k) for k, _ in rows) + 2
    doc = inspect.cleandoc(cls.__doc__ or "")
    lines = [f"usage: diffllm {command} key=value ...", "", doc, "", "keys (key=default):"]
    lines += [_key_line(k, m, width) for k, m in rows]
    return "\n".join(lines + _examples(examples))


def _key_line(text: str, meaning: str, width: int, columns: int = 118) -> str:
    """`  key=default   meaning`, the meaning wrapped at `columns` under itself (on the next line when the key is wider
    than `width`)."""
    if not meaning:
        return f"  {text}"
    indent = " " * (2 + width)
    body = textwrap.fill(meaning, columns, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)
    return f"  {text}\n{body}" if len(text) >= width else f"  {text:<{width}}{body[len(indent) :]}"


def _examples(examples: tuple[str, ...]) -> list[str]:
    return ["", "examples:"] + [f"  {e}" for e in examples] if examples else []
