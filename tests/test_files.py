"""Whole files (aiayn.documents.files): documents made with each format's own library, translated by
a fake backend whose translation and alignment are known, opened again with that library; every
member not translated byte for byte; bad bytes of every kind refused with one UserError line."""

from __future__ import annotations

import io
import re
import struct
import zipfile
import zlib
from types import SimpleNamespace
from typing import Callable, Sequence

import pytest

from aiayn.decode.request import TEXT, LineLike, Translation, Wanted, as_lines
from aiayn.decode.search import DecodeOptions
from aiayn.documents.files import DEFAULT_LIMITS, EXTENSIONS, FileLimits, read_file
from aiayn.documents.translate import DocumentTranslator
from aiayn.errors import UserError
from markup_fakes import identity, reverse, upper
from test_documents_translate import WordTokenizer

docx = pytest.importorskip("docx")
pptx = pytest.importorskip("pptx")
odf = pytest.importorskip("odf")
ebooklib = pytest.importorskip("ebooklib")
srt = pytest.importorskip("srt")


class WordsBackend:
    """A :class:`~aiayn.decode.request.Backend` translating each line with ``rule`` (a
    :mod:`markup_fakes` translator: its alignment is exact); records its calls."""

    name = "words"

    def __init__(self, rule: Callable[[str], Translation] = upper) -> None:
        self.rule = rule
        self.tokenizer, self.config = WordTokenizer(), SimpleNamespace(max_len=200)
        self.progress = None
        self.calls: list[list[str]] = []

    def translate(
        self, lines: Sequence[LineLike], options: DecodeOptions, wanted: Wanted = TEXT
    ) -> list[Translation]:
        lines = as_lines(lines)
        self.calls.append([line.text for line in lines])
        return [self.rule(line.text) for line in lines]


def translated(data: bytes, name: str, rule=upper) -> tuple[bytes, WordsBackend, object]:
    backend = WordsBackend(rule)
    source = read_file(data, name)
    result = source.translate(DocumentTranslator(backend, language="en"), DecodeOptions(beam=1))
    assert len(backend.calls) == 1  # one stream for the whole file
    assert result.sentences == len(backend.calls[0]) and result.characters == source.characters
    return result.data, backend, source


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def same_except(before: bytes, after: bytes, rewritten: set[str]) -> None:
    """Every member but ``rewritten`` byte for byte, in the same order with the same compression."""
    old, new = members(before), members(after)
    assert list(old) == list(new)
    with zipfile.ZipFile(io.BytesIO(before)) as a, zipfile.ZipFile(io.BytesIO(after)) as b:
        assert [i.compress_type for i in a.infolist()] == [i.compress_type for i in b.infolist()]
    assert {name for name in old if old[name] != new[name]} == rewritten


