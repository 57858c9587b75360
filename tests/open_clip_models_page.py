"""docs/open_clip_models.md, rendered from the recorded data and the converter's decisions (not
a test): written by tests/fixtures/make_open_clip_models.py and compared with the file by
tests/test_open_clip_config.py. Like the converter modules it uses, the standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contrastive_jax.training.models.converters.open_clip.config_options import (
    MODEL_CONVERTED,
    MODEL_NO_EFFECT,
    MODEL_REFUSED,
    TEXT_CONVERTED,
    TEXT_NO_EFFECT,
    TEXT_REFUSED,
    TIMM_SUPPORTED,
    VISION_CONVERTED,
    VISION_NO_EFFECT,
    VISION_REFUSED,
    supported_values,
)
from contrastive_jax.training.models.converters.open_clip.model_configs import verdict
from contrastive_jax.training.models.converters.open_clip.model_sources import (
    json_text,
    model_names,
    recorded,
)


def state_dict_digest(shapes: Mapping[str, Any]) -> str:
    """SHA-256 of the sorted lines ``name:d1,d2,...`` of a state dict's ``{name: shape}``,
    the ``text.`` prefix (open_clip's ``CustomTextCLIP``) removed: recorded for every
    converted config (``models[name]["state_dict"]``) to compare with the tensors the
    converter's rules read."""
    import hashlib

    lines = sorted(f"{name.removeprefix('text.')}:{','.join(str(int(d)) for d in shape)}"
                   for name, shape in shapes.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


HIDDEN_SETTINGS = {
    "text pool_type 'eos' (the eos_id position)":
        lambda m: m["text_cfg"].get("pool_type") == "eos",
    "text pool_type 'last' / 'first'":
        lambda m: m["text_cfg"].get("pool_type") in ("last", "first"),
    "text no_causal_mask":
        lambda m: bool(m["text_cfg"].get("no_causal_mask")),
    "vision pool_type 'avg' (+ final_ln_after_pool)":
        lambda m: m["vision_cfg"].get("pool_type") == "avg",
    "LayerNorm eps other than 1e-5 (norm_kwargs)":
        lambda m: bool(m["vision_cfg"].get("norm_kwargs") or m["text_cfg"].get("norm_kwargs")),
    "tanh GELU (act_kwargs)":
        lambda m: bool(m["vision_cfg"].get("act_kwargs") or m["text_cfg"].get("act_kwargs")),
    "QuickGELU (quick_gelu)": lambda m: bool(m.get("quick_gelu")),
    "heads other than width / 64":
        lambda m: ("head_width" in m["vision_cfg"] and m["vision_cfg"]["head_width"] != 64)
        or m["text_cfg"].get("width", 512) != 64 * m["text_cfg"].get("heads", 8),
}


def verdict_counts() -> dict[str, int]:
    """``{"convertible": n, "refused": m}`` over the recorded configs."""
    blocks = [verdict(name)[0] for name in model_names()]
    return {"convertible": sum(b is not None for b in blocks),
            "refused": sum(b is None for b in blocks)}


def _releases(entry: Mapping[str, Any]) -> str:
    tags = []
    for tag, release in sorted(entry["pretrained"].items()):
        tags.append(f"`{tag}` ({release['hf_repo']})" if release.get("hf_repo") else f"`{tag}`")
    return ", ".join(tags) or "none"


def models_table() -> str:
    """The markdown table of every recorded config: converted (what it converts to) or refused
    (why), and its releases."""
    lines = ["| config | converted | image and text towers, or why not | releases (Hugging "
             "Face repository) |", "| --- | --- | --- | --- |"]
    for name in model_names():
        block, why = verdict(name)
        why = why.replace(f"; supported: {TIMM_SUPPORTED}", "").replace("|", "\\|")
        entry = recorded()["models"][name]
        lines.append(f"| `{name}` | {'yes' if block else 'no'} | {why} | "
                     f"{_releases(entry)} |")
    return "\n".join(lines) + "\n"


def _options_table() -> str:
    fields = recorded()["fields"]
    lines = ["| option | default | converted / no effect / refused |", "| --- | --- | --- |"]
    for where, key, converted, no_effect, refused in (
            ("model", "model", MODEL_CONVERTED, MODEL_NO_EFFECT, MODEL_REFUSED),
            ("vision_cfg", "vision_cfg", VISION_CONVERTED, VISION_NO_EFFECT, VISION_REFUSED),
            ("text_cfg", "text_cfg", TEXT_CONVERTED, TEXT_NO_EFFECT, TEXT_REFUSED)):
        known = {**fields[key], **({"custom_text": False, "multimodal_cfg": None}
                                   if key == "model" else {})}
        for option in sorted(known):
            if option in converted:
                how = f"converted: {converted[option]}"
            elif option in no_effect:
                how = f"no effect at inference: {no_effect[option]}"
            elif option in refused:
                how = (f"refused unless {supported_values(refused[option][0])} "
                       f"({refused[option][1]})")
            else:
                how = "(unclassified)"
            name = option if where == "model" else f"{where}.{option}"
            default = ("" if option in ("vision_cfg", "text_cfg")
                       else f"`{json_text(known[option])}`")
            lines.append(f"| `{name}` | {default} | {how} |")
    return "\n".join(lines) + "\n"


def _hidden_table() -> str:
    lines = ["| setting the tensors do not show | configs using it |", "| --- | --- |"]
    configs = recorded()["models"]
    for what, uses in HIDDEN_SETTINGS.items():
        names = [n for n in sorted(configs) if uses(configs[n]["model_cfg"])]
        lines.append(f"| {what} | {len(names)}: {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(lines) + "\n"


def models_document() -> str:
    """docs/open_clip_models.md (written by tests/fixtures/make_open_clip_models.py)."""
    data = recorded()
    counts = verdict_counts()
    return f"""# open_clip's model configs and the CLIP converter

Generated by `{data['generator']}` on {data['date']} from open_clip {data['open_clip_version']}
(timm {data['timm_version']}, torch {data['torch_version']}): its {len(data['models'])}
shipped model configs, recorded in
`contrastive_jax/training/models/converters/open_clip/open_clip_models.json`, and the decision of
`model_configs.model_block` on each: **{counts['convertible']} converted, {counts['refused']}
refused**. Converted means the `dual_encoder` block computes what open_clip's model computes
(every option converted exactly); refused names the first option that the project's models do
not compute. `python -m contrastive_jax.training.models.converters.clip_import --model=NAME`
(or `--open_clip_config=FILE|DIR`, or `--checkpoint=` a hub directory) reads these settings
from the config instead of guessing them from tensor shapes (docs/pretrained.md).

## Every option

Each field of open_clip's `CLIPVisionCfg` and `CLIPTextCfg` and each top-level key of a model
config (`CLIP`'s arguments, the factory's `custom_text` and `multimodal_cfg`). "No effect at
inference" options are accepted (set, they are listed in the converter's notes); an option
open_clip does not know is refused. With a timm trunk (`vision_cfg.timm_model_name`) open_clip
reads only `timm_*`, `image_size` and `patch_dropout`; the rest of `vision_cfg` has no effect.
A timm trunk converts when it is {TIMM_SUPPORTED} (what timm builds for the name is recorded
from timm on PyTorch's meta device).

{_options_table()}
## Without a config

A bare state dict (`--checkpoint=FILE` alone) shows sizes, not these settings. The converter
then assumes CLIP's (heads `width // 64`, LayerNorm eps 1e-5, class-token pooling after
`ln_post`, a causal text mask with argmax pooling, the activation from `--quick_gelu`) and warns
that it did; where the tensors contradict CLIP (a text projection with a bias, no `ln_pre`, a
timm trunk, a ResNet, a Hugging Face text tower) it refuses and asks for the config. The
settings it cannot see, and the shipped configs that use them:

{_hidden_table()}
## The shipped configs

{models_table()}"""
