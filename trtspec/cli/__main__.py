"""``python -m trtspec.cli``: the same entry point as the ``trtspec`` script."""

import sys

from trtspec.cli import main

sys.exit(main())
