"""What content parts cost in tokens: text by the counter, media by the providers' formulas.

Every counter (tiktoken, approximate, callable) counts parts by the same rules; only the text
count differs. Base64 is never tokenized as text: a model reads the image, the sound or the
document, not its encoding. Sources were read on 2026-12-01; docs/tokens.md ("Content parts")
has the same rules with examples.

Text and reasoning
    ``count_text(part.text)``. A reasoning part's ``signature`` and ``encrypted`` content
    are not counted: they are opaque tokens the provider checks or decrypts on its side, not
    text the model reads, and their length says nothing about the reasoning's. (Anthropic
    does not count earlier turns' thinking at all, so counting the text errs high.)

Images — OpenAI, "Images and vision", Calculating costs
(https://platform.openai.com/docs/guides/images-vision#calculating-costs)
    ``detail: low`` costs 85. ``high`` (and ``auto`` or no detail, which may choose high, so
    counted as its upper bound): fit within 2048x2048, then scale the shortest side down to
    768, then 170 tokens per 512-px tile + 85. Worked examples of the docs: 1024x1024 high =
    765; 2048x4096 high = 1105; 4096x8192 low = 85. Images already smaller than that are not
    scaled up: OpenAI bills a 128x64 image at high detail one tile (255), measured by the
    community (https://community.openai.com/t/1262691). Scaled sizes are rounded up to whole
    pixels; OpenAI does not say how it rounds. The size is read from the header of a
    ``data:`` URL (PNG, JPEG, GIF, WebP), decoding only the bytes the header needs.

    An image whose size cannot be read (a remote URL, a file id, an unreadable header) costs
    :data:`IMAGE_UNKNOWN` = 1445, the most any image costs at high detail (2x4 tiles, as
    768x2048 after scaling), so that an image never makes a context go over its budget.

Audio — OpenAI, "Realtime API costs" (https://developers.openai.com/api/docs/guides/realtime-costs)
    A user's audio is 1 token per 100 ms: 10 tokens a second, rounded up. The duration comes
    from a WAV header (``data`` size / byte rate) or an MP3 frame header (its bit rate); when
    neither can be read, from the decoded size at an assumed rate (:data:`AUDIO_BYTES_PER_SECOND`:
    WAV and AIFF 16 kHz 16-bit mono, raw pcm16 24 kHz 16-bit mono as OpenAI's Realtime API
    takes it, any other format 64 kbit/s). Gemini counts 32 tokens a second
    (https://ai.google.dev/gemini-api/docs/tokens); Zerda's counters count OpenAI's format.

Files — OpenAI, "File inputs" (https://developers.openai.com/api/docs/guides/file-inputs);
Anthropic, "PDF support" (https://platform.claude.com/docs/en/build-with-claude/pdf-support)
    A PDF is read as the text and an image of each page (both providers). Anthropic puts a
    page's text at 1,500-3,000 tokens; OpenAI gives no figure. A page costs
    :data:`FILE_PAGE_TOKENS` = 2265: 1500 of text (Anthropic's low end) + 765 for its image (a
    US Letter page at high detail by the image formula above). Pages are counted from the
    PDF's page objects, in compressed object streams too; a PDF whose pages cannot be found
    counts one page per 50 KB. A text file (``text/*``, JSON, XML, YAML, CSV, or such a file
    name) is decoded and counted as text, as OpenAI extracts it. A file by id or URL, or of
    another type, counts :data:`FILE_UNKNOWN` = one page: its size cannot be known without
    fetching it, no bound exists (a PDF may have hundreds of pages), and one page is what any
    document costs at least.

Every rule runs on what the part holds and never raises: a header it cannot read gets the
default. An image or audio part costs a few microseconds whatever its size; a PDF or text file
is decoded once, when its message is counted (memories count each message once, when added).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from urllib.parse import unquote_to_bytes

from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart

__all__ = [
    "AUDIO_BYTES_PER_SECOND",
    "AUDIO_TOKENS_PER_SECOND",
    "FILE_PAGE_TOKENS",
    "FILE_UNKNOWN",
    "IMAGE_UNKNOWN",
    "audio_length",
    "audio_part_tokens",
    "audio_seconds",
    "data_url",
    "decoded_size",
    "file_part_tokens",
    "image_part_tokens",
    "image_size",
    "image_tokens",
    "part_tokens",
    "parts_tokens",
    "pdf_pages",
    "split_data_url",
]

IMAGE_LOW = 85
IMAGE_BASE = 85
IMAGE_TILE = 170
_TILE = 512
_FIT = 2048
_SHORT_SIDE = 768

AUDIO_TOKENS_PER_SECOND = 10
AUDIO_BYTES_PER_SECOND: Mapping[str, int] = MappingProxyType(
    {
        "wav": 32_000,  # 16 kHz, 16-bit, mono: speech as most apps record it
        "aiff": 32_000,
        "pcm16": 48_000,  # 24 kHz, 16-bit, mono: OpenAI Realtime's pcm16
    }
)
"""Bytes a second assumed when a recording's header cannot be read; other formats 64 kbit/s."""
_AUDIO_OTHER_BYTES_PER_SECOND = 8_000

