"""dicomm-bench: dicomm against gloo on this host (the `dicomm-bench` command; see bench/README.md)."""
