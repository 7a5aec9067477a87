"""Typed entities in a request: the kind of thing a file name, a path, a URL or an email
address is, written beside it (:func:`annotate`), so the request names what the tool it needs
works on.

"save the headlines into notes.md" asks for a tool that writes a *file*, but neither the model
nor BM25 reads "notes.md" as one: its words are "notes" and "md", and "papers.md" pulls tools
about papers. With the type word beside the entity ("into notes.md file") the request matches
file tools both ways; a URL gets "web page" (or "file" when its path ends in one), a path
"folder", an address "email address". Only the kind is added: the entity itself stays, so a
tool that names it still matches. A bare domain gets nothing: "arxiv.org" names a service as
often as a site.

A file a request saves into, or moves, is a step of its own (:func:`implied_steps`): "find
arXiv papers about RAG and write the titles into papers.md" needs a tool that writes a file,
which the words of that request ("titles", "papers") do not find.
"""

from __future__ import annotations

import functools
import re

#: File extensions common in requests to agents: documents, data, code, media, archives.
_EXTENSIONS = (
    "txt|md|csv|tsv|json|jsonl|ya?ml|xml|pdf|docx?|xlsx?|pptx?|png|jpe?g|gif|svg|webp|html?|"
    "py|ipynb|sh|log|env|ini|toml|sql|db|sqlite|zip|tar|gz|mp3|mp4|wav|mov"
)
_END = r"""(?=[,;:.!?)\]"'’]*(?:\s|$))"""  # what may follow an entity: punctuation, a space
_ENTITY = re.compile(
    r"(?:"
    r"(?<![\w.+-])(?P<email>[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63}){0,7}\.[a-z]{2,24})"
    r"(?![\w.-]*\w)"
    rf"|(?P<url>\b[a-z][a-z0-9+.-]{{0,31}}://\S+?){_END}"
    rf"|(?<![\w@/.:-])(?P<file>(?:~|\.{{1,2}})?/?(?:[\w.-]+/)*[\w-][\w.-]*\.(?:{_EXTENSIONS}))"
    r"(?![\w/])"
    r"|(?<![\w.:/])(?P<path>(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]+)*/?)(?![\w/])"
    r""")(?P<quote>["'’]?)""",
    re.IGNORECASE,
)
#: A URL whose path ends in a file's extension is a file to fetch, not a page.
_FILE_URL = re.compile(rf"\.(?:{_EXTENSIONS})$", re.IGNORECASE)
_KIND = {"email": "email address", "url": "web page", "file": "file", "path": "folder"}
#: What a request that saves into a file, or moves one, implies, as a request of its own.
WRITE_FILE = "write a file"
MOVE_FILE = "move a file"
_SAVE_VERBS = "save|write|store|export|dump|output|append"
_MOVE_VERBS = "move|rename"
_SAVING = re.compile(rf"\b(?:{_SAVE_VERBS})\b", re.IGNORECASE)
#: "move old_data.csv", "rename the file report_v2.docx": the file right after the verb.
_MOVING = re.compile(
    rf"\b(?:{_MOVE_VERBS})\s+(?:(?:the|a|an|my|our|your|this|that|local|file)\s+){{0,4}}$",
    re.IGNORECASE,
)
_STEP_VERB = re.compile(rf"\b(?:{_SAVE_VERBS}|{_MOVE_VERBS})\b", re.IGNORECASE)
#: "to", "into" or "as" right before the file, a few words such as "a new file called" between.
_DESTINATION = re.compile(
    r"\b(?:into|onto|to|as)\s+(?:(?:the|a|an|my|our|your|new|local|file|called|named)\s+){0,4}$",
    re.IGNORECASE,
)
#: How far before a file its saving verb may stand (one request: the decomposer's part).
_WINDOW_CHARS = 200


@functools.lru_cache(maxsize=4096)
def annotate(text: str) -> str:
    """``text`` with the kind of each file name, path, URL and email address written after it
    ("read todo.txt" -> "read todo.txt file"); unchanged when it has none. Memoized: a turn
    annotates its request to embed it and again to score it."""
    return _ENTITY.sub(_with_kind, text)


def implied_steps(request: str) -> list[str]:
    """The steps ``request`` implies without asking for them in so many words:
    :data:`WRITE_FILE` when it saves into a file ("save a summary to notes.md", "write the
    titles into papers.md", "save it as talk.txt"), :data:`MOVE_FILE` when it moves or renames
    one ("move old_data.csv into it"). A file the request reads from or edits in place implies
    nothing: "add a table to report.docx" is one step of a document tool."""
    if _STEP_VERB.search(request) is None:  # most requests: no need to look for files
        return []
    steps: list[str] = []
    for match in _ENTITY.finditer(request):
        if _kind(match) != "file":
            continue
        before = request[max(0, match.start() - _WINDOW_CHARS) : match.start()]
        if _MOVING.search(before):
            steps.append(MOVE_FILE)
        destination = _DESTINATION.search(before)
        if destination is not None and _SAVING.search(before[: destination.start()]):
            steps.append(WRITE_FILE)
    return list(dict.fromkeys(steps))


def _kind(match: re.Match[str]) -> str:
    found = next(name for name in _KIND if match.group(name) is not None)
    if found == "url" and _FILE_URL.search(match.group("url")):
        return "file"
    return found


def _with_kind(match: re.Match[str]) -> str:
    kind = _KIND[_kind(match)]
    following = match.string[match.end() : match.end() + len(kind) + 1].lower()
    if following.strip() == kind or following.startswith(f" {kind}"):
        return match.group(0)  # "the file notes.md file" reads worse, not better
    return f"{match.group(0)} {kind}"
