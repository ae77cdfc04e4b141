"""A small typed client of the ragstream job's HTTP API (`/v1/`), on the standard library only."""

from __future__ import annotations

import base64
import itertools
import json
import os
import pathlib
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

#: What a query answers (the job's `Mode`): `bounded` packs a context into the token budget, `deep`
#: returns up to `k` whole chunks; the others are lookups (docs/query.md).
Mode = Literal["bounded", "deep", "read_chunk", "list_sources", "files", "sql_compact", "sql_full", "index_stats"]
#: How an item was packed (the job's `Tier`).
Tier = Literal["expanded", "snippet", "surrogate", "full", "gist", "micro"]
#: How fresh the index must be for a query (the job's `Consistency`).
Consistency = Literal["eventual", "read_your_writes"]
#: Where a batch posted in local mode stands.
BatchState = Literal["queued", "indexed", "stopped"]

PROBLEM_PREFIX = "urn:ragstream:problem:"


class RagstreamError(Exception):
    """A problem answered by the job (RFC 9457), or no answer at all.

    `kind` is the problem's name (`invalid_query`, `forbidden`, `index_unavailable`, ...; the names of
    refused input are the job's DLQ reasons), `status` the HTTP status (0 when the job could not be
    reached), `detail` what was wrong.
    """

    def __init__(
        self,
        kind: str,
        status: int,
        detail: str,
        query_id: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(f"{kind} ({status}): {detail}")
        self.kind = kind
        self.status = status
        self.detail = detail
        self.query_id = query_id
        #: For a refused batch of documents: each refused one's `index`, `reason` and `detail`.
        self.errors = errors or []

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later (an outage, a busy job, a timeout)."""
        return self.kind in {"busy", "index_unavailable", "stopping", "timeout", "unreachable"}


@dataclass(frozen=True)
class Item:
    """One item of a context: a chunk (or an excerpt of one) with its provenance."""

    chunk_id: str
    doc_id: str
    source: str
    lines: tuple[int, int]
    section_path: list[str]
    tier: Tier
    score: float
    tokens: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    page: int | None = None
    """The PDF page of the item, from 1; `None` for other kinds."""

    @property
    def citation(self) -> str:
        """`source (lines a–b)`, or `source (page p, lines a–b)` for a PDF, as the packed context
        heads the item."""
        place = f"lines {self.lines[0]}–{self.lines[1]}"
        if self.page is not None:
            place = f"page {self.page}, {place}"
        return f"{self.source} ({place})"

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Item:
        first, last = value.get("lines", (0, 0))
        return cls(
            chunk_id=value["chunk_id"],
            doc_id=value["doc_id"],
            source=value["source"],
            lines=(int(first), int(last)),
            section_path=list(value.get("section_path", [])),
            tier=cast(Tier, value.get("tier", "full")),
            score=float(value.get("score", 0.0)),
            tokens=int(value.get("tokens", 0)),
            text=value.get("text", ""),
            metadata=dict(value.get("metadata", {})),
            page=int(value["page"]) if value.get("page") is not None else None,
        )


def item_metadata(item: Item) -> dict[str, Any]:
    """A context item's metadata for a framework document: the document's own metadata, then the
    item's provenance (`chunk_id`, `doc_id`, `source`, `lines`, `page` for a PDF, `section_path`,
    `tier`, `score`, `citation`), which wins where a key is in both."""
    provenance: dict[str, Any] = {} if item.page is None else {"page": item.page}
    return {
        **item.metadata,
        "chunk_id": item.chunk_id,
        "doc_id": item.doc_id,
        "source": item.source,
        "lines": list(item.lines),
        "section_path": list(item.section_path),
        "tier": item.tier,
        "score": item.score,
        "citation": item.citation,
        **provenance,
    }


@dataclass(frozen=True)
class Context:
    """The answer to a query: the packed context, its items and how it was made."""

    query_id: str
    tenant: str
    mode: Mode
    context: str
    items: list[Item]
    tokens_used: int
    token_budget: int | None
    truncated: bool
    note: str | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Context:
        return cls(
            query_id=value.get("query_id", ""),
            tenant=value.get("tenant", ""),
            mode=cast(Mode, value.get("mode", "bounded")),
            context=value.get("context", ""),
            items=[Item.from_json(item) for item in value.get("items", [])],
            tokens_used=int(value.get("tokens_used", 0)),
            token_budget=value.get("token_budget"),
            truncated=bool(value.get("truncated", False)),
            note=value.get("note"),
            raw=dict(value),
        )


@dataclass(frozen=True)
class Source:
    """A document of the tenant, with the chunks it has in the index."""

    doc_id: str
    source: str
    title: str
    chunks: int


@dataclass(frozen=True)
class SourcesPage:
    """One page of `GET /v1/sources`."""

    tenant: str
    sources: list[Source]
    next_cursor: str | None


@dataclass(frozen=True)
class Accepted:
    """The answer to an accepted batch of documents (`POST /v1/documents`, `DELETE
    /v1/documents/{doc_id}`): `indexed` when the index holds them (local mode), else the documents
    topic does (Kafka mode) or, local mode past its `wait`, `status` is the batch's link."""

    accepted: int
    indexed: bool
    status: str | None = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Accepted:
        return cls(accepted=int(value["accepted"]), indexed=bool(value["indexed"]), status=value.get("status"))


