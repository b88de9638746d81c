"""Gemini's prices of what is not text: images, documents, audio, video, thought signatures.

INTERFACE CONTRACT (``gemini_wire.py`` prices parts with these; pure, standard library only):

* ``media_tokens(mime_type, data) -> int``: one ``inlineData`` part (``data`` its base64 string)
  or one ``fileData`` part (``data`` None: only the URI is in the request);
* ``image_tokens(width, height) -> int``: Gemini's tile rule with the Gemini 3 floor (below);
* ``signature_tokens(signature) -> int``: a ``thoughtSignature`` sent back in a request.

Gemini's tokenizer is not public; these follow Google's documented rules and round up where the
rule depends on something the request does not say (ai.google.dev/gemini-api/docs/tokens,
/vision, /document-processing, /audio, /video-understanding, /thinking):

* an image costs ``IMAGE_TILE_TOKENS`` (258) when both sides are at most ``IMAGE_SMALL_PX`` (384)
  pixels, else 258 per ``IMAGE_TILE_PX`` (768) square tile that covers it (Gemini 2.x); Gemini 3
  prices an image by its ``media_resolution`` (``high``, the default for images: 1,120 tokens),
  so no image is priced below ``IMAGE_FLOOR_TOKENS`` (1,120). An image whose size cannot be read
  from its header (a ``fileData`` URI, an unknown format) costs ``IMAGE_UNKNOWN_TOKENS`` (3,000,
  the figure gemini-cli itself uses: a 4K image on Gemini 3);
* a PDF costs ``DOCUMENT_PAGE_TOKENS`` (258) per page, its pages counted by their ``/Type /Page``
  objects in the decoded bytes (at least one); a PDF by URI is priced at
  ``DOCUMENT_UNKNOWN_PAGES`` pages (gemini-cli's estimate: about 100 pages);
* audio costs 32 tokens a second and video 263 (plus its audio track's 32); the duration is not in
  the request, so inline audio/video is priced by its size at ``MEDIA_BYTES_PER_TOKEN`` bytes a
  token (128 kbit/s audio: 16 KB a second for 32 tokens, 1 token per 500 bytes; video at about
  1 Mbit/s: 125 KB a second for 295 tokens, 1 token per 424 bytes; 400 covers both), and a
  URI at ``MEDIA_UNKNOWN_SECONDS`` of video;
* inline text (``text/*``, JSON, ...) is priced like text at ``TEXT_BYTES_PER_TOKEN`` bytes a token;
* a thought signature counts toward the input ("Thought signatures will increase the input tokens
  you are charged when sent back"): priced like Responses' encrypted reasoning, one token per
  ``SIGNATURE_CHARS_PER_TOKEN`` base64 characters (over-counts rather than under-counts).

A request whose media the upstream counts differently is corrected by the upstream's usage
(``usageMetadata.promptTokenCount``) and, near the boundary, by ``:countTokens``.
"""

from __future__ import annotations

import base64
import binascii
import math

from ..media import image_size_from_data_url

IMAGE_TILE_TOKENS = 258
IMAGE_SMALL_PX = 384
IMAGE_TILE_PX = 768
IMAGE_FLOOR_TOKENS = 1120
IMAGE_UNKNOWN_TOKENS = 3000
DOCUMENT_PAGE_TOKENS = 258
DOCUMENT_UNKNOWN_PAGES = 100
AUDIO_TOKENS_PER_SECOND = 32
VIDEO_TOKENS_PER_SECOND = 263
MEDIA_BYTES_PER_TOKEN = 400
MEDIA_UNKNOWN_SECONDS = 60
TEXT_BYTES_PER_TOKEN = 4
SIGNATURE_CHARS_PER_TOKEN = 4
# Only this much of a base64 PDF is decoded to count its pages (about 48 MB decoded; Gemini takes
# at most 20 MB inline), so a hostile body cannot make parsing unbounded.
DOCUMENT_MAX_DECODED_CHARS = 64 * 1024 * 1024
# Enough of a base64 image for its header (PNG, GIF, WebP, JPEG's SOF marker).
IMAGE_HEADER_CHARS = 200_000


def image_tokens(width: int, height: int) -> int:
    """Gemini 2.x's tile rule, never below Gemini 3's default (``IMAGE_FLOOR_TOKENS``)."""
    w, h = max(1, width), max(1, height)
    if w <= IMAGE_SMALL_PX and h <= IMAGE_SMALL_PX:
        tiles = 1
    else:
        tiles = math.ceil(w / IMAGE_TILE_PX) * math.ceil(h / IMAGE_TILE_PX)
    return max(IMAGE_FLOOR_TOKENS, tiles * IMAGE_TILE_TOKENS)


def signature_tokens(signature: object) -> int:
    """A thought signature's price (0 for anything that is not a non-empty string)."""
    if not isinstance(signature, str) or not signature:
        return 0
    return math.ceil(len(signature) / SIGNATURE_CHARS_PER_TOKEN)


def _decoded_size(data: str) -> int:
    """The decoded size of base64 ``data`` without decoding it (padding and line breaks aside)."""
    chars = len(data) - data.count("\n") - data.count("\r") - data.count("=")
    return max(0, chars * 3 // 4)


def _pdf_pages(data: str) -> int:
    try:
        raw = base64.b64decode(data[:DOCUMENT_MAX_DECODED_CHARS], validate=False)
    except (binascii.Error, ValueError):
        return 1
    pages = raw.count(b"/Type /Page") - raw.count(b"/Type /Pages")
    pages += raw.count(b"/Type/Page") - raw.count(b"/Type/Pages")
    return max(1, pages)


def media_tokens(mime_type: object, data: object) -> int:
    """The price of one media part (see the module docstring); ``data`` None for a URI."""
    mime = mime_type.lower() if isinstance(mime_type, str) else ""
    inline = data if isinstance(data, str) else None
    if mime.startswith("image/"):
        if inline is not None:
            size = image_size_from_data_url(f"data:{mime};base64,{inline[:IMAGE_HEADER_CHARS]}")
            if size is not None:
                return image_tokens(*size)
        return IMAGE_UNKNOWN_TOKENS
    if mime == "application/pdf":
        pages = _pdf_pages(inline) if inline is not None else DOCUMENT_UNKNOWN_PAGES
        return DOCUMENT_PAGE_TOKENS * pages
    if inline is not None and (mime.startswith("text/") or mime.endswith(("json", "xml"))):
        return math.ceil(_decoded_size(inline) / TEXT_BYTES_PER_TOKEN)
    if inline is not None:
        return max(1, math.ceil(_decoded_size(inline) / MEDIA_BYTES_PER_TOKEN))
    if mime.startswith("audio/"):
        return AUDIO_TOKENS_PER_SECOND * MEDIA_UNKNOWN_SECONDS
    return (VIDEO_TOKENS_PER_SECOND + AUDIO_TOKENS_PER_SECOND) * MEDIA_UNKNOWN_SECONDS


__all__ = [
    "DOCUMENT_PAGE_TOKENS",
    "IMAGE_FLOOR_TOKENS",
    "IMAGE_TILE_TOKENS",
    "IMAGE_UNKNOWN_TOKENS",
    "image_tokens",
    "media_tokens",
    "signature_tokens",
]