def png() -> bytes:
    """A 1x1 PNG."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0\xff\0\0"))
        + chunk(b"IEND", b"")
    )


# ---------------------------------------------------------------------------------------------
# docx


def make_docx() -> bytes:
    from docx.opc.constants import RELATIONSHIP_TYPE
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = "The header says hello."
    p = document.add_paragraph("The ")
    p.add_run("quick").bold = True
    p.add_run(" brown fox ")
    p.add_run("jumps").italic = True
    p.add_run(" over the dog.")
    p.add_run().add_tab()
    p.add_run("Next line")
    p.runs[-1].add_break()
    p.add_run("is here.")
    link = OxmlElement("w:hyperlink")
    link.set(
        qn("r:id"), p.part.relate_to("https://example.org", RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    )
    run = OxmlElement("w:r")
    text = OxmlElement("w:t")
    text.text = "a link"
    run.append(text)
    link.append(run)
    p.add_run(" See ")
    p._p.append(link)
    p.add_run(" now.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "left cell"
    table.cell(0, 1).text = "right cell"
    document.add_picture(io.BytesIO(png()))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_docx_text_runs_links_tables_and_header_are_translated_with_their_formatting() -> None:
    source = make_docx()
    data, backend, _ = translated(source, "report.docx")
    document = docx.Document(io.BytesIO(data))
    p = document.paragraphs[0]
    assert p.text == "THE QUICK BROWN FOX JUMPS OVER THE DOG.\tNEXT LINE\nIS HERE. SEE A LINK NOW."
    assert [r.text for r in p.runs if r.bold] == ["QUICK"]
    assert [r.text for r in p.runs if r.italic] == ["JUMPS"]
    w = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
    link = p._p.find(f".//{w}hyperlink")
    assert "".join(t.text for t in link.iter(f"{w}t")) == "A LINK"
    assert [c.text for c in document.tables[0].rows[0].cells] == ["LEFT CELL", "RIGHT CELL"]
    assert document.sections[0].header.paragraphs[0].text == "THE HEADER SAYS HELLO."
    assert len(document.inline_shapes) == 1
    rewritten = {"word/document.xml", "word/header1.xml"} & set(members(source))
    same_except(source, data, rewritten)


def test_docx_formatting_follows_the_words_it_was_on() -> None:
    data, _, _ = translated(make_docx(), "report.docx", rule=reverse)
    p = docx.Document(io.BytesIO(data)).paragraphs[0]
    assert [r.text for r in p.runs if r.bold] == ["quick"]
    assert " ".join(p.text.split()).startswith("dog. the over jumps fox brown quick The")


def test_a_docx_field_moves_whole_and_its_result_stays() -> None:
    from docx.oxml import parse_xml

    document = docx.Document()
    p = document.add_paragraph("Page ")
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    for part in (
        '<w:fldChar w:fldCharType="begin"/>',
        '<w:instrText xml:space="preserve"> PAGE </w:instrText>',
        '<w:fldChar w:fldCharType="separate"/>',
        "<w:t>1</w:t>",
        '<w:fldChar w:fldCharType="end"/>',
    ):
        p._p.append(parse_xml(f"<w:r {w}>{part}</w:r>"))
    p.add_run(" of the report.")
    out = io.BytesIO()
    document.save(out)
    data, _, _ = translated(out.getvalue(), "f.docx")
    xml = members(data)["word/document.xml"].decode()
    assert "PAGE </w:instrText>" in xml and "<w:t>1</w:t>" in xml
    order = [xml.find(f'w:fldCharType="{k}"') for k in ("begin", "separate", "end")]
    assert -1 < order[0] < order[1] < order[2]
    assert docx.Document(io.BytesIO(data)).paragraphs[0].text.split() == ["PAGE", "1", "OF", "THE", "REPORT."]


def test_a_source_file_translates_again_from_its_bytes() -> None:
    source = read_file(make_docx(), "a.docx")
    translator = DocumentTranslator(WordsBackend(), language="en")
    first = source.translate(translator, DecodeOptions(beam=1)).data
    assert source.translate(translator, DecodeOptions(beam=1)).data == first


def test_identity_gives_back_the_file_byte_for_byte() -> None:
    for name, data in [
        ("a.docx", make_docx()),
        ("a.pptx", make_pptx()),
        ("a.odt", make_odt()),
        ("a.epub", make_epub()),
    ]:
        assert translated(data, name, rule=identity)[0] == data, name


# ---------------------------------------------------------------------------------------------
# pptx


def make_pptx() -> bytes:
    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Hello world."
    body = slide.placeholders[1].text_frame
    body.text = "First point."
    paragraph = body.add_paragraph()
    paragraph.add_run().text = "A "
    bold = paragraph.add_run()
    bold.text = "bold"
    bold.font.bold = True
    paragraph.add_run().text = " word and a "
    link = paragraph.add_run()
    link.text = "link"
    link.hyperlink.address = "https://example.org"
    paragraph.add_run().text = " here."
    slide.notes_slide.notes_text_frame.text = "Speaker notes."
    slide.shapes.add_picture(io.BytesIO(png()), 0, 0)
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def test_pptx_titles_bodies_bold_links_and_notes() -> None:
    source = make_pptx()
    data, _, _ = translated(source, "deck.pptx")
    slide = pptx.Presentation(io.BytesIO(data)).slides[0]
    assert slide.shapes.title.text == "HELLO WORLD."
    paragraphs = slide.placeholders[1].text_frame.paragraphs
    assert paragraphs[0].text == "FIRST POINT."
    assert paragraphs[1].text == "A BOLD WORD AND A LINK HERE."
    assert [r.text for r in paragraphs[1].runs if r.font.bold] == ["BOLD"]
    assert [(r.text, r.hyperlink.address) for r in paragraphs[1].runs if r.hyperlink.address] == [
        ("LINK", "https://example.org")
    ]
    assert slide.notes_slide.notes_text_frame.text == "SPEAKER NOTES."
    names = members(source)
    rewritten = {n for n in names if re.fullmatch(r"ppt/(slides/slide|notesSlides/notesSlide)\d+\.xml", n)}
    same_except(source, data, rewritten)


# ---------------------------------------------------------------------------------------------
# odt


def make_odt() -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.style import Style, TextProperties
    from odf.text import A, LineBreak, P, Span, Tab

    document = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    p = P(text="The ")
    p.addElement(Span(stylename=bold, text="quick"))
    p.addText(" brown fox")
    p.addElement(Tab())
    p.addText("jumps over ")
    p.addElement(A(href="https://example.org", text="the dog"))
    p.addText(".")
    p.addElement(LineBreak())
    p.addText("New line.")
    document.text.addElement(p)
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def test_odt_spans_links_tabs_and_line_breaks() -> None:
    from odf.opendocument import load
    from odf.teletype import extractText
    from odf.text import A, P, Span

    source = make_odt()
    data, _, _ = translated(source, "letter.odt")
    document = load(io.BytesIO(data))
    p = document.getElementsByType(P)[0]
    assert extractText(p) == "THE QUICK BROWN FOX\tJUMPS OVER THE DOG.\nNEW LINE."
    assert [str(s) for s in document.getElementsByType(Span)] == ["QUICK"]
    assert [str(a) for a in document.getElementsByType(A)] == ["THE DOG"]
    same_except(source, data, {"content.xml"})
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        first = archive.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED


def test_odp_text_boxes_and_notes() -> None:
    from odf.draw import Frame, TextBox
    from odf.opendocument import load
    from odf.presentation import Notes
    from odf.teletype import extractText
    from odf.text import P, Span

    p = P(text="Slide ")
    p.addElement(Span(text="text"))
    p.addText(" here.")
    document, page = odp_page(p)
    notes = Notes()
    notes_frame = Frame(width="10cm", height="2cm", x="1cm", y="1cm")
    notes_box = TextBox()
    notes_box.addElement(P(text="Say this."))
    notes_frame.addElement(notes_box)
    notes.addElement(notes_frame)
    page.addElement(notes)
    document.presentation.addElement(page)
    out = io.BytesIO()
    document.write(out)
    source = out.getvalue()
    data, _, _ = translated(source, "talk.odp")
    texts = [extractText(p) for p in load(io.BytesIO(data)).getElementsByType(P)]
    assert texts == ["SLIDE TEXT HERE.", "SAY THIS."]
    same_except(source, data, {"content.xml"})


# ---------------------------------------------------------------------------------------------
# epub


def make_epub() -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("id1")
    book.set_title("A book")
    book.set_language("en")
    chapter = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    chapter.content = (
        "<html><body><h1>Chapter one</h1><p>The <b>quick</b> fox.<br/>It <a href='two.xhtml'>runs</a>"
        " far.</p><pre>code stays</pre><p translate='no'>Not this.</p></body></html>"
    )
    book.add_item(chapter)
    book.add_item(epub.EpubItem(uid="img", file_name="pic.png", media_type="image/png", content=png()))
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", chapter]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def test_epub_xhtml_stays_well_formed_with_markup_on_its_words() -> None:
    from lxml import etree

    source = make_epub()
    data, _, _ = translated(source, "book.epub")
    new = members(data)
    chapter = etree.fromstring(new["EPUB/one.xhtml"])  # well-formed XML
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    assert chapter.find(".//h:h1", ns).text == "CHAPTER ONE"
    p = chapter.find(".//h:p", ns)
    assert "".join(p.itertext()) == "THE QUICK FOX.IT RUNS FAR."
    assert p.find("h:b", ns).text == "QUICK" and p.find("h:a", ns).text == "RUNS"
    assert p.find("h:br", ns) is not None
    assert chapter.find(".//h:pre", ns).text == "code stays"
    assert "".join(chapter.findall(".//h:p", ns)[1].itertext()) == "Not this."
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        first = archive.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
    rewritten = {"EPUB/one.xhtml", "EPUB/nav.xhtml"}
    same_except(source, data, rewritten)
    book = ebooklib.epub.read_epub(io.BytesIO(data))
    assert book.get_item_with_href("pic.png").content == png()


# ---------------------------------------------------------------------------------------------
# srt and text


SUBTITLES = """1
00:00:01,000 --> 00:00:02,500
Hello there,
<i>my friend</i>.

