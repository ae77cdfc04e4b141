"""The Python client and its retrievers against a running job.

Run by the Rust integration test `python_client` (tests/integration/python_client.rs), which starts the job with
the documents these tests expect and sets RAGSTREAM_URL, RAGSTREAM_TEST_ADMIN_TOKEN (every tenant)
and RAGSTREAM_TEST_ACME_TOKEN (bound to the tenant `acme`).
"""

import concurrent.futures
import json
import os
import time
import typing
import unittest
import urllib.request
from typing import Any

from ragstream import Accepted, Client, Consistency, Mode, RagstreamError, Subscription, Tier, Version

URL = os.environ["RAGSTREAM_URL"]
ADMIN = os.environ["RAGSTREAM_TEST_ADMIN_TOKEN"]
ACME = os.environ["RAGSTREAM_TEST_ACME_TOKEN"]
QUESTION = "how do I roll back a release"


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.admin = Client(URL, token=ADMIN, tenant="acme")
        self.acme = Client(URL, token=ACME)

    def test_query_returns_items_with_provenance_and_metadata(self) -> None:
        context = self.acme.query(QUESTION, token_budget=400)
        self.assertEqual(context.tenant, "acme")
        self.assertLessEqual(context.tokens_used, 400)
        self.assertTrue(context.items, context.raw)
        top = context.items[0]
        self.assertEqual(top.doc_id, "rollback")
        self.assertIn("deployctl", top.text)
        self.assertEqual(top.metadata["team"], "ops")
        self.assertTrue(top.citation.startswith("acme/rollback.md (lines "), top.citation)
        self.assertIn(top.source, context.context)

    def test_metadata_filters_narrow_the_answer(self) -> None:
        context = self.admin.query(QUESTION, mode="deep", k=5, filters={"metadata": {"team": "facilities"}})
        self.assertTrue(context.items)
        self.assertEqual({item.doc_id for item in context.items}, {"office"})
        none = self.admin.query(QUESTION, filters={"metadata": {"year": {"gte": 2030}}})
        self.assertEqual(none.items, [])

    def test_sources_page_and_iterate(self) -> None:
        first = self.acme.sources(limit=1)
        self.assertEqual(first.tenant, "acme")
        self.assertEqual(len(first.sources), 1)
        self.assertIsNotNone(first.next_cursor)
        every = list(self.acme.iter_sources(page_size=1))
        self.assertEqual([s.doc_id for s in every], ["office", "rollback"])
        self.assertTrue(all(s.chunks >= 1 for s in every))

    def test_chunk_reads_a_chunk_whole(self) -> None:
        top = self.acme.query(QUESTION, k=1).items[0]
        chunk = self.acme.chunk(top.chunk_id)
        self.assertEqual(chunk.chunk_id, top.chunk_id)
        self.assertEqual(chunk.tier, "full")
        self.assertIn("deployctl rollback", chunk.text)

    def test_problems_are_errors_with_stable_kinds(self) -> None:
        with self.assertRaises(RagstreamError) as refused:
            self.acme.query(QUESTION, tenant="globex")
        self.assertEqual((refused.exception.kind, refused.exception.status), ("forbidden", 403))
        with self.assertRaises(RagstreamError) as invalid:
            self.admin.query(QUESTION, k=0)
        self.assertEqual((invalid.exception.kind, invalid.exception.status), ("invalid_query", 400))
        self.assertIn("k must be", invalid.exception.detail)
        self.assertFalse(invalid.exception.retryable)
        with self.assertRaises(RagstreamError) as unknown:
            self.acme.chunk("00000000-0000-0000-0000-000000000000")
        self.assertEqual(unknown.exception.kind, "unknown_chunk")
        with self.assertRaises(RagstreamError) as anonymous:
            Client(URL, token="").sources(tenant="acme")
        self.assertEqual(anonymous.exception.kind, "unauthorized")
        with self.assertRaises(RagstreamError) as down:
            Client("http://127.0.0.1:9", token=ACME, timeout=5).sources()
        self.assertTrue(down.exception.retryable)

    def test_upsert_and_delete(self) -> None:
        answer = self.acme.upsert(
            [
                {
                    "doc_id": "harbour.md",
                    "version": 1,
                    "text": "# Harbour\n\nThe harbour opens at dawn for the ferries.",
                    "metadata": {"team": "ports"},
                }
            ]
        )
        self.assertEqual(answer, Accepted(accepted=1, indexed=True))
        found = self.acme.query("when does the harbour open", mode="deep", k=1)
        self.assertEqual(found.items[0].doc_id, "harbour.md")
        self.assertEqual(found.items[0].metadata["team"], "ports")
        with self.assertRaises(RagstreamError) as refused:
            self.acme.upsert(
                [{"doc_id": "ok.md", "version": 1, "text": "fine"}, {"doc_id": "bad.md", "text": "no version"}]
            )
        self.assertEqual(refused.exception.kind, "missing_field")
        self.assertEqual([e["index"] for e in refused.exception.errors], [1])
        self.assertNotIn("ok.md", [s.doc_id for s in self.acme.iter_sources()])
        self.assertEqual(self.acme.delete("harbour.md"), Accepted(accepted=1, indexed=True))
        self.assertNotIn("harbour.md", [s.doc_id for s in self.acme.iter_sources()])

    def test_upsert_past_its_wait_is_followed_to_indexed(self) -> None:
        # wait=0: the job answers 202 at once with the batch's status link.
        answer = self.acme.upsert(
            [{"doc_id": "lighthouse.md", "version": 1, "text": "The lighthouse keeper lights the lamp at dusk."}],
            wait=0,
            follow=False,
        )
        self.assertEqual((answer.accepted, answer.indexed), (1, False))
        assert answer.status is not None
        self.assertRegex(answer.status, r"^/v1/batches/[0-9]+$")
        batch = self.acme.batch(answer.status)
        self.assertIn(batch.state, ("queued", "indexed"))
        self.assertEqual(batch.accepted, 1)
        # Followed, the same call returns once the index holds the batch.
        followed = self.acme.upsert(
            [{"doc_id": "lighthouse.md", "version": 2, "text": "The lighthouse keeper lights the lamp at sunset."}],
            wait=0,
        )
        self.assertEqual(followed, Accepted(accepted=1, indexed=True))
        self.assertEqual(self.acme.batch(answer.status).state, "indexed")
        found = self.acme.query("when is the lighthouse lamp lit", mode="deep", k=1)
        self.assertIn("sunset", found.items[0].text)
        # A batch this process never had is not found.
        with self.assertRaises(RagstreamError) as hidden:
            Client(URL, token=ACME).batch(10**9)
        self.assertEqual(hidden.exception.kind, "not_found")
        self.assertEqual(self.acme.delete("lighthouse.md", wait=0), Accepted(accepted=1, indexed=True))

    def test_upsert_file_sends_a_pdf_and_items_cite_its_page(self) -> None:
        # A three-page PDF the Rust side of the test wrote (ragstream_core::testing::pdf_file).
        path = os.environ["RAGSTREAM_TEST_PDF"]
        answer = self.acme.upsert_file(path, doc_id="tides.pdf", metadata={"team": "ports"})
        self.assertEqual(answer, Accepted(accepted=1, indexed=True))
        found = self.acme.query("what time is high tide at the pier", mode="deep", k=1)
        top = found.items[0]
        self.assertEqual((top.doc_id, top.page), ("tides.pdf", 2), found.raw)
        self.assertIn("page 2, lines ", top.citation)
        self.assertIn(f"Source: {top.citation}", found.context)
        from ragstream.client import item_metadata

        self.assertEqual(item_metadata(top)["page"], 2)
        self.assertEqual(self.acme.delete("tides.pdf"), Accepted(accepted=1, indexed=True))

    def test_subscription_follows_the_corpus_over_server_sent_events(self) -> None:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

        def next_version(subscription: Subscription, **options: Any) -> Version:
            # A version must come within a minute; the stream itself never ends on its own.
            def follow() -> Version:
                return next(subscription.versions(**options))

            return pool.submit(follow).result(timeout=60)

        question = "when does the ferry to the island leave"
        with self.acme.subscribe(question, token_budget=300, min_interval_ms=0) as subscription:
            self.assertEqual(subscription.first.version, 1)
            self.assertEqual(subscription.first.context.tenant, "acme")
            self.assertNotIn("ferry.md", [item.doc_id for item in subscription.first.context.items])
            self.acme.upsert(
                [
                    {
                        "doc_id": "ferry.md",
                        "version": 1,
                        "text": "# Ferry\n\nThe ferry to the island leaves the harbour at seven.",
                    }
                ]
            )
            second = next_version(subscription)
            self.assertEqual(second.version, 2)
            self.assertIn("ferry.md", [item.doc_id for item in second.context.items])
            self.assertTrue(second.added)
            # Resumed after version 1, the stream starts with version 2 again; the latest is it.
            self.assertEqual(next_version(subscription, after=1).version, 2)
            self.assertEqual(subscription.latest().version, 2)
            # Pending until the tenant has been quiet a moment (the job checks the corpus
            # statistics' drift at rest), then not.
            deadline = time.monotonic() + 30
            while subscription.status().pending:
                self.assertLess(time.monotonic(), deadline, "pending 30 s after its version")
                time.sleep(0.05)
            # Once quiet, the latest version is the one-shot answer.
            one_shot = self.acme.query(question, token_budget=300)
            self.assertEqual(
                [(i.chunk_id, i.text) for i in subscription.context().items],
                [(i.chunk_id, i.text) for i in one_shot.items],
            )
            self.acme.delete("ferry.md")
            third = next_version(subscription)
            self.assertEqual(third.version, 3)
            self.assertNotIn("ferry.md", [item.doc_id for item in third.context.items])
            self.assertTrue(third.removed)
        with self.assertRaises(RagstreamError) as ended:
            subscription.status()
        self.assertEqual(ended.exception.kind, "not_found")
        pool.shutdown(wait=False, cancel_futures=True)

    def test_invalidations(self) -> None:
        page = self.acme.invalidations()
        self.assertIsInstance(page.invalidations, list)
        self.assertIsInstance(page.last, int)
        later = self.acme.invalidations(since=page.last)
        self.assertGreaterEqual(later.last, page.last)

    def test_the_clients_literal_types_are_the_apis_enums(self) -> None:
        # The job's OpenAPI document names each enum's values; the client's Literal types must
        # name the same, so a type checker refuses what the job would.
        with urllib.request.urlopen(URL + "/v1/openapi.json", timeout=30) as response:
            schemas = json.loads(response.read())["components"]["schemas"]
        for name, literal in (("Mode", Mode), ("Tier", Tier), ("Consistency", Consistency)):
            values = [one["const"] for one in schemas[name]["oneOf"]]
            self.assertEqual(sorted(typing.get_args(literal)), sorted(values), name)


