"""Terminology, prefixes and confidence on a trained model (the built-in digits -> words task):
glossaries (files, matching, constrained translations), prefixes on both engines, the model's own
probabilities in the scores and the next choices, and `aiayn translate`'s flags."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from aiayn.cli import main
from aiayn.decode import DecodeOptions, Translator
from aiayn.decode.choices import next_choices
from aiayn.decode.glossary import check_glossary, read_glossary, targets
from aiayn.decode.request import Line, Wanted
from aiayn.errors import UserError
from aiayn.loading import load_translation_model

pytestmark = pytest.mark.xdist_group("served")  # on one worker with the other tests of the tiny served model

NUMBERS = ["42", "907042", "1042", "42"]
GLOSSARY = (("42", "seven"),)  # a word the model never writes for 42 ("forty-two")


@pytest.fixture(scope="module")
def loaded(tiny_translation_run: Path):
    model, tokenizer, _ = load_translation_model(tiny_translation_run)
    return model.eval(), tokenizer


CONFIDENCE = Wanted(confidence=True)


def translator(loaded, warnings=None, **options) -> Translator:
    model, tokenizer = loaded
    warn = warnings.append if warnings is not None else (lambda _: None)
    return Translator(model, tokenizer, warn=warn, **options)


def texts(translations) -> list[str]:
    return [translation.text for translation in translations]


# --- glossaries -----------------------------------------------------------------------------------


def test_glossary_files_are_read_and_bad_ones_name_the_line(tmp_path) -> None:
    good = tmp_path / "g.tsv"
    good.write_text("# terms\nHund\tdog\n\nNew York\tNueva York\n", encoding="utf-8")
    assert read_glossary(good) == (("Hund", "dog"), ("New York", "Nueva York"))
    for text, needle in [
        ("Hund dog\n", "line 1: expected"),
        ("a\tb\n\tc\n", "line 2"),
        ("# none\n", "no terms"),
    ]:
        (tmp_path / "bad.tsv").write_text(text, encoding="utf-8")
        with pytest.raises(UserError, match=needle):
            read_glossary(tmp_path / "bad.tsv")
    with pytest.raises(UserError, match="cannot read"):
        read_glossary(tmp_path / "missing.tsv")
    with pytest.raises(UserError, match="entry 2"):
        check_glossary([["a", "b"], ["c"]])


def test_terms_match_whole_words_in_any_case_the_longest_first() -> None:
    pairs = (("Hund", "dog"), ("York", "York"), ("New York", "New York City"))
    assert targets(pairs, "Der HUND und der hund, nicht Hunde.") == ["dog", "dog"]
    assert targets(pairs, "In New  York, not Yorkshire; York.") == ["New York City", "York"]
    assert targets((), "Hund") == []


def test_a_term_is_absent_without_the_glossary_and_present_exactly_once_with_it(loaded) -> None:
    plain = texts(translator(loaded, beam=4).translate(NUMBERS))
    assert plain[0] == "forty-two" and not any("seven" in text.split() for text in plain[:1])
    constrained = texts(translator(loaded, beam=4, glossary=GLOSSARY).translate(NUMBERS))
    for number, text in zip(NUMBERS, constrained):
        assert text.split().count("seven") == (
            1 if number == "42" else plain[NUMBERS.index(number)].split().count("seven")
        )
    # one line alone gives what it gives in the batch (the search is batch-invariant)
    assert [
        translator(loaded, beam=4, glossary=GLOSSARY).translate([n])[0].text for n in NUMBERS
    ] == constrained
    scored = translator(loaded, beam=4, glossary=GLOSSARY).translate(NUMBERS, wanted=CONFIDENCE)
    assert [s.terms for s in scored] == [(1, 1), (0, 0), (0, 0), (1, 1)]


def test_with_the_source_language_a_term_is_asked_for_in_its_inflected_forms(loaded) -> None:
    """``glossary_language``: "Hund" is asked for where the line holds "Hunde" (terms met 1 of 1);
    without it, only where the line holds "Hund" itself."""
    pairs, line, wanted = (("Hund", "seven"),), ["42 Hunde"], CONFIDENCE
    [plain] = translator(loaded, beam=4, glossary=pairs).translate(line, wanted=wanted)
    assert plain.terms == (0, 0) and "seven" not in plain.text.split()
    [inflected] = translator(loaded, beam=4, glossary=pairs, glossary_language="de").translate(
        line, wanted=wanted
    )
    assert inflected.terms == (1, 1) and inflected.text.split().count("seven") == 1


def once(text: str) -> list[str]:
    """The spans of words that ``text`` holds exactly once, in order."""
    words = text.split()
    spans = [" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)]
    return [span for span in spans if spans.count(span) == 1]


@pytest.mark.parametrize("line", ["42", "1042", "907042"])
def test_a_term_the_plain_search_already_writes_changes_nothing(loaded, line) -> None:
    """Metamorphic: for every span of words the plain translation holds once, a glossary asking for
    that span gives the same translation, now meeting its term; the same tokens of the same model have
    the same log-probabilities, so the same score (up to the rounding of a wider batch of rows)."""
    [plain] = translator(loaded, beam=4).translate([line], wanted=CONFIDENCE)
    expected = {
        "42": "forty-two",
        "1042": "one hundred twenty-two",
        "907042": "nine thousand seven hundred forty-two",
    }
    assert plain.text == expected[line]  # 1, 6 and 15 terms
    for term in once(plain.text):
        [held] = translator(loaded, beam=4, glossary=((line, term),)).translate([line], wanted=CONFIDENCE)
        assert (held.text, held.terms) == (plain.text, (1, 1)), term
        assert held.score == pytest.approx(plain.score, abs=1e-5), term


def test_where_a_term_the_plain_search_writes_does_change_the_translation(loaded) -> None:
    """Not a theorem, on two lines of this model. The constrained search is wider (4 + one slot per
    term token) and finds what the plain search finds at that width; and a term asked once is met
    exactly once, so a translation that holds it twice is barred."""
    [plain] = translator(loaded, beam=4).translate(["341001"], wanted=CONFIDENCE)
    width = 4 + len(loaded[1].encode("thirty-one", target=True))  # beam_for: 4 + its 3 pieces
    [wide] = translator(loaded, beam=width).translate(["341001"], wanted=CONFIDENCE)
    [held] = translator(loaded, beam=4, glossary=(("341001", "thirty-one"),)).translate(
        ["341001"], wanted=CONFIDENCE
    )
    assert (plain.text, wide.text, held.text) == (
        "thirty-one thousand one hundred one",
        "thirty-one",
        "thirty-one",
    )
    assert held.score == pytest.approx(wide.score, abs=1e-5) and held.score > plain.score
    [plain] = texts(translator(loaded, beam=4).translate(["80008"]))
    [held] = texts(translator(loaded, beam=4, glossary=(("80008", "eight"),)).translate(["80008"]))
    assert (plain, held) == ("eight hundred eight", "eight thousand eighty")


def test_terms_that_cannot_fit_warn_naming_the_line_and_as_many_as_fit_are_met(loaded) -> None:
    warnings: list[str] = []
    pairs = (("42", "seven"), ("42", "nine hundred"))  # the last entry for a term wins: "nine hundred"
    long = (("42", "one two three four five six seven eight nine ten"),)
    out = (
        translator(loaded, warnings, beam=2, max_len_a=0.0, max_len_b=3, glossary=long)
        .translate(["42"])[0]
        .text
    )
    assert any("line 1: its glossary terms need" in w and "0 of 1 kept" in w for w in warnings), warnings
    assert out  # still a translation
    short = translator(loaded, warnings, beam=2, glossary=pairs).translate(["42"])[0].text
    assert short.count("nine hundred") == 1
    assert "glossary: lines with terms are searched with beam 2 + one per term token" in warnings


def test_the_ctranslate2_engine_and_sampling_refuse_a_glossary() -> None:
    from aiayn.decode.backends import check_ct2_options

    with pytest.raises(UserError, match="glossary: the ctranslate2 engine has no lexical constraints"):
        check_ct2_options(DecodeOptions(glossary=GLOSSARY))
    with pytest.raises(UserError, match="glossary: constrains a search, not sampling"):
        DecodeOptions(sample=True, glossary=GLOSSARY)


# --- prefixes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam", [1, 4])
def test_a_prefix_is_kept_exactly_and_the_model_completes_it(loaded, beam) -> None:
    lines = [Line("907042", "nine hundred  six"), Line("907042"), Line("", "x")]
    out = texts(translator(loaded, beam=beam).translate(lines))
    assert out[0].startswith("nine hundred  six") and len(out[0]) > len("nine hundred  six")
    assert out[1] == translator(loaded, beam=beam).translate(["907042"])[0].text
    assert out[2] == ""  # a blank line stays blank, whatever its prefix


def test_a_prefix_gives_the_same_greedy_output_on_both_engines(tiny_translation_run, tmp_path) -> None:
    pytest.importorskip("ctranslate2")
    from aiayn.decode.backends import load_backend

    lines = [Line("907042", "nine hundred"), Line("1042", "one thousand one"), Line("55"), Line("")]
    options = DecodeOptions(beam=1)
    torch_out = texts(load_backend(tiny_translation_run, "torch").translate(lines, options))
    ct2 = load_backend(tiny_translation_run, "ctranslate2", ct2_dir=tmp_path / "ct2")
    assert texts(ct2.translate(lines, options)) == torch_out
    assert torch_out[1].startswith("one thousand one")
    scored = ct2.translate(lines, DecodeOptions(beam=1), CONFIDENCE)
    reference = load_backend(tiny_translation_run, "torch").translate(lines, options, CONFIDENCE)
    for a, b in zip(scored, reference):
        assert a.text == b.text and a.confidence == pytest.approx(b.confidence, abs=1e-3)


# --- confidence -----------------------------------------------------------------------------------


def teacher_forced(model, tokenizer, source: str, target_ids: list[int]) -> list[float]:
    """The model's own log-probability of each target token (EOS last), in one full forward pass."""
    config = model.config
    src = torch.tensor([tokenizer.encode(source) + [config.eos_id]])
    tgt = torch.tensor([[config.bos_id, *target_ids]])
    with torch.inference_mode():
        log_probs = model(src, tgt).float().log_softmax(dim=-1)[0]  # (T, V)
    return log_probs.gather(1, torch.tensor([*target_ids, config.eos_id])[:, None])[:, 0].tolist()


