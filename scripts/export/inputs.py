"""Every file the export reads, checked before anything opens it, and the error that refuses one.

- A path must be what its flag expects: a regular file (links followed), or a folder whose
  entries (three levels down; what a diffusers folder holds) are regular files or folders. A FIFO
  would hang the export on its first read, a device would feed it endless bytes: refused by name,
  as a missing file or a link to nothing is.
- A safetensors file's header is validated as the format's reference reader validates it
  (safetensors' Metadata::validate; src/lora/safetensors.cpp does the same for LoRAs) before the
  library gets the file, so that a damaged or hostile file is refused with one line naming the
  file and the problem instead of a traceback from inside the library.
- No input is TorchScript: a TorchScript archive (a zip holding code/ or constants.pkl) runs its
  code when it is loaded (its __setstate__ is TorchScript, and torch.load hands such a zip to
  torch.jit.load even with a restricted unpickler), so every regular file the export is given, and
  every file of an input folder, is refused when it is one, before any loader sees it. A file that
  starts as a zip (what torch.load takes for one) must be one Python's zip reader reads whole, and
  its entries may not expand to more bytes than the file holds (torch.save stores them
  uncompressed; a loader allocates what an entry claims). The export itself calls torch.jit.load
  only on the modules it wrote into its temporary folder.
Imports nothing but the standard library (cli checks every input before torch is imported).
"""
from __future__ import annotations

import json
import os
import stat
import struct
import zipfile
from pathlib import Path

HEADER_MAX = 100 * 2**20  # the format's limit on the header's length
FOLDER_DEPTH = 3  # folder levels checked below a folder input (diffusers: DIR/unet/FILE)
# Bytes per element of every dtype the torch loader (safetensors.torch) reads.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E5M2FNUZ": 1, "F8_E4M3FNUZ": 1,
               "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
               "C64": 8}


class ExportError(SystemExit):
    """An input the export refuses (exit code 1, no traceback); the message names the file and why."""


def _what(mode: int) -> str:
    for test, what in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _stat(path: Path, label: str) -> os.stat_result:
    try:
        return os.stat(path)  # follows links; does not open the file
    except FileNotFoundError:
        what = "a link to nothing" if os.path.islink(path) else "no such file or folder"
        raise ExportError(f"{label}: {what}")
    except OSError as e:
        raise ExportError(f"{label}: cannot be read ({e.strerror})")


def regular_file(path: Path, flag: str = "") -> Path:
    """path, after checking that it names a regular file that is not a TorchScript archive (see
    not_torchscript); else ExportError naming it (and the flag)."""
    label = f"{flag} {path}".strip()
    mode = _stat(path, label).st_mode
    if not stat.S_ISREG(mode):
        raise ExportError(f"{label}: {_what(mode)}, not a regular file")
    with open_regular(path, label) as f:
        not_torchscript(f, label)
    return path


def open_regular(path: Path, label: str):
    """path opened for binary reading, after checking (on the open file: a FIFO swapped in since the
    stat does not block the open) that it is a regular file; ExportError naming label otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ExportError(f"{label}: cannot be read ({e.strerror})")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ExportError(f"{label}: {_what(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


ZIP_MAGIC = b"PK\x03\x04"  # torch.load takes a file that starts so for a zip archive


def _is_torchscript_entry(name: str) -> bool:
    """constants.pkl or a file under code/ at any depth (torch's reader strips the archive's top folder)."""
    parts = name.replace("\\", "/").split("/")
    return parts[-1] == "constants.pkl" or "code" in parts[:-1]


def not_torchscript(f, label: str) -> None:
    """ExportError naming label when the open binary file f is a TorchScript archive, a file that
    starts as a zip but is not one Python's zip reader reads, or a zip whose entries expand to more
    bytes than the file holds. f is left at its start: the caller may hand the same open file to a
    loader, so what was checked is what is loaded."""
    f.seek(0)
    starts_as_zip = f.read(4) == ZIP_MAGIC
    f.seek(0)
    if not starts_as_zip and not zipfile.is_zipfile(f):
        f.seek(0)
        return
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        if not starts_as_zip:  # a zip end record by chance in other bytes (weights): not a zip to torch.load
            f.seek(0)
            return
        raise ExportError(f"{label}: cannot be read: a truncated or damaged zip archive ({e})")
    finally:
        f.seek(0)
    code = next((i.filename for i in infos if _is_torchscript_entry(i.filename)), None)
    if code is not None:
        raise ExportError(f"{label}: a TorchScript archive (it holds {code[:120]}); loading one runs the code it "
                          "holds, so the export never loads one. Use the model's weights as published (a state "
                          "dict .pth / .pt / .ckpt, or .safetensors)")
    size = os.fstat(f.fileno()).st_size
    expanded = sum(i.file_size for i in infos)
    if expanded > size:
        raise ExportError(f"{label}: a zip archive whose entries expand to {expanded} bytes, more than the file's "
                          f"{size} (torch.save stores them uncompressed)")


def folder(path: Path, flag: str = "", safetensors: bool = True) -> Path:
    """path, after checking that it is a folder whose entries down to FOLDER_DEPTH levels are regular
    files or folders, and (safetensors) that the header of each .safetensors file in it is valid."""
    label = f"{flag} {path}".strip()
    mode = _stat(path, label).st_mode
    if not stat.S_ISDIR(mode):
        raise ExportError(f"{label}: {_what(mode)}, not a folder")
    top = len(path.parts)
    for root, dirs, files in os.walk(path, followlinks=True):  # a loader follows them too; the depth bounds loops
        here = Path(root)
        if len(here.parts) - top >= FOLDER_DEPTH:
            dirs[:] = []
        for name in files:
            entry = here / name
            emode = _stat(entry, f"{label}: {entry.relative_to(path)}").st_mode
            if not stat.S_ISREG(emode):
                raise ExportError(f"{label}: {entry.relative_to(path)} is {_what(emode)}, not a regular file")
            with open_regular(entry, f"{label}: {entry.relative_to(path)}") as f:
                not_torchscript(f, f"{label}: {entry.relative_to(path)}")
            if safetensors and name.endswith(".safetensors"):
                read_header(entry)
    return path


def file_or_folder(path: Path, flag: str, safetensors: bool = True) -> Path:
    """A regular file (with safetensors: a safetensors file, its header checked) or a folder (as folder())."""
    label = f"{flag} {path}".strip()
    if stat.S_ISDIR(_stat(path, label).st_mode):
        return folder(path, flag, safetensors)
    regular_file(path, flag)
    if safetensors:
        read_header(path)
    return path


def _fail(path: Path, what: str):
    raise ExportError(f"{path}: not a valid safetensors file: {what}")


def _is_count(v) -> bool:
    return type(v) is int and v >= 0  # not bool, not float


def _header_json(path: Path, f, n: int) -> dict:
    """The header's JSON object: UTF-8, an object, no name twice, __metadata__ an object of strings."""
    def no_duplicates(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                _fail(path, f"tensor '{k}' appears twice in the header")
            seen.add(k)
        return dict(pairs)

    raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not a safetensors file (header is not JSON: {e})")
    if not isinstance(header, dict):
        raise ExportError(f"{path}: not a safetensors file (header is not a JSON object)")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict):
        _fail(path, "__metadata__ is not an object of strings")
    for k, v in meta.items():
        if not isinstance(v, str):
            _fail(path, f"__metadata__ value '{k}' is not a string")
    return header


