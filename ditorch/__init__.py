"""ditorch package."""
