"""`python -m keras_cait.cli ...` is the `keras-cait` command."""

import sys

from keras_cait.cli import main

sys.exit(main())