@pytest.mark.parametrize("beam", [1, 4])
def test_confidence_is_the_model_s_own_probability_of_its_words(loaded, beam) -> None:
    model, tokenizer = loaded
    lines = ["907042", "", "1042"]
    scored = translator(loaded, beam=beam).translate(lines, wanted=CONFIDENCE)
    assert scored[1].text == "" and scored[1].words == ()
    for line, result in zip(lines, scored):
        if not line:
            continue
        ids = tokenizer.encode(result.text, target=True)
        expected = teacher_forced(model, tokenizer, line, ids)
        assert result.length == len(expected)
        assert result.confidence == pytest.approx(sum(expected) / len(expected), abs=1e-4)
        assert result.probability == pytest.approx(math.exp(sum(expected) / len(expected)), rel=1e-4)
        words = result.text.split()
        assert [w for w, _ in result.words] == words
        assert math.prod(p for _, p in result.words) == pytest.approx(math.exp(sum(expected[:-1])), rel=1e-3)
        assert all(0 < p <= 1 for _, p in result.words)


def test_the_next_choices_are_the_model_s_softmax_and_sum_to_one_with_the_rest(loaded) -> None:
    model, tokenizer = loaded
    found = next_choices(model, tokenizer, "907042", "nine hundred", k=4)
    assert len(found.choices) == 4
    probabilities = [c.probability for c in found.choices]
    assert probabilities == sorted(probabilities, reverse=True)
    assert sum(probabilities) + found.rest == pytest.approx(1.0, abs=1e-6)
    config = model.config
    prefix = tokenizer.encode("nine hundred", target=True)
    src = torch.tensor([tokenizer.encode("907042") + [config.eos_id]])
    with torch.inference_mode():
        softmax = model(src, torch.tensor([[config.bos_id, *prefix]])).float().softmax(dim=-1)[0, -1]
    for choice in found.choices:
        assert choice.probability == pytest.approx(float(softmax[choice.token]), abs=1e-5)
        assert choice.end or choice.prefix.startswith("nine hundred")
    # taking the first choice: the greedy completion from its prefix continues with that piece
    best = found.choices[0]
    greedy = translator(loaded, beam=1).translate([Line("907042", "nine hundred")])[0].text
    assert greedy == best.prefix or greedy.startswith(best.prefix)


