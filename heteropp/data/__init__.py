"""Real token data for training: token files (`tokenfile`), streaming tokenization (`prepare`), the sampling
contract (`sampler`), a locally trained tokenizer (`tokenizer`) and the `heteropp data` commands (`cli`)."""
from .sampler import sample_windows, windows
from .tokenfile import TokenData, TokenWriter, dtype_for_vocab

__all__ = ["TokenData", "TokenWriter", "dtype_for_vocab", "sample_windows", "windows"]
