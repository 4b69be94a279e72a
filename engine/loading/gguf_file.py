"""A GGUF file's metadata and tensor table, parsed in a fraction of a second.

gguf.GGUFReader builds numpy views for every part of every metadata value: for a 128k vocabulary (tokens, their types,
~280k merges) that is over a million small arrays, seconds of parsing and hundreds of MB that stay resident. The
loader needs only the hyperparameters, the special token ids and the tensor table; the tokenizer is built from the
file by transformers, which reads its arrays itself. So string arrays are skipped here (their strings are decoded
only if asked for), numeric arrays are read whole with numpy, and the header is read with plain file reads, so no
page of the file stays mapped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
FIRST_READ = 4 << 20  # bytes of header read first; doubled until the metadata and tensor table fit
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_FILE_DTYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


class _Truncated(Exception):
    """The header runs past the bytes read so far."""


@dataclass(frozen=True)
class StringArray:
    """An array of strings left unparsed: `count` strings in buf[start:end], decoded on demand."""

    buf: bytes
    start: int
    end: int
    count: int

    def strings(self) -> list[str]:
        out, pos = [], self.start
        for _ in range(self.count):
            (n,) = struct.unpack_from("<Q", self.buf, pos)
            out.append(self.buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        return out


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor of the table, as gguf.ReaderTensor names its fields (`data` mapped only when asked for)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # dims innermost first, as GGUF lists them
    n_elements: int
    n_bytes: int
    data_offset: int  # absolute offset in the file
    path: Path = field(repr=False)

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes memory-mapped as gguf.GGUFReader gives them: F32/F16 as floats in the file's shape
        (outermost first), every other type as uint8 rows."""
        dims = [int(d) for d in reversed(self.shape.tolist())]
        if self.tensor_type in _FILE_DTYPES:
            dtype, shape = _FILE_DTYPES[self.tensor_type], dims
        else:
            dtype, shape = np.uint8, [*dims[:-1], self.n_bytes // max(1, int(np.prod(dims[:-1])))]
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self.data_offset, shape=tuple(shape))


@dataclass(frozen=True)
class GGUFFile:
    """What `open_gguf` returns: metadata values by key and the tensor table."""

    path: Path
    metadata: dict[str, Any]  # scalars, str, lists of numbers, StringArray
    tensors: list[GGUFTensorInfo]

    def value(self, key: str, default: Any = None) -> Any:
        """A metadata value: scalar, str or list (a string array decoded), or `default` when absent."""
        if key not in self.metadata:
            return default
        value = self.metadata[key]
        return value.strings() if isinstance(value, StringArray) else value


def read_gguf_file(path: str | Path) -> GGUFFile:
    """The file's metadata and tensor table (ValueError for a file that is not GGUF v2/v3)."""
    path = Path(path).expanduser()
    size = FIRST_READ
    with open(path, "rb") as f:
        while True:
            f.seek(0)
            buf = f.read(size)
            try:
                return _parse(path, buf)
            except (_Truncated, struct.error):
                if len(buf) < size:  # the whole file was read: it is cut short
                    raise ValueError(f"{path}: GGUF header is truncated") from None
                size *= 4


def _parse(path: Path, buf: bytes) -> GGUFFile:
    if buf[:4] != MAGIC:
        raise ValueError(f"{path} is not a GGUF file")
    version, num_tensors, num_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    pos, metadata = 24, {}
    for _ in range(num_kv):
        key, pos = _string(buf, pos)
        (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        metadata[key], pos = _value(buf, pos, kind)
    table = []
    for _ in range(num_tensors):
        name, pos = _string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        shape = np.frombuffer(buf, np.uint64, n_dims, pos + 4).copy()
        kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, shape, GGMLQuantizationType(kind), offset))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-pos // alignment) * alignment
    tensors = []
    for name, shape, kind, offset in table:
        n_elements = int(np.prod(shape.astype(np.int64))) if len(shape) else 1
        block_weights, block_bytes = GGML_QUANT_SIZES[kind]
        n_bytes = n_elements // block_weights * block_bytes
        tensors.append(GGUFTensorInfo(name, kind, shape, n_elements, n_bytes, data_start + offset, path))
    return GGUFFile(path, metadata, tensors)


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    if pos + 8 + n > len(buf):
        raise _Truncated
    return buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"), pos + 8 + n


def _value(buf: bytes, pos: int, kind: int) -> tuple[Any, int]:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(buf, pos)
    if kind != _ARRAY:
        raise ValueError(f"GGUF metadata value type {kind} is unknown")
    item_kind, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item_kind in _SCALARS:
        dtype = np.dtype(_SCALARS[item_kind])
        if pos + count * dtype.itemsize > len(buf):
            raise _Truncated
        return np.frombuffer(buf, dtype, count, pos).tolist(), pos + count * dtype.itemsize
    if item_kind == _STRING:  # skipped: only the lengths are read
        start = pos
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + n
        if pos > len(buf):
            raise _Truncated
        return StringArray(buf, start, pos, count), pos
    values = []
    for _ in range(count):  # arrays of arrays: rare, parsed one by one
        value, pos = _value(buf, pos, item_kind)
        values.append(value)
    return values, pos
