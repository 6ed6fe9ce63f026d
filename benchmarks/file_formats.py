"""Which library reads and writes each file format of ``aiayn translate --file`` (issue 52).

For each zipped format there is a real choice between the format's own library (python-docx,
python-pptx, odfpy, ebooklib) and lxml on the XML members that hold the text, the zip copied member
by member. For SubRip, between ``srt`` and ``pysrt`` (when importable; ``--extra-path DIR`` adds a
folder where it was installed, e.g. ``pip install --target DIR pysrt``). On a generated document
of ``--paragraphs`` paragraphs (three sentences each, bold and italic words, a link) this measures:

* **round trip**: what a load and a save with no change gives back: the members whose bytes differ,
  whether the member order and compression are kept (the requirement: everything not translated
  comes back as it was);
* **load + save** (ms): the library: open, visit every paragraph's runs, save; lxml: the zip read
  within limits, the text members parsed, every paragraph's inline content built
  (:class:`~aiayn.documents.markup.InlineBuilder`), serialized, the zip written;
* **translate** (ms, and per sentence): the whole of :func:`aiayn.documents.files.read_file` +
  :meth:`~aiayn.documents.files.SourceFile.translate` with a translation that changes every word
  (upper case) aligned word for word, no model: what a file costs on top of the model.

Medians of ``--repeat`` interleaved rounds (every candidate once a round), wall time. Writes
``benchmarks/results/file_formats.json``.

    .venv/bin/python benchmarks/file_formats.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

from aiayn.decode.request import Translation, as_lines
from aiayn.decode.search import DecodeOptions
from aiayn.documents.files import read_file
from aiayn.documents.translate import DocumentTranslator
from common import command, machine, versions

SENTENCES = (
    ("The ", "quick", " brown fox jumps over the lazy dog near the river bank."),
    ("It was a ", "bright", " cold day in April, and the clocks were striking thirteen."),
    ("Call me ", "Ishmael", " said the man, and he walked slowly into the old harbour town."),
)


class UpperBackend:
    """Every word upper-cased, aligned to itself (a Backend with no model)."""

    name = "upper"

    def __init__(self) -> None:
        self.tokenizer = SimpleNamespace(
            encode=lambda text, target=False: text.split(),
            encode_batch=lambda texts, threads=-1, target=False: [t.split() for t in texts],
        )
        self.config, self.progress = SimpleNamespace(max_len=256), None

    def translate(self, lines, options, wanted=None):
        out = []
        for line in as_lines(lines):
            words = line.text.split()
            out.append(Translation(line.text.upper(), tuple((i, i) for i in range(len(words)))))
        return out


# ---------------------------------------------------------------------------------------------
# Documents


def make_docx(paragraphs: int) -> bytes:
    import docx

    document = docx.Document()
    for k in range(paragraphs):
        p = document.add_paragraph()
        for before, word, after in SENTENCES:
            p.add_run(before)
            run = p.add_run(word)
            run.bold, run.italic = k % 2 == 0, k % 2 == 1
            p.add_run(after + " ")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_pptx(paragraphs: int) -> bytes:
    import pptx

    presentation = pptx.Presentation()
    for s in range(max(1, paragraphs // 10)):
        slide = presentation.slides.add_slide(presentation.slide_layouts[1])
        slide.shapes.title.text = f"Slide {s}"
        frame = slide.placeholders[1].text_frame
        for k in range(10):
            p = frame.paragraphs[0] if k == 0 else frame.add_paragraph()
            for before, word, after in SENTENCES:
                p.add_run().text = before
                run = p.add_run()
                run.text, run.font.bold = word, True
                p.add_run().text = after + " "
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def make_odt(paragraphs: int) -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.style import Style, TextProperties
    from odf.text import P, Span

    document = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    for _ in range(paragraphs):
        p = P()
        for before, word, after in SENTENCES:
            p.addText(before)
            p.addElement(Span(stylename=bold, text=word))
            p.addText(after + " ")
        document.text.addElement(p)
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def make_epub(paragraphs: int) -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("bench")
    book.set_title("Bench")
    book.set_language("en")
    chapters = []
    for c in range(max(1, paragraphs // 50)):
        body = "".join(
            "<p>" + " ".join(f"{b}<b>{w}</b>{a}" for b, w, a in SENTENCES) + "</p>" for _ in range(50)
        )
        chapter = epub.EpubHtml(title=f"C{c}", file_name=f"c{c}.xhtml", lang="en")
        chapter.content = f"<html><body><h1>Chapter {c}</h1>{body}</body></html>"
        book.add_item(chapter)
        chapters.append(chapter)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def make_srt(cues: int) -> bytes:
    blocks = []
    for k in range(cues):
        start, end = k * 3, k * 3 + 2
        before, word, after = SENTENCES[k % 3]
        blocks.append(
            f"{k + 1}\n00:{start // 60:02d}:{start % 60:02d},000 --> 00:{end // 60:02d}:{end % 60:02d},500\n"
            f"{before}<i>{word}</i>\n{after.strip()}\n"
        )
    return "\n".join(blocks).encode()


def as_office_writes(data: bytes) -> bytes:
    """The zip with each XML member's declaration as Microsoft Office writes it (double quotes, CRLF
    after it): a file that the library did not write itself."""
    import re

    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for info in source.infolist():
            content = source.read(info)
            if info.filename.endswith((".xml", ".rels")):
                content = re.sub(
                    rb"^<\?xml[^>]*\?>\s*",
                    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\r\n',
                    content,
                )
            target.writestr(info, content)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------
# The libraries' load + save


def docx_library(data: bytes) -> bytes:
    import docx

    document = docx.Document(io.BytesIO(data))
    for p in document.paragraphs:
        for run in p.runs:
            run.text = run.text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def pptx_library(data: bytes) -> bytes:
    import pptx

    presentation = pptx.Presentation(io.BytesIO(data))
    for slide in presentation.slides:
        for shape in slide.shapes:
            if shape.has_text_frame:
                for p in shape.text_frame.paragraphs:
                    for run in p.runs:
                        run.text = run.text
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def odt_library(data: bytes) -> bytes:
    from odf import teletype
    from odf.opendocument import load
    from odf.text import P

    document = load(io.BytesIO(data))
    for p in document.getElementsByType(P):
        teletype.extractText(p)
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


def epub_library(data: bytes) -> bytes:
    import ebooklib
    from ebooklib import epub

    path = Path("/tmp/file_formats_bench.epub")
    path.write_bytes(data)
    book = epub.read_epub(str(path))
    for item in book.get_items_of_type(ebooklib.ITEM_DOCUMENT):
        item.get_content()
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def lxml_load_save(data: bytes, name: str) -> bytes:
    """The zip read, the text members parsed into paragraphs, serialized, the zip written."""
    from aiayn.documents.files import DEFAULT_LIMITS
    from aiayn.documents.files.mixed import epub_members, odf_members
    from aiayn.documents.files.ooxml import docx_members, pptx_members
    from aiayn.documents.files.package import read_zip, serialize_xml

    kind = name.rsplit(".", 1)[1]
    archive = read_zip(data, name, kind, DEFAULT_LIMITS)
    members = {
        "docx": lambda: docx_members(archive, name),
        "pptx": lambda: pptx_members(archive, name),
        "odt": lambda: odf_members(archive, name, "odt"),
        "epub": lambda: epub_members(archive, name),
    }[kind]()
    changed = {m.name: serialize_xml(m.tree, archive.contents[m.name]) for m in members}
    return archive.written(changed)


def srt_library(data: bytes) -> bytes:
    import srt

    cues = list(srt.parse(data.decode()))
    return srt.compose(cues, reindex=False).encode()


def pysrt_library(data: bytes) -> bytes:
    import pysrt

    cues = pysrt.from_string(data.decode())
    out = io.StringIO()
    cues.write_into(out)
    return out.getvalue().encode()


def ours(data: bytes, name: str) -> tuple[bytes, int]:
    source = read_file(data, name)
    result = source.translate(DocumentTranslator(UpperBackend(), language="en"), DecodeOptions(beam=1))
    return result.data, result.sentences


# ---------------------------------------------------------------------------------------------
# Measuring


def round_trip(before: bytes, after: bytes) -> dict:
    """What a load + save with no change did to the zip."""
    with zipfile.ZipFile(io.BytesIO(before)) as a, zipfile.ZipFile(io.BytesIO(after)) as b:
        old = {i.filename: (a.read(i), i.compress_type) for i in a.infolist()}
        new = {i.filename: (b.read(i), i.compress_type) for i in b.infolist()}
        return {
            "identical_file": before == after,
            "members": len(old),
            "members_changed": sorted(n for n in old if n in new and old[n][0] != new[n][0]),
            "members_lost": sorted(set(old) - set(new)),
            "members_added": sorted(set(new) - set(old)),
            "order_kept": [n for n in a.namelist()] == [n for n in b.namelist() if n in old],
            "compression_kept": all(old[n][1] == new[n][1] for n in old if n in new),
        }


def interleaved(candidates: dict, repeat: int) -> dict[str, float]:
    """Median milliseconds of each candidate over ``repeat`` rounds, every candidate once a round."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, function in candidates.items():
            start = time.perf_counter()
            function()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(values), 2) for name, values in times.items()}


def lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paragraphs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--extra-path", help="a folder to import more candidates from (pysrt)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "file_formats.json")
    args = parser.parse_args()
    if args.extra_path:
        sys.path.append(args.extra_path)
    n = args.paragraphs
    made = {
        "docx": (as_office_writes(make_docx(n)), docx_library),
        "pptx": (as_office_writes(make_pptx(n)), pptx_library),
        "odt": (make_odt(n), odt_library),
        "epub": (make_epub(n), epub_library),
    }
    formats: dict[str, dict] = {}
    for kind, (data, library) in made.items():
        name = f"bench.{kind}"
        _, sentences = ours(data, name)
        formats[kind] = {
            "bytes": len(data),
            "sentences": sentences,
            "round_trip": {
                "library": round_trip(data, library(data)),
                "lxml": round_trip(data, lxml_load_save(data, name)),
            },
            "load_save_ms": interleaved(
                {
                    "library": lambda d=data, f=library: f(d),
                    "lxml": lambda d=data, k=name: lxml_load_save(d, k),
                },
                args.repeat,
            ),
        }
        translate = interleaved({"ours": lambda d=data, k=name: ours(d, k)}, args.repeat)["ours"]
        formats[kind]["translate_ms"] = translate
        formats[kind]["translate_ms_per_sentence"] = round(translate / sentences, 3)
        print(
            kind,
            json.dumps(formats[kind]["load_save_ms"]),
            formats[kind]["round_trip"]["library"]["members_changed"],
        )
    subtitles = make_srt(3 * n)
    candidates = {"srt": lambda: srt_library(subtitles)}
    try:
        import pysrt  # noqa: F401

        candidates["pysrt"] = lambda: pysrt_library(subtitles)
    except ImportError:
        pass
    srt_result = {
        "cues": 3 * n,
        "parse_compose_ms": interleaved(candidates, args.repeat),
        "round_trip_identical": {
            name: (srt_library if name == "srt" else pysrt_library)(subtitles) == subtitles
            for name in candidates
        },
    }
    _, sentences = ours(subtitles, "bench.srt")
    srt_result["translate_ms"] = interleaved({"ours": lambda: ours(subtitles, "bench.srt")}, args.repeat)[
        "ours"
    ]
    srt_result["translate_ms_per_sentence"] = round(srt_result["translate_ms"] / sentences, 3)
    formats["srt"] = srt_result
    print("srt", json.dumps(srt_result))
    libraries = {}
    for package in ("lxml", "srt", "pysrt", "python-docx", "python-pptx", "odfpy", "EbookLib"):
        try:
            libraries[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            libraries[package] = None
    result = {
        "command": command(),
        "versions": versions(**{k: v for k, v in libraries.items() if v}),
        "machine": {**machine(), "lscpu_model_name": lscpu_model()},
        "paragraphs": n,
        "repeat": args.repeat,
        "formats": formats,
    }
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