class LangChainTest(unittest.TestCase):
    def test_retriever_returns_documents_with_metadata_scores_and_citations(self) -> None:
        from langchain_core.documents import Document

        from ragstream.langchain import RagstreamRetriever

        retriever = RagstreamRetriever(client=Client(URL, token=ACME), token_budget=400)
        documents = retriever.invoke(QUESTION)
        self.assertTrue(documents)
        self.assertTrue(all(isinstance(d, Document) for d in documents))
        top = documents[0]
        self.assertIn("deployctl", top.page_content)
        self.assertEqual(top.metadata["doc_id"], "rollback")
        self.assertEqual(top.metadata["team"], "ops")
        self.assertGreater(top.metadata["score"], 0)
        self.assertTrue(top.metadata["citation"].startswith("acme/rollback.md"))
        self.assertEqual(top.id, top.metadata["chunk_id"])
        filtered = RagstreamRetriever(
            client=Client(URL, token=ADMIN),
            tenant="acme",
            mode="deep",
            k=3,
            filters={"metadata": {"team": "facilities"}},
        ).invoke(QUESTION)
        self.assertEqual({d.metadata["doc_id"] for d in filtered}, {"office"})

    def test_standing_retriever_reads_the_latest_version(self) -> None:
        from ragstream.langchain import StandingRetriever

        client = Client(URL, token=ACME)
        with client.subscribe(QUESTION, token_budget=400, min_interval_ms=0) as subscription:
            documents = StandingRetriever(subscription=subscription).invoke("not searched")
            latest = subscription.context()
            self.assertEqual([d.id for d in documents], [i.chunk_id for i in latest.items])
            self.assertEqual([d.page_content for d in documents], [i.text for i in latest.items])
            self.assertIn("deployctl", documents[0].page_content)


