"""Exporting a dual encoder as an open_clip model directory (contrastive_jax.clip_export,
contrastive_jax.training.models.converters.open_clip.export_files), without PyTorch.

The open_clip fixtures (two CLIPs, tests/test_clip_import.py; a SigLIP with a timm trunk,
tests/test_open_clip_siglip.py) are imported, saved as converted directories and exported: the
exported state dict is the original file's bit for bit, every key, and the exported
``model_cfg`` is the config open_clip built the fixture from (up to the spelling of a ratio
that gives the same MLP width). A CLIP-shaped run trained one step exports from its workdir
(latest checkpoint or ``--step``) to the parameters it holds. What open_clip cannot represent is
refused naming the option. That open_clip 3.3.0 loads the exports and computes the same
features is checked outside the suite (tests/fixtures/check_clip_export_open_clip.py; numbers
in docs/pretrained.md).
"""

import json
import pathlib

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file
from test_open_clip_siglip import (
    FIXTURE,
    SIGLIP_BLOCK,
    SIGLIP_PREPROCESS,
    WEIGHTS,
    siglip_params,
)

from contrastive_jax import clip_export
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.converters import (
    clip_import,
    converted_directory,
)
from contrastive_jax.training.models.converters.open_clip import export_files, tensor_layouts
from contrastive_jax.training.parameter_paths import leaves_by_path

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
CLIP_PREPROCESS = {"mean": list(clip_import.OPENAI_MEAN), "std": list(clip_import.OPENAI_STD),
                   "resize": "bicubic", "image_size": 16}
TINY_TIMM = "vit_tiny_test_patch4_siglip_16"


def clip_model_cfg(layers: int, quick_gelu: bool) -> dict:
    """The config tests/fixtures/make_open_clip_fixture.py built its CLIPs from."""
    cfg = {"embed_dim": 24,
           "vision_cfg": {"image_size": 16, "patch_size": 4, "width": 32, "layers": layers,
                          "head_width": 16, "pool_type": "tok"},
           "text_cfg": {"context_length": 16, "vocab_size": 100, "width": 32, "heads": 2,
                        "layers": layers}}
    return {"embed_dim": 24, "quick_gelu": True, **cfg} if quick_gelu else cfg


def without_ratio(cfg: dict) -> dict:
    """``cfg`` with the text tower's mlp_ratio left out (checked separately)."""
    return {**cfg, "text_cfg": {k: v for k, v in cfg["text_cfg"].items() if k != "mlp_ratio"}}


