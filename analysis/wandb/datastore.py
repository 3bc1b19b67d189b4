"""Read an offline wandb run back without wandb's service: ``python -m analysis.wandb.datastore RUN.wandb``.

An offline run (``wandb/offline-run-<time>-<id>/run-<id>.wandb``) is a log of protobuf
``wandb.proto.wandb_internal_pb2.Record`` messages in LevelDB's log format: a 7-byte W&B
header (``:W&B``, magic ``0xBEE1``, version 0), then 32 KiB blocks of records, each with a
7-byte header (CRC-32 of type byte + data, little-endian length, type FULL / FIRST /
MIDDLE / LAST); a record that does not fit the rest of a block is split into fragments,
and a block tail shorter than a header is zero padding. ``read_run`` folds the records
into what a synced run would show: config, history rows, summary, metric definitions,
tables (read from the run's ``files/``).
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
RECORD_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbFileError(ValueError):
    """Not a .wandb file, or a damaged one."""


def records(path: str | Path) -> Iterator[Any]:
    """Every record of a ``.wandb`` file, in order (a torn last record ends the stream)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise WandbFileError(f"{path}: no W&B header (first bytes {data[:7]!r})")
    pos, parts = len(HEADER), []
    while pos + RECORD_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER:  # zero padding at the end of a block
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        body = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        if len(body) < length or kind not in (FULL, FIRST, MIDDLE, LAST):
            return  # torn write at the end (a crash), as LevelDB's reader treats it
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise WandbFileError(f"{path}: bad checksum in the record at byte {pos}")
        pos += RECORD_HEADER + length
        parts = [body] if kind in (FULL, FIRST) else parts + [body]
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(b"".join(parts))
            yield rec


def _path(item: Any) -> list[str]:
    return list(item.nested_key) if item.nested_key else [item.key]


def _set(into: dict[str, Any], items: Any) -> dict[str, Any]:
    """Items (``key`` or ``nested_key`` path, JSON value) into a nested dict."""
    for item in items:
        *parents, last = _path(item)
        d = into
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = json.loads(item.value_json) if item.value_json else None
    return into


@dataclass
class OfflineRun:
    """What an offline run holds, as a synced run would show it."""

    path: Path
    run_id: str = ""
    project: str = ""
    group: str = ""
    job_type: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    resumed: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)  # metric (or glob) -> its step metric
    exit_code: int | None = None

    def table(self, key: str) -> tuple[list[str], list[list[Any]]]:
        """(columns, rows) of the table logged as ``key`` (from the run's files)."""
        ref = self.summary.get(key)
        if not isinstance(ref, dict) or ref.get("_type") != "table-file":
            raise KeyError(f"{key} is not a table of {self.path}")
        obj = json.loads((self.path.parent / "files" / ref["path"]).read_text())
        return obj["columns"], obj["data"]

    def file(self, key: str) -> Path:
        """The file behind a logged media value (image, table)."""
        return self.path.parent / "files" / self.summary[key]["path"]


def read_run(path: str | Path) -> OfflineRun:
    """Fold a ``.wandb`` file's records into an ``OfflineRun``."""
    run = OfflineRun(Path(path))
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.run_id, run.project, run.group, run.job_type = r.run_id, r.project, r.run_group, r.job_type
            run.name, run.tags, run.resumed = r.display_name, list(r.tags), r.resumed
            _set(run.config, r.config.update)
        elif kind == "config":
            _set(run.config, rec.config.update)
        elif kind == "history":
            run.history.append(_set({}, rec.history.item))
        elif kind == "summary":
            _set(run.summary, rec.summary.update)
            for i in rec.summary.remove:
                run.summary.pop(_path(i)[0], None)
        elif kind == "metric":
            m = rec.metric
            run.metrics[m.name or m.glob_name] = m.step_metric
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    # wandb stores config values as {"value": v} (and its own under "_wandb")
    run.config = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in run.config.items()}
    run.config.pop("_wandb", None)
    return run


def main(argv: list[str] | None = None) -> None:
    for path in argv if argv is not None else sys.argv[1:]:
        run = read_run(path)
        print(f"{path}: run {run.run_id} group {run.group!r} job_type {run.job_type!r}, {len(run.history)} rows")
        print(json.dumps({"config": run.config, "summary": run.summary}, indent=1, default=str))


if __name__ == "__main__":
    main()
