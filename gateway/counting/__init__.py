"""counting."""
