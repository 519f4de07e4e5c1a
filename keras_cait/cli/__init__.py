"""The applications built on the library: the `keras-cait` command and its runs.

    commands.py   the `keras-cait` command line (predict, convert, export, attention,
                  demo, train, finetune, evaluate); `main` is the console script
    runs.py       train / finetune / evaluate: their flags, calling keras_cait.training.run
    demo.py       `keras-cait demo`: train, export, serve and look inside a CaiT offline

The library (`keras_cait` outside this package) never imports from here, and what
a run does is the library's (`keras_cait.training.run`): this package parses flags,
checks them and turns errors into one line.
"""

from keras_cait.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
