"""Data: corpus reading and validation, SentencePiece subwords, token batching, built-in task.

Text flows ``read_parallel`` → ``Tokenizer`` → ``encode_corpus`` (filter by length) →
``TokenBatchSampler`` + ``collate`` → :class:`Batch` (padded ids, batch first). For training, the
same steps run once in :func:`aiayn.data.prepare.prepare` (sampled tokenizer, parallel encoding),
and :class:`aiayn.data.prepared.PreparedSplit` serves the pairs from the files it wrote.
"""

from aiayn.data.batching import (
    Batch,
    TokenBatchSampler,
    collate,
    example_sizes,
    iterate_batches,
    make_batches,
    padding_share,
)
from aiayn.data.corpus import CorpusStats, encode_corpus, filter_by_length, list_corpus, read_parallel
from aiayn.data.download import download_multi30k
from aiayn.data.synthetic import make_task, number_to_words, write_task
from aiayn.data.tokenizer import Tokenizer

__all__ = [
    "Batch",
    "CorpusStats",
    "TokenBatchSampler",
    "Tokenizer",
    "collate",
    "download_multi30k",
    "encode_corpus",
    "example_sizes",
    "filter_by_length",
    "iterate_batches",
    "list_corpus",
    "make_batches",
    "make_task",
    "number_to_words",
    "padding_share",
    "read_parallel",
    "write_task",
]
