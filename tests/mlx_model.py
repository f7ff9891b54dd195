"""A tiny random-weight model in the on-disk format mlx-lm loads, built offline for the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 768
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
INTERMEDIATE = 128
MAX_POSITIONS = 8192

WORDS = """
the a an and or but if then when while of to in on at by for with from about over under
cat dog bird fish horse dragon king queen child story apple banana orange bread water fire
sat ran flew swam told said asked answered found lost made gave took saw heard knew thought
red green blue yellow small large old young happy sad quick slow bright dark warm cold
one two three four five six seven eight nine ten first last next every some many few
house tree river mountain city road garden window door table book letter song word name
Paris London Berlin Rome Madrid Tokyo model server token request answer question hello
is was are were be been has have had do does did will would can could should may might
""".strip()

# Qwen's ChatML template, trimmed to what the tests use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    """Sentences from a fixed word list: the tokenizer, and so the model, never drift."""
    rng = np.random.default_rng(1234)
    words = WORDS.split()
    lines = [", ".join(str(i) for i in range(1, 200))]
    for _ in range(3000):
        sentence = " ".join(rng.choice(words, size=int(rng.integers(4, 14))))
        lines.append(sentence.capitalize() + rng.choice([".", "!", "?", ":", ";"]))
    return lines


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def added_token(content: str) -> dict[str, Any]:
    """A special token's entry in tokenizer_config.json's added_tokens_decoder."""
    return {
        "content": content,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "single_word": False,
        "special": True,
    }


def _tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    added = {str(tokenizer.token_to_id(t)): added_token(t) for t in SPECIAL_TOKENS}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _model_config(architecture: str, vocab: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[architecture]],
        "model_type": architecture,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    return config


def _weights(architecture: str, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(size) * 0.1).astype(np.float32)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    # Large output weights make the logits spread out, so greedy text varies and
    # penalties of a few logits visibly change it.
    weights = {
        "model.embed_tokens.weight": normal(vocab, HIDDEN, scale=1.0),
        "model.norm.weight": norm(HIDDEN),
        "lm_head.weight": normal(vocab, HIDDEN, scale=0.3),
    }
    shapes = {
        "self_attn.q_proj": (q, HIDDEN),
        "self_attn.k_proj": (kv, HIDDEN),
        "self_attn.v_proj": (kv, HIDDEN),
        "self_attn.o_proj": (HIDDEN, q),
        "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTERMEDIATE),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        for name, (rows, cols) in shapes.items():
            weights[f"{prefix}{name}.weight"] = normal(rows, cols, scale=cols**-0.5)
        weights[prefix + "input_layernorm.weight"] = norm(HIDDEN)
        weights[prefix + "post_attention_layernorm.weight"] = norm(HIDDEN)
        if architecture == "qwen2":
            # Qwen2's query, key and value projections have biases.
            for name, (rows, _) in list(shapes.items())[:3]:
                weights[f"{prefix}{name}.bias"] = normal(rows, scale=0.1)
        if architecture == "qwen3":
            weights[prefix + "self_attn.q_norm.weight"] = norm(HEAD_DIM)
            weights[prefix + "self_attn.k_norm.weight"] = norm(HEAD_DIM)
    return weights


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2))


def build_model(target: Path, architecture: str = "llama", seed: int = 0) -> Path:
    """Write a tiny `architecture` ("llama", "qwen2" or "qwen3") model into `target`; return it."""
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.save(str(target / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    _write_json(target / "tokenizer_config.json", _tokenizer_config(tokenizer))
    _write_json(target / "config.json", _model_config(architecture, vocab))
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    _write_json(
        target / "generation_config.json",
        {"eos_token_id": eos, "temperature": 0.7, "top_p": 0.9, "top_k": 30},
    )
    save_file(
        _weights(architecture, vocab, seed), str(target / "model.safetensors"), {"format": "pt"}
    )
    return target


IMAGE_TOKEN = "<image>"
IMAGE_SIDE = 32
PATCH = 8
VISION_HIDDEN = 32
IMAGE_TOKENS = (IMAGE_SIDE // PATCH) ** 2
"""Tokens one image takes in a prompt: a patch each (LLaVA's default drops the CLS row)."""


def _vision_config(vocab: int, image_token: int) -> dict[str, Any]:
    text = _model_config("llama", vocab)
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": VISION_HIDDEN,
        "intermediate_size": 2 * VISION_HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIDE,
        "patch_size": PATCH,
        "projection_dim": VISION_HIDDEN,
        "num_channels": 3,
        "layer_norm_eps": 1e-5,
    }
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": text,
        "vision_config": vision,
        "image_token_index": image_token,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "vocab_size": vocab,
        "torch_dtype": "float32",
    }


def _processor_files(target: Path) -> None:
    """CLIP's image processor at IMAGE_SIDE pixels, and LLaVA's processor around it."""
    _write_json(
        target / "preprocessor_config.json",
        {
            "image_processor_type": "CLIPImageProcessor",
            "do_resize": True,
            "size": {"shortest_edge": IMAGE_SIDE},
            "do_center_crop": True,
            "crop_size": {"height": IMAGE_SIDE, "width": IMAGE_SIDE},
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_convert_rgb": True,
        },
    )
    _write_json(
        target / "processor_config.json",
        {
            "processor_class": "LlavaProcessor",
            "patch_size": PATCH,
            "vision_feature_select_strategy": "default",
            "image_token": IMAGE_TOKEN,
            "num_additional_image_tokens": 1,
        },
    )


def build_vision_model(target: Path, seed: int = 0) -> Path:
    """Write a tiny LLaVA (CLIP tower, projector, the tiny Llama) in mlx-vlm's format."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.llava import Model, ModelConfig, TextConfig, VisionConfig

    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.add_special_tokens([IMAGE_TOKEN])
    tokenizer.save(str(target / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    image_token = tokenizer.token_to_id(IMAGE_TOKEN)
    tokenizer_config = _tokenizer_config(tokenizer)
    tokenizer_config["added_tokens_decoder"][str(image_token)] = added_token(IMAGE_TOKEN)
    _write_json(target / "tokenizer_config.json", tokenizer_config)
    config = _vision_config(vocab, image_token)
    _write_json(target / "config.json", config)
    _processor_files(target)
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    _write_json(target / "generation_config.json", {"eos_token_id": eos})
    text = _weights("llama", vocab, seed)
    weights = {f"language_model.{name}": mx.array(value) for name, value in text.items()}
    rng = np.random.default_rng(seed + 1)
    model_config = ModelConfig.from_dict(config)
    model_config.text_config = TextConfig.from_dict(config["text_config"])
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    model = Model(model_config)
    for name, value in tree_flatten(model.parameters()):
        if not name.startswith("language_model."):
            scale = 1.0 if name.endswith(("norm.weight", "layer_norm1.weight")) else 0.2
            noise = rng.standard_normal(value.shape).astype(np.float32) * scale
            weights[name] = mx.array(noise)
    mx.save_safetensors(str(target / "model.safetensors"), weights, {"format": "mlx"})
    return target
