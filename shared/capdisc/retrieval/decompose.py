"""Query decomposition: the separate requests of a query that chains several ("... Then ...
Finally ...", "read todo.txt and post it to slack"), so each can find a capability of its own
(:func:`decompose`).
"""

from __future__ import annotations

import functools
import re

from capdisc.retrieval.entities import implied_steps
from capdisc.retrieval.lexical import STOPWORDS, words

_SENTENCE = re.compile(r"(?<=[.!?;])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_CHAIN = re.compile(
    r"(?:[,;]\s*|\s+)(?:and then|after that|and also|and finally|and if so,?|if so,|then)\s+",
    re.IGNORECASE,
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
    "add|analy[sz]e|append|apply|approve|archive|assign|attach|book|build|buy|calculate|call|"
    "cancel|chart|check|clean|click|clone|close|comment|commit|compare|compile|compute|"
    "convert|copy|count|crawl|create|delete|deploy|describe|destroy|detect|disable|download|"
    "draft|draw|edit|email|enable|export|extract|fetch|fill|filter|find|follow|fork|forward|"
    "generate|get|identify|import|insert|install|invite|leave|list|load|locate|look|make|"
    "mark|merge|message|monitor|move|navigate|notify|open|order|parse|pay|pick|pin|plot|post|"
    "press|print|publish|pull|push|put|query|read|record|refund|register|remember|remove|"
    "rename|reply|report|reserve|resize|restart|retrieve|review|run|save|scan|schedule|"
    "scrape|scroll|search|select|send|set|share|show|sort|stage|start|stop|store|submit|"
    "summari[sz]e|sync|take|tell|test|track|transcribe|transfer|translate|trigger|turn|type|"
    "update|upload|validate|verify|view|visit|wait|watch|write"
)
#: A word that takes a pronoun as its object is a verb ("... and refund her"); a plural
#: noun ("files and folders it holds") is not taken for one.
_VERB_OBJECT = r"[a-z]*(?:ss|[a-rt-z])\s+(?:it|them|her|him|me|us)\b"
_NEXT_REQUEST = rf"(?:{_ACTIONS})\b|{_VERB_OBJECT}"
_AND_ACTION = re.compile(rf"(?:,\s*|\s+)and\s+(?={_NEXT_REQUEST})", re.IGNORECASE)
#: "open the page, fill in the form": a comma or colon before an action verb, which splits
#: only after a request ("With the Stripe API, refund ..." stays whole).
_COMMA_ACTION = re.compile(rf"[,:]\s*(?=(?:{_ACTIONS})\b)", re.IGNORECASE)
_MIN_SUBQUERY_WORDS = 3
#: The words of asking itself, beyond BM25's stop words (which hold "can you please ..."): a
#: part made only of them asks for nothing in particular.
_ASKING_WORDS = (
    "anything appreciate assist assistance get give glad great greatly hello help hi know let "
    "like need provide question questions request requests something us want yes"
)
_ASKING = STOPWORDS | frozenset(_ASKING_WORDS.split())
_REQUEST = re.compile(rf"^(?:{_ACTIONS})\b", re.IGNORECASE)
_BARE_VERB = re.compile(rf"^(?:{_ACTIONS})$", re.IGNORECASE)
#: Two words still make a request when they are an action on a pronoun ("... and merge it").
_SHORT_REQUEST = re.compile(
    rf"^(?:{_ACTIONS})\s+(?:it|them|her|him|me|us|this|that|these|those|all|everything)\W*$",
    re.IGNORECASE,
)


#: Quoted text: double quotes, curly quotes, and single quotes that are not apostrophes.
#: Unbounded (a quote cannot cross another), so quotes pair up in order however long.
_QUOTED = re.compile(
    r"\"[^\"\n]+\"|\u201c[^\u201d\n]+\u201d|\u2018[^\u2019\n]+\u2019|(?<![\w'])'[^'\n]+'(?![\w'])"
)
_SPLITTING = " \t,:;.!?"
_MASK = {ord(c): 0xE000 + i for i, c in enumerate(_SPLITTING)}
_UNMASK = {0xE000 + i: ord(c) for i, c in enumerate(_SPLITTING)}


def decompose(query: str, max_parts: int = 8, implied: bool = False) -> list[str]:
    """The separate requests of a query: sentences, then chained clauses ("and then ..."), then
    clauses joined by "and" before an action verb ("read todo.txt and post it to slack"; "search
    for cats and dogs" stays whole).

    Quoted text (a message to send, a name) is never split. Leading discourse markers
    ("Additionally,", "Finally,") are dropped, and so are fragments of fewer than three words.
    With ``implied``, the steps a request implies follow the requests
    ("... save it as talk.txt" -> "write a file":
    :func:`capdisc.retrieval.entities.implied_steps`). One part (or none) means the query is a
    single request. Memoized: a turn splits its query once to embed the parts and once to
    score them.
    """
    return list(_decompose(query, max_parts, implied))


@functools.lru_cache(maxsize=4096)
def _decompose(query: str, max_parts: int, implied: bool) -> tuple[str, ...]:
    parts: list[str] = []
    for sentence in _SENTENCE.split(_masked(query)):
        for chained in _CHAIN.split(sentence.strip()):
            for clause in _clauses(chained):
                text = _LEAD.sub("", _unmasked(clause).strip()).strip()
                if _is_request(text):
                    parts.append(text)
    if implied:
        steps = [step for part in parts for step in implied_steps(part)]
        parts += [step for step in dict.fromkeys(steps) if step not in parts]
    return tuple(parts[:max_parts])


def _masked(query: str) -> str:
    """``query`` with the spaces and punctuation of its quoted text (a message to send, a
    commit message, a name) moved to private-use characters, so no split happens inside it
    ('commit it as "docs: update readme"', 'post "build and deploy done"')."""
    core = query.strip()
    whole = _QUOTED.fullmatch(core)
    if whole is not None:  # the whole request in quotes: only the quotes inside it count
        start = query.index(core) + 1
        return (
            query[:start]
            + _masked(query[start : start + len(core) - 2])
            + query[start + len(core) - 2 :]
        )
    return _QUOTED.sub(lambda m: m.group(0).translate(_MASK), query)


def _unmasked(text: str) -> str:
    return text.translate(_UNMASK)


def _is_request(text: str) -> bool:
    """A part that asks for something: three words or more, or an action on a pronoun, and
    not only the words of asking ("Can you help me with that?")."""
    found = words(text)
    if not set(found) - _ASKING:
        return False
    return len(found) >= _MIN_SUBQUERY_WORDS or (
        len(found) == 2 and bool(_SHORT_REQUEST.match(text))
    )


def _clauses(text: str) -> list[str]:
    """``text`` split at "and" before a request, then at a comma or colon before an action
    verb where what precedes it is a request too."""
    out: list[str] = []
    for clause in _and_requests(text):
        pieces = _COMMA_ACTION.split(clause)
        current = pieces[0]
        for piece in pieces[1:]:
            if _REQUEST.match(_LEAD.sub("", current.strip())):
                out.append(current)
                current = piece
            else:
                current = f"{current}, {piece}"
        out.append(current)
    return out


def _and_requests(text: str) -> list[str]:
    """``text`` split at "and" before a request, except between two verbs that share their
    object ("detect and track objects", "track and record the sugar content")."""
    out, start = [], 0
    for match in _AND_ACTION.finditer(text):
        before = text[start : match.start()].split()
        if before and _BARE_VERB.match(before[-1]):  # not the end of a URL or path (".../list")
            continue
        out.append(text[start : match.start()])
        start = match.end()
    out.append(text[start:])
    return out
