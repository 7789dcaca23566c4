"""Built-in vendor adapters, one module each; the registry imports them lazily."""

BUILTIN_MODULES: tuple[str, ...] = ("cuda", "rocm", "npu", "mlu", "musa", "xpu", "mps", "diopi", "cpu")
