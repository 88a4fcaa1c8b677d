"""Re-parametrising trained attention as collaborative attention (Cordonnier, Loukas, Jaggi 2020).

Head i of a trained layer scores query x against key x' with
    (x W_Q^(i) + b_Q^(i)) (x' W_K^(i) + b_K^(i))^T / sqrt(d_k)
  = [x (W_Q^(i) W_K^(i)^T) x'^T + x' . (W_K^(i) b_Q^(i)) + terms constant over keys] / sqrt(d_k).
Terms constant over the keys cancel in the softmax, so the key bias disappears and the
query bias becomes the content vector v_i = W_K^(i) b_Q^(i). Stacking the heads' W_Q W_K^T
gives an N x D x D tensor; its rank-D~k CP (PARAFAC) decomposition sum_r m_r (x) q_r (x) k_r
is exactly collaborative attention: shared W~Q = [q_r], W~K = [k_r], mixing M = [m_r].
The softmax scale stays 1/sqrt(d_k) of the original heads whatever D~k is.

At D~k = N * d_k the decomposition is known in closed form (concatenated heads, block
mixing), so that case is converted exactly, without iterations.
"""

import time

import numpy as np

from concise_attention.models.attention import CollaborativeAttention
from concise_attention.models.attention import FixedHeadSizeAttention
from concise_attention.models.bert import BertEncoder
from concise_attention.models.lm import CausalLM
from concise_attention.models.transformer import head_size_of


def _check_convertible(layer):
    if not isinstance(layer, FixedHeadSizeAttention) or isinstance(layer, CollaborativeAttention):
        raise ValueError(
            "Only standard or fixed-head-size attention layers can be converted to collaborative attention. "
            f"Received: {type(layer).__name__} {getattr(layer, 'name', '')!r}"
        )
    if not layer.built:
        raise ValueError(f"The attention layer {layer.name!r} is not built: it has no trained weights to convert.")


def query_key_tensor(layer):
    """The N x D x D stack of the heads' W_Q^(i) W_K^(i)^T (float64)."""
    _check_convertible(layer)
    query_IxNxH = np.asarray(layer.query_dense.kernel, "float64")
    key_IxNxH = np.asarray(layer.key_dense.kernel, "float64")
    return np.einsum("inh,jnh->nij", query_IxNxH, key_IxNxH)


def _exact_factors(layer):
    """Shared projections and block mixing that reproduce the heads exactly (D~k = N * d_k)."""
    query_IxNxH = np.asarray(layer.query_dense.kernel, "float64")
    key_IxNxH = np.asarray(layer.key_dense.kernel, "float64")
    heads, head_size = query_IxNxH.shape[1:]
    mixing = np.kron(np.eye(heads), np.ones((1, head_size)))
    return query_IxNxH.reshape(query_IxNxH.shape[0], -1), key_IxNxH.reshape(key_IxNxH.shape[0], -1), mixing


def _cp_factors(tensor_NxIxI, rank, seed, n_iter_max, tol):
    import tensorly  # only for a conversion: models/ imports keras and numpy alone
    from tensorly.decomposition import parafac

    tensorly.set_backend("numpy")
    weights, (mixing_NxK, query_IxK, key_IxK) = parafac(
        tensor_NxIxI,
        rank=rank,
        init="random",
        random_state=seed,
        n_iter_max=n_iter_max,
        tol=tol,
        normalize_factors=False,
    )
    return query_IxK, key_IxK, mixing_NxK * weights[None, :]


def _collaborative_layer(layer, shared_key_dim, query, key, mixing):
    """The `CollaborativeAttention` of `layer`'s shape holding the factors, the content bias that
    carries the query bias, and `layer`'s value and output projections."""
    input_size = layer.query_dense.kernel.shape[0]
    converted = CollaborativeAttention(
        num_heads=layer.num_heads,
        shared_key_dim=shared_key_dim,
        head_size=layer.query_dense.kernel.shape[-1],
        value_head_size=layer.value_dense.kernel.shape[-1],
        output_size=layer.output_dense.kernel.shape[-1],
        dropout=layer.dropout,
        use_bias=layer.use_bias,
        dtype=layer.dtype_policy,
        name=layer.name,
    )
    converted.build((None, None, input_size))
    converted.query_dense.kernel.assign(query.astype("float32"))
    converted.key_dense.kernel.assign(key.astype("float32"))
    converted.mixing.assign(mixing.astype("float32"))
    if layer.use_bias:
        query_bias_NxH = np.asarray(layer.query_dense.bias, "float64")
        key_IxNxH = np.asarray(layer.key_dense.kernel, "float64")
        converted.content_bias.assign(np.einsum("inh,nh->in", key_IxNxH, query_bias_NxH).astype("float32"))
    else:
        converted.content_bias.assign(np.zeros(converted.content_bias.shape, "float32"))
    converted.value_dense.set_weights(layer.value_dense.get_weights())
    converted.output_dense.set_weights(layer.output_dense.get_weights())
    return converted