def _entry(path: Path, name: str, info) -> tuple[str, list[int], int, int]:
    """(dtype, shape, begin, end) of one tensor's header entry, each of the type the format gives it."""
    if not isinstance(info, dict):
        _fail(path, f"tensor '{name}': its entry is not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        _fail(path, f"tensor '{name}': dtype is missing or not a string")
    if dtype not in DTYPE_BYTES:
        _fail(path, f"tensor '{name}': unknown dtype '{dtype[:40]}'")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        _fail(path, f"tensor '{name}': shape is missing or not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        _fail(path, f"tensor '{name}': data_offsets is not [begin, end] of non-negative integers")
    if offsets[1] < offsets[0]:
        _fail(path, f"tensor '{name}': data_offsets {offsets} end before they begin")
    return dtype, shape, offsets[0], offsets[1]


def _check_spans(path: Path, entries: dict, data_bytes: int) -> None:
    """As the reference reader: in offset order, each tensor's bytes start where the previous ones
    end and are its shape's element count times its dtype's size, and the last end the file."""
    pos = 0
    for name, (dtype, shape, begin, end) in sorted(entries.items(), key=lambda e: (e[1][2], e[1][3])):
        if begin != pos:
            _fail(path, f"tensor '{name}': its bytes " + ("overlap the previous tensor's" if begin < pos
                                                          else "leave a gap after the previous tensor's"))
        count = 1
        for d in shape:
            count *= d
        size = count * DTYPE_BYTES[dtype]
        if size >= 2**64:
            _fail(path, f"tensor '{name}': shape {shape} overflows (more than 2^64 bytes)")
        if size != end - begin:
            _fail(path, f"tensor '{name}': shape {shape} of {dtype} is {size} bytes, its data_offsets span "
                        f"{end - begin}")
        pos = end
    if pos != data_bytes:
        _fail(path, f"the data section is {data_bytes} bytes, the tensors cover {pos} (bytes after the last tensor)")


def read_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from the safetensors header, after checking that path is a regular
    file, not a pickle, and that its header is one the format allows and describes every byte of
    the file (see the module's docstring); ExportError otherwise."""
    regular_file(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ExportError(f"{path}: {size} bytes, too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if head[:2] == b"PK" or head[:1] == b"\x80":
            raise ExportError(f"{path}: a pickle (.ckpt/.pt) checkpoint; loading one can run code. "
                              "Convert it to .safetensors with a tool you trust first")
        if n > min(HEADER_MAX, size - 8):
            raise ExportError(f"{path}: not a safetensors file (header length {n} does not fit in {size} bytes)")
        header = _header_json(path, f, n)
    entries = {name: _entry(path, name, info) for name, info in header.items() if name != "__metadata__"}
    end = max((e[3] for e in entries.values()), default=0)
    if 8 + n + end > size:
        raise ExportError(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size} "
                          "(an interrupted download or copy?)")
    _check_spans(path, entries, size - 8 - n)
    return {name: list(e[1]) for name, e in entries.items()}
