"""The corpus builder on fixture packages laid out as `dpkg-deb -x` unpacks them (no apt, no network).

Expected paragraphs are written by hand from each fixture; the held-out rule is recomputed here from
its definition (SHA-256 of "package/path", 1 in 50), and the manifest's counts and hashes are checked
against the files with Python's own counting and hashlib.
"""

import gzip
import hashlib
import json
import shutil
import subprocess
import textwrap

import pytest

from loading import load

make_corpus = load("scripts/make_corpus.py")

COPYRIGHT = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: fixture

Files: *
Copyright: 2024 Someone
License: CC-BY-4.0

Files: debian/*
License: GPL-2+
"""

HTML_PAGE = """\
<!DOCTYPE html>
<html><head><title>The Frobnicator Guide</title><script>var navigation = "menu";</script>
<style>p { color: red; }</style></head>
<body>
<nav role="navigation"><ul><li><a href="index.html">Home page of the whole frobnicator manual for everybody</a></li></ul></nav>
<div class="sphinxsidebar" role="navigation"><p>Search the frobnicator documentation from this sidebar box right here.</p></div>
<div class="document">
<h1>The frobnicator configuration file and its many options<a class="headerlink" href="#x">&para;</a></h1>
<p>The frobnicator reads its configuration from the file named in the
<code>--config</code> option, or from a default location when none is given.</p>
<p>Short line.</p>
<div class="highlight-c"><div class="highlight"><pre>int main(void) { return frobnicate(argc, argv); }</pre></div></div>
<table><tr><td>CELLTEXT is a table cell and it should never appear in the corpus at all.</td></tr></table>
<p>Each option is read once &amp; kept until the program ends, so a change takes effect at the next start.</p>
<ul><li>Lists of options are written one item per line, and every item is a sentence like this one.</li></ul>
<p>Il programma legge la configurazione dal file indicato nella opzione della riga di comando.</p>
</div>
<div class="footer" role="contentinfo"><p>Copyright 2024 by the authors of the frobnicator and its fine manual.</p></div>
</body></html>
"""

HTML_DUPLICATE_PAGE = """\
<html><body><div>
<p>The   frobnicator reads its configuration from the file named in the
--config option, or from a default location when none is given.</p>
<p>THE FROBNICATOR READS ITS CONFIGURATION FROM THE FILE NAMED IN THE --CONFIG OPTION, OR FROM A DEFAULT LOCATION
WHEN NONE IS GIVEN.</p>
<p>A second page has one sentence of its own so that it is not empty after deduplication.</p>
</div></body></html>
"""

MAN_PAGE = r""".\" Copyright (c) 2024 Someone
.de Sp
.if t .sp .5v
..
.TH TOOL 1 "2024-01-01" "tool 1.0" "User Commands"
.SH NAME
tool \- copy bytes slowly
.SH DESCRIPTION
The
.B tool
command copies every byte \(em slowly, carefully and with much patience \(em to
\fIstandard output\fR, and it stops at the end of its input.
.PP
.nf
while (read(fd, buffer, 1) == 1) write(1, buffer, 1);
.fi
.TS
tab(;);
l l.
TABLECELL;another table cell that is long enough to count as words
.TE
.TP
.BR \-v ", " \-\-verbose
Print the name of each file before it is copied, so that long runs can be followed.
.SH "SEE ALSO"
.BR cat (1)
"""

POD_FILE = """\
=encoding utf8

=head1 NAME

perlthing - how things work in Perl

=head1 DESCRIPTION

A B<thing> is made with C<< $class->new(name =E<gt> 'x') >> and is described in L<perlobj/Methods>, which every reader should know.

    my $thing = Thing->new(name => 'x');
    print $thing->name, "\\n";

=begin html

<p>Raw HTML for the HTML renderer only, never part of the plain text corpus.</p>

=end html

=over 4

=item * A list item

Each item in a POD list is an ordinary paragraph of I<running> text, and E<eacute>t E<233> are decoded.

=back

=cut

sub never_documentation { return "This Perl code is after the cut, so it is not documentation at all."; }
"""

RST_FILE = """\
Working with widgets
====================

A widget is created with :func:`make_widget <widgets.make_widget>` and configured with ``configure``, as `the guide <https://example.org/guide>`_ explains.

.. code-block:: python

   widget = make_widget()
   widget.configure(size=3)

The following example shows the full sequence of calls in order::

    widget = make_widget()
    widget.run()

+-----------------------------+------------------+
| GRIDCELL header of a table  | another column   |
+=============================+==================+
| body cell of the grid table | yes              |
+-----------------------------+------------------+

.. note:: Widgets are **not** thread safe, so each thread should create its own widget.

- A list item written in *emphasis* still reads as one complete English sentence.

.. this is a comment that should never reach the corpus text in any form whatsoever.
"""

TEXT_FILE = """\
README for the fixture package
==============================

This package exists only for the tests, and this paragraph is plain running text in a readme.

    $ fixture --run --all-the-things
    exit status 0 means that everything went well

Name        Value       Meaning of the value
alpha       1           the first letter of the alphabet
"""

# (package, path inside the package, text); a .gz path is written gzipped.
FIXTURES = [
    ("docs-html", "usr/share/doc/docs-html/html/guide.html", HTML_PAGE),
    ("docs-html", "usr/share/doc/docs-html/html/second.html", HTML_DUPLICATE_PAGE),
    (
        "docs-html",
        "usr/share/doc/docs-html/html/_sources/guide.rst.txt",
        "This Sphinx source copy is a twin of the page and must be skipped entirely.",
    ),
    (
        "docs-html",
        "usr/share/doc/docs-html/html/de/guide.html",
        "<p>Die Konfiguration wird aus der Datei gelesen, die in der Option angegeben ist.</p>",
    ),
    ("docs-man", "usr/share/man/man1/tool.1.gz", MAN_PAGE),
    ("docs-pod", "usr/share/perl/5.36.0/pod/perlthing.pod", POD_FILE),
    ("docs-rst", "usr/share/doc/docs-rst/widgets.rst", RST_FILE),
    ("docs-rst", "usr/share/doc/docs-rst/README", TEXT_FILE),
    (
        "docs-rst",
        "usr/share/doc/docs-rst/changelog.Debian.gz",
        "This changelog entry is packaging boilerplate, written in full sentences anyway.",
    ),
]

EXPECTED_PARAGRAPHS = {
    "The frobnicator reads its configuration from the file named in the --config option, or from a default location when none is given.",
    "Each option is read once & kept until the program ends, so a change takes effect at the next start.",
    "Lists of options are written one item per line, and every item is a sentence like this one.",
    "A second page has one sentence of its own so that it is not empty after deduplication.",
    "The tool command copies every byte \u2014 slowly, carefully and with much patience \u2014 to standard output, and it stops at the end of its input.",
    "Print the name of each file before it is copied, so that long runs can be followed.",
    "A thing is made with $class->new(name => 'x') and is described in Methods in perlobj, which every reader should know.",
    "Each item in a POD list is an ordinary paragraph of running text, and \u00e9t \u00e9 are decoded.",
    "A widget is created with make_widget and configured with configure, as the guide explains.",
    "Widgets are not thread safe, so each thread should create its own widget.",
    "A list item written in emphasis still reads as one complete English sentence.",
    "This package exists only for the tests, and this paragraph is plain running text in a readme.",
}

# Text of code, tables, navigation, boilerplate, translations and skipped twins: none may appear.
DROPPED_TEXT = [
    "int main",
    "CELLTEXT",
    "TABLECELL",
    "GRIDCELL",
    "Home page",
    "Search the frobnicator",
    "Copyright 2024",
    "while (read",
    "my $thing",
    "Raw HTML",
    "never_documentation",
    "widget.run",
    "make_widget()",
    "Sphinx source",
    "Die Konfiguration",
    "Il programma",
    "changelog entry",
    "fixture --run",
    "alphabet",
    "Short line",
    "comment that",
    "SEE ALSO",
    "copy bytes slowly",
    "Working with widgets",
    "configuration file and its many options",
]
MARKUP = [
    "<",
    "\\f",
    "\\(",
    "=head",
    "=item",
    "``",
    ":func:",
    "B<",
    "C<",
    "L<",
    "E<",
    "&amp;",
    "&para;",
    "\u00b6",
    ".. ",
    "::",
    "**",
    "`_",
]


def _heldout_document_count(package, paths):
    """1 in 50 by the SHA-256 of "package/path" (the rule the builder documents), counted here by hand."""
    return sum(
        int.from_bytes(hashlib.sha256(f"{package}/{path}".encode()).digest()[:8], "big") % 50 == 0 for path in paths
    )


def _write_fixtures(root, extra_documents=0):
    for package, path, text in FIXTURES:
        target = root / package / path
        target.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        target.write_bytes(gzip.compress(data, mtime=0) if path.endswith(".gz") else data)
    for package in {package for package, _, _ in FIXTURES}:
        copyright_file = root / package / "usr/share/doc" / package / "copyright"
        copyright_file.parent.mkdir(parents=True, exist_ok=True)
        copyright_file.write_text(COPYRIGHT)
    (root / "docs-html/DEBIAN").mkdir()
    (root / "docs-html/DEBIAN/control").write_text("Package: docs-html\nVersion: 1:2.3-4\n")
    pages = root / "docs-html/usr/share/doc/docs-html/html/pages"
    pages.mkdir()
    for number in range(extra_documents):  # many documents, so that some are held out
        (pages / f"page{number:03d}.html").write_text(
            f"<p>Page number {number} of the fixture manual is a document with one sentence of its own.</p>"
        )


def _packages(root):
    return list(make_corpus.unpacked_packages(["docs-html", "docs-man", "docs-pod", "docs-rst"], root))


def _lines(directory):
    return [line for path in sorted(directory.glob("*.txt")) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("unpacked")
    _write_fixtures(root, extra_documents=150)
    out = tmp_path_factory.mktemp("corpus")
    manifest = make_corpus.build_corpus(_packages(root), out, paragraph_min_words=8)
    return root, out, manifest


def test_prose_is_kept_and_markup_code_tables_navigation_are_dropped(built):
    _, out, _ = built
    lines = _lines(out / "train") + _lines(out / "heldout")
    fixture_lines = [line for line in lines if not line.startswith("Page number")]
    assert set(fixture_lines) == EXPECTED_PARAGRAPHS
    for line in lines:
        assert not [text for text in DROPPED_TEXT + MARKUP if text in line], line


def test_no_duplicate_paragraph_and_no_heldout_document_in_train(built):
    _, out, manifest = built
    train, heldout = _lines(out / "train"), _lines(out / "heldout")
    lines = train + heldout
    assert len(lines) == len(set(lines))
    # A case-, space- and quote-folded copy of a paragraph counts as the same paragraph.
    assert sum("frobnicator reads its configuration" in line.lower() for line in lines) == 1
    pages = [f"usr/share/doc/docs-html/html/pages/page{number:03d}.html" for number in range(150)]
    expected_heldout = {number for number, path in enumerate(pages) if _heldout_document_count("docs-html", [path])}
    assert expected_heldout, "the fixture needs at least one held-out page"
    heldout_pages = {int(line.split()[2]) for line in heldout if line.startswith("Page number")}
    train_pages = {int(line.split()[2]) for line in train if line.startswith("Page number")}
    assert heldout_pages == expected_heldout
    assert train_pages == set(range(150)) - expected_heldout
    html_entry = next(entry for entry in manifest["sources"] if entry["package"] == "docs-html")
    assert html_entry["heldout_documents"] == _heldout_document_count(
        "docs-html", pages + ["usr/share/doc/docs-html/html/guide.html", "usr/share/doc/docs-html/html/second.html"]
    )


def test_the_trainer_reads_the_built_corpus_by_its_own_split(built, tmp_path):
    """`task.dataset: text_files` on a built corpus trains on train/ and evaluates on heldout/
    (walking the whole folder, one line in 20, would train on held-out documents)."""
    from concise_attention.training.data.pipeline import corpus_splits

    _, out, _ = built
    train_lines, eval_lines = corpus_splits("text_files", str(out))
    assert list(train_lines()) == _lines(out / "train")
    assert list(eval_lines()) == _lines(out / "heldout")
    (tmp_path / "train").mkdir()
    (tmp_path / "heldout").mkdir()
    (tmp_path / "train" / "a.txt").write_text("One line of training text.\n")
    (tmp_path / "heldout" / "b.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="held-out split of task.data_dir is empty"):
        corpus_splits("text_files", str(tmp_path))


def test_manifest_counts_and_hashes_equal_the_files(built):
    _, out, manifest = built
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == manifest
    for split in ("train", "heldout"):
        lines = _lines(out / split)
        assert sum(entry["paragraphs"][split] for entry in manifest["sources"]) == len(lines)
        assert sum(entry["words"][split] for entry in manifest["sources"]) == sum(len(line.split()) for line in lines)
        assert manifest["totals"]["paragraphs"][split] == len(lines)
    shard_files = sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.txt"))
    assert sorted(shard["file"] for shard in manifest["shards"]) == shard_files
    for shard in manifest["shards"]:
        data = (out / shard["file"]).read_bytes()
        assert shard["bytes"] == len(data)
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        assert shard["paragraphs"] == data.count(b"\n")
    entries = {entry["package"]: entry for entry in manifest["sources"]}
    assert entries["docs-html"]["version"] == "1:2.3-4"
    assert entries["docs-man"]["version"] == "unknown"
    assert entries["docs-man"]["licence"] == "CC-BY-4.0"
    assert entries["docs-man"]["copyright_file"] == "usr/share/doc/docs-man/copyright"
    assert entries["docs-html"]["documents"] == 152  # guide, second and the pages; not _sources/ nor de/
    assert entries["docs-rst"]["documents"] == 2  # widgets.rst and README; not the changelog
    assert entries["docs-html"]["duplicate_paragraphs"] == 2
    assert str(built[0]) not in (out / "manifest.json").read_text()  # no path of this machine


def test_second_build_is_byte_identical_and_replaces_the_first(built, tmp_path):
    root, out, _ = built
    again = tmp_path / "again"
    (again / "train").mkdir(parents=True)
    (again / "train" / "train-00007.txt").write_text("left over from an older build\n")
    make_corpus.build_corpus(_packages(root), again, paragraph_min_words=8)

    def tree(directory):
        return {
            p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
        }

    assert tree(again) == tree(out)


def test_shards_roll_over_at_the_size_limit(tmp_path):
    writer = make_corpus.ShardWriter(tmp_path, "train", shard_bytes=50)
    for number in range(6):
        writer.write(f"Sentence number {number} is longer than half of a shard.")  # 2 of them do not fit
    shards = writer.close()
    assert [shard["file"] for shard in shards] == [f"train/train-{n:05d}.txt" for n in range(6)]
    assert all(shard["paragraphs"] == 1 for shard in shards)


def test_roff_escapes_and_pod_codes_by_hand():
    assert make_corpus.roff_inline(
        r"""\fBbold\fR, \f(CWcode\fP and \s-1SMALL\s0 \(em \*(L"quoted\*(R" \e \- x\ y \('e"""
    ) == ("bold, code and SMALL \u2014 \u201cquoted\u201d \\ - x y \u00e9")
    assert make_corpus.roff_inline(r"""\[u00FC]ber \[em] \*(C+ text \" a comment""") == "\u00fcber \u2014 C++ text "
    assert make_corpus.pod_inline("B<I<nested>> C<< a->b >> L<text|http://x> L<perlfunc/open> X<index>E<lt>")[0] == (
        "nested a->b text open in perlfunc <"
    )
    assert make_corpus.pod_inline("E<0x41>E<0102>E<67>E<eacute>E<verbar>")[0] == "ABC\u00e9|"


@pytest.mark.parametrize(
    "paragraph, kept",
    [
        ("The parser keeps this paragraph because it is a plain English sentence.", True),
        ("Too short to keep.", False),
        ("This one has enough words but it never ends with a full stop or any other mark", False),
        ("x = frobnicate(a, b); y = x->next; z = y[0] + 1; return z * 2; done.", False),
        ("Der Parser behält diesen Absatz nicht, weil er auf Deutsch geschrieben ist und nicht englisch.", False),
        ("apt-get is less demanding on hardware resources, and it consumes less memory than others.", True),
        ("continues a sentence that was cut in half by a block element in the middle of it.", False),
    ],
)
def test_prose_filter(paragraph, kept):
    assert make_corpus.is_prose(paragraph, 10) is kept


def test_command_line_reports_and_fails_below_min_words(built, tmp_path, capsys):
    root, out, _ = built
    names = ["docs-html", "docs-man", "docs-pod", "docs-rst"]
    common = ["--unpacked", str(root), "--packages", *names, "--paragraph-min-words", "8", "--no-progress"]
    assert make_corpus.main(["--out", str(tmp_path / "cli"), *common, "--min-words", "10"]) == 0
    assert (tmp_path / "cli" / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    assert "total:" in capsys.readouterr().out
    assert make_corpus.main(["--out", str(tmp_path / "small"), *common, "--min-words", "1000000"]) == 1
    assert "fewer than --min-words 1000000" in capsys.readouterr().err
    assert make_corpus.main(["--out", str(tmp_path / "bad"), "--unpacked", str(root), "--packages", "no-such-doc"]) == 2
    error = capsys.readouterr().err
    assert "no-such-doc" in error and "Traceback" not in error
    with pytest.raises(SystemExit) as exit_info:
        make_corpus.main(["--out", str(tmp_path / "bad"), "--paragraph-min-words", "0"])
    assert exit_info.value.code == 2
    assert "--paragraph-min-words" in capsys.readouterr().err


def test_document_formats_and_licences(tmp_path):
    assert make_corpus.document_format("usr/share/man/man3/Foo::Bar.3perl.gz") == "man"
    assert make_corpus.document_format("usr/share/doc/x/html/a.html") == "html"
    assert make_corpus.document_format("usr/share/doc/x/notes.rst") == "rst"
    assert make_corpus.document_format("usr/share/doc/x/README.gz") == "text"
    assert make_corpus.document_format("usr/share/doc/x/picture.png") is None
    unstructured = tmp_path / "usr/share/doc/old/copyright"
    unstructured.parent.mkdir(parents=True)
    unstructured.write_text(
        textwrap.dedent("""\
        This package was debianized by someone.

        It is distributed under the Python Software Foundation License, version 2.
        """)
    )
    licence, path = make_corpus.read_licence(tmp_path, "old")
    assert path == "usr/share/doc/old/copyright"
    assert licence == "see usr/share/doc/old/copyright; it names: Python Software Foundation"
    assert make_corpus.read_licence(tmp_path, "absent")[1] is None
    (tmp_path / "usr/share/doc/old-doc").symlink_to("old")  # the licence is that of the linked package
    assert make_corpus.read_licence(tmp_path, "old-doc") == make_corpus.read_licence(tmp_path, "old")
    (tmp_path / "usr/share/doc/new-doc").symlink_to("new")
    assert make_corpus.read_licence(tmp_path, "new-doc") == (
        "that of new (usr/share/doc/new-doc links to its directory)",
        None,
    )


def test_default_sources_name_each_package_once():
    names = [source.package for source in make_corpus.DEFAULT_SOURCES]
    assert len(names) == len(set(names))
    assert make_corpus.source_spec("linux-doc-6.1").include == ("usr/share/doc/linux-doc-6.1/html/*.html",)
    assert make_corpus.source_spec("some-other-doc") == make_corpus.SourceSpec("some-other-doc")


# A GCIDE-like dictd database as `dictfmt` lays it out: its header entry, a licence notice at column 0,
# an entry with senses, labels, a quotation and its attribution, a WordNet-sourced block and synonyms.
DICTD = """\
00-database-short
   A test dictionary

This notice at column 0 is licence text of the database and not an entry of it at all.

Affect \\Af*fect"\\, v. t. [imp. & p. p. {Affected}; p. pr. & vb.
   n. {Affecting}.] [L. affectus, p. p. of afficere; ad + facere to make: cf. F. affecter. See {Fact}.]
   1. To act upon; to produce an effect or change upon.
      [1913 Webster]

            The climate affected their health and spirits.
                                                  --Macaulay.
      [1913 Webster]

   2. To love; to regard with affection. [Obs.]
      [1913 Webster]

   3. A state of mind taken from a semantic network of words and their meanings.
      [WordNet 1.5]

   Syn: To influence; move; touch; melt; subdue; overcome.
      [1913 Webster]

Afeard \\A*feard"\\, a. [AS. [=a]f[=ae]red, p. p.]
   Afraid of something that is coming soon. [Obs.] --Shak.
   [1913 Webster]
"""

FORTUNES = """\
A journey of a thousand miles begins with a single step.
		-- Lao Tsu
%
Never put off until tomorrow
what you can do the day after tomorrow.
		-- Mark Twain
%
"""


def test_dictionary_and_fortune_entries_by_hand():
    # the header, the notice, headwords, etymologies, labels, sources, attributions and WordNet's block: gone
    assert make_corpus.dictd_entries(DICTD) == [
        [
            "To act upon; to produce an effect or change upon.",
            "The climate affected their health and spirits.",
            "To love; to regard with affection.",
        ],
        ["Afraid of something that is coming soon."],
    ]
    assert make_corpus.fortune_entries(FORTUNES) == [
        ["A journey of a thousand miles begins with a single step."],
        ["Never put off until tomorrow what you can do the day after tomorrow."],
    ]
    assert make_corpus.document_format("usr/share/dictd/gcide.dict.dz") == "dictd"
    assert make_corpus.document_format("usr/share/games/fortunes/food") == "fortune"
    assert make_corpus.document_format("usr/share/games/fortunes/food.dat") is None


def test_each_dictionary_entry_is_its_own_document(tmp_path):
    root = tmp_path / "unpacked"
    (root / "dict-gcide/usr/share/dictd").mkdir(parents=True)
    entries = "\n\n".join(
        f"Word{i} \\Word{i}\\, n.\n   The meaning number {i} of this word, written as a sentence.\n   [1913 Webster]"
        for i in range(200)
    )
    (root / "dict-gcide/usr/share/dictd/gcide.dict.dz").write_bytes(gzip.compress(entries.encode(), mtime=0))
    (root / "dict-gcide/usr/share/doc/dict-gcide").mkdir(parents=True)
    (root / "dict-gcide/usr/share/doc/dict-gcide/copyright").write_text(COPYRIGHT)
    assert (
        make_corpus.main(
            [
                "--out",
                str(tmp_path / "out"),
                "--unpacked",
                str(root),
                "--packages",
                "dict-gcide",
                "--min-words",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    held_out = {i for i in range(200) if make_corpus.is_heldout("dict-gcide", f"usr/share/dictd/gcide.dict.dz#{i}")}
    assert 0 < len(held_out) < 20  # 1 in 50 entries by the same hash rule, not the whole file
    text = (tmp_path / "out/heldout/heldout-00000.txt").read_text()
    assert text == "".join(f"The meaning number {i} of this word, written as a sentence.\n" for i in sorted(held_out))
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["sources"][0]["documents"] == 200 and manifest["sources"][0]["heldout_documents"] == len(held_out)
    assert make_corpus.PACKAGE_SETS["general"] == ("dict-gcide", "fortunes")


def _deb(root, package, version, tmp_path, extra=""):
    """A real .deb of the fixture package `package` (dpkg-deb --build), `extra` appended to one of its documents."""
    tree = tmp_path / f"tree-{package}-{version}"
    shutil.copytree(root / package, tree)
    (tree / "DEBIAN").mkdir(exist_ok=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: Test <test@example.org>\nDescription: fixture\n"
    )
    if extra:
        (tree / "usr/share/doc" / package / "extra.txt").write_text(extra)
    deb = tmp_path / f"{package}_{version.replace(':', '%3a')}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)], check=True, capture_output=True
    )
    return deb


def _fake_apt(monkeypatch, debs):
    """apt-cache show/madison and apt-get download answered from `debs` ({(package, version): .deb}); dpkg-deb real."""
    real = make_corpus._run

    def run(command, what, **kwargs):
        if command[0] == "apt-cache" and command[1] == "show":
            package, _, version = command[-1].partition("=")
            offered = sorted(v for p, v in debs if p == package)
            if not offered or (version and version not in offered):
                raise ValueError(f"{what}: no such version")
            return f"Package: {package}\nVersion: {version or offered[-1]}\nArchitecture: all\n\n"
        if command[0] == "apt-cache" and command[1] == "madison":
            return "".join(
                f" {p} | {v} | http://deb.example/ main all Packages\n" for p, v in sorted(debs) if p == command[2]
            )
        if command[0] == "apt-get":
            package, version = command[2].split("=")
            shutil.copy(debs[(package, version)], kwargs["cwd"])
            return ""
        return real(command, what, **kwargs)

    monkeypatch.setattr(make_corpus, "_run", run)


def _build(tmp_path, out, cache, *arguments):
    """make_corpus into tmp_path/out with its cache in tmp_path/cache: the exit status."""
    return make_corpus.main(["--out", str(tmp_path / out), "--cache", str(tmp_path / cache), *arguments])


def test_a_corpus_is_rebuilt_from_its_manifest_and_says_what_differs(tmp_path, monkeypatch, capsys):
    """The manifest records each .deb's sha256 and the corpus' own; `--manifest` rebuilds the same corpus (byte for
    byte) where apt offers the recorded versions, and where it does not says which package moved, and how."""
    root = tmp_path / "unpacked"
    _write_fixtures(root, extra_documents=20)
    original = {
        ("docs-html", "1:2.3-4"): _deb(root, "docs-html", "1:2.3-4", tmp_path),
        ("docs-man", "1.0"): _deb(root, "docs-man", "1.0", tmp_path),
    }
    _fake_apt(monkeypatch, original)
    common = ["--paragraph-min-words", "8", "--no-progress"]
    assert _build(tmp_path, "a", "c1", "--packages", "docs-man", "docs-html", *common) == 0
    recorded = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert {entry["package"]: entry["deb_sha256"] for entry in recorded["sources"]} == {
        package: hashlib.sha256(deb.read_bytes()).hexdigest() for (package, _), deb in original.items()
    }
    assert recorded["corpus_sha256"] == make_corpus.corpus_sha256(recorded["shards"])
    capsys.readouterr()

    manifest_file = str(tmp_path / "a" / "manifest.json")
    assert _build(tmp_path, "b", "c2", "--manifest", manifest_file, "--no-progress") == 0
    assert f"the same corpus as {manifest_file}" in capsys.readouterr().out
    rebuilt = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert rebuilt["rebuilt_from"] == {"corpus_sha256": recorded["corpus_sha256"]}
    assert {k: v for k, v in rebuilt.items() if k != "rebuilt_from"} == recorded
    for shard in recorded["shards"]:
        assert (tmp_path / "b" / shard["file"]).read_bytes() == (tmp_path / "a" / shard["file"]).read_bytes()

    moved = {
        ("docs-html", "1:2.3-4"): original[("docs-html", "1:2.3-4")],
        ("docs-man", "1.1"): _deb(
            root,
            "docs-man",
            "1.1",
            tmp_path,
            extra="A new paragraph of plain prose arrived with the next version of the package.\n",
        ),
    }
    _fake_apt(monkeypatch, moved)
    assert _build(tmp_path, "c", "c3", "--manifest", manifest_file, "--no-progress") == 0
    out = capsys.readouterr().out
    assert "docs-man 1.0: not offered here (1.1): its candidate is used" in out
    assert "docs-man: version 1.0 -> 1.1, deb_sha256" in out and "docs-html:" not in out.split("corpus sha256", 2)[-1]
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["corpus_sha256"] != recorded["corpus_sha256"]


def test_a_bad_manifest_is_one_line(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"sources": "x"}')
    assert make_corpus.main(["--out", str(tmp_path / "out"), "--manifest", str(tmp_path / "manifest.json")]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith(f"make_corpus: error: --manifest {tmp_path / 'manifest.json'}: not a manifest")
        and error.count("\n") == 1
    )
    assert not (tmp_path / "out").exists()
