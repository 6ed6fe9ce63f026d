"""Read by mypy, not run (tests/test_architecture.py): every engine, what stands before one in the
server, and the tests' fake documents backend are :class:`~aiayn.decode.request.Backend` s."""

from aiayn.decode.backends import CTranslate2Backend
from aiayn.decode.request import Backend
from aiayn.decode.translator import Translator
from aiayn.serve.documents import BatchedBackend
from test_documents_translate import FakeBackend


def engines(a: Translator, b: CTranslate2Backend, c: BatchedBackend, d: FakeBackend) -> list[Backend]:
    return [a, b, c, d]
