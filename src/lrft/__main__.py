"""``python -m lrft train ...`` (under torchrun: ``torchrun --nproc_per_node N -m lrft train``)."""

import sys

from lrft.cli import main

if __name__ == "__main__":
    sys.exit(main())
