"""``python -m fuselab``: the same command as the ``fuselab`` console script."""

import sys

from fuselab.cli import main

if __name__ == "__main__":
    sys.exit(main())
