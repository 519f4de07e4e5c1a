"""Ctrl-C while the `keras-cait` command starts: the command line's one line, not a traceback.

`keras-cait` spends its first seconds in `import keras_cait`, loading Keras and TensorFlow,
before any code of the command line (`keras_cait.cli`) runs. An interrupt there would end it
with a KeyboardInterrupt traceback from deep inside TensorFlow. So `import keras_cait` calls
`end_on_interrupt_while_starting()` first: in the `keras-cait` process (its console script,
or `python -m keras_cait.cli`) Ctrl-C then ends it with the error contract's line
(keras_cait/cli/errors.py) and exit status 1,

    keras-cait finetune: interrupted; run the same command again (train and finetune resume ...)

until the command begins (`command_begins()`, called by `keras_cait.cli.errors.reported`),
which takes Ctrl-C back as a KeyboardInterrupt and reports it the same way. In any other
process (a notebook, a script importing keras_cait), with `--debug` or KERAS_CAIT_DEBUG=1, or
where SIGINT already has a handler of someone else's, nothing changes.

Python ignores an exception raised in a garbage collector's callback (JAX registers one, run
at every collection) or in a `__del__`: it prints "Exception ignored in ..." and goes on. A
Ctrl-C landing there would be lost, and a training run would go on to its last epoch. While
the command starts, ours is kept quiet and `command_begins` raises it; once the command runs,
an ignored KeyboardInterrupt is signalled again to the main thread (`_thread.interrupt_main`,
from a thread of its own), which raises it where the command reports it.

This module imports nothing heavy: it runs before Keras is imported.
"""

import _thread
import os
import re
import signal
import sys
import time

COMMAND = "keras-cait"
MODULE = "keras_cait.cli"
DEBUG_ENV = "KERAS_CAIT_DEBUG"
INTERRUPTED = "interrupted; run the same command again (train and finetune resume from their last backup)"


def debug_requested(argv):
    """Whether `argv` or the environment asks for tracebacks (`--debug`, KERAS_CAIT_DEBUG=1)."""
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")


def is_the_command(argv=None, orig_argv=None):
    """Whether this process is `keras-cait`: its console script (`keras-cait`, on Windows
    `keras-cait.exe` / `keras-cait-script.py`), or `python -m keras_cait.cli`, whose
    `sys.argv[0]` is "-m" while the package is imported."""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    script = re.sub(r"(-script\.pyw?|\.exe)$", "", os.path.basename(argv[0])) if argv else ""
    if script == COMMAND:
        return True
    module = any(orig_argv[index:index + 2] == ["-m", MODULE] for index in range(len(orig_argv)))
    return bool(argv) and argv[0] == "-m" and (module or f"-m{MODULE}" in orig_argv)


def interrupted_line(argv):
    """`keras-cait <command>: interrupted; ...`, the command being the first word of `argv` not a flag."""
    words = [word for word in argv if not word.startswith("-")]
    command = words[0] if words and re.fullmatch(r"[a-z]+", words[0]) else None
    return f"{COMMAND} {command}: {INTERRUPTED}" if command else f"{COMMAND}: {INTERRUPTED}"


_received = []  # the Ctrl-C this process received while starting, if any
_unraisablehook = []  # the hook `_quiet_when_ours` or `_interrupt_again` stands in for


def _interrupted(signum, frame):
    # SystemExit with a text: Python prints it to standard error once every `finally` has run
    # (standard error is restored after keras_cait.io.stderr has caught it) and exits with 1.
    _received.append(signum)
    raise SystemExit(interrupted_line(sys.argv[1:]))


def _quiet_when_ours(unraisable):
    # Python ignores an exception raised in a garbage collector's callback (JAX registers one) and
    # prints it as "Exception ignored in ...", a traceback. Ours is kept quiet: `command_begins` raises it.
    if isinstance(unraisable.exc_value, SystemExit) and _received:
        return
    (_unraisablehook[0] if _unraisablehook else sys.__unraisablehook__)(unraisable)


def _interrupt_main_soon():
    time.sleep(0.01)
    _thread.interrupt_main()


def _interrupt_again(unraisable):
    # Once the command runs: a Ctrl-C that Python ignored is raised again in the main thread. Not
    # from here: the main thread would raise it in this hook, where Python ignores it too. Another
    # thread signals it a moment later, once this hook and the callback have returned, and the
    # main thread raises it at its next instruction (in such a callback again: this runs again).
    # With --debug it is also printed.
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _thread.start_new_thread(_interrupt_main_soon, ())
        if not debug_requested(sys.argv[1:]):
            return
    (_unraisablehook[0] if _unraisablehook else sys.__unraisablehook__)(unraisable)


def end_on_interrupt_while_starting():
    """In the `keras-cait` process only: Ctrl-C ends it with the contract's line until the command begins."""
    if not is_the_command() or debug_requested(sys.argv[1:]):
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)
        _unraisablehook[:] = [sys.unraisablehook]
        sys.unraisablehook = _quiet_when_ours


def command_begins():
    """The command's own error handling takes Ctrl-C from here, as a KeyboardInterrupt; one that
    came while starting but did not end the process is raised here (see below)."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.unraisablehook is _quiet_when_ours:
        sys.unraisablehook = _interrupt_again
    elif sys.unraisablehook is not _interrupt_again:
        _unraisablehook[:] = [sys.unraisablehook]
        sys.unraisablehook = _interrupt_again
    if _received:
        # A Ctrl-C that landed in a callback whose exceptions Python ignores (see `_quiet_when_ours`)
        # did not end the start; it ends the command here.
        raise KeyboardInterrupt
