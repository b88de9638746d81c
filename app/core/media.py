"""Media parts of a chat message, priced without decoding them: images, audio and files.

INTERFACE CONTRACT:

* ``image_tokens(width, height, *, detail="auto") -> int``: OpenAI's image rule.
* ``image_size_from_data_url(url) -> (width, height) | None``: PNG, JPEG, GIF and WebP sizes from
  the first bytes of a base64 data URL (never the whole image); None when it cannot be read.
* The prices of one wire part, each a fixed token count (media is never counted as text; used by
  the chat accounting, ``accounting.py``, and by dialects whose parts share the rule):
  ``image_part_tokens(image_url)`` (chat's ``image_url`` value: a URL string or ``{"url",
  "detail"}``), ``audio_part_tokens(input_audio)`` (``{"data": base64, "format"}``),
  ``data_url_tokens(url)`` (a ``data:`` URL met anywhere else: an image by its size, anything
  else as a file) and ``FILE_PART_TOKENS`` (a file part's flat allowance).

The rules, all conservative where OpenAI documents nothing: an image by its tiles (a remote URL, or
a data URL whose header cannot be read, is taken to be ``DEFAULT_IMAGE_SIZE``); audio by its
duration at the lowest plausible bitrate for its format, with a floor; a file by a flat allowance.
Pure functions of their input: no I/O, no fetching.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

# OpenAI's image rule (gpt-4o family): low detail is a flat 85; high/auto fit the image within
# 2048x2048, scale it down so its shortest side is 768, then 85 + 170 per 512px tile.
IMAGE_LOW_TOKENS = 85
IMAGE_BASE_TOKENS = 85
IMAGE_TILE_TOKENS = 170
IMAGE_TILE_PX = 512
IMAGE_MAX_SIDE_PX = 2048
IMAGE_SHORT_SIDE_PX = 768
# A remote image (or a data URL whose header we cannot read) is not fetched: we assume 1024x1024,
# i.e. 765 tokens at high detail, the size OpenAI uses as its worked example.
DEFAULT_IMAGE_SIZE = (1024, 1024)
# Only the start of a data URL is decoded: PNG, GIF and WebP keep their size in the first bytes;
# a JPEG's SOF marker can sit behind an EXIF block, so JPEG reads up to IMAGE_HEADER_MAX_BYTES.
IMAGE_HEADER_BYTES = 4096
IMAGE_HEADER_MAX_BYTES = 131072

# Audio input is billed at about 10 tokens per second on gpt-4o audio models. We cannot decode the
# audio, so we take the duration from its size at the lowest plausible bitrate for its format
# (a low bitrate means a long clip, so this over-counts rather than under-counts), with a floor.
AUDIO_TOKENS_PER_SECOND = 10
AUDIO_BYTES_PER_SECOND = {"wav": 16000, "pcm16": 16000, "mp3": 4000}  # 8 kHz mono 16-bit; 32 kbit/s
AUDIO_DEFAULT_BYTES_PER_SECOND = 4000
AUDIO_MIN_TOKENS = 50

# A file part (PDF) is turned upstream into page text plus page images, neither of which we can see
# without parsing it; a flat allowance is counted (about one dense page: text plus one page image)
# together with the filename. Larger files are caught by the upstream overflow retry.
FILE_PART_TOKENS = 1024


def image_tokens(width: int, height: int, *, detail: str = "auto") -> int:
    """OpenAI's image rule: ``low`` is 85; ``high``/``auto`` 85 + 170 per 512px tile after resizing."""
    if detail == "low":
        return IMAGE_LOW_TOKENS
    w, h = float(max(1, width)), float(max(1, height))
    if max(w, h) > IMAGE_MAX_SIDE_PX:
        ratio = IMAGE_MAX_SIDE_PX / max(w, h)
        w, h = w * ratio, h * ratio
    if min(w, h) > IMAGE_SHORT_SIDE_PX:
        ratio = IMAGE_SHORT_SIDE_PX / min(w, h)
        w, h = w * ratio, h * ratio
    # A hair of tolerance so 768.0000001 from float scaling does not add a tile.
    tiles = math.ceil(w / IMAGE_TILE_PX - 1e-9) * math.ceil(h / IMAGE_TILE_PX - 1e-9)
    return IMAGE_BASE_TOKENS + IMAGE_TILE_TOKENS * tiles