2
00:00:03,000 --> 00:00:04,000
Second cue.
"""


def test_srt_cues_keep_numbers_timings_lines_and_tags() -> None:
    data, _, _ = translated(SUBTITLES.encode(), "film.srt")
    cues = list(srt.parse(data.decode()))
    before = list(srt.parse(SUBTITLES))
    assert [(c.index, c.start, c.end) for c in cues] == [(c.index, c.start, c.end) for c in before]
    assert cues[0].content == "HELLO THERE,\n<i>MY FRIEND</i>." and cues[1].content == "SECOND CUE."


def test_text_html_and_markdown_files_and_their_byte_order_mark() -> None:
    assert translated(b"\xef\xbb\xbfOne. Two.\n", "a.txt")[0] == b"\xef\xbb\xbfONE. TWO.\n"
    assert translated(b"<p>A <b>b</b> c.</p>", "a.html")[0] == b"<p>A <b>B</b> C.</p>"
    assert translated(b"# Title\n\nSome *text*.\n", "a.md")[0] == b"# TITLE\n\nSOME *TEXT*.\n"


# ---------------------------------------------------------------------------------------------
# bad input


def error(data, name: str, limits: FileLimits = DEFAULT_LIMITS) -> str:
    with pytest.raises(UserError) as caught:
        read_file(data, name, limits)
    message = str(caught.value)
    assert "\n" not in message
    return message


def zipped(entries: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_what_is_refused_is_said_in_one_line() -> None:
    assert "supported: .txt" in error(b"x", "a.pdf")
    assert "not UTF-8" in error(b"caf\xe9", "a.txt")
    assert "binary" in error(b"a\x00b", "a.txt")
    assert "not a zip" in error(b"%PDF-1.4 ...", "a.docx")
    assert "no word/document.xml" in error(zipped({"a.txt": b"x"}), "a.docx")
    assert "password-protected" in error(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 100, "a.docx")
    assert "not well-formed" in error(zipped({"word/document.xml": b"<w:document"}), "a.docx")
    assert "more than the 10 allowed" in error(b"x" * 11, "a.txt", FileLimits(max_bytes=10))
    assert "characters to translate" in error(b"word " * 10, "a.txt", FileLimits(max_characters=5))
    assert "zip members" in error(
        zipped({f"{i}": b"" for i in range(5)}), "a.docx", FileLimits(max_members=4)
    )
    bomb = zipped({"word/document.xml": b"<a/>", "big": b"\0" * 3_000_000})
    assert "zip bomb" in error(bomb, "a.docx")
    assert "unpacked" in error(bomb, "a.docx", FileLimits(max_unpacked_bytes=1_000_000))
    assert "not SubRip" in error(b"not subtitles at all", "a.srt")
    assert "not an EPUB" in error(zipped({"mimetype": b"text/plain"}), "a.epub")
    assert "OpenDocument" in error(zipped({"mimetype": b"application/epub+zip"}), "a.odt")


def test_a_directory_that_understates_its_sizes_is_stopped_at_the_limit() -> None:
    data = bytearray(zipped({"word/document.xml": b"<a/>", "big": b"\0" * 600_000}))
    # make the central directory say the big member is tiny: its file size field (offset 24)
    at = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, at + 24, 10)
    message = error(bytes(data), "a.docx", FileLimits(max_unpacked_bytes=100_000))
    assert "unpacked" in message or "cannot be read" in message


@pytest.mark.parametrize("name", ["a.docx", "a.pptx", "a.odt", "a.epub", "a.srt", "a.html", "a.md", "a.txt"])
def test_garbled_and_truncated_files_raise_only_user_errors(name: str) -> None:
    makers = {".docx": make_docx, ".pptx": make_pptx, ".odt": make_odt, ".epub": make_epub}
    extension = name[1:]
    good = (
        makers[extension]()
        if extension in makers
        else (SUBTITLES.encode() if extension == ".srt" else b"<p>A b.</p>")
    )
    import random

    rng = random.Random(0)
    variants = [good[:n] for n in (0, 1, 10, len(good) // 3, len(good) // 2, len(good) - 1)]
    for _ in range(12):
        garbled = bytearray(good)
        for _ in range(rng.randint(1, 20)):
            garbled[rng.randrange(len(garbled))] = rng.randrange(256)
        variants.append(bytes(garbled))
    if extension in makers:  # members garbled inside a sound zip
        for member, content in members(good).items():
            variants.append(zipped({**members(good), member: content[: len(content) // 2]}))
    for data in variants:
        try:
            source = read_file(data, name)
        except UserError as err:
            assert "\n" not in str(err)
            continue
        source.translate(DocumentTranslator(WordsBackend(), language="en"), DecodeOptions(beam=1))


def test_every_extension_has_a_kind_read() -> None:
    assert set(EXTENSIONS.values()) == {
        "text",
        "html",
        "markdown",
        "docx",
        "pptx",
        "odt",
        "odp",
        "epub",
        "srt",
    }


# ---------------------------------------------------------------------------------------------
# the command


def test_aiayn_translate_file_with_the_tiny_model(tiny_translation_run, tmp_path, capsys) -> None:
    from aiayn.cli import main

    document = docx.Document()
    p = document.add_paragraph("4213")
    p.add_run(" ")
    p.add_run("77").bold = True
    source = tmp_path / "numbers.docx"
    document.save(source)
    out = tmp_path / "words.docx"
    run = ["translate", "--checkpoint", str(tiny_translation_run), "--device", "cpu", "--beam", "1"]
    assert main([*run, "--file", str(source), "--out", str(out)]) == 0
    assert "numbers.docx -> " in capsys.readouterr().err
    text = docx.Document(out).paragraphs[0].text
    assert text and not any(c.isdigit() for c in text)  # digits -> words
    same_except(source.read_bytes(), out.read_bytes(), {"word/document.xml"})


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--file", "a.docx"], "--file: needs --out"),
        (["--out", "b.docx"], "--out: needs --file"),
        (["--file", "a.docx", "--out", "a.docx"], "is --file itself"),
        (["--file", "a.docx", "--out", "b.odt"], "must have the extension"),
        (["--file", "a.docx", "--out", "b.docx", "--format", "html"], "--format: not with --file"),
        (["--file", "a.docx", "--out", "b.docx", "--nbest", "2"], "--nbest: not with --file"),
        (["--file", "a.docx", "--out", "b.docx", "--input", "x"], "--input: not with --file"),
        (["--file", "a.docx", "--out", "b.docx", "--output", "x"], "--output: not with --file"),
    ],
)
def test_the_file_flags_refused_in_one_line(flags, said, tmp_path, capsys, monkeypatch) -> None:
    from aiayn.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["translate", "--checkpoint", "nowhere", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_without_the_files_extra_a_zipped_file_says_how_to_install_it(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "lxml", None)
    for module in ("package", "ooxml", "mixed", "subtitles"):
        monkeypatch.delitem(sys.modules, f"aiayn.documents.files.{module}", raising=False)
    assert "pip install 'aiayn[files]'" in error(make_docx(), "a.docx")
    assert read_file(b"One.", "a.txt").characters == 4  # the text formats need no extra


# ---------------------------------------------------------------------------------------------
# hostile input: refused (or read) cheaply

_W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def word_parts(parts: dict[str, bytes], **extra: bytes) -> bytes:
    """A docx of one sentence and ``parts`` (``word/header1.xml``: its XML inside ``w:hdr``)."""
    body = f"<w:document {_W}><w:body><w:p><w:r><w:t>Hi.</w:t></w:r></w:p></w:body></w:document>"
    entries = {"word/document.xml": body.encode()}
    entries.update({name: f"<w:hdr {_W}>".encode() + xml + b"</w:hdr>" for name, xml in parts.items()})
    return zipped({**entries, **extra})


def test_headers_of_empty_paragraphs_under_a_megabyte_are_refused_as_a_zip_bomb() -> None:
    import time

    from aiayn.documents.files import TooLarge

    started = time.perf_counter()
    bomb = word_parts({f"word/header{i}.xml": b"<w:p/>" * 166_000 for i in range(5)})
    assert len(bomb) < 20_000
    with pytest.raises(TooLarge, match="zip bomb"):
        read_file(bomb, "a.docx")
    # one member over 64 KB is enough; so is a zip whose small members together are
    assert "zip bomb" in error(word_parts({"word/header1.xml": b"<w:p/>" * 20_000}), "a.docx")
    many = word_parts({f"word/header{i}.xml": b"<w:p/>" * 10_000 for i in range(100)})
    assert "unpacks" in error(many, "a.docx") and "times its size" in error(many, "a.docx")
    assert time.perf_counter() - started < 5  # 4.7 s and 100 MB for the first one alone, before


def test_the_xml_parsed_is_limited() -> None:
    data = word_parts({"word/header1.xml": b"<w:p><w:r><w:t>Some text.</w:t></w:r></w:p>" * 100})
    assert read_file(data, "a.docx").characters == 3 + 1000
    with pytest.raises(UserError, match="bytes of XML allowed") as caught:
        read_file(data, "a.docx", FileLimits(max_xml_bytes=2_000))
    from aiayn.documents.files import TooLarge

    assert isinstance(caught.value, TooLarge)


def test_paragraphs_without_text_are_never_built(monkeypatch) -> None:
    from aiayn.documents.files import ooxml

    built = []
    init = ooxml.OfficeParagraph.__init__

    def counting(self, *args, **kwargs) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(ooxml.OfficeParagraph, "__init__", counting)
    empty = b"<w:p/><w:p><w:r/><w:r><w:t> </w:t></w:r></w:p><w:p><w:pPr/><w:r><w:tab/></w:r></w:p>"
    data = word_parts({"word/header1.xml": empty * 1000 + b"<w:p><w:r><w:t>Text.</w:t></w:r></w:p>"})
    source = read_file(data, "a.docx")
    assert source.characters == len("Hi.") + len("Text.") and len(built) == 2


def random_png(width: int, height: int) -> bytes:
    """A PNG of random pixels: compressed no further by the zip."""
    import random

    rng = random.Random(0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\0" + rng.randbytes(3 * width) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows, 1))
        + chunk(b"IEND", b"")
    )


def test_real_documents_pass_the_zip_bomb_checks() -> None:
    document = docx.Document()
    said = "Paragraph {} says something about the weather and the sea."
    for k in range(400):
        document.add_paragraph(said.format(k))
        if k % 50 == 0:
            document.add_paragraph("")  # empty ones too
    document.add_picture(io.BytesIO(random_png(700, 700)))  # 1.5 MB, compressed already
    out = io.BytesIO()
    document.save(out)
    assert len(out.getvalue()) > 1_000_000
    source = read_file(out.getvalue(), "a.docx")
    assert source.characters == sum(len(said.format(k)) for k in range(400))
    data, _, _ = translated(out.getvalue(), "a.docx")
    assert docx.Document(io.BytesIO(data)).paragraphs[0].text == said.format(0).upper()


def test_a_huge_subtitle_time_is_one_line_and_any_failure_of_a_format_is_too(monkeypatch) -> None:
    timed = b"1\n99999999999999:00:00,000 --> 99999999999999:00:01,000\nHello.\n"
    assert "not SubRip" in error(timed, "a.srt")  # srt's OverflowError
    from aiayn.documents.files import subtitles

    def broken(*_args) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr(subtitles, "Subtitles", broken)
    message = error(SUBTITLES.encode(), "film.srt")
    assert message.startswith("film.srt: cannot be read") and "KeyError" in message


def test_rewrapping_a_cue_of_many_lines_takes_near_linear_time() -> None:
    import time

    from aiayn.documents.files.subtitles import rewrap

    text = " ".join(f"word{k}" for k in range(20_000))
    started = time.perf_counter()
    out = rewrap(text, 10_000)
    assert time.perf_counter() - started < 1  # about 8 s before (quadratic), 0.02 s now
    assert out.count("\n") == 9_999 and out.replace("\n", " ") == text
    assert rewrap("one two three four", 2) == "one two\nthree four"
    assert rewrap("<i>one two</i> three four five", 3) == "<i>one two</i>\nthree\nfour five"


def test_characters_are_counted_as_the_model_sees_them() -> None:
    from aiayn.documents.files.types import characters, squeezed

    assert squeezed("  a \n\t b  ") == "a b" and characters("  a \n\t b  ") == 3
    assert read_file(b"  One.\n\n  Two  words.\n", "a.txt").characters == len("One. Two words.")


def odp_page(paragraph):
    """A presentation of one page whose one text box holds ``paragraph``; the document and the page
    (the presentation holds the page only once the caller adds it)."""
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation
    from odf.style import MasterPage, PageLayout

    document = OpenDocumentPresentation()
    layout = PageLayout(name="L")
    document.automaticstyles.addElement(layout)
    master = MasterPage(name="M", pagelayoutname=layout)
    document.masterstyles.addElement(master)
    page = Page(masterpagename=master)
    frame = Frame(width="10cm", height="2cm", x="1cm", y="1cm")
    box = TextBox()
    box.addElement(paragraph)
    frame.addElement(box)
    page.addElement(frame)
    return document, page


def odp_bytes() -> bytes:
    from odf.text import P

    document, page = odp_page(P(text="Slide   text here."))
    document.presentation.addElement(page)
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


@pytest.mark.parametrize(
    "name, first",
    [
        ("a.docx", "The quick brown fox jumps over the dog. Next line is here. See a link now.\nleft cell"),
        ("a.pptx", "Hello world.\nFirst point.\nA bold word and a link here.\nSpeaker notes."),
        ("a.odt", "The quick brown fox jumps over the dog. New line."),
        ("a.odp", "Slide text here."),
        ("a.epub", None),
        ("a.srt", "Hello there, my friend.\nSecond cue."),
        ("a.txt", "One. Two\nthree.\nFour."),
        ("a.html", "A b c.\nSecond."),
        ("a.md", "Title\nSome text."),
    ],
)
def test_a_source_files_sample_is_the_start_of_its_text(name: str, first: str | None) -> None:
    data = {
        "a.docx": make_docx,
        "a.pptx": make_pptx,
        "a.odt": make_odt,
        "a.odp": odp_bytes,
        "a.epub": make_epub,
        "a.srt": SUBTITLES.encode,
        "a.txt": lambda: b"\xef\xbb\xbfOne.   Two\nthree.\n\n  Four.\n",
        "a.html": lambda: b"<p>A <b>b</b>\n c.</p><p>Second.</p>",
        "a.md": lambda: b"# Title\n\nSome *text*.\n",
    }[name]()
    source = read_file(data, name)
    sample = source.sample()
    if first is None:  # EPUB: its chapter's heading, paragraph
        assert "Chapter one\nThe quick fox." in sample and "code stays" not in sample
    else:
        assert sample.startswith(first), sample
    if name != "a.txt":  # the sample is the text counted, one run a line
        assert sum(len(line) for line in sample.splitlines()) == source.characters
    assert source.sample(10) == sample[:10] and source.sample(0) == ""
    source.translate(DocumentTranslator(WordsBackend(), language="en"), DecodeOptions(beam=1))
    assert source.sample() == sample  # the source's text still, after a translation


def test_a_long_files_sample_is_cut_at_its_limit() -> None:
    source = read_file(("A sentence here. " * 50 + "\n").encode() * 1000, "a.txt")
    assert len(source.sample()) == 2000 and len(source.sample(5000)) == 5000


def test_a_deeply_nested_opendocument_is_read_in_linear_time() -> None:
    import time

    ns = (
        'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"'
    )
    inner = (
        b"<x>" * 200
        + b"<text:p><text:span/></text:p>" * 20_000
        + b"<text:p>Deep <text:span>text</text:span>.</text:p>"
        + b"</x>" * 200
    )
    content = f"<office:document-content {ns}><office:body><office:text>".encode()
    content += inner + b"</office:text></office:body></office:document-content>"
    odt = zipped(
        {"mimetype": b"application/vnd.oasis.opendocument.text", "content.xml": content}, zipfile.ZIP_STORED
    )
    started = time.perf_counter()
    source = read_file(odt, "deep.odt")  # each paragraph looked up through its 200 ancestors: 8 s before
    assert source.characters == len("Deep text.") and time.perf_counter() - started < 2
    data, _, _ = translated(odt, "deep.odt")
    assert b"<text:p>DEEP <text:span>TEXT</text:span>.</text:p>" in members(data)["content.xml"]
