"""Command line: ``python -m contrastive_jax.main --config=configs/X.py[:variant] --workdir=DIR``.

Any field can be overridden: ``--config.data.batch_size=256 --config.loss.temperature=0.2``.
Run the same command on every host of a pod (docs/launching.md); a workdir that holds
checkpoints resumes. Results go to ``DIR/results.json``, TensorBoard scalars to
``DIR/tensorboard``, per-step metrics to ``DIR/metrics.jsonl``, checkpoints to
``DIR/checkpoints``. ``DIR`` may be ``gs://bucket/path`` (the ``gcs`` extra; docs/launching.md,
"Remote workdirs").

``--help`` lists the flags and the config files of ``configs/`` with their variants and
defaults; JAX's options are flags too, e.g. ``--jax_num_cpu_devices=8``
(:mod:`contrastive_jax.command_line`).

Exit status (docs/reliability.md):

- 0: the run finished, or was stopped by SIGTERM/SIGINT after saving a checkpoint;
- 2: a problem the user can fix, one paragraph ``error: ...`` on stderr and no traceback: a bad
  config, variant or flag, data that is not prepared, an unusable workdir or checkpoint, a run
  that kept producing non-finite losses (every
  :class:`contrastive_jax.errors.ContrastiveJaxError`), a write the system refused (disk full,
  file-size limit, read-only files: :func:`contrastive_jax.errors.storage_cause`).
  ``CONTRASTIVE_JAX_TRACEBACK=1`` shows the traceback as well;
- 75: a process of a multi-process job was lost (a host died, was preempted or killed;
  process 0, the coordinator, included): one line ``error: the job lost a process: ...``
  naming it and the checkpoint the rerun resumes from (:mod:`contrastive_jax.training.run.
  job_supervisor`); start every process again with the same command;
- 1: anything else, with its traceback: a bug (please report it).
"""

from __future__ import annotations

import itertools
import os
import pathlib
import sys
import traceback
from collections.abc import Sequence

from absl import flags, logging
from ml_collections import config_flags

from contrastive_jax import command_help, command_line
from contrastive_jax.command_line import flag_error, last_line
from contrastive_jax.errors import (
    ConfigError,
    ContrastiveJaxError,
    WorkdirError,
    storage_cause,
    storage_message,
)
from contrastive_jax.training.run.compilation_cache import enable_compilation_cache
from contrastive_jax.training.run.launch import job_supervisor
from contrastive_jax.training.run.launch.distributed import (
    check_same_config,
    join_job,
    launch_settings,
)
from contrastive_jax.training.run.workdir.workdir_path import is_remote, workdir_path, write_probe

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config file, configs/NAME.py[:VARIANTS] (the config files "
    "below); --config.FIELD=VALUE overrides a field.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.")
_ACCEPT_CHANGE = flags.DEFINE_bool(
    "accept_config_change", False,
    "Resume a workdir whose checkpoints were written with another config (workdir/config.json), "
    "continuing with this one; without it such a resume stops and lists the differences.")
_RESPLIT_DATA = flags.DEFINE_bool(
    "resplit_data", False,
    "Resume a checkpoint written by another number of processes: every process starts at the "
    "batch the saved run would have read next (the same examples, in another row order).")


def check_workdir(workdir: str) -> None:
    """Check ``--workdir`` (a local path or ``gs://...``:
    :func:`~contrastive_jax.training.run.workdir.workdir_path.workdir_path`), create it if
    needed and check that a file can be written there (on ``gs://``: an object, so missing
    credentials or permissions show here, before any work)."""
    path = workdir_path(workdir)
    try:
        write_probe(path)
    except Exception as err:
        if not isinstance(err, OSError) and not is_remote(path):
            raise
        reason = getattr(err, "strerror", None) or f"{type(err).__name__}: {err}"
        raise WorkdirError(f"workdir {workdir} is not writable ({reason}); choose another "
                           "--workdir") from None


