"""The embedded default stack (``capdisc up``): Redis, one indexing worker, one discovery worker
and the watcher, on one machine with nothing installed but Python.

The stack writes ``.capdisc/stack.json`` (the Redis URL, the pid of ``up`` and of each child) so
that commands run from the project directory find it with no flags (:mod:`capdisc.stackfile`
reads it; so does ``celery -A capdisc_workers.celery_app``). ``CAPDISC_REDIS_URL`` overrides
both (it points ``up`` at an existing Redis and the other commands at any stack).

``up`` supervises its children (:mod:`capdisc_producers.supervisor`): one that exits is reaped,
reported with the tail of its log, and restarted with backoff; its own redis-server comes back
on the same port and directory (AOF: the data is kept). ``capdisc status`` shows each child's
restarts. The watcher runs in a thread and rides out Redis restarts.

Stopping: SIGINT (Ctrl-C), SIGTERM, and SIGHUP unless it was ignored (``nohup``) stop ``up``
however it was started: its handlers are set explicitly, so a SIGINT that a non-interactive
shell ignored for its background jobs still works. It stops the watcher, then the workers, then
Redis (SIGTERM, SIGKILL after 15 s; a second signal kills at once), removes ``stack.json`` and
exits 0: a stop that was asked for is a success. A failure exits 2 with the reason. If ``up``
itself is killed, the kernel stops the children (the supervisor module says how).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
import structlog

from capdisc import keys
from capdisc.client import Answer, Client
from capdisc.errors import CapdiscError, RedisUnavailableError, StackRunningError
from capdisc.identity import auth
from capdisc.localredis import LocalRedis, start_redis
from capdisc.registry.store import tenant_version
from capdisc.settings import Settings, mask_url
from capdisc.stackfile import LOCK_FILE, REDIS_ENV, STACK_FILE, STATE_DIR
from capdisc.stackfile import find_stack as find_stack
from capdisc.status import forget_worker, live_workers, read_heartbeats, record_supervised
from capdisc_producers.access import TOKEN_ENV as TOKEN_ENV
from capdisc_producers.access import Access as Access
from capdisc_producers.access import resolve_access
from capdisc_producers.credentials import StackSecrets
from capdisc_producers.publisher import Publisher
from capdisc_producers.supervisor import Child, Supervisor, child_options, exit_reason, log_tail
from capdisc_producers.sync import SyncReport, sync_directory
from capdisc_producers.watcher import watch_directory

#: How a discovery worker is started (``python -m capdisc_workers.discovery``).
DISCOVERY_ARGV = [sys.executable, "-m", "capdisc_workers.discovery"]


def indexing_argv(log_level: str = "INFO") -> list[str]:
    """How an indexing worker is started: a solo Celery worker on the indexing queue, with no
    gossip, mingle or Celery heartbeat (capdisc keeps its own); add ``-n NAME`` for a node
    name of its own."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "capdisc_workers.celery_app",
        "worker",
        "-Q",
        "indexing",
        "-P",
        "solo",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        log_level,
    ]


AUTH_ENV = "CAPDISC_AUTH"
KEYS_ENV = "CAPDISC_AUTH_KEYS_FILE"
PASSWORD_FILE_ENV = "CAPDISC_REDIS_PASSWORD_FILE"
SNAPSHOT_DIR_ENV = "CAPDISC_SNAPSHOT_DIR"
#: Lifetime of the tokens ``up`` issues itself for each of its own requests and publishes.
SERVICE_TOKEN_TTL_S = 3600
WORKER_START_TIMEOUT_S = 120.0


def resolve_redis_url(explicit: str | None, environ: Mapping[str, str], cwd: Path) -> str:
    """``--redis-url``, else ``CAPDISC_REDIS_URL``, else the running stack's (with the password
    from its password file), else an error."""
    return resolve_access(explicit, None, environ, cwd).redis_url


