"""The layers of the package, as the tree shows them, hold: nothing imports a higher layer.

Layers, lowest first (docs/architecture.md):

0. ``contrastive_jax.errors``, ``contrastive_jax.mesh``, ``contrastive_jax.interrupts``: error
   types, the device mesh, Ctrl-C during a command;
1. ``contrastive_jax.losses`` (and the package's top level): the losses, JAX and NumPy only;
2. ``contrastive_jax.analytic``: closed-form gradients and the gradient check, on the losses;
3. ``contrastive_jax.training``: methods, models, data, optimisers, checkpoints, the loop,
   evaluation; and ``contrastive_jax.command_line`` / ``command_help`` (the commands' flags,
   help and errors, on absl);
4. ``contrastive_jax.main``, ``contrastive_jax.plan``, ``contrastive_jax.demo``,
   ``contrastive_jax.evaluate``: the command lines.

Experiment helpers live in ``experiments/common``, outside the package. Inside layer 3, the
rooms of ``contrastive_jax.training`` (methods, models, step, run, ...) import each other only as
:data:`TRAINING_ROOMS` allows.
"""

import ast
import pathlib
import re
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "contrastive_jax"
LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ("contrastive_jax.errors", 0), ("contrastive_jax.mesh", 0), ("contrastive_jax.interrupts", 0),
    ("contrastive_jax", 1), ("contrastive_jax.losses", 1),
    ("contrastive_jax.analytic", 2),
    ("contrastive_jax.training", 3), ("contrastive_jax.command_line", 3),
    ("contrastive_jax.command_help", 3),
    ("contrastive_jax.main", 4), ("contrastive_jax.plan", 4),
    ("contrastive_jax.demo", 4), ("contrastive_jax.pretrained", 4),
    ("contrastive_jax.clip_export", 4), ("contrastive_jax.evaluate", 4),
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


def package_arrows() -> set[tuple[str, str]]:
    """Every ``(importer, imported)`` pair of the package's modules; ``pkg.module.symbol``
    resolves to its module."""
    known = {name for name, _ in modules()}
    arrows = set()
    for name, path in modules():
        for target in set(imports(path, name)):
            if not target.startswith("contrastive_jax"):
                continue
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            arrows.add((name, target))
    return arrows


def test_no_module_imports_a_higher_layer():
    violations = [f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})"
                  for name, target in sorted(package_arrows()) if layer(target) > layer(name)]
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


# --------------------------------------------------------- rooms of the losses and analytic
# Inside the losses layer (and the analytic package above it), which room may import which.
# A module belongs to the room of its longest matching prefix; an import between two rooms
# that is not an arrow of LOSS_ARROWS fails (imports inside a room are free).
LOSS_ROOMS = {
    "contrastive_jax.losses": "public losses",  # info_nce, clip, nt_xent, moco, siglip, ...
    "contrastive_jax.losses.parts": "parts",  # validation, normalize, similarity, temperature
    "contrastive_jax.losses.tiling": "tiling",  # the subpackage's docstring
    "contrastive_jax.losses.tiling.tile": "tiling.tile",
    "contrastive_jax.losses.tiling.row_exchange": "tiling.row_exchange",
    "contrastive_jax.losses.tiling.tile_loops": "tiling.tile_loops",
    "contrastive_jax.losses.tiling.custom_vjps": "tiling.custom_vjps",
    "contrastive_jax.analytic": "analytic",
}
LOSS_ARROWS = {  # room -> the rooms it may import
    "parts": set(),
    "tiling": set(),
    "tiling.tile": {"parts"},
    "tiling.row_exchange": {"tiling.tile"},
    "tiling.tile_loops": {"tiling.tile", "parts"},
    "tiling.custom_vjps": {"tiling.tile", "tiling.row_exchange", "tiling.tile_loops",
                           "parts"},
    # the engine's entry points, and RowExchange for its settings; never the loops or a tile
    "public losses": {"tiling.custom_vjps", "tiling.row_exchange", "parts"},
    # closed forms check the public losses; the engine's internals are not theirs to use
    "analytic": {"public losses", "parts"},
}


def loss_room(module: str) -> str | None:
    matches = [(len(p), room) for p, room in LOSS_ROOMS.items()
               if module == p or module.startswith(p + ".")]
    return max(matches)[1] if matches else None


def loss_room_violations(arrows) -> list[str]:
    """The ``(importer, imported)`` module pairs that no arrow of :data:`LOSS_ARROWS` allows."""
    bad = []
    for source, target in arrows:
        a, b = loss_room(source), loss_room(target)
        if a is not None and b is not None and a != b and b not in LOSS_ARROWS[a]:
            bad.append(f"{source} ({a}) imports {target} ({b})")
    return sorted(bad)


def test_the_losses_rooms_import_only_along_their_arrows():
    known = {name for name, _ in modules()}
    arrows = package_arrows()
    assert not loss_room_violations(arrows), "\n".join(loss_room_violations(arrows))
    # every room of the table holds a module, and the check does catch an arrow it forbids
    assert {loss_room(name) for name in known} >= set(LOSS_ARROWS)
    assert loss_room_violations({("contrastive_jax.losses.tiling.custom_vjps",
                                  "contrastive_jax.losses.clip"),
                                 ("contrastive_jax.analytic.gradcheck",
                                  "contrastive_jax.losses.tiling.tile")}) == [
        "contrastive_jax.analytic.gradcheck (analytic) imports "
        "contrastive_jax.losses.tiling.tile (tiling.tile)",
        "contrastive_jax.losses.tiling.custom_vjps (tiling.custom_vjps) imports "
        "contrastive_jax.losses.clip (public losses)"]

