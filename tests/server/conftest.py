"""The server the tool-calling modules share (test_structured_server, test_responses_tools, test_langchain_litellm):
one ``jaxinfer serve`` with ``--tool-call-parser hermes --enable-auto-tool-choice``, started once for this package
and stopped when its tests are done (the rest of the session does not run beside a live server)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def tools_server():
    """``(url, app)`` of the shared tool-calling server."""
    pytest.importorskip("uvicorn")
    from tests.server.test_server import ENGINE, live_server

    with live_server([*ENGINE, "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]) as running:
        yield running
