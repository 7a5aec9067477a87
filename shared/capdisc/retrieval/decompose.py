"""Query decomposition: the separate requests of a query that chains several ("... Then ...
Finally ...", "read todo.txt and post it to slack"), so each can find a capability of its own
(:func:`decompose`).
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
#: Verbs a request starts with: "read todo.txt and post it to slack" chains two requests,
#: "search for cats and dogs" does not.
_ACTIONS = (
    "add|analy[sz]e|append|apply|archive|book|build|calculate|call|cancel|chart|check|clean|"
    "click|close|commit|compare|compile|compute|convert|copy|count|create|crawl|delete|deploy|"
    "describe|download|draft|draw|edit|email|export|extract|fetch|fill|filter|find|forward|"
    "generate|get|import|insert|install|invite|leave|list|load|locate|look|make|merge|message|"
    "move|notify|open|order|plot|post|print|publish|pull|push|put|read|record|remember|remove|"
    "rename|reply|report|reserve|restart|retrieve|review|run|save|schedule|scrape|search|send|"
    "set|share|show|sort|stage|start|stop|store|submit|summari[sz]e|sync|take|tell|translate|"
    "update|upload|verify|visit|wait|write"
)
_AND_ACTION = re.compile(rf"(?:,\s*|\s+)and\s+(?=(?:{_ACTIONS})\b)", re.IGNORECASE)
_MIN_SUBQUERY_WORDS = 3


def decompose(query: str, max_parts: int = 8) -> list[str]:
    """The separate requests of a query: sentences, then chained clauses ("and then ..."), then
    clauses joined by "and" before an action verb ("read todo.txt and post it to slack"; "search
    for cats and dogs" stays whole).

    Leading discourse markers ("Additionally,", "Finally,") are dropped, and so are fragments of
    fewer than three words. One part (or none) means the query is a single request. Memoized:
    a turn splits its query once to embed the parts and once to score them.
    """
    return list(_decompose(query, max_parts))


@functools.lru_cache(maxsize=4096)
def _decompose(query: str, max_parts: int) -> tuple[str, ...]:
    parts: list[str] = []
    for sentence in _SENTENCE.split(query):
        for chained in _CHAIN.split(sentence.strip()):
            for clause in _AND_ACTION.split(chained):
                text = _LEAD.sub("", clause.strip()).strip()
                if len(words(text)) >= _MIN_SUBQUERY_WORDS:
                    parts.append(text)
    return tuple(parts[:max_parts])