# --- the rooms of contrastive_jax.training -------------------------------------------------
# Each folder (or root module) of contrastive_jax.training is a room; a room imports only the
# rooms listed here (and the layers below the training layer: errors, mesh). "losses" stands
# for contrastive_jax.losses: only the methods call the losses. docs/architecture.md draws it.
TRAINING_ROOMS = {
    "augmentations": set(),  # JAX augmentations of a batch
    "data": set(),  # datasets, tokenizers, the grain input pipeline
    "parameter_paths": set(),  # a leaf's "a/0/b" name in any parameter tree, and back
    # a saved checkpoint's checksums, their check, its read on the host (run/ and models/)
    "checkpoint_integrity": {"parameter_paths"},
    # Flax NNX encoders, heads, the model registry, locked towers (converters: the readers of
    # pretrained sources, a trainer workdir's checkpoints among them)
    "models": {"parameter_paths", "checkpoint_integrity"},
    "methods": {"augmentations", "models", "losses"},  # SimCLR, MoCo, CLIP, SigLIP, MI critic
    "evaluation": {"augmentations", "data", "models"},  # probes, zero-shot, retrieval
    # the train step, train state, accumulation, sharding (augmentations: the pixel
    # normalisation's settings, for the method's context)
    "step": {"methods", "models", "augmentations", "parameter_paths"},
    # workdir, lock, checkpoints, config record, ...
    "run": {"step", "models", "parameter_paths", "checkpoint_integrity"},
    "config": {"step"},  # base_config (the state's sharding defaults)
    # resolve(config, workdir) -> RunSpec: the method, the sources, the evaluators, the mesh
    "run_spec": {"data", "evaluation", "methods", "models", "run", "step"},
    # the periodic and final evaluations, results.json, a stopped run's message
    "run_results": {"evaluation", "run", "step"},
    "train": {"augmentations", "data", "models", "methods", "evaluation", "step", "run",
              "config", "run_spec", "run_results"},  # the loop
}


def training_room(module: str) -> str | None:
    """``"methods"`` for ``contrastive_jax.training.methods.simclr``; ``"losses"`` for any
    module of the losses; ``None`` for the package itself and for modules outside both."""
    parts = module.split(".")
    if parts[:2] == ["contrastive_jax", "losses"]:
        return "losses"
    if parts[:2] != ["contrastive_jax", "training"] or len(parts) < 3:
        return None
    return parts[2]


def test_the_training_rooms_import_only_what_their_table_allows():
    """Every module of contrastive_jax.training sits in a room of :data:`TRAINING_ROOMS` (a
    new loose module at the training root fails here) and imports only the rooms its row
    lists: a method importing the step or the data, the step importing the losses, fail."""
    known = {name for name, _ in modules()}
    rooms = {training_room(name) for name in known} - {None, "losses"}
    assert rooms == set(TRAINING_ROOMS), (
        f"rooms without a row: {sorted(rooms - set(TRAINING_ROOMS))}; rows without a room: "
        f"{sorted(set(TRAINING_ROOMS) - rooms)}")
    violations = []
    for name, target in sorted(package_arrows()):
        room, other = training_room(name), training_room(target)
        if room in (None, "losses") or target == "contrastive_jax.training":
            continue
        if other not in (None, room) and other not in TRAINING_ROOMS[room]:
            violations.append(f"{name} ({room}) imports {target} ({other})")
    assert not violations, "\n".join(violations)


# --- folder size ---------------------------------------------------------------------------
MAX_MODULES_PER_FOLDER = 10  # a folder holds one concept; a larger one splits into subfolders


def test_every_folder_of_the_package_holds_at_most_ten_modules():
    counts = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            counts.setdefault(path.parent.relative_to(PACKAGE.parent).as_posix(), []).append(
                path.name)
    crowded = {folder: len(names) for folder, names in counts.items()
               if len(names) > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules: {crowded}"
    assert len(counts) >= 15  # the walk did find the package's folders


# Every command module's entry point is ``main(argv=None)`` (``python -m`` runs it; the tests
# call ``module.main([...])``): the one public name that several modules share by design.
SHARED_ENTRY_POINT = "main"


def _top_level_names(kind) -> dict[str, list[str]]:
    """``{name: [module files]}`` of the package's top-level classes (``kind`` ClassDef) or
    public functions (FunctionDef) defined in more than one module."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, kind) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    return {name: where for name, where in found.items() if len(where) > 1}


def test_no_two_classes_and_no_two_public_functions_share_a_name():
    """A name says which thing it is: a reader who meets ``Block`` or ``convert`` in a
    traceback or an import knows the module without looking (the commands' ``main`` aside)."""
    assert _top_level_names(ast.ClassDef) == {}
    shared = _top_level_names((ast.FunctionDef, ast.AsyncFunctionDef))
    assert set(shared) <= {SHARED_ENTRY_POINT}, {k: v for k, v in shared.items()
                                                 if k != SHARED_ENTRY_POINT}
    assert len(shared.get(SHARED_ENTRY_POINT, [])) >= 9  # every command module has one


def test_the_module_map_names_every_module_and_folder():
    """docs/architecture.md's module map still matches the tree: every module of the package
    is named in it (by its name) and every folder (``name/``), so a new module or room is
    placed in the map when it is added."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
               if path.name not in ("__init__.py", "__main__.py")
               and not re.search(rf"\b{re.escape(path.stem)}\b", doc)]
    missing += [f"{folder.relative_to(PACKAGE)}/" for folder in sorted(PACKAGE.rglob("*"))
                if (folder / "__init__.py").exists() and f"{folder.name}/" not in doc]
    assert not missing, f"not in docs/architecture.md's module map: {missing}"
