"""Keras 3 models of concise-attention (keras and keras.ops only: TF and JAX backends)."""

from models.attention import CollaborativeAttention
from models.attention import ConcatenateMixing
from models.attention import FixedHeadSizeAttention
from models.attention import StandardAttention
from models.attention import compute_attention_mask
from models.bert import BertEncoder
from models.bert import BertPretrainer
from models.lm import CausalLM
from models.transformer import TransformerBlock
from models.transformer import admin_initialize

__all__ = [
    "BertEncoder",
    "BertPretrainer",
    "CausalLM",
    "CollaborativeAttention",
    "ConcatenateMixing",
    "FixedHeadSizeAttention",
    "StandardAttention",
    "TransformerBlock",
    "admin_initialize",
    "compute_attention_mask",
]
