"""python -m precision.run [--tool NAME] [options] script.py [args...]: run an unmodified script
with precision tools active (or with those named by PRECISION_TOOL)."""
from __future__ import annotations

import argparse
import os
import runpy
import sys

from . import env
from .arguments import cli_type


def _validated(key: str):
    """The option's text, once it passed the check its PRECISION_ variable gets."""
    check = env.CHECKS.get(key)
    if check is None:
        return None

    def keep(text: str) -> str:
        check(text)
        return text

    keep.__name__ = check.__name__
    return cli_type(keep)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m precision.run", description=__doc__)
    p.add_argument("--tool", help=f"comma-separated: {', '.join(env.TOOLS)} (default: $PRECISION_TOOL)")
    p.add_argument("--out", help="output directory (default ./precision_out)")
    for key in ("ops", "exclude_ops", "modules", "steps", "ranks", "phases", "max_bytes", "dtype", "device",
                "range_dtype", "top"):
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=_validated(key))
    p.add_argument("--callsite", action="store_const", const="1")
    p.add_argument("--no-sync", dest="sync", action="store_const", const="0",
                   help="autocompare without extra device synchronisations")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if not os.path.isfile(a.script):
        p.error(f"script {a.script!r} not found")
    if a.tool:
        if env._active:
            p.error(f"PRECISION_TOOL already started {[t.name for t in env._active]}; drop --tool or the variable")
        names = [n.strip() for n in a.tool.split(",") if n.strip()]
        cfg = {k: v for k, v in vars(a).items() if k not in ("tool", "script", "args") and v is not None}
        unknown = [n for n in names if n not in env.TOOLS]
        if unknown or not names:
            p.error(f"--tool {a.tool!r}: unknown tool {', '.join(unknown) or '(none)'}; expected one or more of "
                    f"{', '.join(env.TOOLS)}, comma-separated")
        try:
            env.start(names, cfg)
        except ValueError as exc:
            p.error(str(exc))
    elif not env._active:
        p.error("no tool: pass --tool NAME or set PRECISION_TOOL")
    sys.argv = [a.script, *a.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    try:
        runpy.run_path(a.script, run_name="__main__")
    except SystemExit as exc:
        env.stop()
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    env.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
