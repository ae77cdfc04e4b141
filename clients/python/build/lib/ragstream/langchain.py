"""A LangChain retriever over the ragstream job (`pip install ragstream[langchain]`)."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from .client import Client, Context, Mode, Subscription, item_metadata

__all__ = ["RagstreamRetriever", "StandingRetriever"]


def _documents(context: Context) -> list[Document]:
    return [Document(page_content=item.text, metadata=item_metadata(item), id=item.chunk_id) for item in context.items]


class RagstreamRetriever(BaseRetriever):
    """The items of a ragstream context as LangChain documents, best first.

    `mode="bounded"` (the default) returns the items packed into `token_budget` (excerpts where the
    budget asked for them); `mode="deep"` returns up to `k` whole chunks without a budget.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client
    tenant: str | None = None
    token_budget: int | None = None
    k: int | None = None
    mode: Mode = "bounded"
    filters: dict[str, Any] | None = None
    acl: list[str] | None = None

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        context = self.client.query(
            query,
            tenant=self.tenant,
            token_budget=self.token_budget,
            k=self.k,
            mode=self.mode,
            filters=self.filters,
            acl=self.acl,
        )
        return _documents(context)


class StandingRetriever(BaseRetriever):
    """The latest version of a standing query (`Client.subscribe`) as LangChain documents: a chain
    built on it reads the context the job keeps current, without asking again. The text a chain
    passes in is not searched: the subscription's own query was.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    subscription: Subscription

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return _documents(self.subscription.context())
