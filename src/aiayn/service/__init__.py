"""The models a process serves: which exist and what they translate (:mod:`.catalog`), which are
loaded within a memory budget (:mod:`.registry`), and how a language pair is reached, directly or
through a bridge language (:mod:`.router`, :mod:`.chain`). Used by ``aiayn serve``; knows no HTTP.
"""
