"""``python -m coursepkg.cli ARGS``: the ``coursepkg`` command without its console script."""

import sys

from . import main

sys.exit(main())
