"""The :class:`~capdisc.vectorstores.port.VectorStore` port over Weaviate (``weaviate-client`` v4).

- **One collection, one named vector.** The collection (``Capability`` by default) has one
  self-provided named vector (``capability``, cosine HNSW): capdisc computes every vector, Weaviate
  never vectorizes. Every filter is a property: ``capability_id``, ``kind``, ``category``,
  ``tags``, ``available``, ``vis_open`` (the capability names no roles and no users),
  ``vis_roles``, ``vis_users`` (filterable, exact-match ``field`` tokenization, not searchable)
  and ``text`` (the BM25 side, ``word`` tokenization).
- **A Weaviate tenant per capdisc tenant**, multi-tenancy on and automatic tenant creation *off*:
  :meth:`WeaviateVectorStore.ensure_tenant` creates tenants explicitly, and any other operation on
  a tenant that does not exist raises :class:`~capdisc.errors.UnknownTenantError`.
- **Deterministic ids**: ``generate_uuid5(capability_id, tenant + "/")``, so rewriting a capability
  replaces its object (batch writes upsert).
- **Batch writes** go through ``data.insert_many`` (one gRPC ``BatchObjects`` call per
  ``batch_size`` objects). Per-object refusals are sent once more; those refused again are
  returned in the :class:`~capdisc.vectorstores.port.UpsertReport` with Weaviate's reason, never
  dropped.
  A call that fails as a whole (timeout, server unreachable) raises
  :class:`~capdisc.errors.VectorStoreError`: the write is idempotent, so the caller retries it.
- **Hybrid queries** send capdisc's query vector, its ``alpha``, relative-score fusion, the named
  target vector and every filter, visibility included, inside the one query (a pre-filter):
  :func:`query_filter` renders a :class:`~capdisc.filters.SearchFilters` on the properties.
- **Explicit timeouts** (init, query, insert) on every call; a timeout is a
  :class:`~capdisc.errors.VectorStoreError` that names the timeout and its setting.
- **Clients are created lazily, per process**: nothing connects at construction or import, and a
  store used in a forked child (Celery prefork) builds its own client there; gRPC channels are
  not fork-safe.

Every vendor error is translated here, ``raise ... from exc``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import numpy as np

from capdisc.errors import CapdiscError, UnknownTenantError, VectorStoreError
from capdisc.filters import SearchFilters
from capdisc.vectorstores.port import (
    ArrayLike,
    StoredObject,
    StoreHit,
    UpsertFailure,
    UpsertReport,
    check_query,
    check_tenant,
    last_per_id,
)

if TYPE_CHECKING:
    from weaviate import WeaviateClient


#: The collection's properties: exact-match filter properties (text, text arrays, booleans) and
#: the one text BM25 searches.
FILTER_TEXT = ("capability_id", "kind", "category")
FILTER_TEXT_ARRAYS = ("tags", "vis_roles", "vis_users")
FILTER_BOOLS = ("available", "vis_open")
SEARCH_TEXT = "text"
#: Most ids one delete request names (Weaviate caps matches per request at
#: QUERY_MAXIMUM_RESULTS, 10,000 by default).
DELETE_CHUNK = 1000


@dataclass(frozen=True)
class WeaviateStoreSettings:
    """How to reach Weaviate and shape the collection; units in the names."""

    url: str = "http://127.0.0.1:8080"
    grpc_port: int = 50051
    #: None: the host of ``url``.
    grpc_host: str | None = None
    api_key: str = field(default="", repr=False)
    collection: str = "Capability"
    vector_name: str = "capability"
    timeout_init_s: float = 5.0
    timeout_query_s: float = 10.0
    timeout_insert_s: float = 60.0
    #: Objects per BatchObjects request.
    batch_size: int = 200
    #: Pause before objects refused by a batch are sent again.
    retry_delay_s: float = 0.5


def object_uuid(tenant: str, capability_id: str) -> str:
    """The object id of ``capability_id`` in ``tenant`` (uuid5; tenant names hold no '/')."""
    from weaviate.util import generate_uuid5

    return generate_uuid5(capability_id, f"{tenant}/")


def object_properties(obj: StoredObject) -> dict[str, Any]:
    return {
        "capability_id": obj.id,
        "kind": obj.kind,
        "category": obj.category,
        "tags": list(obj.tags),
        "available": obj.available,
        "vis_open": obj.visibility.open,
        "vis_roles": list(obj.vis_roles),
        "vis_users": list(obj.vis_users),
        SEARCH_TEXT: obj.text,
    }


def query_filter(filters: SearchFilters) -> Any:
    """The Weaviate filter of ``filters``: visibility AND every capability filter, the rendering
    of :meth:`capdisc.filters.SearchFilters.admits` on the stored properties.

    Visibility (:func:`capdisc.access.visible`) is ``vis_open = true OR vis_roles CONTAINS ANY
    the caller's roles OR vis_users CONTAINS ANY [the caller's user]`` (the role and user terms
    only when the caller has some)."""
    from weaviate.classes.query import Filter

    caller = filters.caller
    visible = [Filter.by_property("vis_open").equal(True)]
    if caller.roles:
        visible.append(Filter.by_property("vis_roles").contains_any(sorted(caller.roles)))
    if caller.user is not None:
        visible.append(Filter.by_property("vis_users").contains_any([caller.user]))
    parts = [Filter.any_of(visible)]
    if filters.kind is not None:
        parts.append(Filter.by_property("kind").equal(filters.kind))
    if filters.category is not None:
        parts.append(Filter.by_property("category").equal(filters.category))
    if filters.tags:
        parts.append(Filter.by_property("tags").contains_all(sorted(set(filters.tags))))
    if filters.only_available:
        parts.append(Filter.by_property("available").equal(True))
    if filters.only_installable:
        parts.append(Filter.by_property("available").equal(False))
    if filters.include_ids is not None:
        allowed = sorted(filters.include_ids - filters.exclude_ids)
        parts.append(Filter.by_property("capability_id").contains_any(allowed))
    parts.extend(
        Filter.by_property("capability_id").not_equal(i) for i in sorted(filters.exclude_ids)
    )
    return Filter.all_of(parts)


class WeaviateVectorStore:
    """:class:`~capdisc.vectorstores.port.VectorStore` on one Weaviate collection (see the
    module)."""

    def __init__(
        self, settings: WeaviateStoreSettings, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        if settings.batch_size < 1:
            raise VectorStoreError(f"batch_size must be at least 1, got {settings.batch_size}")
        self.settings = settings
        self._sleep = sleep
        self._lock = threading.RLock()
        self._client: WeaviateClient | None = None
        self._pid = 0
        self._collection: Any = None
        self._tenants: dict[str, Any] = {}

    # -- the port ----------------------------------------------------------------------------------

    def ensure_tenant(self, tenant: str) -> None:
        check_tenant(tenant)
        with self._lock:
            if tenant in self._process_tenants():
                return
            collection = self._ready_collection()
        with self._translated("look up tenant", tenant, "query"):
            exists = collection.tenants.exists(tenant)
        if not exists:
            from weaviate.classes.tenants import Tenant
            from weaviate.exceptions import UnexpectedStatusCodeError

            with self._translated("create tenant", tenant, "insert"):
                try:
                    collection.tenants.create([Tenant(name=tenant)])
                except UnexpectedStatusCodeError:
                    if not collection.tenants.exists(tenant):  # not a concurrent creation
                        raise
        with self._lock:
            self._process_tenants()[tenant] = collection.with_tenant(tenant)

    def upsert(self, tenant: str, objects: Sequence[StoredObject]) -> UpsertReport:
        check_tenant(tenant)
        unique = last_per_id(objects)
        if not unique:
            return UpsertReport()
        handle = self._tenant(tenant)
        refused = self._write(handle, tenant, unique)
        retried = 0
        if refused:
            again = [obj for obj in unique if obj.id in refused]
            retried = len(again)
            if self.settings.retry_delay_s > 0:
                self._sleep(self.settings.retry_delay_s)
            refused = self._write(handle, tenant, again)
        return UpsertReport(
            tuple(obj.id for obj in unique if obj.id not in refused),
            tuple(UpsertFailure(key, reason) for key, reason in refused.items()),
            retried,
        )

    def delete(self, tenant: str, ids: Collection[str]) -> int:
        check_tenant(tenant)
        handle = self._tenant(tenant)
        from weaviate.classes.query import Filter

        uuids = sorted({object_uuid(tenant, key) for key in ids})
        deleted = 0
        for start in range(0, len(uuids), DELETE_CHUNK):
            chunk = uuids[start : start + DELETE_CHUNK]
            with self._translated("delete", tenant, "insert"):
                result = handle.data.delete_many(where=Filter.by_id().contains_any(chunk))
            if result.failed:
                raise VectorStoreError(
                    f"Weaviate at {self.settings.url} failed to delete {result.failed} of "
                    f"{result.matches} objects in tenant {tenant!r}; retry the delete"
                )
            deleted += int(result.successful)
        return deleted

    def search(
        self,
        tenant: str,
        query_text: str,
        query_vector: ArrayLike,
        k: int,
        *,
        alpha: float,
        filters: SearchFilters,
    ) -> list[StoreHit]:
        check_tenant(tenant)
        check_query(k, alpha)
        handle = self._tenant(tenant)
        text = query_text if query_text.strip() else None
        if k == 0 or filters.admits_nothing or (text is None and alpha == 0.0):
            return []
        from weaviate.classes.query import HybridFusion, MetadataQuery

        query = np.asarray(query_vector, dtype=np.float32)
        if query.ndim != 1 or query.size == 0 or not np.isfinite(query).all():
            raise VectorStoreError(
                f"the query vector must be one finite row of numbers, got shape {query.shape}"
            )
        vector = [float(x) for x in query]
        with self._translated("search", tenant, "query"):
            result = handle.query.hybrid(
                query=text,
                vector=vector,
                alpha=float(alpha),
                fusion_type=HybridFusion.RELATIVE_SCORE,
                query_properties=[SEARCH_TEXT],
                target_vector=self.settings.vector_name,
                filters=query_filter(filters),
                limit=k,
                return_metadata=MetadataQuery(score=True),
                return_properties=["capability_id"],
            )
        return [
            StoreHit(str(o.properties["capability_id"]), float(o.metadata.score or 0.0))
            for o in result.objects
        ]

    def count(self, tenant: str) -> int:
        check_tenant(tenant)
        handle = self._tenant(tenant)
        with self._translated("count", tenant, "query"):
            result = handle.aggregate.over_all(total_count=True)
        return int(result.total_count or 0)

    def close(self) -> None:
        with self._lock:
            client, mine = self._client, self._pid == os.getpid()
            self._client, self._collection, self._tenants = None, None, {}
        if client is not None and mine:
            with suppress(Exception):  # best effort: the connection may already be gone
                client.close()

    # -- connection and collection -----------------------------------------------------------------

    def _process_client(self) -> WeaviateClient:
        """This process's client: created on first use, and again in a forked child."""
        if self._client is not None and self._pid == os.getpid():
            return self._client
        # A client inherited through fork belongs to the parent: drop it unclosed.
        self._client, self._collection, self._tenants = None, None, {}
        self._client = self._connect()
        self._pid = os.getpid()
        return self._client

    def _process_tenants(self) -> dict[str, Any]:
        self._process_client()
        return self._tenants

    def _connect(self) -> WeaviateClient:
        try:
            import weaviate
            from weaviate.classes.init import AdditionalConfig, Auth, Timeout
        except ImportError as exc:
            raise VectorStoreError(
                "the Weaviate vector store needs the weaviate-client "
                "package: pip install 'capdisc[weaviate]'"
            ) from exc
        s = self.settings
        parts = urlsplit(s.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise VectorStoreError(
                f"CAPDISC_WEAVIATE_URL {s.url!r} is not an http(s) URL "
                "such as http://127.0.0.1:8080"
            )
        secure = parts.scheme == "https"
        config = AdditionalConfig(
            timeout=Timeout(
                init=s.timeout_init_s, query=s.timeout_query_s, insert=s.timeout_insert_s
            )
        )
        with self._translated("connect", None, "query"):  # /v1/meta: a GET, query timeout
            # skip_init_checks: no OIDC discovery and no PyPI version lookup from every worker;
            # REST is checked by the /v1/meta call every connect makes, gRPC by is_live below.
            client = weaviate.connect_to_custom(
                http_host=parts.hostname,
                http_port=parts.port or (443 if secure else 80),
                http_secure=secure,
                grpc_host=s.grpc_host or parts.hostname,
                grpc_port=s.grpc_port,
                grpc_secure=secure,
                auth_credentials=Auth.api_key(s.api_key) if s.api_key else None,
                additional_config=config,
                skip_init_checks=True,
            )
        try:
            live = client.is_live()
        except Exception:
            live = False
        if not live:
            client.close()
            raise VectorStoreError(
                f"Weaviate at {s.url} answers REST but is not live over gRPC at "
                f"{s.grpc_host or parts.hostname}:{s.grpc_port} (checked within "
                f"{s.timeout_init_s:g} s); check CAPDISC_WEAVIATE_GRPC_HOST, "
                "CAPDISC_WEAVIATE_GRPC_PORT and that the gRPC port is open"
            )
        return client

    def _ready_collection(self) -> Any:
        """The collection handle, the collection created (or checked) once per client."""
        with self._lock:
            client = self._process_client()
            if self._collection is not None:
                return self._collection
            name = self.settings.collection
            with self._translated("look up collection", None, "query"):
                exists = client.collections.exists(name)
            if not exists:
                from weaviate.exceptions import UnexpectedStatusCodeError

                with self._translated("create collection", None, "insert"):
                    try:
                        self._create_collection(client)
                    except UnexpectedStatusCodeError:
                        if not client.collections.exists(name):  # not a concurrent creation
                            raise
            collection = client.collections.use(name)
            with self._translated("read the collection definition", None, "query"):
                config = collection.config.get()
            self._check_definition(config)
            self._collection = collection
            return collection

    def _create_collection(self, client: WeaviateClient) -> None:
        from weaviate.classes.config import (
            Configure,
            DataType,
            Property,
            Tokenization,
            VectorDistances,
        )

        def exact(name: str, data_type: DataType) -> Property:
            if data_type == DataType.BOOL:
                return Property(name=name, data_type=data_type, index_filterable=True)
            return Property(
                name=name,
                data_type=data_type,
                index_filterable=True,
                index_searchable=False,
                tokenization=Tokenization.FIELD,
            )

        properties = [exact(name, DataType.TEXT) for name in FILTER_TEXT]
        properties += [exact(name, DataType.TEXT_ARRAY) for name in FILTER_TEXT_ARRAYS]
        properties += [exact(name, DataType.BOOL) for name in FILTER_BOOLS]
        properties.append(
            Property(
                name=SEARCH_TEXT,
                data_type=DataType.TEXT,
                index_searchable=True,
                index_filterable=False,
                tokenization=Tokenization.WORD,
            )
        )
        client.collections.create(
            self.settings.collection,
            description="capdisc capabilities: one object per capability, one tenant per "
            "capdisc tenant",
            properties=properties,
            vector_config=Configure.Vectors.self_provided(
                name=self.settings.vector_name,
                vector_index_config=Configure.VectorIndex.hnsw(
                    distance_metric=VectorDistances.COSINE
                ),
            ),
            multi_tenancy_config=Configure.multi_tenancy(
                enabled=True, auto_tenant_creation=False, auto_tenant_activation=True
            ),
        )

    def _check_definition(self, config: Any) -> None:
        """Refuse a pre-existing collection that this adapter cannot use correctly."""
        name, problems = self.settings.collection, []
        tenancy = config.multi_tenancy_config
        if not tenancy.enabled:
            problems.append("multi-tenancy is off")
        if tenancy.auto_tenant_creation:
            problems.append("automatic tenant creation is on")
        vectors = config.vector_config or {}
        if self.settings.vector_name not in vectors:
            problems.append(f"it has no named vector {self.settings.vector_name!r}")
        present = {p.name for p in config.properties}
        wanted = {*FILTER_TEXT, *FILTER_TEXT_ARRAYS, *FILTER_BOOLS, SEARCH_TEXT}
        if wanted - present:
            problems.append(f"properties {', '.join(sorted(wanted - present))} are missing")
        if problems:
            raise VectorStoreError(
                f"the Weaviate collection {name!r} at {self.settings.url} exists but "
                f"{'; '.join(problems)}. Delete it (it is rebuilt on the next publish) or set "
                "CAPDISC_WEAVIATE_COLLECTION to a new name"
            )

    def _tenant(self, tenant: str) -> Any:
        """The tenant-scoped handle; UnknownTenantError when the tenant does not exist."""
        with self._lock:
            handle = self._process_tenants().get(tenant)
            if handle is not None:
                return handle
            collection = self._ready_collection()
        with self._translated("look up tenant", tenant, "query"):
            exists = collection.tenants.exists(tenant)
        if not exists:
            raise _unknown_tenant(tenant)
        with self._lock:
            handle = self._process_tenants().setdefault(tenant, collection.with_tenant(tenant))
        return handle

    # -- writes -----------------------------------------------------------------------------------

    def _write(self, handle: Any, tenant: str, objects: list[StoredObject]) -> dict[str, str]:
        """Send ``objects`` in batches; capability id -> reason for each one refused."""
        from weaviate.classes.data import DataObject

        refused: dict[str, str] = {}
        for start in range(0, len(objects), self.settings.batch_size):
            chunk = objects[start : start + self.settings.batch_size]
            batch = [
                DataObject(
                    properties=object_properties(obj),
                    uuid=object_uuid(tenant, obj.id),
                    vector={self.settings.vector_name: obj.vector.tolist()},
                )
                for obj in chunk
            ]
            errors = self._insert_many(handle, tenant, batch)
            refused.update((chunk[index].id, reason) for index, reason in errors.items())
        return refused

    def _insert_many(self, handle: Any, tenant: str, batch: list[Any]) -> dict[int, str]:
        """One BatchObjects call: index -> reason of each object refused. A call that fails as
        a whole (timeout, unreachable) raises."""
        from weaviate.exceptions import WeaviateInsertManyAllFailedError

        with self._translated("write", tenant, "insert"):
            try:
                result = handle.data.insert_many(batch)
            except WeaviateInsertManyAllFailedError as exc:
                # Every object was refused, each for its own reason (the client joins the
                # distinct reasons into one message): per-object failures, not a failed call.
                reason = _reason(exc)
                if "tenant not found" in reason.lower():
                    raise _unknown_tenant(tenant) from exc
                return dict.fromkeys(range(len(batch)), reason)
        return {int(index): str(error.message) for index, error in result.errors.items()}

    # -- error translation ------------------------------------------------------------------------

    @contextmanager
    def _translated(self, operation: str, tenant: str | None, timeout: str) -> Iterator[None]:
        """Vendor errors raised inside become capdisc errors (``timeout`` names the client
        timeout that bounds the calls: init, query or insert)."""
        try:
            yield
        except CapdiscError:
            raise
        except Exception as exc:
            self._raise_translated(exc, operation, tenant, timeout)

    def _raise_translated(
        self, exc: Exception, operation: str, tenant: str | None, timeout: str
    ) -> NoReturn:
        s = self.settings
        where = f"Weaviate at {s.url} (collection {s.collection!r}" + (
            f", tenant {tenant!r})" if tenant else ")"
        )
        detail = str(exc).strip() or type(exc).__name__
        if _is_timeout(exc):
            seconds = {
                "init": s.timeout_init_s,
                "query": s.timeout_query_s,
                "insert": s.timeout_insert_s,
            }[timeout]
            raise VectorStoreError(
                f"{operation} timed out: {where} did not answer within the {timeout} timeout of "
                f"{seconds:g} s; raise CAPDISC_WEAVIATE_TIMEOUT_{timeout.upper()}_S or check the "
                f"server's load"
            ) from exc
        if tenant is not None and "tenant not found" in detail.lower():
            raise _unknown_tenant(tenant) from exc
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            raise VectorStoreError(
                f"{operation}: {where} refused the credentials (HTTP "
                f"{status}); check CAPDISC_WEAVIATE_API_KEY and its "
                f"permissions: {detail}"
            ) from exc
        name = type(exc).__name__
        if name in (
            "WeaviateConnectionError",
            "WeaviateStartUpError",
            "WeaviateGRPCUnavailableError",
            "WeaviateClosedClientError",
        ):
            raise VectorStoreError(
                f"{operation}: {where} cannot be reached; check "
                f"CAPDISC_WEAVIATE_URL and CAPDISC_WEAVIATE_GRPC_PORT: "
                f"{detail}"
            ) from exc
        raise VectorStoreError(f"{operation} failed in {where}: {detail}") from exc


def _unknown_tenant(tenant: str) -> UnknownTenantError:
    return UnknownTenantError(
        f"the vector store has no tenant {tenant!r}: create it with "
        "ensure_tenant first (publish to that tenant)"
    )


def _is_timeout(exc: BaseException) -> bool:
    """A timeout anywhere in the chain: REST read timeouts, gRPC DEADLINE_EXCEEDED."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in ("WeaviateTimeoutError", "ReadTimeout", "TimeoutException"):
            return True
        code = getattr(current, "code", None)
        if callable(code):
            try:
                if getattr(code(), "name", "") == "DEADLINE_EXCEEDED":
                    return True
            except Exception:  # not a gRPC call object
                pass
        if "deadline exceeded" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    prefix = "Here is the set of all errors:"
    return text.split(prefix, 1)[1].strip() if prefix in text else text
