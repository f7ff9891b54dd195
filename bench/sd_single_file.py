"""A Stable Diffusion 1.x diffusers folder as one single-file checkpoint, with original names.

    python bench/sd_single_file.py PIPELINE_DIR OUT.safetensors

Single-file checkpoints (the `.safetensors` files people share for SD 1.x) hold the UNet, the
VAE and the text encoder in one file under the names of the original CompVis code
(`model.diffusion_model.input_blocks.1.0.in_layers.0.weight`, `first_stage_model.decoder.up.3
.block.0.conv1.weight`, `cond_stage_model.transformer.text_model...`). This writes one from a
diffusers folder by renaming its tensors: the inverse of the mapping diffusers' own
`from_single_file` applies, derived from the folder's configs, so a checkpoint of any depth and
width (the tests' tiny pipeline included) round-trips to the same weights.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

UNET = "model.diffusion_model."
VAE = "first_stage_model."
TEXT = "cond_stage_model.transformer."
# Within one ResNet block: (diffusers, original).
UNET_RESNET = (
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("time_emb_proj", "emb_layers.1"),
    ("conv_shortcut", "skip_connection"),
)
UNET_TOP = (
    ("time_embedding.linear_1", "time_embed.0"),
    ("time_embedding.linear_2", "time_embed.2"),
    ("conv_in", "input_blocks.0.0"),
    ("conv_norm_out", "out.0"),
    ("conv_out", "out.2"),
)
VAE_ATTENTION = (
    ("group_norm", "norm"),
    ("to_q", "q"),
    ("to_k", "k"),
    ("to_v", "v"),
    ("to_out.0", "proj_out"),
)


def _unet_prefixes(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(diffusers prefix, original prefix) for every block of the UNet."""
    per = int(config["layers_per_block"])
    levels = len(config["block_out_channels"])
    pairs = [(f"{new}.", f"{old}.") for new, old in UNET_TOP]
    for i in range(levels):
        for j in range(per):
            slot = (per + 1) * i + j + 1
            pairs.append((f"down_blocks.{i}.resnets.{j}.", f"input_blocks.{slot}.0."))
            pairs.append((f"down_blocks.{i}.attentions.{j}.", f"input_blocks.{slot}.1."))
        down = (per + 1) * (i + 1)
        pairs.append((f"down_blocks.{i}.downsamplers.0.conv.", f"input_blocks.{down}.0.op."))
        attends = config["up_block_types"][i].startswith("CrossAttn")
        for j in range(per + 1):
            slot = (per + 1) * i + j
            pairs.append((f"up_blocks.{i}.resnets.{j}.", f"output_blocks.{slot}.0."))
            pairs.append((f"up_blocks.{i}.attentions.{j}.", f"output_blocks.{slot}.1."))
        last = (per + 1) * i + per
        pairs.append(
            (f"up_blocks.{i}.upsamplers.0.", f"output_blocks.{last}.{2 if attends else 1}.")
        )
    pairs.append(("mid_block.attentions.0.", "middle_block.1."))
    pairs += [(f"mid_block.resnets.{j}.", f"middle_block.{2 * j}.") for j in range(2)]
    return pairs


def _rename(name: str, prefixes: list[tuple[str, str]], inner: tuple[tuple[str, str], ...]) -> str:
    for new, old in prefixes:
        if name.startswith(new):
            rest = name[len(new) :]
            for new_part, old_part in inner:
                if rest.startswith(new_part + "."):
                    rest = old_part + rest[len(new_part) :]
                    break
            return old + rest
    raise ValueError(f"no original name for {name}")


def _vae_name(name: str, levels: int) -> str:
    parts = name.split(".")
    if parts[1] in ("down_blocks", "up_blocks"):
        level = int(parts[2]) if parts[1] == "down_blocks" else levels - 1 - int(parts[2])
        stage = "down" if parts[1] == "down_blocks" else "up"
        if parts[3] == "resnets":
            parts = [parts[0], stage, str(level), "block", *parts[4:]]
        else:
            parts = [parts[0], stage, str(level), f"{stage}sample", *parts[5:]]
    elif parts[1] == "mid_block" and parts[2] == "resnets":
        parts = [parts[0], "mid", f"block_{int(parts[3]) + 1}", *parts[4:]]
    elif parts[1] == "mid_block":
        rest = ".".join(parts[4:])
        for new, old in VAE_ATTENTION:
            if rest.startswith(new + "."):
                rest = old + rest[len(new) :]
        parts = [parts[0], "mid", "attn_1", rest]
    name = ".".join(parts).replace("conv_norm_out", "norm_out")
    return name.replace("conv_shortcut", "nin_shortcut")


def write_single_file(folder: Path, out: Path) -> Path:
    """Write `folder`'s UNet, VAE and text encoder to `out` under their original names."""
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "unet" / "config.json").read_text())
    prefixes = _unet_prefixes(config)
    tensors = {}
    for name, tensor in load_file(folder / "unet" / "diffusion_pytorch_model.safetensors").items():
        tensors[UNET + _rename(name, prefixes, UNET_RESNET)] = tensor
    levels = len(json.loads((folder / "vae" / "config.json").read_text())["block_out_channels"])
    for name, tensor in load_file(folder / "vae" / "diffusion_pytorch_model.safetensors").items():
        renamed = _vae_name(name, levels)
        # The original VAE's attention projections are 1x1 convolutions.
        conv = ".mid.attn_1." in renamed and renamed.endswith(".weight") and tensor.ndim == 2
        tensors[VAE + renamed] = tensor[:, :, None, None] if conv else tensor
    for name, tensor in load_file(folder / "text_encoder" / "model.safetensors").items():
        # transformers 5.6 dropped CLIPTextModel's `text_model.` level; the originals have it.
        tensors[TEXT + ("" if name.startswith("text_model.") else "text_model.") + name] = tensor
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, out)
    return out


def single_file_pipeline(folder: Path, out: Path) -> Path:
    """`out`: `folder`'s configs and tokenizer without their weights, and the single-file
    checkpoint of those weights, `out/<folder name>.safetensors` (the path returned)."""
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return write_single_file(folder, out / f"{folder.name}.safetensors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(write_single_file(args.folder, args.out))


if __name__ == "__main__":
    main()
