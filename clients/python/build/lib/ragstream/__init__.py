"""Python client of the ragstream job's HTTP API.

    from ragstream import Client
    client = Client("http://127.0.0.1:9464", tenant="local")
    context = client.query("how do I roll back a release?", token_budget=800)
    print(context.context)

Retrievers: `ragstream.langchain.RagstreamRetriever` (LangChain) and
`ragstream.llama_index.RagstreamRetriever` (LlamaIndex).
"""

from .client import (
    Accepted,
    Batch,
    BatchState,
    Client,
    Consistency,
    Context,
    Invalidation,
    InvalidationsPage,
    Item,
    Mode,
    RagstreamError,
    Source,
    SourcesPage,
    Subscription,
    SubscriptionStatus,
    Tier,
    Version,
)

__all__ = [
    "Accepted",
    "Batch",
    "BatchState",
    "Client",
    "Consistency",
    "Context",
    "Invalidation",
    "InvalidationsPage",
    "Item",
    "Mode",
    "RagstreamError",
    "Source",
    "SourcesPage",
    "Subscription",
    "SubscriptionStatus",
    "Tier",
    "Version",
]
# The package's one version: pyproject.toml reads it from here.
__version__ = "0.1.0"
