"""A narrower, shallower or differently-headed encoder started from a trained one's weights.

Distillation students start here instead of at random (as DistilBERT takes every other layer of its
teacher). The student may be narrower: the teacher's hidden axis is projected onto its `width` leading
principal directions (P, teacher_width x width, orthonormal columns): those the teacher's residual
stream uses most, from its layers' outputs on sample texts (`stream_directions`); what writes into the
stream is multiplied by P, what reads from it by P^T. Layer norms keep a P^2-weighted mean of their
gains, scaled so that the narrower stream keeps the projected stream's norm (`gain_scale`), and the
projected biases.
Heads re-split: a student with 6 heads of 64 takes the teacher's 12 heads of 32 two by two (the same
query/key/value widths, reshaped); where it has fewer heads it keeps the first ones, and where it has fewer
feed-forward units, those with the largest input and output weight norms. Fewer layers: layers evenly spaced
through the teacher's depth, the first included. A funnel (`stem_layers`) keeps the teacher's token table and
first layers at the teacher's width (heads and feed-forward units as above), then writes into the narrow stream
through P. A student's output projection (`output_size`), which the teacher lacks, starts as the leading
`output_size` of those directions. This is an approximation that training repairs, not an equivalence.
"""

import numpy as np


def principal_directions(vectors_NxD, width):
    """The `width` leading right singular vectors of the rows (uncentred), (D, width), and the share of
    the rows' energy they keep."""
    _, values, right = np.linalg.svd(np.asarray(vectors_NxD, np.float64), full_matrices=False)
    return right[:width].T, float(np.sum(values[:width] ** 2) / np.sum(values**2))


def stream_directions(teacher, inputs, width):
    """P from the teacher's residual stream: the leading directions of every layer's output over the
    real tokens of `inputs` (encoder inputs), and the gain scale sqrt(kept share * D_teacher / width)
    under which a student's layer norms give the projected stream's norm."""
    outputs = teacher(inputs)
    real = np.asarray(inputs["input_mask"]) == 1
    vectors = np.concatenate([np.asarray(layer)[real] for layer in outputs["encoder_outputs"]])
    if len(vectors) < width:
        raise ValueError(f"{len(vectors)} token vectors cannot give {width} directions: give the teacher more text.")
    projection, kept = principal_directions(vectors, width)
    return projection, float(np.sqrt(kept * teacher.hidden_size / width))


def _layer_map(student, teacher_layers):
    """{student layer: teacher layer}. A funnel's narrow layers take the teacher's layers that follow its stem,
    evenly spaced, the first and the last included."""
    first = student.stem_layers
    if first:
        spaced = np.linspace(first, teacher_layers - 1, student.num_layers)
        return {i: int(round(value)) for i, value in enumerate(spaced)}
    return {i: int(round(i * teacher_layers / student.num_layers)) for i in range(student.num_layers)}


def _teacher_path(path, layers):
    """The teacher variable of a student variable path (`transformer_layer_3/...` renumbered; a funnel's
    `stem_layer_i` is the teacher's layer i)."""
    head, _, rest = path.partition("/")
    if head.startswith("stem_layer_"):
        return f"transformer_layer_{int(head.rsplit('_', 1)[1])}/{rest}"
    if head.startswith("transformer_layer_"):
        return f"transformer_layer_{layers[int(head.rsplit('_', 1)[1])]}/{rest}"
    return path


def shrunk_value(teacher_value, student_shape, projection, is_norm_gain=False):
    """The student's value of one variable from the teacher's.

    Axes of the teacher's hidden width are projected by `projection` (D_t, D_s); a (heads, head_size)
    pair of equal product is reshaped; any other smaller axis keeps its first units (heads).
    """
    value = np.asarray(teacher_value, np.float64)
    hidden_t, hidden_s = projection.shape
    if is_norm_gain:
        return np.square(projection).T @ value  # each new unit: a weighted mean of the gains it mixes
    if value.ndim == 3 and len(student_shape) == 3 and value.shape != tuple(student_shape):
        # (I, N, H) -> (I, N', H') or (N, H, O) -> (N', H', O): heads re-split where N*H is kept.
        if value.shape[0] != hidden_t and value.shape[0] * value.shape[1] == student_shape[0] * student_shape[1]:
            value = value.reshape(student_shape[0], student_shape[1], value.shape[2])
        elif value.shape[1] * value.shape[2] == student_shape[1] * student_shape[2]:
            value = value.reshape(value.shape[0], student_shape[1], student_shape[2])
    if (
        value.ndim == 2
        and len(student_shape) == 2
        and value.shape[0] * value.shape[1] == student_shape[0] * student_shape[1]
        and value.shape != tuple(student_shape)
        and hidden_t not in value.shape
    ):
        value = value.reshape(student_shape)  # a (N, H) bias re-split
    for axis in range(value.ndim):
        if value.shape[axis] == hidden_t and student_shape[axis] == hidden_s:
            value = np.moveaxis(np.tensordot(value, projection, axes=([axis], [0])), -1, axis)
        elif value.shape[axis] != student_shape[axis]:
            # The first heads (or units): the same ones in the query, key, value and output weights.
            value = np.take(value, np.arange(student_shape[axis]), axis=axis)
    if value.shape != tuple(student_shape):
        raise ValueError(
            f"Cannot map a teacher variable of shape {np.shape(teacher_value)} onto {tuple(student_shape)}."
        )
    return value


