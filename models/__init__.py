"""Keras 3 models of concise-attention (keras and keras.ops only: TF and JAX backends)."""

from concise_attention.models.attention import CollaborativeAttention
from concise_attention.models.attention import ConcatenateMixing
from concise_attention.models.attention import FixedHeadSizeAttention
from concise_attention.models.attention import StandardAttention
from concise_attention.models.attention import compute_attention_mask
from concise_attention.models.bert import BertEncoder
from concise_attention.models.bert import BertPretrainer
from concise_attention.models.lm import CausalLM
from concise_attention.models.transformer import TransformerBlock
from concise_attention.models.transformer import admin_initialize

# The backbone of each config `model_type` (the configs' and the run directory's name for it).
BUILDERS = {"bert": BertEncoder, "causal_lm": CausalLM}

__all__ = [
    "BUILDERS",
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
