"""Builds a corpus of >= 20 million words of real English prose from Debian documentation packages.

The studies need more text than the shipped sample (`training/data/python_reference.txt`). Debian's
documentation packages are real, freely licensed English prose that the package registry serves to
every machine of this project, so the corpus is rebuilt, never committed:

    python scripts/make_corpus.py --out corpus --cache corpus-cache

Each package is fetched with `apt-get download` into the cache (nothing is installed), unpacked with
`dpkg-deb -x` into a temporary directory, and its documents (HTML, man pages in roff, POD,
reStructuredText, plain text) are reduced to paragraphs of running prose: markup, code blocks,
tables, navigation and headings are dropped, and only paragraphs of at least `--paragraph-min-words`
words that are mostly alphabetic English and end in sentence punctuation are kept. Paragraphs are
deduplicated by a hash of their normalised text. One document in `HELDOUT_ONE_IN`, chosen by a hash
of its package and path, goes wholly to the held-out split.

Output (one paragraph per line, shards of about 10 MB):
    OUT/train/train-00000.txt ...   OUT/heldout/heldout-00000.txt ...   OUT/manifest.json
The manifest records, per package, its version, the SHA-256 of its .deb, its licence (from
`usr/share/doc/<pkg>/copyright`), documents, paragraphs and words in each split; each shard's counts and
SHA-256; and the corpus' own SHA-256 (`corpus_sha256`, of the shards' names and SHA-256s). The same packages
give byte-identical files: walks are sorted, packages are processed in name order, nothing depends
on time or set order. The packages of a day's Debian change, so a corpus is rebuilt from its manifest:

    python scripts/make_corpus.py --out corpus --manifest old/manifest.json

takes the manifest's packages at its versions where apt still offers them (the candidate where not), and prints
how the result differs from the recorded build (nothing: the same corpus_sha256), packages by version, .deb
SHA-256 and counts; the new manifest records the corpus it was rebuilt from (`rebuilt_from`).
"""

import argparse
import dataclasses
import fnmatch
import gzip
import hashlib
import html.entities
import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata

HELDOUT_ONE_IN = 50
SHARD_BYTES = 10_000_000
DEFAULT_MIN_WORDS = 20_000_000
SET_MIN_WORDS = {"docs": DEFAULT_MIN_WORDS, "general": 3_000_000}  # what each set gives, less a margin
DEFAULT_PARAGRAPH_MIN_WORDS = 10


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """Which files of an unpacked package are documents (fnmatch globs on paths relative to its root).

    One rendering of each document only: a package that ships the same text as HTML and as its
    source (Sphinx `_sources`, rst beside html, man pages made from POD) would put near-identical
    paragraphs under two paths, one of which could be held out while the other is trained on.
    """

    package: str
    include: tuple = ("usr/share/*",)
    exclude: tuple = ()


# Globs excluded from every package: generated indexes, source listings, build by-products, packaging boilerplate.
COMMON_EXCLUDES = (
    "*/_sources/*",
    "*/_static/*",
    "*/_images/*",
    "*/_downloads/*",
    "*/genindex*.html",
    "*/search.html",
    "*/py-modindex.html",
    "*/modindex.html",
    "*/copyright",
    "*/copyright.html",
    "*changelog*",
    "*/NEWS*",
    "*/translations/*",
    "usr/share/lintian/*",
    "usr/share/doc-base/*",
    "usr/share/info/*",
    "*/legal/*",
    "*/index-files/*",
    "*/class-use/*",
    "*-tree.html",
    "*/allclasses*",
    "*/allpackages*",
    "*/deprecated-list.html",
    "*/constant-values.html",
    "*/serialized-form.html",
    "*/help-doc.html",
    "*_source.html",
    "*-big-page.html",
    "*/print.html",
)


def _html(*directories, exclude=()):
    return {"include": tuple(f"{directory}/*.html" for directory in directories), "exclude": tuple(exclude)}


