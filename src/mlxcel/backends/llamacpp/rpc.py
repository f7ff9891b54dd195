"""llama.cpp's RPC backend, from the very build that serves the model: remote devices
registered through ggml's backend registry (as llama-server's --rpc does, common/arg.cpp), the
layers each device got, and ggml's RPC server (tools/rpc/rpc-server.cpp). llama-cpp-python's
own `rpc_servers` argument is ignored since llama.cpp moved RPC into the registry."""

from __future__ import annotations

import ctypes
import functools
import re
import socket
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp._ctypes_extensions import load_shared_library

from mlxcel.engine.capabilities import DeviceInfo

# enum ggml_backend_dev_type (ggml-backend.h)
_DEV_CPU, _DEV_GPU, _DEV_IGPU = 0, 1, 2
_CONNECT_TIMEOUT_S = 5.0
_LAYER_LINE = re.compile(rb"layer +(\d+) assigned to device (\S+),")

_AddServer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_StartServer = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p
)


class RpcError(RuntimeError):
    """An RPC host cannot be used; the message names it."""


def _declare(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
    function = getattr(lib, name)
    function.restype, function.argtypes = restype, list(argtypes)


@functools.cache
def _ggml() -> ctypes.CDLL:
    """libggml as llama-cpp-python ships it (the registry and the device calls)."""
    lib = load_shared_library("ggml", Path(llama_cpp.__file__).parent / "lib")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    _declare(lib, "ggml_backend_load_all", None)
    _declare(lib, "ggml_backend_reg_by_name", vp, ctypes.c_char_p)
    _declare(lib, "ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p)
    _declare(lib, "ggml_backend_reg_dev_count", sz, vp)
    _declare(lib, "ggml_backend_reg_dev_get", vp, vp, sz)
    _declare(lib, "ggml_backend_dev_count", sz)
    _declare(lib, "ggml_backend_dev_get", vp, sz)
    _declare(lib, "ggml_backend_dev_by_type", vp, ctypes.c_int)
    _declare(lib, "ggml_backend_dev_type", ctypes.c_int, vp)
    _declare(lib, "ggml_backend_dev_name", ctypes.c_char_p, vp)
    _declare(lib, "ggml_backend_dev_description", ctypes.c_char_p, vp)
    _declare(lib, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
    lib.ggml_backend_load_all()
    return lib


def _rpc_proc(name: str, prototype: Any) -> Any:
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise RpcError(
            "this llama-cpp-python was built without RPC: reinstall it with "
            "CMAKE_ARGS=-DGGML_RPC=ON (make install does)"
        )
    return prototype(address)


def supports_rpc() -> bool:
    """Whether the llama.cpp build here has the RPC backend."""
    return bool(llama_cpp.llama_supports_rpc())


def check_reachable(endpoint: str, shown: str) -> None:
    """Raise RpcError naming `shown` unless a TCP connection to `endpoint` opens: ggml's RPC
    client aborts the process on a host it cannot reach, so it is asked only after this."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise RpcError(f"RPC host {shown} is unreachable: {why}") from None


@dataclass
class ModelDevices:
    """The devices a model is loaded onto, as llama.cpp's model parameters take them."""

    pointers: list[int]
    """The RPC devices first, then the local GPUs, as llama-server orders them."""
    array: Any
    """The NULL-terminated ggml_backend_dev_t array the parameters point to (kept alive)."""
    shown: dict[str, str]
    """A device description (a ggml endpoint) to the host the user named."""


def model_devices(endpoints: Sequence[tuple[str, str]]) -> ModelDevices:
    """Register each (ggml endpoint, name to show) RPC server, reachable (check_reachable),
    and list the model's devices."""
    add_server = _rpc_proc("ggml_backend_rpc_add_server", _AddServer)
    lib = _ggml()
    pointers: list[int] = []
    for endpoint, shown in endpoints:
        reg = add_server(endpoint.encode())
        if not reg:
            raise RpcError(f"RPC host {shown} offers no devices")
        pointers += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(_dev_count(reg))]
    for i in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(device) in (_DEV_GPU, _DEV_IGPU) and device not in pointers:
            pointers.append(device)
    array = (ctypes.c_void_p * (len(pointers) + 1))(*pointers, None)
    return ModelDevices(pointers, array, {e: s for e, s in endpoints})


def _dev_count(reg: int) -> int:
    return int(_ggml().ggml_backend_reg_dev_count(reg))


@contextmanager
def layer_split() -> Iterator[Counter[str]]:
    """Count the layers llama.cpp assigns to each device while a model loads (its own debug
    lines, load_tensors), passing every line on to llama-cpp-python's logger."""
    from llama_cpp import _logger

    counts: Counter[str] = Counter()

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def capture(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        found = _LAYER_LINE.search(text)
        if found:
            counts[found.group(2).decode()] += 1
        _logger.llama_log_callback(level, text, user_data)

    llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
    try:
        yield counts
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def devices_report(devices: ModelDevices | None, counts: Counter[str]) -> tuple[DeviceInfo, ...]:
    """Each device the model's layers went to, the CPU first, with its layer count."""
    lib = _ggml()
    pointers = [lib.ggml_backend_dev_by_type(_DEV_CPU), *(devices.pointers if devices else ())]
    shown = devices.shown if devices is not None else {}
    report = []
    for pointer in pointers:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(pointer, ctypes.byref(free), ctypes.byref(total))
        name = lib.ggml_backend_dev_name(pointer).decode(errors="replace")
        description = lib.ggml_backend_dev_description(pointer).decode(errors="replace")
        report.append(
            DeviceInfo(name, shown.get(description, description), counts[name], total.value)
        )
    return tuple(report)


def start_server(endpoint: str, threads: int, cache_dir: Path | None) -> None:
    """Run ggml's RPC server on `endpoint` over this machine's devices (its GPUs, else its
    CPU, as rpc-server picks them); returns only when it cannot serve."""
    start = _rpc_proc("ggml_backend_rpc_start_server", _StartServer)
    lib = _ggml()
    found = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    devices = [d for d in found if lib.ggml_backend_dev_type(d) in (_DEV_GPU, _DEV_IGPU)]
    devices = devices or [lib.ggml_backend_dev_by_type(_DEV_CPU)]
    array = (ctypes.c_void_p * len(devices))(*devices)
    cache = str(cache_dir).encode() if cache_dir is not None else None
    start(endpoint.encode(), cache, threads, len(devices), ctypes.cast(array, ctypes.c_void_p))
