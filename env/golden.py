"""``python -m env.golden``: the clinical environment's golden replay, :mod:`env.clinical.golden`."""

import sys

from env.clinical.golden import main

if __name__ == "__main__":
    sys.exit(main())
