"""The controller's JSON-bodied routes decode their body with ``policies.json_text``: FastAPI's decoder keeps
the last of two equal keys, so a consistency report giving ``checks`` twice would store its second list
while the sender's log shows the first. A repeated key is FastAPI's own 422 for a body that is not JSON,
naming the key."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from sparkgate.policies import json_text


class _StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json_text.loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """A route whose handler sees the request through ``_StrictRequest`` (FastAPI's documented hook for
    changing how a body is read: a custom ``APIRoute`` wrapping the request)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictRequest(request.scope, request.receive))

        return strict
