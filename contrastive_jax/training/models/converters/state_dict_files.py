"""PyTorch state dicts as NumPy: ``.safetensors`` without PyTorch, ``.pt`` / ``.bin`` with it.

:func:`load_state_dict` reads a checkpoint file the user already has into ``{name: float32
array}``, the input of :mod:`~contrastive_jax.training.models.converters.clip_import`;
:func:`torchscript_activation` reads the activation a TorchScript archive's modules name,
without running it.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import zipfile
from collections.abc import Mapping

import numpy as np

from contrastive_jax.errors import ConfigError

# prefixes that wrappers add to every key: DistributedDataParallel, torch.compile
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def load_state_dict(path: str | os.PathLike, *, allow_torchscript: bool = False
                    ) -> dict[str, np.ndarray]:
    """``{name: float32 array}`` of a CLIP checkpoint file, with wrapper prefixes (``module.``,
    ``_orig_mod.``) and open_clip's ``text.`` prefix (CustomTextCLIP) removed.

    ``.safetensors``: safetensors' NumPy reader (bfloat16 tensors through its Flax reader).
    Anything else is read with PyTorch (an import error is a :class:`ConfigError` saying to
    install torch or convert the file to safetensors): ``torch.load(weights_only=True)``, taking
    ``["state_dict"]`` of a training checkpoint. A TorchScript archive (a zip holding
    ``constants.pkl``: OpenAI's release files) is read by ``torch.jit.load``, which runs code
    stored in the file, so only with ``allow_torchscript=True`` (a file you trust); without it
    a :class:`ConfigError` says so. A file's contents pick the path, so a crafted ``.pt`` cannot
    reach ``torch.jit.load`` unless the caller allowed it.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"checkpoint {path!r} does not exist or is not a file")
    if path.endswith(".safetensors"):
        tensors = _load_safetensors(path)
    else:
        torchscript = is_torchscript(path)
        if torchscript and not allow_torchscript:
            raise ConfigError(
                f"{path!r} is a TorchScript archive: loading it (torch.jit.load) runs code "
                "stored in the file, so it is refused by default. If you trust the file (e.g. "
                "OpenAI's release from its official URL), pass --allow_torchscript "
                "(allow_torchscript=True in Python); or convert it to .safetensors where you "
                "trust it")
        tensors = _load_torch(path, torchscript)
    return _normalise_names(tensors)


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError

    try:
        return _read_safetensors(path)
    except SafetensorError as err:  # truncated, cut inside the header, not safetensors at all
        raise ConfigError(f"{path!r} is not a readable .safetensors file ({err}); it may be "
                          "truncated (copy or download it again) or another format") from None


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    out = {}
    with safe_open(path, framework="np") as f:
        half = [k for k in f.keys() if f.get_slice(k).get_dtype() == "BF16"]
        out.update({k: np.asarray(f.get_tensor(k), np.float32) for k in f.keys()
                    if k not in half})
    if half:  # NumPy has no bfloat16: read those through JAX
        with safe_open(path, framework="flax") as f:
            out.update({k: np.asarray(f.get_tensor(k), np.float32) for k in half})
    return out


def is_torchscript(path: str) -> bool:
    """OpenAI's release files are TorchScript archives (a zip with ``constants.pkl``)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(n.endswith("/constants.pkl") or n == "constants.pkl"
                   for n in archive.namelist())


def _load_torch(path: str, torchscript: bool) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as err:
        raise ConfigError(
            f"reading {path!r} needs PyTorch (pip install torch); or convert it to a "
            ".safetensors file where PyTorch is installed (safetensors.torch.save_file of its "
            "state dict), which this importer reads without PyTorch") from err
    try:
        if torchscript:
            state = torch.jit.load(path, map_location="cpu").state_dict()
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as err:
        reason = _torch_reason(err)
        if "Unsupported global" in reason:  # weights_only refuses pickled classes
            raise ConfigError(
                f"{path!r} holds pickled Python objects, not only tensors (e.g. a whole model "
                f"saved with torch.save(model)), which weights_only loading refuses ({reason}); "
                "save its state_dict() and convert that") from None
        raise ConfigError(f"{path!r} is not a readable PyTorch checkpoint ({reason}); it may "
                          "be truncated (copy or download it again) or another format") from None
    if not torchscript and isinstance(state, Mapping) and \
            isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise ConfigError(f"{path!r} holds a {type(state).__name__}, not a state dict")
    return {k: v.detach().float().numpy() for k, v in state.items()
            if isinstance(v, torch.Tensor)}


def _torch_reason(err: BaseException) -> str:
    """The informative line of a ``torch.load`` error (its weights-only unpickler's own
    reason when there is one, not the advice paragraph before it)."""
    text = str(err).strip()
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip()
    lines = text.splitlines()
    return lines[0] if lines else type(err).__name__


def _normalise_names(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in tensors.items():
        for prefix in WRAPPER_PREFIXES:
            name = name.removeprefix(prefix)
        name = name.removeprefix("text.")  # open_clip's CustomTextCLIP keeps its text tower there
        value = np.asarray(value, np.float32)
        if name == "logit_scale" and value.shape == (1,):  # open_clip's nonscalar_logit_scale
            value = value.reshape(())
        out[name] = value
    return out


def _pickle_classes(data: bytes) -> set[str]:
    """``module.Class`` names a pickle refers to (its GLOBAL / STACK_GLOBAL opcodes), read with
    :mod:`pickletools` (nothing is unpickled or run)."""
    out, strings = set(), []
    for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
        if opcode.name == "GLOBAL":
            out.add(str(arg).replace(" ", "."))
        elif opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(str(arg))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            out.add(f"{strings[-2]}.{strings[-1]}")
    return out


def torchscript_activation(path: str | os.PathLike) -> str | None:
    """The activation of a TorchScript archive of a CLIP (OpenAI's releases, a scripted
    open_clip model), read from the archive as data (the module classes its ``data.pkl``
    names, the ``approximate`` its stored GELU code declares; nothing in it runs):
    ``"quick_gelu"`` (QuickGELU modules only), ``"gelu"`` / ``"gelu_tanh"``
    (``torch.nn.GELU`` only), or None when it cannot tell (neither, both, or an unreadable
    archive)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            classes = set()
            for name in names:
                if name.endswith("data.pkl"):
                    classes |= _pickle_classes(archive.read(name))
            approximate = set()
            for name in names:
                if name.endswith(".py") and "/code/" in f"/{name}":
                    code = archive.read(name).decode("utf-8", "replace")
                    approximate |= set(re.findall(
                        r"class GELU\(Module\):.*?approximate : Final\[str\] = \"(\w+)\"",
                        code, re.S))
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return None
    quick = any(c.rsplit(".", 1)[-1] == "QuickGELU" for c in classes)
    gelu = any(c.rsplit(".", 1)[-1] == "GELU" for c in classes)
    if quick and not gelu:
        return "quick_gelu"
    if gelu and not quick and len(approximate) == 1:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate.pop())
    return None
