"""`models.shrink`: a student started from its teacher's weights (all-MiniLM-L6-v2)."""

import numpy as np
import pytest

from concise_attention.models import BUILDERS
from concise_attention.models.hf_import import load_hf_bert
from concise_attention.models.shrink import shrink_into
from concise_attention.models.shrink import stream_directions


@pytest.fixture(scope="module")
def teacher(minilm_dir):
    return load_hf_bert(minilm_dir)


def _inputs(shape=(2, 12)):
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 5000, shape).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": 0 * ids}


def _student(**model):
    base = {
        "vocab_size": 30522,
        "hidden_size": 384,
        "num_layers": 6,
        "num_heads": 12,
        "intermediate_size": 1536,
        "attention": {"type": "standard"},
        "activation": "gelu",
    }
    return BUILDERS["bert"](**(base | model))


def _assert_leading_subspace(projection, rows):
    """P spans the leading eigenvectors of rows^T rows (numpy's symmetric eigensolver, not an SVD)."""
    values, vectors = np.linalg.eigh(rows.astype(np.float64).T @ rows)
    leading = vectors[:, np.argsort(values)[::-1][: projection.shape[1]]]
    np.testing.assert_allclose(projection @ projection.T, leading @ leading.T, atol=1e-5)
    return np.sort(values)[::-1]


def test_stream_directions_are_the_residual_streams_leading_ones_with_the_norm_keeping_gain(teacher):
    inputs = _inputs((8, 16))  # 6 layers x 124 real tokens: more rows than the 192 directions
    with pytest.raises(ValueError, match="120 token vectors.*192"):
        stream_directions(teacher, _inputs(), 192)
    projection, gain = stream_directions(teacher, inputs, 192)
    real = inputs["input_mask"] == 1
    rows = np.concatenate([np.asarray(layer)[real] for layer in teacher(inputs)["encoder_outputs"]])
    values = _assert_leading_subspace(projection, rows)
    assert gain == pytest.approx(np.sqrt(values[:192].sum() / values.sum() * 384 / 192), rel=1e-6)
    student = _student(
        hidden_size=192, num_heads=6, intermediate_size=384, num_layers=2, attention={"type": "fixed", "head_size": 64}
    )
    shrink_into(teacher, student, projection, gain_scale=gain)
    gamma = teacher.blocks[3].attention_norm.gamma.numpy()
    np.testing.assert_allclose(
        student.blocks[1].attention_norm.gamma.numpy(), gain * (np.square(projection).T @ gamma), rtol=1e-5
    )


def test_a_student_of_the_teachers_shape_is_the_teacher(teacher):
    student = _student()
    shrink_into(teacher, student)
    inputs = _inputs()
    np.testing.assert_array_equal(
        np.asarray(student(inputs)["sequence_output"]), np.asarray(teacher(inputs)["sequence_output"])
    )


def test_a_half_width_fixed_head_student_takes_projected_and_resplit_weights(teacher):
    student = _student(
        hidden_size=192, num_heads=6, intermediate_size=384, num_layers=3, attention={"type": "fixed", "head_size": 64}
    )
    projection = shrink_into(teacher, student)
    embeddings = teacher.word_embeddings.embeddings.numpy()
    assert projection.shape == (384, 192)
    np.testing.assert_allclose(projection.T @ projection, np.eye(192), atol=1e-6)
    _assert_leading_subspace(projection, embeddings)
    np.testing.assert_allclose(student.word_embeddings.embeddings.numpy(), embeddings @ projection, atol=1e-6)
    # layer 1 of 3 is the teacher's layer 2; its 12 query heads of 32 become 6 of 64, read through P
    query = teacher.blocks[2].attention.query_dense.kernel.numpy().reshape(384, 6, 64)
    np.testing.assert_allclose(
        student.blocks[1].attention.query_dense.kernel.numpy(),
        np.tensordot(projection, query, axes=([0], [0])),
        atol=1e-5,
    )
    # the 384 feed-forward units kept are the same in both matrices: those of largest |in| * |out|
    inner, outer = teacher.blocks[2].intermediate.kernel.numpy(), teacher.blocks[2].feedforward_output.kernel.numpy()
    keep = np.sort(np.argsort(-np.linalg.norm(inner, axis=0) * np.linalg.norm(outer, axis=1))[:384])
    np.testing.assert_allclose(student.blocks[1].intermediate.kernel.numpy(), projection.T @ inner[:, keep], atol=1e-5)
    np.testing.assert_allclose(student.blocks[1].feedforward_output.kernel.numpy(), outer[keep] @ projection, atol=1e-5)


def test_a_wider_stream_with_an_output_projection_starts_at_the_leading_directions(teacher):
    """A 256-wide student with a 192-wide output: its output projection starts as the first 192 of the stream's
    256 directions (P's leading columns), so that its embedding is the teacher's stream read through P[:, :192]."""
    student = _student(
        hidden_size=256, num_heads=6, intermediate_size=256, num_layers=2, output_size=192,
        attention={"type": "fixed", "head_size": 64},
    )  # fmt: skip
    projection = shrink_into(teacher, student)
    np.testing.assert_array_equal(student.output_projection.kernel.numpy(), np.eye(256, 192))
    np.testing.assert_array_equal(student.output_projection.bias.numpy(), np.zeros(192))
    outputs = student(_inputs())
    np.testing.assert_allclose(
        np.asarray(outputs["sequence_output"]), np.asarray(outputs["encoder_outputs"][-1])[..., :192], atol=1e-6
    )
    pooler = teacher.pooler.kernel.numpy()
    np.testing.assert_allclose(
        student.pooler.kernel.numpy(), projection[:, :192].T @ pooler @ projection[:, :192], atol=1e-5
    )


