"""Several ``python -m contrastive_jax.main`` command lines from one interpreter (not a test).

    python tests/forked_command_lines.py < commands.json > results.json

``commands.json`` is a list of ``{"args": [...], "env": {...}}``: the arguments after
``-m contrastive_jax.main`` and the environment variables to set; ``"bug": "message"`` makes
that child's ``train.train_and_evaluate`` raise ``RuntimeError(message)`` (a bug in the
trainer, to check what the command line does with one). The interpreter imports the
command line (and the trainer it imports) once, then forks one child per command: the child
parses its own flags (the parent never parses any) and runs ``main.main()``, as
``python -m contrastive_jax.main`` does, with its stdout and stderr in files; its exit status
is the one that command would have (an uncaught exception: its traceback and 1, as the
interpreter does). Prints a JSON list of ``{"returncode", "stdout", "stderr"}``. The test suite
checks the user errors this way: one import of JAX and the trainer instead of one per command.
"""

import json
import os
import sys
import tempfile
import traceback


def run_in_child(args: list[str], env: dict[str, str], out_path: str, err_path: str,
                 bug: str | None = None) -> int:
    """Fork; in the child, run the command line with ``args`` and exit with its status."""
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    code = 1
    try:
        os.environ.update(env)
        for fd, path in ((1, out_path), (2, err_path)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(handle, fd)
            os.close(handle)
        sys.argv = ["contrastive_jax.main", *args]
        from contrastive_jax import main

        if bug is not None:
            from contrastive_jax.training import train

            def raise_bug(config, workdir, **options):
                raise RuntimeError(bug)

            train.train_and_evaluate = raise_bug
        try:
            main.main()
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    commands = json.load(sys.stdin)
    from contrastive_jax import main as _  # noqa: F401  (imported once, before the forks)
    from contrastive_jax.training import train as _train  # noqa: F401

    results = []
    with tempfile.TemporaryDirectory() as folder:
        out_path, err_path = os.path.join(folder, "out"), os.path.join(folder, "err")
        for command in commands:
            sys.stdout.flush()
            code = run_in_child(command["args"], command.get("env", {}), out_path, err_path,
                                command.get("bug"))
            with open(out_path) as out, open(err_path) as err:
                results.append({"returncode": code, "stdout": out.read(), "stderr": err.read()})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
