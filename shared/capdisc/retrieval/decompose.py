"""Query decomposition: the separate requests of a query that chains several ("... Then ...
Finally ..."), so each can find a capability of its own (:func:`decompose`).
"""

from __future__ import annotations

import functools
import re

from capdisc.retrieval.lexical import words

_SENTENCE = re.compile(r"(?<=[.!?;])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_CHAIN = re.compile(
    r"(?:[,;]\s*|\s+)(?:and then|after that|and also|and finally|then)\s+", re.IGNORECASE
)
_LEAD = re.compile(
    r"^(?:(?:and|also|additionally|furthermore|moreover|besides|then|next|finally|lastly|"
    r"first|firstly|second|secondly|third|thirdly|after that|afterwards|subsequently|"
    r"in addition|once (?:that|this) is done|after (?:this|that))\b[\s,:]*)+",
    re.IGNORECASE,
)
_MIN_SUBQUERY_WORDS = 3


def decompose(query: str, max_parts: int = 8) -> list[str]:
    """The separate requests of a query: sentences, then chained clauses ("and then ...").

    Leading discourse markers ("Additionally,", "Finally,") are dropped, and so are fragments of
    fewer than three words. One part (or none) means the query is a single request. Memoized:
    a turn splits its query once to embed the parts and once to score them.
    """
    return list(_decompose(query, max_parts))


@functools.lru_cache(maxsize=4096)
def _decompose(query: str, max_parts: int) -> tuple[str, ...]:
    parts: list[str] = []
    for sentence in _SENTENCE.split(query):
        for clause in _CHAIN.split(sentence.strip()):
            text = _LEAD.sub("", clause.strip()).strip()
            if len(words(text)) >= _MIN_SUBQUERY_WORDS:
                parts.append(text)
    return tuple(parts[:max_parts])
