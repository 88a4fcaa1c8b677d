"""`python -m concise_attention.training.prepare_data`, the command's earlier path, kept working: the program is
`training/backends/prepare_data.py` (`python -m concise_attention.training.backends.prepare_data`)."""

import sys

from concise_attention.training.backends.prepare_data import main

if __name__ == "__main__":
    sys.exit(main())
