"""The layers of the package, as the tree shows them, hold: nothing imports a higher layer.

Layers, lowest first (docs/architecture.md):

0. ``contrastive_jax.errors``, ``contrastive_jax.mesh``: error types and the device mesh;
1. ``contrastive_jax.losses`` (and the package's top level): the losses, JAX and NumPy only;
2. ``contrastive_jax.analytic``: closed-form gradients and the gradient check, on the losses;
3. ``contrastive_jax.training``: methods, models, data, optimisers, checkpoints, the loop,
   evaluation;
4. ``contrastive_jax.main``, ``contrastive_jax.plan``, ``contrastive_jax.demo``: the command lines.

Experiment helpers live in ``experiments/common``, outside the package.
"""

import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "contrastive_jax"
LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ("contrastive_jax.errors", 0), ("contrastive_jax.mesh", 0),
    ("contrastive_jax", 1), ("contrastive_jax.losses", 1),
    ("contrastive_jax.analytic", 2),
    ("contrastive_jax.training", 3),
    ("contrastive_jax.main", 4), ("contrastive_jax.plan", 4), ("contrastive_jax.demo", 4),
]
# What the losses layer may import from outside the standard library.
LOSSES_THIRD_PARTY = {"jax", "jaxlib", "numpy"}


def layer(module: str) -> int:
    matches = [(len(p), n) for p, n in LAYERS if module == p or module.startswith(p + ".")]
    return max(matches)[1]


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path


def imports(path: pathlib.Path, module: str):
    """Every module ``path`` imports (at the top or inside functions), absolute names."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            yield base
            for alias in node.names:  # ``from contrastive_jax import losses``
                yield f"{base}.{alias.name}"


def test_no_module_imports_a_higher_layer():
    known = {name for name, _ in modules()}
    violations = []
    for name, path in modules():
        for target in set(imports(path, name)):
            if not target.startswith("contrastive_jax"):
                continue
            while target not in known and "." in target:  # ``pkg.module.symbol`` -> module
                target = target.rpartition(".")[0]
            if layer(target) > layer(name):
                violations.append(f"{name} (layer {layer(name)}) imports {target} "
                                  f"(layer {layer(target)})")
    assert not violations, "\n".join(violations)


def test_the_losses_layer_needs_only_jax_and_numpy():
    violations = []
    for name, path in modules():
        if layer(name) > 1:
            continue
        for target in imports(path, name):
            top = target.split(".")[0]
            if top and top != "contrastive_jax" and top not in sys.stdlib_module_names and (
                    top not in LOSSES_THIRD_PARTY):
                violations.append(f"{name} imports {target}")
    assert not violations, "\n".join(violations)


def test_importing_the_losses_loads_no_training_dependency():
    code = ("import sys, contrastive_jax, contrastive_jax.losses, "
            "contrastive_jax.analytic.gradcheck;"
            "heavy = ['flax', 'optax', 'orbax', 'tensorflow_datasets', 'grain', 'ml_collections',"
            " 'matplotlib', 'sklearn', 'absl', 'tensorboardX', 'contrastive_jax.training'];"
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_experiment_helpers_are_outside_the_package():
    for name, path in modules():
        tops = {target.split(".")[0] for target in imports(path, name)}
        assert "matplotlib" not in tops, f"{name} imports matplotlib"
        assert "common" not in tops, f"{name} imports the experiments' helpers"
