"""``python -m refimpl`` = the ``refimpl`` command."""

import sys

from refimpl.cli import main

sys.exit(main())
