"""Bounds on model sizes every spec reader applies: they keep each derived count (parameters, FLOPs, memory)
a sane finite number instead of an overflow or an out-of-memory error far downstream; real models are far
inside them."""
MAX_LAYERS = 100_000
MAX_WIDTH = 1 << 20  # hidden size, heads, FFN width, head_dim
MAX_VOCAB = 1 << 24
MAX_SEQ = 1 << 24
