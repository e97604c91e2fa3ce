"""A model's files checked without loading them: what must be there, readable and whole.

Loading an 8B model takes minutes; a directory without weights, a weights file cut short
by a failed copy, or an adapter whose config does not parse must be refused before that,
in one line naming the file (`limit=0`, the evaluator's check-only mode, relies on it).
The checks read a few bytes per file: a safetensors file is an 8-byte header length, a
JSON header naming every tensor's byte range, then the data, so its header says how long
the whole file must be. PyTorch pickles (`*.bin`) have no such header: only their presence
and non-zero size are checked.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# What transformers reads as a model's weights, and as an adapter's (PEFT), in that order.
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
ADAPTER_CONFIG = "adapter_config.json"
# A safetensors header is a few KB per hundred tensors; a larger length is not a header.
MAX_HEADER_BYTES = 100_000_000
GGUF_MAGIC = b"GGUF"


class ModelFileError(ValueError):
    """A model or adapter file that cannot load (a ValueError: one `error:` line, exit 2)."""


def read_json(path: Path) -> Any:
    """A JSON file's content; an unreadable or malformed one is refused naming the file.

    Args:
        path (Path): the JSON file.
    """
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(f"{path}: not readable JSON ({error})") from error


def check_safetensors(path: Path) -> None:
    """Refuse a safetensors file that is empty, not safetensors, or shorter than its header says.

    Args:
        path (Path): the safetensors file.
    """
    size = path.stat().st_size
    try:
        with path.open("rb") as stream:
            head = stream.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if length is None or not 2 <= length <= MAX_HEADER_BYTES:
                raise ModelFileError(f"{path}: not a safetensors file ({size} bytes, no valid header): "
                                     "an interrupted copy or save? copy or save it again")
            if length > size - 8:
                raise ModelFileError(f"{path}: truncated ({size} bytes, shorter than its own header): "
                                     "an interrupted copy or save? copy or save it again")
            header = json.loads(stream.read(length))
    except OSError as error:
        raise ModelFileError(f"{path}: cannot be read ({error.strerror or error})") from error
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(f"{path}: not a safetensors file (its header is not JSON)") from error
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: not a safetensors file (its header is not a JSON object)")
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        raise ModelFileError(f"{path}: truncated ({size} bytes; its header describes {needed}): "
                             "an interrupted copy or save? copy or save it again")


def check_weights_file(path: Path) -> None:
    """Refuse a weights file that is missing or empty, or a safetensors file that is not whole.

    Args:
        path (Path): the weights file.
    """
    if not path.is_file():
        raise ModelFileError(f"{path}: weights file missing")
    if path.suffix == ".safetensors":
        check_safetensors(path)
    elif path.stat().st_size == 0:
        raise ModelFileError(f"{path}: empty weights file")


def check_model_dir(directory: Path) -> None:
    """A full or merged model directory: config.json, and weights (single or sharded) whole.

    Args:
        directory (Path): the model directory.
    """
    config = directory / "config.json"
    if not config.is_file():
        raise ModelFileError(f"{directory}: no config.json: not a model directory (nor an adapter: no {ADAPTER_CONFIG})")
    read_json(config)
    found = next((directory / name for name in MODEL_WEIGHTS if (directory / name).is_file()), None)
    if found is None:
        raise ModelFileError(f"{directory}: holds no weights (none of {', '.join(MODEL_WEIGHTS)}): "
                             "an unfinished save or download?")
    if found.name.endswith(".index.json"):
        index = read_json(found)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFileError(f"{found}: names no weight files (no weight_map)")
        for shard in sorted(set(weight_map.values())):
            check_weights_file(directory / shard)
    else:
        check_weights_file(found)


def is_adapter_dir(path: str | Path) -> bool:
    """Whether a path is a PEFT adapter directory (it holds adapter_config.json).

    Args:
        path (str | Path): the path to look at.
    """
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def adapter_base(name_or_path: str | Path) -> str | None:
    """The base model a local PEFT adapter directory names, else None (not an adapter).

    Args:
        name_or_path (str | Path): a model source; only a local adapter directory has a base.
    """
    if not is_adapter_dir(name_or_path):
        return None
    path = Path(name_or_path).expanduser() / ADAPTER_CONFIG
    config = read_json(path)
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        raise ModelFileError(f"{path} names no base_model_name_or_path")
    return base


def check_adapter_dir(directory: Path) -> None:
    """A PEFT adapter directory: adapter_config.json parses and names its base; the adapter's
    weights are there and whole.

    Args:
        directory (Path): the adapter directory.
    """
    adapter_base(directory)
    found = next((directory / name for name in ADAPTER_WEIGHTS if (directory / name).is_file()), None)
    if found is None:
        raise ModelFileError(f"{directory}: adapter without weights (none of {', '.join(ADAPTER_WEIGHTS)})")
    check_weights_file(found)


def check_gguf(path: Path) -> None:
    """Refuse a file that does not start with the GGUF magic.

    Args:
        path (Path): the GGUF file.
    """
    with path.open("rb") as stream:
        if stream.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"{path}: not a GGUF file (no GGUF magic at its start)")


def check_local_source(name_or_path: str) -> None:
    """Check a local model source (a .gguf file, an adapter, or a model directory) by its
    files; a name that is not a local path (embedded name, hub id) is left to its loader.

    Args:
        name_or_path (str): the model source.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        check_gguf(path)
    elif is_adapter_dir(path):
        check_adapter_dir(path)
    elif path.is_dir():
        check_model_dir(path)
