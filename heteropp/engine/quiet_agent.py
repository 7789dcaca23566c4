"""torchrun with torch elastic's own logs off: the agent of an emulated host of `heteropp run --elastic`. Its
workers say in one line each why a round ended and rank 0 one line a round (chips, plan, where it resumes), so the
agent's lines (a worker's exit code, the signals it sends, restarts) only repeat them (`heteropp run --verbose`
runs torchrun itself). Its arguments are torchrun's."""
import logging
import os

if __name__ == "__main__":
    # the level torch elastic's own loggers take when created (torch.distributed.elastic.utils.logging), and the
    # parent of those that take none (its multiprocessing api's)
    os.environ["LOGLEVEL"] = "CRITICAL"
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    from torch.distributed.run import main
    main()