# The default sources: English documentation in Debian main, one rendering per document (see
# SourceSpec): HTML where a package also ships its sources, text or single-page twins; translations
# left out. Together about 22 million words of prose after filtering and deduplication (see the
# README for the figures of a build).
DEFAULT_SOURCES = tuple(
    SourceSpec(package, **files)
    for package, files in (
        (
            "ada-reference-manual-2020",
            _html("usr/share/doc/ada-reference-manual-2020/aarm2020.html"),
        ),  # annotated = RM + notes
        ("apache2-doc", _html("usr/share/doc/apache2-doc/manual")),
        ("bash-doc", {"include": ("usr/share/doc/bash/bashref.html",)}),  # bash.html is the man page, a twin
        ("bind9-doc", _html("usr/share/doc/bind9-doc/arm")),
        ("cmake-doc", _html("usr/share/doc/cmake-data/html")),
        ("cppreference-doc-en-html", _html("usr/share/cppreference/doc/html")),
        ("db5.3-doc", _html("usr/share/doc/db5.3-doc")),
        ("debian-faq", _html("usr/share/doc/debian/FAQ")),
        ("debian-handbook", _html("usr/share/doc/debian-handbook/html/en-US")),
        ("debian-policy", _html("usr/share/doc/debian-policy", exclude=("*-1.html",))),
        ("debian-reference-en", {"include": ("usr/share/debian-reference/*.en.html",)}),
        ("debmake-doc", _html("usr/share/doc/debmake-doc/html")),
        ("derby-doc", _html("usr/share/doc/derby-doc")),
        ("developers-reference", _html("usr/share/developers-reference", exclude=("*/developers-reference.html",))),
        ("dpdk-doc", _html("usr/share/doc/dpdk")),
        ("erlang-doc", _html("usr/share/doc/erlang-doc")),
        ("exim4-doc-html", _html("usr/share/doc/exim4-doc-html/spec_html")),
        ("ghc-doc", _html("usr/share/doc/ghc-doc/html")),
        ("gimp-help-en", _html("usr/share/gimp/2.0/help/en")),
        ("git-doc", _html("usr/share/doc/git-doc")),  # the .txt files are the AsciiDoc sources of the pages
        (
            "gnucash-docs",
            _html("usr/share/doc/gnucash-docs/gnucash-guide-en", "usr/share/doc/gnucash-docs/gnucash-help-en"),
        ),
        ("gnutls-doc", {"include": ("usr/share/doc/gnutls-doc/html/gnutls.html",)}),
        ("kicad-doc-en", _html("usr/share/doc/kicad/help/en")),
        (
            "libboost1.74-doc",
            {"include": ("usr/share/doc/libboost1.74-doc/*.html", "usr/share/doc/libboost1.74-doc/*.htm")},
        ),
        ("libgtk-4-doc", _html("usr/share/doc/libgtk-4-doc/gtk4")),
        ("libreoffice-help-en-us", _html("usr/share/libreoffice/help/en-US")),
        ("lilypond-doc-html", _html("usr/share/doc/lilypond/html")),
        ("linux-doc-6.1", _html("usr/share/doc/linux-doc-6.1/html")),  # Documentation/*.rst.gz are its sources
        ("llvm-15-doc", _html("usr/share/doc/llvm-15-doc/html")),
        ("maint-guide", _html("usr/share/doc/maint-guide/html")),
        ("manpages", {"include": ("usr/share/man/man*/*",)}),
        ("manpages-dev", {"include": ("usr/share/man/man*/*",)}),
        ("maxima-doc", _html("usr/share/doc/maxima-doc/html")),
        ("nodejs-doc", _html("usr/share/doc/nodejs/api", exclude=("*/api/all.html",))),  # all.html joins the others
        ("octave-doc", _html("usr/share/doc/octave")),
        ("openjdk-17-doc", _html("usr/share/doc/openjdk-17-jre-headless")),
        ("opencv-doc", _html("usr/share/doc/opencv-doc/opencv4/html")),
        (
            "perl-doc",
            {"include": ("usr/share/perl/*/pod/*.pod", "usr/share/doc/perl/*.pod.gz", "usr/share/man/man3/*")},
        ),
        ("petsc3.18-doc", _html("usr/share/doc/petsc3.18-doc/docs", exclude=("*/docs/src/*",))),
        ("postfix-doc", _html("usr/share/doc/postfix/html")),
        ("postgresql-doc-15", _html("usr/share/doc/postgresql-doc-15/html")),
        ("python-astropy-doc", _html("usr/share/doc/python-astropy-doc/html")),
        ("python-celery-doc", _html("usr/share/doc/python-celery-doc/html")),
        ("python-dask-doc", _html("usr/share/doc/python-dask-doc/html")),
        ("python-brian-doc", _html("usr/share/doc/python-brian-doc/docs")),
        ("python-django-doc", _html("usr/share/doc/python-django-doc/html")),
        ("python-pandas-doc", _html("usr/share/doc/python-pandas-doc/html")),
        ("python-scipy-doc", _html("usr/share/doc/python-scipy-doc/html")),
        ("python-skimage-doc", _html("usr/share/doc/python-skimage-doc/html")),
        ("python-sklearn-doc", _html("usr/share/doc/python-sklearn-doc/html")),
        ("python-sqlalchemy-doc", _html("usr/share/doc/python-sqlalchemy-doc/html")),  # rst/ holds its sources
        ("python-statsmodels-doc", _html("usr/share/doc/python-statsmodels-doc/html")),
        ("python-sympy-doc", _html("usr/share/doc/python-sympy-doc/html")),
        ("python3.11-doc", _html("usr/share/doc/python3.11/html")),
        ("qt5-doc-html", _html("usr/share/qt5/doc")),
        ("qtbase5-doc-html", _html("usr/share/qt5/doc")),
        ("qtdeclarative5-doc-html", _html("usr/share/qt5/doc")),
        ("qtmultimedia5-doc-html", _html("usr/share/qt5/doc")),
        ("qttools5-doc-html", _html("usr/share/qt5/doc")),
        ("racket-doc", _html("usr/share/doc/racket")),
        ("rust-doc", _html("usr/share/doc/rust-doc/html", exclude=("*/html/src/*",))),  # src/: source listings
        ("scala-doc", _html("usr/share/doc/scala-2.11")),
        ("sqlite3-doc", _html("usr/share/doc/sqlite3")),
        ("tcl8.6-doc", {"include": ("usr/share/man/man*/*",)}),
        ("tk8.6-doc", {"include": ("usr/share/man/man*/*",)}),
        ("twisted-doc", _html("usr/share/doc/twisted-doc/html")),  # howto/*.rst are its sources
        (
            "wireshark-doc",
            _html("usr/share/doc/wireshark/wsug_html_chunked", "usr/share/doc/wireshark/wsdg_html_chunked"),
        ),
        ("wx3.2-doc", _html("usr/share/doc/wx3.2-doc/html")),
        ("xorg-docs", _html("usr/share/doc/xorg-docs")),  # the .txt.gz files are text renderings of the same
        ("zsh-doc", _html("usr/share/doc/zsh-common/html")),
    )
)
DEFAULT_PACKAGES = tuple(source.package for source in DEFAULT_SOURCES)

# General English for distillation (`--packages general`): a dictionary's definitions and quotations
# (GCIDE: Webster's 1913 with its supplements, WordNet-derived definitions left out, see
# `dictd_entries`) and fortune(6)'s quotations, jokes and sayings; each entry is its own document.
GENERAL_SOURCES = tuple(
    SourceSpec(package, **files)
    for package, files in (
        ("dict-gcide", {"include": ("usr/share/dictd/gcide.dict.dz",)}),
        ("fortunes", {"include": ("usr/share/games/fortunes/*",), "exclude": ("*/ascii-art", "*/art")}),
    )
)
PACKAGE_SETS = {"docs": DEFAULT_PACKAGES, "general": tuple(source.package for source in GENERAL_SOURCES)}

# Path components naming a translation (ISO 639-1, optionally with a region): never English prose.
_TRANSLATION_DIR = re.compile(
    r"^(ar|bg|ca|cs|da|de|el|es|et|eu|fa|fi|fr|gl|he|hi|hr|hu|id|it|ja|ka|ko|lt|lv|nb|nl|nn|pl|pt|ro|ru"
    r"|sk|sl|sp|sq|sr|sv|th|tr|uk|vi|zh)([_-][A-Za-z]{2,4})?$"
)


def source_spec(package):
    """The SourceSpec of a default package, or one taking every document under usr/share."""
    for source in DEFAULT_SOURCES + GENERAL_SOURCES:
        if source.package == package:
            return source
    return SourceSpec(package)


# ---------------------------------------------------------------------------------------------
# Paragraph cleaning, deduplication keys and the prose filter
# ---------------------------------------------------------------------------------------------

_INVISIBLE = dict.fromkeys(
    [cp for cp in range(0x20) if cp not in (9, 10, 13)] + [0x7F, 0xAD, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF]
)
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")
_MARKUP_LEFT = re.compile(
    r"</?(?:a|b|i|p|br|div|span|code|pre|em|strong|tt|table|tr|td|li|ul|ol|img|html|body|head)\b[^<>]*>|"
    r"\\f[BIRP(\[]|\\\(|^=[a-z]|``|:[a-z]+:`|\b[A-Z]<[^>]+>|&[a-z]+;"
)
_WORD_EDGES = re.compile(r"^[\"'(\[\u201c\u2018]+|\(\d\w*\)|[.,;:!?\"')\]\u201d\u2019]+$")  # quotes, stops, `name(1)`
_ENGLISH_FUNCTION_WORDS = frozenset(
    "a an the and or but if of to in on at by for with from as into onto about than then that this these those "
    "is are was were be been being has have had do does did not no can could may might must shall should will "
    "would it its they them their there which who whom whose what when where while how all any each some such "
    "only also more most other so very you your we our he she his her one".split()
)


def clean_paragraph(text):
    """One line of NFC text: invisible characters removed, every run of whitespace one space."""
    text = unicodedata.normalize("NFC", text).translate(_INVISIBLE)
    return " ".join(text.split())


def dedup_key(paragraph):
    """16-byte hash of the paragraph's words, case- and compatibility-folded (quotes, widths, dashes)."""
    words = re.findall(r"\w+", unicodedata.normalize("NFKC", paragraph).casefold())
    return hashlib.blake2b(" ".join(words).encode("utf-8"), digest_size=16).digest()