def convert_attention(layer, shared_key_dim, seed=0, n_iter_max=200, tol=1e-9, flops_length=128):
    """A `CollaborativeAttention` equivalent (or closest at rank D~k) to a trained layer.

    Args:
        layer: a built `StandardAttention` or `FixedHeadSizeAttention`.
        shared_key_dim: D~k, in [1, num_heads * head_size].
        seed: seed of the CP decomposition's random initialisation (deterministic).
        n_iter_max, tol: ALS iterations and tolerance of tensorly's parafac.
        flops_length: sequence length at which query/key FLOPs are reported.

    Returns (collaborative layer, report dict): the report holds the relative reconstruction
    error of the stacked tensor, query/key parameters and FLOPs before and after, and seconds.
    """
    exact = _check_shared_key_dim(layer, shared_key_dim)
    start = time.perf_counter()
    tensor = query_key_tensor(layer)
    if shared_key_dim == exact:
        query, key, mixing = _exact_factors(layer)
    else:
        query, key, mixing = _cp_factors(tensor, shared_key_dim, seed, n_iter_max, tol)
    reconstruction = np.einsum("ik,nk,jk->nij", query, mixing, key)
    error = float(np.linalg.norm(reconstruction - tensor) / np.linalg.norm(tensor))

    input_size = layer.query_dense.kernel.shape[0]
    converted = _collaborative_layer(layer, shared_key_dim, query, key, mixing)
    report = {
        "layer": layer.name,
        "shared_key_dim": shared_key_dim,
        "relative_error": error,
        "query_key_parameters_before": 2 * input_size * exact + (2 * exact if layer.use_bias else 0),
        "query_key_parameters_after": (2 * input_size + layer.num_heads) * shared_key_dim
        + input_size * layer.num_heads,
        "flops_length": flops_length,
        "query_key_flops_before": layer.query_key_flops(flops_length),
        "query_key_flops_after": converted.query_key_flops(flops_length),
        "seconds": time.perf_counter() - start,
    }
    return converted, report


def _check_shared_key_dim(layer, shared_key_dim):
    """num_heads * head_size of a convertible `layer`, once `shared_key_dim` is checked against it."""
    _check_convertible(layer)
    exact = layer.num_heads * layer.query_dense.kernel.shape[-1]
    if isinstance(shared_key_dim, bool) or not isinstance(shared_key_dim, int) or not 1 <= shared_key_dim <= exact:
        raise ValueError(
            f"`shared_key_dim` must be an integer in [1, num_heads * head_size = {exact}] for layer {layer.name!r}. "
            f"Received: shared_key_dim={shared_key_dim!r}"
        )
    return exact


def convert_model(model, shared_key_dim, seed=0, n_iter_max=200, tol=1e-9, progress=True):
    """A collaborative copy of a trained `BertEncoder` or `CausalLM`, layer by layer.

    Every weight outside the attention query/key path is copied; each layer's attention
    is converted by `convert_attention` with seed `seed + layer index` (deterministic).

    Returns:
        (model, reports): the new model (collaborative attention, same builder) and
        one report per layer.
    """
    from tqdm import tqdm  # only for a conversion's progress bar: models/ imports keras and numpy alone

    if not isinstance(model, (BertEncoder, CausalLM)):
        raise ValueError(f"`model` must be a BertEncoder or a CausalLM. Received: {type(model).__name__}")
    if model.attention["type"] == "collaborative":
        raise ValueError(f"The model {model.name!r} already uses collaborative attention.")
    head_size = head_size_of(model)
    arguments = {key: value for key, value in model.get_config().items() if key not in ("name", "trainable", "dtype")}
    arguments["attention"] = {
        "type": "collaborative",
        "head_size": head_size,
        "shared_key_dim": shared_key_dim,
        "mixing_initializer": "concatenate",
    }
    for block in model.blocks:  # every layer checked before the first is converted (or a progress bar shown)
        _check_shared_key_dim(block.attention, shared_key_dim)
    converted_layers = []
    for index, block in enumerate(tqdm(model.blocks, desc=f"CP rank {shared_key_dim}", disable=not progress)):
        converted_layers.append(convert_attention(block.attention, shared_key_dim, seed + index, n_iter_max, tol))
    result = type(model)(**arguments, dtype=model.dtype_policy)
    source = {variable.path: variable for variable in model.weights}
    for variable in result.weights:
        original = source.get(variable.path)
        if original is not None and tuple(original.shape) == tuple(variable.shape):
            variable.assign(original)
    for block, (attention, _) in zip(result.blocks, converted_layers):
        block.attention.set_weights(attention.get_weights())
    reports = [report | {"layer": block.name} for block, (_, report) in zip(model.blocks, converted_layers)]
    return result, reports
