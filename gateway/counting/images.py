"""What an image costs (OpenAI's vision pricing): by its size when a data URL's header says it
(PNG, JPEG, GIF, WebP; only the header bytes of the base64 payload are decoded), else a flat
price.
"""

from __future__ import annotations

import binascii
import math
import struct
from collections.abc import Mapping
from typing import Final

# Images: OpenAI's vision pricing for the gpt-4o family. detail=low costs the base; high (and
# auto, counted as high to stay on the safe side) costs base + per tile after the image is
# scaled to fit 2048x2048 and then its shortest side to 768, in 512x512 tiles. When the size is
# unknown (a remote URL, an unreadable header) an image costs IMAGE_FLAT_TOKENS, the price of a
# 1024x1024 high-detail image (4 tiles); the most a high-detail image can cost is 85 + 170*8.
IMAGE_BASE_TOKENS: Final = 85
IMAGE_TILE_TOKENS: Final = 170
IMAGE_FLAT_TOKENS: Final = 765
IMAGE_FIT_SIDE: Final = 2048
IMAGE_SHORT_SIDE: Final = 768
IMAGE_TILE_SIDE: Final = 512


def image_tokens(image_url: object) -> int:
    """Tokens of an `image_url` content part's value (`{"url", "detail"}` or a bare URL string)."""
    url: object
    detail: object
    if isinstance(image_url, str):
        url, detail = image_url, "auto"
    elif isinstance(image_url, Mapping):
        url = image_url.get("url")
        detail = image_url.get("detail") or "auto"
    else:
        return IMAGE_FLAT_TOKENS
    if detail == "low":
        return IMAGE_BASE_TOKENS
    size = data_url_image_size(url) if isinstance(url, str) else None
    if size is None:
        return IMAGE_FLAT_TOKENS
    return high_detail_image_tokens(*size)


def high_detail_image_tokens(width: int, height: int) -> int:
    """OpenAI's tile formula: fit in 2048x2048, shortest side to 768, 170 per 512px tile + 85."""
    if width <= 0 or height <= 0:
        return IMAGE_BASE_TOKENS
    scale = min(1.0, IMAGE_FIT_SIDE / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, IMAGE_SHORT_SIDE / min(w, h))
    w, h = math.floor(w * scale), math.floor(h * scale)
    tiles = math.ceil(w / IMAGE_TILE_SIDE) * math.ceil(h / IMAGE_TILE_SIDE)
    return IMAGE_BASE_TOKENS + IMAGE_TILE_TOKENS * max(tiles, 1)


_JPEG_SOF: Final = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE: Final = frozenset({0x01, *range(0xD0, 0xD8)})
_JPEG_MAX_SEGMENTS: Final = 256


class _Base64Prefix:
    """Random access to the bytes of a base64 payload, decoding only the 4-char groups read."""

    def __init__(self, payload: str) -> None:
        self._payload = payload

    def read(self, start: int, length: int) -> bytes:
        """Up to `length` bytes at `start`; fewer at the end of the payload or if it is invalid."""
        first, last = start // 3, (start + length + 2) // 3
        try:
            data = binascii.a2b_base64(self._payload[first * 4 : last * 4], strict_mode=True)
        except binascii.Error:
            return b""
        return data[start - first * 3 : start - first * 3 + length]


def data_url_image_size(url: str) -> tuple[int, int] | None:
    """(width, height) from a `data:image/...;base64,` URL's header bytes, or None."""
    if not url.startswith("data:"):
        return None
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        return None
    reader = _Base64Prefix(payload)
    head = reader.read(0, 30)
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        width, height = struct.unpack(">II", head[16:24])
        return width, height
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        width, height = struct.unpack("<HH", head[6:10])
        return width, height
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp_size(head)
    if head[:2] == b"\xff\xd8":
        return _jpeg_size(reader)
    return None


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a" and len(head) >= 30:
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and head[20:21] == b"\x2f" and len(head) >= 25:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(head) >= 30:
        width = int.from_bytes(head[24:27], "little") + 1
        height = int.from_bytes(head[27:30], "little") + 1
        return width, height
    return None


def _jpeg_size(reader: _Base64Prefix) -> tuple[int, int] | None:
    """Walk the JPEG segment headers (4 bytes each) to the first start-of-frame marker."""
    offset = 2
    for _ in range(_JPEG_MAX_SEGMENTS):
        marker = reader.read(offset, 4)
        if len(marker) < 4 or marker[0] != 0xFF:
            return None
        code = marker[1]
        if code == 0xFF:  # fill byte
            offset += 1
            continue
        if code in _JPEG_STANDALONE:  # markers that carry no length
            offset += 2
            continue
        if code in (0xD9, 0xDA):  # end of image / start of scan: no frame header before it
            return None
        if code in _JPEG_SOF:
            frame = reader.read(offset + 5, 4)
            if len(frame) < 4:
                return None
            height, width = struct.unpack(">HH", frame)
            return width, height
        offset += 2 + int.from_bytes(marker[2:4], "big")
    return None
