"""Is this checkpoint whole? What a resume may start from.

A save that ran out of disk leaves a file that looks like a checkpoint: torch's zip writer
stops mid-archive (`unexpected pos 8192 vs 8086`), and a resume from it fails with
`PytorchStreamReader failed reading zip archive`. These checks read what a file says of
itself, never its data, so they cost a few small reads however large the checkpoint:

- a zip archive (`torch.save`'s format since torch 1.6, and the files of DeepSpeed and
  accelerate checkpoints) must end in its central directory, and every member's data must
  lie inside the file;
- a safetensors file must be exactly as long as its header says;
- anything else passes (torch's legacy pickle format says nothing of its length);
- a directory (DeepSpeed's `global_stepN`, accelerate's, a Hugging Face `checkpoint-N`) is
  whole when every file in it is, and it holds at least one.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO

#: The most files of a checkpoint directory looked at (a sharded checkpoint has a few
#: per rank; a directory with more is most likely not a checkpoint).
MAX_FILES = 4096
ZIP_MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip member's local file header


def broken(path: str | Path) -> str | None:
    """Why the checkpoint at `path` cannot be resumed from, in a few words (naming the
    file at fault inside a directory); None when it is whole, as far as its format says."""
    where = Path(path)
    try:
        if where.is_dir():
            return _broken_dir(where)
        return _broken_file(where)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"


def _broken_dir(directory: Path) -> str | None:
    files = 0
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            files += 1
            if files > MAX_FILES:
                return None  # not a checkpoint's layout: nothing is claimed either way
            file = Path(root) / name
            why = _broken_file(file)
            if why is not None:
                return f"{file.relative_to(directory)} is {why}"
    return None if files else "an empty directory"


def _broken_file(file: Path) -> str | None:
    size = file.stat().st_size
    if size == 0:
        return "empty (0 bytes)"
    with file.open("rb") as f:
        head = f.read(8)
        if head.startswith(ZIP_MAGIC):
            return _broken_zip(f, size)
        if file.suffix == ".safetensors":
            return _broken_safetensors(f, head, size)
    return None


def _broken_zip(f: BinaryIO, size: int) -> str | None:
    """A zip archive whose central directory is missing (cut short) or whose members
    reach past its end."""
    try:
        archive = zipfile.ZipFile(f)
    except zipfile.BadZipFile:
        return f"cut short: a zip archive without its central directory ({size:,} bytes)"
    with archive:
        for info in archive.infolist():
            f.seek(info.header_offset)
            header = f.read(_LOCAL_HEADER.size)
            if len(header) < _LOCAL_HEADER.size or not header.startswith(ZIP_MAGIC):
                return f"damaged: the zip member {info.filename} has no header"
            fields = _LOCAL_HEADER.unpack(header)
            start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
            if start + info.compress_size > size:
                return f"cut short: the zip member {info.filename} ends past the file's end"
    return None


def _broken_safetensors(f: BinaryIO, head: bytes, size: int) -> str | None:
    if len(head) < 8:
        return "cut short: no safetensors header"
    (length,) = struct.unpack("<Q", head)
    if 8 + length > size:
        return "cut short: the safetensors header ends past the file's end"
    try:
        header = json.loads(f.read(length))
    except ValueError:
        return "damaged: its safetensors header is not JSON"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"cut short: {size:,} bytes where its header says {expected:,}"
    return None