def test_a_student_at_the_teachers_width_reads_its_embedding_on_the_streams_leading_directions(teacher):
    """The teacher's shape with a 192-wide output: its stream is the teacher's, unprojected, and its embedding is the
    teacher's read through the 192 leading stream directions (not the stream's first 192 coordinates)."""
    inputs = _inputs((8, 16))
    directions, _ = stream_directions(teacher, inputs, 384)
    student = _student(output_size=192)
    reads = shrink_into(teacher, student, directions)
    np.testing.assert_array_equal(reads, directions[:, :192])
    np.testing.assert_allclose(student.output_projection.kernel.numpy(), directions[:, :192], atol=1e-7)
    np.testing.assert_allclose(
        np.asarray(student(inputs)["sequence_output"]),
        np.asarray(teacher(inputs)["sequence_output"]) @ directions[:, :192],
        atol=1e-5,
    )
    np.testing.assert_array_equal(shrink_into(teacher, _student(), directions), np.eye(384))


def test_a_standard_student_with_fewer_heads_keeps_the_first_heads(teacher):
    student = _student(hidden_size=192, num_heads=6, intermediate_size=768)
    projection = shrink_into(teacher, student)
    key = teacher.blocks[0].attention.key_dense.kernel.numpy()[:, :6, :]
    np.testing.assert_allclose(
        student.blocks[0].attention.key_dense.kernel.numpy(), np.tensordot(projection, key, axes=([0], [0])), atol=1e-5
    )
    output = teacher.blocks[0].attention.output_dense.kernel.numpy()[:6]
    np.testing.assert_allclose(student.blocks[0].attention.output_dense.kernel.numpy(), output @ projection, atol=1e-5)


FUNNEL = {"stem_layers": 1, "stem_width": 384, "stem_heads": 12}


def test_a_funnel_at_the_teachers_width_is_the_teacher(teacher):
    """The teacher's first layer as the stem, its other five after an identity stem projection: every output equal."""
    student = _student(num_layers=5, stem_intermediate_size=1536, **FUNNEL)
    shrink_into(teacher, student)
    np.testing.assert_array_equal(student.stem_projection.kernel.numpy(), np.eye(384))
    inputs = _inputs()
    ours, theirs = student(inputs), teacher(inputs)
    np.testing.assert_allclose(np.asarray(ours["sequence_output"]), np.asarray(theirs["sequence_output"]), atol=2e-5)
    np.testing.assert_allclose(
        np.asarray(ours["encoder_outputs"][0]), np.asarray(theirs["encoder_outputs"][1]), atol=2e-5
    )


def test_a_half_width_funnel_keeps_the_teachers_table_and_first_layer_and_writes_through_p(teacher):
    student = _student(
        hidden_size=192, num_heads=6, intermediate_size=384, num_layers=3, attention={"type": "fixed", "head_size": 64},
        stem_intermediate_size=768, **FUNNEL,
    )  # fmt: skip
    projection = shrink_into(teacher, student)
    np.testing.assert_array_equal(
        student.word_embeddings.embeddings.numpy(), teacher.word_embeddings.embeddings.numpy()
    )
    np.testing.assert_allclose(student.stem_projection.kernel.numpy(), projection, atol=1e-7)
    np.testing.assert_array_equal(student.stem_projection.bias.numpy(), np.zeros(192))
    # the stem is the teacher's layer 0 with its 768 feed-forward units of largest |in| * |out|
    inner, outer = teacher.blocks[0].intermediate.kernel.numpy(), teacher.blocks[0].feedforward_output.kernel.numpy()
    keep = np.sort(np.argsort(-np.linalg.norm(inner, axis=0) * np.linalg.norm(outer, axis=1))[:768])
    np.testing.assert_array_equal(student.stem_blocks[0].intermediate.kernel.numpy(), inner[:, keep])
    np.testing.assert_array_equal(student.stem_blocks[0].feedforward_output.kernel.numpy(), outer[keep])
    np.testing.assert_array_equal(
        student.stem_blocks[0].attention.query_dense.kernel.numpy(), teacher.blocks[0].attention.query_dense.kernel
    )
    # the three narrow layers are the teacher's layers 1, 3 and 5, read through P
    for layer, source in enumerate((1, 3, 5)):
        query = teacher.blocks[source].attention.query_dense.kernel.numpy().reshape(384, 6, 64)
        np.testing.assert_allclose(
            student.blocks[layer].attention.query_dense.kernel.numpy(),
            np.tensordot(projection, query, axes=([0], [0])),
            atol=1e-5,
        )
    outputs = student(_inputs())
    assert [tuple(output.shape) for output in outputs["encoder_outputs"]] == [(2, 12, 192)] * 3


def test_a_funnel_whose_stem_is_not_the_teachers_width_is_refused(teacher):
    student = _student(hidden_size=192, num_heads=6, num_layers=2, stem_layers=1, stem_width=256, stem_heads=4,
                       stem_intermediate_size=256)  # fmt: skip
    with pytest.raises(ValueError, match="stem_width=256, the teacher's hidden_size=384"):
        shrink_into(teacher, student)
