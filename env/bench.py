"""``python -m env.bench``: the clinical environment's throughput benchmark, :mod:`env.clinical.bench`."""

import sys

from env.clinical.bench import main

if __name__ == "__main__":
    sys.exit(main())
