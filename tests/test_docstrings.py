"""Docstrings a reader can follow: every public name has one, the public losses state their
sources (docs/derivations.md, docs/references.md), and their examples run."""

import doctest
import importlib
import inspect
import pathlib
import pkgutil
import re

import pytest

import contrastive_jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The public API of the losses and analytic layers: what users import and cite.
PUBLIC_APIS = ["contrastive_jax.losses", "contrastive_jax.losses.sharded",
               "contrastive_jax.analytic.anchor", "contrastive_jax.analytic.batch"]
WITH_EXAMPLES = ["contrastive_jax.losses.clip", "contrastive_jax.losses.nt_xent",
                 "contrastive_jax.losses.info_nce", "contrastive_jax.losses.moco",
                 "contrastive_jax.losses.siglip", "contrastive_jax.losses.mutual_information",
                 "contrastive_jax.losses.parts.normalize", "contrastive_jax.losses.sharded",
                 "contrastive_jax.training.parameter_paths"]


def _modules():
    for info in pkgutil.walk_packages(contrastive_jax.__path__, "contrastive_jax."):
        yield importlib.import_module(info.name)


def _defined_here(module):
    for name, obj in vars(module).items():
        if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)) and (
                getattr(obj, "__module__", None) == module.__name__):
            yield name, obj


def test_every_public_function_and_class_has_a_docstring():
    missing = [f"{m.__name__}.{name}" for m in _modules() for name, obj in _defined_here(m)
               if not (inspect.getdoc(obj) or "").strip()]
    assert not missing, missing


def _keys() -> set[str]:
    return set(re.findall(r"\[([A-Za-z][A-Za-z0-9]*)\]",
                          (ROOT / "docs" / "references.md").read_text()))


def test_public_losses_cite_a_derivation_or_a_paper():
    keys, sections = _keys(), _sections()
    missing, dangling = [], []
    for module_name in PUBLIC_APIS:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", [n for n, _ in _defined_here(module)]):
            obj = getattr(module, name)
            if not callable(obj):
                continue
            doc = inspect.getdoc(obj) or ""
            cited = re.findall(r"§(\d+(?:\.\d+)?)", doc)
            papers = [k for k in re.findall(r"\[([A-Za-z][A-Za-z0-9]*)\]", doc) if k in keys]
            if not cited and not papers:
                missing.append(f"{module_name}.{name}")
            dangling += [f"{module_name}.{name}: §{c}" for c in cited if c not in sections]
    assert not missing, f"no derivation section or paper cited: {missing}"
    assert not dangling, f"cites sections that docs/derivations.md does not have: {dangling}"


def _sections() -> set[str]:
    text = (ROOT / "docs" / "derivations.md").read_text()
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", text, re.M))


def test_no_source_outside_the_repository_is_cited():
    pattern = re.compile(r"\b00[0-4] (P\d|A\.1\d)|shared/seeds|reference texts?\b")
    offenders = [f"{path.relative_to(ROOT)}:{i}" for path in ROOT.glob("contrastive_jax/**/*.py")
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert not offenders, offenders


@pytest.mark.parametrize("module_name", WITH_EXAMPLES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module_name} has no example"
    assert result.failed == 0
