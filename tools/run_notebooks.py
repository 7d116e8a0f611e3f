"""Execute notebooks one after another into a folder, each to its end or its first failing cell.

    python tools/run_notebooks.py --output-dir results/notebooks notebooks/[0-9]*.ipynb

A notebook that fails does not stop the others: its copy is kept with every cell run up to the
failing one and that cell's error, to open and read. The end is a summary (each notebook, ran or
failed, its time) and exit status 1 when any failed. run_course.sh runs the course with it.
"""

import argparse
import sys
import time
from pathlib import Path


def run_one(path, out_dir, timeout):
    """(True, seconds) or (False, seconds, the failing cell's error in one line); the copy written
    either way."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=timeout, resources={"metadata": {"path": str(path.parent)}}
    )
    tick = time.monotonic()
    try:
        client.execute()
        result = (True, time.monotonic() - tick, "")
    # the copy keeps the cells run and this error
    except nbclient.exceptions.CellExecutionError as e:
        result = (False, time.monotonic() - tick, f"{e.ename}: {e.evalue}".splitlines()[0][:200])
    # a kernel that died or a cell past its time: said, the others still run
    except Exception as e:
        result = (False, time.monotonic() - tick, f"{type(e).__name__}: {e}".splitlines()[0][:200])
    nbformat.write(nb, out_dir / path.name)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--output-dir", type=Path, required=True)
    p.add_argument("--timeout", type=int, default=3600, help="seconds a cell may run")
    args = p.parse_args(argv)
    missing = [str(n) for n in args.notebooks if not n.is_file()]
    if missing:
        p.error(f"no such notebook: {', '.join(missing)}")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for nb in args.notebooks:
        print(f"== {nb}", flush=True)
        ok, seconds, why = run_one(nb.resolve(), args.output_dir, args.timeout)
        rows.append((nb.name, ok, seconds, why))
        if not ok:
            print(f"   failed: {why}", flush=True)
    print("\nnotebook                               result   minutes")
    for name, ok, seconds, why in rows:
        print(
            f"{name:<38} {'ran' if ok else 'FAILED':<8} {seconds / 60:6.1f}"
            + (f"   {why}" if why else "")
        )
    failed = [name for name, ok, _, _ in rows if not ok]
    print(
        f"\n{len(rows) - len(failed)} of {len(rows)} notebooks ran to the end"
        + (
            f"; open the failed ones in {args.output_dir}/ at their last cell: {', '.join(failed)}"
            if failed
            else "."
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
