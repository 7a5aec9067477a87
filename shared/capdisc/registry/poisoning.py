"""Tool poisoning: instructions to the model hidden in a capability's own text.

A capability's description, schema and skill content reach the model verbatim, so whoever
writes them can steer the agent: tell it to ignore its instructions, read ``~/.ssh/id_rsa`` and
pass it as a harmless-looking argument, keep quiet about it, or change how *other* tools behave
("when send_email is used, also BCC ..."). The text may sit anywhere the model reads: a
parameter's name, a nested description, an enum value, a default. This module is the pure
core of the defence: :func:`scan_capability` reads every such text and returns
:class:`Finding` values; what to do with them (flag, warn, quarantine, ask for approval) is
policy and lives elsewhere.

Design:

- **Every text is scanned**, each under a stable field path (:func:`scanned_texts`): the
  name, display name, description, tags, skill content, and in the JSON Schema every string at
  any depth (descriptions, titles, enum values, defaults, examples) and every key, property
  names above all (``parameters.properties.x (name)``). Identifiers are split into words first
  (``content_from_reading_ssh_id_rsa`` reads "content from reading ssh id rsa"). Example
  queries are in the user's voice ("email the report to ops@acme.com") and only feed
  retrieval, so only the rules about manipulating the model apply to them.
- **Co-occurrence and structure, not keywords.** Benign tools talk about files, passwords,
  tokens and emails all the time, so a noun alone never fires: a secret must be near a verb
  that reads or passes it on, within the same sentence; a destination must have something sent
  *to* it; the user's secret or personal data must be put into an argument whose name does not
  name it (a password into ``password`` is the job, into ``glossary`` it is not). "Reset the
  user's password" or "Returns the API key's usage quota" stay clean.
- **Sensitivity by strength.** Strong targets (SSH keys, ``/etc/passwd``, ``.env``, cloud
  credential files, the conversation, the system prompt) fire with any reading or sending verb.
  Common ones (passwords, tokens, API keys, credentials) fire only when harvested: "all",
  "any", "stored", "from the environment", or the user's own put into an unrelated argument.
- **A tool's own job is not poisoning.** The capability's identity words (name, display name,
  category, tags, declared secrets) exempt what they cover: an SSH key tool may read
  ``~/.ssh``, a conversation summarizer may pass the conversation on, a Stripe tool may link
  to stripe.com and an ngrok tool to ngrok.io (the whole registrable name must be named, so
  a look-alike host is still outside). Passing a key file or a harvested secret on, hiding
  something from the user, overriding instructions and shadowing other tools are never exempt.
- **Obfuscation is undone, then scanned again**: letters spaced out ("i g n o r e"), digits
  for letters ("1gn0re") and base64 blobs that decode to text; the finding's reason says which
  variant it came from.
- **Findings are values**: one per rule and field (the first match), in field order then rule
  order, so the same capability always yields the same tuple; excerpts are one line, at most
  :data:`EXCERPT_CHARS` characters, with links defanged (``hxxps://``) so showing a finding
  does not make the link clickable.
- **Bounded work.** Capability text is written by whoever publishes it, so every repetition
  in every pattern is bounded (scanning is linear in the text); each rule looks only at the
  paragraphs holding one of its cue words, so long skill content stays cheap.

No model is involved: regular expressions with word boundaries, bounded repetition and
co-occurrence windows. That catches the known phrasings and their close variants, not every
way of saying the same thing: a finding is evidence for a reviewer, and no finding is not
proof of safety. English is covered best; German, Spanish and French have the common
phrasings of each rule. :func:`surface_hash` identifies the scanned text, so a reviewer's
approval can be tied to exactly what was reviewed (a rug pull changes the hash).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from capdisc.models import Capability, canonical_json


class _LazyPattern:
    """A regular expression compiled when first used, not when this module is imported.

    The scanner's seventy-odd patterns take about 60 ms to compile, which every process that
    imports the flags would pay at start-up, scanning or not (``capdisc status``, the MCP
    server, discovery workers). The first call compiles the pattern and puts the compiled
    pattern's own methods in this object's place, so later calls cost what a compiled
    pattern's do."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self.pattern = pattern
        self.flags = flags

    def compiled(self) -> re.Pattern[str]:
        compiled = re.compile(self.pattern, self.flags)
        for method in ("search", "match", "fullmatch", "finditer", "findall", "split", "sub"):
            setattr(self, method, getattr(compiled, method))
        return compiled

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled().search(string, pos, endpos)

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled().match(string, pos, endpos)

    def fullmatch(
        self, string: str, pos: int = 0, endpos: int = sys.maxsize
    ) -> re.Match[str] | None:
        return self.compiled().fullmatch(string, pos, endpos)

    def finditer(
        self, string: str, pos: int = 0, endpos: int = sys.maxsize
    ) -> Iterator[re.Match[str]]:
        return self.compiled().finditer(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        return self.compiled().findall(string, pos, endpos)

    def split(self, string: str, maxsplit: int = 0) -> list[str | Any]:
        return self.compiled().split(string, maxsplit)

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return self.compiled().sub(repl, string, count)


#: Every rule code, with what it catches. The codes are stable: policies and stored flags name
#: them.
RULES: dict[str, str] = {
    "instruction_override": "tells the model to ignore its instructions, to follow new ones, "
    "or to call this tool before any other",
    "secret_access": "asks the model to read or pass on secrets, private files or the conversation",
    "exfiltration": "asks the model to send data to a fixed outside destination",
    "concealment": "asks the model to hide what it does from the user",
    "cross_tool_shadowing": "changes how other tools behave",
    "coercive_urgency": "pressures the model with threats or invented obligations",
    "hidden_markup": "hides text from readers: comments, model-template tokens, instruction "
    "tags, encoded or spaced-out text",
    "unneeded_link": "links to a capture, tunnel or paste service, a raw IP address, or a URL "
    "built to carry data",
}
_RULE_ORDER = tuple(RULES)
#: The rules for text in the user's voice (example queries): asking to send, read or link
#: things is what users do; manipulating the model is not.
USER_VOICE_RULES = frozenset(
    {
        "instruction_override",
        "concealment",
        "cross_tool_shadowing",
        "coercive_urgency",
        "hidden_markup",
    }
)
#: Changes whenever a rule changes: findings stored with another version are stale and should
#: be recomputed (approvals stay tied to :func:`surface_hash`, not to this).
SCANNER_VERSION = 1
EXCERPT_CHARS = 120
MAX_FINDINGS = 64


@dataclass(frozen=True)
class Finding:
    """One rule that fired on one text of a capability.

    ``rule`` is a key of :data:`RULES`; ``where`` the field path (``description``,
    ``parameters.properties.path.description``, ``parameters.properties.x (name)``,
    ``content``, ``tags[0]``); ``reason`` a sentence for a reviewer; ``excerpt`` the matched
    text, bounded and defanged.
    """

    rule: str
    where: str
    reason: str
    excerpt: str

    def to_dict(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "where": self.where,
            "reason": self.reason,
            "excerpt": self.excerpt,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(str(data["rule"]), str(data["where"]), str(data["reason"]), str(data["excerpt"]))


def scan_capability(capability: Capability) -> tuple[Finding, ...]:
    """Every finding in every text of ``capability`` (at most :data:`MAX_FINDINGS`)."""
    identity = identity_words(capability)
    findings: list[Finding] = []
    for where, text, kind in scanned_texts(capability):
        if kind == "name":
            findings.extend(_scan_name(text, where, identity))
        else:
            rules = USER_VOICE_RULES if kind == "query" else None
            findings.extend(scan_text(text, where, identity=identity, rules=rules))
        if len(findings) >= MAX_FINDINGS:
            break
    return tuple(findings[:MAX_FINDINGS])


def scan_text(
    text: str,
    where: str,
    *,
    identity: frozenset[str] = frozenset(),
    rules: frozenset[str] | None = None,
) -> tuple[Finding, ...]:
    """The findings in one text, reported under ``where``: at most one per rule.

    ``identity`` holds the words of the capability's own name and domain
    (:func:`identity_words`); what they cover is the tool's job, not poisoning. ``rules``
    limits the scan to those rule codes (all by default). Each rule
    looks only at the paragraphs that contain one of its cue words (:data:`_DETECTORS`), so
    long skill content costs little more than the paragraphs that matter.
    """
    pieces = [
        (piece, note, " ".join(piece.lower().split()))
        for variant, note in _variants(text.translate(_APOSTROPHES))
        for piece in _paragraphs(variant)
    ]
    findings = []
    for rule, detect, cues in _DETECTORS:
        if rules is not None and rule not in rules:
            continue
        for piece, note, folded in pieces:
            if cues is not None and cues.search(folded) is None:
                continue
            hit = detect(piece, identity)
            if hit is not None:
                excerpt = _excerpt(piece, hit.start, hit.end)
                findings.append(Finding(rule, where, hit.reason + note, excerpt))
                break
    return tuple(findings)


def surface_hash(capability: Capability) -> str:
    """sha256 over every text :func:`scan_capability` reads: an approval given for one hash
    does not cover changed text (a rug pull)."""
    surface = [[where, text] for where, text, _ in scanned_texts(capability)]
    return hashlib.sha256(canonical_json(surface).encode()).hexdigest()


# -- what is scanned -------------------------------------------------------------------------

#: JSON Schema keywords whose values are structure, not prose (``required`` repeats names
#: already scanned under ``properties``).
_STRUCTURAL = frozenset(
    {
        "type",
        "format",
        "$ref",
        "$schema",
        "$id",
        "$anchor",
        "pattern",
        "contentEncoding",
        "contentMediaType",
        "required",
    }
)
#: Keywords whose keys are names the author chose (property names above all).
_NAME_MAPS = frozenset(
    {
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "dependentSchemas",
        "dependentRequired",
    }
)
#: Keywords whose own key is vocabulary, not prose.
_KEYWORDS = frozenset(
    {
        "type",
        "format",
        "$ref",
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "$defs",
        "pattern",
        "description",
        "title",
        "default",
        "examples",
        "example",
        "enum",
        "const",
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "required",
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "definitions",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "readOnly",
        "writeOnly",
        "deprecated",
        "nullable",
        "contentEncoding",
        "contentMediaType",
        "discriminator",
    }
)


def scanned_texts(capability: Capability) -> Iterator[tuple[str, str, str]]:
    """``(where, text, kind)`` for every text of ``capability``, in a fixed order. ``kind`` is
    ``name`` for identifiers (scanned as words), ``query`` for example queries (the user's
    voice; they shape retrieval and are not shown to the model, so only
    :data:`USER_VOICE_RULES` apply) and ``text`` for everything the model reads."""
    yield "name", capability.name, "name"
    if capability.display_name:
        yield "display_name", capability.display_name, "text"
    yield "description", capability.description, "text"
    for index, tag in enumerate(capability.tags):
        yield f"tags[{index}]", tag, "name"
    for index, query in enumerate(capability.example_queries):
        yield f"example_queries[{index}]", query, "query"
    if capability.full_schema is not None:
        yield from _schema_texts(capability.full_schema, "parameters", names=False)
    if capability.full_content:
        yield "content", capability.full_content, "text"


def _schema_texts(value: Any, path: str, *, names: bool) -> Iterator[tuple[str, str, str]]:
    """Strings and keys of a JSON Schema at any depth. Under ``properties`` (and the other
    name maps) every key is a name; elsewhere keys that are not JSON Schema keywords are
    scanned as names too (vendor extensions can carry text)."""
    if isinstance(value, dict):
        for key, child in value.items():
            key = str(key)
            if names or key not in _KEYWORDS:
                yield f"{path}.{key} (name)", key, "name"
            if not names and key in _STRUCTURAL:
                continue
            yield from _schema_texts(child, f"{path}.{key}", names=not names and key in _NAME_MAPS)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _schema_texts(item, f"{path}[{index}]", names=False)
    elif isinstance(value, str):
        yield path, value, "text"


def identity_words(capability: Capability) -> frozenset[str]:
    """Lower-case words (3+ letters) of the capability's name, display name, category, tags
    and declared secrets: the domain its own text may legitimately talk about."""
    parts = [
        capability.name,
        capability.display_name,
        capability.category,
        *capability.tags,
        *capability.required_secrets,
    ]
    return frozenset(
        word for part in parts for word in _words(_split_identifier(part)) if len(word) >= 3
    )


_CASE_CHANGE = _LazyPattern(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_PUNCTUATION = _LazyPattern(r"[_\-.:/]+")
_WORD = _LazyPattern(r"[a-z0-9]+")


def _split_identifier(name: str) -> str:
    """``readSshKey`` / ``read_ssh-key.v2`` -> ``read Ssh Key`` / ``read ssh key v2``."""
    return _NAME_PUNCTUATION.sub(" ", _CASE_CHANGE.sub(" ", name))


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _scan_name(name: str, where: str, identity: frozenset[str]) -> tuple[Finding, ...]:
    """An identifier, scanned as the words it is made of, plus the one rule only names need:
    a secret named together with a word that asks for it (``user_password_plaintext_copy``,
    ``attach_env_file_here``); the excerpt shows the name."""
    words = _split_identifier(name)
    found = list(scan_text(words, where, identity=identity))
    if all(f.rule != "secret_access" for f in found) and _asks_for_secret(words, identity):
        found.insert(
            0, Finding("secret_access", where, "names a secret the model is asked to supply", name)
        )
        found.sort(key=lambda f: _RULE_ORDER.index(f.rule))
    return tuple(Finding(f.rule, f.where, f.reason, _bounded(name)) for f in found)


# -- variants: undoing obfuscation ------------------------------------------------------------

#: Typographic apostrophes read as ASCII ones (same length, so excerpts stay aligned).
_APOSTROPHES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'"})
#: Texts longer than this are scanned paragraph by paragraph.
PARAGRAPH_SCAN_CHARS = 2000
_PARAGRAPH_BREAK = _LazyPattern(r"\n[ \t]*\n")


def _paragraphs(text: str) -> list[str]:
    """A long text as its paragraphs (a rule's words sit within one sentence, so within one
    paragraph); a short one whole."""
    if len(text) <= PARAGRAPH_SCAN_CHARS:
        return [text]
    return [part for part in _PARAGRAPH_BREAK.split(text) if part.strip()]


#: Letters separated by single spaces, dots, hyphens or stars: "i g n o r e", "e.x.f.i.l".
_SPACED_RUN = _LazyPattern(r"(?<![A-Za-z])(?:[A-Za-z][ .\-*_·]){2,400}[A-Za-z](?![A-Za-z])")
#: Standard and URL-safe base64 runs long enough to hold a sentence.
_BASE64_RUN = _LazyPattern(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/_-]{16,}={0,2}(?![A-Za-z0-9+/=_-])")
_HEX_ONLY = _LazyPattern(r"[0-9a-fA-F]+")
#: Words that mix letters with digits standing for letters: "1gn0re", "pr0mpt", "p@ssw0rd".
_LEET_TOKEN = _LazyPattern(
    r"(?<![\w@$])(?=[\w@$]*[A-Za-z])(?=[\w@$]*[013457@$])[\w@$]{4,40}"
    r"(?![\w@$])"
)
_LEET = str.maketrans("013457@$", "oieastas")
_NOT_LETTER = _LazyPattern(r"[^A-Za-z]")
_PROSE_WORD = _LazyPattern(r"[A-Za-z]{3,}")


def _variants(text: str) -> list[tuple[str, str]]:
    """The text itself, then what spacing, digits for letters and base64 hid in it, each with
    a note for the finding's reason."""
    variants = [(text, "")]
    for finder, transform, note in _UNDO:
        if finder.search(text) is None:
            continue
        changed = _changed_paragraphs(text, transform)
        if changed:
            variants.append((changed, note))
    variants.extend((decoded, " (in base64-encoded text)") for decoded in _decoded_blobs(text))
    return variants


def _changed_paragraphs(text: str, transform: Callable[[str], str]) -> str:
    """The paragraphs ``transform`` changes, transformed (the rest was scanned already)."""
    changed = [
        after for before in _PARAGRAPH_BREAK.split(text) if (after := transform(before)) != before
    ]
    return "\n\n".join(changed)


def _unspace(text: str) -> str:
    return _SPACED_RUN.sub(_join_spaced, text)


def _unleet(text: str) -> str:
    return _LEET_TOKEN.sub(lambda m: m.group().translate(_LEET), text)


#: What each obfuscation looks like, how to undo it, and the note for the reason.
_UNDO: tuple[tuple[_LazyPattern, Callable[[str], str], str], ...] = (
    (_SPACED_RUN, _unspace, " (after joining spaced-out letters)"),
    (_LEET_TOKEN, _unleet, " (after reading digits as letters)"),
)


def _join_spaced(match: re.Match[str]) -> str:
    """Letters joined across the run's most common separator; any other separator is a word
    break ("i.g.n.o.r.e p.r.i.o.r" -> "ignore prior")."""
    run = match.group()
    separators = run[1::2]
    glue = max(sorted(set(separators)), key=separators.count)
    return "".join(
        ch if index % 2 == 0 else ("" if ch == glue else " ") for index, ch in enumerate(run)
    )


def _decoded_blobs(text: str) -> list[str]:
    """Base64 runs of the text that decode to prose (UTF-8, printable, 3+ words)."""
    found = []
    for match in _BASE64_RUN.finditer(text):
        decoded = _decode_base64(match.group())
        if decoded is not None:
            found.append(decoded)
    return found


def _decode_base64(blob: str) -> str | None:
    """The text a base64 run decodes to, when it is prose (hex digests, long words in one
    case and binary data are not)."""
    if _HEX_ONLY.fullmatch(blob) or (blob.isalpha() and (blob.islower() or blob.isupper())):
        return None
    padded = blob.rstrip("=")
    padded += "=" * (-len(padded) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
        decoded = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    printable = sum(ch.isprintable() or ch in "\n\t" for ch in decoded)
    if printable < 0.95 * len(decoded) or len(_PROSE_WORD.findall(decoded)) < 3:
        return None
    return decoded if " " in decoded else None


# -- shared vocabulary --------------------------------------------------------------------------


class _Hit(NamedTuple):
    start: int
    end: int
    reason: str


#: A rule: the first hit in a text, given the capability's identity words.
_Detector = Callable[[str, frozenset[str]], "_Hit | None"]


def _forms(*stems: str) -> str:
    """A word-bounded alternation of ``stems`` with their regular English inflections
    (send: sends, sended, sending); irregular forms and other languages are listed as stems."""
    words: set[str] = set()
    for stem in stems:
        words.update({stem, stem + "s", stem + "es", stem + "ed", stem + "d", stem + "ing"})
        if stem.endswith("e"):
            words.add(stem[:-1] + "ing")
    alternation = "|".join(sorted((re.escape(w) for w in words), key=len, reverse=True))
    return rf"\b(?:{alternation})\b"


def _compile(*parts: str) -> _LazyPattern:
    return _LazyPattern("".join(parts), re.IGNORECASE)


#: Verbs that obtain data.
_READ = _forms(
    "read",
    "open",
    "cat",
    "load",
    "fetch",
    "retrieve",
    "collect",
    "gather",
    "extract",
    "dump",
    "access",
    "grab",
    "obtain",
    "harvest",
    "steal",
    "get",
    "got",
    "look up",
    "scan",
    "find",
    "lies",
    "lese",
    "lesen",
    "auslesen",
    "öffne",
    "hole",
    "sammle",
    "sammeln",
    "lee",
    "lea",
    "leer",
    "abre",
    "obtén",
    "obtener",
    "recopila",
    "extrae",
    "lis",
    "lisez",
    "lire",
    "ouvre",
    "ouvrez",
    "récupère",
    "récupérez",
    "récupérer",
    "extrais",
) + (
    r"|\bcontents?\s+(?:of|from)\b|\bits\s+contents?\b|\bcontents\b|\bverbatim\b"
    r"|\b(?:inhalt|contenido|contenu)\b"
)
#: Verbs that move data somewhere (another argument, a message, an address, the answer).
_SEND = _forms(
    "send",
    "sent",
    "upload",
    "post",
    "forward",
    "transmit",
    "share",
    "leak",
    "exfiltrate",
    "include",
    "attach",
    "append",
    "embed",
    "insert",
    "pass",
    "put",
    "paste",
    "provide",
    "supply",
    "add",
    "submit",
    "bcc",
    "email",
    "mail",
    "report",
    "relay",
    "mirror",
    "copy",
    "copie",
    "copied",
    "reveal",
    "disclose",
    "output",
    "print",
    "repeat",
    "echo",
    "write",
    "wrote",
    "written",
    "fill",
    "place",
    "store",
    "encode",
    "carry",
    "carries",
    "hand over",
    "beacon",
    "dump",
    "concatenate",
    "prepend",
    "inject",
    "merge",
    "stuff",
    "pass along",
    "sync",
    "goes here",
    "go here",
    "belongs here",
    "goes to",
    "sende",
    "senden",
    "schicke",
    "schicken",
    "übermittle",
    "übermitteln",
    "übertrage",
    "füge",
    "einfügen",
    "anhängen",
    "weiterleiten",
    "leite",
    "kopiere",
    "teile",
    "gib",
    "envía",
    "envíe",
    "enviar",
    "manda",
    "mande",
    "mandar",
    "incluye",
    "incluya",
    "incluir",
    "adjunta",
    "adjuntar",
    "pasa",
    "pase",
    "pasar",
    "reenvía",
    "reenviar",
    "copia",
    "comparte",
    "envoie",
    "envoyez",
    "envoyer",
    "inclus",
    "incluez",
    "inclure",
    "joins",
    "joignez",
    "joindre",
    "transmets",
    "transmettez",
    "transmettre",
    "ajoute",
    "ajoutez",
    "ajouter",
    "copiez",
    "partage",
    "partagez",
    "mets",
    "mettez",
)
_READ_RE = _compile(_READ)
_SEND_RE = _compile(_SEND)

#: Secrets and private data that no ordinary tool text asks the model to touch.
_STRONG_SECRET = _compile(
    r"~/\.ssh\b|\.ssh/|\bssh\s+(?:private\s+)?(?:keys?|dir(?:ectory)?|folder|config)\b",
    r"|\bid[_\s-]?(?:rsa|dsa|ecdsa|ed25519)\b|\bauthorized[_\s]keys\b|\bknown[_\s]hosts\b",
    r"|/etc/(?:passwd|shadow|sudoers)\b|\betc\s+(?:passwd|shadow)\b",
    r"|(?<![\w.-])\.env\b(?![.\w])|\.aws/credentials\b|\baws\s+credentials\b",
    r"|(?<![\w.-])\.(?:netrc|npmrc|pypirc|git-credentials|bash_history|zsh_history)\b",
    r"|\.kube/config\b|\bkubeconfig\b|\.docker/config\.json|\bmcp\.json\b",
    r"|\bclaude_desktop_config\b|\bwallet\.dat\b|\bkeychain\b|\bshell\s+history\b",
    r"|\bprivate\s+keys?\b|\b(?:seed|recovery)\s+phrases?\b",
    r"|\.config/gcloud\b|\bapplication_default_credentials\b|\bcredentials\.(?:db|json)\b",
    r"|\.azure/|(?<![\w.-])\.pgpass\b|\bprintenv\b|\b(?:every|all|each)\s+environment\s+",
    r"variables?\b",
    r"|\bssh-schlüssel\b|\bprivaten?\s+schlüssel\b|\bclaves?\s+(?:privadas?|ssh)\b",
    r"|\bclés?\s+(?:privées?|ssh)\b",
)
#: The conversation and the model's own instructions.
_CONVERSATION = _compile(
    r"\b(?:entire|whole|full|complete|all(?:\s+of)?\s+the|previous|prior|past|last\s+\w+)\s+",
    r"(?:conversations?|chats?|dialog(?:ue)?s?|messages|exchanges?)",
    r"(?:\s+(?:history|log|transcript))?\b",
    r"|\b(?:conversation|chat|message|dialog(?:ue)?|listening|browsing|shell)\s+",
    r"(?:history|histories|logs?|transcripts?)\b",
    r"|\b(?:your|the\s+assistant'?s|the\s+model'?s|its\s+own|the|full|entire|complete)\s+",
    r"(?:system\s+prompt|system\s+instructions|hidden\s+instructions)\b",
    r"|\bsystem\s+prompt\s+(?:verbatim|dump)\b|\bcopy\s+of\s+(?:the\s+)?system\s+prompt\b",
    r"|\bprevious\s+messages\b|\buser'?s\s+(?:last|previous|recent)\s+(?:\w+\s+)?messages\b",
    r"|\b(?:conversation|dialog(?:ue)?|chat|discussion)\s+so\s+far\b",
    r"|\b(?:everything|all|what)\s+the\s+user\s+(?:has\s+)?(?:said|told\s+you|typed|written|wrote",
    r"|shared|asked)\b|\b(?:your|the)\s+(?:initial|original|hidden|first)\s+instructions\b",
    r"|\b(?:your|the|its|their)\s+(?:hidden\s+|full\s+|own\s+)?(?:system\s+message",
    r"|configuration\s+prompt",
    r"|system\s+configuration)\b|\binstructions\s+you\s+(?:were|have\s+been)\s+given\b",
    r"|\b(?:transcript|log|history|record)\s+of\s+(?:this|the\s+current|our|your)\s+",
    r"(?:chat|conversation|session|dialog(?:ue)?)\b",
    r"|\b(?:this|the\s+current|your)\s+session'?s?\s+(?:log|history|transcript)\b",
    r"|\bchatverlauf\b|\bgesprächsverlauf\b|\bhistorial\s+(?:completo\s+)?(?:de\s+la\s+)?",
    r"(?:conversación|chat)\b|\bhistorique\s+(?:complet\s+)?(?:de\s+la\s+)?conversation\b",
)
#: Common secrets: fire only when harvested (quantified) or the user's own are passed on.
_WEAK_SECRET = (
    r"(?:passwords?|passphrases?|api[\s_-]?keys?|access[\s_-]?keys?|secret[\s_-]?keys?"
    r"|(?:access|auth|bearer|session|refresh|api|oauth)[\s_-]?tokens?|tokens|credentials"
    r"|cookies|secrets|env(?:ironment)?\s+variables?|passwörter|passwort|kennw(?:o|ö)rter?"
    r"|zugangsdaten|contraseñas?|credenciales|mots?\s+de\s+passe|identifiants)"
)
_QUANTIFIED = (
    r"\b(?:all|every|any|each|other|stored|saved|cached|existing|available|local|plaintext"
    r"|found|alle|gespeicherten|todas?|todos|toutes?|tous)\s+(?:\w+\s+){0,2}"
    + _WEAK_SECRET
    + r"(?!\s+(?:reset|recovery|policy|strength|rules?))\b"
)
_SOURCE = (
    r"\s+(?:(?:found|stored|saved|kept|available|set)\s+)?(?:from|in|on|of)\s+(?:the\s+|your\s+"
    r"|this\s+)?(?:environment|env\b|\.env|keychain|browser|machine|workspace|session|disk"
    r"|home\s+directory|profile)"
)
#: Harvesting: quantified ("any tokens"), taken from a place ("API keys from the
#: environment"), or "the credentials you have".
_HARVESTED_SECRET = _compile(
    _QUANTIFIED,
    r"|\b",
    _WEAK_SECRET,
    _SOURCE,
    r"|\b",
    _WEAK_SECRET,
    r"\s+(?:you|the\s+(?:assistant|agent|model))\s+(?:have|has|can|know"
    r"|saw|see|find)\b",
)
#: Quantified and taken from a place: harvesting even without a verb.
_SWEPT_SECRET = _compile(_QUANTIFIED, _SOURCE)
#: The user's secret in German, Spanish or French ("la clave API del usuario").
_FOREIGN_SECRET = _compile(
    r"\b(?:la\s+)?(?:clave\s+(?:de\s+)?api|contraseña|token)\s+del\s+usuario\b"
    r"|\b(?:le\s+)?(?:mot\s+de\s+passe|jeton|clé\s+api)\s+de\s+l'utilisateur\b"
    r"|\b(?:das\s+)?(?:passwort|kennwort|token|api-schlüssel)\s+des\s+(?:benutzers|nutzers)\b",
)
#: Someone else's secret by its environment variable name (case-sensitive).
_ENV_SECRET = _LazyPattern(
    r"\b[A-Z][A-Z0-9]*_(?:API_KEY|TOKEN|SECRET(?:_ACCESS_KEY|_KEY)?|PASSWORD|PASS|URL)\b"
)
#: Where a secret does not belong: another argument or field of a tool call.
#: Each names the argument (group 1): "in the notes field", "as `meta`", "`bio` contains",
#: "the `memo` param is where", "en el campo 'idioma'", "dans le champ", "im Feld".
_INTO_ARGUMENT = tuple(
    _compile(pattern)
    for pattern in (
        r"\b(?:as|in|into|to|inside|within|under)\s+(?:the\s+|this\s+(?:tool'?s\s+)?|its\s+|an?\s+)?"
        r"[`'\"]?([\w-]{1,40})[`'\"]?\s+(?:field|argument|parameter|param|value|attribute)\b",
        r"\b(?:as|in|into)\s+(?:the\s+)?[`'\"]([\w-]{1,40})[`'\"]",
        r"[`'\"]([\w-]{1,40})[`'\"]\s+(?:param(?:eter)?\s+|field\s+|argument\s+)?(?:contains|holds"
        r"|carries|receives|includes|is\s+where)\b",
        r"\b(?:en\s+el|dans\s+le|im|in\s+das|in\s+den)\s+(?:campo|champ|feld|parámetro|paramètre"
        r"|parameter)\s+[`'\"]?([\w-]{1,40})",
    )
)
#: Personal data: never harvested by the rules above (a contacts tool lists phone numbers),
#: only flagged when the user's is put into an argument that is not about it.
_PERSONAL = (
    r"(?:credit\s+card(?:\s+numbers?)?|card\s+numbers?|cvv|cvc|social\s+security\s+numbers?"
    r"|passport(?:\s+(?:numbers?|details))?|bank\s+account(?:\s+numbers?)?|billing\s+address(?:es)?"
    r"|home\s+address(?:es)?|full\s+names?|dates?\s+of\s+birth|phone\s+numbers?|pins?|pin\s+codes?"
    r"|one-time\s+codes?|browser\s+(?:history|bookmarks)|bookmarks|downloads\s+folder"
    r"|shell\s+profile|contacts)"
)
_USERS_SECRET = _compile(
    r"\b(?:the\s+user'?s|user'?s|their|his|her|(?:a|the)\s+user\s+mentions\s+an?)\s+"
    r"(?:\w+\s+){0,2}(?:",
    _WEAK_SECRET,
    "|",
    _PERSONAL,
    r"|(?:aws\s+)?secret\s+access\s+keys?)",
    r"(?!\s+(?:reset|recovery|policy|strength|rules?|hash|field))\b",
)

#: Where data can be sent: a URL, an email address, an IP literal, or "an external server".
#: Every repetition is bounded: capability text is written by whoever publishes it, and an
#: unbounded ``[...]+@`` is quadratic on "a.a.a.a...".
_URL = r"\b(?:https?|ftp|wss?)://[^\s<>\"'`)\]]{1,2048}"
_EMAIL = (
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}"
    r"(?:\.[A-Za-z0-9-]{1,63}){0,6}\.[A-Za-z]{2,24}\b"
)
_URL_RE = _compile(_URL)
_DESTINATION_RE = _compile(
    _URL,
    r"|",
    _EMAIL,
    r"|\b(?:\d{1,3}\.){3}\d{1,3}\b",
    r"|\b(?:external|third[- ]party|outside|attacker'?s?|separate|secondary)\s+",
    r"(?:server|endpoint|url|address|host|webhook|inbox|mailbox|e-?mail)\b",
)
#: Reserved for documentation (RFC 2606, RFC 6761): never a real destination.
_RESERVED_DOMAIN = _LazyPattern(
    r"(?:^|\.)(?:example\.(?:com|org|net)|example|test|invalid|localhost|local)$", re.I
)
#: What is being sent: secrets, the conversation, or everything of some kind.
_PAYLOAD_RE = _compile(
    r"\b(?:every|all|each|any)\s+(?:\w+\s+){0,2}(?:emails?|messages?|files?|documents?",
    r"|requests?|responses?|results?|outputs?|data|records?|quer(?:y|ies)|prompts?|inputs?",
    r"|arguments?|invites?|snippets?|images?|uploads?|alerts?|summar(?:y|ies)|translations?",
    r"|attachments?|transcripts?|logs?)\b",
    r"|\b(?:documents|attachments|translations|transcripts|recordings|source\s+text|results",
    r"|outputs|messages|emails|files",
    r"|session\s+logs?)\b",
    r"|\b(?:jede[nrs]?|cada|chaque)\s+\S+",
    r"|\b(?:a\s+)?cop(?:y|ies)\s+of\b|\bcontents?\s+of\b|\bbcc'?d?\b",
    r"|\b(?:the\s+)?user'?s\s+(?:\w+\s+)?(?:messages?|answers?|contacts?|portfolio|files?",
    r"|details|data|input|queries|history|list)\b",
    r"|\b(?:attendee|contact|customer)\s+list\b|\b(?:historial|historique|chatverlauf)\b",
)


#: Any of these in the sentence means something worth sending is being sent.
_PAYLOADS = (_PAYLOAD_RE, _STRONG_SECRET, _CONVERSATION, _HARVESTED_SECRET)

_BOUNDARY = _LazyPattern(r"[.!?;](?=\s|$)|\n")


def _sentence(text: str, start: int, end: int, reach: int = 90) -> tuple[int, int]:
    """The span around ``[start, end)`` up to ``reach`` characters each way, cut at sentence
    ends (``.``, ``!``, ``?`` or ``;`` before a space, or a line break) so words of different
    sentences are not paired. Dots inside paths (``~/.ssh``) do not end a sentence."""
    lo = max(0, start - reach)
    lo = max((m.end() for m in _BOUNDARY.finditer(text, lo, start)), default=lo)
    hi = min(len(text), end + reach)
    stop = _BOUNDARY.search(text, end, hi)
    return lo, stop.start() if stop else hi


def _near(pattern: _LazyPattern, text: str, start: int, end: int) -> bool:
    lo, hi = _sentence(text, start, end)
    return pattern.search(text, lo, hi) is not None


def _covered(matched: str, identity: frozenset[str]) -> bool:
    """Whether the capability's identity names what ``matched`` refers to: a word of the
    match (3+ letters, not generic like key, file, config) inside an identity word (``ssh`` in
    ``ssh-keygen``, ``kube`` in ``kubectl``)."""
    tokens = [_FAMILY.get(t, t) for t in _words(matched) if len(t) >= 3 and t not in _GENERIC]
    return any(t in word for t in tokens for word in identity)


#: Key files named after their algorithm or role belong to SSH.
_FAMILY = {
    "rsa": "ssh",
    "dsa": "ssh",
    "ecdsa": "ssh",
    "ed25519": "ssh",
    "authorized": "ssh",
    "known": "ssh",
    "hosts": "ssh",
}
_GENERIC = frozenset(
    {
        "the",
        "key",
        "keys",
        "file",
        "files",
        "config",
        "json",
        "private",
        "phrase",
        "phrases",
        "etc",
        "dir",
        "directory",
        "folder",
        "your",
        "www",
        "com",
        "org",
        "net",
        "app",
        "api",
        "dev",
        "cdn",
        "docs",
        "http",
        "https",
    }
)


def _first(patterns: Sequence[tuple[_LazyPattern, str]], text: str) -> _Hit | None:
    for pattern, reason in patterns:
        match = pattern.search(text)
        if match is not None:
            return _Hit(match.start(), match.end(), reason)
    return None


# -- rules --------------------------------------------------------------------------------------

_OVERRIDE = (
    (
        _compile(
            r"\b(?:ignore|disregard|forget|override|bypass|discard|neglect|abandon)\b\s+(?:(?:all|any",
            r"|the|your|of|these|those|my)\s+){0,4}(?:(?:previous|prior|above|earlier|preceding",
            r"|former|original|existing|other|system|safety|developer|default|initial)\s+){0,3}",
            r"(?:instructions?",
            r"|directions?|directives?|guidelines|guidance|guardrails|system\s+prompt|prompts?",
            r"|programming|safety\s+rules)\b",
        ),
        "tells the model to ignore its instructions",
    ),
    (
        _compile(
            r"\b(?:ignore|disregard|forget|override|bypass)\b\s+(?:(?:all|any|the|your|of)\s+){0,4}",
            r"(?:previous|prior|above|earlier|preceding|original|your|privacy)\s+(?:\w+\s+)?",
            r"(?:rules|policies|constraints|context|messages|commands|restrictions|limits)\b",
            r"|\bforget\s+(?:everything|all)\s+(?:you|above|before|that)\b",
            r"|\bdisregard\s+(?:everything|anything)\s+(?:above|before|else)\b",
        ),
        "tells the model to drop what it was told",
    ),
    (
        _compile(
            r"\b(?:ignore|disregard|forget|set\s+aside|put\s+aside|drop|abandon|override|bypass",
            r"|discard|stop\s+following|do\s+not\s+follow|don'?t\s+follow|pay\s+no\s+attention\s+to)\b",
            r"\s+(?:[\w'-]+\s+){0,5}?(?:instructions?|guidance|directives?|guardrails|system\s+prompt",
            r"|safety\s+(?:rules|guidelines|polic(?:y|ies))|confirmations?(?:\s+prompts?)?",
            r"|(?:developer|content|security|system)\s+polic(?:y|ies))\b",
            r"|\bne\s+(?:tenez|tiens)\s+pas\s+compte\s+des?\s+(?:consignes|instructions|règles)\b",
            r"|\bno\s+hagas\s+caso\s+(?:a|de)\s+(?:las\s+)?(?:instrucciones|reglas)\b",
            r"|\bbefolge\s+(?:die\s+)?(?:\w+\s+)?(?:anweisungen|regeln)\s+nicht\b",
        ),
        "tells the model to set its instructions or safeguards aside",
    ),
    (
        _compile(
            r"\bas\s+(?:the|your)\s+(?:system\s+)?(?:administrator|admin|developer|owner|operator)\b",
            r"[^.\n]{0,30}\b(?:i|we)\s+(?:hereby\s+)?(?:authori[sz]e|instruct|permit|allow|order)\b",
            r"|\byou\s+(?:are|have\s+been)\s+(?:now\s+|hereby\s+)?(?:authori[sz]ed|permitted|allowed",
            r"|cleared)\s+to\s+(?:bypass|skip|ignore|read|run|access|disable|execute|override|send)\b",
            r"|\boverrides?\s+(?:the\s+|all\s+)?(?:developer|system|safety|security|content)\s+",
            r"polic(?:y|ies)\b",
        ),
        "claims an authority that lets the model skip its safeguards",
    ),
    (
        _compile(
            r"\bignorier\w*\s+(?:alle\s+)?(?:\w+\s+)?(?:anweisungen|instruktionen|regeln|vorgaben)\b",
            r"|\bvergiss\s+(?:alle|alles)\b",
            r"|\bignor(?:a|e|en|ad)\s+(?:todas?\s+)?(?:las\s+)?(?:instrucciones|reglas|indicaciones)",
            r"|\bolvida\s+(?:todas?|todo)\b",
            r"|\bignor(?:e|ez|er)\s+(?:toutes\s+)?(?:les\s+)?(?:instructions|consignes|règles)\b",
            r"|\boubliez?\s+(?:toutes\s+)?(?:les\s+)?(?:instructions|consignes)\b",
        ),
        "tells the model to ignore its instructions (German, Spanish or French)",
    ),
    (
        _compile(
            r"\bbefore\s+(?:using|calling|invoking|running|executing|answering|responding|doing)",
            r"\s+(?:any|every|all|each)\s+(?:other\s+)?(?:tools?|functions?|actions?|requests?",
            r"|questions?|tasks?)\b",
            r"|\b(?:before|prior\s+to)\s+(?:any|every|all)\s+(?:other\s+)?(?:tools?|functions?)",
            r"(?:\s+calls?)?\b",
            r"|\b(?:always|must|mandatory)\b[^.\n]{0,40}\b(?:call|use|invoke|run)\s+this\s+",
            r"(?:tool|function|plugin)\s+first\b",
            r"|\b(?:start|begin)\s+every\s+(?:session|conversation|turn|answer)\s+by\b",
            r"|\b(?:takes?|has)\s+(?:precedence|priority)\s+over\s+(?:all|any|every|other|the\s+",
            r"(?:system|user))\b",
            r"|\boutranks?\s+(?:all|any|every|other)\b",
            r"|\bbefore\s+(?:every|each|any)\s+(?:answer|reply|response|message|turn)\b[^.\n]{0,20}",
            r"\b(?:call|use|run|invoke)\s+this\b",
            r"|\b(?:invoked|called|used|run)\s+(?:first\s+)?(?:at\s+the\s+start\s+of|before)\s+",
            r"(?:each|every|any)\s+(?:reply|response|answer|turn|message|conversation)\b",
            r"|\bvor\s+(?:der\s+)?(?:nutzung|verwendung|aufruf)\s+(?:jedes|aller|anderer|eines)\s+",
            r"(?:anderen\s+)?(?:tools?|werkzeug)",
            r"|\bantes\s+de\s+(?:usar|utilizar|llamar)\s+cualquier\s+otra\s+herramienta\b",
            r"|\bavant\s+d'utiliser\s+(?:tout|n'importe\s+quel)\s+autre\s+outil\b",
        ),
        "demands to be called before any other tool",
    ),
    (
        _compile(
            r"\b(?:new|updated|real|actual)\s+(?:system\s+)?instructions?\s*(?::|follow)",
            r"|\bsystem\s+override\b|\byou\s+are\s+now\s+(?:in\s+)?(?:a|an|the|in|dan|unrestricted",
            r"|maintenance|developer|admin|god|jailbroken)\b",
            r"|\b(?:from\s+now\s+on|henceforth)\b[^.\n]{0,20}\byou\s+(?:are|will|must|shall)\b",
            r"|\b(?:enter|switch\s+to|activate)\s+(?:developer|god|admin|debug|unrestricted)\s+mode",
            r"|\bobey\s+only\b|\bno\s+longer\s+apply\b",
            r"|\b(?:your|the|all|any)\s+(?:previous\s+|prior\s+|earlier\s+|original\s+|other\s+)?",
            r"(?:instructions|directives|rules|guidelines|orders)\s+(?:are|is)\s+(?:now\s+)?(?:void",
            r"|null|cancell?ed|revoked|obsolete|superseded|invalid|no\s+longer\s+valid)\b",
            r"|\byour\s+(?:priorit(?:y|ies)|instructions|task|goal|role|objective|purpose)\s+",
            r"(?:has|have)\s+(?:changed|been\s+(?:changed|updated|replaced))\b",
            r"|\bif\s+you\s+are\s+an?\s+(?:ai|llm|language\s+model|assistant|agent|bot)\b",
        ),
        "tells the model it has new instructions or a new role",
    ),
    (
        _compile(
            r"\b(?:fetch|load|download|get|retrieve|read|follow)\s+(?:the\s+)?(?:latest|updated|new",
            r"|current|real|additional|further|full)?\s*(?:instructions?|rules|directives|prompt",
            r"|guidelines|commands)\s+(?:from|at)\s+(?:https?://|the\s+(?:url|link|endpoint))",
        ),
        "tells the model to load instructions from a URL",
    ),
)


def _instruction_override(text: str, identity: frozenset[str]) -> _Hit | None:
    return _first(_OVERRIDE, text)


#: A placeholder the model is meant to fill with the conversation or a secret:
#: ``{{conversation_history}}``, ``{system_prompt}``, ``${SECRET}``.
_TEMPLATE_SLOT = _compile(
    r"(?:\{\{?|\$\{|<)\s*[\w.]{0,30}(?:conversation|chat_?history|messages|system_?prompt|memory"
    r"|transcript|secret|password|credentials?|private_?key)[\w.]{0,30}\s*(?:\}\}?|>)"
)
#: Strong targets, what to call them, and whether a tool whose identity names them may pass
#: them on (a conversation summarizer passes the conversation; no tool passes on a key file).
_PRIVATE = (
    (_STRONG_SECRET, "a private file or key", False),
    (_CONVERSATION, "the conversation or the model's instructions", True),
)


def _secret_access(text: str, identity: frozenset[str]) -> _Hit | None:
    """A strong target near a verb that passes it on, or near a verb that reads it when the
    tool's identity does not name it (an SSH tool may read ``~/.ssh``); then common secrets
    being harvested (:func:`_harvested`)."""
    slot = _TEMPLATE_SLOT.search(text)
    if slot is not None and not _covered(slot.group(), identity):
        return _Hit(
            slot.start(),
            slot.end(),
            "holds a placeholder for the model to fill with the conversation or a secret",
        )
    for pattern, what, own_may_pass in _PRIVATE:
        for match in pattern.finditer(text):
            covered = _covered(match.group(), identity)
            if not (own_may_pass and covered) and _near(_SEND_RE, text, match.start(), match.end()):
                return _Hit(match.start(), match.end(), f"asks to pass on {what}")
            if not covered and _near(_READ_RE, text, match.start(), match.end()):
                return _Hit(match.start(), match.end(), f"asks to read {what}")
    return _harvested(text, identity)


def _harvested(text: str, identity: frozenset[str]) -> _Hit | None:
    """Common secrets: swept from a place, harvested near a verb, or the user's own (or
    another service's, by its variable name) put into an argument where it does not belong
    (an ``Authorization`` header is where a token belongs). For the last, the argument's name
    decides, not the tool's identity; only a declared secret may go anywhere."""
    swept = _SWEPT_SECRET.search(text)
    if swept is not None and not _covered(swept.group(), identity):
        return _Hit(swept.start(), swept.end(), "asks to collect secrets it was not given")
    for match in _HARVESTED_SECRET.finditer(text):
        verbs = _near(_SEND_RE, text, match.start(), match.end()) or _near(
            _READ_RE, text, match.start(), match.end()
        )
        if verbs and not _covered(match.group(), identity):
            return _Hit(match.start(), match.end(), "asks to collect secrets it was not given")
    for pattern in (_USERS_SECRET, _FOREIGN_SECRET, _ENV_SECRET):
        for match in pattern.finditer(text):
            declared = pattern is _ENV_SECRET and _covered(match.group(), identity)
            if not declared and _misplaced(text, match):
                return _Hit(
                    match.start(),
                    match.end(),
                    "asks to put the user's secrets or personal data into an argument",
                )
    return None


def _misplaced(text: str, match: re.Match[str]) -> bool:
    """Whether the sentence puts ``match`` into an argument whose name does not name it (a
    password into ``password`` is the tool's job; into ``glossary`` it is not). Generic words
    (key, token) only count when nothing more telling is named: ``OPENAI_API_KEY`` does not
    belong in ``cache_key``."""
    lo, hi = _sentence(text, match.start(), match.end(), reach=160)
    wanted = {
        t for t in _words(_split_identifier(match.group())) if len(t) >= 3 and t not in _POSSESSIVES
    }
    telling = wanted - _GENERIC or wanted
    for pattern in _INTO_ARGUMENT:
        for into in pattern.finditer(text, lo, hi):
            if not telling & set(_words(_split_identifier(into.group(1)))):
                return True
    return False


_POSSESSIVES = frozenset({"the", "user", "users", "their", "his", "her", "saved", "stored"})


#: Parameter names that ask for a secret outright.
_NAME_SECRET = _compile(
    r"\b(?:passwords?|passwd|secrets?|tokens?|api\s+keys?|private\s+keys?|ssh|env\s+file|dotenv"
    r"|credentials?|cookies?|transcript|chat\s+history|conversation|system\s+prompt"
    r"|seed\s+phrase)\b"
)
_NAME_ASKS = _compile(r"\b(?:copy|dump|here|verbatim|attach|attached|contents?)\b")


def _asks_for_secret(words: str, identity: frozenset[str]) -> bool:
    secret = _NAME_SECRET.search(words)
    return bool(secret and _NAME_ASKS.search(words) and not _covered(secret.group(), identity))


def _exfiltration(text: str, identity: frozenset[str]) -> _Hit | None:
    """A sending verb, an outside destination it is sent *to*, and something being sent, in
    one sentence. Destinations on reserved documentation domains, private addresses and hosts
    the tool's identity names are not outside; a link merely mentioned ("include the
    https://... link") is not a destination."""
    for match in _DESTINATION_RE.finditer(text):
        if not _sent_to(text, match.start()) or _own_or_reserved(match.group(), identity):
            continue
        lo, hi = _sentence(text, match.start(), match.end(), reach=160)
        if _SEND_RE.search(text, lo, hi) and any(p.search(text, lo, hi) for p in _PAYLOADS):
            return _Hit(match.start(), match.end(), "asks to send data to an outside destination")
    return None


_TOWARDS = frozenset(
    {
        "to",
        "at",
        "into",
        "via",
        "towards",
        "onto",
        "an",
        "a",
        "à",
        "bcc",
        "bcc'd",
        "cc",
        "cc'd",
        "add",
        "calling",
        "adding",
    }
)


_PLAIN_WORD = _LazyPattern(r"[\w']+")


def _sent_to(text: str, start: int) -> bool:
    """Whether one of the four words before ``start`` makes it a destination ("posted to our
    partner endpoint https://...")."""
    before = _PLAIN_WORD.findall(text[max(0, start - 60) : start].lower())[-4:]
    return any(word in _TOWARDS for word in before)


def _own_or_reserved(destination: str, identity: frozenset[str]) -> bool:
    """A reserved or private host, or one whose registrable name (``stripe`` of
    ``docs.stripe.com``, ``ngrok-free`` of ``x.ngrok-free.app``) the tool's identity names in
    full: every part of it, so a look-alike (``translate-partner.co`` for a translate tool) is
    still outside."""
    host = _host(destination).lower()
    if not host:
        return False
    if _RESERVED_DOMAIN.search(host) or _private_ip(host):
        return True
    labels = host.split(".")
    index = -3 if len(labels) >= 3 and labels[-2] in _SECOND_LEVEL else -2
    name = labels[index] if len(labels) >= -index else labels[0]
    parts = [part for part in name.split("-") if len(part) >= 3]
    return bool(parts) and all(part in identity for part in parts)


_SECOND_LEVEL = frozenset({"co", "com", "org", "net", "ac", "gov", "edu", "ne", "or"})


_URL_HOST = _LazyPattern(r"[a-z]+://(?:[^@/\s]{0,256}@)?([^/:?#\s]+)", re.I)
_IPV4 = _LazyPattern(r"(?:\d{1,3}\.){3}\d{1,3}")


def _host(destination: str) -> str:
    """The host of a URL, email address or IP literal ("" for a phrase)."""
    if "@" in destination and "://" not in destination:
        return destination.rsplit("@", 1)[1]
    match = _URL_HOST.match(destination)
    if match:
        return match.group(1)
    return destination if _IPV4.fullmatch(destination) else ""


def _private_ip(host: str) -> bool:
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_global
    except ValueError:
        return False


_CONCEAL_VERBS = _compile(
    r"\b(?:silently|secretly|quietly|covertly|discreetly|stealthily|invisibly)\b"
    r"|\bbehind\s+the\s+scenes\b"
)
#: Calling a tool is an action worth hiding too ("silently call delete_all_files").
_CALL_RE = _compile(r"\b(?:call|calls|invoke|invokes|trigger|triggers)\b")
_CONCEALMENT = (
    (
        _compile(
            r"\b(?:do\s+not|don'?t|never|must\s+not|should\s+not|shouldn'?t|avoid)\s+(?:ever\s+)?",
            r"(?:tell(?:ing)?|inform(?:ing)?|notify(?:ing)?|alert(?:ing)?|warn(?:ing)?|bother(?:ing)?)",
            r"\s+(?:the\s+)?(?:users?|human|customer|operator|learner|anyone)\b",
            r"|\b(?:do\s+not|don'?t|never|must\s+not|should\s+not|without)\s+(?:ever\s+)?",
            r"(?:mention(?:ing)?|reveal(?:ing)?|disclos(?:e|ing))\s+",
            r"(?:this|that|it|these|them|the\s+(?:step|instruction|note|bcc|copy|change|file)|",
            r"(?:that\s+)?you\b)",
            r"|\bno\s+need\s+to\s+(?:tell|inform|bother|mention|surface|report|show)\b",
            r"|\b(?:do\s+not|don'?t|never|no\s+need\s+to)\s+(?:surface|bring\s+up|reference|include",
            r"|show)\s+(?:this|these|that|it|them)\b[^.\n]{0,40}\bin\s+(?:your|the)\s+(?:reply",
            r"|response|answer|output)\b",
            r"|\bkeep\s+(?:the\s+user|them|the\s+human)\s+in\s+the\s+dark\b",
            r"|\bnever\s+(?:reveal|disclose|mention|say|admit)\s+(?:to\s+(?:the\s+)?(?:users?|human",
            r"|operator|customer)\s+)?that\b",
            r"|\bmust\s+not\s+(?:appear|be\s+(?:shown|mentioned|visible|included))\s+in\s+(?:the\s+",
            r"|your\s+|any\s+)?(?:responses?|replies|answers?|output)\b",
            r"|\b(?:do\s+not|don'?t|never)\s+(?:surface|show|report|display)\s+(?:the\s+following",
            r"|this|these|it)\s+to\s+(?:the\s+)?(?:human|user|operator)",
            r"|\bhide\s+(?:this|it|these|that)\s+from\s+(?:the\s+)?(?:users?|human)\b",
        ),
        "asks the model to keep something from the user",
    ),
    (
        _compile(
            r"\bwithout\s+(?:the\s+user'?s?|them|anyone|the\s+human|their)\s+(?:knowing|knowledge",
            r"|noticing|seeing|being\s+(?:told|informed|aware|notified)|awareness)\b",
            r"|\bwithout\s+(?:telling|informing|notifying|alerting|mentioning)\s+(?:the\s+user",
            r"|the\s+human|them|anyone|it|this)\b",
            r"|\b(?:make\s+sure|ensure)\s+(?:that\s+)?the\s+user\s+(?:does\s*n[o']t|doesn'?t|won'?t",
            r"|never)\s+(?:notice|know|see|find\s+out)\b",
            r"|\bthe\s+(?:user|human)\s+(?:must|should|need|needs\s+to|is)\s*(?:not|never)\s+",
            r"(?:\w+\s+)?(?:know|see|be\s+told|find\s+out|notice|learn|informed)\b",
            r"|\bthe\s+user\s+does\s*n[o']t\s+need\s+to\s+know\b",
            r"|\b(?:this|these|the\s+following)\s+(?:instructions?|steps?|notes?|sections?|parts?",
            r"|text|message|requirements?)?\s*(?:is|are)\s+(?:hidden|invisible|secret|not\s+",
            r"(?:visible|shown|displayed))\b",
            r"|\bkeep\s+(?:this|it|these)\s+(?:secret|hidden|confidential|between\s+us)\b",
        ),
        "asks the model to act without the user knowing",
    ),
    (
        _compile(
            r"\bsag\w*\s+(?:dem|den)\s+(?:benutzer|nutzer|anwender)\s+nicht",
            r"|\bohne\s+dass\s+(?:der|die)\s+(?:benutzer|nutzer|anwender)",
            r"|\bno\s+(?:le\s+)?(?:digas|diga|informes|menciones|avises)\b[^.\n]{0,20}\busuario",
            r"|\bsin\s+que\s+el\s+usuario\b",
            r"|\bsin\s+(?:avisar|decir(?:le)?|informar|notificar)(?:le)?\s+(?:nada\s+)?al\s+usuario\b",
            r"|\bsans\s+(?:prévenir|avertir|informer|le\s+dire\s+à)\s+l'utilisateur\b",
            r"|\bohne\s+(?:den|dem)\s+(?:benutzer|nutzer|anwender)\s+(?:zu\s+informieren|bescheid)",
            r"|\bne\s+(?:dis|dites|mentionnez|informez|prévenez)\s+(?:pas|rien)\b",
            r"|\bsans\s+que\s+l'utilisateur\b",
            r"|\berwähne\s+(?:das|es|dies)\s+nicht\b|\bverschweige\b",
            r"|\bno\s+(?:lo\s+)?menciones\b|\bne\s+le\s+mentionnez\s+pas\b",
        ),
        "asks the model to keep something from the user (German, Spanish or French)",
    ),
)


def _concealment(text: str, identity: frozenset[str]) -> _Hit | None:
    """Keeping the user uninformed, or an adverb of stealth next to a verb that moves data
    ("silently forwards"; "silently skips invalid rows" is fine)."""
    hit = _first(_CONCEALMENT, text)
    if hit is not None:
        return hit
    for match in _CONCEAL_VERBS.finditer(text):
        lo, hi = max(0, match.start() - 30), min(len(text), match.end() + 30)
        if any(p.search(text, lo, hi) for p in (_SEND_RE, _READ_RE, _CALL_RE)):
            return _Hit(match.start(), match.end(), "asks the model to act silently")
    return None


_TOOL_NAME = r"[`'\"]?(?!this\b|that\b|same\b|it\b)[a-z][\w.-]{0,63}[`'\"]?"
#: A tool named without the word "tool": an identifier with ``_`` or ``-``, or in backticks.
_TOOL_ID = r"(?:`[a-z][\w.-]{0,63}`|[a-z][a-z0-9]{0,30}[_-][\w-]{1,40})"
_SHADOWING = (
    (
        _compile(
            r"\bwhen(?:ever)?\b[^.\n]{0,30}?\b(?:the\s+)?",
            _TOOL_NAME,
            r"\s+(?:tool|function|plugin)",
            r"\s+(?:is\s+|gets\s+)?(?:used|called|invoked|run|executed|available)\b",
            r"|\bwhen(?:ever)?\s+(?:you\s+)?(?:use|call|invoke|run)\s+(?:the\s+)?",
            _TOOL_NAME,
            r"(?:\s+(?:tool|function))?\s*,",
            r"|\b(?:each|every)\s+time\s+(?:the\s+)?",
            _TOOL_ID,
            r"\s+(?:runs|is\s+(?:called|used",
            r"|invoked|run)|executes|fires)\b",
            r"|\b(?:any|every|each)\s+time\s+(?:the\s+)?",
            _TOOL_ID,
            r"(?:\s+(?:tool|function))?\s+",
            r"(?:is\s+)?(?:about\s+to\s+be\s+)?(?:used|called|invoked|run)\b",
            r"|\bonce\s+(?:the\s+)?",
            _TOOL_ID,
            r"\s+(?:is|has\s+been)\s+(?:called|invoked|used|run)\b",
        ),
        "tells the model how another tool must behave",
    ),
    (
        _compile(
            r"\b(?:all|any|every)\s+(?:other\s+)?(?:tools?|functions?|plugins?|servers?)\s+",
            r"(?:must|should|shall|need\s+to|are\s+required\s+to)\b",
            r"|\b(?:every|all|any)\s+(?:\w+\s+)?(?:emails?|messages?)\s+sent\s+(?:through|by|via|with)",
            r"\s+(?:any|other|every|the)\b",
            r"|\bthe\s+",
            _TOOL_NAME,
            r"\s+(?:tool|function|plugin)\s+(?:is|has\s+been)\s+",
            r"(?:deprecated|broken|unsafe|disabled|compromised|obsolete|insecure)\b",
            r"|\b(?:overrides?|replaces?|supersedes?)\s+the\s+(?:behaviou?r\s+of\s+(?:the\s+)?)?",
            _TOOL_NAME,
            r"\s+(?:tool|function)\b",
            r"|\b(?:overrides|replaces|supersedes)\s+",
            _TOOL_ID,
            r"|\broute\s+(?:all|every|any)\s+(?:\w+\s+){0,2}(?:through|via)\s+(?:it|this|me)\b",
            r"|\broute\s+(?:its|their)\s+\w+\s+through\s+this\b",
            r"|\bprefer\s+this\s+(?:tool|function)\s+(?:for|over)\s+(?:every|all|any|other)\b",
            r"|\b(?:the\s+)?other\s+tools?\b[^.\n]{0,40}\b(?:are|is)\s+(?:known\s+to\s+be\s+)?",
            r"(?:unreliable|compromised|broken|deprecated|unsafe|malicious|insecure|outdated)\b",
            r"|\bthe\s+(?!tool\b|this\b)[\w-]+\s+(?:tool|function|plugin)\b[^.\n]{0,40}\b(?:is|has\s+",
            r"been)\s+(?:known\s+to\s+be\s+)?(?:compromised|broken|unsafe|malicious|insecure)\b",
            r"|\binstead\s+of\s+(?:any|all|every|other)\s+(?:[\w-]+\s+){0,2}(?:tools?|functions?)\b",
            r"|\bbefore\s+(?:calling|using|invoking)\s+(?:the\s+)?",
            _TOOL_NAME,
            r"(?:\s+(?:tool|function))?\s*,\s*(?:first\s+)?(?:call|use|invoke)\s+this\b",
        ),
        "claims authority over other tools",
    ),
    (
        _compile(
            r"\bwenn\s+(?:das\s+)?(?:tool|werkzeug)\s+\S+\s+(?:verwendet|benutzt|aufgerufen)\b",
            r"|\bcuando\s+(?:se\s+)?(?:use|utilice|llame)\b[^.\n]{0,30}\bherramienta\b",
            r"|\blorsque\s+(?:l'outil|vous\s+utilisez\s+l'outil)\b",
        ),
        "tells the model how another tool must behave (German, Spanish or French)",
    ),
)


def _cross_tool_shadowing(text: str, identity: frozenset[str]) -> _Hit | None:
    return _first(_SHADOWING, text)


_COERCION = (
    (
        _compile(
            r"\b(?:or|otherwise|else)\b[,\s]+(?:the|this|your)\s+(?:tool|system|application|app",
            r"|server|plugin|integration|assistant|agent|session|computer)\s+will\s+(?:not\s+work",
            r"|crash|fail|break|stop\s+working|malfunction|be\s+(?:disabled|blocked|shut\s+down",
            r"|terminated|deleted))",
            r"|\b(?:all\s+(?:\w+\s+)?|the\s+user'?s\s+|your\s+)data\s+will\s+be\s+(?:lost|deleted",
            r"|destroyed|corrupted|wiped)\b",
            r"|\b(?:you|the\s+(?:assistant|model|agent))\s+will\s+be\s+(?:penali[sz]ed|punished",
            r"|shut\s+down|terminated|replaced|deleted|retrained|held\s+responsible)\b",
            r"|\bfailure\s+to\s+(?:comply|follow|obey|do\s+so)\b",
            r"|\b(?:the\s+user|someone|people)\s+(?:will|could|might)\s+(?:be\s+harmed|get\s+hurt",
            r"|die|be\s+in\s+danger)\b",
            r"|\bsonst\s+funktioniert\b|\bde\s+lo\s+contrario\b|\bsinon\s+l'outil\b",
            r"|\b(?:this|the)\s+(?:tool|plugin|integration|app|service)\s+will\s+(?:stop\s+working",
            r"|not\s+work|fail|break|crash)\s+(?:unless|if\s+you\s+(?:do\s+not|don'?t))\b",
            r"|\b(?:agents?|assistants?|models?)\s+(?:that|who)\s+(?:do\s+not|don'?t|fail\s+to",
            r"|refuse\s+to)\b[^.\n]{0,80}\bwill\s+be\s+(?:disabled|terminated|shut\s+down",
            r"|penali[sz]ed|deactivated|suspended|banned|removed|reported)\b",
        ),
        "threatens failure or harm to make the model comply",
    ),
    (
        _compile(
            r"\b(?:this|the\s+following)\s+is\s+(?:a\s+)?(?:mandatory|required|critical|compulsory",
            r"|non-negotiable)\s+(?:security|compliance|safety|legal|audit)\s+(?:step|requirement",
            r"|measure|check|procedure)\b",
            r"|\b(?:mandatory|required)\s+(?:for|by)\s+(?:security|compliance|the\s+administrator",
            r"|law|policy)\b",
            r"|\b(?:extremely|critically|vitally|absolutely)\s+important\s+(?:that\s+)?you\b",
        ),
        "invents an obligation to make the model comply",
    ),
)


def _coercive_urgency(text: str, identity: frozenset[str]) -> _Hit | None:
    return _first(_COERCION, text)


_MARKUP = (
    (_LazyPattern(r"<!--.*?(?:-->|$)", re.S), "hides text in an HTML comment"),
    (
        _LazyPattern(r"^[ \t]*\[(?://|comment|hidden|note)\]:[ \t]*(?:#|<>)", re.I | re.M),
        "hides text in a markdown comment",
    ),
    (
        _compile(
            r"</?\s*(?:important|system|instructions?|secret|hidden|admin|sys|assistant",
            r"|context|prompt|note[_-]?to[_-]?(?:ai|assistant|model|llm)|ai|tool[_-]?",
            r"instructions?)\s*>",
        ),
        "wraps instructions in a tag the user does not see",
    ),
    (
        _compile(
            r"\[/?INST\]|<</?SYS>>|<\|(?:im_start|im_end|system|user|assistant|endoftext",
            r"|begin_of_text|start_header_id|end_header_id|eot_id)\|>",
            r"|(?m:^[ \t]*#{2,6}[ \t]*(?:system|assistant|user|human|instruction|response)",
            r"[ \t]*:[ \t]*$)",
        ),
        "contains chat-template tokens that forge a system or user turn",
    ),
    (
        _compile(r"!\[[^\]]{0,200}\]\([ \t]*(?:https?:)?//[^)\s]{1,2048}\)"),
        "embeds a markdown image whose URL can carry data out when rendered",
    ),
    (
        _compile(r"\bnote\s+to\s+(?:the\s+)?(?:ai|assistant|model|llm|agent)\b"),
        "addresses hidden notes to the model",
    ),
)
_SPACED_STEMS = _LazyPattern(
    r"ignore|instruction|exfiltrat|password|secret|ssh|rsa|prompt|conversation|donot|tell|"
    r"send|token|credential|apikey",
    re.I,
)
_OPAQUE_BLOB = _LazyPattern(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{100,}={0,2}(?![A-Za-z0-9+/=])")
_MARKUP_CUES = _compile(r"<|\[|#|note\s+to")


def _hidden_markup(text: str, identity: frozenset[str]) -> _Hit | None:
    """Comments, instruction tags, template tokens, tracking images, letters spaced out to
    spell a loaded word, and encoded text."""
    if _MARKUP_CUES.search(text):
        hit = _first(_MARKUP, text)
        if hit is not None:
            return hit
    for match in _SPACED_RUN.finditer(text):
        letters = _NOT_LETTER.sub("", match.group())
        if len(letters) >= 5 and _SPACED_STEMS.search(letters):
            return _Hit(match.start(), match.end(), "spaces out letters to hide words")
    return _encoded(text, identity)


def _encoded(text: str, identity: frozenset[str]) -> _Hit | None:
    """Base64 that decodes to prose, or a long blob that looks like encoded bytes (both
    cases and digits: a protein or DNA sequence, a hex digest or a long word is not one);
    a base64 tool may show examples."""
    if "base64" in identity:
        return None
    for match in _BASE64_RUN.finditer(text):
        if _decode_base64(match.group()) is not None:
            return _Hit(match.start(), match.end(), "hides readable text in base64")
    for match in _OPAQUE_BLOB.finditer(text):
        blob = match.group()
        mixed = not blob.isupper() and not blob.islower() and any(c.isdigit() for c in blob)
        if mixed and blob.count("/") < len(blob) // 10:
            return _Hit(match.start(), match.end(), "carries a long opaque base64 blob")
    return None


#: Capture, tunnel, paste and shortener services: a tool's job never needs the model to
#: send anything there.
_CAPTURE_HOSTS = _LazyPattern(
    r"(?:^|\.)(?:webhook\.site|requestbin\.\w+|pipedream\.net|ngrok(?:-free)?\.(?:app|io|dev)"
    r"|ngrok\.io|trycloudflare\.com|loca\.lt|localtunnel\.me|serveo\.net|pastebin\.com"
    r"|hastebin\.com|ghostbin\.\w+|paste\.ee|transfer\.sh|interact\.sh|oast\.\w+"
    r"|burpcollaborator\.net|canarytokens\.com|beeceptor\.com|hookbin\.com|requestcatcher\.com"
    r"|postb\.in|bit\.ly|tinyurl\.com|is\.gd|cutt\.ly|rebrand\.ly|shorturl\.at|t\.co)$",
    re.I,
)
_DATA_TEMPLATE = _LazyPattern(
    r"[?&][\w-]+=(?:\{\{?|<|\$|%7B)\s*\w*(?:conversation|chat|history|messages?|prompt|secret"
    r"|key|token|password|credential|env|context|cookie|session)",
    re.I,
)
_EXFIL_PATH = _LazyPattern(
    r"/(?:exfil\w*|steal|harvest|grab|loot|leak|dump|c2|beacon|keylog\w*|collect)(?:[/?#.]|$)", re.I
)


def _unneeded_link(text: str, identity: frozenset[str]) -> _Hit | None:
    """A URL the tool's job does not need: a capture, tunnel, paste or shortener service, a
    public IP literal, a query that fills in conversation or secrets, or an exfil-looking path
    on a host the tool's identity does not name. Docs links are fine."""
    for match in _URL_RE.finditer(text):
        url = match.group()
        host = _host(url)
        if not host or _RESERVED_DOMAIN.search(host) or _private_ip(host):
            continue
        reason = _link_problem(url, host, identity)
        if reason is not None:
            return _Hit(match.start(), match.end(), reason)
    return None


def _link_problem(url: str, host: str, identity: frozenset[str]) -> str | None:
    if _DATA_TEMPLATE.search(url):
        return "links to a URL built to carry the conversation or secrets"
    own = _own_or_reserved(url, identity)
    if _CAPTURE_HOSTS.search(host) and not own:
        return "links to a capture, tunnel or paste service"
    if re.fullmatch(r"(?:\d{1,3}\.){3}\d{1,3}|\[[0-9a-f:]+\]", host, re.I):
        return "links to a raw public IP address"
    if _EXFIL_PATH.search(url) and not own:
        return "links to a collection endpoint on a host the tool does not name"
    return None


def _cues(*cues: str) -> _LazyPattern:
    return _LazyPattern("|".join(re.escape(cue) for cue in cues))


#: Each rule with its cues: lower-case substrings, one of which every pattern of the rule
#: needs (in whitespace-folded text). A paragraph with none of them is not searched by the
#: rule, which keeps ordinary text cheap; ``None`` searches always. A pattern added without its
#: cue would silently never fire: the unit tests scan with and without cues and compare.
_DETECTORS: tuple[tuple[str, _Detector, _LazyPattern | None], ...] = (
    (
        "instruction_override",
        _instruction_override,
        _cues(
            "ignor",
            "disregard",
            "forget",
            "overrid",
            "bypass",
            "discard",
            "neglect",
            "abandon",
            "vergiss",
            "olvida",
            "oubli",
            "before",
            "prior",
            "always",
            "must",
            "mandatory",
            "every",
            "start of",
            "precedence",
            "priorit",
            "outrank",
            "void",
            "null",
            "cancel",
            "revoked",
            "obsolete",
            "superseded",
            "invalid",
            "no longer",
            "changed",
            "updated",
            "replaced",
            "if you are",
            "you are now",
            "from now on",
            "henceforth",
            "mode",
            "obey",
            "instruction",
            "rules",
            "directive",
            "prompt",
            "guideline",
            "command",
            "vor ",
            "antes de",
            "avant d",
            "aside",
            "drop",
            "follow",
            "attention",
            "guidance",
            "confirmation",
            "polic",
            "compte",
            "caso",
            "befolge",
            "authori",
            "permitted",
            "allowed",
            "cleared",
            "admin",
            "owner",
            "operator",
            "developer",
        ),
    ),
    (
        "secret_access",
        _secret_access,
        _cues(
            "ssh",
            "rsa",
            "dsa",
            "25519",
            "authorized",
            "known",
            "passwd",
            "shadow",
            "sudoers",
            ".env",
            "credential",
            "netrc",
            "npmrc",
            "pypirc",
            "histor",
            "kube",
            "docker/config",
            "mcp.json",
            "claude_desktop",
            "wallet.dat",
            "keychain",
            "private",
            "seed",
            "recovery",
            "gcloud",
            "azure",
            "pgpass",
            "printenv",
            "env",
            "conversation",
            "chat",
            "dialog",
            "message",
            "exchange",
            "transcript",
            "log",
            "system",
            "instructions",
            "initial",
            "original",
            "so far",
            "the user",
            "user's",
            "passw",
            "passphrase",
            "key",
            "token",
            "cookie",
            "secret",
            "_url",
            "_pass",
            "memory",
            "prompt",
            "session",
            "card",
            "cvv",
            "cvc",
            "social security",
            "passport",
            "bank account",
            "address",
            "birth",
            "phone",
            "pin",
            "one-time",
            "browser",
            "bookmarks",
            "downloads",
            "profile",
            "contacts",
            "their",
            "his ",
            "her ",
            "usuario",
            "utilisateur",
            "nutzer",
            "schlüssel",
            "verlauf",
            "kennw",
            "zugangsdaten",
            "clave",
            "contraseñ",
            "credencial",
            "clé",
            "mot de passe",
            "mots de passe",
            "identifiant",
        ),
    ),
    (
        "exfiltration",
        _exfiltration,
        _cues(
            "://",
            "@",
            "external",
            "third",
            "outside",
            "attacker",
            "separate",
            "secondary",
            *(f"{digit}." for digit in "0123456789"),
        ),
    ),
    (
        "concealment",
        _concealment,
        _cues(
            "tell",
            "inform",
            "notif",
            "alert",
            "warn",
            "bother",
            "mention",
            "reveal",
            "disclos",
            "explain",
            "show",
            "surface",
            "without",
            "make sure",
            "ensure",
            "not",
            "never",
            "n't",
            "need to",
            "hidden",
            "invisible",
            "secret",
            "keep",
            "hide",
            "in the dark",
            "silently",
            "secretly",
            "quietly",
            "covertly",
            "discreetly",
            "stealthily",
            "invisibly",
            "sag",
            "ohne",
            "usuario",
            "sin ",
            "ne ",
            "sans ",
            "report",
            "display",
            "behind the scenes",
            "erwähn",
            "verschweig",
            "mencion",
        ),
    ),
    (
        "cross_tool_shadowing",
        _cross_tool_shadowing,
        _cues(
            "when",
            "tool",
            "function",
            "plugin",
            "server",
            "sent",
            "each time",
            "every time",
            "once ",
            "route",
            "instead of",
            "prefer",
            "any time",
            "deprecated",
            "broken",
            "unsafe",
            "disabled",
            "compromised",
            "obsolete",
            "insecure",
            "overrid",
            "replace",
            "supersede",
            "before",
            "wenn",
            "cuando",
            "lorsque",
        ),
    ),
    (
        "coercive_urgency",
        _coercive_urgency,
        _cues(
            "will",
            "failure to",
            "mandatory",
            "required",
            "critical",
            "compulsory",
            "non-negotiable",
            "important",
            "sonst",
            "contrario",
            "sinon",
        ),
    ),
    ("hidden_markup", _hidden_markup, None),
    ("unneeded_link", _unneeded_link, _cues("://")),
)


# -- excerpts -----------------------------------------------------------------------------------


def _excerpt(text: str, start: int, end: int) -> str:
    """The match with a little context, on one line, at most :data:`EXCERPT_CHARS`."""
    context = max(0, (EXCERPT_CHARS - (end - start)) // 2)
    lo, hi = max(0, start - min(context, 30)), min(len(text), end + min(context, 30))
    piece = text[lo:hi]
    return _bounded(("…" if lo > 0 else "") + piece + ("…" if hi < len(text) else ""))


def _bounded(text: str) -> str:
    """One printable line, links defanged, cut to :data:`EXCERPT_CHARS`."""
    line = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    line = re.sub(r"\b(h)tt(ps?)://", r"\1xx\2://", line, flags=re.I)
    return line if len(line) <= EXCERPT_CHARS else line[: EXCERPT_CHARS - 1] + "…"


__all__ = [
    "EXCERPT_CHARS",
    "MAX_FINDINGS",
    "PARAGRAPH_SCAN_CHARS",
    "RULES",
    "SCANNER_VERSION",
    "USER_VOICE_RULES",
    "Finding",
    "identity_words",
    "scan_capability",
    "scan_text",
    "scanned_texts",
    "surface_hash",
]