@dataclass(frozen=True)
class Batch:
    """Where a batch posted in local mode stands (`GET /v1/batches/{id}`)."""

    id: int
    state: BatchState
    accepted: int

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Batch:
        return cls(id=int(value["id"]), state=cast(BatchState, value["state"]), accepted=int(value["accepted"]))


@dataclass(frozen=True)
class Invalidation:
    """One context made stale by index writes."""

    seq: int
    query_id: str
    tenant: str
    stale_chunk_ids: list[str]
    index_watermark: dict[str, Any]

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Invalidation:
        return cls(
            seq=int(value.get("seq", 0)),
            query_id=value["query_id"],
            tenant=value["tenant"],
            stale_chunk_ids=list(value.get("stale_chunk_ids", [])),
            index_watermark=dict(value.get("index_watermark", {})),
        )


@dataclass(frozen=True)
class InvalidationsPage:
    """`GET /v1/invalidations`: the invalidations numbered above `since`, oldest first; `last` is the
    next `since`; `truncated` when some above `since` were already dropped (re-read those contexts)."""

    invalidations: list[Invalidation]
    last: int
    truncated: bool

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> InvalidationsPage:
        return cls(
            invalidations=[Invalidation.from_json(i) for i in value.get("invalidations", [])],
            last=int(value["last"]),
            truncated=bool(value.get("truncated", False)),
        )


def problem_error(error: urllib.error.HTTPError) -> RagstreamError:
    """The job's problem answer (RFC 9457) as an error; an answer that is no problem keeps its
    status and the start of its body."""
    raw = error.read().decode("utf-8", "replace")
    try:
        problem = json.loads(raw)
        kind = str(problem.get("type", "")).removeprefix(PROBLEM_PREFIX) or "http_error"
        return RagstreamError(
            kind, error.code, problem.get("detail", raw), problem.get("query_id"), problem.get("errors")
        )
    except (ValueError, AttributeError):
        return RagstreamError("http_error", error.code, raw[:500])


