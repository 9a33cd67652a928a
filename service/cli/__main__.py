"""``python -m service.cli``: the same as the ``vecbridge`` script."""

import sys

from . import main

sys.exit(main())
