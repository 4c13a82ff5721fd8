"""The `blitzscale` command."""
