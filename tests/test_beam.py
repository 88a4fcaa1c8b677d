"""`python -m concise_attention.export.beam`: what runs without Apache Beam (Beam is not a dependency of the package;
its pipeline is checked end to end in an environment of its own: benchmarks/beam_check.py)."""

import hashlib
import importlib.util

import pytest

from concise_attention.export import beam


def test_a_plain_line_is_keyed_by_the_sha256_of_its_text_and_a_blank_one_is_skipped():
    text = "Stocks fell sharply on Monday."
    assert beam.keyed_text(text, "text") == (hashlib.sha256(text.encode("utf-8")).hexdigest(), text)
    assert beam.keyed_text("  \t", "text") is None


def test_json_and_parquet_records_keep_their_own_ids_and_a_malformed_one_is_named():
    assert beam.keyed_text('{"id": "doc-7", "text": "A man is playing a guitar."}', "jsonl") == (
        "doc-7",
        "A man is playing a guitar.",
    )
    assert beam.keyed_text({"id": "row-3", "text": "Stock markets fell."}, "parquet") == (
        "row-3",
        "Stock markets fell.",
    )
    assert beam.keyed_text('{"id": "doc-8", "text": "  "}', "jsonl") is None  # a blank text, as a blank line
    assert beam.keyed_text({"id": "row-4", "text": ""}, "parquet") is None
    for record, form in [
        ('{"text": "no id"}', "jsonl"),
        ('{"id": 7, "text": "id not a string"}', "jsonl"),
        ('["id", "text"]', "jsonl"),
        ("not json", "jsonl"),
        ({"id": None, "text": "a null id"}, "parquet"),
    ]:
        with pytest.raises(ValueError, match=r"^--input: ") as error:
            beam.keyed_text(record, form)
        assert repr(str(record)) in str(error.value)


def _example(**features):
    """A serialized tf.train.Example of `features` (name: a list of bytes, or of ints)."""
    import tensorflow as tf

    def feature(values):
        if values and isinstance(values[0], int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))

    return tf.train.Example(
        features=tf.train.Features(feature={name: feature(values) for name, values in features.items()})
    ).SerializeToString()


def test_a_tfrecord_example_gives_its_id_and_text_and_a_malformed_one_names_its_feature():
    text = "Café naïve résumé."
    assert beam.keyed_text(_example(id=[b"doc-1"], text=[text.encode("utf-8")]), "tfrecord") == ("doc-1", text)
    assert beam.keyed_text(_example(id=[b"doc-2"], text=[b" \n"]), "tfrecord") is None  # blank: skipped
    for record, named in [
        (_example(text=[b"no id"]), "'id'"),
        (_example(id=[b"a", b"b"], text=[b"two ids"]), "'id'"),
        (_example(id=[7], text=[b"an int64 id"]), "'id'"),
        (_example(id=[b"a"], text=[b"\xff\xfe"]), "'text'"),
        (_example(id=[b"a"]), "'text'"),
        (b"\x00\xffnot a protocol buffer", "not a serialized tf.train.Example"),
    ]:
        with pytest.raises(ValueError, match=r"^--input: ") as error:
            beam.keyed_text(record, "tfrecord")
        assert named in str(error.value) and repr(str(record)[:200]) in str(error.value)


def test_without_apache_beam_the_command_says_so_in_one_line_and_exits_2(monkeypatch, capsys, tmp_path):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "apache_beam" else found(name, *a)
    )
    with pytest.raises(SystemExit) as exit_info:
        beam.main(["--model", str(tmp_path), "--input", str(tmp_path / "*.txt"), "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "apache_beam is not installed" in error and len(error.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