@pytest.mark.parametrize("case", ["quickgelu", "gelu", "siglip"])
def test_exported_fixture_is_the_original_state_dict(case, tmp_path):
    if case == "siglip":
        block, params, pixels = SIGLIP_BLOCK, siglip_params(), SIGLIP_PREPROCESS
        original, extra = load_file(WEIGHTS), [f"--timm_model_name={TINY_TIMM}"]
    else:
        path = FIXTURES / f"open_clip_tiny_{case}.safetensors"
        block, params = clip_import.convert_checkpoint(path, quick_gelu=case == "quickgelu",
                                            vision_heads=2, text_heads=2)
        pixels, original, extra = CLIP_PREPROCESS, load_file(path), []
    converted_directory.save_converted(tmp_path / "converted", block, params, preprocess=pixels)
    out = tmp_path / "open_clip"
    assert clip_export.main([f"--converted={tmp_path / 'converted'}", f"--output={out}",
                             *extra]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["open_clip_config.json",
                                                     "open_clip_model.safetensors"]
    exported = load_file(out / "open_clip_model.safetensors")
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        assert exported[name].dtype == np.float32, name
        assert exported[name].tobytes() == value.tobytes(), name
    config = json.loads((out / "open_clip_config.json").read_text())
    cfg = config["model_cfg"]
    if case == "siglip":
        recorded = json.loads((FIXTURE / "open_clip_config.json").read_text())
        want = recorded["model_cfg"]
        # another ratio with the same MLP width: int(16 * 3.6875) = int(16 * 3.7362) = 59
        assert int(16 * cfg["text_cfg"]["mlp_ratio"]) == int(16 * want["text_cfg"][
            "mlp_ratio"]) == 59
        assert cfg["init_logit_bias"] == -4.7  # the value (the fixture's init was -10)
        assert without_ratio({**cfg, "init_logit_bias": -10}) == without_ratio(want)
        args, want_args = config["timm_model_args"], recorded["timm_model_args"]
        assert int(16 * args.pop("mlp_ratio")) == int(16 * want_args.pop("mlp_ratio")) == 59
        assert args == want_args
        assert config["preprocess_cfg"] == {**recorded["preprocess_cfg"]}
    else:
        assert cfg == clip_model_cfg(2 if case == "quickgelu" else 1, case == "quickgelu")
        assert config["preprocess_cfg"] == {
            "mean": list(clip_import.OPENAI_MEAN), "std": list(clip_import.OPENAI_STD),
            "interpolation": "bicubic", "resize_mode": "shortest"}
    with pytest.raises(ConfigError, match="not an empty directory"):
        export_files.export(out, block, params, pixels,
                           timm_model_name=TINY_TIMM if extra else None)


def clip_shaped_config():
    """The pod template's tiny run with CLIP's own towers (class token, ln_pre, token and
    argmax pooling, causal text, no output layers, exact GELU, eps 1e-5)."""
    from test_train import load_config

    config = load_config("clip_vit_b16_pod.py:tiny")
    clip = {"features": None, "activation": "gelu", "layer_norm_eps": 1e-5}
    config.model.sample_encoder.update({**clip, "class_token": True, "pre_norm": True,
                                        "pool": "token", "patch_bias": False})
    config.model.text_encoder.update({**clip, "causal": True, "pool": "argmax"})
    config.model.update({"dtype": "float32", "remat": False})
    config.augment = None
    return config


def test_a_trained_workdir_exports_the_parameters_of_its_checkpoint(tmp_path, capsys):
    """One step of a CLIP-shaped run, checkpointed as the trainer does (orbax manager, item
    "state"; config.json): the export of the latest checkpoint re-imports to its parameters
    bit for bit, --step=0 to the initial ones; preprocess_cfg from data.preprocess."""
    import orbax.checkpoint as ocp

    from contrastive_jax.mesh import make_mesh
    from contrastive_jax.training.methods import method_for
    from contrastive_jax.training.parameter_paths import path_name
    from contrastive_jax.training.run import checkpoints
    from contrastive_jax.training.run.workdir.config_record import write_config
    from contrastive_jax.training.step import train_step
    from contrastive_jax.training.step.state_sharding import state_shardings
    from contrastive_jax.training.step.train_state import create_state

    config = clip_shaped_config()
    method = method_for(config)
    graphdef, state, tx = create_state(config, 2, method)
    mesh = make_mesh({"data": 8})
    state = jax.device_put(state, state_shardings(config.sharding, mesh, state))
    step = train_step.compiled_step(config, mesh, graphdef, state, tx, 2, method)
    workdir = tmp_path / "run"
    manager = checkpoints.manager(workdir, every=1, keep=3)
    manager.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()

    def by_path(tree):
        return {path_name(p): np.asarray(a) for p, a in jax.tree_util.tree_leaves_with_path(tree)}

    first = by_path(state.params)
    rng = np.random.default_rng(0)
    batch = {"image": rng.integers(0, 256, (16, 32, 32, 3), dtype=np.uint8),
             "caption": rng.integers(1, 64, (16, 12)).astype(np.int32)}
    state, _ = step(state, batch)
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
    manager.close()
    write_config(config, workdir)
    last = by_path(state.params)
    assert not np.array_equal(last["text_proj/kernel"], first["text_proj/kernel"])
    for flags, want in (([], last), (["--step=0"], first)):
        out = tmp_path / f"export{len(flags)}"
        assert clip_export.main([f"--workdir={workdir}", f"--output={out}", *flags]) == 0
        assert f"step {1 - len(flags)}" in capsys.readouterr().out
        params = tensor_layouts.params_from_state_dict(
            config.model, load_file(out / "open_clip_model.safetensors"))
        got = leaves_by_path(params)
        assert sorted(got) == sorted(want)
        for path, value in want.items():
            assert got[path].tobytes() == value.tobytes(), path
    exported = json.loads((out / "open_clip_config.json").read_text())
    assert exported["model_cfg"] == {
        "embed_dim": 8,
        "vision_cfg": {"image_size": 32, "patch_size": 16, "width": 16, "layers": 1,
                       "head_width": 8, "pool_type": "tok"},
        "text_cfg": {"context_length": 12, "vocab_size": 64, "width": 16, "heads": 2,
                     "layers": 1}}
    assert exported["preprocess_cfg"] == {
        "mean": list(config.data.preprocess.mean), "std": list(config.data.preprocess.std),
        "interpolation": "bicubic", "resize_mode": "shortest"}
    assert clip_export.main([f"--workdir={workdir}", f"--output={tmp_path / 'x'}",
                             "--step=7"]) == 2
    assert "has no checkpoint of step 7; its steps: [0, 1]" in capsys.readouterr().err
    # step 1's arrays no longer match a checksum record (one naming none of them): exported
    # from step 0, said on the way
    (workdir / "checkpoints" / "1" / "checksums").mkdir()
    (workdir / "checkpoints" / "1" / "checksums" / "metadata").write_text('{"leaves": {}}')
    out = tmp_path / "fallback"
    assert clip_export.main([f"--workdir={workdir}", f"--output={out}"]) == 0
    assert (f"warning: --workdir {workdir}: step 1: it does not match the checksums recorded "
            "when it was saved (damaged files); using an earlier one") in capsys.readouterr().out
    got = leaves_by_path(tensor_layouts.params_from_state_dict(
        config.model, load_file(out / "open_clip_model.safetensors")))
    assert all(got[path].tobytes() == value.tobytes() for path, value in first.items())


def block(vision=None, text=None, **model):
    """A CLIP-shaped model block (image 32, patch 16, width 64, 2 heads; text 12 ids of 64)
    with ``vision`` / ``text`` / ``model`` settings changed."""
    own = {"features": None, "activation": "gelu", "layer_norm_eps": 1e-5, "depth": 1}
    return {"name": "dual_encoder",
            "sample_encoder": {"name": "vit", "image_size": 32, "patch": 16, "width": 64,
                               "heads": 2, **own, "class_token": True, "pre_norm": True,
                               "pool": "token", "patch_bias": False, **(vision or {})},
            "text_encoder": {"name": "text_transformer", "vocab_size": 64, "max_tokens": 12,
                             "width": 64, "heads": 2, **own, "causal": True,
                             "pool": "argmax", **(text or {})},
            "embed_dim": 32, **model}


TIMM = {"class_token": False, "pre_norm": False, "patch_bias": True, "layer_norm_eps": 1e-6}


@pytest.mark.parametrize("changes,named", [
    ({"name": "projected_encoder"}, r"model.name = 'projected_encoder'"),
    ({"vision": {"name": "signal_cnn"}}, r"model.sample_encoder.name = 'signal_cnn'"),
    ({"vision": {"features": 128}}, r"model.sample_encoder.features = 128"),
    ({"text": {"features": 64}}, r"model.text_encoder.features = 64"),
    ({"text": {"pool": "mean", "causal": False}}, r"model.text_encoder.pool = 'mean'"),
    ({"vision": {"in_channels": 1}}, r"model.sample_encoder.in_channels = 1"),
    ({"vision": {"patch_bias": True}}, r"model.sample_encoder.patch_bias = True"),
    ({"vision": {"activation": "quick_gelu"}},
     r"model.sample_encoder.activation = 'quick_gelu' but the other tower's is not"),
    ({"sample_projection": "linear_bias"}, r"model.sample_projection = 'linear_bias'"),
    ({"vision": {**TIMM, "pool": "mean"}}, r"no registered timm model has this image tower "
                                           r"\(image 32 patch 16 width 64 .*--timm_model_name"),
    ({"vision": {**TIMM, "pool": "map", "pre_norm": True}},
     r"model.sample_encoder.pre_norm = True"),
    ({"vision": {**TIMM, "pool": "map", "layer_norm_eps": 1e-5}},
     r"model.sample_encoder.layer_norm_eps = 1e-05"),
    ({"vision": {**TIMM, "pool": "map", "activation": "quick_gelu"}},
     r"model.sample_encoder.activation = 'quick_gelu': timm"),
    ({"vision": {**TIMM, "pool": "mean", "norm_after_pool": True}},
     r"model.sample_encoder.norm_after_pool = True"),
])
def test_what_open_clip_cannot_represent_is_refused_by_name(changes, named):
    model = block(changes.pop("vision", None), changes.pop("text", None), **changes)
    with pytest.raises(ConfigError, match=named):
        export_files.model_cfg(model)


def test_a_registered_name_must_have_the_sizes():
    model = block({**TIMM, "pool": "map"})
    with pytest.raises(ConfigError, match=r"--timm_model_name = 'vit_base_patch16_siglip_224' "
                                          r"is timm's \(224, 16, 768"):
        export_files.model_cfg(model, timm_model_name="vit_base_patch16_siglip_224")
    cfg, args = export_files.model_cfg(model, timm_model_name="my_vit")
    assert cfg["vision_cfg"]["timm_model_name"] == "my_vit" and args == {
        "img_size": 32, "patch_size": 16, "embed_dim": 64, "depth": 1, "num_heads": 2,
        "mlp_ratio": 4.0, "class_token": False, "global_pool": "map"}


def siglip_b16(**vision):
    """open_clip's ViT-B-16-SigLIP as a model block (what the importers give)."""
    tower = {"width": 768, "depth": 12, "heads": 12, "features": None, "activation": "gelu",
             "layer_norm_eps": 1e-6}
    return {"name": "dual_encoder",
            "sample_encoder": {"name": "vit", "image_size": 224, "patch": 16, **tower, **TIMM,
                               "pool": "map", **vision},
            "text_encoder": {"name": "text_transformer", "vocab_size": 32000, "max_tokens": 64,
                             **tower, "causal": False, "pool": "last"},
            "embed_dim": 768, "siglip": True, "init_bias": -10.0, "sample_projection": "none",
            "text_projection": "linear_bias"}


def test_real_siglip_sizes_map_to_timms_registered_trunks():
    """ViT-B-16-SigLIP's block gives open_clip 3.3.0's own ViT-B-16-SigLIP.json (less its
    tokenizer keys); the mean-pooled tower is timm's gap variant; SO400M's MLP width 4304
    (int(1152 * 3.7362)) finds its trunk; gelu_tanh is timm's GELUTanh (B/32) and, in
    open_clip's own towers, act_kwargs approximate='tanh'."""
    cfg, args = export_files.model_cfg(siglip_b16())
    assert args is None
    assert cfg == {
        "embed_dim": 768, "init_logit_bias": -10.0, "custom_text": True,
        "vision_cfg": {"image_size": 224, "timm_model_name": "vit_base_patch16_siglip_224",
                       "timm_model_pretrained": False, "timm_pool": "map", "timm_proj": "none"},
        "text_cfg": {"context_length": 64, "vocab_size": 32000, "width": 768, "heads": 12,
                     "layers": 12, "no_causal_mask": True, "pool_type": "last",
                     "proj_bias": True, "norm_kwargs": {"eps": 1e-6}}}
    gap, _ = export_files.model_cfg(siglip_b16(pool="mean"))
    assert gap["vision_cfg"]["timm_model_name"] == "vit_base_patch16_siglip_gap_224"
    assert gap["vision_cfg"]["timm_pool"] == "avg"
    so400m = siglip_b16(image_size=224, patch=14, width=1152, depth=27, heads=16,
                        mlp_width=4304)
    so400m["text_encoder"].update({"width": 1152, "heads": 16, "depth": 27, "mlp_width": 4304})
    so400m["embed_dim"] = 1152
    cfg, _ = export_files.model_cfg(so400m)
    assert cfg["vision_cfg"]["timm_model_name"] == "vit_so400m_patch14_siglip_224"
    assert int(1152 * cfg["text_cfg"]["mlp_ratio"]) == 4304
    b32 = siglip_b16(image_size=256, patch=32, activation="gelu_tanh")
    assert export_files.model_cfg(b32)[0]["vision_cfg"]["timm_model_name"] == \
        "vit_base_patch32_siglip_256"
    tanh, _ = export_files.model_cfg(block({"activation": "gelu_tanh"},
                                          {"activation": "gelu_tanh"}))
    assert tanh["vision_cfg"]["act_kwargs"] == tanh["text_cfg"]["act_kwargs"] == {
        "approximate": "tanh"}


def test_command_line_errors(tmp_path, capsys):
    for args, message in (
            ([f"--output={tmp_path / 'o'}"], "exactly one of --workdir"),
            ([f"--workdir={tmp_path}", f"--converted={tmp_path}", f"--output={tmp_path / 'o'}"],
             "exactly one of --workdir"),
            ([f"--converted={tmp_path}", "--step=3", f"--output={tmp_path / 'o'}"],
             "--step applies to --workdir"),
            ([f"--converted={tmp_path}", f"--output={tmp_path / 'o'}"], "no model.json"),
            ([f"--workdir={tmp_path}", f"--output={tmp_path / 'o'}"], "no config.json"),
            ([f"--converted={tmp_path}"], "--output is required")):
        assert clip_export.main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert clip_export.main(["--help"]) == 0
    assert "open_clip_config.json" in capsys.readouterr().out
