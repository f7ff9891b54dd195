"""`mlxcel serve --config models.yaml`: a `server:` section and a `models:` list.

mlx-openai-server's files load unchanged: its keys map onto ours, and the ones we accept but
do not act on yet are reported so the caller logs them once. Every problem is a ConfigError
naming the file, the line and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import yaml

from mlxcel.backends.group import from_section
from mlxcel.config import adapters, ray_keys, rpc
from mlxcel.config import values as to
from mlxcel.config.settings import (
    BACKENDS,
    ENCODER_ENGINES,
    KIND_NAMES,
    KINDS,
    KV_CACHE_TYPES,
    SERVABLE_KINDS,
    SPEC_TYPES,
    Kind,
)
from mlxcel.engine.replica_router import POLICIES
from mlxcel.extras import install_extra
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


def _kind(value: Any) -> Kind:
    text = to.text(value)
    if text in MODEL_TYPES:
        return MODEL_TYPES[text]
    for kind in KINDS:
        if kind == text:
            return kind
    options = ", ".join((*MODEL_TYPES, *KINDS))
    raise ValueError(f"expected one of {options}, got {text!r}")


# A key that sets both cache types at once.
BOTH_CACHE_TYPES = "cache_types"


# key -> (ModelConfig field, converter). Aliases are mlx-openai-server's names.
MODEL_KEYS: dict[str, tuple[str, to.Convert]] = {
    "model": ("model", to.text),
    "model_path": ("model", to.text),
    "kind": ("kind", _kind),
    "model_type": ("kind", _kind),
    "name": ("alias", to.text),
    "served_model_name": ("alias", to.text),
    "aliases": ("aliases", to.names),
    "model_id": ("aliases", to.names),
    "tags": ("tags", to.names),
    "backend": ("backend", to.choice(BACKENDS)),
    "ctx_size": ("ctx_size", to.at_least(0)),
    "context_length": ("ctx_size", to.at_least(0)),
    "n_predict": ("n_predict", to.at_least(-1)),
    "max_tokens": ("n_predict", to.at_least(-1)),
    "default_max_tokens": ("n_predict", to.at_least(-1)),
    "threads": ("threads", to.at_least(1)),
    "threads_batch": ("threads_batch", to.at_least(1)),
    "parallel": ("parallel", to.at_least(1)),
    "max_concurrency": ("parallel", to.at_least(1)),
    "batch_size": ("batch_size", to.at_least(1)),
    "ubatch_size": ("ubatch_size", to.at_least(1)),
    "queue_size": ("queue_size", to.at_least(0)),
    "queue_timeout": ("queue_timeout", to.duration),
    "warmup": ("warmup", to.boolean),
    "tool_call_parser": (
        "tool_call_parser",
        to.choice(("auto", *TOOL_PARSERS), TOOL_PARSER_NAMES),
    ),
    "reasoning_parser": (
        "reasoning_parser",
        to.choice(("auto", "none", *REASONING_PARSERS, "harmony"), REASONING_PARSER_NAMES),
    ),
    "chat_template_file": ("chat_template_file", to.path),
    "mmproj": ("mmproj", to.path),
    "cache_ram": ("cache_ram_mib", to.at_least(-1)),
    "cache_disk": ("cache_disk", to.path),
    "cache_disk_max": ("cache_disk_max", to.size),
    "slot_save_path": ("slot_save_path", to.path),
    "temperature": ("temperature", to.number),
    "default_temperature": ("temperature", to.number),
    "top_p": ("top_p", to.number),
    "default_top_p": ("top_p", to.number),
    "top_k": ("top_k", to.integer),
    "default_top_k": ("top_k", to.integer),
    "min_p": ("min_p", to.number),
    "default_min_p": ("min_p", to.number),
    "repeat_penalty": ("repeat_penalty", to.number),
    "default_repetition_penalty": ("repeat_penalty", to.number),
    "p_less": ("p_less", to.boolean),
    "p_less_norm": ("p_less_norm", to.boolean),
    "seed": ("seed", to.at_least(0)),
    "reasoning": ("reasoning", to.switch),
    "chat_template": ("chat_template", to.text),
    "chat_template_kwargs": ("chat_template_kwargs", to.template_vars),
    "jinja": ("jinja", to.boolean),
    "n_gpu_layers": ("n_gpu_layers", to.gpu_layers),
    "rpc": ("rpc", rpc.rpc_servers),
    "tensor_split": ("tensor_split", rpc.tensor_split),
    "rpc_key_file": ("rpc_key_file", to.path),
    "flash_attn": ("flash_attn", to.switch),
    "mmap": ("mmap", to.boolean),
    "mlock": ("mlock", to.boolean),
    "cache_type_k": ("cache_type_k", to.choice(KV_CACHE_TYPES)),
    "cache_type_v": ("cache_type_v", to.choice(KV_CACHE_TYPES)),
    "kv_bits": (BOTH_CACHE_TYPES, to.kv_bits),
    "spec_type": ("spec_type", to.choice(SPEC_TYPES)),
    "spec_ngram_size_n": ("spec_ngram_size_n", to.at_least(1, 1024)),
    "draft_max": ("draft_max", to.at_least(1)),
    "draft_min": ("draft_min", to.at_least(0)),
    "draft_cost": ("draft_cost", to.draft_cost),
    "model_draft": ("model_draft", to.path),
    "draft_model_path": ("model_draft", to.path),
    "num_draft_tokens": ("draft_max", to.at_least(1)),
    "on_demand": ("on_demand", to.boolean),
    "idle_timeout": ("idle_timeout", to.duration),
    "on_demand_idle_timeout": ("idle_timeout", to.duration),
    "pinned": ("pinned", to.boolean),
    "lora_adapters": ("lora_adapters", adapters.from_config),
    "lora_paths": ("lora_adapters", adapters.from_paths),
    "lora_scales": ("lora_scales", adapters.scales),
    "lora_init_without_apply": ("lora_init_without_apply", to.boolean),
    "distributed": ("distributed", from_section),
    "replicas": ("replicas", to.at_least(1, 64)),
    "replica_routing": ("replica_routing", to.choice(POLICIES)),
    "replica_imbalance": ("replica_imbalance", to.at_least(0)),
    "autoscaling": ("autoscaling", ray_keys.autoscaling),
    "ray_actor_options": ("ray_actor_options", ray_keys.actor_options),
    "embedding_engine": ("embedding_engine", to.choice(ENCODER_ENGINES)),
}
# mlx-openai-server's model keys we accept and do not act on yet (reported at startup).
MODEL_KEYS_IGNORED = frozenset(
    {
        "enable_auto_tool_choice",
        "config_name",
        "quantize",
        "kv_group_size",
        "quantized_kv_start",
        "trust_remote_code",
        "disable_auto_resize",
        "group",
        "is_default_model",
    }
)
# Prefixes of such keys: default_* sampling keys we have no field for, prompt_cache_*.
MODEL_PREFIXES_IGNORED = ("default_", "prompt_cache_")
SERVER_KEYS: dict[str, tuple[str, to.Convert]] = {
    "host": ("host", to.text),
    "port": ("port", to.at_least(1, 65535)),
    "socket": ("socket", to.path),
    "api_keys": ("api_keys", to.names),
    "api_key": ("api_keys", to.names),
    "log_level": ("log_level", to.log_level),
    "max_body_bytes": ("max_body_bytes", to.integer),
    "max_memory": ("max_memory", to.size),
    "image_url_ttl": ("image_url_ttl", to.number),
    "image_url_max_mib": ("image_url_max_mib", to.at_least(1)),
    "image_max_pixels": ("image_max_pixels", to.at_least(1)),
    "image_max_steps": ("image_max_steps", to.at_least(1)),
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
    keys: dict[str, tuple[str, to.Convert]],
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


def _spread_cache_types(
    values: dict[str, Any], lines: dict[str, int], where: str, what: str
) -> None:
    """kv_bits sets the K and the V cache type; with cache_type_k or _v as well it is an error."""
    if BOTH_CACHE_TYPES not in values:
        return
    cache_type, line = values.pop(BOTH_CACHE_TYPES), lines.pop(BOTH_CACHE_TYPES)
    for target in ("cache_type_k", "cache_type_v"):
        if target in values:
            raise ConfigError(f"{where}:{line}: {what}.kv_bits sets what {target} already set")
        values[target], lines[target] = cache_type, line


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
        elif key.value == "ray":
            try:
                server.update(ray_keys.section(_value(node)))
            except ValueError as exc:
                raise ConfigError(f"{where}:{key.start_mark.line + 1}: ray: {exc}") from None
        else:
            line = key.start_mark.line + 1
            raise ConfigError(
                f"{where}:{line}: unknown key '{key.value}' "
                "(the file has `server:`, `models:` and `ray:`)"
            )
    if not isinstance(models_node, yaml.SequenceNode) or not models_node.value:
        raise ConfigError(f"{where}: no models: the file needs a `models:` list")
    for index, node in enumerate(models_node.value):
        what = f"models[{index}]"
        values, lines = _section(
            node, where, what, MODEL_KEYS, MODEL_KEYS_IGNORED, MODEL_PREFIXES_IGNORED, ignored
        )
        _spread_cache_types(values, lines, where, what)
        section = ModelSection(node.start_mark.line + 1, values, lines)
        if "model" not in values:
            raise ConfigError(f"{where}:{section.line}: {what} has no model_path (or model)")
        if values.get("on_demand") and "idle_timeout" not in values:
            values["idle_timeout"] = ON_DEMAND_IDLE_TIMEOUT_S
        models.append(section)
    return FileConfig(path, server, server_lines, models, ignored)


def unservable(kind: Kind) -> str | None:
    """Why a model of this kind cannot be served here, or None if it can."""
    if kind == "image" and find_spec("diffusers") is None:
        return "image models need diffusers: " + install_extra("images")
    if kind in SERVABLE_KINDS:
        return None
    served = ", ".join(KIND_NAMES[k] for k in sorted(SERVABLE_KINDS))
    return (
        f"no installed mlxcel package serves {KIND_NAMES[kind]} models yet "
        f"(this mlxcel serves {served})"
    )
