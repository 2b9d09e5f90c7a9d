"""`python -m mechopd.cli`: the command line."""

import sys

from mechopd.cli import main

sys.exit(main())
