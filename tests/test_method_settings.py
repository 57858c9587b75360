"""Methods own their settings: MoCo's ``config.moco`` block, the loss settings parsed once, one
call from a method to its loss whatever the mesh, old records read in today's keys."""

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import clip_loss, nt_xent
from contrastive_jax.losses.siglip import siglip_loss
from contrastive_jax.mesh import make_mesh
from contrastive_jax.training.data.datasets.correlated_gaussians import CorrelatedGaussians
from contrastive_jax.training.methods import LossSettings, MICritic, MoCo, method_for
from contrastive_jax.training.models import build_model
from contrastive_jax.training.run.workdir.config_record import changes, plain, upgrade
from contrastive_jax.training.step.train_step import make_context

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_train import load_config

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "workdir_v0_2_moco"


def test_moco_reads_its_own_block():
    config = load_config("moco_mnist1d.py:quick")
    method = method_for(config)
    assert isinstance(method, MoCo)
    assert (method.momentum, method.queue_size, method.seed) == (0.99, 256, 0)
    config.moco = {"momentum": 0.9, "queue_size": 128}
    method = method_for(config)
    assert (method.momentum, method.queue_size) == (0.9, 128)
    config.moco.momentum = 1.5
    with pytest.raises(ConfigError, match=r"moco.momentum must lie in \[0, 1\]; got 1.5"):
        method_for(config)
    config.moco = {"momentum": 0.9, "queue": 128}
    with pytest.raises(ConfigError, match=r"unknown moco settings \['queue'\]"):
        method_for(config)


def test_the_old_moco_keys_name_the_new_ones():
    config = load_config("moco_mnist1d.py:quick")
    config.model.momentum = 0.9
    with pytest.raises(ConfigError, match=r"model.momentum is a setting of MoCo now: set "
                                          r"config.moco.momentum instead"):
        method_for(config)
    with pytest.raises(ConfigError, match=r"set config.moco.queue_size instead"):
        build_model({**config.model.to_dict(), "queue_size": 64}, nnx.Rngs(0))


def test_old_model_names_build_the_projected_encoder_with_a_warning():
    model = load_config("simclr_mnist1d.py:quick").model.to_dict()
    assert model["name"] == "projected_encoder"
    want = nnx.state(build_model(model, nnx.Rngs(0)), nnx.Param)
    for old in ("simclr", "moco"):
        with pytest.warns(DeprecationWarning, match=f"model.name = '{old}' is deprecated"):
            got = nnx.state(build_model({**model, "name": old}, nnx.Rngs(0)), nnx.Param)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b)


def test_an_old_record_reads_as_todays_config():
    """The committed MoCo workdir's config.json (model.name "moco", model.momentum,
    model.queue_size) equals today's command's config once upgraded; today's records are left
    as they are."""
    old = json.loads((FIXTURE / "config.json").read_text())
    assert old["model"]["name"] == "moco" and old["model"]["queue_size"] == 256
    config = load_config("moco_mnist1d.py:quick")
    config.total_steps, config.checkpoint_every = 4, 2
    config.evaluation.enabled = False
    new = plain(config)
    assert changes(old, new) != []  # the keys did change
    upgraded = upgrade(old)
    assert upgraded["moco"] == {"momentum": 0.99, "queue_size": 256}
    assert upgraded["model"]["name"] == "projected_encoder"
    assert "momentum" not in upgraded["model"] and "queue_size" not in upgraded["model"]
    assert changes(upgraded, upgrade(new)) == []
    assert upgrade(new) == new
    assert old["model"]["name"] == "moco"  # the record itself is not modified


def test_the_loss_settings_are_parsed_once_and_reach_the_step():
    config = load_config("simclr_mnist1d.py:quick")
    method = method_for(config)
    assert method.loss_settings == LossSettings.from_config(config.loss)
    ctx = make_context(config, make_mesh({"data": 8}), None, method)
    assert ctx.loss is method.loss_settings


@pytest.mark.parametrize("strategy", ["", "all_gather", "ring"])
def test_one_call_per_loss_whatever_the_mesh(strategy):
    """``LossSettings.nt_xent_on`` / ``clip_on`` / ``siglip_on`` give the library's
    single-device loss (autodiff reference) on 8 devices for each strategy."""
    mesh = make_mesh({"data": 8})
    k1, k2 = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(k1, (16, 8)), jax.random.normal(k2, (16, 8))
    log_scale, bias = jnp.log(10.0), -2.0
    settings = LossSettings(strategy=strategy, block_size=8)
    np.testing.assert_allclose(settings.nt_xent_on(mesh, x, y, 0.2),
                               nt_xent(x, y, 0.2, impl="autodiff"), rtol=1e-5)
    settings = LossSettings(name="clip", strategy=strategy, block_size=8, direction="x_to_y")
    np.testing.assert_allclose(settings.clip_on(mesh, x, y, log_scale),
                               clip_loss(x, y, log_scale, impl="autodiff", direction="x_to_y"),
                               rtol=1e-5)
    settings = LossSettings(name="siglip", strategy=strategy, block_size=8)
    np.testing.assert_allclose(settings.siglip_on(mesh, x, y, log_scale, bias),
                               siglip_loss(x, y, log_scale, bias, impl="autodiff"), rtol=1e-5)


def test_the_mi_critic_asks_the_source_for_its_true_mi():
    source = CorrelatedGaussians(num_examples=4, dim=3, rho=0.5)
    want = -0.5 * 3 * np.log(1 - 0.25)
    assert MICritic().results(source, None) == {"true_mutual_information": pytest.approx(want)}
    assert MICritic().results([{"x": 0}], None) == {}  # a source without a known MI
