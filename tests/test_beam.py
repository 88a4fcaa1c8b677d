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
