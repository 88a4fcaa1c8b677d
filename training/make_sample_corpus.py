"""`python -m concise_attention.training.make_sample_corpus`, the command's earlier path, kept working: the program is
`training/data/make_sample_corpus.py` (`python -m concise_attention.training.data.make_sample_corpus`)."""

import sys

from concise_attention.training.data.make_sample_corpus import main

if __name__ == "__main__":
    sys.exit(main())
