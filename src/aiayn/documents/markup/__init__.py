"""Inline markup carried through translation by word alignment.

The model translates plain text; the inline elements (bold words, links, line breaks, untranslated
code) are taken out before and put back after, each around the target words aligned to the source
words it covered. The alignment is the model's own: the cross-attention of its last decoder layer,
each target word linked to the source word it attends to most (:mod:`aiayn.decode.align`). This is
the alignment-based projection of tags ("detag and project") that Hanneman & Dinu (2020, "How Should
Markup Tags Be Translated?") compare with tags translated by the model, and that Zenkel, Wuebker &
DeNero (2021, "Automatic Bilingual Markup Transfer") build on; the rules for what an alignment leaves
open (crossing siblings, dropped words, zero-width elements, punctuation, whitespace, the source's
spelling) are this package's, one idea a module:

- :mod:`.inline`: the model, a run's plain text and its elements as character ranges over it;
- :mod:`.build`: building it from a run's content in document order (:class:`InlineBuilder`);
- :mod:`.project`: the words and pieces of the run and of its translation, aligned;
- :mod:`.place`: where each element goes in the translation;
- :mod:`.write`: the translation written with the markup (:func:`transfer`), and a document of
  literal text and runs (:class:`Assembled`).

Every element is written exactly once, and the result nests properly.
"""

from aiayn.documents.markup.build import InlineBuilder
from aiayn.documents.markup.inline import Element, Inline
from aiayn.documents.markup.write import Assembled, Run, transfer

__all__ = ["Assembled", "Element", "Inline", "InlineBuilder", "Run", "transfer"]
