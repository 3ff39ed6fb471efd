"""Search: enumerate the space, prune with cheap bounds, price the survivors, partition stages."""
