"""``python -m env.server``: serve the environment (options: ``--help``)."""

import sys

from env.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
