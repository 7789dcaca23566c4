"""ditorch_diopi package."""
