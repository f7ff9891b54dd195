"""`mlxcel serve --config models.yaml`: a `server:` section and a `models:` list.

mlx-openai-server's files load unchanged: its keys map onto ours, and the ones we accept but
do not act on yet are reported so the caller logs them once. Every problem is a ConfigError
naming the file, the line and the key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlxcel.config import BACKENDS, KIND_NAMES, KINDS, SERVABLE_KINDS, Kind
from mlxcel.logs import LOG_LEVELS
from mlxcel.models.memory import parse_size
from mlxcel.parsers.reasoning import PARSERS as REASONING_PARSERS
from mlxcel.parsers.tools import PARSERS as TOOL_PARSERS

# mlx-openai-server's model_type values, as our kinds.
MODEL_TYPES: dict[str, Kind] = {
    "lm": "text",
    "multimodal": "vision",
    "image-generation": "image",
    "image-edit": "image",
    "embeddings": "embedding",
    "whisper": "transcription",
}
# mlx-openai-server's parser names that are one of ours under another name.
TOOL_PARSER_NAMES = {name: "hermes" for name in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl")}
REASONING_PARSER_NAMES = {
    name: "qwen3" for name in ("qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_5")
}
# mlx-openai-server leaves an on-demand model loaded this long when idle, unless told.
ON_DEMAND_IDLE_TIMEOUT_S = 60.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class ConfigError(ValueError):
    """A config file problem, in one line naming its file and line."""


@dataclass(frozen=True)
class Value:
    """A value read from the file, with where it was."""

    value: Any
    line: int


@dataclass
class ModelSection:
    """One entry of `models:`: ModelConfig field values, and where each came from."""

    line: int
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)


@dataclass
class FileConfig:
    """What a config file says."""

    path: Path
    server: dict[str, Any]
    server_lines: dict[str, int]
    models: list[ModelSection]
    ignored: list[str]
    """`file:line: key` for each key we accept but do not act on yet."""

    def where(self, line: int) -> str:
        """`file:line` for messages."""
        return f"{self.path}:{line}"


Convert = Callable[[Any], Any]


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _at_least(minimum: int, maximum: int | None = None) -> Convert:
    def convert(value: Any) -> int:
        number = _integer(value)
        if number < minimum or (maximum is not None and number > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            raise ValueError(f"must be at least {minimum}{upper}, got {number}")
        return number

    return convert


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or value == "":
        raise ValueError(f"expected a string, got {value!r}")
    return str(value)


def duration(value: Any) -> float:
    """Seconds from a number or a string like `90`, `30s`, `5m`, `1h`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(str(value).strip())
        if match is None:
            raise ValueError(f"expected seconds or a duration like 30s, 5m, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return seconds


def _names(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError(f"expected a list of names, got {value!r}")
    return tuple(_text(item).strip() for item in items if str(item).strip())


def _choice(options: tuple[str, ...], renamed: dict[str, str] | None = None) -> Convert:
    def convert(value: Any) -> str:
        text = _text(value)
        text = (renamed or {}).get(text, text)
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {text!r}")
        return text

    return convert


def _kind(value: Any) -> Kind:
    text = _text(value)
    if text in MODEL_TYPES:
        return MODEL_TYPES[text]
    for kind in KINDS:
        if kind == text:
            return kind
    options = ", ".join((*MODEL_TYPES, *KINDS))
    raise ValueError(f"expected one of {options}, got {text!r}")


def _path(value: Any) -> Path:
    return Path(_text(value)).expanduser()


def _size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return parse_size(_text(value))


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of template variables, got {value!r}")
    return value


def _gpu_layers(value: Any) -> int:
    """-ngl's values: a count, or auto / all (-1: every layer)."""
    if value in ("auto", "all"):
        return -1
    return _at_least(-1)(value)


_SWITCH = ("on", "off", "auto")


def _switch(value: Any) -> str:
    """on / off / auto; YAML reads a bare on or off as true or false."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return _choice(_SWITCH)(value)


def _log_level(value: Any) -> str:
    return _choice(LOG_LEVELS)(_text(value).lower())


# key -> (ModelConfig field, converter). Aliases are mlx-openai-server's names.
MODEL_KEYS: dict[str, tuple[str, Convert]] = {
    "model": ("model", _text),
    "model_path": ("model", _text),
    "kind": ("kind", _kind),
    "model_type": ("kind", _kind),
    "name": ("alias", _text),
    "served_model_name": ("alias", _text),
    "aliases": ("aliases", _names),
    "model_id": ("aliases", _names),
    "backend": ("backend", _choice(BACKENDS)),
    "ctx_size": ("ctx_size", _at_least(0)),
    "context_length": ("ctx_size", _at_least(0)),
    "n_predict": ("n_predict", _at_least(-1)),
    "max_tokens": ("n_predict", _at_least(-1)),
    "default_max_tokens": ("n_predict", _at_least(-1)),
    "threads": ("threads", _at_least(1)),
    "parallel": ("parallel", _at_least(1)),
    "max_concurrency": ("parallel", _at_least(1)),
    "batch_size": ("batch_size", _at_least(1)),
    "ubatch_size": ("ubatch_size", _at_least(1)),
    "queue_size": ("queue_size", _at_least(0)),
    "queue_timeout": ("queue_timeout", duration),
    "warmup": ("warmup", _boolean),
    "tool_call_parser": (
        "tool_call_parser",
        _choice(("auto", *TOOL_PARSERS), TOOL_PARSER_NAMES),
    ),
    "reasoning_parser": (
        "reasoning_parser",
        _choice(("auto", "none", *REASONING_PARSERS, "harmony"), REASONING_PARSER_NAMES),
    ),
    "chat_template_file": ("chat_template_file", _path),
    "mmproj": ("mmproj", _path),
    "cache_ram": ("cache_ram_mib", _at_least(-1)),
    "temperature": ("temperature", _number),
    "default_temperature": ("temperature", _number),
    "top_p": ("top_p", _number),
    "default_top_p": ("top_p", _number),
    "top_k": ("top_k", _integer),
    "default_top_k": ("top_k", _integer),
    "min_p": ("min_p", _number),
    "default_min_p": ("min_p", _number),
    "repeat_penalty": ("repeat_penalty", _number),
    "default_repetition_penalty": ("repeat_penalty", _number),
    "p_less": ("p_less", _boolean),
    "p_less_norm": ("p_less_norm", _boolean),
    "seed": ("seed", _at_least(0)),
    "reasoning": ("reasoning", _switch),
    "chat_template": ("chat_template", _text),
    "chat_template_kwargs": ("chat_template_kwargs", _object),
    "jinja": ("jinja", _boolean),
    "n_gpu_layers": ("n_gpu_layers", _gpu_layers),
    "flash_attn": ("flash_attn", _switch),
    "mmap": ("mmap", _boolean),
    "mlock": ("mlock", _boolean),
    "on_demand": ("on_demand", _boolean),
    "idle_timeout": ("idle_timeout", duration),
    "on_demand_idle_timeout": ("idle_timeout", duration),
    "pinned": ("pinned", _boolean),
}
# mlx-openai-server's model keys we accept and do not act on yet (reported at startup).
MODEL_KEYS_IGNORED = frozenset(
    {
        "enable_auto_tool_choice",
        "config_name",
        "quantize",
        "kv_bits",
        "kv_group_size",
        "quantized_kv_start",
        "draft_model_path",
        "num_draft_tokens",
        "lora_paths",
        "lora_scales",
        "trust_remote_code",
        "disable_auto_resize",
        "group",
        "is_default_model",
    }
)
# Prefixes of such keys: default_* sampling keys we have no field for, prompt_cache_*.
MODEL_PREFIXES_IGNORED = ("default_", "prompt_cache_")
SERVER_KEYS: dict[str, tuple[str, Convert]] = {
    "host": ("host", _text),
    "port": ("port", _at_least(1, 65535)),
    "socket": ("socket", _path),
    "api_keys": ("api_keys", _names),
    "api_key": ("api_keys", _names),
    "log_level": ("log_level", _log_level),
    "max_body_bytes": ("max_body_bytes", _integer),
    "max_memory": ("max_memory", _size),
}
SERVER_KEYS_IGNORED = frozenset(
    {"log_file", "no_log_file", "max_loaded_models", "model_load_timeout", "enable_status_page"}
)


def _mapping(node: yaml.Node, where: str, what: str) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}:{node.start_mark.line + 1}: {what} must be a mapping")
    pairs = []
    seen: set[str] = set()
    for key, value in node.value:
        line = key.start_mark.line + 1
        if not isinstance(key, yaml.ScalarNode):
            raise ConfigError(f"{where}:{line}: a key in {what} is not a name")
        if key.value in seen:
            raise ConfigError(f"{where}:{line}: '{key.value}' is given twice in {what}")
        seen.add(key.value)
        pairs.append((key, value))
    return pairs


def _value(node: yaml.Node) -> Any:
    try:
        return yaml.safe_load(yaml.serialize(node))
    except yaml.YAMLError as exc:
        raise ValueError(f"not a plain value ({exc})") from None


def _section(
    node: yaml.Node,
    where: str,
    what: str,
    keys: dict[str, tuple[str, Convert]],
    ignored_keys: frozenset[str],
    ignored_prefixes: tuple[str, ...],
    ignored: list[str],
) -> tuple[dict[str, Any], dict[str, int]]:
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for key, value_node in _mapping(node, where, what):
        line = key.start_mark.line + 1
        name = key.value
        if name in keys:
            target, convert = keys[name]
            try:
                converted = convert(_value(value_node))
            except ValueError as exc:
                raise ConfigError(f"{where}:{line}: {what}.{name}: {exc}") from None
            if target in values and target != "aliases":
                raise ConfigError(
                    f"{where}:{line}: {what}.{name} sets what another key of {what} already set"
                )
            if target == "aliases":
                converted = values.get(target, ()) + converted
            values[target] = converted
            lines[target] = line
        elif name in ignored_keys or name.startswith(ignored_prefixes):
            ignored.append(f"{where}:{line}: {what}.{name}")
        else:
            raise ConfigError(f"{where}:{line}: unknown key '{name}' in {what}")
    return values, lines


def read_config(path: Path) -> FileConfig:
    """Parse and check a config file (its model paths are resolved by the caller)."""
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}{line}: not valid YAML: {problem}") from None
    if root is None:
        raise ConfigError(f"{where}: the file is empty; it needs a `models:` list")
    ignored: list[str] = []
    server: dict[str, Any] = {}
    server_lines: dict[str, int] = {}
    models: list[ModelSection] = []
    models_node: yaml.Node | None = None
    for key, node in _mapping(root, where, "the file"):
        if key.value == "server":
            server, server_lines = _section(
                node, where, "server", SERVER_KEYS, SERVER_KEYS_IGNORED, (), ignored
            )
        elif key.value == "models":
            models_node = node
        else:
            line = key.start_mark.line + 1
            raise ConfigError(
                f"{where}:{line}: unknown key '{key.value}' (the file has `server:` and `models:`)"
            )
    if not isinstance(models_node, yaml.SequenceNode) or not models_node.value:
        raise ConfigError(f"{where}: no models: the file needs a `models:` list")
    for index, node in enumerate(models_node.value):
        what = f"models[{index}]"
        values, lines = _section(
            node, where, what, MODEL_KEYS, MODEL_KEYS_IGNORED, MODEL_PREFIXES_IGNORED, ignored
        )
        section = ModelSection(node.start_mark.line + 1, values, lines)
        if "model" not in values:
            raise ConfigError(f"{where}:{section.line}: {what} has no model_path (or model)")
        if values.get("on_demand") and "idle_timeout" not in values:
            values["idle_timeout"] = ON_DEMAND_IDLE_TIMEOUT_S
        models.append(section)
    return FileConfig(path, server, server_lines, models, ignored)


def unservable(kind: Kind) -> str | None:
    """Why a model of this kind cannot be served here, or None if it can."""
    if kind in SERVABLE_KINDS:
        return None
    served = ", ".join(KIND_NAMES[k] for k in sorted(SERVABLE_KINDS))
    return (
        f"no installed mlxcel package serves {KIND_NAMES[kind]} models yet "
        f"(this mlxcel serves {served})"
    )
