"""Where an open_clip model comes from: its config, weights, pixels and tokenizer files, found
locally ([OpenCLIP] in docs/references.md; docs/pretrained.md).

:func:`locate` takes a model config (a mapping), a JSON file (``open_clip_config.json`` with
``model_cfg`` and ``preprocess_cfg``, or a plain model config), a hub-layout directory
(``open_clip_config.json`` + ``open_clip_model.safetensors`` / ``open_clip_pytorch_model.bin``),
a Hugging Face cache snapshot or repository folder, ``hf-hub:ORG/NAME`` (looked up in the local
cache: :func:`hf_hub_cache`), or the name of one of open_clip's shipped configs, recorded with
its releases (``pretrained`` tags: Hugging Face repository, ``quick_gelu``, pixels) in
``open_clip_models.json`` (:func:`recorded`; written by tests/fixtures/make_open_clip_models.py),
and gives a :class:`Source`. :func:`source_preprocess` gives its pixel settings,
:func:`tokenizer_spec` its tokenizer (the timm image trunks the configs name:
:mod:`.timm_trunks`). Nothing is downloaded: a source with no local file says
where it looked and what to put there.

The standard library only (no JAX, no PyTorch), so the fixture scripts can run it where
open_clip is installed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
from collections.abc import Mapping
from typing import Any

from contrastive_jax.errors import ConfigError

DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "open_clip_models.json")
CONFIG_FILE = "open_clip_config.json"
# open_clip's preferred weight files of a hub directory, in its order (factory.py)
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth",
                "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth")


@functools.cache
def recorded() -> dict:
    """The recorded data (``open_clip_models.json``): ``open_clip_version``, ``fields`` (the
    defaults of ``CLIPVisionCfg``, ``CLIPTextCfg``, ``CLIP``'s arguments and
    ``PreprocessCfg``), ``models`` (name: ``model_cfg`` as shipped and ``pretrained``
    releases) and ``timm_models`` (timm name: the trunk,
    :func:`.timm_trunks.recorded_timm_trunk`)."""
    with open(DATA_FILE) as f:
        return json.load(f)


def model_names() -> list[str]:
    """The names of open_clip's shipped model configs (``ViT-B-32``, ``ViT-B-16-SigLIP``...)."""
    return sorted(recorded()["models"])


def json_text(value: Any) -> str:
    """A config value as it reads in JSON."""
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


@dataclasses.dataclass(frozen=True)
class Source:
    """An open_clip model config and where it came from: ``model_cfg``; ``preprocess_cfg``
    (open_clip's ``PreprocessCfg`` fields the source gives, or None); ``weights``: the weight
    file when the source has one; ``directory``: the hub directory (its tokenizer files);
    ``origin``: for messages; ``timm_args``: a fixture's ``timm_model_args``; ``name`` and
    ``release``: a recorded config's name and pretrained release."""

    model_cfg: dict | None
    preprocess_cfg: dict | None
    weights: str | None
    directory: str | None
    origin: str
    timm_args: dict | None = None
    name: str | None = None
    release: dict | None = None


def recorded_model(name: str) -> dict:
    """The recorded entry of open_clip's config ``name`` (``model_cfg``, ``pretrained``); an
    unknown name is a :class:`ConfigError` with the closest names."""
    models = recorded()["models"]
    if name not in models:
        close = difflib.get_close_matches(name, list(models), n=5)
        raise ConfigError(f"{name!r} is not one of open_clip {recorded()['open_clip_version']}'s "
                          f"model configs (recorded in {os.path.basename(DATA_FILE)}); closest: "
                          f"{close}; see docs/open_clip_models.md")
    return models[name]


def hf_hub_cache() -> str:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE``, else
    ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's order)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return os.path.expanduser(os.environ[variable])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def cache_folder(repo_id: str, cache: str | None = None) -> str:
    """``CACHE/models--ORG--NAME``: where the cache keeps the repository ``repo_id``."""
    return os.path.join(cache or hf_hub_cache(), "models--" + repo_id.replace("/", "--"))