def is_prose(paragraph, min_words):
    """True for a paragraph of running English prose: sentences, not code, tables or fragments."""
    words = paragraph.split()
    if len(words) < min_words or not _SENTENCE_END.search(paragraph):
        return False
    if not (paragraph[0].isupper() or paragraph[0].isdigit() or paragraph[0] in "\"'\u201c\u2018("):
        if not paragraph[0].isalpha() or words[0].isalpha():
            return False  # a fragment; only a name like `df(1)` or `apt-get` may start a sentence in lower case
    if _MARKUP_LEFT.search(paragraph) or max(len(word) for word in words) > 60:
        return False
    letters = sum(character.isalpha() for character in paragraph)
    if letters < 0.75 * sum(not character.isspace() for character in paragraph):
        return False
    plain = [_WORD_EDGES.sub("", word) for word in words]
    if sum(word.replace("-", "").replace("'", "").isalpha() for word in plain) < 0.75 * len(words):
        return False  # identifiers, paths, numbers and operators: code or a table row
    function_words = sum(word.lower() in _ENGLISH_FUNCTION_WORDS for word in plain)
    return function_words >= 0.15 * len(words)  # English, not another language or a keyword list


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

_HTML_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
_HTML_BLOCK = frozenset(
    "address article aside blockquote body br caption center dd details div dl dt figcaption figure hr li "
    "main ol p section summary td th tr ul".split()
)
_HTML_SKIP_TAGS = frozenset(
    "button code-block form head header footer iframe math nav noscript object pre script "
    "select style svg table template textarea title".split()
)
# Headings are dropped up to the next block, not skipped as elements: one left open must not hide the page.
_HTML_HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
_HTML_SKIP_ROLES = frozenset("banner contentinfo menu navigation search toolbar".split())
_HTML_SKIP_CLASS = re.compile(
    r"^(highlight.*|sphinxsidebar.*|related|headerlink|toctree-wrapper|wy-nav-side|wy-nav-top|wy-breadcrumbs.*"
    r"|rst-footer-buttons|breadcrumbs?|navbar|navheader|navfooter|docnav.*|toc|sig|sig-object|literal-block.*"
    r"|programlisting|screen|synopsis|cmdsynopsis|funcsynopsis|table|informaltable|member-signature"
    r"|type-signature|.*summary-table.*|inheritance|inherited-list|sub-title|table-header|sub-nav.*|top-nav"
    r"|bottom-nav|legal-copy|menu|searchbox)$"
)


class _ProseHTMLParser(html.parser.HTMLParser):
    """Collects the text of block elements, skipping whole elements that are code, tables or navigation."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs = []
        self._parts = []
        self._skipped_tag = None  # the tag of the element being skipped, and how deep in it we are
        self._skipped_depth = 0
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        if self._skipped_tag is not None:
            self._skipped_depth += tag == self._skipped_tag
            return
        if tag in _HTML_VOID:  # never closed, so never skipped
            if tag in _HTML_BLOCK:
                self._flush()
            return
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if (
            tag in _HTML_SKIP_TAGS
            or attributes.get("role") in _HTML_SKIP_ROLES
            or any(_HTML_SKIP_CLASS.match(name) for name in classes)
        ):
            self._flush()
            self._skipped_tag, self._skipped_depth = tag, 1
        elif tag in _HTML_BLOCK or tag in _HTML_HEADINGS:
            self._flush()
            self._in_heading = tag in _HTML_HEADINGS

    def handle_endtag(self, tag):
        if self._skipped_tag is not None:
            if tag == self._skipped_tag:
                self._skipped_depth -= 1
                if self._skipped_depth == 0:
                    self._skipped_tag = None
            return
        if tag in _HTML_BLOCK or tag in _HTML_HEADINGS:
            self._flush()

    def handle_data(self, data):
        if self._skipped_tag is None:
            self._parts.append(data)

    def close(self):
        super().close()
        self._flush()

    def _flush(self):
        text = " ".join("".join(self._parts).split())
        if text and not self._in_heading:
            self.paragraphs.append(text)
        self._parts.clear()
        self._in_heading = False


def html_paragraphs(text):
    """Paragraphs of an HTML page's body text (code, tables, headings and navigation dropped)."""
    parser = _ProseHTMLParser()
    parser.feed(text)
    parser.close()
    return parser.paragraphs


# ---------------------------------------------------------------------------------------------
# Man pages (roff, man(7) macros and pod2man output): a stripper, so output needs no groff version
# ---------------------------------------------------------------------------------------------

_ROFF_GLYPHS = {
    "em": "\u2014",
    "en": "\u2013",
    "hy": "-",
    "mi": "-",
    "lq": "\u201c",
    "rq": "\u201d",
    "oq": "\u2018",
    "cq": "\u2019",
    "aq": "'",
    "dq": '"',
    "bu": "\u2022",
    "co": "\u00a9",
    "rg": "\u00ae",
    "tm": "\u2122",
    "mu": "\u00d7",
    "de": "\u00b0",
    "+-": "\u00b1",
    "<=": "\u2264",
    ">=": "\u2265",
    "!=": "\u2260",
    "->": "\u2192",
    "<-": "\u2190",
    "ti": "~",
    "ha": "^",
    "rs": "\\",
    "sl": "/",
    "ba": "|",
    "bv": "|",
    "lB": "[",
    "rB": "]",
    "lC": "{",
    "rC": "}",
    "Fo": "\u00ab",
    "Fc": "\u00bb",
    "ss": "\u00df",
}
# Strings that pod2man and man pages define (`.ds`); anything else interpolates to nothing.
_ROFF_STRINGS = {
    'L"': "\u201c",
    'R"': "\u201d",
    "lq": "\u201c",
    "rq": "\u201d",
    "Aq": "'",
    "--": "\u2014",
    "C+": "C++",
    "Tm": "\u2122",
    "PI": "\u03c0",
    "R": "\u00ae",
}
_ROFF_ACCENTS = {
    "'": "\u0301",
    "`": "\u0300",
    ":": "\u0308",
    "^": "\u0302",
    "~": "\u0303",
    ",": "\u0327",
    "o": "\u030a",
}
_ROFF_NAME = r"(?:\[[^\]]*\]|\(..|.)"
_ROFF_ESCAPE = re.compile(
    r"\\(?:(?P<font>f" + _ROFF_NAME + r")|(?P<size>s[+-]?(?:\d|\(\d\d|\[\d+\]))"
    r"|(?P<delimited>[hvwlLoDNbxXHSZ]'[^']*')|(?P<string>\*"
    + _ROFF_NAME
    + r")|(?P<register>n[+-]?"
    + _ROFF_NAME
    + r")|(?P<glyph>\(..|\[[^\]]*\])|(?P<char>.))"
)
_ROFF_CHARS = {"-": "-", "e": "\\", "\\": "\\", "0": " ", "~": " ", " ": " ", "'": "'", "`": "`", ".": "."}


