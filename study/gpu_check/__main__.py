"""``python -m study.gpu_check``: see :mod:`study.gpu_check`."""
import sys

from study.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
