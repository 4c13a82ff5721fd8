"""Cluster control: the parameter pool, worker launch, and commands to workers."""
