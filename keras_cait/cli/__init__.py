"""The applications built on the library: the `keras-cait` command and its runs.

    commands.py   the `keras-cait` command line (predict, convert, export, attention,
                  demo, train, finetune, evaluate); `main` is the console script
    runs.py       train / finetune / evaluate: their flags and orchestration
    demo.py       `keras-cait demo`: train, export, serve and look inside a CaiT offline

The library (`keras_cait` outside this package) never imports from here, as
timm keeps train.py / validate.py outside `timm/`.
"""

from keras_cait.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