def _roff_glyph(name):
    if name.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):
        return chr(int(name[1:], 16))
    if len(name) == 2 and name[0] in _ROFF_ACCENTS and name[1].isalpha():
        return unicodedata.normalize("NFC", name[1] + _ROFF_ACCENTS[name[0]])
    return _ROFF_GLYPHS.get(name, "")


def _roff_replace(match):
    glyph = match.group("glyph")
    if glyph:
        return _roff_glyph(glyph[1:] if glyph.startswith("(") else glyph[1:-1])
    if match.group("string"):
        name = match.group("string")[1:]
        return _ROFF_STRINGS.get(name[1:-1] if name.startswith("[") else name.lstrip("("), "")
    if match.group("char") is not None:
        return _ROFF_CHARS.get(match.group("char"), "")  # \& \| \^ \c \% \: \{ \} and the like print nothing
    return ""  # fonts, sizes, motions, registers: no text


def roff_inline(text):
    """The printed text of one roff line: escapes resolved, font and size changes removed."""
    text = re.sub(r'\\".*$', "", text)  # a comment runs to the end of the line
    return _ROFF_ESCAPE.sub(_roff_replace, text)


_ROFF_SKIPPED_BLOCKS = {
    "nf": "fi",
    "EX": "EE",
    "Vb": "Ve",
    "TS": "TE",
    "EQ": "EN",
    "PS": "PE",
    "de": "..",
    "de1": "..",
    "am": "..",
    "ig": "..",
    "Bd": "Ed",
    "cs": None,
}
_ROFF_FONT_MACROS = {
    "B": " ",
    "I": " ",
    "SM": " ",
    "SB": " ",
    "BR": "",
    "BI": "",
    "IB": "",
    "IR": "",
    "RB": "",
    "RI": "",
}
_ROFF_HEADINGS = frozenset("SH SS TH Sh Ss Dt Dd".split())
_ROFF_BREAKS = frozenset("PP LP P IP HP TP sp br RS RE in ti bp ne Pp Lp It Bl El".split())


def _roff_request(line):
    """(macro name, argument text) of a request or macro line."""
    match = re.match(r"^[.']\s*(\S*)\s*(.*)$", line)
    return match.group(1), match.group(2)


def _ends_block(line, end):
    if end == "..":
        return line.strip() == ".."
    return re.match(r"^[.']\s*" + re.escape(end) + r"(\s|$)", line) is not None


def man_paragraphs(text):
    """Paragraphs of a man page's filled text (examples, tables, headings and definitions dropped)."""
    paragraphs, current = [], []
    block_end, term_pending = None, False

    def flush():
        if current:
            paragraphs.append(" ".join(" ".join(current).split()))
            current.clear()

    for line in text.splitlines():
        if block_end is not None:
            block_end = None if _ends_block(line, block_end) else block_end
            continue
        if line.startswith((".", "'")):
            name, arguments = _roff_request(line)
            if name in _ROFF_SKIPPED_BLOCKS and _ROFF_SKIPPED_BLOCKS[name]:
                flush()
                block_end = _ROFF_SKIPPED_BLOCKS[name]
            elif name in _ROFF_FONT_MACROS and arguments and term_pending:
                term_pending = False  # the term of a .TP, set in a font: dropped like a plain one
            elif name in _ROFF_FONT_MACROS and arguments:
                words = [quoted or bare for quoted, bare in re.findall(r'"((?:[^"]|"")*)"|(\S+)', arguments)]
                current.append(roff_inline(_ROFF_FONT_MACROS[name].join(words)))
            elif name in _ROFF_HEADINGS or name in _ROFF_BREAKS:
                flush()
                term_pending = name == "TP"  # the next text line is the term being defined
            continue
        if term_pending or not line.strip() or line[0] in " \t":
            term_pending = False
            flush()  # a blank line breaks; an indented line is a literal display (code)
            continue
        current.append(roff_inline(line))
    flush()
    return paragraphs


# ---------------------------------------------------------------------------------------------
# POD
# ---------------------------------------------------------------------------------------------

_POD_OPEN = re.compile(r"([A-Z])(<<+\s+|<)")
_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}


def _pod_code(letter, inner):
    if letter in "XZ":
        return ""  # index entries and zero-width markers print nothing
    if letter == "E":
        if inner in _POD_ESCAPES:
            return _POD_ESCAPES[inner]
        if re.fullmatch(r"0x[0-9A-Fa-f]{1,6}|0[0-7]{1,7}|[1-9]\d{0,6}", inner):  # hex, octal or decimal (perlpodspec)
            code_point = int(inner, 16 if inner.startswith("0x") else 8 if inner.startswith("0") else 10)
            return chr(code_point) if code_point <= sys.maxunicode else ""
        return chr(html.entities.name2codepoint[inner]) if inner in html.entities.name2codepoint else ""
    if letter == "L":
        if "|" in inner:
            return inner.split("|", 1)[0]
        if inner.startswith(("http:", "https:", "ftp:")):
            return inner
        page, _, section = inner.partition("/")
        section = section.strip('"')
        return f"{section} in {page}" if page and section else (section or page)
    return inner  # B I C F S: the text itself


def pod_inline(text, start=0, closer=None):
    """(text with POD formatting codes resolved, position after `closer`), nesting handled."""
    parts, position = [], start
    while position < len(text):
        opening = _POD_OPEN.search(text, position)
        closing = closer.search(text, position) if closer else None
        if closing and (not opening or closing.start() <= opening.start()):
            parts.append(text[position : closing.start()])
            return "".join(parts), closing.end()
        if not opening:
            break
        parts.append(text[position : opening.start()])
        brackets = opening.group(2).count("<")
        inner_closer = re.compile(">") if brackets == 1 else re.compile(r"\s+" + ">" * brackets)
        inner, position = pod_inline(text, opening.end(), inner_closer)
        parts.append(_pod_code(opening.group(1), inner))
    parts.append(text[position:])
    return "".join(parts), len(text)


def pod_paragraphs(text):
    """Ordinary POD paragraphs (verbatim code, commands and =begin/=for blocks dropped)."""
    paragraphs, in_pod, in_begin_block = [], False, False
    for block in re.split(r"\n(?:[ \t]*\n)+", text.replace("\r\n", "\n")):
        if not block.strip():
            continue
        if block.startswith("="):
            command = block.split(None, 1)[0][1:]
            in_pod = command != "cut"
            if command in ("begin", "end"):
                in_begin_block = command == "begin"
            continue  # headings, items and directives are not sentences
        if in_pod and not in_begin_block and block[0] not in " \t":
            paragraphs.append(pod_inline(" ".join(block.split()))[0])
    return paragraphs


# ---------------------------------------------------------------------------------------------
# reStructuredText and plain text
# ---------------------------------------------------------------------------------------------

