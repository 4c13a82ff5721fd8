"""Worker processes: one per GPU rank (or CPU slot), all in one torch.distributed world."""
