"""``python -m roost``: the ``roost`` command line."""

import sys

from roost.cluster.cli import main

sys.exit(main())
