"""A LlamaIndex retriever over the ragstream job (`pip install ragstream[llamaindex]`)."""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from .client import Client, Context, Mode, Subscription, item_metadata

__all__ = ["RagstreamRetriever", "StandingRetriever"]


def _nodes(context: Context) -> list[NodeWithScore]:
    return [
        NodeWithScore(
            node=TextNode(id_=item.chunk_id, text=item.text, metadata=item_metadata(item)),
            score=item.score,
        )
        for item in context.items
    ]


class RagstreamRetriever(BaseRetriever):
    """The items of a ragstream context as LlamaIndex nodes with their scores, best first.

    `mode="bounded"` (the default) returns the items packed into `token_budget`; `mode="deep"` returns
    up to `k` whole chunks without a budget.
    """

    def __init__(
        self,
        client: Client,
        *,
        tenant: str | None = None,
        token_budget: int | None = None,
        k: int | None = None,
        mode: Mode = "bounded",
        filters: dict[str, Any] | None = None,
        acl: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._client = client
        self._tenant = tenant
        self._token_budget = token_budget
        self._k = k
        self._mode = mode
        self._filters = filters
        self._acl = acl
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        context = self._client.query(
            query_bundle.query_str,
            tenant=self._tenant,
            token_budget=self._token_budget,
            k=self._k,
            mode=self._mode,
            filters=self._filters,
            acl=self._acl,
        )
        return _nodes(context)


class StandingRetriever(BaseRetriever):
    """The latest version of a standing query (`Client.subscribe`) as LlamaIndex nodes: a query
    engine built on it reads the context the job keeps current, without asking again. The query
    string passed in is not searched: the subscription's own query was.
    """

    def __init__(self, subscription: Subscription, **kwargs: Any) -> None:
        self._subscription = subscription
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _nodes(self._subscription.context())
