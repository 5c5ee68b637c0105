"""``python -m recruit_trl`` runs the ``recruit-trl`` command line."""

import sys

from recruit_trl.cli import main

sys.exit(main())
