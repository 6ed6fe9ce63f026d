"""Lexical constraints for beam search: target token sequences (a glossary's terms) that a translation
must contain, each exactly as often as it is asked for, placed where their source words are translated.

The search is Post & Vilar's (2018) *dynamic beam allocation* in Hu et al.'s (2019) vectorized form,
guided by the model's own alignment (as Hasler et al., 2018, use attention to place constraints):

* **Candidates.** A hypothesis is extended not only by its best tokens but also by the token that
  continues a constraint it has begun and the first token of each constraint it has not met.
* **Banks.** The candidates are put in banks by how many constraint tokens they have produced (met
  terms count whole, a term under way by its tokens so far), and the beam is filled from the banks in
  turn (the best of each bank, the fullest bank first, then the second best of each, ...), so that
  hypotheses that have met more constraints survive beside better-scored ones that have met fewer.
  The beam is the user's ``beam`` plus one slot per constraint token (:func:`beam_for`); the user's
  ``beam`` slots go first to the best candidates by score, as plain beam search would keep them.
  An EOS ends a hypothesis where this allocation gives it one of the beam's places (a bank's best
  ends even when ``beam`` hypotheses that have met fewer terms score better).
* **The alignment guide** (:func:`guide`; when the step function gives its cross-attention, as the
  model's do with ``attention_layer``): a term is *due* where the source word the decoder attends to
  most (one decoder layer, heads averaged, as :mod:`aiayn.decode.align` reads alignments) is one of
  its source term's words; a term asked twice is due at its second place once met once. A
  hypothesis that moves past the place without the term (for :data:`PATIENCE` steps: the term was
  due and is no longer, or the word attended is :data:`BEYOND` words or more after the place), or
  that begins a term where it is not due (and has not passed it), *misplaces* it:
  :data:`PLACE_PENALTY` off its score, and one more in its ``misplaced`` count, which ranks before
  the score (``Hypothesis.rank``: terms met, fewer misplaced, score). A term that is never due is
  still met: beginning it anywhere is allowed, at that cost.
* **No sentence end before the terms**: neither EOS nor a piece that ends a sentence (``ends``: ``.``
  ``!`` ``?`` ...) while a term is unmet, unless it is that term's own next piece. Without this rule
  the cheapest place for a term the model would not choose is after the sentence's full stop.

What a hypothesis has met is read off its tokens as it grows, with each term's automaton (the
Knuth-Morris-Pratt one: the longest end of the output that begins the term), in tensors for every
row and term at once:

* EOS is allowed only once every term is met (except at the maximum length, where EOS is forced and
  the finished hypotheses are ranked by the terms they meet, then as above);
* a term met as often as asked cannot be completed once more ("exactly once" for a term asked once);
* right after a term, a piece that would continue its last word is not allowed (``continues``: the
  pieces that do not start a word), so the term stays a whole word.

Sentences never interact (each row reads its own sentence's terms), so the search stays
batch-invariant. ``benchmarks/terminology.py`` measures it on terms the model would not choose;
``benchmarks/README.md`` has the record (and why the allocation keeps the user's beam by score).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch
from torch import Tensor

NEG_INF = float("-inf")
PLACE_PENALTY = 10.0  # log-probability lost for a term away from its source words (:func:`guide`)
BEYOND = 3  # attending this many words or more after a term's place is moving past it, as leaving it is
PATIENCE = 3  # the steps a hypothesis may be past a term's place, without it, before the term is passed
Terms = Sequence[Sequence[int]]  # one sentence's constraints: token sequences, repeats allowed


def total_tokens(terms: Terms) -> int:
    """How many tokens the constraints need (a repeated term counts each time)."""
    return sum(len(term) for term in terms)


def beam_for(beam: int, terms: Terms) -> int:
    """The beam a sentence with ``terms`` is searched with: ``beam`` slots kept by score, and one
    more for each constraint token (the banks' room)."""
    return beam + total_tokens(terms)


def _borders(term: Sequence[int], width: int) -> list[list[bool]]:
    """``[p][k - 1]``: after matching ``p`` tokens of ``term``, may a match of ``k`` tokens end at
    the next token (``term[:k-1]`` ends ``term[:p]``)? The automaton's transitions, minus the token."""
    term = list(term)
    return [
        [k - 1 <= p and k <= len(term) and term[: k - 1] == term[p - k + 1 : p] for k in range(1, width + 1)]
        for p in range(width)
    ]


class Constraints:
    """The constraints of a batch's sentences as tensors: ``terms`` ``(n, C, L)`` (distinct terms,
    -1 padded), ``lengths`` ``(n, C)`` (0: no term), ``need`` ``(n, C)`` (how often each is asked),
    ``borders`` ``(n, C, L, L)``. ``continues`` ``(V,)`` bool: the pieces that continue a word;
    ``ends`` ``(V,)`` bool: the pieces that end a sentence (none while a term is unmet), kept as
    their ids ``(E,)``.

    ``places``: each sentence's source places of its terms (a list per term, as ``per_sentence``:
    the source words, counted as the source pieces count them, where that term's source term is)
    and ``words`` ``(n, S)`` the source word of each source position (-1: none, as EOS and padding):
    the alignment guide (:func:`guide`); None: no guide."""

    def __init__(
        self,
        per_sentence: Sequence[Terms],
        continues: Tensor | None,
        device,
        *,
        ends: Tensor | None = None,
        places: Sequence[Sequence[Sequence[int]]] | None = None,
        words: Tensor | None = None,
    ) -> None:
        counted = [Counter(tuple(t) for t in terms if t) for terms in per_sentence]
        n, c = len(counted), max((len(c) for c in counted), default=0) or 1
        width = max((len(t) for terms in counted for t in terms), default=0) or 1
        self.terms = torch.full((n, c, width), -1, dtype=torch.long)
        self.need = torch.zeros((n, c), dtype=torch.long)
        self.borders = torch.zeros((n, c, width, width), dtype=torch.bool)
        for s, terms in enumerate(counted):
            for j, (term, count) in enumerate(terms.items()):
                self.terms[s, j, : len(term)] = torch.tensor(term)
                self.need[s, j] = count
                self.borders[s, j] = torch.tensor(_borders(term, width))
        self.lengths = (self.terms >= 0).sum(dim=-1)  # (n, C)
        self.terms, self.need, self.lengths = (
            self.terms.to(device),
            self.need.to(device),
            self.lengths.to(device),
        )
        self.borders = self.borders.to(device)
        self.tokens = (self.need * self.lengths).sum(dim=-1)  # (n,) constraint tokens of each sentence
        self.banks = int(self.tokens.max()) + 1 if n else 1
        self.continues = continues.to(device) if continues is not None else None
        self.ends = ends.nonzero()[:, 0].to(device) if ends is not None else None
        self.places: Tensor | None = None  # (n, C, W + 1) bool: the source words of each term
        self.words: Tensor | None = None  # (n, S): each source position's word, W where none
        if places is not None and words is not None:
            self._place(per_sentence, counted, places, words.to(device))

    def _place(self, per_sentence, counted, places, words: Tensor) -> None:
        """``places`` ``(n, C, R, W + 1)``: the source words of each term's occurrences, in source
        order (the k-th is due once the term is met k times); ``words`` with W for no word."""
        width = max(int(words.max()) + 1, 1)
        self.words = words.masked_fill(words < 0, width)
        repeats = max((count for terms in counted for count in terms.values()), default=1)
        self.places = torch.zeros((len(counted), self.terms.size(1), repeats, width + 1), dtype=torch.bool)
        for s, (terms, spans) in enumerate(zip(per_sentence, places)):
            index = {term: j for j, term in enumerate(counted[s])}
            found = sorted((min(span, default=width), tuple(t), span) for t, span in zip(terms, spans) if t)
            seen: Counter = Counter()
            for _, term, span in found:
                j, k = index[term], seen[term]
                self.places[s, j, k, [w for w in span if 0 <= w < width]] = True
                seen[term] += 1
        self.places = self.places.to(words.device)

    def rows(self, sentences: Tensor) -> "Constraints":
        """The constraints of the given sentence indices (a view for the rows that remain)."""
        out = object.__new__(Constraints)
        out.terms, out.need, out.lengths = (
            self.terms[sentences],
            self.need[sentences],
            self.lengths[sentences],
        )
        out.borders, out.banks, out.continues = self.borders[sentences], self.banks, self.continues
        out.tokens, out.ends = self.tokens[sentences], self.ends
        guided = self.places is not None and self.words is not None
        out.places = self.places[sentences] if guided else None
        out.words = self.words[sentences] if guided else None
        return out


class State:
    """What each of N hypotheses has met: ``count`` ``(N, C)`` completed occurrences of each term,
    ``partial`` ``(N, C)`` tokens of each matched so far, ``ended`` ``(N,)`` a term ended at the
    last token; the guide's (:func:`guide`) ``due`` ``(N, C)``, each term's source words attended
    when the last token was chosen, ``passed`` ``(N, C)``, their place left without the term,
    ``misplaced`` ``(N,)``, the terms placed away from their source words (passed, or begun early),
    ``away`` ``(N, C)``, the steps in a row each open term has been away from its place, and
    ``seen`` ``(N, C)``, each term due at some step (of its next occurrence)."""

    def __init__(
        self,
        count: Tensor,
        partial: Tensor,
        ended: Tensor,
        due: Tensor,
        passed: Tensor,
        misplaced: Tensor,
        away: Tensor | None = None,
        seen: Tensor | None = None,
    ) -> None:
        self.count, self.partial, self.ended = count, partial, ended
        self.due, self.passed, self.misplaced = due, passed, misplaced
        self.away = torch.zeros_like(count) if away is None else away
        self.seen = torch.zeros_like(count, dtype=torch.bool) if seen is None else seen

    @classmethod
    def start(cls, rows: int, terms: int, device) -> "State":
        zeros = torch.zeros((rows, terms), dtype=torch.long, device=device)
        no = torch.zeros((rows, terms), dtype=torch.bool, device=device)
        none = torch.zeros(rows, dtype=torch.long, device=device)
        return cls(zeros, zeros.clone(), none.bool(), no, no.clone(), none, zeros.clone())

    def select(self, rows: Tensor) -> "State":
        return State(
            self.count[rows],
            self.partial[rows],
            self.ended[rows],
            self.due[rows],
            self.passed[rows],
            self.misplaced[rows],
            self.away[rows],
            self.seen[rows],
        )


def advance(c: Constraints, state: State, tokens: Tensor) -> State:
    """The state after each row of ``state`` (N rows, ``c`` holding one sentence per row) produces
    each of ``tokens`` ``(N, M)``: a state of ``N * M`` rows, row-major."""
    n, m = tokens.shape
    match = c.terms[:, None] == tokens[:, :, None, None]  # (N, M, C, L) term position k-1 is the token
    index = state.partial[:, :, None, None].expand(-1, -1, 1, c.borders.size(-1))
    allowed = c.borders.gather(2, index)[:, :, 0]  # (N, C, L) matches that may end at the next token
    ok = match & allowed[:, None]  # (N, M, C, L)
    steps = torch.arange(1, ok.size(-1) + 1, device=tokens.device)
    partial = (ok * steps).amax(dim=-1)  # (N, M, C) the longest match ending here
    done = (partial == c.lengths[:, None]) & (c.lengths[:, None] > 0)  # a term completed
    count = state.count[:, None] + done.long()
    partial = partial.masked_fill(done, 0)
    kept = (state.due, state.passed, state.misplaced, state.away, state.seen)
    due, passed, misplaced, away, seen = (x.repeat_interleave(m, dim=0) for x in kept)
    done = done.reshape(n * m, -1)  # a term met: its next occurrence's place is new
    due, passed, seen, away = due & ~done, passed & ~done, seen & ~done, away.masked_fill(done, 0)
    count, partial = count.reshape(n * m, -1), partial.reshape(n * m, -1)
    return State(count, partial, done.any(dim=-1), due, passed, misplaced, away, seen)


def met(c: Constraints, state: State) -> Tensor:
    """``(N,)`` the constraint occurrences met (a term asked twice and met once: 1)."""
    return torch.minimum(state.count, c.need).sum(dim=-1)


def bank(c: Constraints, state: State) -> Tensor:
    """``(N,)`` constraint tokens produced: met terms whole, plus the longest one under way."""
    done = (torch.minimum(state.count, c.need) * c.lengths).sum(dim=-1)
    under_way = state.partial.masked_fill(state.count >= c.need, 0).amax(dim=-1)
    return done + under_way


def unmet(c: Constraints, state: State) -> Tensor:
    """``(N,)`` some term is not met as often as asked."""
    return (state.count < c.need).any(dim=-1)


def restrict(
    c: Constraints, state: State, log_probs: Tensor, free: Tensor, eos: int, offered: Tensor | None = None
) -> Tensor:
    """In place, on the rows where ``free`` ``(N,)`` (not forced to a token): no EOS and no piece that
    ends a sentence (``c.ends``, unless it is the next piece of an unmet term) while a term is unmet,
    no completing a term met as often as asked, no piece continuing a term's last word."""
    rows = free & unmet(c, state)
    log_probs[rows, eos] = NEG_INF
    if c.ends is not None and c.ends.numel() and bool(rows.any()):
        terms = candidates(c, state) if offered is None else offered  # (N, 2C) a term's next piece may be one
        ban = rows[:, None] & ~(terms[:, :, None] == c.ends[None, None]).any(dim=1)  # (N, E)
        log_probs[:, c.ends] = log_probs[:, c.ends].masked_fill(ban, NEG_INF)
    last = c.terms.gather(2, (c.lengths - 1).clamp(min=0)[:, :, None])[:, :, 0]  # (N, C)
    full = (state.count >= c.need) & (state.partial == c.lengths - 1) & (c.lengths > 0) & free[:, None]
    row, term = full.nonzero(as_tuple=True)
    log_probs[row, last[row, term]] = NEG_INF
    if c.continues is not None:
        ended = (free & state.ended).nonzero()[:, 0]
        if ended.numel():
            log_probs[ended[:, None], c.continues.nonzero()[:, 0][None]] = NEG_INF
    return log_probs


def guide(c: Constraints, state: State, attention: Tensor) -> tuple[Tensor, Tensor]:
    """The alignment guide at this step, from ``attention`` ``(N, S)`` (each row's cross-attention
    for the token it chooses now): a term is *due* where the source word attended most is one of its
    source words. A row is *away* from an open term's place (unmet, not begun) when the term is not
    due now but was due before (and not since), or when the word attended is :data:`BEYOND` words or
    more after the place; after :data:`PATIENCE` steps away in a row the term is *passed* (so that
    reordering, "a city street" for "Straße ... Stadt", costs nothing: the attention comes back).
    Updates ``state.due``/``away``/``passed``/``seen``, and returns ``(left, early)``: ``left`` ``(N,)``
    how many terms each row has passed at this step, ``early`` ``(N, C)`` the terms that beginning now
    would put away from their place (not due, and not passed: a passed term may still come late, its
    penalty paid)."""
    if c.places is None or c.words is None:
        none = torch.zeros_like(state.due)
        return torch.zeros(state.due.size(0), dtype=torch.long, device=state.due.device), none
    mass = torch.zeros(attention.size(0), c.places.size(-1), dtype=attention.dtype, device=attention.device)
    mass.scatter_add_(1, c.words, attention)  # (N, W + 1) the attention of each source word
    best = mass.argmax(dim=-1)  # (N,) the last column: no word (EOS, padding)
    occurrence = state.count.clamp(max=c.places.size(2) - 1)  # (N, C) the occurrence due next
    places = c.places.gather(2, occurrence[:, :, None, None].expand(-1, -1, 1, c.places.size(-1)))[:, :, 0]
    due = places.gather(2, best[:, None, None].expand(-1, places.size(1), 1))[:, :, 0]  # (N, C)
    open_ = (state.count < c.need) & (state.partial == 0) & (c.lengths > 0)
    words = places[:, :, :-1]  # (N, C, W) the column "no word" left out
    last = words.long().cumsum(dim=-1).argmax(dim=-1)  # (N, C) the place's last word
    beyond = (best[:, None] >= last + BEYOND) & (best[:, None] < words.size(-1)) & words.any(dim=-1)
    away = open_ & ~due & (state.seen | beyond)  # due before (a term begun and broken off too)
    state.away = torch.where(away, state.away + 1, torch.zeros_like(state.away))
    left = (state.away >= PATIENCE) & open_ & ~state.passed  # passed now, counted once
    state.passed = state.passed | left
    state.due = due
    state.seen = state.seen | due
    return left.sum(dim=-1), open_ & ~due & ~state.passed


def candidates(c: Constraints, state: State) -> Tensor:
    """``(N, 2C)`` the tokens that advance each row's unmet terms (the next token of each, and each
    one's first), -1 where none; a token repeated in a row is given once."""
    open_ = (state.count < c.need) & (c.lengths > 0)  # (N, C)
    following = c.terms.gather(2, state.partial[:, :, None])[:, :, 0]
    tokens = torch.cat([following, c.terms[:, :, 0]], dim=1).masked_fill(~open_.repeat(1, 2), -1)
    same = tokens[:, :, None] == tokens[:, None, :]  # (N, 2C, 2C)
    earlier = torch.ones_like(same[0]).tril(-1)
    return tokens.masked_fill((same & earlier).any(dim=-1), -1)


def stripes(banks: Tensor, valid: Tensor, n_banks: int, by_score: Tensor) -> Tensor:
    """The order in which a sentence's candidates ``(n, M)`` (already sorted by score) fill the beam:
    a key per candidate, smaller first: the ``by_score`` ``(n,)`` best valid ones, then the best of
    each bank (fullest first), then the second best of each, ...; invalid candidates last."""
    one_hot = torch.nn.functional.one_hot(banks.clamp(0, n_banks - 1), n_banks) * valid[..., None]
    rank = (one_hot.cumsum(dim=1) - one_hot).gather(2, banks.clamp(0, n_banks - 1)[..., None])[..., 0]
    key = rank * n_banks + (n_banks - 1 - banks)
    place = valid.cumsum(dim=1) - 1  # (n, M) rank by score among the valid candidates
    first = valid & (place < by_score[:, None])
    key = torch.where(first, place - banks.size(1), key)  # negative: before every bank's
    return key.masked_fill(~valid, torch.iinfo(torch.long).max)
