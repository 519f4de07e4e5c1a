"""The error a run raises for what it is given (`RunError`), and `about`, which names the argument."""

import contextlib


class RunError(ValueError):
    """What a run is given cannot work (bad data, a batch larger than the data, a missing extra).

    `argument` names the run's argument at fault (e.g. "data", "weights"), or is None; the
    message names it as Python writes it (`data='photos': no such folder ...`).
    """

    def __init__(self, message, argument=None, usage=False, value=None):
        super().__init__(message)
        self.argument, self.value = argument, value
        self.usage = usage  # the arguments cannot work together or alone, whatever the files hold


@contextlib.contextmanager
def about(argument, value, *types):
    """The library's errors of type `types` while reading `argument` as a `RunError` naming it."""
    try:
        yield
    except RunError:
        raise
    except types as error:
        text = str(error).strip() or type(error).__name__
        raise RunError(f"{argument}={value!r}: {text}" if argument else text, argument, value=value) from error
