"""``aiayn serve``: a JSON API and a web page over a trained model (FastAPI + uvicorn, the ``serve`` extra).

:mod:`aiayn.serve.app` builds the application, :mod:`aiayn.serve.batching` decodes the requests
that arrive together in one batch, :mod:`aiayn.serve.cli` is the command. The page lives in
``static/``.
"""