class Client:
    """The job's HTTP API.

    `url` is the job's address; `token` the bearer token (default: the `RAGSTREAM_QUERY_TOKEN`
    environment variable; none for a job without tokens on loopback); `tenant` the tenant used when a
    call names none (a token bound to one tenant needs none).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:9464",
        *,
        token: str | None = None,
        tenant: str | None = None,
        timeout: float = 130.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("RAGSTREAM_QUERY_TOKEN") or None
        self.tenant = tenant
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._prefix = f"py-{os.getpid()}-{int(time.time() * 1000)}"

    # -- plumbing -------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as error:
            raise problem_error(error) from None
        except (urllib.error.URLError, OSError) as error:
            raise RagstreamError("unreachable", 0, f"{url}: {error}") from None

    def _tenant(self, tenant: str | None) -> str | None:
        return tenant if tenant is not None else self.tenant

    def _query_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    # -- the API ----------------------------------------------------------------------------------

    def query(
        self,
        text: str,
        *,
        tenant: str | None = None,
        token_budget: int | None = None,
        k: int | None = None,
        mode: Mode = "bounded",
        filters: Mapping[str, Any] | None = None,
        acl: Sequence[str] | None = None,
        consistency: Consistency | None = None,
        trace: bool = False,
        fill: bool = False,
        context_window: int | None = None,
        query_id: str | None = None,
        **extra: Any,
    ) -> Context:
        """`POST /v1/query`: a context packed into `token_budget` (or another mode's answer).

        `filters` takes `source_prefix`, `kinds`, `doc_ids`, `langs` and `metadata`
        (`{"team": "search", "year": {"gte": 2020}, "tags": {"any": ["a", "b"]}}`).
        """
        body = self._query_body(
            text,
            tenant=tenant,
            token_budget=token_budget,
            k=k,
            mode=mode,
            filters=filters,
            acl=acl,
            consistency=consistency,
            trace=trace,
            fill=fill,
            context_window=context_window,
            **extra,
        )
        body["query_id"] = query_id or self._query_id()
        # Without a tenant, a token bound to exactly one tenant has the job fill it in.
        return Context.from_json(self._request("POST", "/v1/query", body))

    def _query_body(
        self,
        text: str,
        *,
        tenant: str | None,
        token_budget: int | None,
        k: int | None,
        mode: Mode,
        filters: Mapping[str, Any] | None,
        acl: Sequence[str] | None,
        consistency: Consistency | None,
        trace: bool,
        fill: bool,
        context_window: int | None,
        **extra: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text, "mode": mode}
        optional = {
            "tenant": self._tenant(tenant),
            "token_budget": token_budget,
            "k": k,
            "filters": dict(filters) if filters else None,
            "acl": list(acl) if acl is not None else None,
            "consistency": consistency,
            "context_window": context_window,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        if trace:
            body["trace"] = True
        if fill:
            body["fill"] = True
        body.update(extra)
        return body

    def subscribe(
        self,
        text: str,
        *,
        tenant: str | None = None,
        token_budget: int | None = None,
        k: int | None = None,
        mode: Mode = "bounded",
        filters: Mapping[str, Any] | None = None,
        acl: Sequence[str] | None = None,
        min_interval_ms: int | None = None,
        ttl_secs: int | None = None,
        **extra: Any,
    ) -> Subscription:
        """`POST /v1/subscriptions`: a standing query. The job answers it now (`first`) and again
        whenever the tenant's documents change, publishing a new version only when the context
        moved; read the latest with `latest()`, follow the versions with `versions()`, end it with
        `close()` (or use it in a `with` block). The query's parameters are those of `query`."""
        body: dict[str, Any] = {
            "query": self._query_body(
                text,
                tenant=tenant,
                token_budget=token_budget,
                k=k,
                mode=mode,
                filters=filters,
                acl=acl,
                consistency=None,
                trace=False,
                fill=False,
                context_window=None,
                **extra,
            )
        }
        if min_interval_ms is not None:
            body["min_interval_ms"] = min_interval_ms
        if ttl_secs is not None:
            body["ttl_secs"] = ttl_secs
        return Subscription(self, Version.from_json(self._request("POST", "/v1/subscriptions", body)))

    def _events(self, path: str, last: int) -> Iterator[tuple[str, str]]:
        """The (event, data) pairs of a Server-Sent Events stream after event id `last` (raises
        `RagstreamError` for a problem answer; returns when the server closes the stream)."""
        request = urllib.request.Request(self.url + path, method="GET")
        request.add_header("Accept", "text/event-stream")
        request.add_header("Last-Event-ID", str(last))
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            # Keep-alive comments come every 15 s: a read waits at most `timeout`.
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                event, data = "message", list[str]()
                for raw in response:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if not line:
                        if data:
                            yield event, "\n".join(data)
                        event, data = "message", list[str]()
                    elif line.startswith("event:"):
                        event = line[len("event:") :].strip()
                    elif line.startswith("data:"):
                        data.append(line[len("data:") :].lstrip(" "))
        except urllib.error.HTTPError as error:
            raise problem_error(error) from None

    def upsert(
        self,
        documents: Iterable[Mapping[str, Any]],
        *,
        tenant: str | None = None,
        wait: float | None = None,
        follow: bool = True,
    ) -> Accepted:
        """`POST /v1/documents`: document events, as on the documents topic (`doc_id`, `version`,
        `text` or `content_base64`, and optionally `source`, `kind`, `title`, `acl`, `updated_at`,
        `metadata`; `op` may be `delete`). The batch is checked whole: any refused document raises
        `RagstreamError` with every refusal in `errors`, and nothing is written. Returns `Accepted`
        (`indexed`: the index holds them; else the documents topic does, in Kafka mode).

        Local mode: the job answers once the index holds the batch, or after `wait` seconds (0 to
        120; the job's default 120) with the batch's status link; with `follow` (the default) the
        client then polls the link until the batch is indexed, else it returns the answer with its
        `status` link (read it with `batch`).
        """
        tenant = self._tenant(tenant)
        events = []
        for document in documents:
            event = dict(document)
            event.setdefault("op", "upsert")
            if tenant is not None:
                event.setdefault("tenant", tenant)
            events.append(event)
        answer = Accepted.from_json(
            self._request("POST", "/v1/documents", {"documents": events}, params={"wait": wait})
        )
        return self._follow(answer) if follow else answer

    def batch(self, status: str | int) -> Batch:
        """`GET /v1/batches/{id}`: where a batch posted in local mode stands (`state`: `queued`,
        `indexed` or `stopped`); `status` is the link of a 202 answer or the batch's id."""
        ident = str(status).rstrip("/").rsplit("/", 1)[-1]
        return Batch.from_json(self._request("GET", "/v1/batches/" + urllib.parse.quote(ident, safe="")))

    def _follow(self, answer: Accepted) -> Accepted:
        """Polls a 202's status link until its batch is indexed (raises `stopping` if the job
        stopped first)."""
        link = answer.status
        delay = 0.2
        while link:
            state = self.batch(link).state
            if state == "indexed":
                return Accepted(accepted=answer.accepted, indexed=True)
            if state != "queued":
                raise RagstreamError("stopping", 503, f"the job stopped before batch {link} was indexed; post it again")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        return answer

    def upsert_file(
        self,
        path: str | os.PathLike[str],
        *,
        doc_id: str | None = None,
        version: int | None = None,
        tenant: str | None = None,
        **fields: Any,
    ) -> Accepted:
        """Sends one file (a PDF, a DOCX, an HTML page or text) as `content_base64`: the job
        recognises its format and extracts it. `doc_id` and `source` default to the file's name,
        `version` to its modification time in milliseconds; other `fields` (`metadata`, `acl`,
        `title`, …) go into the event."""
        file = pathlib.Path(path)
        data = file.read_bytes()
        stamp = int(file.stat().st_mtime * 1000)
        event: dict[str, Any] = {
            "doc_id": doc_id or file.name,
            "source": fields.pop("source", None) or file.name,
            "version": version if version is not None else max(stamp, 1),
            "content_base64": base64.b64encode(data).decode("ascii"),
            **fields,
        }
        return self.upsert([event], tenant=tenant)

    def delete(
        self,
        doc_id: str,
        *,
        tenant: str | None = None,
        version: int | None = None,
        wait: float | None = None,
        follow: bool = True,
    ) -> Accepted:
        """`DELETE /v1/documents/{doc_id}`: the document and every chunk of it (`wait` and `follow`
        as for `upsert`)."""
        path = "/v1/documents/" + urllib.parse.quote(doc_id, safe="")
        answer = Accepted.from_json(
            self._request("DELETE", path, params={"tenant": self._tenant(tenant), "version": version, "wait": wait})
        )
        return self._follow(answer) if follow else answer

    def sources(self, *, tenant: str | None = None, limit: int | None = None, cursor: str | None = None) -> SourcesPage:
        """`GET /v1/sources`: one page of the tenant's documents."""
        value = self._request(
            "GET", "/v1/sources", params={"tenant": self._tenant(tenant), "limit": limit, "cursor": cursor}
        )
        return SourcesPage(
            tenant=value["tenant"],
            sources=[
                Source(doc_id=s["doc_id"], source=s["source"], title=s.get("title", ""), chunks=int(s["chunks"]))
                for s in value.get("sources", [])
            ],
            next_cursor=value.get("next_cursor"),
        )

    def iter_sources(self, *, tenant: str | None = None, page_size: int = 100) -> Iterator[Source]:
        """Every document of the tenant, page after page."""
        cursor = None
        while True:
            page = self.sources(tenant=tenant, limit=page_size, cursor=cursor)
            yield from page.sources
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def chunk(self, chunk_id: str, *, tenant: str | None = None) -> Item:
        """`GET /v1/chunks/{chunk_id}`: one chunk, whole."""
        path = "/v1/chunks/" + urllib.parse.quote(chunk_id, safe="")
        return Item.from_json(self._request("GET", path, params={"tenant": self._tenant(tenant)}))

    def invalidations(self, since: int = 0) -> InvalidationsPage:
        """`GET /v1/invalidations`: contexts made stale since `since` (`last` is the next `since`)."""
        return InvalidationsPage.from_json(self._request("GET", "/v1/invalidations", params={"since": since}))


@dataclass
class Version:
    """One version of a standing query's context."""

    subscription_id: str
    version: int
    context: Context
    index_watermark: dict[str, Any] = field(default_factory=dict)
    published_ms: int = 0
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    reordered: bool = False

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Version:
        diff = value.get("diff", {})
        return cls(
            subscription_id=value["subscription_id"],
            version=int(value["version"]),
            context=Context.from_json(value["context"]),
            index_watermark=dict(value.get("index_watermark", {})),
            published_ms=int(value.get("published_ms", 0)),
            added=list(diff.get("added", [])),
            removed=list(diff.get("removed", [])),
            changed=list(diff.get("changed", [])),
            reordered=bool(diff.get("reordered", False)),
        )


@dataclass(frozen=True)
class SubscriptionStatus:
    """A subscription's state (`GET /v1/subscriptions/{id}`): `pending` while a change of its tenant
    is not yet reflected by an evaluation."""

    subscription_id: str
    tenant: str
    pending: bool
    min_interval_ms: int
    expires_in_secs: int
    latest: Version

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SubscriptionStatus:
        return cls(
            subscription_id=value["subscription_id"],
            tenant=value["tenant"],
            pending=bool(value["pending"]),
            min_interval_ms=int(value.get("min_interval_ms", 0)),
            expires_in_secs=int(value.get("expires_in_secs", 0)),
            latest=Version.from_json(value["latest"]),
        )


class Subscription:
    """A standing query made by `Client.subscribe`: `first` is its version 1."""

    def __init__(self, client: Client, first: Version) -> None:
        self.client = client
        self.first = first
        self.id = first.subscription_id
        self._path = "/v1/subscriptions/" + urllib.parse.quote(self.id, safe="")
        self._seen = first.version

    def status(self) -> SubscriptionStatus:
        """`GET /v1/subscriptions/{id}`: `pending` (a change not yet reflected), `expires_in_secs`,
        and `latest`."""
        return SubscriptionStatus.from_json(self.client._request("GET", self._path))

    def latest(self) -> Version:
        """The latest version."""
        return self.status().latest

    def context(self) -> Context:
        """The latest version's context (what a retriever or a prompt reads)."""
        return self.latest().context

    def versions(self, *, after: int | None = None, reconnect: bool = True) -> Iterator[Version]:
        """Each version after `after` (default: the last this object yielded, at first version 1) as
        the job publishes it, over Server-Sent Events. A dropped connection is resumed with
        `Last-Event-ID` (unless `reconnect` is false), so nothing is missed while the job still keeps
        the versions; the iteration ends when the subscription ends."""
        last = self._seen if after is None else after
        while True:
            try:
                for event, data in self.client._events(self._path + "/events", last):
                    if event == "end":
                        return
                    if event == "version":
                        version = Version.from_json(json.loads(data))
                        if version.version <= last:
                            continue
                        last = version.version
                        self._seen = max(self._seen, last)
                        yield version
                return
            except RagstreamError:
                raise
            except (urllib.error.URLError, OSError):
                if not reconnect:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        """`DELETE /v1/subscriptions/{id}`: ends it (a subscription already ended is no error)."""
        try:
            self.client._request("DELETE", self._path)
        except RagstreamError as error:
            if error.kind != "not_found":
                raise

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()
