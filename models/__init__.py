"""Keras 3 models of concise-attention (keras and keras.ops only: TF and JAX backends)."""

from models.attention import CollaborativeAttention
from models.attention import ConcatenateMixing
from models.attention import FixedHeadSizeAttention
from models.attention import StandardAttention
from models.attention import compute_attention_mask

__all__ = [
    "CollaborativeAttention",
    "ConcatenateMixing",
    "FixedHeadSizeAttention",
    "StandardAttention",
    "compute_attention_mask",
]
