"""The command line every gloo job example starts with: ``OUT WORLD PORT`` (where it writes, how
many processes it spawns, the port of the store they join: tests serve it, see the precision
tests' conftest)."""
from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("world", type=int)
    p.add_argument("port", type=int)
    return p