def parse_trainer_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with the user's mistakes in it turned into :class:`ConfigError`.

    An unknown config key, a bad variant, a value that does not parse, a config file that
    does not load: each becomes one message naming what to change, instead of absl's
    ``FATAL Flags parsing error`` with the config loader's traceback inside. An override of a
    field the config does not have, at any depth, says what works instead
    (:func:`_unknown_key_error`).
    """
    try:
        return flags.FLAGS(argv)
    except ContrastiveJaxError as err:  # config_flags re-raises it with the loader's traceback
        raise type(err)(last_line(err)) from None
    except flags.Error as err:
        cause = err.__context__
        if isinstance(cause, ContrastiveJaxError):  # raised by the config file's get_config
            raise ConfigError(last_line(cause)) from None
        raise _config_file_error(err, argv) or flag_error(err, PROGRAM) from None
    except AttributeError as err:  # ml_collections: an override naming no field
        raise _config_file_error(err, argv) or _unknown_key_error(err, argv) or ConfigError(
            "unknown config key " + _key_text(err)) from None
    except Exception as err:  # the config file's own code raised: its line, not importlib's
        config_error = _config_file_error(err, argv)
        if config_error is None and isinstance(err, KeyError):  # an override's missing block
            config_error = _unknown_key_error(err, argv)
        if config_error is None and isinstance(err, OSError) and \
                "earlier failure to load" in str(err):  # an override of a file not loaded
            config_error = ConfigError(f"--config could not be loaded: {last_line(err)}")
        if config_error is None:
            raise
        raise config_error from err  # its traceback with CONTRASTIVE_JAX_TRACEBACK=1


def _config_specs(argv: list[str]) -> list[str]:
    """The values of ``--config`` in ``argv`` (``FILE[:VARIANTS]``; the last one counts), as
    ``--config=SPEC`` or ``--config SPEC``."""
    specs = [a.partition("=")[2] for a in argv if a.startswith("--config=")]
    return specs + [b for a, b in itertools.pairwise(argv) if a == "--config"]


def _key_text(err: BaseException) -> str:
    """ml_collections' text of a missing key: ``name``, then its "Did you mean ..." if any."""
    return str(err).strip().strip("'\"").replace("\\n", "\n").replace("\\'", "'")


def _unknown_key_error(err: BaseException, argv: list[str]) -> ConfigError | None:
    """The :class:`ConfigError` of an override ``--config.a.b=value`` naming a field the
    config does not have (``err``: ml_collections' error for it), on one line: the key, the
    flag and what works instead: the setting that does
    (:func:`~contrastive_jax.training.models.unwritten_setting_hint`), a variant of the config
    file of that name (with the flag's value), or else the keys of the block the path reaches.
    ``None`` when no override names a missing field (``err`` is not about one)."""
    from ml_collections import config_flags as loader

    from contrastive_jax.training.models import unwritten_setting_hint

    specs = _config_specs(argv)
    if not specs:
        return None
    argv_of_config = ["main", f"--config={specs[-1]}"]  # the config before the overrides
    flag_values = flags.FlagValues()
    loader.DEFINE_config_file("config", None, flag_values=flag_values, sys_argv=argv_of_config)
    try:
        flag_values(argv_of_config)
        config = flag_values.config.to_dict()
    except Exception:
        return None
    for arg in argv:
        flag, _, value = arg.partition("=")
        path = flag.removeprefix("--config.").split(".")
        reached = _reached(config, path) if flag.startswith("--config.") else None
        if reached is None:
            continue
        missing, block = path[len(reached)], _at(config, reached)
        text = _key_text(err).splitlines()
        mean = f" {text[1]}" if len(text) > 1 and text[0].strip("'\"") == missing else ""
        hints = [unwritten_setting_hint(config["model"], path[1:])
                 if path[0] == "model" and isinstance(config.get("model"), dict) else ""]
        file, _, variants = specs[-1].partition(":")
        for key in dict.fromkeys((missing, path[-1])):
            if key in _variant_names(file):
                chosen = ",".join([*filter(None, variants.split(",")),
                                   f"{key}={value or 'VALUE'}"])
                hints.append(f"the config file's variant {key} sets it: --config={file}:{chosen}")
        hints = [h for h in hints if h]
        if not hints and not mean:
            hints = [f"{'.'.join(reached) or 'the config'} has {', '.join(sorted(block))}"
                     if isinstance(block, dict) else f"{'.'.join(reached)} is a value"]
        return ConfigError(f"unknown config key {missing} ({arg})." + mean
                           + (f" What works: {'; '.join(hints)}" if hints else ""))
    return None


def _reached(config: dict, path: list[str]) -> list[str] | None:
    """The leading keys of ``path`` that name nested blocks of ``config`` up to the first key
    their block does not have; ``None`` when the whole path names a field."""
    block = config
    for depth, key in enumerate(path):
        if not isinstance(block, dict) or key not in block:
            return path[:depth]
        block = block[key]
    return None


def _at(config: dict, path: list[str]):
    """The value of ``config`` at the keys ``path``."""
    for key in path:
        config = config[key]
    return config


def _variant_names(file: str) -> set[str]:
    """The variant names of a config file (:func:`~contrastive_jax.command_help.
    config_variants`, read without running it); none for a file that cannot be read."""
    try:
        found = command_help.config_variants(pathlib.Path(file))
    except (OSError, SyntaxError, ValueError):
        return set()
    return {v.partition("=")[0] for v in found or ()}


