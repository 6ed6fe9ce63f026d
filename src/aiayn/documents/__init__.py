"""Documents: text longer than a sentence, in a format, translated whole.

This layer sits above decoding. It knows formats (plain text, HTML, Markdown) and sentences: it
splits a document into sentences (:mod:`aiayn.documents.segment`), has them translated, and puts the
document back together around them. :mod:`aiayn.decode` stays sentence-level and knows no formats.
"""
