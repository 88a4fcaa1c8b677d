"""`python -m concise_attention.training.shard_trainer`, the command's earlier path, kept working: the program is
`training/backends/shard_trainer.py` (`python -m concise_attention.training.backends.shard_trainer`)."""

import sys

from concise_attention.training.backends.shard_trainer import main

if __name__ == "__main__":
    sys.exit(main())
