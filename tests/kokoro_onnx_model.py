"""A tiny random-weight Kokoro ONNX model, built offline with `onnx`: the real graph's inputs
and output (phoneme ids with their pads, a [1, 256] style, a speed) and audio whose length is
SAMPLES_PER_ID per id over the speed, its sound set by the ids and the style; and a voices file
of VOICES, each a [510, 1, 256] style array, in an .npz as kokoro-onnx ships voices-v1.0.bin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SAMPLES_PER_ID = 240
STYLE_WIDTH = 256
VOICES = ("af_heart", "bm_lewis")
_VOCAB = 178


def _constant(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def kokoro_graph(ids_name: str = "tokens", batched_output: bool = False) -> onnx.ModelProto:
    """kokoro-onnx's export (`tokens` in, 1-D `audio` out), or onnx-community's (`input_ids`
    in, `waveform` [1, samples] out) with ids_name='input_ids' and batched_output."""
    rng = np.random.default_rng(16)
    out_name = "waveform" if batched_output else "audio"
    weights = [
        _constant("amplitude", rng.uniform(0.2, 0.9, (_VOCAB, 1)).astype(np.float32)),
        _constant("voice_weights", rng.standard_normal((STYLE_WIDTH, 1)).astype(np.float32)),
        _constant("per_id", np.array(SAMPLES_PER_ID, np.float32)),
        _constant("pitch", np.array(0.06, np.float32)),
        _constant("zero", np.array(0, np.int64)),
        _constant("one", np.array(1, np.int64)),
        _constant("axis1", np.array([1], np.int64)),
        _constant("scalar", np.zeros(0, np.int64)),
        _constant("flat", np.array([-1], np.int64)),
        _constant("out_shape", np.array([1, -1] if batched_output else [-1], np.int64)),
    ]
    node = helper.make_node
    nodes = [
        node("Shape", [ids_name], ["ids_shape"]),
        node("Gather", ["ids_shape", "axis1"], ["count1"]),
        node("Reshape", ["count1", "scalar"], ["count"]),
        node("Sub", ["count", "one"], ["last"]),
        node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
        node("Mul", ["count_f", "per_id"], ["at_speed_1"]),
        node("Div", ["at_speed_1", "speed"], ["length_f"]),
        node("Floor", ["length_f"], ["length_floor"]),
        node("Cast", ["length_floor"], ["length1"], to=TensorProto.INT64),
        node("Reshape", ["length1", "scalar"], ["length"]),
        node("Range", ["zero", "length", "one"], ["t_i"]),
        node("Cast", ["t_i"], ["t"], to=TensorProto.FLOAT),
        node("Mul", ["t", "speed"], ["t_scaled"]),
        node("Div", ["t_scaled", "per_id"], ["position_f"]),
        node("Floor", ["position_f"], ["position_floor"]),
        node("Cast", ["position_floor"], ["position_raw"], to=TensorProto.INT64),
        node("Min", ["position_raw", "last"], ["position"]),
        node("Reshape", [ids_name, "flat"], ["ids_flat"]),
        node("Gather", ["ids_flat", "position"], ["id_at"]),
        node("Gather", ["amplitude", "id_at"], ["amplitude_at2"]),
        node("Reshape", ["amplitude_at2", "flat"], ["amplitude_at"]),
        node("MatMul", ["style", "voice_weights"], ["voice2"]),
        node("Reshape", ["voice2", "flat"], ["voice_raw"]),
        node("Tanh", ["voice_raw"], ["voice"]),
        node("Mul", ["voice", "pitch"], ["shift"]),
        node("Add", ["pitch", "shift"], ["rate"]),
        node("Mul", ["t", "rate"], ["phase"]),
        node("Sin", ["phase"], ["tone"]),
        node("Mul", ["tone", "amplitude_at"], ["wave"]),
        node("Reshape", ["wave", "out_shape"], [out_name]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_kokoro",
        [
            helper.make_tensor_value_info(ids_name, TensorProto.INT64, [1, "sequence"]),
            helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, STYLE_WIDTH]),
            helper.make_tensor_value_info("speed", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info(
                out_name, TensorProto.FLOAT, [1, "samples"] if batched_output else ["samples"]
            )
        ],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_voices(path: Path, names: tuple[str, ...] = VOICES) -> Path:
    """A voices file as kokoro-onnx ships it: an .npz (whatever its suffix) of name -> style
    [510, 1, 256]."""
    rng = np.random.default_rng(17)
    styles = {n: rng.standard_normal((510, 1, STYLE_WIDTH)).astype(np.float32) for n in names}
    with path.open("wb") as out:
        np.savez(out, **styles)  # type: ignore[arg-type]
    return path


def build_kokoro_onnx(folder: Path, ids_name: str = "tokens", voices: bool = True) -> Path:
    """A model folder as kokoro-onnx's releases lay it out: kokoro-v1.0.onnx beside
    voices-v1.0.bin (left out with voices=False)."""
    folder.mkdir(parents=True, exist_ok=True)
    batched = ids_name == "input_ids"
    onnx.save(kokoro_graph(ids_name, batched), folder / "kokoro-v1.0.onnx")
    if voices:
        write_voices(folder / "voices-v1.0.bin")
    return folder
