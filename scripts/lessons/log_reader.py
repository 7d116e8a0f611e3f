"""One log read back: its records by kind and what breaks the schema. On its own, so that the checks and
the report (which runs jobs and then checks them) both read logs without importing each other."""
import json
from pathlib import Path

from trainup import LOG_DIR
from trainup.schema import check_record


REQUIRED = ("config", "env", "summary")


def read_run(path, checked=None, required=REQUIRED):
    """One log as a dict: config, env, epochs (list), summary (None if the run did not finish), extra
    (the lesson records), problems.

    checked: the record types checked against the schema (None: every one). A reader of older and
    newer logs (the scaling report) checks only the core ones and keeps the rest unchecked in extra.
    required: the record types whose absence is a problem. A resumed run appends to its log: the last
    config/env win and a repeated epoch keeps its last record.
    """
    run = dict(path=Path(path), config=None, env=None, epochs={}, summary=None, problems=[], extra=[])
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            run["problems"].append(f"line {n} is not JSON")
            continue
        kind = record.get("type") if isinstance(record, dict) else None
        if checked is None or kind in checked:
            run["problems"] += (check_record(record) if isinstance(record, dict)
                                else [f"line {n} is not a JSON object"])
        if kind in ("config", "env", "summary"):
            run[kind] = record
        elif kind == "epoch":
            run["epochs"][record.get("epoch")] = record
        else:
            run["extra"].append(record)  # lesson-specific records (GPU samples, sweeps...)
    # a broken log may have an epoch that is not a number: keep it (its problem is listed), sorted last
    order = sorted(run["epochs"], key=lambda k: (0, k, "") if isinstance(k, int) else (1, 0, str(k)))
    run["epochs"] = [run["epochs"][k] for k in order]
    for kind in required:
        if run[kind] is None:
            run["problems"].append(f"no {kind!r} record")
    return run


def records(name, kind, log_dir=LOG_DIR):
    """A run's records of one lesson type ('pipeline', 'fabric'...), in the order written: the one
    helper every lesson module reads its records with."""
    return [r for r in read_run(Path(log_dir) / f"{name}.jsonl")["extra"] if r["type"] == kind]