_RST_ADMONITIONS = frozenset(
    "admonition attention caution danger error hint important note seealso tip warning versionadded "
    "versionchanged deprecated".split()
)
_RST_INLINE = (
    (re.compile(r":[\w:+-]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`"), r"\1"),  # :role:`text <target>`
    (re.compile(r"``(.+?)``"), r"\1"),
    (re.compile(r"`([^`<]*?)\s*(?:<[^>]*>)?`__?"), r"\1"),  # `text <url>`_
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"\*\*(.+?)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*])\*(\S(?:.*?\S)?)\*(?![\w*])"), r"\1"),
    (re.compile(r"\s*\[(?:#\w*|\d+|\*)\]_"), ""),  # footnote references
    (re.compile(r"\|(\w[^|]*)\|_{0,2}"), r"\1"),  # substitutions
    (re.compile(r"\b(\w+)__?(?=\W|$)"), r"\1"),  # simple references: name_
    (re.compile(r"\\(.)"), r"\1"),
)
_RST_ADORNMENT = re.compile(r"^([=\-`:'\"~^_*+#.<>])\1{2,}\s*$")
_LIST_MARKER = re.compile(r"^(?:[-*+\u2022]|#\.|\d+[.)]|\(\d+\)|[a-z][.)])\s+")


def _rst_block_kind(lines):
    """'heading', 'table', 'field' or 'text' for one block of reStructuredText."""
    stripped = [line.strip() for line in lines]
    if any(_RST_ADORNMENT.match(line) for line in stripped) and len(lines) <= 3:
        return "heading"
    if stripped[0].startswith(("+-", "+=")) or re.match(r"^=+(\s+=+)+$", stripped[0]):
        return "table"
    if re.match(r"^:[^:]+:(\s|$)", stripped[0]):
        return "field"
    return "text"


def rst_paragraphs(text):
    """Paragraphs of reStructuredText (directives, literal blocks, tables and headings dropped)."""
    paragraphs, skip_deeper_than = [], None
    for block in re.split(r"\n(?:[ \t]*\n)+", text.replace("\r\n", "\n").expandtabs(8)):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        indent = len(lines[0]) - len(lines[0].lstrip())
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue  # the body of a directive or a literal block
        skip_deeper_than = None
        first = lines[0].strip()
        if first.startswith(".."):
            directive = re.match(r"\.\.\s+([\w:-]+)::\s*(.*)", first)
            if directive and directive.group(1) in _RST_ADMONITIONS:
                lines = [directive.group(2)] + lines[1:]  # an admonition's body is prose
            else:
                skip_deeper_than = indent
                continue
        if _rst_block_kind(lines) != "text":
            continue
        paragraph = " ".join(line.strip() for line in lines if line.strip())
        if paragraph.endswith("::"):
            skip_deeper_than = indent  # a literal block follows
            paragraph = paragraph[:-2].rstrip() + (":" if not paragraph[:-2].endswith(" ") else "")
        paragraph = _LIST_MARKER.sub("", paragraph)
        for pattern, replacement in _RST_INLINE:
            paragraph = pattern.sub(replacement, paragraph)
        paragraphs.append(paragraph)
    return paragraphs


def text_paragraphs(text):
    """Paragraphs of a plain-text document (indented displays, ASCII tables and headings dropped)."""
    paragraphs = []
    for block in re.split(r"\n(?:[ \t]*\n)+", text.replace("\r\n", "\n").expandtabs(8)):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines or lines[0].startswith("    "):
            continue  # code or a display
        if any(_RST_ADORNMENT.match(line.strip()) or re.search(r"\|.*\||\+-{2,}|\S {3,}\S", line) for line in lines):
            continue  # headings with underlines, tables, column layouts
        paragraphs.append(_LIST_MARKER.sub("", " ".join(line.strip() for line in lines)))
    return paragraphs


# ---------------------------------------------------------------------------------------------
# Dictionaries (dictd) and fortune files: many short entries in one file, each its own document
# ---------------------------------------------------------------------------------------------

_DICTD_HEADWORD = re.compile(r"[^\\\s][^\\\n]*\\[^\\\n]+\\")  # `Affect \Af*fect"\`: headword and pronunciation
_DICTD_PART_OF_SPEECH = re.compile(r"^(?:[;,]\s*|(?:pl|sing|[a-z]{1,5})\.\s*|&\s*|\{[^{}\n]*\}\s*)+")
_DICTD_SOURCE_LINE = re.compile(r"^\s*\[[^\[\]]*\]\s*$", re.MULTILINE)  # [1913 Webster], [WordNet 1.5], [PJC]
_DICTD_LABEL = re.compile(r"\[[^\[\]\n]{1,30}\]")  # [Obs.], [Colloq.], [R.]
_ATTRIBUTION = re.compile(r"\s--\s?[A-Z][^\n]*$|^\s*--.*$", re.MULTILINE)  # --Milton.  /  -- Mark Twain


def _skip_brackets(text):
    """`text` after a leading balanced [...] group (etymologies nest: `AS. [=a]f?ran`); `text` if none."""
    depth = 0
    for index, character in enumerate(text):
        depth += {"[": 1, "]": -1}.get(character, 0)
        if depth == 0:
            return text[index + 1 :]
    return ""


def _definition_text(block):
    """A dictd block without its headword, pronunciation, part of speech and etymology."""
    text = block[_DICTD_HEADWORD.match(block).end() :]
    while True:
        text = _DICTD_PART_OF_SPEECH.sub("", text.lstrip(" ,;\n"))
        if not text.startswith("["):
            return text
        text = _skip_brackets(text)


def dictd_entries(text, skip_source="WordNet"):
    """Entries of a dictd database (as `dictfmt` writes GCIDE): each a list of its definitions and
    quotations, headwords, pronunciations, etymologies, labels, synonym lists and attributions removed.

    A block whose source tag names `skip_source` is left out (GCIDE's definitions taken from WordNet,
    whose glosses are this project's labelled probe: they must not be trained on). Blocks at column 0
    without a pronunciation (the database's own header and licence notice) are not entries.
    """
    entries = []
    for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        if not block.strip():
            continue
        if not block[0].isspace():
            entries.append([] if _DICTD_HEADWORD.match(block) else None)
            if entries[-1] is None:
                continue
            block = _definition_text(block)
        if (
            not entries
            or entries[-1] is None
            or (skip_source and re.search(rf"^\s*\[[^\]]*{skip_source}", block, re.MULTILINE))
        ):
            continue
        block = _DICTD_SOURCE_LINE.sub("", block).strip()
        if not block or block.startswith(("Syn.", "Syn:")):  # synonym lists
            continue
        block = _ATTRIBUTION.sub("", block.removeprefix("Note:"))
        block = _DICTD_LABEL.sub("", block.replace("{", "").replace("}", ""))
        entries[-1].append(_LIST_MARKER.sub("", " ".join(block.split())))
    return [entry for entry in entries if entry]


def fortune_entries(text):
    """Entries of a fortune(6) file (separated by lines holding `%`), each one paragraph, attributions removed."""
    entries = []
    for entry in re.split(r"^%[ \t]*$", text.replace("\r\n", "\n"), flags=re.MULTILINE):
        entry = _ATTRIBUTION.sub("", entry)
        if entry.strip():
            entries.append([" ".join(entry.split())])
    return entries


CONVERTERS = {
    "html": html_paragraphs,
    "man": man_paragraphs,
    "pod": pod_paragraphs,
    "rst": rst_paragraphs,
    "text": text_paragraphs,
}
# Formats whose files hold many entries: each entry is a document (split and counted on its own).
ENTRY_CONVERTERS = {"dictd": dictd_entries, "fortune": fortune_entries}