def resolve_token(explicit: str | None, environ: Mapping[str, str], cwd: Path) -> str | None:
    """``--token``, else ``CAPDISC_TOKEN``, else the running stack's admin token when its Redis
    is the one used (see :func:`resolve_access`)."""
    return resolve_access(None, explicit, environ, cwd).token


def without_password(url: str) -> str:
    """``url`` without the password it may carry (the user, if any, is kept)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    where = parts.netloc.rsplit("@", 1)[1]
    netloc = f"{parts.username}@{where}" if parts.username else where
    return urlunsplit(parts._replace(netloc=netloc))


#: How often the supervision loop looks at the children and the stop request.
TICK_S = 0.2
#: How often the children's state is written for ``capdisc status`` (also after each change).
RECORD_EVERY_S = 2.0
#: How long the watcher thread has to finish once asked to stop.
WATCHER_JOIN_S = 5.0
#: Children stopped first, then :data:`REDIS_CHILD` (the workers need Redis to stop cleanly).
WORKER_CHILDREN = ("indexing", "discovery")
REDIS_CHILD = "redis"

log = structlog.get_logger("capdisc.stack")


class StopRequested(BaseException):
    """A stop signal arrived while ``up`` was starting; unwinds the start. A BaseException,
    like KeyboardInterrupt: a stop that was asked for is not an error, and no ``except
    Exception`` on the way may swallow it."""


class StopSignals:
    """SIGINT and SIGTERM (and SIGHUP unless ignored) ask ``up`` to stop, whatever handlers the
    parent left: they are set explicitly with :func:`signal.signal`. While starting, the first
    signal raises :class:`StopRequested`; once serving, it only records the request, which the
    supervision loop polls (setting an Event or logging from a handler could deadlock on a lock
    the interrupted code holds). A second signal asks for the children to be killed at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.serving = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def forced(self) -> bool:
        return self.count > 1

    def install(self) -> None:
        wanted = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            wanted.append(signal.SIGHUP)
        for signum in wanted:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            if handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.signum is not None:
            return
        self.signum = signum  # nothing else here: logging from a handler could deadlock
        if not self.serving:
            raise StopRequested(signum)