class LlamaIndexTest(unittest.TestCase):
    def test_retriever_returns_nodes_with_scores_and_metadata(self) -> None:
        from llama_index.core.schema import NodeWithScore

        from ragstream.llama_index import RagstreamRetriever

        retriever = RagstreamRetriever(Client(URL, token=ACME), token_budget=400)
        nodes = retriever.retrieve(QUESTION)
        self.assertTrue(nodes)
        self.assertTrue(all(isinstance(n, NodeWithScore) for n in nodes))
        top = nodes[0]
        self.assertIn("deployctl", top.node.get_content())
        self.assertEqual(top.node.node_id, top.node.metadata["chunk_id"])
        self.assertEqual(top.node.metadata["doc_id"], "rollback")
        self.assertEqual(top.node.metadata["year"], 2024)
        self.assertGreater(top.score or 0.0, 0)
        self.assertTrue(top.node.metadata["citation"].startswith("acme/rollback.md"))

    def test_standing_retriever_reads_the_latest_version(self) -> None:
        from ragstream.llama_index import StandingRetriever

        client = Client(URL, token=ACME)
        with client.subscribe(QUESTION, token_budget=400, min_interval_ms=0) as subscription:
            nodes = StandingRetriever(subscription).retrieve("not searched")
            latest = subscription.context()
            self.assertEqual([n.node.node_id for n in nodes], [i.chunk_id for i in latest.items])
            self.assertIn("deployctl", nodes[0].node.get_content())


if __name__ == "__main__":
    unittest.main(verbosity=2)