def _config_file_error(err: BaseException, argv: list[str]) -> ConfigError | None:
    """A :class:`ConfigError` naming the ``--config`` file's line and the error when ``err`` (or
    what it wraps) was raised by that file's code, at import or in ``get_config``; ``None``
    when no line of the file is in its traceback (the error is not the config file's)."""
    specs = _config_specs(argv)
    if not specs:
        return None
    path = os.path.realpath(specs[-1].partition(":")[0])
    chain, error = [], err
    while error is not None and len(chain) < 8:  # the loaders wrap it in their own errors
        chain.append(error)
        error = error.__cause__ or error.__context__
    for error in reversed(chain):  # the innermost first: the config file's own exception
        if isinstance(error, SyntaxError) and error.filename and \
                os.path.realpath(error.filename) == path:
            return ConfigError(f"--config file {error.filename}, line {error.lineno}: "
                               f"SyntaxError: {error.msg}; fix the config file")
        lines = [frame for frame in traceback.extract_tb(error.__traceback__)
                 if os.path.realpath(frame.filename) == path]
        if lines:
            return ConfigError(f"--config file {lines[-1].filename}, line {lines[-1].lineno}: "
                               f"{type(error).__name__}: {error}; fix the config file")
    return None


def load_config():
    """The parsed ``--config`` (a locked ConfigDict); a config file that fails to load is a
    :class:`ConfigError` saying why."""
    config = _CONFIG.value
    try:
        config.keys()  # a file that failed to load leaves a placeholder that raises here
    except OSError as err:
        raise ConfigError(f"--config={flags.FLAGS['config'].serialize().partition('=')[2]} "
                          f"could not be loaded: {last_line(err)}") from None
    return config


def run_identity(config) -> dict[str, str]:
    """What every process of a job must share beside its config
    (:func:`~contrastive_jax.training.run.launch.distributed.check_same_config`): this
    package's source (a digest of its ``.py`` files, with the commit), the versions of
    :data:`~contrastive_jax.training.run.provenance.SOFTWARE`, and the prepared training
    dataset (:func:`~contrastive_jax.training.data.sources.prepared_digest`)."""
    from contrastive_jax.training.data.sources import prepared_digest
    from contrastive_jax.training.run import provenance

    commit, dirty = provenance.git_state()
    source = f"{provenance.source_digest()} ({commit[:12]}{' + local changes' if dirty else ''})"
    data = config.get("data") or {}
    name = data.get("name", "")
    return {"software.contrastive_jax source": source,
            **{f"software.{p}": provenance.version(p) for p in provenance.SOFTWARE},
            f"data.{name or 'dataset'} (prepared)": prepared_digest(name, data.get("data_dir"))}


def _train(positional: list[str]) -> int | None:
    """Train and evaluate the ``--config`` in ``--workdir`` (after flag parsing; the command
    takes no positional arguments: :data:`COMMAND`). A process of a multi-process launch
    trains in a supervised child (:mod:`~contrastive_jax.training.run.launch.job_supervisor`) and
    returns its status."""
    del positional  # always empty
    if not flags.FLAGS["verbosity"].present:  # orbax and tfds log every file at INFO
        logging.set_verbosity(logging.WARNING)
    config = load_config()
    launch = launch_settings(config.get("launch"))
    check_workdir(_WORKDIR.value)
    if launch.mode != "single" and not job_supervisor.supervised():
        status = job_supervisor.supervise(_ARGV, _WORKDIR.value, launch)
        if status is not None:  # the supervisor; its forked child (None) trains
            return status
    enable_compilation_cache()
    join_job(launch)
    job_supervisor.joined()
    check_same_config(config, run_identity(config))
    from contrastive_jax.training.train import train_and_evaluate  # after the distributed start-up

    train_and_evaluate(config, _WORKDIR.value, accept_config_change=_ACCEPT_CHANGE.value,
                       resplit_data=_RESPLIT_DATA.value)


def _drop_closed_loop_callbacks(unraisable) -> None:
    """``sys.unraisablehook`` without TensorStore's late callbacks into orbax's event loop after
    a failed save closed it ("Event loop is closed", one traceback per pending write: noise
    around the one-paragraph storage error); everything else goes to the default hook."""
    if isinstance(unraisable.exc_value, RuntimeError) and \
            str(unraisable.exc_value) == "Event loop is closed":
        return
    sys.__unraisablehook__(unraisable)


PROGRAM = "python -m contrastive_jax.main"
_ARGV: list[str] = []  # the command's arguments, as given
COMMAND = command_line.Command(
    program=PROGRAM, doc=__doc__,
    flag_names=("config", "workdir", "accept_config_change", "resplit_data"),
    required=("config", "workdir"), parse=parse_trainer_flags, configs=True)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (``argv``: the arguments, ``sys.argv[1:]`` when None), through
    :func:`contrastive_jax.command_line.run_command`: the project's own errors as one paragraph and
    exit status 2; so is a write the system refused (:func:`storage_cause`)."""
    sys.unraisablehook = _drop_closed_loop_callbacks
    _ARGV[:] = sys.argv[1:] if argv is None else argv  # a supervised child runs them again
    try:
        status = command_line.run_command(COMMAND, _train, argv)
    except Exception as err:  # a write the system refused is the user's to fix, not a bug
        cause = storage_cause(err)
        if cause is None or os.environ.get(command_line.TRACEBACK_ENV):
            raise
        print(f"error: {storage_message(cause, _WORKDIR.value)}", file=sys.stderr)
        status = 2
    sys.exit(status)


if __name__ == "__main__":
    main()