def shrink_into(teacher, student, projection=None, gain_scale=1.0):
    """Sets every weight of `student` (a `BertEncoder`) from `teacher` (a `BertEncoder`) on the directions P
    (default: the word embeddings' leading ones; `stream_directions` gives better ones); returns the map of the
    student's embedding into the teacher's space: P's columns that the embedding reads (the identity for a student
    of the teacher's width without an output projection).

    Feed-forward units are chosen per layer by the norm of their input and output weights together,
    so that a unit is kept or dropped in both of its matrices.
    """
    if projection is None:
        projection, _ = principal_directions(teacher.word_embeddings.embeddings.numpy(), student.hidden_size)
    reading = np.eye(student.hidden_size, student.embedding_size)  # what the embedding reads of the student's stream
    if teacher.hidden_size == student.hidden_size:
        if student.embedding_size != student.hidden_size:
            reading = projection[:, : student.embedding_size]  # the teacher's own stream: its leading directions
        projection, gain_scale = np.eye(teacher.hidden_size), 1.0
    if student.stem_layers and student.stem_width != teacher.hidden_size:
        raise ValueError(
            f"A funnel starts from its teacher at the teacher's width: stem_width={student.stem_width}, "
            f"the teacher's hidden_size={teacher.hidden_size}."
        )
    layers = _layer_map(student, teacher.num_layers)
    teacher_values = {variable.path: variable.numpy() for variable in teacher.weights}
    for variable in student.weights:
        path = variable.path
        shape = tuple(variable.shape)
        if path.startswith(("output_projection/", "stem_projection/")) and path not in teacher_values:
            # the leading directions: output_projection starts as `reading`, a funnel's stem_projection writes P
            start = projection if path.startswith("stem_projection/") else reading
            variable.assign((start if len(shape) == 2 else np.zeros(shape)).astype(variable.dtype))
            continue
        teacher_path = _teacher_path(path, layers)
        source = teacher_values[teacher_path]
        if path.endswith(("intermediate/kernel", "intermediate/bias", "feedforward_output/kernel")) and (
            source.shape != shape
        ):
            source = _feedforward_units(teacher_values, teacher_path, shape)
        if student.stem_layers and not path.startswith(("transformer_layer_", "pooler/")):
            value = shrunk_value(source, shape, np.eye(teacher.hidden_size))  # a funnel's table and stem: not projected
        elif path.startswith("pooler/") and student.embedding_size != student.hidden_size:
            value = shrunk_value(source, shape, projection @ reading)
        else:
            value = shrunk_value(source, shape, projection, is_norm_gain=path.endswith("gamma"))
            value = value * gain_scale if path.endswith("gamma") else value
        variable.assign(value.astype(variable.dtype))
    return projection @ reading


def _feedforward_units(teacher_values, path, student_shape):
    """The teacher's feed-forward variable at `path`, cut to the student's units of largest |in| * |out|."""
    layer = path.split("/", 1)[0]
    inputs, outputs = (
        teacher_values[f"{layer}/intermediate/kernel"],
        teacher_values[f"{layer}/feedforward_output/kernel"],
    )
    units = student_shape[0] if path.endswith("feedforward_output/kernel") else student_shape[-1]
    score = np.linalg.norm(inputs, axis=0) * np.linalg.norm(outputs, axis=1)
    keep = np.sort(np.argsort(-score, kind="stable")[:units])
    value = teacher_values[path]
    return np.take(value, keep, axis=0 if path.endswith("feedforward_output/kernel") else -1)


def with_output_projection(encoder, directions):
    """A copy of `encoder` (a `BertEncoder`) whose embedding is its own read through `directions` (E, W): an
    `output_size` W projection onto them (composed with the encoder's own projection where it has one), no bias
    added, so that the mean-pooled embedding at unit length is the source's projected on `directions`; the pooler
    reads the same coordinates. Every other weight is the source's."""
    directions = np.asarray(directions, np.float64)
    narrow = type(encoder).from_config({**encoder.get_config(), "output_size": int(directions.shape[1])})
    values = {variable.path: variable.numpy().astype(np.float64) for variable in encoder.weights}
    kernel, bias = values.get("output_projection/kernel"), values.get("output_projection/bias")
    values["output_projection/kernel"] = directions if kernel is None else kernel @ directions
    values["output_projection/bias"] = np.zeros(directions.shape[1]) if bias is None else bias @ directions
    values["pooler/kernel"] = directions.T @ values["pooler/kernel"] @ directions
    values["pooler/bias"] = values["pooler/bias"] @ directions
    for variable in narrow.weights:
        variable.assign(values[variable.path].astype(variable.dtype))
    return narrow
