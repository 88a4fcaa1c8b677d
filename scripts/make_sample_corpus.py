"""Regenerates the shipped sample corpus `training/data/python_reference.txt`.

Source: the prose of the Python Language Reference and Library topics as shipped with
CPython in `pydoc_data.topics` (Python Software Foundation License 2.0, a free licence:
https://docs.python.org/3/license.html). Real English text, present offline on every
Python install, so the quickstart and the tests train on real language with no download.
Only prose paragraphs are kept (grammar rules, code and headings are dropped); one
paragraph per line.

    python scripts/make_sample_corpus.py
"""

import pathlib
import re
import sys
from pydoc_data import topics

OUTPUT = pathlib.Path(__file__).resolve().parents[1] / "training" / "data" / "python_reference.txt"


def prose_paragraphs(text):
    """Unwrapped paragraphs of running prose from one reStructuredText-like topic."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if not lines or any(line.startswith((" ", "\t", ">>>")) for line in lines):
            continue  # code, grammar, tables, indented notes
        if len(lines) >= 2 and set(lines[-1]) <= set("*=-~^"):
            continue  # a heading with its underline
        paragraph = " ".join(line.strip() for line in lines)
        if len(paragraph.split()) >= 8 and paragraph[-1] in '.:;)?!"':
            paragraphs.append(paragraph)
    return paragraphs


def main():
    paragraphs = [p for name in sorted(topics.topics) for p in prose_paragraphs(topics.topics[name])]
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    temporary = OUTPUT.with_suffix(".tmp")
    temporary.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    temporary.replace(OUTPUT)
    print(
        f"wrote {OUTPUT}: {len(paragraphs)} paragraphs, {sum(len(p.split()) for p in paragraphs)} words (Python {sys.version.split()[0]})"
    )


if __name__ == "__main__":
    main()
