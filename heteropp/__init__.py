"""heteropp package."""
