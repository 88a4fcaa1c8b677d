"""A console program's `main(argv)` run in the test's own process, where the process boundary is not what a test
checks (each program keeps an end-to-end test in a process of its own): one TensorFlow start saved per call."""

import contextlib
import io
import os
import types


def run_main(main, argv, cwd=None, check=False):
    """`main(argv)` with stdout and stderr captured, in `cwd` if given: (returncode, stdout, stderr), a SystemExit's
    code counting as the return code, as a shell sees it; `check=True` fails the test unless it is 0 (stderr's
    end shown)."""
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(argument) for argument in argv])
            except SystemExit as exit_:
                code = exit_.code
    finally:
        os.chdir(previous)
    assert not check or code == 0, err.getvalue()[-4000:]
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