def image_part_tokens(image: Any) -> int:
    """Tokens of chat's ``image_url`` value (a URL string or ``{"url", "detail"}``): ``low`` is
    flat, else the tile rule on the data URL's size (``DEFAULT_IMAGE_SIZE`` when unreadable)."""
    url: Any = image
    detail: Any = "auto"
    if isinstance(image, Mapping):
        url = image.get("url")
        detail = image.get("detail") or "auto"
    if detail == "low":
        return IMAGE_LOW_TOKENS
    size = image_size_from_data_url(url) if isinstance(url, str) else None
    width, height = size or DEFAULT_IMAGE_SIZE
    return image_tokens(width, height, detail="high")


def data_url_tokens(url: str) -> int:
    """Tokens for a data URL met outside a known part (an image if it says so, else a file)."""
    if url[5:11].lower() == "image/":
        width, height = image_size_from_data_url(url) or DEFAULT_IMAGE_SIZE
        return image_tokens(width, height)
    return FILE_PART_TOKENS


def image_size_from_data_url(url: str) -> tuple[int, int] | None:
    """``(width, height)`` from a base64 data URL's image header, or None when it cannot be read.

    Only the first :data:`IMAGE_HEADER_BYTES` (JPEG: up to :data:`IMAGE_HEADER_MAX_BYTES`) are
    decoded, never the whole image. Knows PNG, JPEG, GIF and WebP.
    """
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 256)
    if comma < 0 or ";base64" not in url[:comma].lower():
        return None
    start = comma + 1
    budget = IMAGE_HEADER_BYTES
    while True:
        stop = start + budget // 3 * 4
        head = _b64_prefix(url[start:stop])
        if head is None:
            return None
        size = _sniff_size(head)
        if size is not None or not head.startswith(b"\xff\xd8"):
            return size
        if stop >= len(url) or budget >= IMAGE_HEADER_MAX_BYTES:  # all read, or read enough
            return None
        budget = min(budget * 8, IMAGE_HEADER_MAX_BYTES)


def _b64_prefix(chunk: str) -> bytes | None:
    chunk = "".join(chunk.split())
    if "-" in chunk or "_" in chunk:
        chunk = chunk.replace("-", "+").replace("_", "/")
    chunk = chunk.rstrip("=")
    if len(chunk) % 4 == 1:  # a lone sextet is not a byte
        chunk = chunk[:-1]
    chunk += "=" * (-len(chunk) % 4)  # a partial group still decodes to its complete bytes
    try:
        return base64.b64decode(chunk, validate=True)
    except (binascii.Error, ValueError):
        return None


def _sniff_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        return (
            int.from_bytes(data[26:28], "little") & 0x3FFF,
            int.from_bytes(data[28:30], "little") & 0x3FFF,
        )
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # stand-alone markers
            i += 2
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return (width, height) if width and height else None
        if length < 2:
            return None
        i += 2 + length
    return None


def audio_part_tokens(audio: Any) -> int:
    """Tokens of chat's ``input_audio`` value: its duration at the format's lowest plausible
    bitrate, at least ``AUDIO_MIN_TOKENS`` (also for a malformed value)."""
    if not isinstance(audio, Mapping):
        return AUDIO_MIN_TOKENS
    data = audio.get("data")
    fmt = audio.get("format")
    rate = (
        AUDIO_BYTES_PER_SECOND.get(fmt, AUDIO_DEFAULT_BYTES_PER_SECOND)
        if isinstance(fmt, str)
        else (AUDIO_DEFAULT_BYTES_PER_SECOND)
    )
    size_bytes = len(data) * 3 // 4 if isinstance(data, str) else 0
    return max(AUDIO_MIN_TOKENS, math.ceil(size_bytes / rate * AUDIO_TOKENS_PER_SECOND))
