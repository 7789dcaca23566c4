"""python -m ditorch_precision.run [--tool NAME] [options] script.py [args...]: run an unmodified script
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
    p = argparse.ArgumentParser(prog="python -m ditorch_precision.run", description=__doc__)
    p.add_argument("--tool", help=f"comma-separated: {', '.join(env.TOOLS)} (default: $PRECISION_TOOL)")
    p.add_argument("--out", help="output directory (default ./precision_out)")
    for key in ("ops", "exclude_ops", "modules", "apis", "steps", "ranks", "phases", "max_bytes", "dtype", "device",
                "range_dtype", "top", "tol", "mode"):
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=_validated(key))
    p.add_argument("--callsite", action="store_const", const="1")
    p.add_argument("--api", action="store_const", const="1", help="record each op's torch-level call")
    p.add_argument("--bulk", action="store_const", const="1",
                   help="capture: write each step's tensors together, a tensor several ops read once (the default)")
    p.add_argument("--no-bulk", dest="bulk", action="store_const", const="0",
                   help="capture: one tensor file per op instead of one part file per step")
    p.add_argument("--no-sync", dest="sync", action="store_const", const="0",
                   help="autocompare without extra device synchronisations")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if not os.path.isfile(a.script):
        p.error(f"script {a.script!r} not found")
    given = {k: v for k, v in vars(a).items() if k not in ("tool", "script", "args") and v is not None}
    try:
        env_names, env_cfg = env.config_from_env()
    except ValueError as exc:
        p.error(str(exc))
    conflicts = [f"--{k.replace('_', '-')} {v!r} vs PRECISION_{k.upper()}={env_cfg[k]!r}"
                 for k, v in given.items() if k in env_cfg and str(env_cfg[k]) != str(v)]
    if a.tool and env_names and [n.strip() for n in a.tool.split(",")] != env_names:
        conflicts.insert(0, f"--tool {a.tool!r} vs PRECISION_TOOL={','.join(env_names)!r}")
    if conflicts:
        p.error("the command line and the environment disagree: " + "; ".join(conflicts)
                + " (give each setting once)")
    if env._active:  # PRECISION_TOOL started the tools at import, with the environment's settings
        extra = [f"--{k.replace('_', '-')}" for k in given if k not in env_cfg]
        if extra:
            p.error(f"{', '.join(extra)} cannot change tools that PRECISION_TOOL already started; set "
                    f"{', '.join('PRECISION_' + k.upper() for k in given if k not in env_cfg)} instead")
    elif a.tool:
        names = [n.strip() for n in a.tool.split(",") if n.strip()]
        cfg = {**env_cfg, **given}
        unknown = [n for n in names if n not in env.TOOLS]
        if unknown or not names:
            p.error(f"--tool {a.tool!r}: unknown tool {', '.join(unknown) or '(none)'}; expected one or more of "
                    f"{', '.join(env.TOOLS)}, comma-separated")
        try:
            env.start(names, cfg)
        except ValueError as exc:
            p.error(str(exc))
    else:
        p.error("no tool: pass --tool NAME or set PRECISION_TOOL")
    sys.argv = [a.script, *a.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    try:
        runpy.run_path(a.script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        return env.stop() or code
    return env.stop()


if __name__ == "__main__":
    sys.exit(main())
