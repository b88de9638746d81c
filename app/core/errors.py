"""The one error tree of ctxproxy: its root, and the core's own errors.

Every error ctxproxy raises on purpose derives from ``CtxproxyError``; anything else that escapes
is a bug (the API answers it with a logged 500). The whole tree, drawn once (the module that
defines each class in brackets; the HTTP status of the errors a client can meet is decided in
``app/api/errors.py`` only):

::

    CtxproxyError                   every error raised on purpose
     ├── CoreError                  the budget engine (this module)
     │    ├── InvalidRequest        the body is not a request we can plan: 400, ``param`` names
     │    │    │                    the offending field (``messages[3].role``)
     │    │    └── InvalidJson      the body is not JSON as RFC 8259 defines it (``NaN``,
     │    │                         ``Infinity``, a number that overflows a double, bad syntax):
     │    │                         400, each API's own invalid-JSON error
     │    ├── CannotFit             nothing the policy allows makes the request fit its budget:
     │    │    │                    400 ``context_length_exceeded``, with every number
     │    │    └── PlanCannotFit    [service.driver] the same, carrying the plan for the
     │    │                         X-Context-* headers
     │    └── InvalidModelTable     a model table is malformed (``key`` names the entry); startup
     ├── UpstreamError              [upstream.errors] no usable HTTP answer from the upstream
     │    ├── UpstreamUnreachable   502
     │    ├── UpstreamTimeout       504
     │    ├── UpstreamProtocolError 502
     │    ├── UpstreamBusy          503 with Retry-After (the proxy's concurrency cap is full)
     │    └── UpstreamPreempted     a summary call client requests cancelled too often; never
     │                              reaches a client (the summary backs off)
     ├── BodyTooLarge               [api.errors] the body is over ``max_body_bytes``: 413
     ├── ClientLeft                 [api.disconnect] the client went away before the answer
     │                              started: nothing is sent (not an answer, a signal)
     ├── SummaryError               [compaction.summarizer] a summary could not be made; never
     │    │                         reaches a client (the summarizer fails open to None)
     │    └── SummaryUpstreamError  [service.summaries] the summarizer's upstream call failed
     ├── VocabularyError            [tokenizer] a shipped vocabulary is missing or corrupt; startup
     ├── InvalidSettings            [settings] bad ``CTXPROXY_*`` values, one line each; startup
     └── CliError                   [cli] bad command-line input: exit code 2

An HTTP answer with an error status from the upstream is not an error of ours: it is a response,
passed back (or classified as a context overflow and retried). Third-party errors are translated
into this tree at the boundary that meets them (``raise UpstreamTimeout(...) from exc``).

Outside the tree on purpose, because they signal a bug and never an answer: ``ExchangeStateError``
(``core.exchange``: an event the exchange cannot take in its state) and ``StructureGuardWarning``
(``core.fit``: a strategy broke an API's structure; a warning, so the plan falls back in
production and the test suite, where warnings are errors, fails). Any other exception class
defined in ``app/`` derives from ``CtxproxyError``.
"""

from __future__ import annotations


class CtxproxyError(Exception):
    """The root: every error ctxproxy raises on purpose (see the tree above)."""


class CoreError(CtxproxyError):
    """Base class of every error the budget engine raises on purpose."""


class InvalidRequest(CoreError):
    """The body cannot be planned: ``param`` names the offending field (``messages[3].role``);
    ``code`` is the API's own code for the problem when it has one (OpenAI's ``invalid_type``,
    ``integer_below_min_value``...; None: a plain request error)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidJson(InvalidRequest, ValueError):
    """The body is not JSON as RFC 8259 defines it (a ``ValueError`` too: what callers of a JSON
    parser catch). ``reason``: the parser's words (``unexpected
    character``); ``line``, ``column`` (1-based) and ``offset`` (0-based, in characters) where it
    stopped, all 0 when unknown; ``excerpt``: the text around that place and a caret line under
    it ("" when unknown); ``unexpected_token``: what stands there starts no JSON value (``NaN``,
    ``Infinity``, a bare word), as opposed to a value that is malformed or out of range. The
    message is ``reason: line L column C (char O)``, the parser's own form."""

    def __init__(
        self,
        reason: str,
        *,
        line: int = 0,
        column: int = 0,
        offset: int = 0,
        excerpt: str = "",
        unexpected_token: bool = False,
    ) -> None:
        where = f": line {line} column {column} (char {offset})" if line else ""
        super().__init__(f"{reason}{where}", param=None)
        self.reason = reason
        self.line = line
        self.column = column
        self.offset = offset
        self.excerpt = excerpt
        self.unexpected_token = unexpected_token


class CannotFit(CoreError):
    """The request is over its input budget and the policy cannot (or may not) bring it under.

    ``tokens`` is the smallest count the engine reached (or the original count under ``reject``),
    ``budget_tokens`` the input budget, ``window_tokens`` the model window and ``reserve_tokens``
    the output reserve, so the message can give the user every number.
    """

    def __init__(
        self,
        *,
        tokens: int,
        budget_tokens: int,
        window_tokens: int,
        reserve_tokens: int,
        reason: str,
    ) -> None:
        self.tokens = tokens
        self.budget_tokens = budget_tokens
        self.window_tokens = window_tokens
        self.reserve_tokens = reserve_tokens
        self.reason = reason
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return (
            f"This request needs {self.tokens} input tokens but its input budget is "
            f"{self.budget_tokens} tokens (context window {self.window_tokens}, "
            f"{self.reserve_tokens} reserved for the output); {self.reason}."
        )


class InvalidModelTable(CoreError):
    """A model table cannot be used: ``key`` names the offending entry, ``source`` the table.

    ``source`` is the table's label (``"builtin"``, ``"operator"``, ...), ``key`` the dotted path of
    the bad value (``models."gpt-4o".max_output``) or None when the whole table is at fault.
    """

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.source = source
