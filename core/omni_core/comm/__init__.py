"""comm layer of omni-core."""
