"""serve layer of omni-core."""
