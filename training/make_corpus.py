"""`python -m concise_attention.training.make_corpus`, the command's earlier path, kept working: the program is
`training/data/make_corpus.py` (`python -m concise_attention.training.data.make_corpus`)."""

import sys

from concise_attention.training.data.make_corpus import main

if __name__ == "__main__":
    sys.exit(main())
