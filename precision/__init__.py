"""precision package."""
