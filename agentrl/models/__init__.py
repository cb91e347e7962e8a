"""Model builders (the offline tiny model)."""
