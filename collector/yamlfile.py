"""YAML files validated by pydantic, with every problem located: `file:line: key.path: message`."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from collector.secrets import REDACTED, is_secret_name


class YamlProblem(Exception):
    """The text is not a YAML mapping; the message names the file and line."""


def parse_yaml_mapping(text: str, source: str) -> tuple[dict[str, Any], yaml.Node | None]:
    """Parse YAML text into a mapping, keeping the node tree for error locations."""
    try:
        root = yaml.compose(text)
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise YamlProblem(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if loaded is None:
        return {}, root
    if not isinstance(loaded, dict):
        raise YamlProblem(f"{source}: the top level must be a mapping")
    return loaded, root


def describe_errors(
    exc: ValidationError,
    source: str,
    root: yaml.Node | None,
    env_paths: dict[tuple[str, ...], str] | None = None,
) -> list[str]:
    return [_describe(err, source, root, env_paths or {}) for err in exc.errors()]


def _describe(err: Any, source: str, root: yaml.Node | None, env_paths: dict[tuple[str, ...], str]) -> str:
    loc = tuple(err["loc"])
    dotted = _dotted(loc)
    got = err.get("input")
    msg = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
    secret = any(isinstance(p, str) and is_secret_name(p) for p in loc)
    if secret:  # never echo a mistyped secret
        msg = msg.replace(repr(got), REDACTED).replace(str(got), REDACTED) if got not in (None, "") else msg
    elif err["type"] != "extra_forbidden" and not isinstance(got, dict | list) and repr(got) not in msg:
        msg += f" (got {got!r})"
    for keys, var in env_paths.items():
        if tuple(str(p) for p in loc[: len(keys)]) == keys:
            return f"env {var}: {dotted}: {msg}"
    line = line_of(root, loc)
    where = f"{source}:{line}" if line else source
    return f"{where}: {dotted}: {msg}"


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the YAML node at `loc` (or of its nearest existing parent)."""
    if node is None:
        return None
    best = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(part)), None)
            key_node = next((k for k, v in node.value if k.value == str(part)), None)
            if match is None:
                return best
            best = (key_node or match).start_mark.line + 1
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best
