"""Vocabulary shared by the serving loop and the tap worker: routes and end kinds.

Pure values, no I/O. The serving loop classifies each request's path into a
``Route`` (a fixed set, so metric labels never take a raw path) and, when the
exchange is over, says how it ended with an ``EndKind``; the worker turns the end
kind plus what it observed into the record's outcome.
"""

from __future__ import annotations

import enum


class Route(enum.IntEnum):
    """What a request path is, as far as the proxy cares."""

    OTHER = 0
    CHAT = 1
    COMPLETIONS = 2
    MODELS = 3
    RESPONSES = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def origin(self) -> str:
        """The envelope's ``origin`` field."""
        return _ORIGINS.get(self, "other")

    @property
    def mirrored(self) -> bool:
        """Whether requests on this route are handed to the taps."""
        return self in _ORIGINS


_ORIGINS = {Route.CHAT: "chat", Route.COMPLETIONS: "completions", Route.RESPONSES: "responses"}
_ROUTES = {
    "/v1/chat/completions": Route.CHAT,
    "/v1/completions": Route.COMPLETIONS,
    "/v1/responses": Route.RESPONSES,
    "/v1/models": Route.MODELS,
}


def classify(method: str, path: str) -> Route:
    """The route of a request. Only POSTs to the generation paths are mirrored."""
    route = _ROUTES.get(path.rstrip("/"), Route.OTHER)
    if route.mirrored and method != "POST":
        return Route.OTHER
    return route


class EndKind(enum.IntEnum):
    """How an exchange ended, as the serving loop saw it."""

    #: The frontend's body ended normally and the client received all of it.
    CLEAN = 0
    #: The client went away before the frontend's body ended.
    CLIENT_GONE = 1
    #: The connection to the frontend broke after the response had started.
    UPSTREAM_BROKEN = 2
    #: A read from the frontend timed out.
    TIMEOUT = 3
    #: The frontend could not be reached or failed before answering; the proxy
    #: answered itself (502 or 504).
    UPSTREAM_FAILED = 4
    #: The proxy shut down with the stream still open (grace period over).
    SHUTDOWN = 5
    #: Part of the exchange could not be handed to the worker (channel full):
    #: the worker cannot build a faithful record.
    CAPTURE_LOST = 6
