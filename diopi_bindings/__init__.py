"""diopi_bindings package."""
