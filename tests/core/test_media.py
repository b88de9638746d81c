"""app.core.media: images by the tile rule, image headers, audio and file parts."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.media import (
    AUDIO_MIN_TOKENS,
    DEFAULT_IMAGE_SIZE,
    FILE_PART_TOKENS,
    image_size_from_data_url,
    image_tokens,
)
from app.core.tokens import MessageCounter
from tests.core.chat_samples import O200K, data_url, gif, jpeg, png, webp_vp8, webp_vp8l, webp_vp8x


def test_audio_and_file_parts_use_flat_rules() -> None:
    mc = MessageCounter(O200K)
    c = O200K.count_text
    base = 3 + c("user")
    small = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert mc.count_message({"role": "user", "content": [small]}) == base + AUDIO_MIN_TOKENS
    ten_seconds_wav = {
        "type": "input_audio",
        "input_audio": {"data": "A" * (16000 * 10 * 4 // 3), "format": "wav"},
    }
    assert mc.count_message({"role": "user", "content": [ten_seconds_wav]}) == base + 100
    file = {
        "type": "file",
        "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64," + "A" * 99999},
    }
    assert mc.count_message({"role": "user", "content": [file]}) == base + FILE_PART_TOKENS + c("report.pdf")


@pytest.mark.parametrize(
    ("width", "height", "detail", "expected"),
    [
        (1024, 1024, "high", 765),
        (2048, 4096, "high", 1105),
        (4096, 8192, "low", 85),
        (1024, 1024, "auto", 765),
        (512, 512, "high", 255),
        (100, 100, "high", 255),
        (768, 768, "high", 765),
        (768, 2048, "high", 1445),
        (1920, 1080, "high", 1105),
    ],
)
def test_image_rule(width: int, height: int, detail: str, expected: int) -> None:
    assert image_tokens(width, height, detail=detail) == expected


@pytest.mark.parametrize(
    ("data", "mime"),
    [
        (png(1500, 700), "image/png"),
        (jpeg(1500, 700), "image/jpeg"),
        (jpeg(1500, 700, exif_bytes=70000), "image/jpeg"),
        (gif(1500, 700), "image/gif"),
        (webp_vp8x(1500, 700), "image/webp"),
        (webp_vp8(1500, 700), "image/webp"),
        (webp_vp8l(1500, 700), "image/webp"),
    ],
)
def test_image_size_from_data_url_headers(data: bytes, mime: str) -> None:
    assert image_size_from_data_url(data_url(data, mime)) == (1500, 700)


def test_image_size_unreadable() -> None:
    assert image_size_from_data_url("https://example.com/cat.png") is None
    assert image_size_from_data_url("data:image/svg+xml,<svg/>") is None
    assert image_size_from_data_url("data:image/png;base64,!!!not base64!!!") is None
    assert image_size_from_data_url(data_url(b"plain bytes, not an image")) is None
    truncated_jpeg = jpeg(10, 10, exif_bytes=200)[:100]
    assert image_size_from_data_url(data_url(truncated_jpeg, "image/jpeg")) is None


def test_base64_is_never_counted_as_text() -> None:
    mc = MessageCounter(O200K)

    def message(url: str, detail: str = "high") -> dict[str, Any]:
        return {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url, "detail": detail}}],
        }

    small = mc.count_message(message(data_url(png(1024, 1024))))
    huge_url = data_url(png(1024, 1024, padding=3_000_000))
    huge = mc.count_message(message(huge_url))
    assert small == huge == 3 + O200K.count_text("user") + 765
    assert mc.count_message(message("https://example.com/a.png", "auto")) == 3 + 1 + image_tokens(
        *DEFAULT_IMAGE_SIZE
    )
    assert mc.count_message(message(huge_url, "low")) == 3 + 1 + 85
    bare = {"role": "user", "content": [{"type": "image_url", "image_url": data_url(png(2048, 4096))}]}
    assert mc.count_message(bare) == 3 + 1 + 1105
    unknown = {"role": "user", "content": [{"type": "input_image", "image": huge_url}]}
    assert mc.count_message(unknown) == 3 + 1 + 765
