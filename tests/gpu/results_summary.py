"""One line per worker JSON (tests/gpu/torchrun_worker.finish's format) in the given folders or
files: how the ranks ran (the mode), checks, failures, left-out checks with their reasons; then
each failed check's name and error.

    python3 tests/gpu/results_summary.py gpu-logs/shared-gpu-tests
"""

import argparse
import json
import pathlib


def summary(path: pathlib.Path) -> list[str]:
    data = json.loads(path.read_text())
    if "results" not in data or "mode" not in data:
        return [f"{path.name}: not a torchrun_worker result file"]
    left_out = {s["name"]: s["reason"] for s in data.get("skipped", [])}
    lines = [
        f"{path.name}: [{data['mode']}] checks={len(data['results'])} failed={data['failed']} "
        f"left_out={len(left_out)}"
    ]
    lines += [f"  left out {name}: {reason}" for name, reason in sorted(left_out.items())]
    for e in data["results"]:
        if not e["ok"]:
            error = e.get("error") or {k: v for k, v in e.items() if k not in ("name", "ok")}
            lines.append(f"  FAILED rank {e['rank']} {e['name']}: {str(error)[:400]}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=pathlib.Path, help="JSON files or folders of them")
    args = ap.parse_args()
    for p in args.paths:
        for f in sorted(p.glob("*.json")) if p.is_dir() else [p]:
            print("\n".join(summary(f)))


if __name__ == "__main__":
    main()
