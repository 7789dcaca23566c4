"""torchrun without the lines of torch elastic's that heteropp's own already say: the agent of an emulated host of
`heteropp run --elastic`. A worker that saw its peer go says so in one line and ends with EXIT_PEER, one that ends
its round for a straggler re-plan after rank 0's verdict line ends with EXIT_REPLAN, and rank 0 prints a line a
round: the agent's error for such a worker's exit, and its routine warnings and notes (the signals it sends,
restarts), only repeat them. Every other error stays: a worker killed by a signal, or ended with another code, is
reported as torchrun reports it (`heteropp run --verbose` runs torchrun itself). Its arguments are torchrun's."""
import logging

from heteropp.engine.elastic import EXIT_PEER, EXIT_REPLAN

SAID = (EXIT_PEER, EXIT_REPLAN)  # worker exit codes whose reason the worker's or rank 0's line gave


class SaidElsewhere(logging.Filter):
    """Drops a record of torchrun or torch elastic below ERROR, and the error of a worker that ended with a code
    of SAID (the multiprocessing api's `failed (exitcode: %s) ...`, the code its first argument); keeps the rest,
    and every record of another logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("torch.distributed.elastic", "torch.distributed.run")):
            return True
        if record.levelno < logging.ERROR:
            return False
        said = isinstance(record.msg, str) and record.msg.startswith("failed (exitcode: ")
        return not (said and isinstance(record.args, tuple) and bool(record.args) and record.args[0] in SAID)


def quiet() -> None:
    """SaidElsewhere on the handlers torch's logging puts on its loggers (`torch`, `torch.distributed`), which
    every torch elastic record reaches (a filter on a logger would not see its children's records)."""
    import torch.distributed.run  # noqa: F401  torch's logging set up, as torchrun runs it

    for name in ("torch", "torch.distributed"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(SaidElsewhere())


if __name__ == "__main__":
    quiet()
    from heteropp.engine.first_round import wait_for_the_others
    wait_for_the_others()
    from torch.distributed.run import main
    main()