# ---------------------------------------------------------------------------------------------
# Documents of an unpacked package
# ---------------------------------------------------------------------------------------------


def document_format(relative_path):
    """The converter name for a file ('html', 'man', 'pod', 'rst', 'text', 'dictd', 'fortune'), or None."""
    if relative_path.endswith(".dict.dz"):
        return "dictd"
    if relative_path.startswith("usr/share/games/fortunes/") and "." not in relative_path.rsplit("/", 1)[-1]:
        return "fortune"  # the .dat and .u8 beside each file are its index and a UTF-8 twin
    path = relative_path[:-3] if relative_path.endswith(".gz") else relative_path
    name = path.rsplit("/", 1)[-1]
    suffix = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if suffix in ("html", "htm", "xhtml"):
        return "html"
    if re.match(r"^usr/share/man/man[1-9n]/", path) and re.fullmatch(r"[1-9n]\w*", suffix):
        return "man"
    if suffix == "pod":
        return "pod"
    if suffix == "rst" or name.endswith(".rst.txt"):
        return "rst"
    if suffix == "txt" or name.startswith("README"):
        return "text"
    return None


def list_documents(root, source):
    """Sorted (relative path, format) of the package's documents: regular files, no symlinks."""
    root = pathlib.Path(root)
    documents = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        relative_directory = pathlib.Path(directory).relative_to(root).as_posix()
        if any(_TRANSLATION_DIR.match(part) for part in relative_directory.split("/")):
            subdirectories.clear()
            continue
        for name in sorted(files):
            relative = name if relative_directory == "." else f"{relative_directory}/{name}"
            if os.path.islink(os.path.join(directory, name)) or not _selected(relative, source):
                continue
            kind = document_format(relative)
            if kind:
                documents.append((relative, kind))
    return sorted(documents)


def _selected(relative_path, source):
    def matches(patterns):
        return any(fnmatch.fnmatchcase(relative_path, pattern) for pattern in patterns)

    return matches(source.include) and not matches(source.exclude + COMMON_EXCLUDES)


