"""A real MCP client (the PyPI package `mcp`) for the standing-query MCP test: launches
`ragstream mcp` over stdio, subscribes to a search with `rag_subscribe`, subscribes to its resource
(`resources/subscribe` with MCP_CLIENT_MODE=legacy, a `subscriptions/listen` stream otherwise),
posts a document that moves the context over the job's HTTP API, waits to be told, reads the
resource again, unsubscribes, and prints one JSON document with what it saw. Usage:

    standing.py DOCUMENTS_URL TOKEN DOCUMENT_JSON COMMAND [ARG ...]
"""

import asyncio
import json
import os
import sys
import warnings

import urllib.request
from mcp import Client
from mcp.client.stdio import StdioServerParameters

QUESTION = "How do I roll back a release?"
WAIT_SECONDS = 90


def latest(read):
    """The subscription status a resource read holds."""
    return json.loads(read.contents[0].text)


async def exercise(server, post):
    legacy = os.environ.get("MCP_CLIENT_MODE") == "legacy"
    told = asyncio.Queue()

    async def on_message(message):
        params = getattr(message, "params", None)
        if getattr(message, "method", "") == "notifications/resources/updated" and params:
            await told.put(params.uri)

    seen = {"notified": []}
    async with Client(server, mode="legacy" if legacy else "auto", message_handler=on_message) as client:
        seen["protocol"] = client.protocol_version
        capabilities = client.server_capabilities
        seen["resources_subscribe"] = bool(capabilities.resources and capabilities.resources.subscribe)
        made = await client.call_tool("rag_subscribe", {"query": QUESTION, "token_budget": 300, "min_interval_ms": 0})
        seen["subscribed"] = {"is_error": bool(made.is_error), "structured": made.structured_content}
        uri = made.structured_content["uri"]
        listed = await client.list_resources()
        seen["listed"] = [resource.uri for resource in listed.resources]
        seen["first"] = latest(await client.read_resource(uri))

        async def moved_until(marker, listen=None):
            """Posts the document, then waits for notifications until the read context holds `marker`."""
            request = urllib.request.Request(post["url"], data=post["body"].encode(), headers=post["headers"])
            answer = await asyncio.to_thread(urllib.request.urlopen, request, timeout=120)
            seen["posted"] = answer.status
            deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return None
                try:
                    if listen is None:
                        seen["notified"].append(await asyncio.wait_for(told.get(), remaining))
                    else:
                        event = await asyncio.wait_for(listen.__anext__(), remaining)
                        seen["notified"].append(event.uri)
                except asyncio.TimeoutError:
                    return None
                status = latest(await client.read_resource(uri))
                if marker in status["latest"]["context"]["context"]:
                    return status

        marker = post["marker"]
        if legacy:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.subscribe_resource(uri)
            seen["moved"] = await moved_until(marker)
        else:
            async with client.listen(resource_subscriptions=[uri]) as listen:
                seen["moved"] = await moved_until(marker, listen)
        ended = await client.call_tool("rag_unsubscribe", {"subscription_id": made.structured_content["subscription_id"]})
        seen["unsubscribed"] = {"is_error": bool(ended.is_error), "structured": ended.structured_content}
        try:
            await client.read_resource(uri)
            seen["read_after_end"] = "read"
        except Exception as error:  # the protocol error of a resource not found
            seen["read_after_end"] = str(error)
    return seen


def main():
    url, token, document = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    post = {
        "url": url,
        "headers": {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        "marker": document.pop("marker"),
    }
    post["body"] = json.dumps({"documents": [document]})
    server = StdioServerParameters(command=sys.argv[4], args=sys.argv[5:], env=dict(os.environ))
    print(json.dumps(asyncio.run(exercise(server, post))))


if __name__ == "__main__":
    main()
