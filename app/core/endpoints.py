"""The values that say where a wire API lives on HTTP: a route, where a request goes upstream,
where a key travels. Pure, standard library only; ``app.core.routes`` matches requests against
them and documents each field (``Route``, ``UpstreamTarget``, ``KeySlot``, ``AUTHORIZATION``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RouteKind = Literal["fit", "count"]


@dataclass(frozen=True, slots=True)
class Route:
    """One POST endpoint of a wire API (see the module docstring)."""

    template: str
    stream: bool | None = None
    kind: RouteKind = "fit"
    upstream: str = ""
    upstream_first: bool = False
    event_query: str = ""

    @property
    def literal(self) -> bool:
        """True when the template has no parameter (matched by a dict lookup)."""
        return "{" not in self.template

    @property
    def prefix(self) -> str:
        """The template's first segment (``/v1``): the pass-through serves the rest under it."""
        return "/" + self.template.lstrip("/").split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Where one request goes: ``path`` under the base URL, or from its origin (``at_origin``)."""

    path: str
    at_origin: bool = False


@dataclass(frozen=True, slots=True)
class KeySlot:
    """Where a key travels: a header (``scheme`` prefixes the value: ``Bearer KEY``) or a query
    parameter (``in_query``). ``name`` is lower case."""

    name: str
    in_query: bool = False
    scheme: str = ""

    def value(self, key: str) -> str:
        """``key`` as this slot carries it."""
        return f"{self.scheme} {key}" if self.scheme else key

    def key_in(self, value: str) -> str | None:
        """The key a value of this slot carries (None when it is malformed: wrong scheme, empty)."""
        text = value.strip()
        if self.scheme:
            scheme, _, token = text.partition(" ")
            if scheme.lower() != self.scheme.lower():
                return None
            text = token.strip()
        return text or None


AUTHORIZATION = KeySlot("authorization", scheme="Bearer")
