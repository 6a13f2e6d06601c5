"""What is wrong with a local corpus file the `datasets` builders could not read, in one line.

The builders fail on a binary file, Latin-1 text, a `.gz` that is not gzip or malformed JSON
with the same vague `DatasetGenerationError`. After such a failure each file is read again
here, as the builder would have read it, and the first fault found is named: not gzip, not
UTF-8 at byte N, a NUL byte at byte N, line N is not JSON.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 20


def open_bytes(file: Path) -> IO[bytes]:
    return gzip.open(file, "rb") if file.suffix.lower() == ".gz" else open(file, "rb")


def not_gzip(file: Path) -> str | None:
    if file.suffix.lower() != ".gz":
        return None
    with open(file, "rb") as handle:
        return None if handle.read(2) == GZIP_MAGIC else f"{file.name} is not gzip (it does not start with gzip's magic bytes 1f 8b)"


def text_fault(file: Path) -> str | None:
    """Not UTF-8, or a NUL byte (a binary file): whichever comes first, at its offset in the (decompressed) text."""
    offset, tail = 0, b""  # tail: a character split across two reads
    with open_bytes(file) as handle:
        while chunk := handle.read(CHUNK):
            data, start = tail + chunk, offset - len(tail)
            bad, tail = first_undecodable(data)
            nul = data.find(b"\x00")
            if nul >= 0 and (bad is None or nul < bad):
                return f"{file.name} holds a NUL byte at byte {start + nul}: a binary file, not text"
            if bad is not None:
                return f"{file.name} is not UTF-8 at byte {start + bad} (re-encode it as UTF-8)"
            offset += len(chunk)
    return f"{file.name} is not UTF-8 at byte {offset - len(tail)} (it ends inside a character)" if tail else None


def first_undecodable(data: bytes) -> tuple[int | None, bytes]:
    """(offset of the first byte that is not UTF-8 or None, an incomplete character at the end to carry over)."""
    try:
        data.decode("utf-8")
        return None, b""
    except UnicodeDecodeError as error:
        if error.reason == "unexpected end of data" and error.end == len(data):
            return None, data[error.start:]
        return error.start, b""


def json_fault(file: Path) -> str | None:
    """The first line that is not a JSON value (a whole-file JSON document is fine too)."""
    with open_bytes(file) as handle:
        text = handle.read().decode("utf-8")
    try:
        json.loads(text)
        return None
    except json.JSONDecodeError:
        pass
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as error:
                return f"{file.name}: line {number} is not JSON ({error.msg} at column {error.colno})"
    return None


def diagnose(files: list[Path], source: str) -> str | None:
    """The first fault in `files` read as `source` (text, json, jsonl), or None when none is found."""
    for file in files:
        try:
            fault = not_gzip(file) or text_fault(file) or (json_fault(file) if source in ("json", "jsonl") else None)
        except (OSError, EOFError) as error:  # a truncated or damaged gzip stream
            fault = f"{file.name}: cannot be decompressed ({error})"
        if fault:
            return fault
    return None
