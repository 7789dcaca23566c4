"""Entry point run by torch at `import torch` (group `torch.backends`).

It must never raise: an exception here would make `import torch` itself fail.
"""


def register() -> None:
    try:
        import dicomm.backend  # noqa: F401  (registers the "dicomm" backend)
    except Exception:  # pragma: no cover - best effort by design
        pass