# --- aiayn translate ------------------------------------------------------------------------------


def lines_of(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_translate_glossary_prefix_and_scores_flags(tiny_translation_run, tmp_path, capsys) -> None:
    src = lines_of(tmp_path / "in.txt", ["42", "", "907042"])
    glossary = lines_of(tmp_path / "g.tsv", ["42\tseven"])
    prefixes = lines_of(tmp_path / "p.txt", ["", "", "nine hundred six"])
    run = ["translate", "--checkpoint", str(tiny_translation_run), "--input", str(src)]
    assert main([*run, "--glossary", str(glossary), "--prefix-file", str(prefixes), "--scores"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[1] == ""
    text, confidence, words = out[0].split(" ||| ")
    assert text.split().count("seven") == 1
    probability, log_prob = map(float, confidence.split())
    assert probability == pytest.approx(math.exp(log_prob), abs=1e-3) and 0 < probability <= 1
    assert len(words.split()) == len(text.split())
    assert out[2].startswith("nine hundred six")


def test_translate_finds_glossary_terms_inflected_in_the_source_language(
    tiny_translation_run, tmp_path, capsys
) -> None:
    """--source-lang de: "Hund" finds "Hunde"; the checkpoint's "digits" has no lemmas: its own form only."""
    src = lines_of(tmp_path / "in.txt", ["42 Hunde"])
    glossary = lines_of(tmp_path / "g.tsv", ["Hund\tseven"])
    run = ["translate", "--checkpoint", str(tiny_translation_run), "--input", str(src)]
    run += ["--glossary", str(glossary)]
    assert main(run) == 0
    assert "seven" not in capsys.readouterr().out.split()
    assert main([*run, "--source-lang", "de"]) == 0
    assert capsys.readouterr().out.split().count("seven") == 1


@pytest.mark.parametrize(
    "extra, needle",
    [
        (
            ["--glossary", "{g}", "--engine", "ctranslate2"],
            "--glossary: the ctranslate2 engine has no lexical",
        ),
        (["--glossary", "{g}", "--sample"], "glossary: constrains a search, not sampling"),
        (["--prefix-file", "{short}"], "--prefix-file: "),
        (["--scores", "--nbest", "2", "--beam", "2"], "--scores: for the best translation only"),
        (["--scores", "--format", "text"], "--scores: one output line per input line only"),
        (["--glossary", "{missing}"], "--glossary: cannot read"),
    ],
)
def test_translate_control_flags_refused_in_one_line(
    tiny_translation_run, tmp_path, capsys, extra, needle
) -> None:
    pytest.importorskip("ctranslate2")
    src = lines_of(tmp_path / "in.txt", ["42", "55"])
    files = {
        "g": lines_of(tmp_path / "g.tsv", ["42\tseven"]),
        "short": lines_of(tmp_path / "p.txt", ["x"]),
        "missing": tmp_path / "none.tsv",
    }
    flags = [flag.format(**files) for flag in extra]
    assert main(["translate", "--checkpoint", str(tiny_translation_run), "--input", str(src), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
