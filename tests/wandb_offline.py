"""The history of an offline wandb run (run-*.wandb), read without the network: a 7-byte header,
then 32 KiB blocks in LevelDB's log layout, each record a protobuf Record."""

import json
import struct
from pathlib import Path
from typing import Any

HEADER = 7
BLOCK = 32 * 1024
PIECE = 7


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a wandb run file")
    pos, pieces, out = HEADER, [], []
    while pos + PIECE <= len(data):
        left = BLOCK - pos % BLOCK
        if left < PIECE:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + PIECE])
        if length == 0 and kind == 0:  # zero padding to the end of a block
            pos += left
            continue
        payload = data[pos + PIECE : pos + PIECE + length]
        pos += PIECE + length
        if kind == 1:
            out.append(payload)
        elif kind == 2:
            pieces = [payload]
        elif kind == 3:
            pieces.append(payload)
        elif kind == 4:
            out.append(b"".join([*pieces, payload]))
    return out


def history(path: Path) -> dict[int, dict[str, Any]]:
    from wandb.proto import wandb_internal_pb2 as pb

    steps: dict[int, dict[str, Any]] = {}
    for raw in records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                 for i in record.history.item}  # fmt: skip
        step = int(items.pop("_step"))
        steps.setdefault(step, {}).update({k: v for k, v in items.items() if not k.startswith("_")})
    return steps