@dataclass
class Stack:
    """The processes ``capdisc up`` runs, supervised, and how to stop them."""

    project: Path
    settings: Settings
    say: Callable[[str], None]
    redis_server: LocalRedis | None = None
    redis_url: str = ""
    #: The keyring tokens are signed with (None: auth off).
    keys: auth.KeyringFile | None = None
    _password: str | None = field(default=None, repr=False)
    supervisor: Supervisor = field(init=False)
    _record_client: redis.Redis | None = None
    _recorded_at: float = 0.0
    _dirty: bool = True

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(
            self.say,
            on_exit=self._child_exited,
            on_change=self._child_changed,
            log_max_bytes=self.settings.up_log_max_bytes,
        )

    @property
    def state_dir(self) -> Path:
        return self.project / STATE_DIR

    @property
    def secrets(self) -> StackSecrets:
        return StackSecrets.under(self.state_dir)

    @property
    def auth(self) -> bool:
        """Tokens are required unless the settings turn auth off (``CAPDISC_AUTH=off``)."""
        return self.settings.auth is not False

    def start(self, environ: Mapping[str, str]) -> str:
        """Start Redis (unless one is given) and the two workers; return the Redis URL (with
        its password: keep it in memory)."""
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        for notice in self.secrets.tighten():
            self.say(notice)
        env = {**environ, **self._start_auth(), **self._start_redis(environ)}
        if self.settings.snapshot_dir is None and SNAPSHOT_DIR_ENV not in environ:
            # the discovery worker maps its last index from here when it starts again
            env[SNAPSHOT_DIR_ENV] = str((self.state_dir / "snapshots").resolve())
        self._record_client = redis.Redis.from_url(
            self.redis_url, socket_connect_timeout=1.0, socket_timeout=2.0
        )
        self.spawn(
            "indexing",
            [*indexing_argv(self.settings.log_level), "-n", f"indexing-{os.getpid()}@%h"],
            env,
        )
        self.spawn("discovery", DISCOVERY_ARGV, env)
        self._write_stack_file()
        return self.redis_url

    def _start_auth(self) -> dict[str, str]:
        """With auth on: the keyring (``auth_keys_file``, else the stack's own, made at the first
        start) and a fresh admin token for the CLI; the workers' environment."""
        if not self.auth:
            return {AUTH_ENV: "off"}
        path = self.settings.auth_keys_file or self.secrets.keys_file
        keyring = (
            auth.load_keyring(path)
            if self.settings.auth_keys_file
            else self.secrets.ensure_keyring(time.time())
        )
        self.keys = auth.KeyringFile(path)
        self.secrets.write_admin_token(keyring, time.time())
        return {AUTH_ENV: "on", KEYS_ENV: str(path.resolve())}

    def _start_redis(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Its own redis-server with a password (kept in the password file), unless
        ``CAPDISC_REDIS_URL`` names one; the workers' environment."""
        if environ.get(REDIS_ENV):
            self.redis_url = environ[REDIS_ENV]
            self._keep_password(self.redis_url)
            return {}
        self._password = self.secrets.ensure_password()
        self.supervisor.add(REDIS_CHILD, self._launch_redis, self.state_dir / "redis" / "redis.log")
        assert self.redis_server is not None
        self.redis_url = self.redis_server.client_url
        return {
            REDIS_ENV: self.redis_server.url,
            PASSWORD_FILE_ENV: str(self.secrets.password_file.resolve()),
        }

    def _launch_redis(self) -> subprocess.Popen[bytes]:
        """Start redis-server, again on the same port and directory after the first time."""
        port = self.redis_server.port if self.redis_server is not None else None
        self.redis_server = start_redis(
            self.state_dir / "redis",
            port=port,
            password=self._password,
            **child_options(signal.SIGTERM),
        )
        return self.redis_server.process

    def _keep_password(self, url: str) -> None:
        """A given URL's password goes to the password file, so ``stack.json`` need not hold
        it (and commands in the project find it there)."""
        password = urlsplit(url).password
        if password:
            self._password = unquote(password)
            auth.write_private(self.secrets.password_file, self._password + "\n")

    def service_token(self) -> str | None:
        """A short-lived admin token for ``up``'s own requests and the watcher's events (None
        with auth off), signed with the keyring as it is now."""
        if self.keys is None:
            return None
        return auth.issue(
            self.keys.current(),
            tenant=auth.ALL_TENANTS,
            user="capdisc-up",
            grants=["admin"],
            ttl_s=SERVICE_TOKEN_TTL_S,
            now=time.time(),
        )

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        """Start a worker, supervised; it logs to ``.capdisc/logs/NAME.log``."""
        log_path = self.state_dir / "logs" / f"{name}.log"

        def start() -> subprocess.Popen[bytes]:
            with log_path.open("ab") as out:
                return subprocess.Popen(
                    argv,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    cwd=self.project,
                    **child_options(signal.SIGKILL),
                )

        self.supervisor.add(name, start, log_path)

    def _write_stack_file(self) -> None:
        """``stack.json``: where Redis is (no password: the file beside it holds that), whether
        ``up`` runs it, whether auth is on, where the keyring and the CLI's admin token are, the
        pids."""
        data: dict[str, Any] = {
            "redis_url": without_password(self.redis_url),
            "pid": os.getpid(),
            "started_at": time.time(),
            "children": self.supervisor.pids(),
            # whether up runs (and restarts) its Redis, or was given one (CAPDISC_REDIS_URL)
            "redis_supervised": REDIS_CHILD in self.supervisor.children,
            "auth": self.auth,
        }
        if self._password:
            data["redis_password_file"] = str(self.secrets.password_file.resolve())
        if self.keys is not None:
            data.update(
                auth_keys_file=str(self.keys.path.resolve()),
                token_file=str(self.secrets.token_file.resolve()),
            )
        path = self.state_dir / STACK_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(temporary, path)

    def wait_for_workers(self, client: redis.Redis, kinds: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            exited = self.supervisor.exited()
            if exited is not None:
                raise CapdiscError(
                    f"{exited.name} exited at start ({_exit_of(exited)}); fix "
                    f"what its log says and start "
                    f"again. Last lines of {exited.log_path}:\n"
                    f"{log_tail(exited.log_path)}"
                )
            if kinds <= {w["kind"] for w in live_workers(client) if self._started_here(w)}:
                return
            time.sleep(0.1)
        raise CapdiscError(
            f"workers did not report ready within {timeout_s:.0f} s; see {self.state_dir / 'logs'}"
        )

    def _started_here(self, heartbeat: dict[str, Any]) -> bool:
        """Whether ``heartbeat`` is one of this ``up``'s children's: the workers of an ``up``
        killed moments ago still look live for a while."""
        return heartbeat.get("host") == socket.gethostname() and heartbeat.get("pid") in set(
            self.supervisor.pids().values()
        )

    def supervise(self, signals: StopSignals, watcher: _Watcher) -> None:
        """Until a stop is asked for: restart children that exit, record their state."""
        while not signals.requested:
            self.supervisor.tick()
            self._record()
            if not watcher.is_alive():
                raise CapdiscError(
                    f"the registry watcher stopped ({watcher.error}); capdisc "
                    "up stops with it: fix the cause and start it again"
                )
            time.sleep(TICK_S)

    def unreachable(self, exc: redis.RedisError) -> RedisUnavailableError:
        """Why ``up`` stops when its Redis does not answer while it starts, and what to do."""
        if REDIS_CHILD in self.supervisor.children:
            return RedisUnavailableError(
                f"the Redis capdisc up started stopped answering ({exc}); see "
                f"{self.state_dir / 'redis' / 'redis.log'}, then start again"
            )
        return RedisUnavailableError(
            f"cannot reach the Redis at {mask_url(self.redis_url)} given in {REDIS_ENV} ({exc}): "
            f"start that Redis, or unset {REDIS_ENV} for capdisc up to run its own"
        )

    def _child_exited(self, child: Child, pid: int) -> None:
        """A dead worker's heartbeat goes at once (``capdisc status`` lists the live ones)."""
        if child.name in WORKER_CHILDREN and self._record_client is not None:
            _forget_heartbeats(self._record_client, pid)

    def _child_changed(self) -> None:
        self._dirty = True
        self._write_stack_file()

    def _record(self) -> None:
        due = time.monotonic() - self._recorded_at >= RECORD_EVERY_S
        if self._record_client is None or not (self._dirty or due):
            return
        children = {name: child.describe() for name, child in self.supervisor.children.items()}
        try:
            record_supervised(
                self._record_client,
                {name: {**info, "supervisor_pid": os.getpid()} for name, info in children.items()},
            )
        except redis.RedisError as exc:
            log.debug("supervised_record_failed", error=str(exc))
            return
        self._dirty, self._recorded_at = False, time.monotonic()

    def stop(self, force: Callable[[], bool] = lambda: False) -> None:
        """Stop the workers, then Redis; leave no child running and no stack file."""
        self.supervisor.stop(WORKER_CHILDREN, force=force)
        if self._record_client is not None:
            with contextlib.suppress(redis.RedisError):
                self._record_client.delete(keys.SUPERVISED)
            self._record_client.close()
        self.supervisor.stop([REDIS_CHILD], force=force)
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / STACK_FILE).unlink()


def _exit_of(child: Child) -> str:
    process = child.process
    return exit_reason(process.returncode) if process and process.returncode is not None else ""


def _forget_heartbeats(client: redis.Redis, pid: int) -> None:
    """Forget the heartbeats of the child ``pid`` of this host that exited; an entry that is no
    heartbeat (not JSON, not an object) is passed over (the sweep forgets it)."""
    host = socket.gethostname()
    try:
        for worker_id, entry in read_heartbeats(client).items():
            if isinstance(entry, dict) and entry.get("pid") == pid and entry.get("host") == host:
                forget_worker(client, worker_id)
    except redis.RedisError as exc:
        log.debug("heartbeat_forget_failed", pid=pid, error=str(exc))


class _Watcher(threading.Thread):
    """The registry watcher, in a thread of its own (children are started from the main
    thread only: see :mod:`capdisc_producers.supervisor`)."""

    def __init__(
        self,
        url: str,
        registry: Path,
        settings: Settings,
        say: Callable[[str], None],
        token: Callable[[], str | None],
    ) -> None:
        super().__init__(name="capdisc-watcher", daemon=True)
        self.token = token
        self.url = url
        self.registry = registry
        self.settings = settings
        self.say = say
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        client = redis.Redis.from_url(self.url)
        publisher = Publisher(
            self.url,
            token=lambda: self.token() or "",
            max_pending_tasks=self.settings.publish_max_pending_tasks,
        )
        try:
            watch_directory(
                client,
                publisher,
                self.registry,
                tenant=self.settings.tenant,
                max_bytes=self.settings.manifest_max_bytes,
                debounce_ms=self.settings.watch_debounce_ms,
                stop=self.stop_event,
                on_sync=lambda r: _report_sync(r, self.say),
            )
        except Exception as exc:
            self.error = exc
            log.exception("watcher_failed", registry=str(self.registry))
        finally:
            publisher.close()
            client.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(WATCHER_JOIN_S)


def run_up(
    project: Path,
    registry: Path,
    settings: Settings,
    environ: Mapping[str, str],
    say: Callable[[str], None],
) -> None:
    """Start everything, index ``registry``, print the ready line, then watch and supervise
    until SIGINT, SIGTERM or SIGHUP; stop everything in order."""
    with only_stack_here(project / STATE_DIR):
        signals = StopSignals()
        signals.install()
        stack = Stack(project=project, settings=settings, say=say)
        try:
            _run(stack, registry, settings, environ, signals)
        except StopRequested:
            pass
        finally:
            signals.serving = True  # from here a signal only hurries the stop
            if signals.signum is not None:
                log.info("stop_requested", signal=signal.Signals(signals.signum).name)
            say("stopping capdisc...")
            stack.stop(force=signals.forced)
            signals.restore()


@contextlib.contextmanager
def only_stack_here(state_dir: Path) -> Iterator[None]:
    """Hold ``state_dir``'s :data:`LOCK_FILE` while a stack runs there: a second ``capdisc up``
    in the same project is refused (:class:`StackRunningError`) rather than starting a second
    Redis on the same files and overwriting ``stack.json``. The lock goes with the process, so
    an ``up`` that was killed leaves none behind."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / LOCK_FILE, "a+") as handle:  # not inherited by the children
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise StackRunningError(_already_running(state_dir)) from exc
        yield


def _already_running(state_dir: Path) -> str:
    """Why ``up`` refuses to start beside the stack running in ``state_dir``."""
    try:
        running = json.loads((state_dir / STACK_FILE).read_text())
        where = f" (pid {running['pid']}, Redis at {mask_url(running['redis_url'])})"
    except (OSError, ValueError, KeyError, TypeError):
        where = " (it is still starting)"
    return (
        f"a capdisc stack already runs in {state_dir.parent}{where}: use it (capdisc status), "
        "or stop it first (Ctrl-C in its terminal) before starting another"
    )


def _run(
    stack: Stack,
    registry: Path,
    settings: Settings,
    environ: Mapping[str, str],
    signals: StopSignals,
) -> None:
    started = time.monotonic()
    url = stack.start(environ)
    settings = settings.with_changes(redis_url=url)
    stack.say(
        f"redis at {mask_url(url)}; starting workers (logs in {stack.state_dir / 'logs'})"
        + (
            ""
            if stack.auth
            else "; auth is OFF (CAPDISC_AUTH=off): requests are served as whoever they claim to be"
        )
    )
    try:
        answer = _index_and_check(stack, registry, settings)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if isinstance(exc, redis.AuthenticationError):
            raise
        raise stack.unreachable(exc) from exc
    stack.say(
        f"capdisc is ready in {time.monotonic() - started:.1f} s: "
        f"{answer.raw['total_indexed']} capabilities at index version "
        f"{answer.index_version}, watching {registry}. Try: {_cli_name()} discover "
        '"post a message to the team\'s slack channel"  (Ctrl-C stops everything)'
    )
    signals.serving = True
    watcher = _Watcher(url, registry, settings, stack.say, stack.service_token)
    watcher.start()
    try:
        stack.supervise(signals, watcher)
    finally:
        watcher.stop()


class IndexingProgress:
    """How far the indexing workers are with what ``up`` published, from their real signal:
    the acknowledgement of each event they applied (embedded and stored), against the events
    sent. A line at the first acknowledgements, then at most one each ``interval_s``, and one
    when all are in: ``embedding capabilities: 64/98``. Nothing when nothing was sent (a
    start that reuses what ``.capdisc/`` kept)."""

    def __init__(
        self,
        say: Callable[[str], None],
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say = say
        self.interval_s = interval_s
        self.clock = clock
        self.sent = 0
        self.applied = 0
        self._said_at: float | None = None

    def __call__(self, stage: str, count: int) -> None:
        if stage == "sent":
            self.sent += count
            return
        self.applied += count
        now = self.clock()
        done = self.applied >= self.sent
        if done or self._said_at is None or now - self._said_at >= self.interval_s:
            self.say(f"embedding capabilities: {self.applied}/{self.sent}")
            self._said_at = now


def _index_and_check(stack: Stack, registry: Path, settings: Settings) -> Answer:
    """Wait for the workers, publish ``registry`` (saying how far the workers are), and
    discover once from its version."""
    client = redis.Redis.from_url(settings.redis_url)
    publisher = Publisher(
        settings.redis_url,
        token=stack.service_token(),
        max_pending_tasks=settings.publish_max_pending_tasks,
    )
    try:
        started = time.monotonic()
        stack.wait_for_workers(client, {"indexing", "discovery"}, WORKER_START_TIMEOUT_S)
        stack.say(f"workers started in {time.monotonic() - started:.1f} s; publishing {registry}")
        report = sync_directory(
            client,
            publisher,
            registry,
            tenant=settings.tenant,
            max_bytes=settings.manifest_max_bytes,
            wait_s=120.0,
            progress=IndexingProgress(stack.say),
        )
        _report_errors(report, stack.say)
        version = report.index_version or tenant_version(client, settings.tenant)
        with Client(
            client, tenant=settings.tenant, timeout_s=30.0, token=stack.service_token()
        ) as discovery:
            return discovery.discover("ready check", min_version=version)
    finally:
        publisher.close()


def _report_sync(report: SyncReport, say: Callable[[str], None]) -> None:
    if report.sent or report.plan.errors:
        say(report.summary())
        _report_errors(report, say)


def _report_errors(report: SyncReport, say: Callable[[str], None]) -> None:
    for error in report.plan.errors.values():
        say(f"rejected: {error}")


def _cli_name() -> str:
    argv0 = Path(sys.argv[0])
    try:
        return str(argv0.resolve().relative_to(Path.cwd()))
    except ValueError:
        return "capdisc"


@contextlib.contextmanager
def running_stack(
    project: Path, settings: Settings, environ: Mapping[str, str]
) -> Iterator[tuple[Stack, str]]:
    """The embedded stack without the watcher and the ready check, for benchmarks and scripts
    that drive it themselves: ``(stack, redis url)``, the URL with the password of the stack's
    own Redis (keep it in memory). Auth is off unless ``settings`` turn it on explicitly: such a
    script asks as whoever it claims to be. Everything is stopped when the block ends."""
    if settings.auth is None:
        settings = settings.with_changes(auth=False)
    stack = Stack(project=project, settings=settings, say=lambda _message: None)
    try:
        url = stack.start(environ)
        yield stack, url
    finally:
        stack.stop()
