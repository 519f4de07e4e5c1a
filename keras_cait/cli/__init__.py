"""The applications built on the library: the `keras-cait` command and its runs.

    commands.py   the `keras-cait` command line (predict, convert, export, attention,
                  demo, train, finetune, evaluate); `main` is the console script
    runs.py       train / finetune / evaluate: their flags, calling keras_cait.training.run
    demo.py       `keras-cait demo`: train, export, serve and look inside a CaiT offline
    errors.py     the error contract: every failure one line, Ctrl-C included
    startup/      what the command needs before Keras loads, run by `import keras_cait`:
                  Ctrl-C while starting is its one line, oneDNN's CPU kernels on every x86 CPU

The library (`keras_cait` outside this package) imports nothing from here but `startup/`,
which imports nothing heavy; what a run does is the library's (`keras_cait.training.run`):
this package parses flags, checks them and turns errors into one line.

`build_parser` and `main` load the command line on first use, so that `import keras_cait`,
which runs `startup/`, does not import it.
"""

import importlib

__all__ = ["build_parser", "main"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("keras_cait.cli.commands"), name)
    raise AttributeError(f"module 'keras_cait.cli' has no attribute {name!r}")
