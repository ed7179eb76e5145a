"""Read a W&B offline run back: the records of its ``run-<id>.wandb`` file.

wandb 0.31 ships no Python reader of its transaction log (the old ``wandb.sdk.internal.datastore``
is gone with the Go core), so this is one: the file is a LevelDB-style log — a 7-byte header
(``b":W&B"``, magic 0xBEE1, version), then 32 KiB blocks of chunks, each with a 7-byte header
(CRC-32 of the type byte and the chunk, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4) — whose payloads are
``wandb.proto.wandb_internal_pb2.Record`` messages, parsed with wandb's own protobuf classes.
Each chunk's CRC is checked, so a misread file fails loudly instead of yielding garbage.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time
import zlib
from typing import Any, Iterator

BLOCK = 32 * 1024
HEADER = struct.Struct("<IHB")


def records(path: str) -> Iterator[Any]:
    """Every ``Record`` in a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, pending = 7, b""
    while pos + HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER.size:  # block trailer
            pos += left
            continue
        crc, length, kind = HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding up to the next block
            pos += left
            continue
        chunk = data[pos + HEADER.size : pos + HEADER.size + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"CRC mismatch at byte {pos} of {path}"
        pos += HEADER.size + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def complete_records(path: str, timeout: float = 60.0) -> list[Any]:
    """The records of a finished run: wandb 0.31's ``run.finish()`` (and a process's exit) can
    return before its service has flushed the log, so wait until the run's final ``exit`` record
    is on disk (a partly written chunk reads as incomplete until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = list(records(path))
        except (AssertionError, struct.error, ValueError):
            found = []
            if time.monotonic() > deadline:
                raise
        if any(record.WhichOneof("record_type") == "exit" for record in found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after {timeout:.0f} s ({len(found)} records)")
        time.sleep(0.2)


def offline_run(wandb_dir: str) -> dict[str, Any]:
    """The one offline run under ``wandb_dir``: its settings, config and logged history."""
    [path] = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    run: dict[str, Any] = {"path": path, "config": {}, "history": []}
    for record in complete_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.update(project=r.project, entity=r.entity, name=r.display_name, tags=list(r.tags))
            run["config"].update({item.key: json.loads(item.value_json) for item in r.config.update})
        elif kind == "config":
            run["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
            run["history"].append(row)
    return run