def read_document(path):
    """A document's text: gunzipped if .gz or .dz (dictzip is gzip), UTF-8 with Latin-1 as the fallback of old man pages."""
    data = pathlib.Path(path).read_bytes()
    data = gzip.decompress(data) if str(path).endswith((".gz", ".dz")) else data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def is_heldout(package, relative_path):
    """Whether a document belongs to the held-out split (1 in HELDOUT_ONE_IN, by a hash of its path)."""
    digest = hashlib.sha256(f"{package}/{relative_path}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_ONE_IN == 0


_LICENCE_NAMES = re.compile(
    r"\b(GNU (?:Lesser |Library |Free Documentation |Affero )?General Public License|GNU Free Documentation License|"
    r"A?GPL|LGPL|GFDL|BSD|MIT|Expat|Apache|Artistic|Python Software Foundation|PSF|Mozilla Public License|MPL|"
    r"Eclipse Public License|EPL|IBM Public License|public domain|Creative Commons|CC-BY[\w.-]*|ISC|zlib|"
    r"Boost Software License|Sleepycat|X11)\b",
    re.IGNORECASE,
)


def linked_doc_owner(root, package):
    """The package whose doc directory usr/share/doc/<package> links to, or None if it is a directory."""
    doc_directory = pathlib.Path(root) / "usr/share/doc" / package
    return pathlib.PurePosixPath(os.readlink(doc_directory)).name if doc_directory.is_symlink() else None


def read_licence(root, package):
    """(licence, copyright file or None) of an unpacked package, from usr/share/doc/<package>/copyright.

    A machine-readable (DEP-5) file gives the licence of its `Files: *` stanza; any other file gives
    the licence names it mentions. A package whose doc directory is a link to another package's
    (manpages-dev -> manpages) carries no copyright file of its own: the licence is that package's,
    read from its copyright file if that was put in the tree (see `downloaded_packages`).
    """
    owner = linked_doc_owner(root, package) or package
    doc_directory = pathlib.Path(root) / "usr/share/doc" / owner
    relative = f"usr/share/doc/{owner}/copyright"
    if not (doc_directory / "copyright").is_file():
        if owner != package:
            return f"that of {owner} (usr/share/doc/{package} links to its directory)", None
        return "unknown: the package ships no copyright file", None
    text = read_document(doc_directory / "copyright")
    for stanza in re.split(r"\n[ \t]*\n", text):
        if re.search(r"^Files:\s*\*(\s|$)", stanza, re.MULTILINE):
            licence = re.search(r"^Licen[cs]e:[ \t]*(\S.*)$", stanza, re.MULTILINE)
            if licence:
                return licence.group(1).strip(), relative
    names = []
    for match in _LICENCE_NAMES.finditer(text):
        if match.group(1).casefold() not in [name.casefold() for name in names]:
            names.append(match.group(1))
    if not names:
        return f"see {relative}: its own permission notice, naming no common licence", relative
    return f"see {relative}; it names: {', '.join(names)}", relative


# ---------------------------------------------------------------------------------------------
# Output: shards and the manifest
# ---------------------------------------------------------------------------------------------


class ShardWriter:
    """Writes paragraphs one per line to `<split>/<split>-00000.txt`..., starting a shard every ~shard_bytes."""

    def __init__(self, out_dir, split, shard_bytes=SHARD_BYTES):
        self._directory = pathlib.Path(out_dir) / split
        self._directory.mkdir(parents=True, exist_ok=True)
        self._split, self._shard_bytes = split, shard_bytes
        self._file, self._hash = None, None
        self.shards = []  # manifest entries, relative to out_dir

    def write(self, paragraph):
        line = (paragraph + "\n").encode("utf-8")
        if self._file is None or self.shards[-1]["bytes"] + len(line) > self._shard_bytes:
            self._next_shard()
        self._file.write(line)
        self._hash.update(line)
        shard = self.shards[-1]
        shard["paragraphs"] += 1
        shard["words"] += len(paragraph.split())
        shard["bytes"] += len(line)

    def close(self):
        if self._file is not None:
            self._file.close()
            self.shards[-1]["sha256"] = self._hash.hexdigest()
            self._file = None
        return self.shards

    def _next_shard(self):
        self.close()
        name = f"{self._split}-{len(self.shards):05d}.txt"
        self._file = open(self._directory / name, "wb")
        self._hash = hashlib.sha256()
        self.shards.append({"file": f"{self._split}/{name}", "paragraphs": 0, "words": 0, "bytes": 0})


@dataclasses.dataclass(frozen=True)
class UnpackedPackage:
    """A package's files unpacked under `root` (as `dpkg-deb -x` lays them out)."""

    name: str
    version: str
    root: pathlib.Path
    source: SourceSpec
    deb_sha256: str = None  # of the .deb it was unpacked from (None: read from an unpacked folder)


def _split_counts():
    return {"train": 0, "heldout": 0}


def _convert_package(package, writers, seen, paragraph_min_words, progress):
    """Streams one package's prose paragraphs into the writers; returns its manifest entry."""
    licence, copyright_file = read_licence(package.root, package.name)
    entry = {
        "package": package.name,
        "version": package.version,
        "deb_sha256": package.deb_sha256,
        "licence": licence,
        "copyright_file": copyright_file,
        "documents": 0,
        "heldout_documents": 0,
        "documents_without_prose": 0,
        "duplicate_paragraphs": 0,
        "paragraphs": _split_counts(),
        "words": _split_counts(),
        "unreadable_documents": [],
    }
    documents = list_documents(package.root, package.source)
    for relative, kind in _progress(documents, package.name, progress):
        try:
            units = _document_units(package.root / relative, relative, kind)
        except (OSError, EOFError, ValueError, gzip.BadGzipFile) as error:
            entry["unreadable_documents"].append(f"{relative}: {type(error).__name__}")
            continue
        for name, paragraphs in units:
            _write_document(package.name, name, paragraphs, writers, seen, paragraph_min_words, entry)
    return entry


def _document_units(path, relative, kind):
    """(name, paragraphs) of each document in a file: the file itself, or each entry of a dictionary or
    fortune file (named `relative#index`, so that entries, not the whole file, are held out)."""
    text = read_document(path)
    if kind in ENTRY_CONVERTERS:
        return [(f"{relative}#{index}", paragraphs) for index, paragraphs in enumerate(ENTRY_CONVERTERS[kind](text))]
    return [(relative, CONVERTERS[kind](text))]


def _write_document(package, relative, paragraphs, writers, seen, paragraph_min_words, entry):
    """Writes one document's new prose paragraphs to its split and counts them in the manifest entry."""
    split = "heldout" if is_heldout(package, relative) else "train"
    entry["documents"] += 1
    entry["heldout_documents"] += split == "heldout"
    kept = 0
    for paragraph in map(clean_paragraph, paragraphs):
        if not is_prose(paragraph, paragraph_min_words):
            continue
        key = dedup_key(paragraph)
        if key in seen:
            entry["duplicate_paragraphs"] += 1
            continue
        seen.add(key)
        writers[split].write(paragraph)
        entry["paragraphs"][split] += 1
        entry["words"][split] += len(paragraph.split())
        kept += 1
    entry["documents_without_prose"] += kept == 0


def _progress(items, description, enabled):
    if not enabled:
        return items
    from tqdm import tqdm  # the builder otherwise needs the standard library alone

    return tqdm(items, desc=description, unit="doc", file=sys.stderr)


def _totals(sources):
    totals = {"documents": 0, "heldout_documents": 0, "paragraphs": _split_counts(), "words": _split_counts()}
    for entry in sources:
        totals["documents"] += entry["documents"]
        totals["heldout_documents"] += entry["heldout_documents"]
        for measure in ("paragraphs", "words"):
            for split in ("train", "heldout"):
                totals[measure][split] += entry[measure][split]
    totals["words"]["all"] = totals["words"]["train"] + totals["words"]["heldout"]
    return totals


def corpus_sha256(shards):
    """The corpus' own sha256: of its shards' names and sha256s, in order (two builds are the same corpus iff equal)."""
    return hashlib.sha256("".join(f"{shard['file']} {shard['sha256']}\n" for shard in shards).encode()).hexdigest()


def build_corpus(packages, out_dir, paragraph_min_words=DEFAULT_PARAGRAPH_MIN_WORDS, progress=False, rebuilt_from=None):
    """Converts, filters, deduplicates and splits the packages' documents into `out_dir`; returns the manifest.

    Args:
        packages: UnpackedPackage objects, consumed one at a time; the same packages in the same
            order give byte-identical output.
        out_dir: receives `train/`, `heldout/` and `manifest.json`, replaced whole (built in
            `.building/`, then moved in); nothing else there is touched.
        paragraph_min_words: the fewest words a kept paragraph has.
        progress: show a tqdm bar per package.
        rebuilt_from: recorded in the manifest as it is.
    """
    if paragraph_min_words < 1:
        raise ValueError(f"paragraph_min_words must be at least 1; got {paragraph_min_words}")
    out_dir = pathlib.Path(out_dir)
    staging = out_dir / ".building"
    shutil.rmtree(staging, ignore_errors=True)
    writers = {split: ShardWriter(staging, split) for split in ("train", "heldout")}
    seen, sources = set(), []
    try:
        for package in packages:
            sources.append(_convert_package(package, writers, seen, paragraph_min_words, progress))
    except BaseException:
        for writer in writers.values():
            writer.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shards = [shard for split in ("train", "heldout") for shard in writers[split].close()]
    manifest = {
        "builder": "python scripts/make_corpus.py",
        "corpus_sha256": corpus_sha256(shards),
        "paragraph_min_words": paragraph_min_words,
        "heldout_one_in": HELDOUT_ONE_IN,
        "sources": sources,
        "totals": _totals(sources),
        "shards": shards,
        **({"rebuilt_from": rebuilt_from} if rebuilt_from else {}),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for name in ("train", "heldout", "manifest.json"):
        target = out_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        (staging / name).rename(target)
    staging.rmdir()
    return manifest


# ---------------------------------------------------------------------------------------------
# Packages: apt-get download into a cache, dpkg-deb -x into a temporary directory
# ---------------------------------------------------------------------------------------------


def _run(command, what, **kwargs):
    try:
        return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout
    except FileNotFoundError:
        raise ValueError(f"{what}: {command[0]} is not installed (a Debian system is needed)") from None
    except subprocess.CalledProcessError as error:
        reason = (error.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"{what}: {' '.join(command)} failed: {reason}") from None


def fetch_deb(package, cache_dir, version=None):
    """(.deb path in cache_dir, package name, version) of the package's candidate (or of `version`, which apt must
    still offer), downloaded if not cached.

    The name is the one apt resolves to (a virtual name such as boost1.74-doc is provided by
    libboost1.74-doc), so that the copyright file and the manifest are that package's.
    """
    info = _run(
        ["apt-cache", "show", "--no-all-versions", package if version is None else f"{package}={version}"],
        f"--packages {package}",
    )
    first_stanza = info.strip().split("\n\n")[0]
    fields = dict(re.findall(r"^(Package|Version|Architecture):\s*(\S+)", first_stanza, re.MULTILINE))
    if len(fields) != 3:
        raise ValueError(f"--packages {package}: apt-cache has no candidate version (run apt-get update?)")
    name, version = fields["Package"], fields["Version"]
    cache_dir = pathlib.Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    deb = cache_dir / f"{name}_{version.replace(':', '%3a')}_{fields['Architecture']}.deb"
    if not deb.is_file():
        _run(["apt-get", "download", f"{name}={version}"], f"--packages {package}", cwd=cache_dir)
    if not deb.is_file():
        raise ValueError(f"--packages {package}: apt-get download did not write {deb}")
    return deb, name, version


def available_versions(package):
    """The versions of `package` apt offers here (`apt-cache madison`), newest first."""
    try:
        listing = _run(["apt-cache", "madison", package], f"--packages {package}")
    except ValueError:
        return []
    return list(dict.fromkeys(line.split("|")[1].strip() for line in listing.splitlines() if line.count("|") >= 2))


def pinned_versions(manifest):
    """{package: version} of a manifest's sources that apt still offers, and the lines saying which it does not."""
    pins, differences = {}, []
    for entry in manifest["sources"]:
        offered = available_versions(entry["package"])
        if entry["version"] in offered:
            pins[entry["package"]] = entry["version"]
        else:
            differences.append(
                f"{entry['package']} {entry['version']}: not offered here "
                f"({'; '.join(offered) or 'no version at all'}): its candidate is used"
            )
    return pins, differences


def compare_builds(recorded, built):
    """Lines saying how a rebuilt corpus differs from the manifest it was rebuilt from (none: the same corpus)."""
    if recorded.get("corpus_sha256") == built["corpus_sha256"]:
        return []
    before = {entry["package"]: entry for entry in recorded["sources"]}
    lines = [f"corpus sha256 {built['corpus_sha256']}, recorded {recorded.get('corpus_sha256', 'none')}"]
    for entry in built["sources"]:
        old = before.pop(entry["package"], None)
        if old is None:
            lines.append(f"{entry['package']}: not in the recorded build")
            continue
        changed = [key for key in ("version", "deb_sha256", "words", "paragraphs") if old.get(key) != entry[key]]
        if changed:
            lines.append(f"{entry['package']}: {', '.join(f'{key} {old.get(key)} -> {entry[key]}' for key in changed)}")
    lines += [f"{name}: in the recorded build only" for name in before]
    return lines


def downloaded_packages(names, cache_dir, versions=None):
    """UnpackedPackage for each name in turn (at `versions[name]` where given), each unpacked just before use
    and removed after."""
    for requested in names:
        deb, name, version = fetch_deb(requested, cache_dir, (versions or {}).get(requested))
        with tempfile.TemporaryDirectory(prefix=f"make_corpus-{name}-") as unpacked:
            _run(["dpkg-deb", "-x", str(deb), unpacked], f"--packages {requested}")
            owner = linked_doc_owner(unpacked, name)
            if owner and not (pathlib.Path(unpacked) / "usr/share/doc" / owner / "copyright").exists():
                _copy_copyright_file(owner, cache_dir, pathlib.Path(unpacked))
            yield UnpackedPackage(name, version, pathlib.Path(unpacked), source_spec(name), _sha256(deb))


def _sha256(path):
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _copy_copyright_file(owner, cache_dir, unpacked):
    """Puts the copyright file of `owner` (the package a doc directory links to) into the unpacked tree."""
    deb, _, _ = fetch_deb(owner, cache_dir)
    with tempfile.TemporaryDirectory(prefix=f"make_corpus-{owner}-") as other:
        _run(["dpkg-deb", "-x", str(deb), other], f"copyright of {owner}")
        source = pathlib.Path(other) / "usr/share/doc" / owner / "copyright"
        if source.is_file():
            target = unpacked / "usr/share/doc" / owner / "copyright"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def unpacked_packages(names, unpacked_dir):
    """UnpackedPackage for each name from `unpacked_dir/<name>/` (version from its DEBIAN/control if any)."""
    for name in names:
        root = pathlib.Path(unpacked_dir) / name
        if not root.is_dir():
            raise ValueError(f"--unpacked: no directory for package {name!r}: {root}")
        control = root / "DEBIAN" / "control"
        version = (
            re.search(r"^Version:\s*(\S+)", control.read_text(encoding="utf-8"), re.MULTILINE)
            if control.is_file()
            else None
        )
        yield UnpackedPackage(name, version.group(1) if version else "unknown", root, source_spec(name))


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python scripts/make_corpus.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory (train/, heldout/, manifest.json)")
    parser.add_argument(
        "--packages",
        nargs="+",
        default=["docs"],
        help="Debian packages to read, or the sets `docs` (English documentation, the default: "
        f"{' '.join(DEFAULT_PACKAGES)}) and `general` (general English for distillation: "
        f"{' '.join(PACKAGE_SETS['general'])})",
    )
    parser.add_argument("--cache", help="where downloaded .deb files are kept (default: OUT/deb-cache)")
    parser.add_argument("--unpacked", help="read already unpacked packages from UNPACKED/<package>/ instead of apt")
    parser.add_argument(
        "--min-words",
        type=_positive,
        help="fail (exit 1) if the corpus has fewer words (default: 20,000,000 for docs, 3,000,000 for "
        "general, their sum for both, 1 for other packages): a failed download must not pass",
    )
    parser.add_argument(
        "--paragraph-min-words",
        type=_positive,
        default=DEFAULT_PARAGRAPH_MIN_WORDS,
        help="the fewest words a kept paragraph has (default: %(default)s)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--manifest",
        help="rebuild the corpus a manifest.json of this builder describes: its packages at its "
        "versions where apt still offers them (the differences are printed and recorded)",
    )
    return parser.parse_args(argv)


def _recorded_manifest(path):
    """The manifest --manifest names, or a ValueError naming it."""
    try:
        manifest = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
        names = [entry["package"] for entry in manifest["sources"]]
        return manifest, names, int(manifest["paragraph_min_words"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"--manifest {path}: not a manifest of this builder ({type(error).__name__}: {error})"
        ) from None


def _package_source(args, names, versions):
    if args.unpacked:
        return unpacked_packages(names, args.unpacked)
    return downloaded_packages(names, args.cache or os.path.join(args.out, "deb-cache"), versions)


def main(argv=None):
    args = parse_args(argv)
    recorded, versions, differences = None, None, []
    try:
        if args.manifest:
            recorded, names, args.paragraph_min_words = _recorded_manifest(args.manifest)
            if not args.unpacked:
                versions, differences = pinned_versions(recorded)
        else:
            # name order: the output does not depend on the order given
            names = sorted({name for given in args.packages for name in PACKAGE_SETS.get(given, (given,))})
        if args.min_words is None:
            args.min_words = 1 if recorded else max(1, sum(SET_MIN_WORDS.get(given, 0) for given in set(args.packages)))
        manifest = build_corpus(
            _package_source(args, names, versions),
            args.out,
            args.paragraph_min_words,
            progress=not args.no_progress,
            rebuilt_from=recorded and {"corpus_sha256": recorded.get("corpus_sha256")},
        )
    except ValueError as error:
        print(f"make_corpus: error: {error}", file=sys.stderr)
        return 2
    for entry in manifest["sources"]:
        words = entry["words"]["train"] + entry["words"]["heldout"]
        print(f"{entry['package']} {entry['version']}: {entry['documents']} documents, {words} words")
    totals = manifest["totals"]
    print(
        f"total: {totals['words']['all']} words ({totals['words']['train']} train, "
        f"{totals['words']['heldout']} held out) in {args.out}; corpus sha256 {manifest['corpus_sha256']}"
    )
    if recorded:
        differences += compare_builds(recorded, manifest)
        print("\n".join(differences) if differences else f"the same corpus as {args.manifest}")
    if totals["words"]["all"] < args.min_words:
        print(
            f"make_corpus: error: the corpus has {totals['words']['all']} words, fewer than --min-words "
            f"{args.min_words}; add packages with --packages",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
