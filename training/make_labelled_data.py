"""`python -m concise_attention.training.make_labelled_data`, the command's earlier path, kept working: the program is
`training/data/make_labelled_data.py` (`python -m concise_attention.training.data.make_labelled_data`)."""

import sys

from concise_attention.training.data.make_labelled_data import main

if __name__ == "__main__":
    sys.exit(main())
