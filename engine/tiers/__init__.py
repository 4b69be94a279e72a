"""Lower KV tiers below the RAM pool: the disk."""