def cache_snapshot(folder: str) -> str | None:
    """The snapshot directory of a cache repository folder: the one ``refs/main`` names, else
    the only one; None when there is none; several without ``refs/main`` are a
    :class:`ConfigError` listing them."""
    snapshots = os.path.join(folder, "snapshots")
    if not os.path.isdir(snapshots):
        return None
    ref = os.path.join(folder, "refs", "main")
    if os.path.isfile(ref):
        with open(ref) as f:
            revision = f.read().strip()
        if os.path.isdir(os.path.join(snapshots, revision)):
            return os.path.join(snapshots, revision)
    revisions = sorted(os.listdir(snapshots))
    if len(revisions) == 1:
        return os.path.join(snapshots, revisions[0])
    if revisions:
        raise ConfigError(f"{folder} holds {len(revisions)} snapshots {revisions} and no "
                          "refs/main: pass the snapshot directory itself")
    return None


def _weights_in(directory: str, preferred: str | None = None) -> str | None:
    names = ((preferred,) if preferred else ()) + WEIGHT_FILES
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def read_config_file(path: str | os.PathLike) -> Source:
    """A JSON file: an ``open_clip_config.json`` (``model_cfg``, ``preprocess_cfg``,
    optionally a fixture's ``timm_model_args``) or a plain model config."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as err:
        raise ConfigError(f"cannot read the open_clip config {path!r} ({err})") from None
    except ValueError as err:
        raise ConfigError(f"{path!r} is not valid JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path!r} holds a JSON {type(data).__name__}, not an open_clip "
                          "config object")
    if "model_cfg" in data:
        return Source(dict(data["model_cfg"]), data.get("preprocess_cfg"), None, None, path,
                      timm_args=data.get("timm_model_args"))
    if "embed_dim" in data and "vision_cfg" in data:
        return Source(dict(data), None, None, None, path)
    raise ConfigError(f"{path!r} is neither an open_clip_config.json (with 'model_cfg') nor an "
                      f"open_clip model config (embed_dim, vision_cfg, text_cfg); its keys: "
                      f"{sorted(data)}")


def read_directory(path: str | os.PathLike) -> Source:
    """A hub-layout directory (``open_clip_config.json`` and a weight file, open_clip's
    ``local-dir:``), a cache snapshot (the same files) or a cache repository folder
    (``models--ORG--NAME``: its snapshot)."""
    path = os.fspath(path)
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config):
        snapshot = cache_snapshot(path)
        if snapshot is not None:
            return read_directory(snapshot)
        raise ConfigError(f"directory {path!r} has no {CONFIG_FILE} (a Hugging Face hub "
                          f"directory of an open_clip model has one, beside "
                          f"{' or '.join(WEIGHT_FILES[:3])})")
    source = read_config_file(config)
    return dataclasses.replace(source, weights=_weights_in(path), directory=path,
                               origin=f"{CONFIG_FILE} of {path}")


def _normalise_tag(tag: str) -> str:
    return tag.lower().replace("-", "_")  # open_clip's _clean_tag


def read_name(name: str, pretrained: str | None = None, *,
              need_weights: bool = True) -> Source:
    """A recorded config by name and, with ``pretrained``, its release: its pixels, and its
    weights from the local Hugging Face cache (``need_weights``: a missing file is a
    :class:`ConfigError` saying where to put it)."""
    entry = recorded_model(name)
    model_cfg = json.loads(json.dumps(entry["model_cfg"]))
    origin = f"open_clip {recorded()['open_clip_version']}'s config {name!r}"
    if pretrained is None:
        return Source(model_cfg, None, None, None, origin, name=name)
    releases = entry["pretrained"]
    tag = _normalise_tag(pretrained)
    if tag not in releases:
        raise ConfigError(f"{name!r} has no pretrained release {pretrained!r} in open_clip "
                          f"{recorded()['open_clip_version']}; its releases: "
                          f"{sorted(releases) or 'none'}")
    release = releases[tag]
    if bool(model_cfg.get("quick_gelu", False)) != release["quick_gelu"]:
        other = name.removesuffix("-quickgelu") if name.endswith("-quickgelu") \
            else f"{name}-quickgelu"
        raise ConfigError(
            f"release {name}/{tag} was trained with quick_gelu = "
            f"{json_text(release['quick_gelu'])} but the config {name!r} has quick_gelu = "
            f"{json_text(bool(model_cfg.get('quick_gelu', False)))} (open_clip only warns and "
            f"builds the wrong activation): use the config {other!r}")
    source_preprocess = {k: release[k] for k in ("mean", "std", "interpolation", "resize_mode")
                  if release.get(k) is not None}
    origin = f"{origin}, release {tag!r}"
    weights, directory = None, None
    if release.get("hf_repo"):
        folder = cache_folder(release["hf_repo"])
        snapshot = cache_snapshot(folder)
        if snapshot is not None:
            weights = _weights_in(snapshot, release.get("hf_file"))
            directory = snapshot
    if weights is None and need_weights:
        raise ConfigError(_where_to_put(name, tag, release))
    return Source(model_cfg, source_preprocess, weights, directory, origin, name=name,
                  release=release)


def _where_to_put(name: str, tag: str, release: Mapping[str, Any]) -> str:
    files = " or ".join(([release["hf_file"]] if release.get("hf_file") else [])
                        + list(WEIGHT_FILES[:3]))
    if release.get("hf_repo"):
        folder = cache_folder(release["hf_repo"])
        return (f"no local weights for {name} release {tag!r}: looked for {files} in "
                f"{folder}/snapshots/<revision>/ (the Hugging Face cache: $HF_HUB_CACHE, "
                f"$HF_HOME/hub or ~/.cache/huggingface/hub); nothing is downloaded. Put the "
                f"Hugging Face repository {release['hf_repo']} there (e.g. `huggingface-cli "
                f"download {release['hf_repo']}` where there is network, then copy the cache) "
                "or pass its files with --checkpoint=FILE or DIR")
    where = f" (published at {release['url']})" if isinstance(release.get("url"), str) else ""
    return (f"no local weights for {name} release {tag!r}{where}: it is not on the Hugging "
            "Face hub; nothing is downloaded: pass the file with --checkpoint=FILE")


def locate(source: str | os.PathLike | Mapping[str, Any], *,
           pretrained: str | None = None) -> Source:
    """The :class:`Source` of ``source``: a model config (mapping), a JSON file, a
    hub-layout directory / cache snapshot / cache repository folder, ``hf-hub:ORG/NAME``
    (the local cache), or a recorded name (with ``pretrained``: a release; its weights from
    the cache). Anything else is a :class:`ConfigError` saying what was looked for."""
    if isinstance(source, Mapping):
        data = dict(source)
        if "model_cfg" in data:
            return Source(dict(data["model_cfg"]), data.get("preprocess_cfg"), None, None,
                          "the given open_clip config", timm_args=data.get("timm_model_args"))
        return Source(data, None, None, None, "the given open_clip model config")
    text = os.fspath(source)
    if pretrained is not None and text not in recorded()["models"]:
        raise ConfigError(f"pretrained={pretrained!r} names a release of a recorded open_clip "
                          f"model; {text!r} is not a recorded model name")
    if text.startswith("hf-hub:"):
        repo = text.removeprefix("hf-hub:").strip("/")
        folder = cache_folder(repo)
        snapshot = cache_snapshot(folder)
        if snapshot is None:
            raise ConfigError(f"{text}: the Hugging Face repository {repo} is not in the local "
                              f"cache (looked in {folder}/snapshots/; $HF_HUB_CACHE, "
                              f"$HF_HOME/hub or ~/.cache/huggingface/hub); nothing is "
                              f"downloaded: `huggingface-cli download {repo}` where there is "
                              "network, then copy the cache, or pass the directory")
        return read_directory(snapshot)
    if os.path.isdir(text):
        return read_directory(text)
    if os.path.isfile(text) and text.endswith(".json"):
        return read_config_file(text)
    if text in recorded()["models"]:
        return read_name(text, pretrained)
    if os.path.isfile(text):
        return Source(None, None, text, None, text)
    close = difflib.get_close_matches(text, model_names(), n=3)
    raise ConfigError(f"{text!r} is not a file, a directory, hf-hub:ORG/NAME or one of open_clip "
                      f"{recorded()['open_clip_version']}'s model names (closest: {close}; "
                      "docs/open_clip_models.md lists them)")


def source_preprocess(source: Source, image_size: int) -> dict:
    """The ``preprocess.json`` fields (``data.preprocess``: ``mean``, ``std``, ``resize``,
    ``resize_mode``, ``image_size``) of a source: its ``preprocess_cfg`` over open_clip's
    ``PreprocessCfg`` defaults (CLIP's mean and std, bicubic, ``shortest``); the size is the
    model's (open_clip sets it from the image tower)."""
    cfg = {**recorded()["fields"]["preprocess_cfg"],
           **{k: v for k, v in (source.preprocess_cfg or {}).items() if v is not None}}
    return {"mean": [float(v) for v in cfg["mean"]], "std": [float(v) for v in cfg["std"]],
            "resize": cfg["interpolation"], "resize_mode": cfg["resize_mode"],
            "image_size": image_size}


# open_clip's HFTokenizer names whose model is a T5-layout SentencePiece file (SigLIP's c4_en
# and its multilingual -i18n- model), computed by the "sentencepiece_open_clip" kind
SENTENCEPIECE_TOKENIZERS = ("timm/ViT-B-16-SigLIP", "timm/ViT-B-16-SigLIP-i18n-256")
SENTENCEPIECE_FILE = "spiece.model"


def tokenizer_spec(name: str | None, directory: str | None,
               text_cfg: Mapping[str, Any] | None = None) -> dict | None:
    """The ``data.preprocess.tokenizer`` spec of a model: CLIP's BPE (``path`` the merges file
    beside the weights, or ``""``), SigLIP's SentencePiece (``spiece.model`` beside the weights
    or ``""``; ``clean`` from ``tokenizer_kwargs``, HFTokenizer's default ``"whitespace"``
    otherwise; ``pad_id`` from the directory's ``tokenizer_config.json``, ``</s>`` = 1 as the
    SigLIP hub repositories have it), or None for a tokenizer this project does not compute."""
    if not name:
        path = ""
        for candidate in ("bpe_simple_vocab_16e6.txt.gz", "bpe_simple_vocab_16e6.txt"):
            if directory and os.path.isfile(os.path.join(directory, candidate)):
                path = os.path.join(directory, candidate)
        return {"kind": "clip_bpe", "path": path}
    model = os.path.join(directory, SENTENCEPIECE_FILE) if directory else ""
    if name not in SENTENCEPIECE_TOKENIZERS and not os.path.isfile(model):
        return None
    kwargs = dict(dict(text_cfg or {}).get("tokenizer_kwargs") or {})
    pad = "</s>"
    settings = os.path.join(directory, "tokenizer_config.json") if directory else ""
    if settings and os.path.isfile(settings):
        with open(settings) as f:
            value = json.load(f).get("pad_token", pad)
        pad = value.get("content", pad) if isinstance(value, Mapping) else value
    if pad not in ("</s>", "<pad>"):
        raise ConfigError(f"{settings}: pad_token {pad!r}; the SentencePiece tokenizer pads "
                          "with '</s>' (1) or '<pad>' (0)")
    return {"kind": "sentencepiece_open_clip",
            "path": model if os.path.isfile(model) else "",
            "clean": kwargs.get("clean", "whitespace"), "pad_id": 1 if pad == "</s>" else 0}
