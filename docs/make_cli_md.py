"""Refresh the example outputs in docs/cli.md by running each command.

Every `<!-- $ shardplan ARGS -->` line of docs/cli.md is followed by a ```text block; this script
runs `python -m shardplan.cli ARGS` in docs/ (stdout not a terminal, so tables are laid out for
100 columns and no progress is shown) and writes `$ shardplan ARGS` plus its stdout and its
`warning:` lines from stderr (or, when it fails, its last stderr line) into the block.
Run from the repository root: `PYTHONPATH=$PWD python docs/make_cli_md.py`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "cli.md"
MARK = re.compile(r"^<!-- \$ shardplan (.*) -->$")
_LOG = re.compile(r"^(\[rank|[WIE]\d{4} |/|\s+warnings\.warn|\S+Warning: )")
"""Lines of other libraries' logs and Python warnings on stderr (not ours)."""


def run(args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(DOCS.parent), COLUMNS="100")
    done = subprocess.run(
        [sys.executable, "-m", "shardplan.cli", *shlex.split(args)],
        cwd=DOCS,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    out = done.stdout.rstrip()
    ours, inside = [], False  # our `warning:` lines and their wrapped continuations, no logs
    for line in done.stderr.splitlines():
        inside = line.startswith("warning: ") or (inside and not _LOG.match(line))
        if inside:
            ours.append(line)
    if ours and not done.returncode:
        out += ("\n" if out else "") + "\n".join(ours)
    if done.returncode:
        out += ("\n" if out else "") + done.stderr.strip().splitlines()[-1]
        out += f"\n(exit code {done.returncode})"
    return "\n".join(line.rstrip() for line in out.splitlines())


def main() -> None:
    lines = PAGE.read_text().splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        m = MARK.match(lines[i])
        i += 1
        if not m:
            continue
        assert lines[i] == "```text", f"line {i + 1}: a ```text block must follow the marker"
        end = lines.index("```", i + 1)
        print(f"$ shardplan {m.group(1)}", file=sys.stderr)
        out += ["```text", f"$ shardplan {m.group(1)}", *run(m.group(1)).splitlines(), "```"]
        i = end + 1
    PAGE.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
