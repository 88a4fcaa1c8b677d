"""`from concise_attention.training.embeddings import SentenceEncoder`, the class's earlier path, kept working:
it lives in `training/inference/embeddings.py`."""

from concise_attention.training.inference.embeddings import SentenceEncoder

__all__ = ["SentenceEncoder"]