FILE_PAGE_TOKENS = 1500 + 765
_PDF_BYTES_PER_PAGE = 50_000

# How far a parser looks: a data: URL's header, JPEG segments, WAV chunks. Bounded so that a
# hostile header costs microseconds, not a walk through megabytes.
_MAX_HEADER = 1024
_MAX_SEGMENTS = 64
_MAX_INFLATE = 1 << 25


def parts_tokens(parts: Sequence[Part], count_text: Callable[[str], int]) -> int:
    """Tokens of a message's content parts, by the rules of the module docstring."""
    n = 0
    for part in parts:
        kind = type(part)
        if kind is TextPart or kind is ReasoningPart:
            text = part.text  # type: ignore[union-attr]
            if text:
                n += count_text(text)
        elif kind is ImagePart:
            n += image_part_tokens(part)  # type: ignore[arg-type]
        elif kind is AudioPart:
            n += audio_part_tokens(part)  # type: ignore[arg-type]
        elif kind is FilePart:
            n += file_part_tokens(part, count_text)  # type: ignore[arg-type]
    return n


def part_tokens(part: Part, count_text: Callable[[str], int]) -> int:
    """Tokens of one part: a message's parts cost the sum of these."""
    return parts_tokens((part,), count_text)


# -- base64 without decoding all of it ----------------------------------------------------------


class _Unreadable(Exception):
    """The bytes asked for are not there, or not base64."""


def _data_url(url: str) -> tuple[str, int, bool] | None:
    """``(media type, offset of the payload, is base64)`` of a ``data:`` URL, else None."""
    if url[:5].lower() != "data:":
        return None
    comma = url.find(",", 5, _MAX_HEADER)
    if comma < 0:
        return None
    params = url[5:comma].split(";")
    return params[0].strip().lower(), comma + 1, params[-1].strip().lower() == "base64"


_BASE64_DATA_URL = re.compile(r"data:([^;,]+);base64,(.*)", re.DOTALL)


def split_data_url(url: str | None) -> tuple[str, str] | None:
    """``(media type, base64 data)`` of a ``data:TYPE;base64,DATA`` URL, else ``None``;
    :func:`data_url` gives the same URL back."""
    if url is None or not url.startswith("data:"):
        return None
    found = _BASE64_DATA_URL.fullmatch(url)
    return (found.group(1), found.group(2)) if found else None


def data_url(media_type: str, data: str) -> str:
    """A ``data:`` URL holding base64 ``data`` of ``media_type``."""
    return f"data:{media_type};base64,{data}"


def _bytes(b64: str, start: int, offset: int, length: int) -> bytes:
    """Bytes ``offset`` to ``offset + length`` of the base64 text ``b64[start:]``, decoding
    only the quads that hold them; fewer at the end of the data."""
    if offset < 0:
        raise _Unreadable
    first = offset // 3
    chunk = b64[start + 4 * first : start + 4 * (-(-(offset + length) // 3))]
    if len(chunk) % 4:  # the end of unpadded base64
        chunk += "=" * (-len(chunk) % 4)
    try:
        data = base64.b64decode(chunk, validate=True)
    except (ValueError, binascii.Error):  # not base64, not ASCII, a bad quad
        raise _Unreadable from None
    skip = offset - 3 * first
    return data[skip : skip + length]


def decoded_size(b64: str, start: int = 0) -> int:
    """How many bytes the base64 text ``b64[start:]`` holds, from its length alone."""
    n = len(b64) - start
    pad = 2 if b64.endswith("==") else 1 if b64.endswith("=") else 0
    return max(0, n * 3 // 4 - pad)


# -- images ---------------------------------------------------------------------------------------


def image_tokens(width: int, height: int, detail: str | None = None) -> int:
    """OpenAI's cost of a ``width`` x ``height`` image at ``detail`` (None and ``auto`` as
    ``high``)."""
    if detail == "low":
        return IMAGE_LOW
    w, h = width, height
    longest = max(w, h)
    if longest > _FIT:
        w, h = -(-w * _FIT // longest), -(-h * _FIT // longest)
    shortest = min(w, h)
    if shortest > _SHORT_SIDE:
        w, h = -(-w * _SHORT_SIDE // shortest), -(-h * _SHORT_SIDE // shortest)
    tiles = -(-w // _TILE) * -(-h // _TILE)
    return IMAGE_BASE + IMAGE_TILE * tiles


IMAGE_UNKNOWN = image_tokens(_SHORT_SIDE, _FIT)


def image_part_tokens(part: ImagePart) -> int:
    if part.detail == "low":
        return IMAGE_LOW
    size = image_size(part.url) if part.url is not None else None
    if size is None:
        return IMAGE_UNKNOWN
    return image_tokens(size[0], size[1], part.detail)


def image_size(url: str) -> tuple[int, int] | None:
    """``(width, height)`` from the header of a base64 ``data:`` URL holding a PNG, JPEG, GIF
    or WebP image; None for anything else or a header that cannot be read."""
    parsed = _data_url(url)
    if parsed is None or not parsed[2]:
        return None
    start = parsed[1]
    try:
        head = _bytes(url, start, 0, 30)
        if head[:8] == b"\x89PNG\r\n\x1a\n":
            size = _png(head)
        elif head[:6] in (b"GIF87a", b"GIF89a"):
            size = _gif(head)
        elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            size = _webp(head)
        elif head[:3] == b"\xff\xd8\xff":
            size = _jpeg(url, start)
        else:
            return None
    except _Unreadable:
        return None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size[0], size[1]


def _png(head: bytes) -> tuple[int, int] | None:
    if head[12:16] != b"IHDR" or len(head) < 24:
        return None
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def _gif(head: bytes) -> tuple[int, int] | None:
    if len(head) < 10:
        return None
    w, h = struct.unpack("<HH", head[6:10])
    return w, h


def _webp(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8X" and len(head) >= 30:  # extended: the canvas size, minus one
        return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(head[27:30], "little")
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":  # lossy
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:  # lossless: 14 bits each
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


# Start-of-frame markers: every SOFn but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(b64: str, start: int) -> tuple[int, int] | None:
    """The frame size, found by hopping over the segments before it (EXIF, ICC profiles and
    tables can be tens of kilobytes) and decoding only each segment's first bytes."""
    pos = 2
    for _ in range(_MAX_SEGMENTS):
        seg = _bytes(b64, start, pos, 9)
        if len(seg) < 4 or seg[0] != 0xFF:
            return None
        marker = seg[1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker in _SOF:
            if len(seg) < 9:
                return None
            h, w = struct.unpack(">HH", seg[5:9])
            return w, h
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
        elif marker in (0xD9, 0xDA):  # the image ends, or its data starts, before a frame
            return None
        else:
            (length,) = struct.unpack(">H", seg[2:4])
            if length < 2:
                return None
            pos += 2 + length
    return None


# -- audio ----------------------------------------------------------------------------------------


def audio_part_tokens(part: AudioPart) -> int:
    seconds, size = audio_length(part)
    if seconds is None:
        fmt = part.format.strip().lower()
        seconds = size / AUDIO_BYTES_PER_SECOND.get(fmt, _AUDIO_OTHER_BYTES_PER_SECOND)
    return max(1, math.ceil(seconds * AUDIO_TOKENS_PER_SECOND))


def audio_length(part: AudioPart) -> tuple[float | None, int]:
    """The duration of ``part``'s audio from its header (``None`` when it cannot be read) and
    its size in bytes; its data is base64, bare or as a ``data:`` URL."""
    data = part.data
    parsed = _data_url(data)
    start = parsed[1] if parsed is not None else 0
    size = decoded_size(data, start)
    return audio_seconds(data, start, size), size


def audio_seconds(b64: str, start: int = 0, size: int | None = None) -> float | None:
    """The duration of base64 audio ``b64[start:]`` from its WAV or MP3 header, else None."""
    if size is None:
        size = decoded_size(b64, start)
    try:
        head = _bytes(b64, start, 0, 12)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
            return _wav_seconds(b64, start, size)
        if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
            return _mp3_seconds(b64, start, size)
    except _Unreadable:
        pass
    return None


def _wav_seconds(b64: str, start: int, size: int) -> float | None:
    pos = 12
    byte_rate = 0
    for _ in range(_MAX_SEGMENTS):
        header = _bytes(b64, start, pos, 8)
        if len(header) < 8:
            return None
        kind, length = header[:4], int.from_bytes(header[4:8], "little")
        if kind == b"fmt ":
            fmt = _bytes(b64, start, pos + 8, 12)
            if len(fmt) < 12:
                return None
            byte_rate = int.from_bytes(fmt[8:12], "little")
        elif kind == b"data":
            if not byte_rate:
                return None
            available = max(0, size - pos - 8)
            # A streamed WAV leaves its data size 0 or 0xFFFFFFFF: the rest is the data.
            return (length if 0 < length <= available else available) / byte_rate
        pos += 8 + length + (length & 1)
    return None


# Layer III bit rates (kbit/s) by index, MPEG-1 and MPEG-2/2.5; 0 is "free", not a rate.
_MP3_RATES_V1 = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 0)
_MP3_RATES_V2 = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 0)


def _mp3_seconds(b64: str, start: int, size: int) -> float | None:
    """From the first frame's bit rate: exact for constant bit rate, an estimate for VBR."""
    pos = 0
    head = _bytes(b64, start, 0, 10)
    if head[:3] == b"ID3" and len(head) == 10:  # an ID3v2 tag: its size is in 7-bit bytes
        tag = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | head[9]
        pos = 10 + tag + (10 if head[5] & 0x10 else 0)
    frame = _bytes(b64, start, pos, 4)
    if len(frame) < 4 or frame[0] != 0xFF or frame[1] & 0xE0 != 0xE0:
        return None
    version, layer = (frame[1] >> 3) & 3, (frame[1] >> 1) & 3
    if layer != 1 or version == 1:  # not Layer III, or a reserved version
        return None
    kbps = (_MP3_RATES_V1 if version == 3 else _MP3_RATES_V2)[frame[2] >> 4]
    if not kbps:
        return None
    return max(0, size - pos) * 8 / (kbps * 1000)


# -- files ----------------------------------------------------------------------------------------

FILE_UNKNOWN = FILE_PAGE_TOKENS

_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/javascript",
        "application/x-sh",
        "application/sql",
        "application/csv",
    }
)
_TEXT_SUFFIXES = frozenset(
    {
        "txt",
        "md",
        "markdown",
        "csv",
        "tsv",
        "json",
        "jsonl",
        "ndjson",
        "xml",
        "yaml",
        "yml",
        "toml",
        "ini",
        "log",
        "html",
        "htm",
        "css",
        "py",
        "js",
        "ts",
        "java",
        "c",
        "h",
        "cpp",
        "go",
        "rs",
        "rb",
        "sh",
        "sql",
        "tex",
        "rst",
    }
)


def file_part_tokens(part: FilePart, count_text: Callable[[str], int]) -> int:
    data = part.data
    if data is None:
        return FILE_UNKNOWN
    parsed = _data_url(data)
    if parsed is None:  # bare base64, as some clients send it
        media, start, is_b64 = "", 0, True
    else:
        media, start, is_b64 = parsed
    media = (part.media_type or media).strip().lower()
    if not is_b64:  # a percent-encoded data: URL holds text
        return _text_tokens(unquote_to_bytes(data[start:]), count_text)
    try:
        is_pdf = _bytes(data, start, 0, 5) == b"%PDF-"
    except _Unreadable:
        return FILE_UNKNOWN
    if is_pdf or media == "application/pdf":
        pages = pdf_pages(data, start)
        return FILE_PAGE_TOKENS * pages
    if _is_text(media, part.filename):
        try:
            raw = base64.b64decode(data[start:])
        except (ValueError, binascii.Error):
            return FILE_UNKNOWN
        return _text_tokens(raw, count_text)
    return FILE_UNKNOWN


def _is_text(media: str, filename: str | None) -> bool:
    if media.startswith("text/") or media in _TEXT_TYPES or media.endswith(("+json", "+xml")):
        return True
    if filename is not None and "." in filename:
        return filename.rsplit(".", 1)[1].lower() in _TEXT_SUFFIXES
    return False


def _text_tokens(raw: bytes, count_text: Callable[[str], int]) -> int:
    text = raw.decode("utf-8", errors="replace")
    return count_text(text) if text else 0


_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z0-9])")
_OBJECT_STREAM = re.compile(rb"/Type\s*/ObjStm(?![A-Za-z0-9])")
_STREAM = re.compile(rb"stream\r?\n")


def pdf_pages(b64: str, start: int = 0) -> int:
    """Pages of the base64 PDF ``b64[start:]``: its page objects, counted in the file and in
    its compressed object streams (PDF 1.5 and later); else one per 50 KB, at least one."""
    try:
        raw = binascii.a2b_base64(b64[start:] if start else b64)
    except (ValueError, binascii.Error):
        return max(1, -(-decoded_size(b64, start) // _PDF_BYTES_PER_PAGE))
    pages = len(_PAGE.findall(raw))
    view = memoryview(raw)
    budget = _MAX_INFLATE  # for all object streams together: a PDF may be a zip bomb
    for found in _OBJECT_STREAM.finditer(raw):
        stream = _STREAM.search(raw, found.end())
        if stream is None or budget <= 0:
            break
        end = raw.find(b"endstream", stream.end())
        try:
            inflated = zlib.decompressobj().decompress(
                view[stream.end() : end if end >= 0 else len(raw)], budget
            )
        except zlib.error:
            continue
        budget -= len(inflated)
        pages += len(_PAGE.findall(inflated))
    return pages or max(1, -(-len(raw) // _PDF_BYTES_PER_PAGE))
